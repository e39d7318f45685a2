import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # tests/reference.py and shared helpers
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
