"""Checkpoint detection, staging, streaming, retention and restore."""
