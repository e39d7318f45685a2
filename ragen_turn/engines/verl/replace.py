"""The few verl functions with no hook that the engine replaces in each process (docs/verl.md, "No hook")."""
from __future__ import annotations

import importlib
from typing import Any, Dict

_REPLACED: Dict[tuple, Any] = {}


def replace_verl_function(module: str, name: str, ours: Any) -> Any:
    """Put ``ours`` in place of verl's ``module.name`` in this process (idempotent: a second call changes
    nothing); returns verl's own function. For the few verl functions with no hook (docs/verl.md)."""
    mod = importlib.import_module(module)
    if getattr(mod, name) is not ours:
        _REPLACED[(module, name)] = getattr(mod, name)
        setattr(mod, name, ours)
    return _REPLACED[(module, name)]
