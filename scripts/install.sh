#!/usr/bin/env bash
# Create .venv (CPU torch pinned) and install ragen_turn with the given extras (default: dev,webshop).
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="${1:-dev,webshop}"
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install -q -c constraints-cpu.txt -e ".[${EXTRAS}]"
