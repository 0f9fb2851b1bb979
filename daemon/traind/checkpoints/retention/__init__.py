"""Retention: which checkpoints may go (a pure policy) and the pruner that deletes them."""
