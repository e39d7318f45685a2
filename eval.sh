#!/usr/bin/env bash
# Usage: bash eval.sh <env> <checkpoint_dir> [hydra overrides...]
#   bash eval.sh sokoban runs/sokoban_turn_ppo_tiny_s0/checkpoints/step_000030
# Success rate, mean reward, mean turns and invalid-action rate on held-out seeds (table + JSON).
set -euo pipefail
cd "$(dirname "$0")"
if [ $# -lt 2 ]; then
  echo "usage: bash eval.sh <env> <checkpoint_dir | run_dir> [overrides]" >&2
  exit 2
fi
ENV_NAME=$1; CKPT=$2; shift 2
. scripts/python.sh
# quoted for Hydra's override grammar: run names hold '=' and ',' (e.g. ..._s0_algorithm.gamma=0.95,algorithm.lam=1.0)
Q=${CKPT//\\/\\\\}; Q=${Q//\'/\\\'}
# Hydra writes nothing of its own (no run dir named after these overrides, no .hydra, no log file)
exec "$PY" -m ragen_turn.evaluate env="$ENV_NAME" +checkpoint="'$Q'" hydra.run.dir=. hydra.output_subdir=null hydra/job_logging=disabled "$@"
