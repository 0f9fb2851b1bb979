"""This machine as the host."""
