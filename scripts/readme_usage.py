"""Run the README's commands as a newcomer would, shortened, one after another in one temporary runs directory:
the main command, then every line of the README's Usage block (train.sh, eval.sh, report, inspect). Each must
succeed: no line may collide with an earlier one's run directory.

    .venv/bin/python scripts/readme_usage.py [--keep DIR]

Shortening: a few steps, a small warm start and small batches, passed as overrides that are also left out of the
run names (``hydra.job.config.override_dirname.exclude_keys``), so every run directory is the one the README names.
"""
from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHORT = {"trainer.total_training_steps": "1", "model.warmstart.steps": "4", "model.warmstart.episodes": "16",
         "model.copy_pretrain_steps": "5",
         "es_manager.train.env_groups": "2", "es_manager.train.group_size": "2", "ppo_mini_batch_size": "4",
         "es_manager.val.env_groups": "4", "agent_proxy.max_turn": "2",
         "actor_rollout_ref.rollout.response_length": "8",
         "model.hidden_size": "32", "model.num_hidden_layers": "1", "model.num_attention_heads": "2",
         "model.num_key_value_heads": "1", "model.intermediate_size": "64"}


def readme_commands(text: str) -> list[str]:
    """The main command (the train.sh half of the README's first command line), then the Usage block's lines."""
    setup = text.split("## Set up and run", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    main = next(ln for ln in setup.splitlines() if "train.sh" in ln).split("#", 1)[0].split("&&")[-1].strip()
    usage = text.split("## Usage", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    lines = [ln.split("#", 1)[0].strip() for ln in usage.splitlines()]
    # a line naming a placeholder path (/path/to/...) shows the form of a command with the user's own model
    return [main] + [ln for ln in lines if ln and "/path/to/" not in ln]


def shortened(cmd: str, runs: Path) -> list[str]:
    words = shlex.split(cmd)
    if words[:2] == ["bash", "train.sh"]:
        given = {w.split("=", 1)[0] for w in words[4:] if "=" in w}
        extra = [f"{k}={v}" for k, v in SHORT.items() if k not in given]
        excl = list(compose_hydra_excludes()) + list(SHORT)
        return words + extra + ["hydra.job.config.override_dirname.exclude_keys=[" + ",".join(excl) + "]"]
    # eval.sh / report: the README's runs/ is our temporary runs directory
    return [str(runs) + w[len("runs"):] if w == "runs" or w.startswith("runs/") else w for w in words]


def compose_hydra_excludes() -> list[str]:
    """The run name's excluded keys as config/base.yaml resolves them (``${ragen_quiet_keys:[...]}`` adds RAGEN's
    keys that change nothing here)."""
    from omegaconf import OmegaConf

    import ragen_turn.compose  # noqa: F401  (registers the ragen_quiet_keys resolver)

    node = OmegaConf.load(ROOT / "config" / "base.yaml").hydra.job.config.override_dirname
    return list(OmegaConf.to_container(node, resolve=True)["exclude_keys"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep", help="use this directory (kept) instead of a temporary one")
    args = ap.parse_args()
    tmp = Path(args.keep or tempfile.mkdtemp(prefix="ragen_turn_readme_"))
    runs = tmp / "runs"
    env = dict(os.environ, RAGEN_TURN_RUNS_DIR=str(runs), RAGEN_TURN_CACHE_DIR=str(tmp / "cache"),
               WANDB_MODE="offline", PYTHON=os.environ.get("PYTHON", sys.executable))
    cmds = readme_commands((ROOT / "README.md").read_text())
    failed = 0
    for i, cmd in enumerate(cmds, 1):
        argv = shortened(cmd, runs)
        if argv[0].endswith("python") and argv[1] == "-m" and argv[2] in ("ragen_turn.report", "ragen_turn.inspect"):
            argv[0] = env["PYTHON"]
        t = time.time()
        out = subprocess.run(argv, cwd=ROOT, env=env, text=True, capture_output=True)
        ok = out.returncode == 0
        failed += not ok
        print(f"[readme {i}/{len(cmds)}] {'ok  ' if ok else 'FAIL'} {time.time() - t:5.1f}s  {cmd}", flush=True)
        if not ok:
            print("   " + "\n   ".join((out.stdout + out.stderr).strip().splitlines()[-15:]))
    dirs = sorted(p.name for p in runs.iterdir() if p.is_dir()) if runs.is_dir() else []
    print(f"[readme] {len(cmds) - failed}/{len(cmds)} README commands ran; run dirs in {runs}: {', '.join(dirs)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
