"""LongSpec's claims as data for `analysis.claims`: the runs that test each."""

from __future__ import annotations

from analysis.claims import SPEED_WHY, Claim

LONGSPEC = {"decoder": "longspec", "experiment": "longspec_table1_cpu"}
MAGICDEC = {"decoder": "selfspec", "kv": "streaming", "experiment": "longspec_table1_magicdec_cpu"}
ABL = "checkpoints/longspec/ablations/smollm2-135m-"
FIGURE3 = {"decoder": "longspec", "experiment": "longspec_figure3_cpu"}  # its runs sample at T 1


def claims() -> list[Claim]:
    return [
        Claim(
            "LongSpec",
            "Table 1",
            "LongSpec accepts more per forward than MagicDec",
            "tau",
            "order",
            "tau",
            LONGSPEC,
            MAGICDEC,
            why=("draft quality", "model size"),
        ),
        Claim(
            "LongSpec",
            "Table 1",
            "LongSpec is faster than MagicDec",
            "speed",
            "order",
            "speedup",
            LONGSPEC,
            MAGICDEC,
            why=SPEED_WHY,
        ),
        Claim(
            "LongSpec",
            "Table 1",
            "LongSpec speeds up long-context decoding",
            "speed",
            "at_least",
            "speedup",
            LONGSPEC,
            threshold=1.0,
            why=SPEED_WHY,
        ),
        Claim(
            "LongSpec",
            "Table 2",
            "Anchor-Offset raises tau",
            "tau",
            "order",
            "tau",
            {"decoder": "longspec", "decoder.checkpoint": ABL + "anchor-offset"},
            {"decoder": "longspec", "decoder.checkpoint": ABL + "no-anchor-offset"},
            why=("model size", "answer length"),
        ),
        Claim(
            "LongSpec",
            "Table 2",
            "Anchor-Offset makes decoding faster",
            "speed",
            "order",
            "speedup",
            {"decoder": "longspec", "decoder.checkpoint": ABL + "anchor-offset"},
            {"decoder": "longspec", "decoder.checkpoint": ABL + "no-anchor-offset"},
            why=SPEED_WHY,
        ),
        Claim(
            "LongSpec",
            "Section 3",
            "lossless: outputs identical to the target's greedy decoding",
            "exactness",
            "at_least",
            "match",
            {"decoder": "longspec"},
            threshold=1.0,
        ),
        Claim(
            "LongSpec",
            "Figure 3",
            "LongSpec keeps its speedup at temperature 1",
            "speed",
            "at_least",
            "speedup",
            FIGURE3,
            threshold=1.0,
            why=SPEED_WHY,
        ),
        Claim(
            "LongSpec",
            "Figure 3",
            "LongSpec accepts more per forward than MagicDec at temperature 1",
            "tau",
            "order",
            "tau",
            FIGURE3,
            {"decoder": "selfspec", "kv": "streaming", "experiment": "longspec_figure3_cpu"},
            why=("draft quality", "model size"),
        ),
    ]
