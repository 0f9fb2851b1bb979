"""traind: supervise a training run and stream its checkpoints to storage, verifiably."""

__version__ = "0.1.0"
