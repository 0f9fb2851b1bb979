"""The daemon: start-up, the main loop and shutdown, and the loops beside it."""
