"""A thin ``gymnasium.Env`` over :class:`SokobanEnv` (Text observations, ``Discrete(4, start=1)``)."""
from __future__ import annotations

from typing import Any, Dict, Optional

import gymnasium as gym
from gymnasium import spaces

from .config import SokobanEnvConfig
from .env import SokobanEnv

GYM_ID = "ragen_turn/Sokoban-v0"


class SokobanGymEnv(gym.Env):
    """Gymnasium API: ``reset(seed, options) -> (text, info)``, ``step(action_id) -> (text, reward,
    terminated, truncated, info)``. ``terminated`` is success; ``truncated`` is running out of
    ``max_steps``. A seeded reset gives the same room as ``SokobanEnv.reset(seed)``; an unseeded
    one draws the room seed from ``self.np_random``."""

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(self, config: SokobanEnvConfig | Dict[str, Any] | None = None,
                 render_mode: Optional[str] = None, **kwargs: Any) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.env = SokobanEnv(config, **kwargs)
        self.render_mode = render_mode
        cfg = self.env.config
        rows, cols = cfg.dim_room
        syms = [cfg.grid_lookup[i] for i in range(7)]
        charset = set("".join(syms)) | set(cfg.cell_sep) | {"\n"}
        longest = max(len(s) for s in syms)
        max_len = rows * cols * longest + rows * (cols - 1) * len(cfg.cell_sep) + rows - 1
        self.observation_space = spaces.Text(max_length=max_len, min_length=1, charset="".join(sorted(charset)))
        ids = sorted(cfg.action_lookup)
        self.action_space = spaces.Discrete(len(ids), start=ids[0]) if ids == list(range(ids[0], ids[0] + len(ids))) \
            else spaces.Discrete(4, start=1)

    def reset(self, *, seed: Optional[int] = None, options: Optional[Dict[str, Any]] = None):
        super().reset(seed=seed)
        room_seed = seed if seed is not None else int(self.np_random.integers(0, 2**63 - 1))
        obs = self.env.reset(seed=room_seed)
        return obs, {"optimal_steps": self.env.optimal_steps, "seed": self.env.seed}

    def step(self, action):
        obs, reward, done, info = self.env.step(action)
        terminated = bool(info["success"])
        truncated = bool(done and not terminated)
        return obs, float(reward), terminated, truncated, info

    def render(self):
        if self.render_mode == "ansi":
            return self.env.render("text")
        return None

    def close(self) -> None:
        self.env.close()


def register_gym_env() -> None:
    """Register ``ragen_turn/Sokoban-v0`` with gymnasium (idempotent)."""
    if GYM_ID not in gym.registry:
        gym.register(id=GYM_ID, entry_point="ragen_turn.envs.sokoban.gym_env:SokobanGymEnv",
                     max_episode_steps=None)


register_gym_env()
