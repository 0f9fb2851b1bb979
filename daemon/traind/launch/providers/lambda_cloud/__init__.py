"""Lambda Cloud."""
