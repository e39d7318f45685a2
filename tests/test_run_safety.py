"""Nothing lost, nothing outside the run, nothing unverified loaded (issue #59).

- ``trainer.overwrite=true`` deletes only what a run of ours wrote, and only in a folder that is recognisably a
  run; anything else stops the command (exit 2) naming the folder and the entries, and nothing is deleted.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import micro_config
import json

from ragen_turn.engines import checkpoints as ckpt
from ragen_turn.engines.rundir import check_overwritable, clear_earlier_run, take_run_dir

ROOT = Path(__file__).resolve().parent.parent


def _train(*args, env=None, timeout=180):
    return subprocess.run([sys.executable, "-m", "ragen_turn.train", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=str(ROOT), env={**os.environ, **(env or {})})


def _tree(d: Path):
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


# ------------------------------------------------------------------------------------------------ overwrite
def test_overwrite_into_a_folder_that_is_no_run_deletes_nothing_and_names_it(tmp_path):
    """The issue's case: ``mkdir -p D/sub; echo x > D/f``, then overwrite=true used to print "deleted the previous
    run in D (sub, f)"."""
    d = tmp_path / "D"
    (d / "sub").mkdir(parents=True)
    (d / "f").write_text("x\n")
    before = _tree(d)
    with pytest.raises(ValueError) as e:
        take_run_dir(micro_config(["trainer.overwrite=true"], run_dir=str(d)), log=lambda *_: None)
    msg = str(e.value)
    assert str(d) in msg and "not a run directory" in msg and "sub" in msg and "f" in msg, msg
    assert "nothing was deleted" in msg
    assert [x for x in _tree(d) if x != "run.lock"] == before and (d / "f").read_text() == "x\n"


def test_overwrite_of_a_run_that_also_holds_a_users_files_deletes_nothing_and_names_them(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints" / "step_000002" / "actor").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 0}\n')
    (run / "config.yaml").write_text("seed: 0\n")
    (run / "notes.txt").write_text("mine")
    (run / "checkpoints" / "best_model").mkdir()
    before = _tree(run)
    with pytest.raises(ValueError) as e:
        clear_earlier_run(run, log=lambda *_: None)
    msg = str(e.value)
    assert "notes.txt" in msg and "checkpoints/best_model" in msg and str(run) in msg and "nothing was deleted" in msg
    assert "metrics.jsonl" not in msg.split("holds what no run writes")[1]  # ours are not called foreign
    assert _tree(run) == before
    (run / "notes.txt").unlink()
    (run / "checkpoints" / "best_model").rmdir()
    assert [p.name for p in check_overwritable(run)] == ["checkpoints", "config.yaml", "metrics.jsonl"]


def test_overwrite_deletes_every_file_a_run_of_ours_writes(tmp_path):
    """Both engines' files, eval.sh's, the report's, wandb's, temp files of atomic writes: a run's own."""
    run = tmp_path / "run"
    run.mkdir()
    for name in ("metrics.jsonl", "config.yaml", "configs.jsonl", "provenance.json", "val_generations.jsonl",
                 "error.log", "eval_sokoban.json", "latest_checkpointed_iteration.txt", ".metrics.jsonl.tmp-123"):
        (run / name).write_text("x")
    for name in ("global_step_3", ".tmp_global_step_4", "wandb", "report", "eval", "hydra",
                 "checkpoints/step_000001", "checkpoints/.tmp_step_000002"):
        (run / name).mkdir(parents=True)
    (run / "checkpoints" / "latest").write_text("step_000001\n")
    said = []
    clear_earlier_run(run, log=said.append)
    assert [p.name for p in run.iterdir()] == ["hydra"] and "deleted the previous run" in said[0]


def test_overwrite_into_a_users_folder_through_the_command_is_exit_2_before_any_work(tmp_path):
    d = tmp_path / "D"
    (d / "sub").mkdir(parents=True)
    (d / "f").write_text("x\n")
    p = _train("env=sokoban", "algo=turn_ppo", "model=tiny", f"trainer.default_local_dir={d}",
               "trainer.overwrite=true", env={"RAGEN_TURN_CACHE_DIR": str(tmp_path / "cache")})
    assert p.returncode == 2, p.stderr[-2000:]
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: trainer.overwrite=true") and str(d) in lines[0], p.stderr
    assert sorted(x.name for x in d.iterdir()) == ["f", "sub"] and not (tmp_path / "cache").exists()


# ------------------------------------------------------------------------------------------ unverified checkpoints
def _fake_checkpoint(ckpts: Path, step: int) -> Path:
    """A complete step dir made by the real staging + commit (files are stand-ins)."""
    tmp = ckpt.begin(ckpts, step)
    (tmp / "actor").mkdir()
    (tmp / "actor" / "config.json").write_text("{}")
    (tmp / "actor" / "model.safetensors").write_bytes(bytes(range(256)))
    (tmp / "trainer_state.pt").write_bytes(b"x" * (100 + step))
    return ckpt.commit(tmp, step)


def test_a_checkpoint_without_complete_json_is_refused_naming_it_the_verified_one_and_the_key(tmp_path):
    """The issue's case: complete.json deleted and a weight byte flipped; the resume used to load it as an
    older-format checkpoint and train on the corrupt weights."""
    ckpts = tmp_path / "checkpoints"
    for s in (1, 2):
        _fake_checkpoint(ckpts, s)
    step2 = ckpts / "step_000002"
    (step2 / ckpt.MANIFEST).unlink()
    w = step2 / "actor" / "model.safetensors"
    w.write_bytes(bytes([w.read_bytes()[0] ^ 1]) + w.read_bytes()[1:])
    ckpt.clean(ckpts, log=lambda *_: None)
    assert step2.is_dir()  # kept: not ours to delete, only not to load
    for call in (lambda: ckpt.resume_point(ckpts, log=lambda *_: None),
                 lambda: ckpt.find(ckpts, "step_000002", verify=True),
                 lambda: ckpt.check_resume_target(ckpts)):
        with pytest.raises(ckpt.UnverifiedCheckpoint) as e:
            call()
        msg = str(e.value)
        assert str(step2) in msg and "no complete.json" in msg and "step_000001" in msg, msg
        assert "trainer.load_unverified=true" in msg and "trainer.resume_from=step_000001" in msg, msg
    said = []
    assert ckpt.resume_point(ckpts, log=said.append, allow_unverified=True) == step2
    assert "loading it anyway (trainer.load_unverified=true)" in said[0]
    assert ckpt.find(ckpts, "step_000001", verify=True).name == "step_000001"  # the verified one still loads
    with pytest.raises(ckpt.UnverifiedCheckpoint, match="unpickles"):
        ckpt.check_resume_target(ckpts, engine="verl")


def test_a_manifest_entry_outside_its_checkpoint_or_an_unlisted_file_is_not_loadable(tmp_path):
    ckpts = tmp_path / "checkpoints"
    for s in (1, 2):
        _fake_checkpoint(ckpts, s)
    step2 = ckpts / "step_000002"
    manifest = step2 / ckpt.MANIFEST
    good = manifest.read_text()
    outside = tmp_path / "outside.txt"
    outside.write_text("host\n")
    for rel in ("../../../etc/hostname", str(outside), "../../outside.txt"):
        doc = json.loads(good)
        doc["files"][rel] = 5
        doc["sha256"][rel] = "0" * 64
        manifest.write_text(json.dumps(doc))
        assert f"lists {rel!r}, outside the checkpoint" in ckpt.incomplete_reason(step2, verify=True)
        said = []
        assert ckpt.resume_point(ckpts, log=said.append).name == "step_000001", said
        assert "outside the checkpoint" in said[0]
    manifest.write_text(good)
    (step2 / "actor" / "evil.pt").write_bytes(b"planted")
    assert "actor/evil.pt is not listed in complete.json" in ckpt.incomplete_reason(step2, verify=True)
    (step2 / "actor" / "evil.pt").unlink()
    (step2 / "actor" / "link").symlink_to(outside)
    assert "actor/link is not listed" in ckpt.incomplete_reason(step2, verify=True)


# ------------------------------------------------------------------------------------------------ resume identity
@pytest.fixture(scope="module")
def turn_ppo_run(tmp_path_factory):
    """A finished 1-step turn_ppo run of the micro model, with its checkpoint."""
    from ragen_turn.engines.local.trainer import build_trainer
    from ragen_turn.engines.rundir import lock_run_dir

    run = tmp_path_factory.mktemp("identity") / "run"
    build_trainer(micro_config(["algo=turn_ppo", "trainer.total_training_steps=1", "trainer.save_freq=1",
                                "trainer.test_freq=0", "trainer.val_before_train=false"], run_dir=run),
                  log=lambda *_: None).fit()
    lock_run_dir(run).release()
    return run


def _copy_run(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_the_resume_identity_is_read_from_every_record_the_run_keeps(turn_ppo_run, tmp_path):
    """The issue's case: config.yaml deleted, a grpo resume trained on top of the turn_ppo run (configs.jsonl,
    which holds the same facts, was not read). Each record alone refuses it; none left refuses it too."""
    from ragen_turn.engines.rundir import check_run_dir

    run = _copy_run(turn_ppo_run, tmp_path / "run")
    entry = json.loads((run / "provenance.json").read_text())[-1]
    assert entry["identity"]["algo.name"] == "turn_ppo" and entry["torch_threads"] >= 1 and entry["cpu"]
    grpo = micro_config(["algo=grpo", "trainer.resume=true", "trainer.total_training_steps=2"], run_dir=run)
    for gone, said in (("config.yaml", "configs.jsonl (its last line)"), ("configs.jsonl", "provenance.json")):
        (run / gone).unlink()
        with pytest.raises(ValueError) as e:
            check_run_dir(grpo, log=lambda *_: None)
        assert "algo.name: turn_ppo -> grpo" in str(e.value) and said in str(e.value), str(e.value)
    (run / "provenance.json").unlink()
    with pytest.raises(ValueError) as e:
        check_run_dir(grpo, log=lambda *_: None)
    msg = str(e.value)
    assert "keeps no record of what its run trains" in msg and "config.yaml is missing" in msg, msg
    assert "configs.jsonl is missing" in msg and "provenance.json is missing" in msg, msg
    check_run_dir(micro_config(["algo=grpo", "trainer.resume=true", "trainer.overwrite=true"], run_dir=run),
                  log=lambda *_: None).release()  # overwrite lets it go on
    fresh = tmp_path / "fresh"  # a resume into a folder with no run: starts fresh, as before
    check_run_dir(micro_config(["trainer.resume=true"], run_dir=fresh), log=lambda *_: None).release()


def test_a_resume_with_another_model_size_is_refused_before_any_model_is_built(turn_ppo_run, tmp_path, monkeypatch):
    import ragen_turn.engines.local.trainer as trainer

    def built(*a, **k):
        raise AssertionError("a model was built before the resume check")

    monkeypatch.setattr(trainer, "load_model_and_tokenizer", built)
    run = _copy_run(turn_ppo_run, tmp_path / "run")
    with pytest.raises(ValueError, match=r"model.hidden_size: 32 -> 64.*model.intermediate_size: 64 -> 128"):
        trainer.build_trainer(micro_config(["algo=turn_ppo", "trainer.resume=true", "model.hidden_size=64",
                                            "model.intermediate_size=128"], run_dir=run), log=lambda *_: None)


# ------------------------------------------------------------------------------------------------ run names
@pytest.mark.parametrize("name", ["../../escaped_exp", "a/b", "..", ".", "x\\y"])
def test_a_run_name_that_leaves_runs_dir_is_refused_at_config_time(name):
    from ragen_turn.config import validate_config

    with pytest.raises(ValueError, match=r"trainer.experiment_name=.*must name one directory under trainer.runs_dir"):
        validate_config(micro_config([f"trainer.experiment_name={name}"]))


def test_the_issues_escaping_name_through_the_command_writes_nothing(tmp_path):
    runs = tmp_path / "a" / "b" / "runs"
    p = _train("env=sokoban", "algo=turn_ppo", f"trainer.runs_dir={runs}", "trainer.experiment_name=../../escaped_exp",
               env={"RAGEN_TURN_CACHE_DIR": str(tmp_path / "cache")})
    assert p.returncode == 2 and "error: trainer.experiment_name='../../escaped_exp'" in p.stderr, p.stderr[-2000:]
    assert sorted(x.name for x in tmp_path.iterdir()) == []  # nothing: not runs_dir, not two levels above it


def test_an_explicit_default_local_dir_and_a_plain_name_stay_free(tmp_path):
    from ragen_turn.config import validate_config

    validate_config(micro_config(["trainer.experiment_name=my.run_1..2"], run_dir=str(tmp_path / ".." / "elsewhere")))


# ------------------------------------------------------------------------------------------------ no pickle
class _Planted:
    """What a planted trainer_state.pt would run on an unpickling load."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (Path(self.marker), "code ran"))


def test_trainer_state_loads_without_pickle_and_a_planted_one_runs_no_code(turn_ppo_run, tmp_path):
    """The issue's case: trainer_state.pt was read with torch.load(weights_only=False), so a planted file (with a
    complete.json made to match it) ran its code on resume. Now the state holds tensors and plain types only, and
    the planted file fails to load (the resume says so), running nothing."""
    import hashlib

    import torch

    from ragen_turn.engines.local.trainer import build_trainer

    run = _copy_run(turn_ppo_run, tmp_path / "run")
    step = run / "checkpoints" / "step_000001"
    state = torch.load(step / "trainer_state.pt", weights_only=True)  # no allow-list needed
    assert state["format"] == 2 and state["step"] == 1 and isinstance(state["rng"]["numpy"]["key"], torch.Tensor)
    marker = tmp_path / "pwned"
    torch.save({"step": 1, "x": _Planted(str(marker))}, step / "trainer_state.pt")
    manifest = step / ckpt.MANIFEST
    doc = json.loads(manifest.read_text())  # a hostile copy: its checksums made to match the planted file
    doc["files"]["trainer_state.pt"] = (step / "trainer_state.pt").stat().st_size
    doc["sha256"]["trainer_state.pt"] = hashlib.sha256((step / "trainer_state.pt").read_bytes()).hexdigest()
    manifest.write_text(json.dumps(doc))
    said = []
    with pytest.raises(FileNotFoundError, match="no checkpoint in .* loads"):
        build_trainer(micro_config(["algo=turn_ppo", "trainer.resume=true", "trainer.total_training_steps=2"],
                                   run_dir=run), log=said.append)
    assert not marker.exists()
    assert any("step_000001 failed to load (UnpicklingError" in s for s in said), said


def test_a_format_1_trainer_state_loads_safely_and_restores_the_rng(tmp_path):
    """Checkpoints written before issue #59 held numpy's RNG state as an ndarray: they load with numpy's array
    reconstruction allowed and nothing else, and restore every RNG."""
    import random

    import numpy as np
    import torch

    from ragen_turn.engines.local.trainer import load_trainer_state, restore_rng_states, rng_states

    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    old = {"step": 4, "rng": {"python": random.getstate(), "numpy": np.random.get_state(),
                              "torch": torch.get_rng_state()}}
    want = (random.random(), np.random.rand(), torch.rand(1).item())
    torch.save(old, tmp_path / "old.pt")
    with pytest.raises(Exception, match="Weights only load failed"):
        torch.load(tmp_path / "old.pt", weights_only=True)
    restore_rng_states(load_trainer_state(tmp_path / "old.pt")["rng"])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == want
    random.seed(5), np.random.seed(6), torch.manual_seed(7)
    torch.save({"rng": rng_states()}, tmp_path / "new.pt")
    want = (random.random(), np.random.rand(), np.random.randn(), torch.rand(1).item())
    restore_rng_states(torch.load(tmp_path / "new.pt", weights_only=True)["rng"])
    assert (random.random(), np.random.rand(), np.random.randn(), torch.rand(1).item()) == want


# ------------------------------------------------------------------------------------------------ advice that works
def test_the_command_a_dead_worker_message_proposes_runs_and_resumes(tmp_path, monkeypatch):
    """The issue's case: after a worker died before the first checkpoint, the verl engine said "start it again",
    and the same command exits 2 ("already holds a run"). The message's command (engines.verl.run_failure, shared
    with any engine: it only names the run dir and resume) now runs: it starts over when no checkpoint was
    written, and continues from the newest one otherwise."""
    import shlex

    from ragen_turn.engines.rundir import RunAborted
    from ragen_turn.engines.verl import run_failure
    from helpers import MICRO_MODEL

    run = tmp_path / "run"
    args = ["env=sokoban", "algo=grpo", "model=tiny", *MICRO_MODEL, "es_manager.train.env_groups=2",
            "es_manager.train.group_size=2", "es_manager.val.env_groups=2", "agent_proxy.max_turn=2",
            "actor_rollout_ref.rollout.response_length=8", "ppo_mini_batch_size=2", "micro_batch_size_per_gpu=2",
            "trainer.total_training_steps=1", "trainer.test_freq=0", "device=cpu", f"trainer.default_local_dir={run}"]
    first = _train(*args)
    assert first.returncode == 0, first.stderr[-2000:]
    import shutil

    shutil.rmtree(run / "checkpoints")  # as a run whose worker died before its first checkpoint leaves it
    again = _train(*args)
    assert again.returncode == 2 and "already holds a run" in again.stderr  # "start it again" did not work

    class ActorDiedError(Exception):
        pass

    monkeypatch.setattr(sys, "argv", ["train.py", *args])
    died = ActorDiedError("The actor died unexpectedly.\n\tclass_name: WorkerDict\n\tpid: 4242")
    msg = str(run_failure(died, run))
    assert isinstance(run_failure(died, run), RunAborted) and "no checkpoint was written" in msg, msg
    command = shlex.split(msg.split("start the run over with: ", 1)[1])
    assert command[-1] == "trainer.resume=true"
    ran = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=str(tmp_path))  # any directory
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "starting fresh" in ran.stdout and (run / "checkpoints" / "step_000001").is_dir(), ran.stdout[-2000:]
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1], steps


# ------------------------------------------------------------------------------------------------ checks first
@pytest.mark.parametrize("args,said", [
    (["env=sokoban", "algo=turn_ppo", "actor_rollout_ref.rollout.response_length=1000000000"],
     "error: actor_rollout_ref.rollout.response_length=1000000000: must be"),
    (["env=sokoban", "algo=turn_ppo", "trainer.total_training_steps=99999999999999999999"],
     "error: trainer.total_training_steps=99999999999999999999: must be in [0, 10000000]"),
    (["env=", "algo=turn_ppo"], "error: env=: names no config (env choices: bandit"),
    (["env=sokoban", "algo=turn_ppo", "env_module="], "error: env_module='': names no module"),
    (["env=sokoban", "algo=turn_ppo", "env_module=''"], "error: env_module='': names no module"),
])
def test_bad_values_stop_before_anything_is_copied_or_written(tmp_path, args, said):
    """The issue's cases: response_length=1e9 copied the model and warm start into the cache before its error; a
    20-digit step count trained until killed; an empty env name got Hydra's own message; env_module='' was
    silently no module."""
    run, cache = tmp_path / "run", tmp_path / "cache"
    p = _train(*args, f"trainer.default_local_dir={run}", env={"RAGEN_TURN_CACHE_DIR": str(cache)}, timeout=120)
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith(said), p.stderr[-2000:]
    assert not run.exists() and not cache.exists()


def test_train_sh_with_an_empty_env_name_is_the_projects_error_line():
    p = subprocess.run(["bash", "train.sh", "", "turn_ppo"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 2 and p.stderr.startswith("error: env=: names no config"), p.stderr[-2000:]


# ------------------------------------------------------------------------------------------------ update progress
def test_an_update_says_where_it_is_while_it_runs(monkeypatch, tmp_path):
    """The issue: the update phase printed nothing for minutes (the rollout prints a line every 30 s). Now the
    update does too, between its mini-batches (every line here: the interval set to 0)."""
    import ragen_turn.engines.local.trainer as trainer

    monkeypatch.setattr(trainer, "UPDATE_PROGRESS_S", 0.0)
    said = []
    trainer.build_trainer(micro_config(["algo=turn_ppo", "trainer.total_training_steps=1", "ppo_epochs=2",
                                        "trainer.val_before_train=false"], run_dir=tmp_path), log=said.append).fit()
    lines = [s for s in said if s.startswith("[update]")]
    # 4 episodes, mini-batches of 2, 2 epochs: 4 mini-batches, a line before each but the first (critic and actor)
    assert [x.split(": ", 1)[1].split(" (")[0] for x in lines if ": actor " in x] == \
        [f"actor {i}/4 mini-batches done" for i in (1, 2, 3)], lines
    assert all(x.startswith("[update] step 1: ") and "ETA" in x for x in lines), lines
    assert "(epoch 2/2)" in lines[-1]
    first_step_line = next(i for i, s in enumerate(said) if s.lstrip().startswith("step    1/1"))
    assert said.index(lines[-1]) < first_step_line  # printed while the update runs, not at the end
