"""RAGEN's Countdown: reach a target with an arithmetic expression of given numbers (problems generated here)."""
from .arith import equals_target, evaluate, has_plus_minus_solution, uses_numbers
from .config import CountdownEnvConfig
from .env import CountdownEnv, generate_problem

__all__ = ["CountdownEnv", "CountdownEnvConfig", "generate_problem", "evaluate", "equals_target", "uses_numbers",
           "has_plus_minus_solution"]
