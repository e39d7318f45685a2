#!/usr/bin/env bash
# Usage: bash train.sh <env> <algo> [hydra overrides...]
#   bash train.sh sokoban turn_ppo
#   bash train.sh sokoban token_ppo algorithm.gamma=0.95 es_manager.train.env_groups=16 ppo_epochs=2
#   bash train.sh sokoban turn_ppo --multirun +sweep=gamma_lambda
#   bash train.sh --config-name _2_sokoban [overrides]     (RAGEN's named runs: config/_N_<env>.yaml)
set -euo pipefail
cd "$(dirname "$0")"
PICK=()
case "${1:-}" in
  --config-name|-cn) [ $# -ge 2 ] || { echo "usage: bash train.sh --config-name <name> [overrides]" >&2; exit 2; }
                     PICK=("$1" "$2"); shift 2 ;;
  --config-name=*) PICK=("$1"); shift ;;
  *)
    if [ $# -lt 2 ]; then
      names() { ls "$1" | sed -n 's/\.yaml$//p' | paste -sd'|'; }  # the config group's choices: config/env, config/algo
      echo "usage: bash train.sh <env: $(names config/env)|an env_type registered by env_module=...> <algo: $(names config/algo)> [overrides]" >&2
      echo "       bash train.sh --config-name <RAGEN's named run: _2_sokoban | _1_bandit | ...> [overrides]" >&2
      exit 2
    fi
    PICK=("env=$1" "algo=$2"); shift 2 ;;
esac
# Hydra wants --multirun before the overrides; accept it anywhere.
args=()
for a in "$@"; do
  case "$a" in --multirun|-m) args+=("hydra.mode=MULTIRUN") ;; *) args+=("$a") ;; esac
done
set -- "${args[@]+"${args[@]}"}"
# engine=verl runs in the verl venv when there is one (pip install -e '.[verl]' or '.[gpu]' into .venv-verl)
VENV=.venv
for a in "$@"; do [ "$a" = engine=verl ] && [ -x .venv-verl/bin/python ] && VENV=.venv-verl; done
. scripts/python.sh
exec "$PY" -m ragen_turn.train "${PICK[@]}" "$@"
