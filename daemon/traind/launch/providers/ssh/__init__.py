"""Hosts you already have, over SSH."""
