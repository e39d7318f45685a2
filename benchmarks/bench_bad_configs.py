"""Time-to-error of every bad command line in tests/bad_configs.py, through the real command line.

    python benchmarks/bench_bad_configs.py [--out results/bad_configs.md]

Runs ``bash train.sh sokoban turn_ppo <overrides>`` once per case (in a private run dir and model cache, so
nothing is shared with real runs), plus two run-dir cases (a live run holds the dir; the dir holds a finished
run), one after another. Prints a markdown table: the input, the exit code, the seconds to the error (wall
clock, and the CPU seconds of the process tree), whether a run dir or a model cache was left, and the message.
The load average is printed before and after: on a shared machine the wall clock follows it.
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from bad_configs import CASES, VERL_CASES  # noqa: E402

HOLD = ("import sys, time\nfrom ragen_turn.engines.rundir import lock_run_dir\n"
        "lock_run_dir(sys.argv[1]); print('locked', flush=True); time.sleep(600)\n")


def message(stderr: str) -> str:
    """The error's text: our one ``error:`` line, or Hydra's first lines (which name the key)."""
    raw = [ln for ln in stderr.splitlines() if ln.strip()]
    lines = [ln.strip() for ln in raw]
    if any(ln.startswith("error:") for ln in lines):  # our line, and the problems listed under it
        i = next(i for i, ln in enumerate(lines) if ln.startswith("error:"))
        more = [ln.strip() for ln in raw[i + 1:] if ln.startswith("  ")]
        return " / ".join([lines[i], *more])
    keep = [ln for ln in lines if not ln.startswith(("Set the environment variable", "object_type", "reference_type"))]
    return " / ".join(keep[:3])


def run_case(overrides, tmp: Path, python: Optional[str]):
    run_dir = tmp / "run"
    cache = tmp / "cache"
    env = {**os.environ, "RAGEN_TURN_CACHE_DIR": str(cache)}
    if python:  # else train.sh picks it (.venv, or .venv-verl for engine=verl)
        env["PYTHON"] = python
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    p = subprocess.run(["bash", "train.sh", "sokoban", "turn_ppo", f"trainer.default_local_dir={run_dir}",
                        *overrides], cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    left = [str(x) for x in (run_dir, cache) if x.exists() and (x != run_dir or any(
        y.name != "run.lock" for y in x.iterdir()))]
    return p.returncode, wall, cpu, left, message(p.stderr)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="also write the table to this markdown file")
    ap.add_argument("--python", help="the Python train.sh runs (default: train.sh's choice)")
    args = ap.parse_args()
    rows = []
    print(f"load average before: {os.getloadavg()}", file=sys.stderr)
    for overrides, key in CASES + VERL_CASES:
        with tempfile.TemporaryDirectory(prefix="bad_config_") as d:
            code, wall, cpu, left, msg = run_case(overrides, Path(d), args.python)
        rows.append((" ".join(overrides), code, wall, cpu, left, msg, key in msg))
        print(f"{rows[-1][0]}: exit {code} in {wall:.1f} s", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="bad_config_") as d:  # a live run holds the dir
        run_dir = Path(d) / "run"
        holder = subprocess.Popen([args.python or sys.executable, "-c", HOLD, str(run_dir)],
                                  stdout=subprocess.PIPE, text=True, cwd=ROOT)
        holder.stdout.readline()
        code, wall, cpu, left, msg = run_case(["trainer.resume=true"], Path(d), args.python)
        holder.kill()
        holder.wait()
        rows.append((f"(run dir held by live pid {holder.pid}) trainer.resume=true", code, wall, cpu, [], msg,
                     f"pid {holder.pid}" in msg))
    with tempfile.TemporaryDirectory(prefix="bad_config_") as d:  # the dir holds a finished run
        (Path(d) / "run").mkdir()
        (Path(d) / "run" / "metrics.jsonl").write_text('{"step": 0}\n')
        code, wall, cpu, left, msg = run_case([], Path(d), args.python)
        rows.append(("(run dir holds a finished run) no resume / overwrite", code, wall, cpu, [], msg,
                     "trainer.resume" in msg))
    print(f"load average after: {os.getloadavg()}", file=sys.stderr)
    table = ["| bad input | exit | wall s | CPU s | left behind | key named | message |",
             "|---|---|---|---|---|---|---|"]
    for inp, code, wall, cpu, left, msg, named in rows:
        table.append(f"| `{inp}` | {code} | {wall:.1f} | {cpu:.1f} | {', '.join(left) or 'nothing'} | "
                     f"{'yes' if named else 'NO'} | {msg.replace('|', '/')[:220]} |")
    text = "\n".join(table)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    bad = [r for r in rows if r[1] != 2 or r[4] or not r[6]]
    print(f"{len(rows)} cases, max wall {max(r[2] for r in rows):.1f} s, max CPU {max(r[3] for r in rows):.1f} s, "
          f"{len(bad)} not stopping with exit 2 naming the key and leaving nothing", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
