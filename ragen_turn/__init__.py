"""ragen_turn: turn-level RL (Turn-PPO, ST-PPO) for multi-turn LLM agents."""
__version__ = "0.1.0"
