"""ragen_turn: turn-level RL (Turn-PPO, ST-PPO) for multi-turn LLM agents."""
import os as _os

__version__ = "0.1.0"

# envs/ sits at the top of the repository and installs as ragen_turn.envs (setup.py's package_dir). Run from a working
# tree that is not installed (the GPU scripts: python -m ragen_turn.train from the tree), ragen_turn.envs is found in
# that same envs/: the tree's root is searched for ragen_turn's subpackages after ragen_turn/ itself.
_TREE = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if not _os.path.isdir(_os.path.join(__path__[0], "envs")) and _os.path.isfile(_os.path.join(_TREE, "setup.py")):
    __path__.append(_TREE)
