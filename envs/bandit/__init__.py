"""RAGEN's two-armed bandit (one pull per episode; arm names from which the model must guess the better arm)."""
from .config import ARM_PAIRS, BanditEnvConfig
from .env import BanditEnv

__all__ = ["BanditEnv", "BanditEnvConfig", "ARM_PAIRS"]
