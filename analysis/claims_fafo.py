"""FAFO's claims (arXiv versions 000 and 001, one set of claims) as data for `analysis.claims`: the
runs that test each, at the paper's settings (k 6, n 40, budget 760, Lookahead G 7)."""

from __future__ import annotations

from analysis.claims import SPEED_WHY, Claim
from analysis.fafo_base import TASKS

FAFO_DECODERS = ["fafo", "fafo_2forward", "fafo_cpu", "fafo_auto"]
FAFO_SET = {"decoder.k": 6, "decoder.n": 40}
STREAM = {"decoder": "fafo", "kv": "streaming", **FAFO_SET}
QUEST = {"decoder": "fafo", "kv": "quest", **FAFO_SET}
LOOKAHEAD = {"decoder": "lookahead", "decoder.G": 7}
TAU_WHY = ("policy inactive", "answer length", "model size")
SAMPLING = "no run of this paper's decoders samples at temperature > 0"
CHAT = ["mtbench", "gsm8k", "humaneval"]  # the chat tasks of FAFO Tables 1-2 and 4


def claims() -> list[Claim]:
    c = []
    for task, where in (("mtbench", "Tables 1-2"), ("gsm8k", "Table 2"), ("humaneval", "Table 2")):
        t = {"task": task}
        c.append(
            Claim(
                "FAFO",
                where,
                f"FAFO-Stream is faster than Lookahead on {TASKS[task]}",
                "speed",
                "order",
                "speedup",
                {**STREAM, **t},
                LOOKAHEAD,
                why=SPEED_WHY,
            )
        )
        c.append(
            Claim(
                "FAFO",
                where,
                f"FAFO-Stream accepts more per forward than Lookahead on {TASKS[task]}",
                "tau",
                "order",
                "tau",
                {**STREAM, **t},
                LOOKAHEAD,
                why=TAU_WHY,
            )
        )
    c += [
        Claim(
            "FAFO",
            "Table 1",
            "FAFO-Stream is ~60% faster than FAFO-2forward (1.91x vs 1.19x)",
            "speed",
            "order",
            "speedup",
            {**STREAM, "task": "mtbench"},
            {"decoder": "fafo_2forward", **FAFO_SET},
            why=SPEED_WHY,
        ),
        Claim(
            "FAFO",
            "Table 1",
            "FAFO-2forward needs more peak memory than FAFO-Stream (3455 vs 2362 MB)",
            "memory",
            "order",
            "peak_mem",
            {"decoder": "fafo_2forward", **FAFO_SET},
            {**STREAM, "task": "mtbench"},
            why=("memory floor",),
        ),
        Claim(
            "FAFO",
            "Table 2",
            "FAFO-Stream speeds up MT-Bench (1.91x over vanilla)",
            "speed",
            "at_least",
            "speedup",
            {**STREAM, "task": "mtbench"},
            threshold=1.0,
            why=SPEED_WHY,
        ),
        Claim(
            "FAFO",
            "Table 2",
            "FAFO-Stream is faster than FAFO-Quest (1.91x vs 1.32x on MT-Bench)",
            "speed",
            "order",
            "speedup",
            {**STREAM, "task": "mtbench"},
            QUEST,
            why=SPEED_WHY,
        ),
        Claim(
            "FAFO",
            "Table 2",
            "FAFO-Stream's tau is above FAFO-Quest's (2.29 vs 2.20 on MT-Bench)",
            "tau",
            "order",
            "tau",
            {**STREAM, "task": "mtbench"},
            QUEST,
            why=TAU_WHY,
        ),
        Claim(
            "FAFO",
            "Table 10",
            "FAFO-Stream is the fastest on PG-19 (above Lookahead)",
            "speed",
            "order",
            "speedup",
            {**STREAM, "task": "pg19"},
            {"decoder": "lookahead"},
            why=SPEED_WHY,
        ),
        Claim(
            "FAFO",
            "Table 10",
            "FAFO-Stream is faster than TriForce on PG-19",
            "speed",
            "order",
            "speedup",
            {**STREAM, "task": "pg19", "experiment": "fafo_table10"},
            {"decoder": "triforce"},
            why=SPEED_WHY,
        ),
        Claim(
            "FAFO",
            "Table 11",
            "speed peaks at k 6-7: k=6 beats k=4 (1.9x vs 0.9x)",
            "speed",
            "order",
            "speedup",
            {**STREAM, "decoder.k": 6, "task": "mtbench"},
            {"decoder": "fafo", "kv": "streaming", "decoder.k": 4, "decoder.n": 40},
            why=SPEED_WHY,
        ),
        Claim(
            "FAFO",
            "Table 12",
            "speed rises with the number of streams n (n=40 above n=10)",
            "speed",
            "order",
            "speedup",
            {**STREAM, "task": "mtbench"},
            {"decoder": "fafo", "kv": "streaming", "decoder.k": 6, "decoder.n": 10},
            why=SPEED_WHY,
        ),
        Claim(
            "FAFO",
            "Table 12",
            "tau rises with n (n=40 above n=10)",
            "tau",
            "order",
            "tau",
            {**STREAM, "task": "mtbench"},
            {"decoder": "fafo", "kv": "streaming", "decoder.k": 6, "decoder.n": 10},
            why=TAU_WHY,
        ),
        Claim(
            "FAFO",
            "Figure 1",
            "at equal guesses (40) FAFO's tau is above Lookahead's",
            "tau",
            "order",
            "tau",
            {**STREAM, "task": "mtbench"},
            {"decoder": "lookahead", "decoder.G": 40},
            why=TAU_WHY,
        ),
        Claim(
            "FAFO",
            "Table 13",
            "a larger Init+Local budget raises tau on Multi-IF (1360 above 360)",
            "tau",
            "order",
            "tau",
            {**STREAM, "task": "multi_if", "kv.budget_frac": 0.1789},
            {"decoder": "fafo", "kv.budget_frac": 0.0474},
            why=TAU_WHY,
        ),
        Claim(
            "FAFO",
            "Appendix",
            "lossless: 157 of 160 outputs identical to greedy decoding (98%)",
            "exactness",
            "at_least",
            "match",
            {"decoder": FAFO_DECODERS, "lossless": True},
            threshold=157 / 160,
        ),
        Claim(  # experiment=fafo_triforce: speedup at most 1x on every chat task
            "FAFO",
            "Tables 1-2",
            "self-speculation (TriForce) slows chat decoding: 0.21x at tau 1.06",
            "speed",
            "at_most",
            "speedup",
            {"decoder": "triforce", "task": CHAT},
            threshold=1.0,
            untestable="no run of experiment=fafo_triforce yet",
        ),
        Claim(  # experiment=fafo_swift runs FAFO-Stream beside SWIFT, each paired with its own vanilla run
            "FAFO",
            "Tables 1-2",
            "SWIFT (layer-skipping self-speculation) is slower than FAFO",
            "speed",
            "order",
            "speedup",
            {**STREAM, "task": CHAT},
            {"decoder": "swift"},
            why=SPEED_WHY,
            untestable="no FAFO-Stream run in a setup with a SWIFT run yet (experiment=fafo_swift's "
            "decoder=fafo entry: ~30 min for 2 MT-Bench samples at 0.08x of vanilla on a shared 2-core box)",
        ),
        Claim(  # experiment=fafo_table4 (temperature 0.6, top-p 0.9)
            "FAFO",
            "Table 4",
            "FAFO keeps its speedup when sampling (1.91x at temperature 0.6, top-p 0.9)",
            "speed",
            "at_least",
            "speedup",
            {**STREAM, "temperature": 0.6},
            threshold=1.0,
            why=SPEED_WHY,
            untestable="no run of experiment=fafo_table4 yet",
        ),
        Claim(  # experiment=fafo_table5
            "FAFO",
            "Table 5",
            "FAFO speeds up AIME24 reasoning",
            "speed",
            "at_least",
            "speedup",
            {**STREAM, "task": "aime24"},
            threshold=1.0,
            why=SPEED_WHY,
            untestable="no run of experiment=fafo_table5 yet",
        ),
    ]
    return c
