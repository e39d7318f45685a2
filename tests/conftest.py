import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))  # tests/reference.py and tests/helpers.py
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Tests build their models in a private cache so they never depend on (or fill) the user's cache.
os.environ.setdefault("RAGEN_TURN_CACHE_DIR", os.path.join(tempfile.gettempdir(), "ragen_turn_test_cache"))
