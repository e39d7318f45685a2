"""A verl run's processes end with it, however it ends, and leave nothing in the temp directory.

Every verl run has a private temporary directory (``engines.verl.private_tmpdir``): its Ray workers' ``TMPDIR``
and Ray's own temp dir (``ray.init(_temp_dir=<it>/ray)``, so the Ray session folder lives in it too). Every
process of the run (Ray's GCS, raylet, dashboard and workers) names it in its command line or its environment,
which is how :func:`run_processes` finds them.

- A clean exit: ``ray.shutdown()``, then :func:`cleanup` (anything of the run still alive is ended, the
  directory removed).
- Any other exit of the driver (an exception, Ctrl-C, ``kill -9``): :func:`start` launches this module as a
  small process of its own session (Ctrl-C and a kill of the driver's process group do not reach it) that polls
  the driver's pid twice a second and, once it is gone, runs the same :func:`cleanup`.

``python -m ragen_turn.engines.verl.watchdog <driver pid> <dir>`` is the watchdog. It imports only the standard
library (it starts in a few tens of milliseconds).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional

POLL_S = 0.5
RESCAN = 20  # polls between two scans of the run's processes (10 s)
GRACE_S = 3.0  # SIGTERM first; what is still alive then gets SIGKILL


def _alive(pid: int) -> bool:
    """``pid`` runs (a zombie, dead but not yet reaped by its parent, counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _read(pid: str, part: str) -> bytes:
    try:
        with open(f"/proc/{pid}/{part}", "rb") as f:
            return f.read()
    except OSError:  # gone, or another user's
        return b""


def _stat(pid: str) -> tuple:
    """(parent pid, start time) of ``pid`` from /proc (0, 0 when gone)."""
    text = _read(pid, "stat").decode(errors="replace")
    try:
        fields = text.rsplit(")", 1)[1].split()
        return int(fields[1]), int(fields[19])
    except (IndexError, ValueError):
        return 0, 0


def run_processes(marker: str) -> Dict[int, int]:
    """The run's processes, ``{pid: start time}``: those whose command line or environment contains ``marker``
    (the run's private dir: Ray's GCS and raylet name it, the job's workers have it as ``TMPDIR``), the workers
    of such a raylet (``RAY_RAYLET_PID`` in their environment: idle and agent workers, whose titles hide their
    arguments), and the descendants of all these; not this process, not a watchdog."""
    want = marker.encode()
    me = str(os.getpid())
    info = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit() and pid != me:
            cmd = _read(pid, "cmdline")
            if b"ragen_turn.engines.verl.watchdog" not in cmd:
                info[pid] = (cmd, _read(pid, "environ"), _stat(pid))
    found = {pid for pid, (cmd, env, _) in info.items() if want in cmd or want in env}
    raylets = [pid for pid in found if b"raylet" in info[pid][0]]
    tags = [f"RAY_RAYLET_PID={r}".encode() for r in raylets]
    found |= {pid for pid, (_, env, _) in info.items() if any(t in env.split(b"\0") for t in tags)}
    grew = True
    while grew:
        more = {pid for pid, (_, _, (ppid, _)) in info.items() if str(ppid) in found} - found
        found |= more
        grew = bool(more)
    return {int(pid): info[pid][2][1] for pid in found}


def _same(pid: int, start: int) -> bool:
    """``pid`` is still the process that started at ``start`` (not a new one that reused the number)."""
    return _alive(pid) and _stat(str(pid))[1] == start


def end_processes(marker: str, grace: float = GRACE_S, known: Optional[Dict[int, int]] = None) -> List[int]:
    """SIGTERM every process of the run (found now, or ``known`` earlier and still the same process), SIGKILL
    those alive ``grace`` seconds later. Returns the pids signalled."""
    procs = {p: t for p, t in (known or {}).items() if _same(p, t)}
    procs.update(run_processes(marker))
    for pid in procs:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    end = time.time() + grace
    while time.time() < end and any(_same(p, t) for p, t in procs.items()):
        time.sleep(0.1)
    procs.update(run_processes(marker))  # and any started meanwhile
    for pid, t in procs.items():
        if _same(pid, t):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    return sorted(procs)


def cleanup(tmpdir: str, grace: float = GRACE_S, known: Optional[Dict[int, int]] = None) -> List[int]:
    """End the run's processes, then remove its private directory (the Ray session folder inside)."""
    pids = end_processes(tmpdir, grace, known)
    for _ in range(3):  # a process that was writing there may have recreated a file
        shutil.rmtree(tmpdir, ignore_errors=True)
        if not os.path.exists(tmpdir):
            break
        time.sleep(0.2)
    return pids


def start(driver_pid: int, tmpdir: str) -> subprocess.Popen:
    """The watchdog of a run whose driver is ``driver_pid``, in a session of its own."""
    return subprocess.Popen([sys.executable, "-m", "ragen_turn.engines.verl.watchdog", str(driver_pid), tmpdir],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, close_fds=True)


def main(argv: List[str]) -> int:
    driver, tmpdir = int(argv[0]), argv[1]
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    known: Dict[int, int] = {}
    n = 0
    while _alive(driver):
        if n % RESCAN == 0:  # the run's processes, in case its raylet dies before the driver
            known.update(run_processes(tmpdir))
        time.sleep(POLL_S)
        n += 1
    cleanup(tmpdir, known=known)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
