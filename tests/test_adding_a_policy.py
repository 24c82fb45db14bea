"""docs/adding-a-policy.md, followed literally: its three places (the module, the config, the registry
entry), written into a copy of the repository, give a policy that the registry's and the presets'
tests pick up, that `build_policy` finds by name, and that `run.py` runs: lossy under vanilla, lossless
under FAFO. Nothing else in the repository has to change."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from decoders.registry import DECODERS
from tests.repo_copy import doc_files, doc_lines, follow, overlay, runner

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "adding-a-policy.md"


def test_the_doc_names_exactly_three_places_its_module_config_and_registry_entry():
    text = DOC.read_text()
    assert set(doc_files(text)) == {"kv_policies/recent.py", "conf/kv/recent.yaml"}
    assert set(doc_lines(text)) == {("kv_policies/registry.py", "REGISTRY")}
    assert "three places" in text.split("\n\n")[1]  # the page's own count, in its first paragraph
    assert not (REPO / "kv_policies" / "recent.py").exists()  # the example lives in the doc only


def test_the_doc_policy_is_registered_tested_and_runs(tmp_path):
    root = overlay(tmp_path, extra={"kv_policies"})
    follow(DOC, root)
    run = runner(root)

    # the tests that read the registry and the presets pick it up
    k = "recent or registered"
    tests = run(
        "-m", "pytest", "-v", "-p", "no:cacheprovider", "-m", "not smollm", "-k", k,
        "tests/test_configs.py", "tests/test_every_method.py",
    )  # fmt: skip
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]
    for test in (
        "test_option_composes[kv=recent]",
        "test_kv_option_instantiates[recent]",
        "test_every_preset_validates_against_its_config[kv-recent]",
        "test_every_registered_method_has_its_config_and_preset[kv]",
        # the one suite: every registered decoder under it, in both layouts (tests/test_every_method.py)
        *(
            f"test_greedy_equals_vanilla_and_the_cache_ends_as_vanillas[{model}-{decoder}-recent-{layout}]"
            for model in ("llama", "qwen2")
            for decoder in DECODERS
            for layout in ("dense", "sliced")
        ),
    ):
        assert f"{test} PASSED" in tests.stdout, tests.stdout[-3000:]
    found = run("-c", "from kv_policies.registry import build_policy; print(build_policy('recent').name)")
    assert found.stdout.strip() == "recent", found.stderr[-2000:]
    out = tmp_path / "records"
    for decoder, budget in (("vanilla", 8), ("fafo", 8)):
        cli = run(
            "run.py",
            f"decoder={decoder}",
            "kv=recent",
            f"kv.budget={budget}",
            "model=tiny_llama",
            "run.limit=2",
            "run.max_new_tokens=16",
            f"run.out_dir={out}",
        )
        assert cli.returncode == 0, cli.stdout[-3000:] + cli.stderr[-2000:]
        (run_dir,) = out.glob(f"runs/*-{decoder}-recent-*")
        rows = pd.read_parquet(run_dir / "samples.parquet")
        assert len(rows) >= 2 and rows["error"].isna().all()
        if decoder == "fafo":  # verification reads the full cache: lossless under any policy
            assert rows["matches_vanilla"].all()
        # identified by its name and its options' values, not by its module
        params = json.loads(pd.read_parquet(run_dir / "runs.parquet")["kv_params"].iloc[0])
        assert params == {
            "method": "recent",
            "budget": 8,
            "backend": "dense",
            "budget_frac": None,
            "dense_layers": 0,
        }
