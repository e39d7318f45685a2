"""Engine-agnostic multi-turn rollouts: env groups, prompts, action parsing, the Trajectory batch."""
from .context import (ChatFormatter, ContextConfig, context_config, parse_response, system_prompt, takes_raw_response,
                      user_message)
from .env_manager import VAL_SEED_OFFSET, EnvGroupManager, EnvSlot
from .runner import Policy, TextPolicy, declared_actions, run_episodes, throttled
from .trajectory import Episode, Trajectory

__all__ = ["ChatFormatter", "ContextConfig", "context_config", "parse_response", "system_prompt", "takes_raw_response",
           "user_message", "VAL_SEED_OFFSET", "EnvGroupManager", "EnvSlot", "Policy", "TextPolicy", "declared_actions",
           "run_episodes", "throttled",
           "Episode", "Trajectory"]
