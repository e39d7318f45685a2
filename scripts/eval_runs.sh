#!/usr/bin/env bash
# Evaluate the last checkpoint of every finished run under a directory, once, and save the result as
# <run>/eval_<name>.json, which `python -m ragen_turn.report` shows as a "<name> success" column.
#
#   bash scripts/eval_runs.sh <runs_dir> <name> [eval.sh overrides...]
#   bash scripts/eval_runs.sh runs/sweep_algos greedy actor_rollout_ref.rollout.val_temperature=0
#
# Each run is evaluated under its own settings (eval.sh reads the run's config) plus the overrides given.
# Skipped: runs whose latest checkpoint is not their last step (not finished), and runs that already have
# eval_<name>.json (delete it to evaluate again).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 2 ]; then
  echo "usage: bash scripts/eval_runs.sh <runs_dir> <name> [eval.sh overrides...]" >&2
  exit 2
fi
ROOT=$1; NAME=$2; shift 2
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
n=0
while IFS= read -r latest; do
  run=$(dirname "$(dirname "$latest")")
  out="$run/eval_${NAME}.json"
  if [ -e "$out" ]; then continue; fi
  # env name, and whether the latest checkpoint is the run's last step (a run still going is skipped)
  read -r env_name done_ <<<"$("$PY" -c "
import sys, yaml
c = yaml.safe_load(open(sys.argv[1]))
print(c['env']['name'], open(sys.argv[2]).read().strip() == 'step_%06d' % c['trainer']['total_training_steps'])
" "$run/config.yaml" "$latest")"
  if [ "$done_" != True ]; then echo "[eval_runs] $run: not finished, skipped"; continue; fi
  echo "[eval_runs] $run ($env_name) -> $out"
  bash eval.sh "$env_name" "$run" +eval_output="$out" "$@" | tail -n 3
  n=$((n + 1))
done < <(find "$ROOT" -path '*/checkpoints/latest' -type f | sort)
echo "[eval_runs] evaluated $n run(s)"
