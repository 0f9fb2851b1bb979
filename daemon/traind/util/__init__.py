"""Leaf helpers every layer may use: child processes, retry and backoff, task groups, file I/O,
units, logs, a deadline poll. They import nothing of traind but its errors."""
