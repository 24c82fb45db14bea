"""One side of `benchmarks.ab`: a long-lived process that imports the harness from ONE source tree
and answers timed bursts on request, so that the lead can alternate two trees many times in a sitting.

    python <any tree>/benchmarks/ab_worker.py <tree>      # started by benchmarks.ab, not by hand

The script is the lead's copy, run with `<tree>` first on `sys.path` (and as the working directory),
so it must use only interfaces every compared revision has: the Hydra config (`conf/`), the runner's
`Runner` for the model and engine, `runners.config.build` for each decoder, `Counts`, `Decoder.generate`
and `Engine.prefill/step/commit/crop`. One JSON line per request on stdin, one JSON line per reply on
the protocol descriptor (everything else the harness prints goes to stderr):

- `{"op": "setup", "decoders": [...], "overrides": [...], "threads": 2, "out_dir": ...}`: compose each
  decoder's config (`decoder=<name>` + overrides) and build it over one shared model and engine.
- `{"op": "burst", "decoder": name, "prompt": [ids], "tokens": n}`: one greedy generation; returns the
  seconds from the end of the prefill to the last token, the tokens decoded and a digest of the ids.
- `{"op": "burst", "decoder": "forward", "prompt": [ids], "tokens": n}`: n one-row forwards of the
  engine over the prompt's cache (the per-forward microbenchmark; no decoder logic).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

FORWARD = "forward"  # the pseudo-decoder of the per-forward microbenchmark


def _protocol_stream():
    """The reply channel: a duplicate of stdout; stdout itself then points at stderr, so prints and
    progress bars of the harness never reach the lead's parser."""
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    return reply


class Side:
    def __init__(self, tree: Path, decoders: list[str], overrides: list[str], threads: int, out_dir: str):
        from hydra import compose, initialize_config_dir

        from runners.config import build
        from runners.runner import Runner

        try:  # a revision whose presets extend their method's Config (runners.schemas) registers it first
            # deferred: imported from the tree main() put first on sys.path (absent in older revisions)
            from runners.schemas import register_schemas
        except ImportError:  # an older revision: its presets are whole
            pass
        else:
            register_schemas()
        base = ["model.dtype=float32", "run.audit=false", f"run.threads={threads}", f"run.out_dir={out_dir}"]
        self.decoders: dict[str, Any] = {}
        with initialize_config_dir(config_dir=str(tree / "conf"), version_base=None):
            first = [d for d in decoders if d != FORWARD][:1] or ["vanilla"]
            self.runner = Runner(compose("config", overrides=[f"decoder={first[0]}", *base, *overrides]))
            self.engine = self.runner.engine
            for name in decoders:
                if name == FORWARD:
                    continue
                if name == first[0]:
                    self.decoders[name] = self.runner.decoder
                    continue
                cfg = compose("config", overrides=[f"decoder={name}", *base, *overrides])
                partial = build(cfg.decoder, "decoder")
                self.decoders[name] = partial(
                    engine=self.engine, kv=build(cfg.kv, "kv"), sampler=self.runner.sampler
                )

    def burst(self, decoder: str, prompt: list[int], tokens: int) -> dict[str, Any]:
        if decoder == FORWARD:
            return self._forwards(prompt, tokens)
        # deferred: the harness is imported from the tree main() put first on sys.path, never the lead's
        from core.types import Counts

        marks: list[float] = []
        counts = Counts(on_prefill_done=lambda: marks.append(time.perf_counter()), keep_steps=False)
        out = self.decoders[decoder].generate(prompt, tokens, set(), counts)
        end = time.perf_counter()
        digest = hashlib.sha1(json.dumps(out).encode()).hexdigest()[:12]
        return {"seconds": end - marks[0], "tokens": len(out), "digest": digest}

    def _forwards(self, prompt: list[int], n: int) -> dict[str, Any]:
        import torch

        from core.attention import CausalView

        eng = self.engine
        eng.reset(len(prompt) + n + 1)
        logits = eng.prefill(prompt)
        tok = torch.tensor([int(logits.argmax())])
        view = CausalView(eng.scale)
        start = time.perf_counter()
        for i in range(n):
            logits = eng.step(tok, torch.tensor([len(prompt) + i]), view)
            eng.commit([0])
            tok = logits[0].argmax().reshape(1)
        seconds = time.perf_counter() - start
        return {"seconds": seconds, "tokens": n, "digest": str(int(tok))}


def main() -> None:
    tree = Path(sys.argv[1]).resolve()
    here = str(Path(__file__).resolve().parent)
    sys.path[:] = [str(tree)] + [p for p in sys.path if p not in ("", here)]
    os.chdir(tree)
    reply = _protocol_stream()
    side: Side | None = None
    for line in sys.stdin:
        req = json.loads(line)
        try:
            if req["op"] == "setup":
                side = Side(tree, req["decoders"], req["overrides"], req["threads"], req["out_dir"])
                import core  # deferred: see burst(): from the compared tree

                ans: dict[str, Any] = {"ok": True, "core": core.__file__}
            else:
                assert side is not None, "setup first"
                ans = {"ok": True, **side.burst(req["decoder"], req["prompt"], req["tokens"])}
        except Exception as exc:  # noqa: BLE001 - the lead prints it and stops both sides
            ans = {"ok": False, "error": f"{exc.__class__.__name__}: {exc}"}
        reply.write(json.dumps(ans) + "\n")


if __name__ == "__main__":
    main()
