"""RAGEN's own envs.yaml entries, pasted unchanged into an env group, train 2 steps with RAGEN's own classes
(``env_module=ragen_classes``, read from a RAGEN checkout) and with ours, and each class is built with the entry's
``env_config`` (the run's log line ``env <tag>: <class> with <config>``).

Needs a RAGEN checkout: ``RAGEN_DIR=/path/to/RAGEN`` (mll-lab-nu/RAGEN; checked at 20daedc); skipped without it.
RAGEN's Sokoban also needs ``gym`` and ``gym_sokoban`` importable (``pip install --target DIR --no-deps gym==0.26.2
gym_sokoban==0.0.6 'setuptools<81' imageio gym_notices`` and ``PYTHONPATH=DIR``); that case is skipped otherwise.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
RAGEN_DIR = os.environ.get("RAGEN_DIR", "")
pytestmark = pytest.mark.skipif(not (Path(RAGEN_DIR) / "config" / "envs.yaml").is_file() if RAGEN_DIR else True,
                                reason="RAGEN_DIR (a RAGEN checkout with config/envs.yaml) not set")

MICRO = ["model.hidden_size=32", "model.num_hidden_layers=1", "model.num_attention_heads=2",
         "model.num_key_value_heads=1", "model.intermediate_size=64", "es_manager.train.env_groups=2",
         "es_manager.train.group_size=2", "es_manager.val.env_groups=2", "agent_proxy.max_turn=2",
         "ppo_mini_batch_size=2", "trainer.total_training_steps=2", "trainer.test_freq=0", "trainer.save_freq=0",
         "model.warmstart.enable=false"]


def entry_text(tag: str) -> str:
    """The lines of RAGEN's config/envs.yaml entry ``tag`` exactly as the file has them (comments included)."""
    lines = (Path(RAGEN_DIR) / "config" / "envs.yaml").read_text().splitlines(keepends=True)
    start = lines.index(f"  {tag}:\n")
    end = start + 1
    while end < len(lines) and not re.match(r"^  \S", lines[end]):
        end += 1
    return "".join(lines[start:end])


def group_file(conf: Path, name: str, tag: str) -> None:
    """An env group whose custom_envs section is RAGEN's entry pasted unchanged."""
    (conf / "env").mkdir(parents=True, exist_ok=True)
    (conf / "env" / f"{name}.yaml").write_text(
        "# @package _global_\nenv:\n"
        f"  name: {name}\n  train_tags: [{tag}]\n  train_n_groups: ['${{es_manager.train.env_groups}}']\n"
        f"  val_tags: [{tag}]\n  val_n_groups: ['${{es_manager.val.env_groups}}']\ncustom_envs:\n" + entry_text(tag))


def run_entry(tmp_path: Path, tag: str, classes: str):
    group_file(tmp_path / "conf", "pasted", tag)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    extra = ["env_module=ragen_classes"] if classes == "ragen" else []
    res = subprocess.run([sys.executable, "-m", "ragen_turn.train", "env=pasted", "algo=turn_ppo", *extra,
                          f"hydra.searchpath=[file://{tmp_path / 'conf'}]", *MICRO,
                          f"trainer.default_local_dir={tmp_path / 'run'}"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return res


@pytest.mark.parametrize("classes", ["ragen", "ours"])
@pytest.mark.parametrize("tag", ["SimpleSokoban", "Bandit", "FrozenLake"])
def test_ragens_entry_trains_two_steps_with_its_env_config(tmp_path, tag, classes):
    res = run_entry(tmp_path, tag, classes)
    if classes == "ragen" and "sokoban not loaded" in res.stdout and tag == "SimpleSokoban":
        pytest.skip("RAGEN's Sokoban needs gym and gym_sokoban importable")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    (line,) = [x for x in res.stdout.splitlines() if x.startswith(f"[ragen_turn] env {tag}: ")]
    module = "ragen.env." if classes == "ragen" else "ragen_turn.envs."
    assert line.split(": ", 1)[1].startswith(module), line
    want = yaml.safe_load(entry_text(tag))[tag]["env_config"]
    for key, value in want.items():
        assert f"{key}={value!r}" in line, (key, value, line)
    steps = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps if "env/reward" in m] == [1, 2]
    print(line)  # the note's evidence: pytest -s shows each tag's class and config
