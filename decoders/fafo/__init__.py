"""FAFO ("FAFO: Lossy KV Cache Compression for Lossless Inference Acceleration via Draftless Fumble
Decoding"): the decoder, its block layout and its per-step attention views."""

from decoders.fafo.decoder import FAFO, FAFO2Forward

__all__ = ["FAFO", "FAFO2Forward"]
