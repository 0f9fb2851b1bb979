"""The host side of a launch: the shell that installs and runs traind there, SSH to it,
local rsync and commands, and what pip installs."""
