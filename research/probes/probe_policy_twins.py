"""Greedy token ids under kv=h2o and kv=sfi, eager and on the fixed-shape forwards (issue #96).

The fast paths of H2O (`h2o_steady.py`) and SFI (`observe_layers`, `gather_evidence_layers`) were
folded into one rule each; this probe writes every id a grid of decoders, budgets, tiny random models
and prompts produce, so the ids of two commits can be compared (`--compare old.json new.json`):
run it in a worktree of each commit (imports resolve to the working directory).

    python -m research.probes.probe_policy_twins --out /tmp/new.json
    python -m research.probes.probe_policy_twins --compare /tmp/old.json /tmp/new.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys

import torch

from core.types import Counts, HarnessError

# prompts unlike the test suite's (other seeds and lengths), over the tiny models' 256-token vocabulary
PROMPT_LENS = (37, 83)
N_NEW = 36
POLICIES = {
    "h2o-b16-r4": ("h2o", {"budget": 16, "recent": 4}),
    "h2o-b22": ("h2o", {"budget": 22}),
    "h2o-frac0.3": ("h2o", {"budget": 8, "recent": 3, "budget_frac": 0.3}),
    "h2o-sliced": ("h2o", {"budget": 18, "recent": 6, "backend": "sliced"}),
    "sfi-k6": ("sfi", {"k": 6, "sinks": 2, "recent": 5, "window": 3}),
    "sfi-sliced": ("sfi", {"k": 6, "sinks": 2, "recent": 6, "window": 3, "backend": "sliced"}),
    "sfi-frac0.4": ("sfi", {"k": 4, "sinks": 2, "recent": 4, "window": 2, "budget_frac": 0.4}),
}
DECODERS = {
    "vanilla": ("vanilla", {}),
    "selfspec": ("selfspec", {"gamma": 3}),
    "fafo": ("fafo", {"k": 2, "n": 4}),
    "triforce": ("triforce", {"gamma1": 2, "gamma2": 4}),
    "sfi": ("sfi", {"t_max": 4, "trigger_token_ids": frozenset({9, 17})}),
}


def prompts(seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(1000 + seed)
    out = [torch.randint(3, 250, (n,), generator=gen).tolist() for n in PROMPT_LENS]
    out.append([11, 12, 13, 14] * 12 + torch.randint(3, 250, (20,), generator=gen).tolist())  # repeats
    return out


def state(policy: object, eng: object) -> list:
    """What the policy holds at the end: H2O's alive flags and scores (rounded to 1e-4: the fixed-shape
    update sums in another order), SFI's chosen entries. Tiny random models keep H2O's earliest
    entries whatever the decode adds, so the ids alone would hide a divergent score."""
    if getattr(policy, "_A", None) is not None:
        n = eng.length  # type: ignore[attr-defined]
        alive = policy._A[:, :, :n].nonzero().tolist()  # type: ignore[attr-defined]
        return [alive, [round(x, 4) for x in policy._S[:, :, :n].flatten().tolist()]]  # type: ignore[attr-defined]
    return [sorted((layer, sel.tolist()) for layer, sel in getattr(policy, "_sel", {}).items())]


def run_grid() -> dict[str, object]:
    from core.engine import Engine
    from core.models import load_model
    from decoders.registry import build_decoder
    from kv_policies.registry import build_policy

    torch.set_num_threads(1)
    ids: dict[str, object] = {}
    for arch, seed in itertools.product(("llama", "qwen2"), (2, 3)):
        lm = load_model("tiny", "tiny", arch=arch, dtype="float32", device="cpu", seed=seed)
        for (pname, (kv, kv_args)), (dname, (dec, dec_args)) in itertools.product(
            POLICIES.items(), DECODERS.items()
        ):
            if dec == "sfi" and kv != "sfi":
                continue  # decoder=sfi needs kv=sfi
            for mode in ("eager", "fixed"):
                for pi, prompt in enumerate(prompts(seed)):
                    key = f"{arch}/s{seed}/{pname}/{dname}/{mode}/p{pi}"
                    eng = Engine(lm.model)
                    if mode == "fixed":
                        eng.use_graphs(capture=False)  # the fixed-shape forwards, run eagerly (a CPU)
                    try:
                        policy = build_policy(kv, **kv_args)
                        decoder = build_decoder(dec, eng, kv=policy, **dec_args)
                        ids[key] = [decoder.generate(prompt, N_NEW, set(), Counts()), state(policy, eng)]
                    except (HarnessError, RuntimeError, ValueError, TypeError) as exc:
                        ids[key] = f"error: {type(exc).__name__}: {str(exc)[:120]}"
            print(arch, seed, pname, dname, file=sys.stderr, flush=True)
    return ids


def agree(eager: list, fixed: list) -> bool:
    """Same ids and chosen entries, scores within 2e-4 (rounded to 1e-4; they differ by ~1e-7)."""
    (ids, st), (ids2, st2) = eager, fixed
    if ids != ids2 or st[0] != st2[0] or len(st) != len(st2):
        return False
    return len(st) == 1 or max((abs(a - b) for a, b in zip(st[1], st2[1], strict=True)), default=0) <= 2e-4


def compare(old_path: str, new_path: str) -> int:
    with open(old_path) as fh_old, open(new_path) as fh_new:
        old, new = json.load(fh_old), json.load(fh_new)
    same_old = diff_old = same_mode = diff_mode = errors = 0
    for key in sorted(new):
        if isinstance(new[key], str):
            errors += 1
            print("error", key, new[key])
            continue
        if old.get(key) == new[key]:  # ids and the policy's state
            same_old += 1
        else:
            diff_old += 1
            print("differs from old:", key)
        if key.split("/")[4] == "fixed":
            eager = new[key.replace("/fixed/", "/eager/")]
            if agree(eager, new[key]):
                same_mode += 1
            else:
                diff_mode += 1
                print("fixed-shape differs from eager:", key)
    print(
        f"{len(new)} runs ({errors} errors): new == old {same_old}, differ {diff_old}; "
        f"fixed-shape == eager {same_mode}, differ {diff_mode}"
    )
    return 1 if diff_old or diff_mode or errors else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the ids of this working tree here (JSON)")
    ap.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"), help="compare two --out files")
    args = ap.parse_args()
    if args.compare:
        return compare(*args.compare)
    if not args.out:
        print("error: give --out FILE or --compare OLD NEW", file=sys.stderr)
        return 2
    ids = run_grid()
    with open(args.out, "w") as fh:
        json.dump(ids, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
