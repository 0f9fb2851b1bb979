"""RunPod."""
