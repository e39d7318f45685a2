#!/usr/bin/env bash
# Equal tuning (results/tuning/README.md): the same grid, the same dev seeds and the same rule for every algorithm of a
# comparison, baselines included. benchmarks/one_update.py --tune: for each dev run seed (100+: never a comparison's
# batch, docs/SPEC.md "Tuning seeds and evaluation seeds") one batch from the setting's committed warm start, and for
# every algorithm x actor lr x clip multiplier (on the algorithm's shipped clip range) one update and a fresh rollout;
# then per algorithm the grid point with the best mean fresh success among those whose mean format errors are within
# TOL of token_ppo's shipped point (lr 2e-4, clip x1), each number a mean and 95% t interval over the batches.
#
#   bash scripts/tune.sh long_turns                                  # ALGOS x LRS x CLIPS on SEEDS
#   ALGOS="token_ppo turn_ppo" LRS="1e-4 2e-4" bash scripts/tune.sh long_turns
#   PARALLEL=2 bash scripts/tune.sh long_turns                       # the seeds split over 2 processes
#   bash scripts/tune.sh long_turns --summarize                      # the table and choices from the rows so far
#
# Environment: ALGOS ("token_ppo turn_ppo grpo st_ppo"), LRS ("2e-4 1e-4 4e-4": the shipped lr first), CLIPS ("1"),
# SEEDS ("100 101 102 103 104"), TOL (0.1), PARALLEL (1), OUT (results/tuning/<setting>: rows go to OUT.part<i>.jsonl,
# the printed lines to OUT.part<i>.txt). Resumable: a (grid point, seed) already in a part file is not run again, so
# the same command (or one with more LRS / CLIPS) continues where a stopped call left off.
set -euo pipefail
cd "$(dirname "$0")/.."
SETTING=${1:?usage: bash scripts/tune.sh <setting> [--summarize]}
PY=${PYTHON:-.venv/bin/python}
ALGOS=${ALGOS:-token_ppo turn_ppo grpo st_ppo}
LRS=${LRS:-2e-4 1e-4 4e-4}
CLIPS=${CLIPS:-1}
SEEDS=${SEEDS:-100 101 102 103 104}
TOL=${TOL:-0.1}
PARALLEL=${PARALLEL:-1}
OUT=${OUT:-results/tuning/$SETTING}
mkdir -p "$(dirname "$OUT")"
if [ "${2:-}" = "--summarize" ]; then
  exec "$PY" benchmarks/one_update.py --summarize "$OUT".part*.jsonl --tol "$TOL"
fi
read -r -a seeds <<< "$SEEDS"
pids=()
for ((i = 0; i < PARALLEL; i++)); do  # seeds round-robin over the processes, one thread each
  mine=()
  for ((j = i; j < ${#seeds[@]}; j += PARALLEL)); do mine+=("${seeds[j]}"); done
  [ ${#mine[@]} -gt 0 ] || continue
  # shellcheck disable=SC2086
  OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 5 "$PY" benchmarks/one_update.py --setting "$SETTING" --tune $ALGOS \
    --lrs $LRS --clips $CLIPS --seeds "${mine[@]}" --tol "$TOL" --out "$OUT.part$i.jsonl" >> "$OUT.part$i.txt" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
"$PY" benchmarks/one_update.py --summarize "$OUT".part*.jsonl --tol "$TOL"
exit $rc
