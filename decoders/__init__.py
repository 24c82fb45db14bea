"""Decoders: one file per method, all built on `core.engine.Engine.step/commit`."""
