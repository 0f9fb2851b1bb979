"""The files by which a trainer and its daemon on one host talk: the marker a finished save
leaves, and where the daemon says it holds a snapshot. Both sides import these names."""

EXPLICIT_MARKER = ".traind-complete"
"""Written by ``traind.integrations.hf.TraindCallback`` once a save has finished."""

ACK_DIR_ENV = "TRAIND_ACK_DIR"
"""Names the directory where the daemon creates an empty file ``<tag>`` once it holds a
snapshot of that checkpoint. ``TraindCallback`` waits for it after each save, so a trainer
that rotates checkpoints aggressively cannot delete one before traind has it."""
