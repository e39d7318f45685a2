#!/usr/bin/env bash
# Create .venv (CPU torch pinned) and install ragen_turn with the given extras
# (default: dev,webshop,plot,wandb,stats,lora: tests, WebShop search, report plots, logger=wandb, report intervals,
# LoRA via peft).
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="${1:-dev,webshop,plot,wandb,stats,lora}"
PY="${PYTHON:-python3}"
start=$(date +%s)
if [ ! -x .venv/bin/python ]; then
  echo "[install] creating .venv with $("$PY" --version 2>&1)"
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
echo "[install] installing ragen_turn[$EXTRAS] and CPU torch into .venv (about 3 minutes on a cold pip cache)"
.venv/bin/python -m pip install -q -c constraints-cpu.txt -e ".[${EXTRAS}]"
echo "[install] done in $(( $(date +%s) - start )) s: $(.venv/bin/python -c 'import torch, transformers; print(f"torch {torch.__version__}, transformers {transformers.__version__}")')"
