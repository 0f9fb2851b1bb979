"""Processes and the OS around them: children that cannot outlive their parent, transfers
kept below the trainer on the CPU, and systemd's notify socket."""
