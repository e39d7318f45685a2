"""RAGEN's FrozenLake on gymnasium's dynamics: a random map per seed, slippery ice, text observations."""
from .config import FrozenLakeEnvConfig
from .env import FrozenLakeEnv, generate_map

__all__ = ["FrozenLakeEnv", "FrozenLakeEnvConfig", "generate_map"]
