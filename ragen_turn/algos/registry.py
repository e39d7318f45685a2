"""Registries by name, like verl's ``register_adv_est`` / ``register_policy_loss``."""
from __future__ import annotations

from typing import Callable, Dict


class Registry(Dict[str, Callable]):
    """A ``name -> function`` dict with a registering decorator and a lookup that names what exists."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def register(self, name: str) -> Callable[[Callable], Callable]:
        def wrap(fn: Callable) -> Callable:
            if name in self and self[name] is not fn:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self[name] = fn
            return fn

        return wrap

    def lookup(self, name: str) -> Callable:
        if name not in self:
            raise ValueError(f"unknown {self.kind} {name!r}; known: {sorted(self)}")
        return self[name]
