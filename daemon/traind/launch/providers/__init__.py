"""Where hosts come from, one sub-package per provider (its API mapping and its adapter),
and what the renting ones share (``rented``, ``rest``)."""
