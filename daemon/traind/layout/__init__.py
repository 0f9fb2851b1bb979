"""The remote layout both sides agree on: names that become keys, the manifest, part manifests.

A leaf: it imports nothing of storage/ or checkpoints/, so the store and the daemon share
the contract without importing each other."""
