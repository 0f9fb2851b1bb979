"""From snapshot to committed: the streamer, its queue and life-cycle table, claims, coalescing,
and ``traind push``."""
