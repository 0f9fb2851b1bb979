"""The SSH store: its primitives (``store``), the asyncssh link, SFTP and rsync transfers,
and the opt-in openssh client."""
