"""vast.ai."""
