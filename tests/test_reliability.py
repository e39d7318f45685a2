"""Crashes, full disks and two processes in one run dir (issue #18).

- kill-anywhere: a run killed at each crash point of a checkpoint write (staging, every file, manifest, rename,
  the four steps of ``latest``, ``last_good``, the rotation's delete) resumes to metrics identical to an
  uninterrupted run; one kill is a real SIGKILL at the moment ``latest``'s temp file is empty, one a SIGKILL
  from outside at a random moment;
- checkpoint bookkeeping: ``latest`` missing / empty / naming an incomplete or older dir, half-deleted and
  staging dirs, rotation never deleting the last confirmed checkpoint, ``resume_from``;
- the run-dir lock: a second process (train or resume) is refused at once naming the holder's pid; a lock left
  by a killed process is taken over with a line saying so;
- a full disk says "no space left on device while writing <path>" and the checkpoint to resume from;
- a torn last line of metrics.jsonl is dropped on resume, with a warning naming the file;
- env reset(seed) takes ints only.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import crash_child
from helpers import micro_config
from ragen_turn.engines import checkpoints as ckpt
from ragen_turn.engines.rundir import (
    DiskFull,
    RunDirBusy,
    atomic_write_text,
    check_run_dir,
    lock_run_dir,
    run_dir_holds_run,
)
from ragen_turn.engines.runlog import read_metrics, truncate_metrics

# the crash points of checkpoint 2 (and of the last_good write after it), then the rotation's delete in
# checkpoint 3, in the order the run passes them (the reference run's log must list exactly these)
CKPT2 = [".tmp_step_000002: created", "actor written", "tokenizer written", "critic written",
         "trainer state written", ".tmp_step_000002: manifest written", ".tmp_step_000002: synced",
         "step_000002: renamed into place", "latest: temp file created, empty", "latest: temp file written, not synced",
         "latest: temp file synced, not renamed", "latest: renamed, directory not synced",
         "last_good: temp file created, empty", "last_good: temp file written, not synced",
         "last_good: temp file synced, not renamed", "last_good: renamed, directory not synced"]
DELETE = ["step_000001: renamed for deletion", "step_000001: deleted"]
KILL_POINTS = [(label, 0) for label in CKPT2] + [(label, 0) for label in DELETE]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run, with the numbered log of every crash point it passed."""
    d = tmp_path_factory.mktemp("reference")
    log = d / "crash_points.log"
    assert crash_child.run(d / "run", crash_log=str(log)) == 0
    points = [line.split(" ", 1) for line in log.read_text().splitlines()]
    return {"metrics": crash_child.metrics(d / "run"), "points": [(int(n), label) for n, label in points],
            "run": d / "run"}


def _point(reference, label: str, after: str) -> int:
    """The number of the first crash point called ``label`` after the one called ``after``."""
    seen = False
    for n, lab in reference["points"]:
        if lab == after:
            seen = True
        if seen and lab == label:
            return n
    raise AssertionError(f"no crash point {label!r} after {after!r}")


def test_the_reference_run_passes_the_listed_crash_points(reference):
    labels = [lab for _, lab in reference["points"]]
    start = labels.index(CKPT2[0])
    assert labels[start:start + len(CKPT2)] == CKPT2
    assert labels[-len(DELETE):] == DELETE
    assert [r["step"] for r in reference["metrics"]] == [0, 1, 2, 3]
    assert sorted(p.name for p in (reference["run"] / "checkpoints").iterdir()) == \
        ["last_good", "latest", "step_000002", "step_000003"]  # step 2 kept: the last confirmed one


def _resume_state(run_dir: Path) -> tuple:
    """Everything a resume of ``run_dir`` reads: the checkpoint it picks (name and every file's bytes) and the
    metrics lines it keeps (without timings). Two crashes that leave the same state resume the same way."""
    point = ckpt.resume_point(run_dir / "checkpoints", log=lambda *_: None)
    files = tuple((str(f.relative_to(point)), hashlib.sha256(f.read_bytes()).hexdigest())
                  for f in sorted(point.rglob("*")) if f.is_file())
    step = int(json.loads((point / ckpt.MANIFEST).read_text())["step"])
    kept = [r for r in crash_child.metrics(run_dir) if r["step"] <= step]
    return point.name, files, json.dumps(kept, sort_keys=True)


_resumed_states: dict = {}  # resume state -> the crash point whose resume was run and checked


@pytest.mark.parametrize("label", CKPT2 + DELETE)
def test_kill_at_a_checkpoint_crash_point_then_resume_gives_identical_metrics(reference, tmp_path, label):
    """Killed at ``label``: ``latest`` is whole, the newest complete checkpoint is loadable, and the resume gives
    the uninterrupted run's metrics. Crash points that leave the same resume state (:func:`_resume_state`) are
    resumed once (the resume is deterministic in that state): the test checks the state is one already resumed."""
    n = _point(reference, label, CKPT2[0] if label in CKPT2 else DELETE[0])
    how = f"{n}:sigkill" if label == "latest: temp file created, empty" else str(n)  # a real SIGKILL there
    code = crash_child.run(tmp_path, crash_at=how)
    assert code == (-signal.SIGKILL if how.endswith("sigkill") else 137), code
    ckpts = tmp_path / "checkpoints"
    latest = (ckpts / "latest").read_text().strip()
    assert latest in ("step_000001", "step_000002", "step_000003")  # never empty, never torn
    point = ckpt.resume_point(ckpts, log=lambda *_: None)
    assert point is not None and ckpt.incomplete_reason(point) is None
    state = _resume_state(tmp_path)
    if state in _resumed_states and not os.environ.get("RAGEN_TURN_RESUME_EVERY_KILL"):
        return  # the same files as a crash whose resume matched the reference
    assert crash_child.run(tmp_path, resume=True) == 0
    assert crash_child.metrics(tmp_path) == reference["metrics"], label
    assert not [p for p in ckpts.iterdir() if p.name.startswith(".")], "staging / deletion leftovers"
    _resumed_states[state] = label


def test_the_kills_left_several_distinct_states(reference):
    """The kills above covered more than one resume state (before and after the rename, before and after
    ``latest``), each resumed to the reference's metrics."""
    if len(_resumed_states) == 0:
        pytest.skip("run with the kill tests")
    assert len(_resumed_states) >= 2, _resumed_states


def test_sigkill_from_outside_at_a_random_moment_then_resume_gives_identical_metrics(reference, tmp_path):
    """A real kill -9 while the run trains or checkpoints (timed at random after its first checkpoint)."""
    ctx = crash_child.context()
    p = ctx.Process(target=crash_child.train, args=(str(tmp_path),))
    p.start()
    deadline = time.time() + 300
    while not (tmp_path / "checkpoints" / "step_000001").is_dir() and p.is_alive() and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(random.uniform(0, 1.5))
    if p.is_alive():
        os.kill(p.pid, signal.SIGKILL)
    p.join(60)
    assert crash_child.run(tmp_path, resume=True) == 0
    assert crash_child.metrics(tmp_path) == reference["metrics"]


# ------------------------------------------------------------------------------------------------ bookkeeping
def _fake_checkpoint(ckpts: Path, step: int) -> Path:
    """A complete step dir made by the real staging + commit (files are stand-ins)."""
    tmp = ckpt.begin(ckpts, step)
    (tmp / "actor").mkdir()
    (tmp / "actor" / "config.json").write_text("{}")
    (tmp / "trainer_state.pt").write_bytes(b"x" * (100 + step))
    return ckpt.commit(tmp, step)


def test_resume_point_when_latest_is_missing_empty_garbage_incomplete_or_older(tmp_path):
    ckpts = tmp_path / "checkpoints"
    for s in (1, 2):
        _fake_checkpoint(ckpts, s)
    said = []
    assert ckpt.resume_point(ckpts, log=said.append).name == "step_000002" and not said
    cases = {"": "latest is empty", "garbage\n": "holds 8 bytes that name no checkpoint (garbage)",
             "step_000009\n": "names 'step_000009', which is not a complete checkpoint (missing)",
             os.urandom(300).replace(b"\n", b"x").decode("latin-1"): "holds 300 bytes that name no checkpoint",
             "step_000001\n": "older"}
    for text, why in cases.items():
        (ckpts / "latest").write_bytes(text.encode("latin-1"))  # what a crash of a non-atomic write could leave
        said.clear()
        assert ckpt.resume_point(ckpts, log=said.append).name == "step_000002"
        assert why in said[0] and "resuming from step_000002" in said[0], said
    (ckpts / "latest").unlink()
    said.clear()
    assert ckpt.resume_point(ckpts, log=said.append).name == "step_000002" and "latest is missing" in said[0]
    # the newest dir lost a file (a half-deleted dir of an older version): the one before is used
    (ckpts / "latest").write_text("step_000002\n")
    (ckpts / "step_000002" / "trainer_state.pt").unlink()
    said.clear()
    assert ckpt.resume_point(ckpts, log=said.append).name == "step_000001"
    assert "trainer_state.pt is missing" in said[0]


def test_a_checkpoint_file_corrupted_at_the_same_size_fails_its_checksum_and_the_one_before_is_used(tmp_path):
    """issue #47 finding 5: trainer_state.pt with zeroed bytes (same size) used to end the resume with torch's
    ``KeyError: "filename 'storages' not found"``; complete.json holds each file's sha256 and the resume says
    which file of which checkpoint is corrupt and goes back to the newest that verifies."""
    ckpts = tmp_path / "checkpoints"
    for s in (1, 2):
        _fake_checkpoint(ckpts, s)
    state = ckpts / "step_000002" / "trainer_state.pt"
    state.write_bytes(bytes(state.stat().st_size))
    assert ckpt.incomplete_reason(ckpts / "step_000002") is None  # sizes match: only the checksum sees it
    said = []
    assert ckpt.resume_point(ckpts, log=said.append).name == "step_000001"
    assert "step_000002" in said[0] and "trainer_state.pt does not match its sha256" in said[0], said
    assert "resuming from step_000001" in said[-1], said
    with pytest.raises(FileNotFoundError, match="trainer_state.pt does not match its sha256"):
        ckpt.find(ckpts, "step_000002", verify=True)


def test_a_local_resume_from_a_corrupt_checkpoint_loads_the_one_before(tmp_path):
    """The local trainer end to end: step 2's trainer_state.pt zeroed; the resume says so, loads step 1, and a
    checkpoint without checksums (an older manifest) that fails to load is passed over the same way."""
    from ragen_turn.engines.local.trainer import build_trainer

    common = ["algo=grpo", "trainer.save_freq=1", "trainer.keep_checkpoints=0", "trainer.test_freq=0",
              "trainer.val_before_train=false"]
    build_trainer(micro_config(common + ["trainer.total_training_steps=3"], run_dir=tmp_path),
                  log=lambda *_: None).fit()
    ckpts = tmp_path / "checkpoints"
    state = ckpts / "step_000003" / "trainer_state.pt"
    state.write_bytes(bytes(state.stat().st_size))
    manifest = ckpts / "step_000002" / ckpt.MANIFEST  # step 2: an older manifest (no sha256), a corrupt file
    doc = json.loads(manifest.read_text())
    del doc["sha256"]
    manifest.write_text(json.dumps(doc))
    state = ckpts / "step_000002" / "trainer_state.pt"
    state.write_bytes(bytes(state.stat().st_size))
    # issue #59: a checkpoint whose files cannot be verified is refused, naming the key that loads it knowingly
    from ragen_turn.engines.rundir import lock_run_dir

    with pytest.raises(ckpt.UnverifiedCheckpoint, match="step_000002 is unverified .*no sha256.*newest verified "
                                                        "checkpoint is step_000001.*trainer.load_unverified=true"):
        build_trainer(micro_config(common + ["trainer.total_training_steps=3", "trainer.resume=true"],
                                   run_dir=tmp_path), log=lambda *_: None)
    lock_run_dir(tmp_path).release()
    said = []
    tr = build_trainer(micro_config(common + ["trainer.total_training_steps=3", "trainer.resume=true",
                                              "trainer.load_unverified=true"], run_dir=tmp_path), log=said.append)
    assert tr.step == 1, said
    text = "\n".join(said)
    assert "step_000003 is not loadable: trainer_state.pt does not match its sha256" in text, text
    assert "step_000002 failed to load" in text and "resumed from" in text and "step_000001" in said[-1], text


def test_clean_removes_staging_deletion_and_incomplete_dirs_and_keeps_complete_ones(tmp_path):
    ckpts = tmp_path / "checkpoints"
    _fake_checkpoint(ckpts, 1)
    _fake_checkpoint(ckpts, 2)
    (ckpts / ".tmp_step_000003").mkdir()
    (ckpts / ".del_step_000000").mkdir()
    (ckpts / ".latest.tmp-123").write_text("step")
    half = ckpts / "step_000002"
    (half / "actor" / "config.json").unlink()  # half-deleted (an old rmtree killed midway)
    legacy = ckpts / "step_000000"  # written before manifests existed: complete, kept
    (legacy / "actor").mkdir(parents=True)
    (legacy / "actor" / "config.json").write_text("{}")
    (legacy / "trainer_state.pt").write_bytes(b"x")
    said = []
    ckpt.clean(ckpts, log=said.append)
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_000000", "step_000001"]
    assert any("incomplete checkpoint" in s and "step_000002" in s for s in said), said


def test_rotation_never_deletes_the_last_confirmed_checkpoint(tmp_path):
    """issue #18 item 3: a blow-up fills keep_checkpoints with broken checkpoints; the good one stays."""
    ckpts = tmp_path / "checkpoints"
    for s in (10, 11):
        _fake_checkpoint(ckpts, s)
    ckpt.confirm(ckpts, ckpts / "step_000010")  # step 11 updated soundly from step 10's weights
    for s in (12, 13, 14):  # steps whose updates were not sound: never confirmed
        _fake_checkpoint(ckpts, s)
        ckpt.rotate(ckpts, keep=2)
    assert [p.name for p in ckpt.step_dirs(ckpts)] == ["step_000010", "step_000013", "step_000014"]
    assert ckpt.find(ckpts, "last_good").name == "step_000010"
    with pytest.raises(FileNotFoundError, match="trainer.resume_from=step_000011"):
        ckpt.find(ckpts, "step_000011")


def test_a_blow_up_keeps_a_good_checkpoint_and_names_it(tmp_path):
    """lr=1e6 on a resumed run (issue #18 item 3): the update after the good checkpoint has finite gradients and
    blows the weights up, later updates are skipped as non-finite and the run stops; with keep_checkpoints=2 the
    good one survives and the stop names it; resume_from=last_good goes back to it."""
    from ragen_turn.engines.local.trainer import build_trainer
    from ragen_turn.engines.rundir import TrainingStopped

    common = ["algo=turn_ppo", "trainer.save_freq=1", "trainer.keep_checkpoints=2", "trainer.max_nonfinite_steps=2"]
    blow_up = ["actor_rollout_ref.actor.optim.lr=1e6", "critic.optim.lr=1e6"]
    build_trainer(micro_config(common + ["trainer.total_training_steps=2"], run_dir=tmp_path),
                  log=lambda *_: None).fit()
    said = []
    tr = build_trainer(micro_config(common + blow_up + ["trainer.total_training_steps=8", "trainer.resume=true"],
                                    run_dir=tmp_path), log=said.append)
    with pytest.raises(TrainingStopped) as e:
        tr.fit()
    # step 3's first mini-batch blew the critic up and its second was not finite: step 2's checkpoint was not
    # confirmed; step 1's was (by step 2, before the lr changed)
    good = ckpt.last_good(tmp_path / "checkpoints")
    assert good is not None and good.name == "step_000001", said
    assert str(good) in str(e.value) and "resume_from=last_good" in str(e.value)
    # steps 3 and 4 were not finite (the 2nd in a row stops before its checkpoint): keep 2 (steps 2, 3) + step 1
    assert [p.name for p in ckpt.step_dirs(tmp_path / "checkpoints")] == ["step_000001", "step_000002",
                                                                         "step_000003"]
    assert any(line.startswith("[warn] step ") for line in said)
    back = build_trainer(micro_config(common + ["trainer.total_training_steps=2", "trainer.resume=true",
                                                "trainer.resume_from=last_good"], run_dir=tmp_path),
                         log=lambda *_: None)
    assert back.step == 1 and [p.name for p in ckpt.step_dirs(tmp_path / "checkpoints")] == ["step_000001"]
    assert all(torch.isfinite(p).all() for p in back.actor.parameters())


def test_an_update_that_blows_the_weights_up_is_put_back_and_the_run_stops_naming_last_good(tmp_path):
    """issue #47 finding 6: lr=1e30 passes the config check and step 1's loss and gradient are finite, but the
    weights reach 1e30 and the next rollout's sampler dies in torch.multinomial, with ``latest`` holding the
    poisoned weights. Now the weights are part of the soundness check: the update is put back (weights and
    optimizer state), its checkpoint is the previous weights, last_good is kept and the run stops naming it."""
    from ragen_turn.engines.local.trainer import build_trainer
    from ragen_turn.engines.rundir import TrainingStopped

    common = ["algo=turn_ppo", "trainer.save_freq=1", "trainer.keep_checkpoints=2",
              "trainer.max_nonfinite_steps=2", "trainer.test_freq=0", "trainer.val_before_train=false"]
    build_trainer(micro_config(common + ["trainer.total_training_steps=2"], run_dir=tmp_path),
                  log=lambda *_: None).fit()
    said = []
    tr = build_trainer(micro_config(common + ["actor_rollout_ref.actor.optim.lr=1e30", "trainer.resume=true",
                                              "trainer.total_training_steps=6"], run_dir=tmp_path), log=said.append)
    start = _params(tr.actor)
    with pytest.raises(TrainingStopped) as e:
        tr.fit()
    # every update was put back
    assert all(torch.equal(a, b) for a, b in zip(start, _params(tr.actor))), "\n".join(said)
    assert "step 3: the update left unsound weights (actor weights moved by" in "\n".join(said), said
    good = ckpt.last_good(tmp_path / "checkpoints")
    assert good is not None and good.name == "step_000001"
    assert "2 steps in a row" in str(e.value) and "resume_from=last_good" in str(e.value)
    rows = read_metrics(tmp_path / "metrics.jsonl")  # step 4 stopped the run before its line
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[2]["actor/weights_unsound"] == 1.0
    assert rows[1]["actor/weights_unsound"] == 0.0 and rows[1]["actor/weights_update_rel"] < 0.1


def test_a_non_finite_sampling_distribution_stops_the_run_naming_the_checkpoint(tmp_path):
    """Weights that are not finite (here set by hand) used to end the rollout in torch.multinomial with a bare
    RuntimeError; now the run stops with one line naming the checkpoint to go back to."""
    from ragen_turn.engines.local.trainer import build_trainer
    from ragen_turn.engines.rundir import TrainingStopped

    tr = build_trainer(micro_config(["algo=grpo", "trainer.total_training_steps=2", "trainer.val_before_train=false"],
                                    run_dir=tmp_path), log=lambda *_: None)
    with torch.no_grad():
        next(tr.actor.parameters()).fill_(float("nan"))
    with pytest.raises(TrainingStopped, match="step 1: the policy's sampling distribution is not finite"):
        tr.fit()


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


def test_update_size_guard_rolls_back_a_blow_up_and_stops_the_run(tmp_path):
    """max_update_kl with lr=1e6: every actor update moves the policy past the limit and is rolled back (weights and
    optimizer state), logged; after max_nonfinite_steps such steps in a row the run stops. (The micro model's policy
    is near uniform, so even this update is only ~6e-3 of KL; updates at its usual lr are ~1e-4.)"""
    from ragen_turn.engines.local.trainer import build_trainer
    from ragen_turn.engines.rundir import TrainingStopped

    said = []
    tr = build_trainer(micro_config(["algo=turn_ppo", "trainer.total_training_steps=5", "trainer.save_freq=1",
                                     "trainer.max_nonfinite_steps=3", "actor_rollout_ref.actor.optim.lr=1e6",
                                     "actor_rollout_ref.actor.max_update_kl=1e-3"], run_dir=tmp_path),
                       log=said.append)
    start = _params(tr.actor)
    with pytest.raises(TrainingStopped, match="rolled-back updates in 3 steps in a row"):
        tr.fit()
    assert all(torch.equal(a, b) for a, b in zip(start, tr.actor.parameters()))  # every update undone
    rows = read_metrics(tmp_path / "metrics.jsonl")[1:]
    assert [r["actor/update_rolled_back"] for r in rows] == [1.0, 1.0]  # steps 1-2 logged; step 3 stopped
    assert all(r["actor/update_kl"] > 1e-3 and r["actor/kl_stop"] == 1.0 for r in rows)  # 2 mini-batches a step
    assert sum("rolled back" in s for s in said) == 3 and any(s.startswith("[kl] step 1:") for s in said)
    assert not tr.actor_optim.state  # the optimizer's moments were rolled back too (none before the first step)


def test_update_size_guard_changes_nothing_below_its_limit(tmp_path):
    """A guard that never trips: the same metrics as no guard (its extra forward draws no random numbers)."""
    from ragen_turn.engines.local.trainer import build_trainer

    runs = {}
    for name, extra in (("off", []), ("on", ["actor_rollout_ref.actor.max_update_kl=1e-3"])):
        build_trainer(micro_config(["algo=token_ppo", "trainer.total_training_steps=2", *extra],
                                   run_dir=tmp_path / name), log=lambda *_: None).fit()
        runs[name] = [{k: v for k, v in r.items() if not k.startswith("perf/")}
                      for r in read_metrics(tmp_path / name / "metrics.jsonl")]
    guard_keys = {"actor/update_kl", "actor/kl_stop", "actor/update_rolled_back", "actor/minibatches_stepped"}
    assert [{k: v for k, v in r.items() if k not in guard_keys} for r in runs["on"]] == runs["off"]
    assert all(r["actor/update_rolled_back"] == 0 and r["actor/kl_stop"] == 0 for r in runs["on"][1:])
    assert all(0 <= r["actor/update_kl"] < 1e-3 for r in runs["on"][1:])


def test_warn_line_names_the_step_it_logs(tmp_path):
    """issue #18 item 9: the [warn] line of a skipped update names the step whose metrics line follows."""
    from ragen_turn.engines.local.trainer import build_trainer

    said = []
    tr = build_trainer(micro_config(["algo=turn_ppo", "trainer.total_training_steps=3", "trainer.max_nonfinite_steps=9",
                                     "actor_rollout_ref.actor.optim.lr=1e6", "critic.optim.lr=1e6"], run_dir=tmp_path),
                       log=said.append)
    tr.fit()
    warned = sorted({int(s.split()[2].rstrip(":")) for s in said if s.startswith("[warn] step")})
    logged = [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")  # skipped, or put back (unsound weights)
              if r.get("actor/skipped_updates") or r.get("critic/skipped_updates") or r.get("actor/weights_unsound")]
    assert warned and warned == logged


def test_atomic_write_leaves_the_old_text_when_killed_between_truncate_and_write(tmp_path):
    path = tmp_path / "latest"
    path.write_text("step_000001\n")
    code = (f"import os; os.environ['RAGEN_TURN_CRASH_AT'] = '1'\n"
            f"from ragen_turn.engines.rundir import atomic_write_text\n"
            f"atomic_write_text({str(path)!r}, 'step_000002\\n')\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True)
    assert p.returncode == 137 and path.read_text() == "step_000001\n"
    left = [x.name for x in tmp_path.iterdir() if x.name != "latest"]
    assert len(left) == 1 and left[0].startswith(".latest.tmp-")  # an empty temp file (ckpt.clean removes it)
    atomic_write_text(path, "step_000002\n")
    assert path.read_text() == "step_000002\n"


# ------------------------------------------------------------------------------------------------ lock
HOLD = ("import sys, time\nfrom ragen_turn.engines.rundir import lock_run_dir\n"
        "lock_run_dir(sys.argv[1]); print('locked', flush=True); time.sleep(120)\n")


@pytest.fixture
def holder(tmp_path):
    """A live process that holds ``tmp_path / 'run'``'s lock."""
    run_dir = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "locked"
    yield p, run_dir
    p.kill()
    p.wait()


@pytest.mark.parametrize("resume", [False, True])
def test_a_second_process_into_a_live_run_dir_is_refused_naming_the_holder(holder, resume):
    p, run_dir = holder
    t = time.perf_counter()
    q = subprocess.run([sys.executable, "-m", "ragen_turn.train", "env=sokoban", "algo=turn_ppo",
                        f"trainer.default_local_dir={run_dir}", f"trainer.resume={str(resume).lower()}"],
                       capture_output=True, text=True, timeout=120)
    assert q.returncode == 2, q.stderr
    assert f"in use by pid {p.pid}" in q.stderr and "[warmstart]" not in q.stdout + q.stderr
    assert time.perf_counter() - t < 60
    assert sorted(x.name for x in run_dir.iterdir()) == ["run.lock"]  # nothing of the second process's


def test_a_trainer_in_this_process_is_refused_too(holder):
    from ragen_turn.engines.local.trainer import build_trainer

    p, run_dir = holder
    with pytest.raises(RunDirBusy, match=f"pid {p.pid}"):
        build_trainer(micro_config(run_dir=run_dir))


def test_a_lock_left_by_a_killed_process_is_taken_over_with_a_line(holder):
    p, run_dir = holder
    p.send_signal(signal.SIGKILL)
    p.wait()
    said = []
    lock = lock_run_dir(run_dir, log=said.append)
    try:
        assert len(said) == 1 and f"stale lock of pid {p.pid}" in said[0] and "no longer running" in said[0]
        assert (run_dir / "run.lock").read_text().split()[0] == str(os.getpid())
        assert lock_run_dir(run_dir) is lock  # re-entrant in the holding process
    finally:
        lock.release()
    assert (run_dir / "run.lock").read_text() == ""  # a clean release leaves no pid: the next run says nothing


def test_the_existing_run_rule_is_checked_with_the_lock(tmp_path):
    cfg = micro_config(run_dir=tmp_path)
    check_run_dir(cfg).release()
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    assert run_dir_holds_run(tmp_path)
    with pytest.raises(FileExistsError, match="trainer.resume=true"):
        check_run_dir(cfg)


# ------------------------------------------------------------------------------------------------ disk full
def _enospc(*args, **kwargs):
    path = args[1] if len(args) > 1 else kwargs.get("f")
    Path(path).write_bytes(b"partial")
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("how", ["oserror", "torch_zip_writer"])
def test_a_full_disk_names_the_file_and_the_checkpoint_to_resume_from(tmp_path, monkeypatch, how):
    from ragen_turn.engines import rundir
    from ragen_turn.engines.local.trainer import build_trainer

    tr = build_trainer(micro_config(["algo=grpo", "trainer.total_training_steps=2", "trainer.save_freq=1"],
                                    run_dir=tmp_path), log=lambda *_: None)
    real_save = torch.save
    calls = []

    def save(obj, f, *a, **k):
        calls.append(f)
        if len(calls) == 1:
            return real_save(obj, f, *a, **k)
        if how == "oserror":
            return _enospc(obj, f)
        Path(f).write_bytes(b"partial")
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 6472832 vs 6472724")

    monkeypatch.setattr(torch, "save", save)
    if how == "torch_zip_writer":  # the zip writer loses the errno: the free space tells
        monkeypatch.setattr(rundir.shutil, "disk_usage", lambda p: type("U", (), {"free": 0})())
    with pytest.raises(DiskFull) as e:
        tr.fit()
    msg = str(e.value)
    assert msg.startswith("no space left on device while writing ") and "trainer_state.pt" in msg
    assert "step_000001" in msg and "trainer.resume=true" in msg
    ckpts = tmp_path / "checkpoints"
    assert (ckpts / "latest").read_text().strip() == "step_000001"
    assert sorted(p.name for p in ckpts.iterdir() if p.name.startswith(".")) == []  # the partial copy is gone
    monkeypatch.setattr(torch, "save", real_save)
    resumed = build_trainer(micro_config(["algo=grpo", "trainer.total_training_steps=2", "trainer.save_freq=1",
                                          "trainer.resume=true"], run_dir=tmp_path), log=lambda *_: None)
    assert resumed.step == 1


def test_a_full_disk_in_safetensors_at_the_first_checkpoint_says_so(tmp_path, monkeypatch):
    """issue #47 finding 5: safetensors reports a full disk as ``SafetensorError`` (no OSError, no errno): it is
    read as a full disk too, the partial checkpoint is removed and the message says none was written."""
    import transformers.modeling_utils as mu
    from safetensors import SafetensorError

    from ragen_turn.engines.local.trainer import build_trainer

    def full(tensors, filename, *a, **k):
        Path(filename).write_bytes(b"partial")
        raise SafetensorError('Error while serializing: I/O error: No space left on device (os error 28)')

    monkeypatch.setattr(mu, "safe_save_file", full)
    tr = build_trainer(micro_config(["algo=grpo", "trainer.total_training_steps=1", "trainer.save_freq=1"],
                                    run_dir=tmp_path), log=lambda *_: None)
    with pytest.raises(DiskFull) as e:
        tr.fit()
    msg = str(e.value)
    assert msg.startswith("no space left on device while writing ") and "actor" in msg, msg
    assert "SafetensorError" in msg and "No checkpoint was written" in msg, msg
    assert not list((tmp_path / "checkpoints").iterdir())  # the partial copy is gone


@pytest.mark.parametrize("err", [OSError(errno.EDQUOT, "Disk quota exceeded"),
                                 RuntimeError("ray.exceptions.RayTaskError(OSError): ... [Errno 28] No space left "
                                              "on device: '/run/global_step_3/actor/model.pt'")])
def test_a_full_disk_from_any_writer_is_a_disk_full(tmp_path, err):
    from ragen_turn.engines.rundir import writing

    with pytest.raises(DiskFull, match="no space left on device while writing"):
        with writing(tmp_path / "x"):
            raise err
    try:  # also when the words are only in the cause (an error wrapping another)
        raise ValueError("save failed") from err
    except ValueError as wrapped:
        with pytest.raises(DiskFull):
            with writing(tmp_path / "x"):
                raise wrapped


def test_a_full_disk_while_logging_metrics_says_so(tmp_path, monkeypatch):
    from ragen_turn.engines import runlog

    class Full:
        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

        def write(self, s):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(runlog, "open", lambda *a, **k: Full(), raising=False)
    with pytest.raises(DiskFull, match=f"no space left on device while writing {tmp_path / 'metrics.jsonl'}"):
        runlog.append_metrics(tmp_path / "metrics.jsonl", {"step": 1})


def test_other_write_errors_are_not_called_a_full_disk(tmp_path):
    from ragen_turn.engines.rundir import writing

    with pytest.raises(PermissionError):
        with writing(tmp_path / "x"):
            raise PermissionError(errno.EACCES, "Permission denied")


# ------------------------------------------------------------------------------------------------ resume config
def test_a_resume_that_trains_something_else_is_refused_naming_the_keys(tmp_path):
    """issue #47 finding 7: a grpo resume into a turn_ppo run used to exit 0, mixing both in metrics.jsonl and
    overwriting config.yaml. Now refused naming the keys (before any work); trainer.overwrite=true lets it, and
    configs.jsonl keeps one entry per start or resume (config.yaml is the latest)."""
    from ragen_turn.engines.local.trainer import build_trainer

    common = ["trainer.save_freq=1", "trainer.test_freq=0", "trainer.val_before_train=false"]
    build_trainer(micro_config(common + ["algo=turn_ppo", "trainer.total_training_steps=1"], run_dir=tmp_path),
                  log=lambda *_: None).fit()
    resume = common + ["algo=grpo", "trainer.total_training_steps=2", "trainer.resume=true", "seed=3"]
    with pytest.raises(ValueError) as e:
        build_trainer(micro_config(resume, run_dir=tmp_path), log=lambda *_: None)
    msg = str(e.value)
    assert "algo.name: turn_ppo -> grpo" in msg and "seed: 0 -> 3" in msg and "trainer.overwrite=true" in msg, msg
    assert "algorithm.adv_estimator: turn_gae -> grpo" in msg and str(tmp_path / "config.yaml") in msg
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1]  # nothing was touched
    # the same through the train command: exit 2, one line, before any work
    lock_run_dir(tmp_path).release()  # this process's trainers held it
    p = subprocess.run([sys.executable, "-m", "ragen_turn.train", "env=sokoban", "algo=grpo", "model=tiny",
                        f"trainer.default_local_dir={tmp_path}", "trainer.resume=true"],
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 2 and "error: trainer.resume=true: this config trains something else" in p.stderr, \
        p.stderr[-2000:]
    build_trainer(micro_config(resume + ["trainer.overwrite=true"], run_dir=tmp_path), log=lambda *_: None).fit()
    history = [json.loads(x) for x in (tmp_path / "configs.jsonl").read_text().splitlines()]
    assert [(h["step"], h["config"]["algo"]["name"]) for h in history] == [(0, "turn_ppo"), (1, "grpo")]
    assert "name: grpo" in (tmp_path / "config.yaml").read_text()


def test_a_context_too_small_for_any_first_turn_is_refused_before_the_warm_start(tmp_path, monkeypatch):
    """issue #47 finding 8: agent_proxy.max_context_tokens=16 was refused only after 28 s, at the first rollout,
    after a warm-start build had started. The check needs the tokenizer: it runs right after it loads."""
    from ragen_turn.engines.local.trainer import build_trainer

    import ragen_turn.warmstart as ws

    def reached(*a, **k):
        raise AssertionError("the warm start began before the context check")

    monkeypatch.setattr(ws, "warmstart", reached)
    monkeypatch.setattr(ws, "warmstart_dir", reached)
    with pytest.raises(ValueError, match=r"agent_proxy.max_context_tokens=16: too small for any first turn") as e:
        build_trainer(micro_config(["agent_proxy.max_context_tokens=16", "model.warmstart.enable=true"],
                                   run_dir=tmp_path / "run"), log=lambda *_: None)
    assert "response_length=8" in str(e.value)


# ------------------------------------------------------------------------------------------------ named faults
def _train_cli(tmp_path, *args, env=None):
    run_dir = tmp_path / "run"
    return subprocess.run([sys.executable, "-m", "ragen_turn.train", *args, f"trainer.default_local_dir={run_dir}"],
                          capture_output=True, text=True, timeout=180, env={**os.environ, **(env or {})},
                          cwd=str(Path(__file__).resolve().parent.parent)), run_dir


@pytest.mark.parametrize("body,said", [
    ("x = 1\ndef broken(:\n    pass\n", "has a syntax error: invalid syntax ({file}, line 2"),
    ("import json\nraise RuntimeError('no licence key')\n",
     "failed while being imported: RuntimeError: no licence key ({file}, line 2)"),
    ("import no_such_dependency_xyz\n", "failed while being imported: ModuleNotFoundError: No module named "
                                        "'no_such_dependency_xyz' ({file}, line 1)"),
])
def test_an_env_module_that_fails_on_import_is_one_error_line(tmp_path, body, said):
    """issue #47 finding 5: an env_module that raises on import or has a SyntaxError used to end with rc 1 and
    a traceback (only ModuleNotFoundError of the module itself was caught): one `error:` line naming the module,
    the error and where, exit code 2, nothing left behind."""
    mod = tmp_path / "mods" / "broken_env_mod.py"
    mod.parent.mkdir()
    mod.write_text(body)
    p, run_dir = _train_cli(tmp_path, "env=sokoban", "algo=grpo", "env_module=broken_env_mod",
                            env={"PYTHONPATH": str(mod.parent)})
    assert p.returncode == 2, p.stderr[-2000:]
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: env_module='broken_env_mod' "), p.stderr
    assert said.format(file=mod) in lines[0], lines[0]
    assert not run_dir.exists()


def test_a_malformed_config_yaml_is_one_error_line_with_file_line_and_column(tmp_path):
    """issue #47 finding 5: a malformed config/**/*.yaml used to stop with Hydra's 95-line traceback."""
    import shutil

    conf = tmp_path / "config"
    shutil.copytree(Path(__file__).resolve().parent.parent / "config", conf)
    bad = conf / "algo" / "grpo.yaml"
    n = len(bad.read_text().splitlines())
    bad.write_text(bad.read_text() + "foo: [1, 2\nbar: 3\n")
    p, run_dir = _train_cli(tmp_path, "--config-path", str(conf), "env=sokoban", "algo=grpo")
    assert p.returncode == 2, p.stderr[-2000:]
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith(f"error: {bad}, line {n + 2}, column 4: malformed YAML"), lines[0]
    assert "expected ',' or ']'" in lines[0] and not run_dir.exists()


# ------------------------------------------------------------------------------------------------ metrics log
def test_a_torn_last_line_is_dropped_on_resume_with_a_warning_naming_the_file(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "env/reward": 0.5 * s} for s in range(4)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 4, "env/rew')  # killed mid-write
    said = []
    truncate_metrics(path, 2, log=said.append)
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [0, 1, 2]
    assert len(said) == 1 and str(path) in said[0] and "torn last line 5" in said[0]


def test_a_bad_line_before_the_last_is_an_error_naming_file_and_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\n{"step": 1\n{"step": 2}\n')
    with pytest.raises(ValueError, match=rf"{path} line 2 is not a JSON object"):
        read_metrics(path)


def test_resume_of_a_run_with_a_torn_metrics_line(tmp_path):
    from ragen_turn.engines.local.trainer import build_trainer

    common = ["algo=grpo", "trainer.total_training_steps=1", "trainer.save_freq=1"]
    build_trainer(micro_config(common, run_dir=tmp_path), log=lambda *_: None).fit()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 2, "env/succ')
    said = []
    tr = build_trainer(micro_config(["algo=grpo", "trainer.total_training_steps=2", "trainer.resume=true"],
                                    run_dir=tmp_path), log=said.append)
    assert tr.step == 1 and any("torn last line" in s and "metrics.jsonl" in s for s in said)
    tr.fit()
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0, 1, 2]


# ------------------------------------------------------------------------------------------------ env seeds
@pytest.mark.parametrize("env", ["sokoban", "webshop"])
def test_env_reset_takes_int_seeds_only(env, tmp_path):
    from ragen_turn.envs import make_env
    from ragen_turn.envs.webshop.search import clear_search_cache

    e = make_env(env, {"cache_dir": str(tmp_path)} if env == "webshop" else None)
    clear_search_cache()  # leave no search engine in this process's cache for other tests
    first = e.reset(seed=3)
    assert e.reset(seed=np.int64(3)) == first and e.reset(seed=np.uint16(3)) == first
    for bad in (1.5, 3.0, True, "3", np.float32(3)):
        with pytest.raises(TypeError, match=r"reset\(seed=.*\): seed must be an int"):
            e.reset(seed=bad)
