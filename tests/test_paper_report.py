"""analysis.paper (`make paper`): the report rebuilds from records alone, fills the tables that have
runs, names the command for those that do not, says why a table was not made, and lists what the
harness cannot reproduce."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from analysis import paper, report_parts
from tests.synthetic_runs import write_run


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
    assert "| LongSpec | Table 3, Figures 5-7 |" in text and "Same protocol, other scale" in text
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
    assert "0 of 1 runs with a measured speedup within +-15%" in text and "FAFO Table 2" in text


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
    folder = paper.figure_folder(out, "cpu-epyc2-fp32-qwen25-coder-0.5b@cpu")
    assert folder == out / "figures" / "cpu-epyc2-fp32-qwen25-coder-0.5b-cpu"
    assert paper.figure_folder(out, "") == out / "figures" / "all"


def fafo_records(root, sha: str = "abc") -> None:
    """FAFO Table 1's MT-Bench runs: FAFO-Stream and vanilla only (Lookahead, FAFO-2forward, TriForce and
    SWIFT have no run), plus TriForce Table 8's PG-19 runs on a GPU (a second setup)."""
    write_run(root, "v", "vanilla", "full", "fafo_baselines", 10.0, task="mtbench", sha=sha)
    write_run(
        root,
        "f",
        "fafo",
        "streaming",
        "fafo_table1",
        5.0,
        task="mtbench",
        sha=sha + "-dirty-0123456789",
        n=40,
    )
    write_run(root, "gv", "vanilla", "full", "triforce_pg19_vanilla_cpu", 10.0, device="NVIDIA H200", sha=sha)
    write_run(root, "gt", "triforce", "retrieval", "triforce_table8a_cpu", 5.0, device="NVIDIA H200", sha=sha,
              gamma1=1, gamma2=6)  # fmt: skip


def tables(text: str) -> list[list[str]]:
    """The markdown tables of `text`, each as its lines."""
    out, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            out.append(current)
            current = []
    return out


def test_report_reads_at_a_glance(tmp_path):
    """A table of contents; the setups named once in a legend; each table's caption one line naming its
    setup and code version (-dirty flagged); no row without a run of ours, those rows listed under
    "Not reproduced, and why" with the reason; no absolute path."""
    root, out = tmp_path / "records", tmp_path / "paper"
    fafo_records(root)
    paper.main(["--root", str(root), "--out", str(out)])
    text = (out / "REPORT.md").read_text()
    lines = text.splitlines()
    # the table of contents links every section and table heading
    toc = lines[lines.index("## Contents") + 2 : lines.index("## Setups")]
    headings = [line.lstrip("#").strip() for line in lines if line.startswith(("## ", "### "))]
    assert [t.split("](")[0].lstrip(" -[") for t in toc if t] == [h for h in headings if h != "Contents"]
    assert (
        "  - [FAFO Table 1](#fafo-table-1)" in toc
        and "- [Not reproduced, and why](#not-reproduced-and-why)" in toc
    )
    # the legend defines each setup's short name once, with model, dtype, device, threads, linear, scale
    legend = tables(text[text.index("## Setups") :])[0]
    assert legend[0] == "| setup | model | dtype | device | threads | linear | scale | ran | runs | code |"
    assert any(
        row.startswith("| `cpu-test2-fp32@paper` | smollm2-135m | float32 | cpu: test | 2 |")
        for row in legend
    )
    assert any(
        row.startswith("| `h200-fp32@paper` | smollm2-135m | float32 | NVIDIA H200 | 2 |") for row in legend
    )
    # captions: one line each, naming a legend setup and the code version of the table's runs
    captions = [line for line in lines if line.startswith("**") and " · setup `" in line]
    assert captions and all(len(c) < 300 for c in captions)
    t1 = next(c for c in captions if c.startswith("**FAFO Table 1"))
    assert "setup `cpu-test2-fp32@paper`" in t1 and "code: 2 versions, 1 of them -dirty" in t1
    t8 = next(c for c in captions if c.startswith("**TriForce Table 8"))
    assert "setup `h200-fp32@paper`" in t8 and "code `abc`" in t8 and "dirty" not in t8
    assert "Setups in these records" not in text and "code versions abc" not in text
    # no empty row and no block of rows without runs
    assert "no runs" not in text and "nan vs nan" not in text
    for table in tables(text):
        head = [c.strip() for c in table[0].strip("|").split("|")]
        ours = [i for i, c in enumerate(head) if c.startswith("ours_") and not c.endswith(paper.NOT_MEASURES)]
        for row in table[2:]:
            cells = [c.strip() for c in row.strip("|").split("|")]
            assert any(cells[1:]), row
            assert not ours or any(cells[i] for i in ours), row
    fafo_t1 = tables(text[text.index("### FAFO Table 1") :])[0]
    assert [r.split("|")[1].strip() for r in fafo_t1[2:]] == ["FAFO-Stream"]
    # the rows left out are listed under "Not reproduced, and why" with their reason
    gaps = text[text.index("## Not reproduced, and why") :]
    swift = "| FAFO | Table 1 | `cpu-test2-fp32@paper` | SWIFT | no run of this setup: `python run.py -m "
    swift += "experiment=fafo_swift` (the cpu slice runs MT-Bench alone"
    assert swift in gaps
    assert (
        "| FAFO | Table 1 | `cpu-test2-fp32@paper` | FAFO-2forward; Lookahead | no run of this setup: "
        in gaps
    )
    # the code versions section flags the -dirty run and prices a rerun: 2 x 9 s + 2 x 4 s of decode
    code = text[text.index("## Code versions") : text.index("## Not reproduced")]
    assert "| FAFO Table 1 | `cpu-test2-fp32@paper` | 2 | abc (1), abc-dirty (1) | 1 | no | 0.4 min |" in code
    # relative paths only
    assert str(tmp_path) not in text and "/records" not in text.replace("`../records`", "")


def test_two_builds_are_byte_identical_and_leave_files_alone(tmp_path):
    """A second build from the same records writes the same bytes and rewrites no file (figures
    included), so `make paper` on a clean checkout leaves `git status` clean; a figure no longer made
    is removed."""
    root, out = tmp_path / "records", tmp_path / "paper"
    fafo_records(root)
    write_run(root, "f10", "fafo", "streaming", "fafo_figure1", 6.0, task="mtbench", n=10)  # Figure 1's PNG
    paper.main(["--root", str(root), "--out", str(out)])
    files = sorted(p for p in out.rglob("*") if p.is_file())
    assert any(p.name == "fafo_figure1.png" for p in files)
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in files}
    stale = out / "figures" / "gone" / "old.png"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"old")
    paper.main(["--root", str(root), "--out", str(out)])
    assert sorted(p for p in out.rglob("*") if p.is_file()) == files and not stale.parent.exists()
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in files} == before
    assert all(b"matplotlib" not in p.read_bytes() for p in files if p.suffix == ".png")


def test_setup_names():
    key = {"device_name": "cpu: AMD EPYC 7B13 [avx512_bf16] x2 threads", "threads": "2", "dtype": "float32"}
    assert (
        paper.setup_name({**key, "model": "smollm2-135m", "scale": "cpu"}) == "cpu-epyc2-avx512bf16-fp32@cpu"
    )
    plain = {**key, "device_name": "cpu: AMD EPYC x2 threads"}  # records made before ISA features were named
    assert paper.setup_name({**plain, "model": "smollm2-135m", "scale": "cpu"}) == "cpu-epyc2-fp32@cpu"
    gpu = {"device_name": "NVIDIA H100 80GB HBM3", "threads": "16", "dtype": "bfloat16", "scale": "paper"}
    assert paper.setup_name({**gpu, "model": "qwen25-coder-0.5b"}) == "h100-bf16-qwen25-coder-0.5b@paper"


def test_setups_told_apart_by_sampling_are_named_by_temperature():
    def run(run_id: str, sampling: str) -> dict:
        return {
            "run_id": run_id,
            "model": "smollm2-135m",
            "dtype": "float32",
            "device_name": "cpu: AMD EPYC x2 threads",
            "threads": 2,
            "scale": "cpu",
            "sampling": sampling,
        }

    greedy = '{"temperature": 0.0, "top_p": 1.0, "top_k": 0}'
    hot = '{"temperature": 0.6, "top_p": 0.9, "top_k": 0}'
    names = [s.name for s in report_parts.setups(pd.DataFrame([run("a", greedy), run("b", hot)]))]
    assert names == ["cpu-epyc2-fp32@cpu+T=0", "cpu-epyc2-fp32@cpu+T=0.6,top_p=0.9"]


def test_the_committed_report_stays_readable():
    """#95: a researcher reads REPORT.md as text too: no line over 400 characters (the gap table's
    merged setups and reasons once ran to 438), and every table is reachable from the contents."""
    text = (Path(__file__).resolve().parents[1] / "results" / "paper" / "REPORT.md").read_text()
    long = [(i, len(line)) for i, line in enumerate(text.splitlines(), 1) if len(line) > 400]
    assert not long, f"lines over 400 characters (line, length): {long}"
    contents = text.split("## Contents", 1)[1].split("\n## ", 1)[0]
    for title in (line[3:] for line in text.splitlines() if line.startswith("## ") and line != "## Contents"):
        assert f"[{title}]" in contents, title
