#!/usr/bin/env bash
# The wheel shuttle: Python packages to a GPU machine without network, in carries under the device
# tool's limit.
#   here:  bash scripts/device_wheels.sh download; bash scripts/device_wheels.sh pack [--limit MIB]
#   there: bash scripts/device_wheels.sh receive .wheels/batch-NN STAGE   (one batch per call)
#          bash scripts/device_wheels.sh install STAGE TARGET            (join, sha256, pip install --target)
# Steps and options: scripts/device_wheels.py (standard library only); how a session uses it: docs/verl.md.
set -euo pipefail
exec "${PYTHON:-python3}" "$(dirname "$0")/device_wheels.py" "$@"
