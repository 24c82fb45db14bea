"""docs/adding-a-decoder.md, followed literally: its three places (the module, the config, the registry
entry), written into a copy of the repository, give a decoder that the registry's and the presets'
tests pick up and that `run.py` runs by its config name with every output matching vanilla greedy.
Nothing else in the repository has to change."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from tests.repo_copy import doc_files, doc_lines, follow, overlay, runner

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "adding-a-decoder.md"


def test_the_doc_names_exactly_three_places_its_module_config_and_registry_entry():
    text = DOC.read_text()
    assert set(doc_files(text)) == {"decoders/bigram.py", "conf/decoder/bigram.yaml"}
    assert set(doc_lines(text)) == {("decoders/registry.py", "DECODERS")}
    assert "three places" in text.split("\n\n")[1]  # the page's own count, in its first paragraph
    assert not (REPO / "decoders" / "bigram.py").exists()  # the example lives in the doc only


def test_the_doc_decoder_is_registered_tested_and_runs_losslessly(tmp_path):
    root = overlay(tmp_path)
    follow(DOC, root)
    run = runner(root)

    # the tests that read the registry and the presets pick it up
    k = "bigram or registered"
    tests = run("-m", "pytest", "-v", "-p", "no:cacheprovider", "tests/test_configs.py", "-k", k)
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]
    # and the one suite every registered decoder runs (tests/test_every_method.py): lossless greedy under
    # every policy, stop and length, sampling in distribution, fixed-shape forwards
    suite = run("-m", "pytest", "-v", "-p", "no:cacheprovider", "tests/test_every_method.py", "-k", "bigram")
    assert suite.returncode == 0, suite.stdout[-3000:] + suite.stderr[-2000:]
    for test in ("greedy_equals_vanilla", "stop_token_and_length", "sampling_is_lossless", "fixed_shape"):
        assert re.search(rf"test_{test}\w*\[[^]]*bigram[^]]*\] PASSED", suite.stdout), suite.stdout[-3000:]
    for test in (
        "test_option_composes[decoder=bigram]",
        "test_decoder_option_instantiates[llama-bigram]",
        "test_decoder_option_instantiates[qwen2-bigram]",
        "test_every_preset_validates_against_its_config[decoder-bigram]",
        "test_every_registered_method_has_its_config_and_preset[decoder]",
    ):
        assert f"{test} PASSED" in tests.stdout, tests.stdout[-3000:]
    out = tmp_path / "records"
    cli = run(
        "run.py",
        "decoder=bigram",
        "model=tiny_llama",
        "run.limit=2",
        "run.max_new_tokens=16",
        f"run.out_dir={out}",
    )
    assert cli.returncode == 0, cli.stdout[-3000:] + cli.stderr[-2000:]
    (run_dir,) = out.glob("runs/*-bigram-full-*")
    rows = pd.read_parquet(run_dir / "samples.parquet")
    assert len(rows) >= 2 and rows["matches_vanilla"].all() and rows["error"].isna().all()
    # identified by its method name and its options' values, not by its module
    params = json.loads(pd.read_parquet(run_dir / "runs.parquet")["decoder_params"].iloc[0])
    assert params == {"method": "bigram", "draft_len": 4}
