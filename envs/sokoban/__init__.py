"""Sokoban for RAGEN-style text RL: room generation by reverse play, text rendering, action
parsing, an optimal solver, and a gymnasium wrapper (``SokobanGymEnv``, imported lazily)."""
from .config import SokobanEnvConfig
from .env import SokobanEnv, build_instruction
from .generation import GeneratedRoom, generate_room
from .room import grid_to_text, text_to_grid
from .solver import dead_squares, solve

__all__ = [
    "SokobanEnv", "SokobanEnvConfig", "SokobanGymEnv", "solve", "generate_room", "GeneratedRoom",
    "grid_to_text", "text_to_grid", "dead_squares", "build_instruction",
]


def __getattr__(name):  # gymnasium is imported only when the wrapper is used
    if name in ("SokobanGymEnv", "register_gym_env"):
        from . import gym_env
        return getattr(gym_env, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
