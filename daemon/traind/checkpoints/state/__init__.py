"""What the daemon keeps on this host: the journal, the run's identity, the journal's reserve,
free space."""
