"""Contract tests for the tasks: offline load, prompt rendering, gold scores right, wrong scores wrong."""

from __future__ import annotations

import pytest

from core.tokenizer import ByteTokenizer
from core.types import HarnessError
from tasks.pg19 import PG19

TOK = ByteTokenizer()


@pytest.mark.parametrize("context_length", [64, 1024])
def test_pg19_windows_are_exact_token_length(context_length: int) -> None:
    task = PG19(context_length=context_length, source="package", limit=3)
    samples = task.load()
    assert len(samples) == 3 and all(s.raw_prompt for s in samples)
    for s in samples:
        ids = task.prompt_ids(s, 0, [], TOK)
        assert len(ids) == context_length and ids[0] == TOK.bos_token_id
        # the prompt ends exactly where the reference continuation starts
        assert TOK.decode(ids[1:]) == s.turns[0][-(context_length - 1) :]
    gold = " ".join(samples[0].reference.split()[:40])
    assert task.score(samples[0], [gold]) == {"rougeL": 1.0}
    assert task.score(samples[0], ["zebra " * 40])["rougeL"] == 0.0


def test_pg19_hub_unreachable_names_offline_source(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(HarnessError, match="task.source=package") as err:
        PG19(context_length=64, source="hub", limit=1).load()
    assert "\n" not in str(err.value)


def test_pg19_missing_local_file_is_one_line(tmp_path) -> None:
    with pytest.raises(HarnessError, match="not found"):
        PG19(context_length=64, data_path=str(tmp_path / "nope.txt")).load()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"txt": 1}\n')
    with pytest.raises(HarnessError, match=r"bad.jsonl:2"):
        PG19(context_length=64, data_path=str(bad)).load()
