#!/usr/bin/env bash
# Many small runs on one GPU: seconds per training step of one comparison run alone, then of N runs side by side
# (scripts/compare.sh, PARALLEL=N), with CUDA MPS when MPS=1 (compare.sh's MPS=1: the runs' kernels share the GPU
# instead of taking turns). Prints each run's mean seconds per step (steps >= 2) and the throughput ratio
# (steps per second of the N runs together / of the one run alone).
#
#   bash benchmarks/bench_parallel_runs.sh [setting] [N] [overrides...]   # defaults: long_turns 14 (7 algorithms x 2 seeds)
#   MPS=1 BUDGET=60 bash benchmarks/bench_parallel_runs.sh long_turns 14
#
# Each run trains for BUDGET seconds (trainer.time_budget_s; default 40 alone, 60 side by side), skips the step-0
# evaluation and ends with a 16-room one; runs go to a temporary folder. The side-by-side runs are ALGOS (compare.sh's
# default: 7) x as many seeds as N needs. DEVICE (cuda) is the runs' device=.
set -uo pipefail
cd "$(dirname "$0")/.."
SETTING=${1:-long_turns}
N=${2:-14}
shift $(( $# < 2 ? $# : 2 ))
TMP=$(mktemp -d)
O=(device=${DEVICE:-cuda} trainer.val_before_train=false es_manager.val.env_groups=16 trainer.save_freq=0 "$@")
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}

mean_step_s() {  # <runs dir>: one line per run, "<mean> s/step over <n> steps  <run>"; last line: steps/s of all together
  "$PY" - "$1" <<'EOF'
import json, pathlib, sys
total = 0.0
for f in sorted(pathlib.Path(sys.argv[1]).glob("compare/*/metrics.jsonl")):
    s = [r["perf/step_s"] for r in map(json.loads, f.read_text().splitlines()) if "perf/step_s" in r and r["step"] >= 2]
    if s:
        total += len(s) / sum(s)
        print(f"{sum(s) / len(s):.2f} s/step over {len(s)} steps  {f.parent.name}")
print(f"{total:.3f}")
EOF
}

echo "[bench] one run alone: turn_ppo s0"
MPS=0 RAGEN_TURN_RUNS_DIR=$TMP/alone BUDGET_S=${BUDGET:-40} ALGOS=turn_ppo SEEDS=0 PARALLEL=1 \
  bash scripts/compare.sh "$SETTING" "${O[@]}" > "$TMP/alone.log" 2>&1 || { tail -20 "$TMP/alone.log"; exit 1; }
ALONE=$(mean_step_s "$TMP/alone" | tee /dev/stderr | tail -n 1)

echo "[bench] $N runs side by side (MPS=${MPS:-0})"
NA=$(echo ${ALGOS:-grpo token_ppo bi_level_gae turn_ppo turn_ppo_geo st_ppo so_grpo} | wc -w)
SEEDS=""; for s in $(seq 0 $(( (N + NA - 1) / NA - 1 ))); do SEEDS="$SEEDS $s"; done
MPS=${MPS:-0} RAGEN_TURN_RUNS_DIR=$TMP/side BUDGET_S=${BUDGET:-60} SEEDS="$SEEDS" PARALLEL="$N" \
  bash scripts/compare.sh "$SETTING" "${O[@]}" > "$TMP/side.log" 2>&1 || { tail -20 "$TMP/side.log"; exit 1; }
SIDE=$(mean_step_s "$TMP/side" | tee /dev/stderr | tail -n 1)
"$PY" -c "import sys; a, s = map(float, sys.argv[1:]); print(f'[bench] steps/s: alone {a:.3f}, side by side {s:.3f}, ratio '
  + (f'{s / a:.2f}' if a else 'n/a: no step >= 2 was timed alone (raise BUDGET)'))" "$ALONE" "$SIDE"
