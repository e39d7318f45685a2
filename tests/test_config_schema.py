"""The typed config schema (ragen_turn/schema.py) and the train command's checks before any work.

- every shipped config (each file of config/env, algo, model, engine, paper, sweep) composes against the schema
  and passes the checks;
- every bad command line of tests/bad_configs.py stops through the train command's own Hydra app with exit code 2,
  naming the key, before any model is loaded or warm start run, leaving no run directory behind; a few run as
  real subprocesses (the command line a user types), timed;
- the schema's rules themselves: each rule kind fails on a bad value and passes a good one; unknown keys,
  missing values and non-finite floats are named.
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra.core.global_hydra import GlobalHydra

from bad_configs import CASES
from ragen_turn import schema
from ragen_turn.config import validate_config
from ragen_turn.schema import ConfigError, Rule, check_schema
from ragen_turn.compose import CONFIG_DIR, compose_config

ROOT = Path(__file__).resolve().parent.parent
CONFIG = Path(CONFIG_DIR)
MODEL_DIR = ROOT / "config"  # an existing directory standing in for a checkpoint (configs are only composed here)


# ------------------------------------------------------------------------------------------------ shipped configs
def _group_overrides(group: str, name: str) -> list:
    """The command line that picks config file ``group/name`` (plus what it needs: a model path)."""
    extra = [f"model.path={MODEL_DIR}"]
    if group == "paper" and name.startswith("stppo"):  # the user's data paths: the shipped search-QA files
        data = ROOT / "envs" / "search_qa" / "data"
        extra += [f"paper_data.corpus_path={data / 'corpus.jsonl.gz'}",
                  f"paper_data.train_path={data / 'train.jsonl.gz'}",
                  f"paper_data.val_path={data / 'val.jsonl.gz'}"]
    if group in ("paper", "sweep", "setting"):
        return [f"+{group}={name}", *extra]
    if group == "sweep/batch_shape":
        return ["+sweep=batch_design", f"+sweep/batch_shape={name}", *extra]
    if group == "model" and name in ("tiny", "smollm2-135m"):
        extra = []
    return [f"{group}={name}", *extra]


# ragen/envs.yaml is data (RAGEN's env entries, read by ragen_keys.add_ragen_env_entries), not a config choice
SHIPPED = sorted((p.parent.relative_to(CONFIG).as_posix(), p.stem) for p in CONFIG.glob("*/**/*.yaml")
                 if not p.stem.endswith("_common") and p.relative_to(CONFIG).as_posix() != "ragen/envs.yaml")


def test_the_list_of_shipped_configs_is_complete():
    groups = {g for g, _ in SHIPPED}
    assert {"env", "algo", "model", "engine", "paper", "sweep", "sweep/batch_shape"} <= groups, groups
    assert len(SHIPPED) >= 30


@pytest.mark.parametrize("group,name", SHIPPED, ids=[f"{g}/{n}" for g, n in SHIPPED])
def test_every_shipped_config_composes_against_the_schema(group, name):
    cfg = compose_config(_group_overrides(group, name) + ["device=cpu"])
    validate_config(cfg)


@pytest.mark.parametrize("env", sorted(p.stem for p in (CONFIG / "env").glob("*.yaml")))
@pytest.mark.parametrize("algo", sorted(p.stem for p in (CONFIG / "algo").glob("*.yaml")))
def test_every_env_algo_pair_passes_the_checks(env, algo):
    validate_config(compose_config([f"env={env}", f"algo={algo}", "device=cpu"]))


# ------------------------------------------------------------------------------------------------ the train command
@pytest.fixture
def train_command(monkeypatch, tmp_path, capsys):
    """``bash train.sh sokoban turn_ppo <overrides>`` (a paper's: ``python -m ragen_turn.train +paper=...``) in
    this process: the real Hydra app of ragen_turn.train
    (its callbacks, exit codes and messages), with model loading and the warm start replaced by a tripwire."""
    import ragen_turn.engines.local.trainer as local_trainer
    import ragen_turn.warmstart as ws
    from ragen_turn import train

    expensive = []

    def tripwire(*a, **k):
        expensive.append(a)
        raise AssertionError("expensive work started")

    monkeypatch.setattr(local_trainer, "load_model_and_tokenizer", tripwire)
    monkeypatch.setattr(ws, "warmstart", tripwire)
    run_dir = tmp_path / "run"
    for name in ("", "hydra"):  # Hydra configures logging as it composes: put it back afterwards
        log = logging.getLogger(name)
        monkeypatch.setattr(log, "handlers", list(log.handlers))
        monkeypatch.setattr(log, "level", log.level)

    def run(overrides):
        # a paper's config picks its own env and algo (its documented command: python -m ragen_turn.train +paper=...)
        pick = [] if any(o.startswith("+paper=") for o in overrides) else ["env=sokoban", "algo=turn_ppo"]
        monkeypatch.setattr(sys, "argv", ["ragen_turn.train", *pick,
                                          f"trainer.default_local_dir={run_dir}", *overrides])
        GlobalHydra.instance().clear()
        t = time.perf_counter()
        try:
            with pytest.raises(SystemExit) as e:
                train.cli()
        finally:
            GlobalHydra.instance().clear()
        return e.value.code, capsys.readouterr().err, time.perf_counter() - t, run_dir, expensive

    return run


def test_train_command_runs_the_config_pipeline_once(train_command, monkeypatch):
    """``compose.finalize`` runs once a command: in the preflight callback, whose finalized config the task
    function then trains with (here up to the model load, the tripwire)."""
    import ragen_turn.compose as compose

    calls = []
    real = compose.finalize

    def counting(cfg, *a, **k):
        calls.append(1)
        return real(cfg, *a, **k)

    monkeypatch.setattr(compose, "finalize", counting)
    code, err, _, _, expensive = train_command(["trainer.total_training_steps=1", "model.warmstart.enable=false"])
    assert expensive, err  # the config passed every check and reached the model load
    assert len(calls) == 1, len(calls)


@pytest.mark.parametrize("overrides,key", CASES, ids=[" ".join(o) for o, _ in CASES])
def test_bad_command_line_stops_before_work_naming_the_key(train_command, overrides, key):
    code, err, seconds, run_dir, expensive = train_command(overrides)
    assert code == 2, err
    assert key in err, err
    assert not expensive, "a model was loaded or a warm start began"
    assert not run_dir.exists(), f"{run_dir} was left behind"


def test_the_issue_cases_are_all_there():
    """Issue #18 item 4-5, 8: each bad value it lists is a case (and 30 cases in all, at least)."""
    text = " ".join(" ".join(o) for o, _ in CASES)
    for bad in ("temperature=-1", "clip_ratio_low=-0.2", "format_penalty=abc", "format_penalty=-inf",
                "optim.lr=-1", "top_p=0", "critic.optim.lr=abc", "save_freq=-1", "ppo_epochs=abc",
                "total_training_steps=abc", "seed=abc", "dtype=float64", "default_local_dir=/sys"):
        assert bad in text, bad
    assert len(CASES) >= 30


def test_a_good_command_line_passes_the_checks_and_reaches_the_model(train_command):
    """The tripwire is reached by a good config: the checks above stop early because of the bad value only."""
    code, err, _, run_dir, expensive = train_command(["trainer.total_training_steps=1"])
    assert expensive and run_dir.is_dir(), err


def test_a_run_dir_that_holds_a_run_is_refused_unless_resume_or_overwrite(train_command):
    code, err, _, run_dir, expensive = train_command([])
    assert expensive  # reached the model: the run dir is taken
    (run_dir / "metrics.jsonl").write_text('{"step": 0}\n')
    expensive.clear()
    code, err, _, _, expensive = train_command([])
    assert code == 2 and "already holds a run" in err and "trainer.resume=true" in err and not expensive


@pytest.mark.parametrize("overrides,key", [
    (["ppo_epochs=abc"], "ppo_epochs"),                                       # Hydra refuses the type
    (["+algorithm.gama=0.9"], "algorithm.gama"),                              # the schema refuses the key
    (["actor_rollout_ref.rollout.temperature=-1"], "actor_rollout_ref.rollout.temperature"),  # a rule
    (["trainer.default_local_dir=/sys/ragen_turn_run"], "trainer.default_local_dir"),         # not writable
])
def test_the_real_command_line_exits_2_in_seconds(tmp_path, overrides, key):
    run_dir = tmp_path / "run"
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "ragen_turn.train", "env=sokoban", "algo=turn_ppo",
                        f"trainer.default_local_dir={run_dir}", *overrides], cwd=ROOT, capture_output=True,
                       text=True, timeout=120, env={**os.environ, "RAGEN_TURN_CACHE_DIR": str(tmp_path / "cache")})
    seconds = time.perf_counter() - t
    assert p.returncode == 2, p.stderr
    assert key in p.stderr and "[warmstart]" not in p.stdout + p.stderr
    assert not run_dir.exists() and not (tmp_path / "cache").exists()
    assert seconds < 60, seconds  # about 1-4 s alone on 2 CPU cores (docs/reliability.md); warm starts take minutes


# ------------------------------------------------------------------------------------------------ the rules
@pytest.mark.parametrize("rule,good,bad,says", [
    (Rule(gt=0), 1e-9, 0, "> 0"),
    (Rule(ge=0), 0, -1, ">= 0"),
    (Rule(gt=0, le=1), 1.0, 0.0, "in (0, 1]"),
    (Rule(ge=0, lt=1), 0.999, 1.0, "in [0, 1)"),
    (Rule(choices=("a", "b")), "a", "c", "one of ['a', 'b']"),
    (Rule(choices=lambda: ["x"]), "x", "y", "one of ['x']"),
    (Rule(pattern=r"cuda(:\d+)?"), "cuda:1", "cuda:x", "must match"),
    (Rule(nonempty=True), ["a"], [], "not be empty"),
    (Rule(length=2), [1, 2], [1], "2 elements"),
    (Rule(each=Rule(ge=1)), [1, 2], [1, 0], "element 1"),
    (Rule(exists=True), "/", "/nonexistent/x", "existing path"),
])
def test_each_rule_kind_passes_good_values_and_names_the_broken_rule(rule, good, bad, says):
    assert rule.broken(good) is None
    assert says in rule.broken(bad)


def test_registry_choices_are_read_last():
    """Choices from a registry import torch: a first pass without them reports the other problems."""
    calls = []
    rule = Rule(choices=lambda: calls.append(1) or ["a"])
    assert rule.broken("b", registries=False) is None and not calls
    assert rule.broken("b") and calls


def test_schema_names_unknown_keys_with_a_suggestion_and_missing_values():
    cfg = compose_config(["device=cpu"])
    from omegaconf import OmegaConf

    OmegaConf.update(cfg, "algorithm.gama", 0.9, force_add=True)  # what Hydra does with +algorithm.gama=0.9
    OmegaConf.update(cfg, "trainer.save_frequency", 3, force_add=True)
    with pytest.raises(ConfigError) as e:
        check_schema(cfg)
    assert "algorithm.gama: unknown key" in str(e.value) and "did you mean algorithm.gamma" in str(e.value)
    assert "trainer.save_frequency" in str(e.value) and "did you mean trainer.save_freq" in str(e.value)
    missing = compose_config(["model=hf"])
    assert OmegaConf.is_missing(missing.model, "path")  # the schema keeps the yaml's ??? (nothing swallows it)
    with pytest.raises(ConfigError, match=r"model.path: must be set"):
        check_schema(missing)


def test_schema_checks_plain_configs_too():
    """verl's mapping and report --list-jobs check a plain (untyped) copy: the same rules apply."""
    from omegaconf import OmegaConf

    plain = OmegaConf.create(OmegaConf.to_container(compose_config(["device=cpu"]), resolve=True))
    check_schema(plain)
    plain.ppo_epochs = "abc"
    with pytest.raises(ConfigError, match="ppo_epochs"):
        check_schema(plain)
    plain.ppo_epochs = 1
    plain.actor_rollout_ref.actor.optim.lr = float("nan")
    with pytest.raises(ConfigError, match=r"actor_rollout_ref.actor.optim.lr=nan: must be a finite number"):
        check_schema(plain)


def test_every_problem_is_listed_at_once():
    cfg = compose_config(["device=cpu", "actor_rollout_ref.actor.optim.lr=-1", "algorithm.lam=2",
                          "trainer.save_freq=-1"])
    with pytest.raises(ConfigError) as e:
        validate_config(cfg)
    assert len(e.value.problems) == 3 and "3 config problems" in str(e.value)


def test_the_schema_is_registered_for_compose():
    """config/base.yaml names the schema first: a typed value is converted as Hydra composes."""
    cfg = compose_config(["actor_rollout_ref.actor.optim.lr=1", "device=cpu"])
    assert isinstance(cfg.actor_rollout_ref.actor.optim.lr, float)
    assert schema.SCHEMA_NAME in (CONFIG / "base.yaml").read_text()


@pytest.mark.parametrize("words,says", [
    (["sokban", "turn_ppo"], "env=sokban: no config/env/sokban.yaml (nor an env registered by env_module=); "
                             "did you mean env=sokoban?"),
    (["sokoban", "turnppo"], "algo=turnppo: no config/algo/turnppo.yaml; did you mean algo=turn_ppo?"),
    (["sokoban", "turn_ppo", "algorithm.gama=0.9"],
     "algorithm.gama: unknown key (the schema, ragen_turn/schema.py, has no such key); "
     "did you mean algorithm.gamma?"),
    (["sokoban", "grpo,turnppo", "--multirun"], "did you mean algo=turn_ppo?"),
])
def test_train_sh_names_the_closest_key_or_choice(words, says, tmp_path):
    """A newcomer's typos in train.sh's env / algo / a key: one 'did you mean' with the right fix (never
    Hydra's 'Could not find' list or its 'To append to your config use +...')."""
    res = subprocess.run(["bash", "train.sh", *words, f"trainer.default_local_dir={tmp_path / 'run'}"],
                         cwd=Path(CONFIG_DIR).parent, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and says in res.stderr, res.stderr[-800:]
    assert "Could not" not in res.stderr and "To append" not in res.stderr and not (tmp_path / "run").exists()


def test_config_choices_are_checked_with_the_same_suggestion():
    from ragen_turn.compose import check_group_choices

    with pytest.raises(ValueError, match=r"model=tinny: no config/model/tinny.yaml; did you mean model=tiny"):
        compose_config(["model=tinny"])
    with pytest.raises(ValueError, match=r"sweep=gama_lambda.*did you mean sweep=gamma_lambda\?"):
        compose_config(["+sweep=gama_lambda"])
    with pytest.raises(ValueError) as e:  # nothing close: no guess, the choices
        check_group_choices(["env=zzzzzz"])
    listed = str(e.value).split("env choices: ", 1)[1].rstrip(")").split(", ")
    assert "did you mean" not in str(e.value) and listed == sorted(listed)  # registered envs too (other test
    assert {p.stem for p in (CONFIG / "env").glob("*.yaml")} <= set(listed)  # modules may have registered some)
    check_group_choices(["env=sokoban,bandit", "algo=choice(grpo,turn_ppo)",
                         "+paper=turnppo_webshop_qwen2.5-3b"])
