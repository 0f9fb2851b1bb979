"""A multi-node job's checkpoints, one host's side: its part, the resume agreement, the
checkpoint made whole."""
