"""Code that runs inside the training script, not the daemon."""
