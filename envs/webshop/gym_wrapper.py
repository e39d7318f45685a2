"""A gymnasium view of :class:`~.env.WebShopEnv` (``Text`` observation and action spaces)."""
from __future__ import annotations

import string
import unicodedata
from typing import Any, Dict, Mapping, Optional, Tuple, Union

import gymnasium as gym
from gymnasium import spaces

from .config import WebShopEnvConfig
from .env import WebShopEnv

#: printable ASCII (newline included); observations are transliterated into it
CHARSET = frozenset(string.printable) - frozenset("\t\r\x0b\x0c")


def to_charset(text: str, max_length: int) -> str:
    """Transliterate to printable ASCII (accents dropped, other symbols become ``?``) and cut to ``max_length``."""
    text = unicodedata.normalize("NFKD", text)
    out = []
    for ch in text:
        if ch in CHARSET:
            out.append(ch)
        elif unicodedata.combining(ch):
            continue
        else:
            out.append(" " if ch.isspace() else "?")
        if len(out) >= max_length:
            break
    return "".join(out)


class WebShopGymEnv(gym.Env):
    """``reset(seed, options) -> (obs, info)``, ``step(action) -> (obs, reward, terminated, truncated, info)``.

    ``terminated`` is set by ``buy now``; ``truncated`` when ``max_turns`` runs out first. ``options`` may
    carry ``{"split": "test"}``. Without a seed, the goal is drawn from the env's seeded ``np_random``.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(self, config: Union[WebShopEnvConfig, Mapping[str, Any], None] = None,
                 render_mode: Optional[str] = None, max_obs_chars: int = 8192):
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.env = WebShopEnv(config)
        self.render_mode = render_mode
        self.max_obs_chars = int(max_obs_chars)
        self.observation_space = spaces.Text(max_length=self.max_obs_chars, min_length=0, charset=CHARSET)
        self.action_space = spaces.Text(max_length=self.env.config.max_action_chars, min_length=1, charset=CHARSET)

    def _obs(self, text: str) -> str:
        return to_charset(text, self.max_obs_chars)

    def reset(self, *, seed: Optional[int] = None,
              options: Optional[Dict[str, Any]] = None) -> Tuple[str, Dict[str, Any]]:
        super().reset(seed=seed)
        goal_seed = seed if seed is not None else int(self.np_random.integers(0, 2 ** 31 - 1))
        obs = self.env.reset(seed=goal_seed, mode=(options or {}).get("split"))
        return self._obs(obs), {"goal_index": self.env.goal_index, "instruction": self.env.instruction_text}

    def step(self, action: str) -> Tuple[str, float, bool, bool, Dict[str, Any]]:
        obs, reward, done, info = self.env.step(action)
        truncated = bool(done and info.get("truncated", False) and self.env.page != "done")
        terminated = bool(done and not truncated)
        return self._obs(obs), float(reward), terminated, truncated, info

    def render(self) -> Optional[str]:
        if self.render_mode == "ansi":
            return self._obs(self.env.render())
        return None

    def close(self) -> None:
        self.env.close()


__all__ = ["WebShopGymEnv", "to_charset", "CHARSET"]
