"""The Hugging Face Hub store: a model or dataset repo, through ``huggingface_hub``."""
