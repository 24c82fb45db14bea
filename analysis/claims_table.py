"""The five papers' claims as data for `analysis.claims`: where each paper makes it (FAFO: arXiv
versions 000 and 001, one set of claims; TriForce; SFI; LongSpec), what it says, what it depends on,
and the runs that test it (record fields). Settings held fixed are the papers' (FAFO k 6, n 40,
budget 760, Lookahead G 7), so a claim reads the same cells as the tables above."""

from __future__ import annotations

from analysis import claims_fafo, claims_longspec, claims_sfi, claims_triforce
from analysis.claims import Claim

# one module per paper; the order is the ledger's
CLAIMS: list[Claim] = (
    claims_fafo.claims() + claims_triforce.claims() + claims_sfi.claims() + claims_longspec.claims()
)
