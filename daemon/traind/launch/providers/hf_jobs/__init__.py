"""Hugging Face Jobs: huggingface_hub's Jobs API (client.py) behind the JobBackend adapter."""
