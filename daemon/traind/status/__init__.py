"""The daemon's status server and metrics."""
