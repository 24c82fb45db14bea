"""Shared core: types, the KV cache, the block-forward engine, attention backends, model loading."""
