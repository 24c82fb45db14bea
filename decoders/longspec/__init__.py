"""LongSpec ("LongSpec: Long-Context Lossless Speculative Decoding with Efficient Drafting and
Verification"): the tree decoder, its one-block draft, the cost-sized tree and the hub drafts' mapping."""

from decoders.longspec.decoder import LongSpec

__all__ = ["LongSpec"]
