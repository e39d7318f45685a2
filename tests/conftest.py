import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))  # tests/reference.py and tests/helpers.py
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Tests build their models in a cache of their own so they never depend on (or fill) the user's cache: a
# RAGEN_TURN_CACHE_DIR the user set is not used; RAGEN_TURN_TEST_CACHE_DIR moves the tests' own cache.
os.environ["RAGEN_TURN_CACHE_DIR"] = (os.environ.get("RAGEN_TURN_TEST_CACHE_DIR")
                                      or os.path.join(tempfile.gettempdir(), "ragen_turn_test_cache"))
