"""ragen_turn: turn-level RL (Turn-PPO, ST-PPO) for multi-turn LLM agents."""
import importlib.abc as _abc
import importlib.util as _util
import os as _os
import sys as _sys

__version__ = "0.1.0"

# envs/ sits at the top of the repository and installs as ragen_turn.envs (setup.py's package_dir). Run from a working
# tree that is not installed (the GPU scripts: python -m ragen_turn.train from the tree), ragen_turn.envs is that same
# envs/: a finder first on sys.meta_path maps that one name there (its subpackages follow its __path__), so nothing
# else at the tree's root (benchmarks/, scripts/, tests/) becomes part of the package.
_TREE = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
_ENVS = _os.path.join(_TREE, "envs")


class _TreeEnvsFinder(_abc.MetaPathFinder):
    """Finds ``ragen_turn.envs``, and only it, in the working tree's top-level ``envs/``."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != __name__ + ".envs":
            return None
        return _util.spec_from_file_location(fullname, _os.path.join(_ENVS, "__init__.py"),
                                             submodule_search_locations=[_ENVS])


if not _os.path.isdir(_os.path.join(__path__[0], "envs")) and _os.path.isfile(_os.path.join(_TREE, "setup.py")) \
        and _os.path.isfile(_os.path.join(_ENVS, "__init__.py")) \
        and not any(type(f).__name__ == _TreeEnvsFinder.__name__ for f in _sys.meta_path):
    _sys.meta_path.insert(0, _TreeEnvsFinder())
