#!/usr/bin/env bash
# The algorithm comparison on one setting (results/<setting>.md): ALGOS x SEEDS runs of config/sweep/compare.yaml
# from ONE warm start (built once, first: ragen_turn.warmstart.build), PARALLEL runs at a time on one thread each; every run resumable.
#
#   bash scripts/compare.sh <setting> [overrides...]     # a Sokoban setting (config/setting/<setting>.yaml)
#   bash scripts/compare.sh <env> [overrides...]         # or another env at its defaults (config/env/<env>.yaml)
#   ALGOS="token_ppo s_ppo st_ppo turn_ppo grpo so_grpo" SEEDS="0 1 2" bash scripts/compare.sh search_qa
#   flock /work/locks/heavy.lock nice -n 5 bash scripts/compare.sh long_horizon     # on a shared machine
#   python -m ragen_turn.report results/<setting>/runs runs/compare/sokoban_<setting>_* --out results/<setting> --threshold T --keep-runs
#   (--keep-runs: the runs' configs and metrics are kept, committed, in results/<setting>/runs: the page survives runs/)
#
# Environment: ALGOS (default: the comparison's algorithms that have a config/algo/<name>.yaml), SEEDS
# ("0 1 2 3 4"; evaluation seeds are 0-99, a fresh comparison takes new ones, e.g. "10 11 12 13 14": run seeds
# 100+ are the tuning harness's dev batches and refused here: docs/SPEC.md "Tuning seeds and evaluation seeds"),
# RUNS (instead of ALGOS x SEEDS, a list of algo:seed, e.g. "grpo:3 st_ppo:4": the runs another
# machine has not made), PARALLEL (2), BUDGET_S (each run's trainer.time_budget_s for this call: a run that spends it
# evaluates, checkpoints and stops, and the next call resumes it; unset = none), DEADLINE (epoch seconds: each run's
# budget ends then, and a run with under MIN_RUN_S (120) seconds left is not started: for a machine lent until a time),
# MPS=1 (runs on one GPU, device=cuda: a CUDA MPS daemon for this call, so the runs share the GPU; results/gpu.md).
# Every call passes trainer.resume=true, so a killed or budget-stopped run continues from its last checkpoint and a
# finished one only loads and exits. Runs go to ${RAGEN_TURN_RUNS_DIR:-runs}/compare/; one line per run and call goes
# to walltimes_<setting>.tsv there:
# run dir, exit status, wall seconds, last logged step.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ]; then
  echo "usage: bash scripts/compare.sh <setting: $(ls config/setting | sed 's/\.yaml$//' | tr '\n' ' ')| env: $(ls config/env | sed 's/\.yaml$//' | grep -vx sokoban | tr '\n' ' ')> [overrides]" >&2
  exit 2
fi
SETTING=$1; shift
if [ -f "config/setting/$SETTING.yaml" ]; then
  TARGET=(env=sokoban "+setting=$SETTING")
elif [ "$SETTING" != sokoban ] && [ -f "config/env/$SETTING.yaml" ]; then
  TARGET=("env=$SETTING")
else
  echo "no config/setting/$SETTING.yaml or config/env/$SETTING.yaml" >&2; exit 2
fi
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
if [ -z "${ALGOS:-}" ]; then
  ALGOS=""
  for a in grpo token_ppo bi_level_gae turn_ppo turn_ppo_geo st_ppo so_grpo; do
    [ -f "config/algo/$a.yaml" ] && ALGOS="$ALGOS $a"
  done
fi
if [ "${MPS:-0}" = 1 ] && ! command -v nvidia-cuda-mps-control > /dev/null; then
  echo "[compare] MPS=1: nvidia-cuda-mps-control not found (it comes with NVIDIA's driver)" >&2; exit 2
fi
SEEDS=${SEEDS:-0 1 2 3 4}
for s in $SEEDS $(for r in ${RUNS:-}; do echo "${r##*:}"; done); do  # dev seeds are the tuning harness's batches
  if [ "$s" -ge 100 ] 2>/dev/null; then
    echo "error: seed $s: run seeds >= 100 are dev (tuning) seeds; a comparison uses evaluation seeds 0-99" >&2; exit 2
  fi
done
PARALLEL=${PARALLEL:-2}
COMMON=("${TARGET[@]}" +sweep=compare trainer.resume=true "$@")
[ -n "${BUDGET_S:-}" ] && COMMON+=("trainer.time_budget_s=$BUDGET_S")
ROOT=${RAGEN_TURN_RUNS_DIR:-runs}/compare
mkdir -p "$ROOT"
LOG=$ROOT/walltimes_$SETTING.tsv
echo "[compare] $SETTING: algos${ALGOS}; seeds $SEEDS; $PARALLEL at a time; log $LOG"

# the shared warm start, once, before the parallel runs (which then load it; its SFT progress is printed). A warm
# start committed under assets/<setting>/warmstart/<key>/ is used when its key matches (same weights on every
# machine: an SFT on another CPU ends at other weights); `cp -r ~/.cache/ragen_turn/models/warmstart/<key> assets/<setting>/warmstart/`
# pins one.
PINNED=(); [ -d "assets/$SETTING/warmstart" ] && PINNED=("model.pinned_cache=assets/$SETTING")
"$PY" - "${COMMON[@]}" algo=grpo ${PINNED[@]+"${PINNED[@]}"} <<'PYEOF' | sed -u "/^Loading weights/d"
import sys
from ragen_turn.config import validate_config
from ragen_turn.compose import compose_config
from ragen_turn.warmstart import build

cfg = compose_config(sys.argv[1:])
validate_config(cfg)
print(f"[compare] warm start: {build(cfg)}")
PYEOF

run_one() {  # <algo> <seed>: one run on one thread, its wall time logged
  local algo=$1 seed=$2 t0 rc dir left deadline=()
  t0=$(date +%s)
  if [ -n "${DEADLINE:-}" ]; then  # stop stepping by then; too little time left: not started (logged as such)
    left=$(( DEADLINE - t0 ))
    if [ "$left" -lt "${MIN_RUN_S:-120}" ]; then
      printf '%s\t%s\t%s\t%s\n' "$algo s$seed (not started: ${left} s to DEADLINE)" - 0 - >> "$LOG"
      echo "[compare] $algo s$seed: ${left} s to DEADLINE; not started"
      return 0
    fi
    [ -n "${BUDGET_S:-}" ] && [ "$BUDGET_S" -lt "$left" ] && left=$BUDGET_S
    deadline=("trainer.time_budget_s=$left")
  fi
  dir=$("$PY" -c "import sys; from ragen_turn.compose import compose_config; \
print(compose_config(sys.argv[1:]).trainer.default_local_dir)" "${COMMON[@]}" "algo=$algo" "seed=$seed") || dir=
  if [ -z "$dir" ]; then  # the config did not compose (its error is above): log the run as failed, go on
    printf '%s\t%s\t%s\t%s\n' "$algo s$seed (config error)" 2 "$(( $(date +%s) - t0 ))" - >> "$LOG"
    echo "[compare] $algo s$seed: the config does not compose; skipped"
    return 0
  fi
  mkdir -p "$dir"
  set +e
  OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 "$PY" -m ragen_turn.train "${COMMON[@]}" "algo=$algo" "seed=$seed" \
    ${deadline[@]+"${deadline[@]}"} >> "$dir/train.log" 2>&1
  rc=$?
  set -e
  local last
  last=$(tail -n 1 "$dir/metrics.jsonl" 2>/dev/null | "$PY" -c "import json,sys; print(json.loads(sys.stdin.read() or '{}').get('step', '-'))" 2>/dev/null || echo -)
  printf '%s\t%s\t%s\t%s\n' "$dir" "$rc" "$(( $(date +%s) - t0 ))" "$last" >> "$LOG"
  echo "[compare] $dir: rc $rc, $(( $(date +%s) - t0 )) s, last step $last"
}
export -f run_one
export PY LOG
export COMMON_STR="$(printf '%q ' "${COMMON[@]}")"
if [ "${MPS:-0}" = 1 ]; then  # CUDA MPS: the parallel runs' kernels share the GPU instead of taking turns (gpu.md)
  CUDA_MPS_PIPE_DIRECTORY=$(mktemp -d /tmp/ragen_turn_mps.XXXXXX); CUDA_MPS_LOG_DIRECTORY=$CUDA_MPS_PIPE_DIRECTORY/log
  export CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  mkdir -p "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d || { echo "[compare] MPS=1: the MPS daemon did not start" >&2; exit 2; }
  trap 'echo quit | nvidia-cuda-mps-control' EXIT
  echo "[compare] CUDA MPS daemon started ($CUDA_MPS_PIPE_DIRECTORY)"
fi
# seeds outer, algos inner: a partial sweep holds every algorithm at the same number of seeds
runs() {
  if [ -n "${RUNS:-}" ]; then for r in $RUNS; do echo "${r%%:*} ${r##*:}"; done; return; fi
  for seed in $SEEDS; do for algo in $ALGOS; do echo "$algo $seed"; done; done
}
runs | xargs -P "$PARALLEL" -L 1 bash -c 'eval "COMMON=($COMMON_STR)"; run_one "$0" "$1"'
echo "[compare] done: $LOG"
