"""RAGEN's own env classes, read from a RAGEN checkout and registered under RAGEN's names, for ``env_module=``.

``RAGEN_DIR`` names the checkout (mll-lab-nu/RAGEN; its ``ragen/`` folder). Its files are imported as they are;
only RAGEN's package ``__init__`` files above the env folders are skipped (``ragen/env/__init__.py`` imports all
of RAGEN's envs and their dependencies), so ``ragen.env.<name>`` loads just that env. Importing this module
registers RAGEN's ``bandit`` and ``frozen_lake`` (gymnasium) and, when ``gym`` and ``gym_sokoban`` import, its
``sokoban``, each in place of ours of the same name for the process that imports it. Nothing of RAGEN's is kept
in this repository: without ``RAGEN_DIR`` the import fails with a message.

    RAGEN_DIR=/path/to/RAGEN PYTHONPATH=tests python -m ragen_turn.train env=<group> env_module=ragen_classes ...
"""
from __future__ import annotations

import importlib
import os
import sys
import types
from pathlib import Path

from ragen_turn.envs import register_env

ROOT = Path(os.environ.get("RAGEN_DIR", "")).expanduser()
if not os.environ.get("RAGEN_DIR") or not (ROOT / "ragen" / "env" / "base.py").is_file():
    raise ImportError(f"ragen_classes: RAGEN_DIR={os.environ.get('RAGEN_DIR', '')!r} is not a RAGEN checkout "
                      "(it needs ragen/env/base.py)")

for _name, _path in (("ragen", ROOT / "ragen"), ("ragen.env", ROOT / "ragen" / "env")):
    if _name not in sys.modules:  # a package object without its __init__: submodules load from the folder
        _pkg = types.ModuleType(_name)
        _pkg.__path__ = [str(_path)]
        sys.modules[_name] = _pkg

LOADED = {}
MISSING = {}
for _env, _cls, _config in (("bandit", "BanditEnv", "BanditEnvConfig"),
                            ("frozen_lake", "FrozenLakeEnv", "FrozenLakeEnvConfig"),
                            ("sokoban", "SokobanEnv", "SokobanEnvConfig")):
    try:
        _mod = importlib.import_module(f"ragen.env.{_env}")
    except ImportError as e:  # RAGEN's Sokoban needs gym and gym_sokoban
        MISSING[_env] = str(e)
        continue
    register_env(_env, getattr(_mod, _cls), getattr(_mod, _config))
    LOADED[_env] = f"{_mod.__name__}.{_cls}"

print(f"[ragen_classes] RAGEN's classes from {ROOT}: "
      + ", ".join(f"{k} = {v} ({sys.modules[v.rsplit('.', 1)[0]].__file__})" for k, v in LOADED.items())
      + "".join(f"; {k} not loaded ({v})" for k, v in MISSING.items()), flush=True)
