"""Modal: the official ``modal`` client's Sandboxes behind the JobBackend adapter."""
