"""analysis.paper (`make paper`): the report rebuilds from records alone, fills the tables that have
runs, names the command for those that do not, says why a table was not made, and lists what the
harness cannot reproduce."""

from __future__ import annotations

import json

import pytest

from analysis import paper
from runners.records import SAMPLE_COLUMNS, RunDir, typed_frame


def write_run(
    root,
    run_id: str,
    decoder: str,
    kv: str,
    experiment: str,
    wall: float,
    steps=(),
    device: str = "cpu: test",
    **params,
) -> None:
    rd = RunDir(root / "runs", run_id)
    rd.path.mkdir(parents=True)
    dec = {"_target_": "x", **{k: v for k, v in params.items() if k.startswith("gamma")}}
    rd.write_run(
        {
            "run_id": run_id,
            "status": "complete",
            "decoder": decoder,
            "kv": kv,
            "task": "pg19",
            "task_params": json.dumps({"context_length": 4096}),
            "model": "smollm2-135m",
            "model_name": "smollm2-135m",
            "dtype": "float32",
            "device_name": device,
            "threads": 2,
            "max_new_tokens": 64,
            "seed": 0,
            "lossless": True,
            "git_sha": "abc",
            "experiment": experiment,
            "draft": "self_layers" if decoder == "triforce" else "none",
            "draft_params": json.dumps(
                {"label": "self-draft: first 4 of 30 layers"} if decoder == "triforce" else {}
            ),
            "decoder_params": json.dumps(dec),
            "kv_params": "{}",
        }
    )
    rows = [
        {
            "run_id": run_id,
            "sample_id": f"s{i}",
            "turn": 0,
            "new_tokens": 64,
            "wall_s": wall,
            "decode_s": wall - 1,
            "forwards": 16 if decoder != "vanilla" else 63,
            "committed": 63,
            "drafted": 40,
            "accepted": 30,
            "drafted_l1": 20,
            "accepted_l1": 2,
            "kv_read_mb": 100.0 if decoder == "vanilla" else 40.0,
            "matches_vanilla": True,
            "prompt_tokens": 100,
        }
        for i in range(2)
    ]
    cols = [c for c in SAMPLE_COLUMNS if c in rows[0]]
    step_rows = [{"run_id": run_id, "sample_id": f"s{i}", "turn": 0, **st} for i in range(2) for st in steps]
    rd.write_sample(
        "all", typed_frame(rows, {c: SAMPLE_COLUMNS[c] for c in cols}).to_dict("records"), step_rows, []
    )
    rd.consolidate()
    rd.mark_complete()


def test_report_from_records(tmp_path):
    root, out = tmp_path / "records", tmp_path / "paper"
    write_run(root, "v", "vanilla", "full", "triforce_pg19_vanilla_cpu", 10.0)
    write_run(root, "t1", "triforce", "retrieval", "triforce_table8a_cpu", 20.0, gamma1=1, gamma2=6)
    write_run(root, "t2", "triforce", "retrieval", "triforce_table8a_cpu", 5.0, gamma1=2, gamma2=6)
    paper.main(["--root", str(root), "--out", str(out)])
    text = (out / "REPORT.md").read_text()
    assert "### TriForce Table 8" in text and "| PG-19 | retrieval | self_layers | 1 | 6 |" in text
    assert "0.5 |" in text and "2 |" in text  # the two speedups vs the vanilla run
    assert "No runs yet: `python run.py -m experiment=triforce_table1_cpu (model=qwen25-coder-0.5b" in text
    assert "No runs yet: `python run.py -m experiment=fafo_table11`" in text
    assert "| LongSpec | Tables 3-4, Figures 3, 5-7 |" in text and "Same protocol, other scale" in text
    assert "### LongSpec Figure 4" in text
    assert "No runs yet: `python run.py -m experiment=longspec_table1_cpu" in text
    # a cell holding two runs is refused in the report, not pooled
    write_run(root, "t2c", "triforce", "retrieval", "triforce_table8a_cpu", 7.0, gamma1=2, gamma2=6)
    paper.main(["--root", str(root), "--out", str(out)])
    text = (out / "REPORT.md").read_text()
    assert "Not made from these records: cell triforce gamma1=2 gamma2=6 on pg19 would pool 2 runs" in text


def test_no_records_is_one_error_line(tmp_path):
    with pytest.raises(SystemExit, match="error: no records under"):
        paper.main(["--root", str(tmp_path), "--out", str(tmp_path / "out")])


def test_cost_section_prices_each_run_on_its_environments_curve(tmp_path):
    """A committed cost curve of the runs' environment: predicted decode speedup beside the measured
    one, with the +-15% count; without one, the command that makes it."""
    from analysis.cost_model import CostCurve, cache_name

    root = tmp_path / "records"
    write_run(root, "v", "vanilla", "full", "", 10.0)
    steps = [
        {
            "step": j,
            "block_tokens": 8,
            "drafted": 7,
            "accepted": 6,
            "committed": 7,
            "kv_attended": 0,
            "draft": False,
            "draft_model": False,
        }
        for j in range(9)
    ]
    write_run(root, "m", "pld", "full", "fafo_baselines", 5.0, steps=steps)
    assert "No cost curve of these records' environment" in "\n".join(paper.cost_section(root, tmp_path))
    key = {"device": "cpu: test", "model": "smollm2-135m", "dtype": "float32", "linear": "aten", "threads": 2}
    curve = CostCurve(key, [1, 8], [64, 256], [[1.0, 1.75], [1.0, 1.75]])
    (tmp_path / "cpu-test").mkdir()
    (tmp_path / "cpu-test" / cache_name(key)).write_text(curve.to_json())
    text = "\n".join(paper.cost_section(root, tmp_path))
    # vanilla: 63 one-row steps (63 s on the curve); pld: 9 forwards of 8 rows (9 x 1.75 s) -> 4.0;
    # measured decode speedup 9 s / 4 s = 2.25
    assert "| fafo_baselines | pld | full | pg19 | 3.94 | 2.25 | 4 | 1.78 |" in text
    assert "0 of 1 runs within +-15%" in text and "FAFO Table 2" in text


def test_summary_shows_predicted_beside_measured(tmp_path, monkeypatch):
    """analysis.summary: the speedup predicted on the environment's committed curve and on the H100
    roofline sit beside the measured one (NaN where no curve of that environment exists)."""
    from analysis import cost_model
    from analysis.cost_model import CostCurve, cache_name
    from analysis.summary import main as summary_main

    root = tmp_path / "records"
    write_run(root, "v", "vanilla", "full", "", 10.0)
    steps = [
        dict(step=j, block_tokens=8, drafted=7, accepted=6, committed=7, kv_attended=0, draft=False,
             draft_model=False)
        for j in range(9)
    ]  # fmt: skip
    write_run(root, "m", "pld", "full", "", 5.0, steps=steps)
    monkeypatch.setattr(cost_model, "BENCH", tmp_path / "bench")
    table = summary_main(["--root", str(root), "--figure", str(tmp_path / "s.png")])
    pld = table[table["decoder"] == "pld"].iloc[0]
    assert pld["pred_speedup"] != pld["pred_speedup"] and pld["pred_H100"] > 1  # no curve here: NaN
    key = {"device": "cpu: test", "model": "smollm2-135m", "dtype": "float32", "linear": "aten", "threads": 2}
    (tmp_path / "bench" / "cpu-test").mkdir(parents=True)
    curve = CostCurve(key, [1, 8], [64, 256], [[1.0, 1.75], [1.0, 1.75]])
    (tmp_path / "bench" / "cpu-test" / cache_name(key)).write_text(curve.to_json())
    table = summary_main(["--root", str(root), "--figure", str(tmp_path / "s.png")])
    pld = table[table["decoder"] == "pld"].iloc[0]
    assert pld["pred_speedup"] == pytest.approx(63 / (9 * 1.75), rel=0.01)


def test_block_auto_section_pairs_auto_runs_with_the_fixed_baselines(tmp_path):
    from analysis.load import load_samples

    root = tmp_path / "records"
    write_run(root, "v", "vanilla", "full", "fafo_baselines", 10.0)
    write_run(root, "p", "pld", "full", "fafo_baselines", 6.0)
    assert "No runs yet" in "\n".join(paper.block_auto_section(load_samples(root)))
    write_run(root, "a", "pld_auto", "full", "block_auto", 5.0)
    text = "\n".join(paper.block_auto_section(load_samples(root)))
    assert "| pg19 | pld_auto+full |" in text and "| pg19 | pld+full |" in text
    assert "| pg19 | vanilla+full | 2 | 1 | 1 |" in text
    assert "| pg19 | pld_auto+full | 2 | 3.94 | 2.25 |" in text  # 63 tokens / 16 forwards; 9 s / 4 s
    # the baselines of a setup with no auto runs (a GPU lease's) stay out of the table and its caption
    write_run(root, "g", "vanilla", "full", "fafo_baselines", 10.0, device="NVIDIA H100")
    text = "\n".join(paper.block_auto_section(load_samples(root)))
    assert text.count("| pg19 | vanilla+full |") == 1 and "H100" not in text


def test_figures_are_filed_by_setup_label_and_stale_ones_removed(tmp_path):
    root, out = tmp_path / "records", tmp_path / "paper"
    write_run(root, "v", "vanilla", "full", "triforce_pg19_vanilla_cpu", 10.0)
    stale = out / "figures" / "setup-of-an-older-build" / "fafo_figure1.png"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"old")
    paper.main(["--root", str(root), "--out", str(out)])
    assert not stale.exists()
    folder = paper.figure_folder(out, "model=qwen25-coder-0.5b, scale=cpu")
    assert folder == out / "figures" / "model-qwen25-coder-0.5b-scale-cpu"
    assert paper.figure_folder(out, "") == out / "figures" / "all"
