"""The ``traind launch`` commands: the command line, the launch itself (``flow``), and
managing a saved launch (status, logs, pull, down)."""
