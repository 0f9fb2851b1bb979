"""Nebius AI Cloud."""
