"""The SSH backend: the asyncssh link, SFTP and rsync transfers, and the opt-in openssh client."""
