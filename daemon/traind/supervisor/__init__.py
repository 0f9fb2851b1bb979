"""Child-process supervision: vLLM, helper services and the trainer."""
