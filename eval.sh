#!/usr/bin/env bash
# Usage: bash eval.sh <env> <checkpoint_dir | run_dir | model_dir> [--out FILE.json] [hydra overrides...]
#   bash eval.sh sokoban runs/sokoban_turn_ppo_tiny_s0/checkpoints/step_000030
# Success rate, mean reward, mean turns and invalid-action rate on held-out seeds (table + JSON). The JSON goes
# to --out, else into the checkpoint's run dir (<run>/eval/<env>_<step>.json), else to
# <runs>/eval_<model>/eval_<env>.json: never into the model directory it reads.
set -euo pipefail
CALLER=$PWD  # --out is relative to where the command was typed
cd "$(dirname "$0")"
if [ $# -lt 2 ]; then
  echo "usage: bash eval.sh <env> <checkpoint_dir | run_dir | model_dir> [--out FILE.json] [overrides]" >&2
  exit 2
fi
ENV_NAME=$1; CKPT=$2; shift 2
quote() {  # an absolute path (relative to where the command was typed), quoted for Hydra's override grammar
  local p; p=$(cd "$CALLER" && realpath -m -- "$1"); p=${p//\\/\\\\}; printf "%s" "${p//\'/\\\'}"
}
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) [ $# -ge 2 ] || { echo "error: --out needs a file name" >&2; exit 2; }
           args+=("+eval_output='$(quote "$2")'"); shift 2 ;;
    --out=*) args+=("+eval_output='$(quote "${1#--out=}")'"); shift ;;
    *) args+=("$1"); shift ;;
  esac
done
set -- "${args[@]+"${args[@]}"}"
. scripts/python.sh
# quoted for Hydra's override grammar: run names hold '=' and ',' (e.g. ..._s0_algorithm.gamma=0.95,algorithm.lam=1.0)
Q=${CKPT//\\/\\\\}; Q=${Q//\'/\\\'}
# Hydra writes nothing of its own (no run dir named after these overrides, no .hydra, no log file)
exec "$PY" -m ragen_turn.evaluate env="$ENV_NAME" +checkpoint="'$Q'" hydra.run.dir=. hydra.output_subdir=null hydra/job_logging=disabled "$@"
