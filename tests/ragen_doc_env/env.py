# A test env written as RAGEN's docs teach (ragen/env/new_env/env.py: a Gym-style class on RAGEN's base class, with
# step, reset, render and close), importing RAGEN's paths unedited; ragen_turn provides them when RAGEN is not
# installed (ragen_turn.envs.ragen_aliases). The agent is shown a word and must answer it back.
import random

from ragen.env.base import BaseLanguageBasedEnv
from ragen.utils import all_seed

from .config import EchoWordEnvConfig


class EchoWordEnv(BaseLanguageBasedEnv):
    def __init__(self, config=None):
        BaseLanguageBasedEnv.__init__(self)
        self.config = config if config is not None else EchoWordEnvConfig()
        self.word = None
        self.steps = 0
        self.render_cache = None

    def reset(self, seed=None, mode=None):
        with all_seed(seed):
            self.word = random.choice(self.config.words)
        self.steps = 0
        self.render_cache = f"Say the word back: {self.word}"
        return self.render_cache

    def step(self, action):
        self.steps += 1
        success = str(action).strip().lower() == self.word
        reward = 1.0 if success else 0.0
        done = success or self.steps >= self.config.max_steps
        self.render_cache = "Correct." if success else f"No. The word is {self.word}."
        info = {"action_is_effective": True, "action_is_valid": True, "success": success}
        return self.render_cache, reward, done, info

    def render(self, mode="text"):
        return self.render_cache

    def close(self):
        pass
