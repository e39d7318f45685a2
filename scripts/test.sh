#!/usr/bin/env bash
# Install (into .venv) and run the fast test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh dev,webshop
.venv/bin/python -m pytest tests -q "$@"
