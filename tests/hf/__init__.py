"""Hugging Face clients on tpu: Transformers (loading, generate, pipeline,
Trainer), the architecture sweep (python -m tests.hf) and Diffusers."""
