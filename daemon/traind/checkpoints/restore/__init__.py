"""Restore: a checkpoint downloaded and verified, start-up recovery, and ``traind verify``."""
