"""The five papers' claims as data for `analysis.claims`: where each paper makes it (FAFO: arXiv
versions 000 and 001, one set of claims; TriForce; SFI; LongSpec), what it says, what it depends on,
and the runs that test it (record fields). Settings held fixed are the papers' (FAFO k 6, n 40,
budget 760, Lookahead G 7), so a claim reads the same cells as the tables above."""

from __future__ import annotations

from analysis.claims import Claim
from analysis.fafo_paper import TASKS

FAFO_DECODERS = ["fafo", "fafo_2forward", "fafo_cpu", "fafo_auto"]
FAFO_SET = {"decoder.k": 6, "decoder.n": 40}
STREAM = {"decoder": "fafo", "kv": "streaming", **FAFO_SET}
QUEST = {"decoder": "fafo", "kv": "quest", **FAFO_SET}
LOOKAHEAD = {"decoder": "lookahead", "decoder.G": 7}
SPEED_WHY = ("cost curve", "baseline", "model size")
TAU_WHY = ("policy inactive", "answer length", "model size")
SAMPLING = "no run samples at temperature > 0 (every record is greedy)"
CHAT = ["mtbench", "gsm8k", "humaneval"]  # the chat tasks of FAFO Tables 1-2 and 4


def _fafo() -> list[Claim]:
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


NEEDLE = {"task": "longbench_ruler_niah"}
RETRIEVAL = {"decoder": "selfspec", "kv": "retrieval", "decoder.rebuild_every": 0, "kv.gqa_score": "logit"}
TRI = ("policy inactive", "model size", "answer length")


def _triforce() -> list[Claim]:
    return [
        Claim(
            "TriForce",
            "Table 1",
            "the retrieval draft cache beats StreamingLLM's on the needle task",
            "tau",
            "order",
            "acceptance",
            {**RETRIEVAL, **NEEDLE},
            {"decoder": "selfspec", "kv": "streaming"},
            why=TRI,
        ),
        Claim(
            "TriForce",
            "Table 1",
            "the retrieval draft cache beats H2O's on the needle task",
            "tau",
            "order",
            "acceptance",
            {**RETRIEVAL, **NEEDLE},
            {"decoder": "selfspec", "kv": "h2o"},
            why=TRI,
        ),
        Claim(
            "TriForce",
            "Table 1",
            "the retrieval draft cache beats StreamingLLM's on PG-19",
            "tau",
            "order",
            "acceptance",
            {**RETRIEVAL, "task": "pg19"},
            {"decoder": "selfspec", "kv": "streaming"},
            why=TRI,
        ),
        Claim(
            "TriForce",
            "Table 1",
            "retrieval comes close to the Top-K oracle (0.988 vs 0.999)",
            "tau",
            "parity",
            "acceptance",
            {**RETRIEVAL},
            {"decoder": "selfspec", "kv": "topk"},
            why=TRI,
        ),
        Claim(
            "TriForce",
            "Table 8",
            "gamma2 = 6 is the fastest (2.31x vs 1.90x at gamma2 = 2)",
            "speed",
            "order",
            "speedup",
            {
                "decoder": "triforce",
                "decoder.gamma1": 2,
                "decoder.gamma2": 6,
                "experiment": ["triforce_table8a_cpu", "triforce_table8b_cpu"],
            },
            {"decoder": "triforce", "decoder.gamma1": 2, "decoder.gamma2": 2},
            why=SPEED_WHY,
        ),
        Claim(
            "TriForce",
            "Table 8",
            "TriForce speeds up PG-19 (2.31x)",
            "speed",
            "at_least",
            "speedup",
            {"decoder": "triforce", "task": "pg19"},
            threshold=1.0,
            why=SPEED_WHY,
        ),
        Claim(
            "TriForce",
            "Figure 6",
            "acceptance rises with the retrieval budget (13.6% above 0.8%)",
            "tau",
            "order",
            "acceptance",
            {"decoder": "selfspec", "kv": "retrieval", "kv.budget_frac": 0.136},
            {"decoder": "selfspec", "kv": "retrieval", "kv.budget_frac": 0.008},
            why=TRI,
        ),
        Claim(
            "TriForce",
            "Section 4",
            "lossless: outputs identical to the target's greedy decoding",
            "exactness",
            "at_least",
            "match",
            {"decoder": "triforce"},
            threshold=1.0,
        ),
        Claim(
            "TriForce",
            "Table 2",
            "acceptance stays high at temperatures 0.2-1.0",
            "tau",
            "none",
            untestable=SAMPLING,
        ),
        Claim(
            "TriForce",
            "Table 5",
            "the hierarchy (draft -> retrieval -> target) beats either level alone",
            "speed",
            "none",
            untestable="no run of the hierarchy ablation (its layer-skipping row)",
        ),
    ]


SFI_RUN = {"decoder": "sfi", "kv": ["sfi_ctx20", "sfi_keep50"], "experiment": "sfi_table4_sfi_cpu"}


def _sfi() -> list[Claim]:
    return [
        Claim(
            "SFI",
            "Table 4",
            "SFI scores above the KV presses at the same ratio (needle accuracy)",
            "quality",
            "order",
            "score.accuracy",
            {**SFI_RUN, **NEEDLE},
            {"kv": ["kvpress_snapkv", "kvpress_streaming", "kvpress_chunkkv", "kvpress_tova"]},
            why=("model size", "answer length"),
        ),
        Claim(
            "SFI",
            "Tables 2-3",
            "SFI keeps the quality of full attention (needle accuracy)",
            "quality",
            "parity",
            "score.accuracy",
            {**SFI_RUN, **NEEDLE},
            {"decoder": "vanilla", "kv": "full", "experiment": "sfi_table4_dense_cpu"},
            why=("model size", "answer length"),
        ),
        Claim(
            "SFI",
            "Tables 2-3",
            "SFI keeps the quality of full attention (QA F1)",
            "quality",
            "parity",
            "score.f1",
            {**SFI_RUN, "task": "longbench_ruler_qa"},
            {"decoder": "vanilla", "kv": "full", "experiment": "sfi_table4_dense_cpu"},
            why=("model size", "answer length"),
        ),
        Claim(
            "SFI",
            "Figure 4",
            "SFI decodes faster than dense attention at long contexts (7k)",
            "speed",
            "at_least",
            "speedup",
            {"decoder": "sfi", "task": "pg19", "task.context_length": 7168},
            threshold=1.0,
            why=SPEED_WHY,
        ),
        Claim(
            "SFI",
            "Figure 4",
            "SFI's gain grows with the context (7k above 1k)",
            "speed",
            "order",
            "speedup",
            {"decoder": "sfi", "task": "pg19", "task.context_length": 7168},
            {"decoder": "sfi", "task.context_length": 1024},
            why=SPEED_WHY,
        ),
        Claim(
            "SFI",
            "Tables 1, 5",
            "SFI's throughput on B200 with vLLM at 8k-128k",
            "speed",
            "none",
            untestable="vLLM kernels, a B200 and Qwen3 models at 8k-128k contexts",
        ),
    ]


LONGSPEC = {"decoder": "longspec", "experiment": "longspec_table1_cpu"}
MAGICDEC = {"decoder": "selfspec", "kv": "streaming", "experiment": "longspec_table1_magicdec_cpu"}
ABL = "checkpoints/longspec/ablations/smollm2-135m-"


def _longspec() -> list[Claim]:
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
            "none",
            untestable=SAMPLING,
        ),
    ]


CLAIMS: list[Claim] = _fafo() + _triforce() + _sfi() + _longspec()
