#!/usr/bin/env bash
# Usage: bash eval.sh [<env>] <checkpoint_dir | run_dir | model_dir> [--out FILE.json] [hydra overrides...]
#        bash eval.sh --config-name <name> model_path=<checkpoint_dir | run_dir | model_dir> [overrides...]  (RAGEN's)
#   bash eval.sh runs/sokoban_turn_ppo_tiny_s0                   # a run: its own env groups (its config's val tags)
#   bash eval.sh sokoban runs/sokoban_turn_ppo_tiny_s0/checkpoints/step_000030
# Success rate, mean reward, mean turns and invalid-action rate on held-out seeds (table + JSON). A run (or a
# checkpoint inside one) is evaluated on its own env groups with its own settings: an <env> or --config-name that is
# not the run's stops (exit 2, naming both). A model directory outside any run is evaluated on <env> (default
# sokoban) or on the named config's envs. The JSON goes to --out, else into the checkpoint's run dir
# (<run>/eval/<env>_<step>.json), else to <runs>/eval_<model>/eval_<env>.json: never into the model directory it reads.
set -euo pipefail
CALLER=$PWD  # --out is relative to where the command was typed
cd "$(dirname "$0")"
usage() {
  echo "usage: bash eval.sh [<env>] <checkpoint_dir | run_dir | model_dir> [--out FILE.json] [overrides]" >&2
  echo "       bash eval.sh --config-name <name> model_path=<checkpoint_dir | run_dir | model_dir> [overrides]" >&2
  exit 2
}
is_dir() { [ -d "$1" ] || [ -d "$CALLER/$1" ]; }
PICK=()
case "${1:-}" in
  --config-name|-cn) [ $# -ge 2 ] || usage; PICK=(--config-name "$2"); shift 2 ;;
  --config-name=*) PICK=(--config-name "${1#--config-name=}"); shift ;;
esac
CKPT=
if [ ${#PICK[@]} -gt 0 ]; then  # RAGEN's form: the model is model_path= (or actor_rollout_ref.model.path=)
  for a in "$@"; do
    case "$a" in model_path=*|actor_rollout_ref.model.path=*) CKPT=${a#*=}; CKPT=${CKPT//\"/}; CKPT=${CKPT//\'/} ;; esac
  done
  [ -n "$CKPT" ] || { echo "error: --config-name ${PICK[1]}: give the model to evaluate: model_path=<checkpoint_dir | run_dir | model_dir>" >&2; exit 2; }
  case "$CKPT" in /*) ;; *) [ -d "$CKPT" ] || CKPT=$CALLER/$CKPT ;; esac
elif [ $# -ge 1 ] && is_dir "$1" && { [ $# -eq 1 ] || [[ "$2" == *=* ]] || [[ "$2" == --* ]]; }; then
  CKPT=$1; shift  # no <env>: the run's own envs
  case "$CKPT" in /*) ;; *) [ -d "$CKPT" ] || CKPT=$CALLER/$CKPT ;; esac
else
  [ $# -ge 2 ] || usage
  PICK=("env=$1"); CKPT=$2; shift 2
fi
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
exec "$PY" -m ragen_turn.evaluate "${PICK[@]+"${PICK[@]}"}" +checkpoint="'$Q'" hydra.run.dir=. hydra.output_subdir=null hydra/job_logging=disabled "$@"
