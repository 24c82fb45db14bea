"""SFI's claims as data for `analysis.claims`: the runs that test each."""

from __future__ import annotations

from analysis.claims import SPEED_WHY, Claim
from analysis.claims_triforce import NEEDLE  # the same needle task as TriForce's

SFI_RUN = {"decoder": "sfi", "kv": ["sfi_ctx20", "sfi_keep50"], "experiment": "sfi_table4_sfi_cpu"}


def claims() -> list[Claim]:
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
            "Table 5",
            "SFI keeps the quality of full attention on reasoning (MMLU 63.0 vs 63.0; GSM8K accuracy here)",
            "quality",
            "parity",
            "score.accuracy",
            {"decoder": "sfi", "kv": "sfi_ctx20", "experiment": "sfi_table5_cpu"},
            {"decoder": "vanilla", "kv": "full", "experiment": "sfi_table5_cpu"},
            why=("policy inactive", "model size", "answer length"),
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
            "Table 1",
            "SFI's throughput on B200 with vLLM at 8k-128k",
            "speed",
            "none",
            untestable="vLLM kernels, a B200 and Qwen3 models at 8k-128k contexts",
        ),
    ]
