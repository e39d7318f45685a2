# Sourced by train.sh and eval.sh: sets PY to the project's Python (.venv's, or $PYTHON) and stops with the fix
# when ragen_turn is not installed there (a fresh clone before `bash scripts/install.sh`). $VENV picks the venv
# (train.sh: .venv-verl for engine=verl when it exists).
VENV=${VENV:-.venv}
PY=${PYTHON:-$( [ -x $VENV/bin/python ] && echo $VENV/bin/python || echo python3 )}
if ! "$PY" -c 'import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in ("torch", "hydra", "transformers", "ragen_turn")))' 2>/dev/null; then
  echo "error: ragen_turn is not installed for $PY: run bash scripts/install.sh first" >&2
  exit 2
fi
# progress lines reach a log file or a pipe (`bash train.sh ... | tee run.log`, nohup) as they are printed
export PYTHONUNBUFFERED=${PYTHONUNBUFFERED:-1}
