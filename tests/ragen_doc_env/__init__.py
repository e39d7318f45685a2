# The one line a RAGEN env file needs here: RAGEN registers it in ragen/env/__init__.py; ragen_turn with
# register_env, imported by env_module=ragen_doc_env (env.py and config.py are as RAGEN's docs teach, unedited).
from ragen_turn.envs import register_env

from .config import EchoWordEnvConfig
from .env import EchoWordEnv

register_env("echo_word", EchoWordEnv, EchoWordEnvConfig)
