"""The opt-in ``transfer = "openssh"`` mode: SFTP spoken here over the pipes of the system ssh."""
