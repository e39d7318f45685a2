"""Kill real verl runs (Ray, verl's FSDP2 workers on CPU, the hf rollout) and check what a user sees (issue #47).

Each case starts ``python -m ragen_turn.train ... engine=verl`` (3 steps of 16 episodes, a checkpoint after every
step, no warm start), kills one piece while it trains, then checks:

- exit: the command's exit code and the seconds from the kill to its end; its stderr's last line (one ``error:``
  line naming what died and the resume command) and the tracebacks printed on the console (Ray forwards the
  workers' output there);
- ``left after 10 s``: processes of the run still alive 10 s after the command ended, and whether its private
  temp dir (Ray's session folder inside) is still there;
- ``resume = uninterrupted``: the command the error line proposes (issue #59; ``trainer.resume=true`` after a driver
  kill, which prints nothing), run from another directory, finishes the run and its ``metrics.jsonl`` (timings left
  out) equals an uninterrupted run's.

Cases: ``worker`` (kill -9 of an FSDP worker, ``ray::WorkerDict``), ``rollout`` (kill -9 of the hf rollout server,
``ray::HFServer``), ``driver`` (kill -9 of the train command), ``ckpt_window`` (the task runner, which runs the
training loop, killed by ``RAGEN_TURN_CRASH_AT`` at checkpoint 2's first file: the step's metrics line is written,
its checkpoint is not), ``first_ckpt_window`` (the same at checkpoint 1: no checkpoint yet, so the line proposes the
command that starts the run over; before issue #59 it said "start it again" and that command exited 2 "already
holds a run"), ``unverified`` (a copy of the uninterrupted run whose newest checkpoint lost its ``complete.json``:
the resume must be refused, exit 2 before Ray, naming it and ``trainer.load_unverified=true``).

    .venv-verl/bin/python benchmarks/fault_injection.py [--cases worker,driver] [--out FILE]

About 2 minutes per run on 2 CPU cores (each case is a killed run and its resume, after one reference run).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from ragen_turn.engines.verl import watchdog  # noqa: E402

RUN = ["env=sokoban", "algo=turn_ppo", "engine=verl", "model.warmstart.enable=false",
       "trainer.total_training_steps=3", "trainer.save_freq=1", "trainer.test_freq=0",
       "trainer.val_before_train=false", "es_manager.train.env_groups=4", "ppo_mini_batch_size=16",
       "es_manager.val.env_groups=4"]
TIMEOUT_S = 900


def start(run_dir: Path, extra: tuple = (), env: Optional[dict] = None) -> tuple:
    log = open(run_dir.parent / f"{run_dir.name}.log", "ab")
    p = subprocess.Popen([sys.executable, "-m", "ragen_turn.train", *RUN, f"trainer.default_local_dir={run_dir}",
                          *extra], cwd=REPO, stdout=log, stderr=subprocess.PIPE,
                         env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
    return p, log


def private_dir(log_path: Path, timeout: float = 300) -> str:
    """The run's private temp dir, from verl's ``ray init kwargs`` line."""
    end = time.time() + timeout
    while time.time() < end:
        m = re.search(r"'TMPDIR': '([^']+)'", log_path.read_text(errors="replace")) if log_path.exists() else None
        if m:
            return m.group(1)
        time.sleep(0.5)
    raise TimeoutError(f"no ray init line in {log_path}")


def wait_for(pred: Callable[[], bool], timeout: float, what: str) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return
        time.sleep(0.5)
    raise TimeoutError(f"waited {timeout} s for {what}")


def steps_logged(run_dir: Path) -> List[int]:
    m = run_dir / "metrics.jsonl"
    if not m.exists():
        return []
    out = []
    for line in m.read_text().splitlines():
        try:
            out.append(json.loads(line)["step"])
        except (ValueError, KeyError):
            pass
    return out


def metrics(run_dir: Path) -> List[Dict]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    # timings and the workers' memory readings (actor/perf/*, critic/perf/*) differ between any two runs
    return [{k: v for k, v in r.items() if not k.startswith(("timing", "perf/")) and "/perf/" not in k} for r in rows]


def actor_pids(tmp: str, title: str) -> List[int]:
    out = []
    for pid in watchdog.run_processes(tmp):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if cmd.startswith(f"ray::{title}"):
            out.append(pid)
    return out


def finish(p: subprocess.Popen, log, tmp: Optional[str], t_kill: float) -> Dict:
    _, err = p.communicate(timeout=TIMEOUT_S)
    t_end = time.time()
    log.close()
    err = err.decode(errors="replace")
    lines = [x for x in err.splitlines() if x.strip()]
    time.sleep(10)
    left = watchdog.run_processes(tmp) if tmp else {}
    return {"rc": p.returncode, "exit_s": round(t_end - t_kill, 1), "tracebacks": err.count("Traceback ("),
            "error": lines[-1] if lines else "", "left_procs": len(left),
            "tmp_left": bool(tmp and os.path.exists(tmp))}


def proposed_command(error: str) -> Optional[List[str]]:
    """The command the run's error line proposes (after ``with: ``), split as a shell would (issue #59: the
    benchmark runs what the message says, not a command of its own)."""
    import shlex

    _, sep, cmd = error.partition(" with: ")
    return shlex.split(cmd) if sep else None


def resume_equal(run_dir: Path, ref: List[Dict], error: str = "") -> Dict:
    command = proposed_command(error)
    if command is None:
        p, log = start(run_dir, ("trainer.resume=true",))
    else:  # from another directory: the command must hold everything it needs
        log = open(run_dir.parent / f"{run_dir.name}.log", "ab")
        p = subprocess.Popen(command, cwd=tempfile.gettempdir(), stdout=log, stderr=subprocess.PIPE,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
    _, err = p.communicate(timeout=TIMEOUT_S)
    log.close()
    ok = p.returncode == 0 and metrics(run_dir) == ref
    return {"resume_rc": p.returncode, "resume_equal": ok, "resumed_with": "the proposed command" if command else
            "trainer.resume=true", "resume_steps": steps_logged(run_dir),
            "resume_err": err.decode(errors="replace")[-300:] if not ok else ""}


def case_kill_actor(root: Path, ref: List[Dict], title: str) -> Dict:
    run_dir = root / f"kill_{title}"
    p, log = start(run_dir)
    tmp = private_dir(root / f"{run_dir.name}.log")
    wait_for(lambda: 1 in steps_logged(run_dir) or p.poll() is not None, TIMEOUT_S, "step 1")
    pids = actor_pids(tmp, title)
    if not pids:
        p.kill()
        return {"rc": None, "error": f"no ray::{title} process found"}
    t = time.time()
    os.kill(pids[0], signal.SIGKILL)
    out = finish(p, log, tmp, t)
    return {**out, **resume_equal(run_dir, ref, out["error"])}


def case_driver(root: Path, ref: List[Dict]) -> Dict:
    run_dir = root / "kill_driver"
    p, log = start(run_dir)
    tmp = private_dir(root / f"{run_dir.name}.log")
    wait_for(lambda: 1 in steps_logged(run_dir) or p.poll() is not None, TIMEOUT_S, "step 1")
    t = time.time()
    p.send_signal(signal.SIGKILL)
    out = finish(p, log, tmp, t)
    out["error"] = "(killed: no message)"
    return {**out, **resume_equal(run_dir, ref)}


def case_ckpt_window(root: Path, ref: List[Dict], crash_at: int, name: str = "ckpt_window") -> Dict:
    run_dir = root / name
    p, log = start(run_dir, env={"RAGEN_TURN_CRASH_AT": str(crash_at)})
    tmp = private_dir(root / f"{run_dir.name}.log")
    out = finish(p, log, tmp, time.time())
    out["exit_s"] = None
    out["steps_before_resume"] = steps_logged(run_dir)
    return {**out, **resume_equal(run_dir, ref, out["error"])}


def case_unverified(root: Path, ref_dir: Path) -> Dict:
    """Issue #59: a copy of the reference run whose newest checkpoint lost its complete.json: the resume is
    refused (exit 2, before Ray) naming it, the newest verified checkpoint and trainer.load_unverified=true."""
    import shutil

    run_dir = root / "unverified"
    shutil.copytree(ref_dir, run_dir, ignore=shutil.ignore_patterns("run.lock"))
    newest = sorted(run_dir.glob("global_step_*"), key=lambda q: int(q.name.split("_")[-1]))[-1]
    (newest / "complete.json").unlink()
    t = time.time()
    p, log = start(run_dir, ("trainer.resume=true", "trainer.total_training_steps=4"))
    _, err = p.communicate(timeout=TIMEOUT_S)
    log.close()
    lines = [x for x in err.decode(errors="replace").splitlines() if x.strip()]
    said = lines[-1] if lines else ""
    named = newest.name in said and "trainer.load_unverified=true" in said and "unpickles" in said
    return {"rc": p.returncode, "exit_s": round(time.time() - t, 1), "tracebacks": said.count("Traceback"),
            "error": said, "left_procs": 0, "tmp_left": False, "resume_equal": p.returncode == 2 and named}


def crash_index(crash_log: Path, label: str = "actor written", nth: int = 2) -> int:
    seen = 0
    for line in crash_log.read_text().splitlines():
        n, lab = line.split(" ", 1)
        if lab == label:
            seen += 1
            if seen == nth:
                return int(n)
    raise ValueError(f"no {nth}th {label!r} in {crash_log}")


def table(rows: Dict[str, Dict]) -> str:
    head = ("| fault | exit | s to exit | tracebacks on the console | last stderr line "
            "| left after 10 s (procs, temp dir) | resume = uninterrupted |\n|---|---|---|---|---|---|---|")
    out = [head]
    for name, r in rows.items():
        err = (r.get("error") or "").replace("|", "/")[:160]
        out.append(f"| {name} | {r.get('rc')} | {r.get('exit_s', '-')} | {r.get('tracebacks', '-')} | {err} | "
                   f"{r.get('left_procs', '-')}, {'left' if r.get('tmp_left') else 'removed'} | "
                   f"{r.get('resume_equal')} (steps {r.get('resume_steps')}) |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default="worker,rollout,driver,ckpt_window,first_ckpt_window,unverified")
    ap.add_argument("--out", default=None)
    ap.add_argument("--reference", default=None, help="the root of an earlier run of this script: reuse its "
                    "uninterrupted run (reference/, crash_points.log)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ragen_turn_faults_"))
    print(f"[faults] runs under {root}", flush=True)
    ref_root = Path(args.reference) if args.reference else root
    ref_dir = ref_root / "reference"
    crash_log = ref_root / "crash_points.log"
    t0 = time.time()
    if not args.reference:
        p, log = start(ref_dir, env={"RAGEN_TURN_CRASH_LOG": str(crash_log)})
        _, err = p.communicate(timeout=TIMEOUT_S)
        log.close()
        if p.returncode != 0:
            sys.exit(f"reference run failed: {err.decode(errors='replace')[-2000:]}")
    ref = metrics(ref_dir)
    print(f"[faults] reference: steps {steps_logged(ref_dir)} in {time.time() - t0:.0f} s", flush=True)
    rows: Dict[str, Dict] = {}
    for case in args.cases.split(","):
        t = time.time()
        if case == "worker":
            rows["kill -9 an FSDP worker (ray::WorkerDict) after step 1"] = case_kill_actor(root, ref, "WorkerDict")
        elif case == "rollout":
            rows["kill -9 the rollout server (ray::HFServer) after step 1"] = case_kill_actor(root, ref, "HFServer")
        elif case == "driver":
            rows["kill -9 the driver after step 1"] = case_driver(root, ref)
        elif case == "ckpt_window":
            rows["task runner killed between step 2's metrics line and its checkpoint"] = \
                case_ckpt_window(root, ref, crash_index(crash_log))
        elif case == "first_ckpt_window":  # issue #59: no checkpoint yet; the line proposes a command that starts over
            rows["task runner killed between step 1's metrics line and the first checkpoint"] = \
                case_ckpt_window(root, ref, crash_index(crash_log, nth=1), "first_ckpt_window")
        elif case == "unverified":  # issue #59 (seconds: refused before Ray; "resume" column: refused as it should)
            rows["resume when the newest checkpoint lost its complete.json"] = case_unverified(root, ref_dir)
        print(f"[faults] {case}: {time.time() - t:.0f} s: {json.dumps(list(rows.values())[-1])}", flush=True)
    text = table(rows)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
