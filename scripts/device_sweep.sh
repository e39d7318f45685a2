#!/usr/bin/env bash
# Many runs side by side on one lent GPU, in one device call (results/gpu.md): the project's wheels beyond torch
# come along in $WHEELS and go to /tmp/site, as in scripts/device_compare.sh. The runs come from a file, one run's
# overrides per line (`#` starts a comment). Lines that begin with `warm ` come first, all at once: each builds one
# warm start (and evaluates it: trainer.total_training_steps=0), so that the runs after them load it from the cache
# instead of each building its own copy. Then every other line runs, all at once, under CUDA MPS, each with a time
# budget that ends at W seconds from the start (the run then evaluates and checkpoints). A tiny model's base (its copy
# pretraining) is built on the CPU, one thread per run: on the H100 machine eight builds of copy_pretrain_steps=1000 side
# by side took about 150 s before any SFT step reached the GPU; give WARM_W room for that. How the 2026-11-27 sweep for
# the Sokoban default was run (results/sokoban_default.md):
#
#   W=480 HARD=560 bash scripts/device_sweep.sh benchmarks/sweeps/sokoban_default_gpu.txt device=cuda
#
# Arguments: the runs file, then overrides for every run. Environment: W, HARD (seconds from the start after which
# what still runs is stopped), WARM_W (seconds from the start by which the warm starts must be built: 240), WHEELS
# (.whl), OUT (the device tool's output folder). $OUT receives sweep.log, mon.log (GPU use every 15 s), runs.tgz (the
# runs without checkpoints) and ws.tgz.* (the warm-start cache, in parts of 15 MB).
set -uo pipefail
T0=$(date +%s)
cd "$(dirname "$0")/.."
RUNSFILE=$1; shift
OUT=${OUT:-/tmp/device_sweep_out}; mkdir -p "$OUT"
LOG=$OUT/sweep.log; : > "$LOG"
WHEELS=${WHEELS:-.whl}
if command -v nvidia-smi > /dev/null; then
  [ -d /tmp/site/transformers ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$WHEELS"/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
export RAGEN_TURN_RUNS_DIR=${RAGEN_TURN_RUNS_DIR:-runs/sweep_device} RAGEN_TURN_CACHE_DIR=${RAGEN_TURN_CACHE_DIR:-/tmp/ragen_turn_cache}
CLEANUP=()  # what the EXIT trap undoes: only what this script made
trap 'for c in "${CLEANUP[@]}"; do eval "$c"; done' EXIT
if command -v nvidia-cuda-mps-control > /dev/null; then  # the runs' kernels share the GPU instead of taking turns
  CUDA_MPS_PIPE_DIRECTORY=$(mktemp -d /tmp/ragen_turn_mps.XXXXXX); CUDA_MPS_LOG_DIRECTORY=$CUDA_MPS_PIPE_DIRECTORY/log
  export CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  mkdir -p "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d && CLEANUP+=("echo quit | nvidia-cuda-mps-control")
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
fi
if command -v nvidia-smi > /dev/null || [ -n "${MONITOR_TEST:-}" ]; then  # GPU use every 15 s, for as long as this runs
  (while sleep 15; do echo "$(( $(date +%s) - T0 )) s $(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader 2>&1) load $(cut -d' ' -f1 /proc/loadavg)"; done) > "$OUT/mon.log" 2>&1 &
  MON=$!
fi
say() { echo "[sweep] $(( $(date +%s) - T0 )) s: $*" | tee -a "$LOG"; }

one() {  # <budget s> <overrides...>: one run, its log in <run dir>/train.log; a line in sweep.log when it ends
  local budget=$1 t0 rc dir; shift
  t0=$(date +%s)
  dir=$("$PY" -c "import sys; from ragen_turn.compose import compose_config; \
print(compose_config(sys.argv[1:]).trainer.default_local_dir)" "$@") || { say "config error: $*"; return; }
  mkdir -p "$dir"
  timeout $(( T0 + ${HARD:-560} - t0 )) "$PY" -m ragen_turn.train "$@" "trainer.time_budget_s=$budget" \
    trainer.resume=true >> "$dir/train.log" 2>&1
  rc=$?
  say "rc $rc, $(( $(date +%s) - t0 )) s, last: $(grep -o '"val/success[^,]*' "$dir/metrics.jsonl" 2>/dev/null | tail -1): $dir"
}

mapfile -t LINES < <(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$RUNSFILE")
say "${#LINES[@]} lines from $RUNSFILE; overrides for all: $*"
# Each phase waits for its own runs by PID: a bare `wait` would also wait for the GPU monitor, which never ends (the
# first call of the 2026-11-27 sweep spent its whole time so: its runs never started).
pids=()
for line in "${LINES[@]}"; do  # phase 1: the warm starts
  if [[ $line == warm\ * ]]; then
    # shellcheck disable=SC2086  # a line is a list of overrides
    one $(( T0 + ${WARM_W:-240} - $(date +%s) )) ${line#warm } "$@" trainer.total_training_steps=0 & pids+=($!)
  fi
done
[ ${#pids[@]} -gt 0 ] && wait "${pids[@]}"
say "warm starts done"
pids=()
for line in "${LINES[@]}"; do  # phase 2: the runs
  # shellcheck disable=SC2086
  [[ $line == warm\ * ]] || { one $(( T0 + ${W:-480} - $(date +%s) )) $line "$@" & pids+=($!); }
done
[ ${#pids[@]} -gt 0 ] && wait "${pids[@]}"
say "runs done"
[ -n "${MON:-}" ] && kill "$MON"
tar czf "$OUT/runs.tgz" --exclude=checkpoints --exclude=hydra "$RAGEN_TURN_RUNS_DIR"
tar czf - -C "$RAGEN_TURN_CACHE_DIR" . | split -b 15M - "$OUT/ws.tgz."
ls -la "$OUT" | tee -a "$LOG"
say "done"
