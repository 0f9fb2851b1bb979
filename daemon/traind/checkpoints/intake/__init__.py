"""Taking checkpoints in: the trainer's output_dir watched, a directory judged complete, its
snapshot staged."""
