"""Hydra entry point: compose the config, run it, print one clear line on a user error.

python run.py                                   # SmolLM2 + vanilla + full KV on MT-Bench
python run.py decoder=fafo kv=quest task=mtbench
python run.py -m decoder=vanilla,lookahead,fafo launcher=slurm
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

from core.types import HarnessError

CONF = Path(__file__).resolve().parent / "conf"


def check_group_choices(argv: list[str]) -> None:
    """Fail fast, in one line, on `group=option` overrides that name no config file."""
    for arg in argv:
        key, sep, value = arg.lstrip("+~").partition("=")
        group = CONF / key
        if not sep or "." in key or not group.is_dir() or value in ("", "null"):
            continue
        options = sorted(p.stem for p in group.glob("*.yaml"))
        for choice in value.split(","):
            if choice.startswith(("glob(", "range(")):
                continue
            if choice not in options:
                sys.exit(f"error: unknown {key} {choice!r}; available: {', '.join(options)}")


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    from runners.runner import run

    with open_dict(cfg):
        cfg.choices = {k: v for k, v in HydraConfig.get().runtime.choices.items() if "/" not in k}
    try:
        run(cfg)
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    check_group_choices(sys.argv[1:])
    main()
