#!/usr/bin/env bash
# One device call of a comparison (scripts/compare.sh) on a lent GPU machine that has torch + CUDA but no network and no
# project install: the wheels the project needs beyond torch come along in $WHEELS, are installed into /tmp/site, and the
# runs go on from the working tree. Resumable: a second call on the same (warm) machine continues what the first left.
# How long_turns and long_horizon were run (results/gpu.md):
#
#   W=490 HARD=560 PAR=14 SETTING=long_horizon EXTRA="trainer.total_training_steps=30" bash scripts/device_compare.sh
#
# Environment: SETTING (long_turns), EXTRA (more overrides), PAR (runs at once, under CUDA MPS; 21 fit an H200's memory
# for long_turns, 14 an H100's for long_horizon), W (seconds from the start to DEADLINE: runs stop stepping then,
# evaluate and checkpoint), HARD (seconds after which compare.sh itself is stopped), MINRUN (MIN_RUN_S, 100), ALGOS and
# SEEDS (as compare.sh; seeds 0-4 by default), WHEELS (.whl). $OUT (the device tool's output folder) receives
# compare.log, mon.log (GPU use every 15 s) and runs.tgz (runs/compare without checkpoints).
# The wheels, fetched once where there is network:
#   pip download --no-deps -d .whl transformers==5.10.4 tokenizers==0.22.2 hydra-core==1.3.8 omegaconf==2.3.1 \
#     antlr4-python3-runtime==4.9.3 gymnasium==1.4.0 farama-notifications==0.0.6
set -uo pipefail
T0=$(date +%s)
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/device_compare_out}; mkdir -p "$OUT"; : > "$OUT/compare.log"
WHEELS=${WHEELS:-.whl}
[ -d /tmp/site/transformers ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site "$WHEELS"/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHON=python3 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc
(while sleep 15; do echo "$(( $(date +%s) - T0 )) s $(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader) load $(cut -d' ' -f1 /proc/loadavg) runs $(pgrep -fc 'python3 -m ragen_turn[.]train')"; done) > "$OUT/mon.log" 2>&1 &
MON=$!
export DEADLINE=$(( T0 + ${W:-500} )) MIN_RUN_S=${MINRUN:-100} SEEDS=${SEEDS:-0 1 2 3 4}
echo "[device] $(( $(date +%s) - T0 )) s: compare ${SETTING:-long_turns}, deadline in $(( DEADLINE - $(date +%s) )) s"
compare() {  # <MPS 0|1> <runs at once>: compare.sh until HARD, appending to compare.log; returns its exit status
  # shellcheck disable=SC2086  # EXTRA is a list of overrides
  MPS=$1 PARALLEL=$2 timeout $(( T0 + ${HARD:-565} - $(date +%s) )) \
    bash scripts/compare.sh "${SETTING:-long_turns}" device=cuda ${EXTRA:-} >> "$OUT/compare.log" 2>&1
}
t=$(date +%s)
compare 1 "${PAR:-21}"; rc=$?
echo "[device] $(( $(date +%s) - T0 )) s: compare rc $rc"
if [ $rc = 2 ] && [ $(( $(date +%s) - t )) -lt 60 ]; then  # MPS did not start: without it, fewer at once
  tail -5 "$OUT/compare.log"
  compare 0 10
  echo "[device] $(( $(date +%s) - T0 )) s: compare (no MPS) rc $?"
fi
# runs that outlived the timeout; the pattern names the interpreter, so it cannot match this shell's own command line
pkill -f 'python3 -m ragen_turn[.]train' && sleep 2
kill $MON
cut -c1-200 "runs/compare/walltimes_${SETTING:-long_turns}.tsv"
tar czf "$OUT/runs.tgz" --exclude=checkpoints runs/compare
echo "[device] $(( $(date +%s) - T0 )) s: done"
