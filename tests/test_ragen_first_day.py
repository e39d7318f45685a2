"""A RAGEN user's first day (issue 60): eval.sh evaluates the run's own env groups; RAGEN's eval form
(``--config-name NAME model_path=...``) works; an ``<env>`` that is not the run's stops naming both."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ONE_STEP_RUN as TINY, micro_config, sh

ROOT = Path(__file__).resolve().parent.parent
@pytest.fixture(scope="module")
def named_runs(tmp_path_factory):
    """(name -> run dir) for a 1-step _1_bandit and _2_sokoban run."""
    out = {}
    for name in ("_1_bandit", "_2_sokoban"):
        run = tmp_path_factory.mktemp(name) / "run"
        res = sh("train.sh", "--config-name", name, *TINY, f"trainer.default_local_dir={run}")
        assert res.returncode == 0, res.stderr[-2000:]
        out[name] = (run, res.stdout)
    return out


@pytest.mark.parametrize("name,env,tag", [("_1_bandit", "bandit", "Bandit"), ("_2_sokoban", "sokoban", "CoordSokoban")])
def test_eval_sh_evaluates_the_runs_own_envs(named_runs, name, env, tag):
    run, train_out = named_runs[name]
    next_line = next(x for x in train_out.splitlines() if "next:" in x).split("next:")[1].split("#")[0].split()
    assert next_line[:3] == ["bash", "eval.sh", env]  # the line the run printed evaluates the run's env
    for args in (next_line[2:], [run]):  # with the <env> the run printed, and without one
        res = sh("eval.sh", *args)
        assert res.returncode == 0, res.stderr[-2000:]
        assert f"[eval] env={env}: held-out tags {tag} (2 episodes)" in res.stdout
        assert f"--config-name {name}" in res.stdout
        data = json.loads((run / "eval" / f"{env}_step_000001.json").read_text())
        assert data["env"] == env and data["val_tags"] == [tag] and f"val/{tag}/success" in data
        assert data["episodes"] == 2


def test_an_env_that_is_not_the_runs_stops_naming_both(named_runs):
    run, _ = named_runs["_1_bandit"]
    res = sh("eval.sh", "sokoban", run)
    assert res.returncode == 2
    assert "env=sokoban" in res.stderr and "trained on env=bandit" in res.stderr and "Bandit" in res.stderr
    assert not (run / "eval" / "sokoban_step_000001.json").exists()


def test_ragens_eval_form_with_config_name_and_model_path(named_runs, tmp_path):
    run, _ = named_runs["_2_sokoban"]
    rel = os.path.relpath(run, tmp_path)  # model_path relative to where the command is typed
    res = sh("eval.sh", "--config-name", "_2_sokoban", f"model_path={rel}", "es_manager.val.env_groups=3", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "[eval] env=sokoban: held-out tags CoordSokoban (3 episodes)" in res.stdout
    bad = sh("eval.sh", "--config-name", "_1_bandit", f"model_path={run}")
    assert bad.returncode == 2 and "--config-name _1_bandit" in bad.stderr and "_2_sokoban" in bad.stderr
    missing = sh("eval.sh", "--config-name", "_2_sokoban")
    assert missing.returncode == 2 and "model_path=" in missing.stderr
    # a model directory outside any run: the named config's envs
    hf = tmp_path / "hf"
    subprocess.run(["cp", "-r", str(run / "checkpoints" / "step_000001" / "actor"), str(hf)], check=True)
    res = sh("eval.sh", "--config-name", "_2_sokoban", f"model_path={hf}", "es_manager.val.env_groups=2",
             "agent_proxy.max_turn=1", "actor_rollout_ref.rollout.response_length=8", f"trainer.runs_dir={tmp_path}")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "held-out tags CoordSokoban (2 episodes)" in res.stdout
    assert json.loads((tmp_path / "eval_hf" / "eval_sokoban.json").read_text())["val_tags"] == ["CoordSokoban"]


# ---------------------------------------------------------------- RAGEN's and verl's keys (issue 60, part 2)
def _mapped(overrides):
    from ragen_turn.config import validate_config

    cfg = micro_config(overrides)
    validate_config(cfg)
    return cfg


ALIAS_CASES = [
    (["algo=token_ppo", "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum"],
     "actor_rollout_ref.actor.policy_loss.loss_agg_mode", "seq-mean-token-sum"),
    (["algo=turn_ppo", "actor_rollout_ref.actor.loss_agg_mode=seq-mean-turn-sum-token-norm"],
     "actor_rollout_ref.actor.policy_loss.loss_agg_mode", "seq-mean-turn-sum-token-norm"),
    (["actor_rollout_ref.rollout.n=4", "ppo_mini_batch_size=4"], "es_manager.train.group_size", 4),
    (["actor_rollout_ref.rollout.top_k=20"], "actor_rollout_ref.rollout.top_k", 20),
    (["ctx_manager.generation.gen_config.top_k=50"], "actor_rollout_ref.rollout.top_k", 50),
    (["ctx_manager.generation.gen_config.top_k=null"], "actor_rollout_ref.rollout.top_k", -1),
    (["actor_rollout_ref.model.enable_gradient_checkpointing=True"], "engine.gradient_checkpointing", True),
    (["actor_rollout_ref.model.enable_gradient_checkpointing=True", "critic.model.enable_gradient_checkpointing=True"],
     "engine.gradient_checkpointing", True),
    (["engine=verl", "actor_rollout_ref.model.enable_gradient_checkpointing=False"],
     "engine.verl.gradient_checkpointing", False),
    (["engine=verl", "actor_rollout_ref.actor.fsdp_config.param_offload=True"], "engine.verl.param_offload", True),
    (["engine=verl", "critic.model.fsdp_config.optimizer_offload=True"], "engine.verl.optimizer_offload", True),
    (["engine=verl", "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True"], "engine.verl.optimizer_offload",
     True),
    (["engine=verl", "critic.model.fsdp_config.param_offload=True"], "engine.verl.param_offload", True),
    (["actor_rollout_ref.actor.micro_batch_size_per_gpu=1"], "micro_batch_size_per_gpu", 1),
]


@pytest.mark.parametrize("overrides,key,value", ALIAS_CASES)
def test_a_key_with_our_equivalent_is_an_alias(overrides, key, value):
    from omegaconf import OmegaConf

    assert OmegaConf.select(_mapped(overrides), key) == value


UNUSED_CASES = [
    "actor_rollout_ref.rollout.tp_size_check=False", "actor_rollout_ref.rollout.n=1",
    "actor_rollout_ref.model.use_remove_padding=True", "critic.model.use_remove_padding=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False", "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "trainer.default_hdfs_dir=/hdfs/ckpts", "data.shuffle=True",
    "trainer.generations_to_log_to_wandb.train=128",
]


@pytest.mark.parametrize("override", UNUSED_CASES)
def test_keys_accepted_and_unused_are_recorded(override):
    from ragen_turn.ragen_keys import UNUSED_TAG, unused_lines

    cfg = _mapped([override])
    recorded = {k.split("=", 1)[0]: v for k, v in cfg.ragen_aliases.items()}
    assert recorded[override.split("=", 1)[0]].startswith(UNUSED_TAG)
    assert override.split("=", 1)[0] in unused_lines(cfg)[0]


STOP_CASES = [
    (["actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-max"], "actor_rollout_ref.actor.policy_loss.loss_agg_mode"),
    (["algo=turn_ppo", "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum"], "loss_agg_mode"),
    (["actor_rollout_ref.model.enable_gradient_checkpointing=True", "critic.model.enable_gradient_checkpointing=False"],
     "engine.gradient_checkpointing"),
    (["actor_rollout_ref.rollout.top_k=-3"], "actor_rollout_ref.rollout.top_k"),
    (["actor_rollout_ref.rollout.val_kwargs.top_k=20"], "actor_rollout_ref.rollout.val_temperature"),
    (["actor_rollout_ref.rollout.val_kwargs.top_p=0.9"], "actor_rollout_ref.rollout.val_temperature"),
]
# the RAGEN / verl keys this file exercises (tests/test_ragen_compat.py: every table key is tested and documented)
TESTED_KEYS = {o.split("=", 1)[0] for ovs, *_ in ALIAS_CASES + STOP_CASES for o in ovs} | \
    {o.split("=", 1)[0] for o in UNUSED_CASES}


@pytest.mark.parametrize("overrides,names", STOP_CASES)
def test_keys_without_our_meaning_stop_naming_ours(overrides, names):
    from ragen_turn.config import validate_config

    with pytest.raises(ValueError) as e:
        validate_config(micro_config(overrides))
    assert names in str(e.value) and "Could not override" not in str(e.value)


def test_top_k_sampling_keeps_the_k_most_likely_tokens():
    """A hand case: probabilities 0.4, 0.3, 0.2, 0.1 with top_k=2 sample tokens 0 and 1 only, at 4:3."""
    import torch

    from ragen_turn.engines.local.sampler import LocalSampler

    sampler = LocalSampler.__new__(LocalSampler)
    sampler.temperature, sampler.top_p, sampler.top_k = 1.0, 1.0, 2
    sampler._sample_gen = torch.Generator().manual_seed(0)
    logits = torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log().repeat(20000, 1)
    counts = torch.bincount(sampler._sample(logits), minlength=4)
    assert counts[2] == counts[3] == 0
    assert abs(counts[0] / counts.sum() - 4 / 7) < 0.02
    sampler.top_k = -1
    assert torch.bincount(sampler._sample(logits), minlength=4)[3] > 0


# ---------------------------------------------------------------- RAGEN's named configs, both commits' files and lines
# data/ragen_configs.json: RAGEN's files as data, per commit (RAGEN-AI/RAGEN 5eb79b8, 2025-09-06; mll-lab-nu/RAGEN
# 20daedc, 2026-04-14): the leaf keys and values of config/base.yaml, config/envs.yaml's tags (env_type; for text env
# types also max_actions_per_traj and env_config, prompts left out) and the train / eval command lines of the README
# (and of train_all.sh, Sept 2025) as arguments (experiment names and CUDA_VISIBLE_DEVICES left out, repeats dropped)
RAGEN = json.loads((ROOT / "tests" / "data" / "ragen_configs.json").read_text())
COMMITS = sorted(RAGEN)
MODEL_DIR = str(ROOT / "tests")  # stands in for RAGEN's model_path (nothing is loaded when composing)
TEXT_ENV_TYPES = ("sokoban", "bandit", "frozen_lake", "countdown")


def compose_named(overrides, name, check=True):
    from ragen_turn.compose import compose_config

    return compose_config(overrides, config_name=name, check=check)


def _value(v):
    """A yaml value as a command-line override value."""
    if v is None:
        return "null"
    if isinstance(v, (list, dict)):
        return json.dumps(v).replace('"', "'")
    return str(v)


def test_config_name_base_is_ragens_ppo_run(monkeypatch, capsys):
    """RAGEN's --config-name base (PPO with GAE) is our _2_sokoban on the command line, said in one line; without
    --config-name our own base stays the default."""
    from ragen_turn.compose import prepare_cli

    for argv, name in ((["--config-name", "base"], "_2_sokoban"), (["--config-name=base.yaml"], "_2_sokoban"),
                       (["-cn", "_1_bandit"], "_1_bandit"), ([], None)):
        monkeypatch.setattr(sys, "argv", ["train", *argv, "trainer.default_local_dir=/tmp/x"])
        prepare_cli()
        from ragen_turn.compose import _config_name_arg

        assert _config_name_arg(sys.argv[1:]) == name
    assert capsys.readouterr().out.count("RAGEN's base run (PPO with GAE: algo=token_ppo)") == 2
    cfg = compose_named(["trainer.default_local_dir=/tmp/x"], "_2_sokoban")
    assert cfg.algo.name == "token_ppo" and cfg.algorithm.adv_estimator == "token_gae"


def test_config_name_6_webshop_is_env_webshop_with_ragens_settings():
    cfg = compose_named(["trainer.default_local_dir=/tmp/x"], "_6_webshop")
    assert cfg.env.name == "webshop" and cfg.algo.name == "token_ppo"
    assert cfg.agent_proxy.max_turn == 9 and cfg.agent_proxy.max_actions_per_turn == 1
    assert list(cfg.es_manager.train.env_configs.tags) == ["WebShop"]


@pytest.mark.parametrize("name,names", [("_5_metamathqa", "_4_countdown"), ("evaluate_api_llm", "bash eval.sh"),
                                        ("stream", "bash eval.sh"), ("eval", "bash eval.sh"),
                                        ("webshop_3b_train", "_6_webshop"), ("_8_sudoku", "env_module=")])
def test_ragens_other_named_configs_stop_naming_what_to_use(name, names):
    with pytest.raises(ValueError) as e:
        compose_named([], name)
    assert f"--config-name {name}" in str(e.value) and names in str(e.value)


@pytest.mark.parametrize("commit", COMMITS)
def test_ragens_base_yaml_composes_whole(commit):
    """Every leaf key of RAGEN's config/base.yaml at its value (interpolations too), given at once on RAGEN's main
    run, composes and passes the checks; keys that map onto ours get RAGEN's values."""
    from omegaconf import OmegaConf

    leaves = RAGEN[commit]["base_yaml"]
    given = dict(leaves)
    overrides = []
    for key, v in leaves:
        # RAGEN's wiring (lora_rank: ${lora.rank}): its value; an interpolation of verl's keys (top_p) is ours: kept
        while isinstance(v, str) and v.startswith("${") and v[2:-1] in given:
            v = given[v[2:-1]]
        if key in ("model_path", "actor_rollout_ref.model.path", "critic.model.path"):
            v = MODEL_DIR
        if key == "trainer.default_local_dir":
            continue
        overrides.append(f"{key}={_value(v)}")
    cfg = compose_named(overrides + ["trainer.default_local_dir=/tmp/ragen_turn_base_yaml"], "_2_sokoban")
    assert cfg.model.path == MODEL_DIR and cfg.model.name == "hf"
    assert cfg.seed == given["seed.train"] and cfg.ppo_mini_batch_size == given["ppo_mini_batch_size"]
    assert cfg.algorithm.adv_estimator == "token_gae"
    assert list(cfg.es_manager.train.env_configs.tags) == given["es_manager.train.env_configs.tags"]
    assert cfg.actor_rollout_ref.rollout.response_length == given["actor_rollout_ref.rollout.response_length"]
    assert OmegaConf.select(cfg, "actor_rollout_ref.rollout.top_k") == -1


@pytest.mark.parametrize("commit", COMMITS)
def test_ragens_envs_yaml_text_tags_are_available_by_name(commit):
    """Each text tag of RAGEN's envs.yaml is playable by name, with RAGEN's entry (max_actions_per_traj, env_config)
    given on the command line as RAGEN's scripts give it; each image tag stops naming its text twin."""
    from ragen_turn.envs import make_env

    for tag, entry in RAGEN[commit]["envs_yaml"].items():
        if entry["env_type"] not in TEXT_ENV_TYPES:
            continue
        over = [f"es_manager.val.env_configs.tags=[{tag}]", "es_manager.val.env_configs.n_groups=[8]",
                "es_manager.val.env_groups=8",
                f"custom_envs.{tag}.max_actions_per_traj={entry['max_actions_per_traj']}"]
        given = entry["env_config"] or {}  # its mappings (grid_lookup) are the library's, checked below
        over += [f"custom_envs.{tag}.env_config.{k}={_value(v)}" for k, v in given.items() if not isinstance(v, dict)]
        if (entry["env_config"] or {}).get("render_mode") == "rgb_array":
            with pytest.raises(ValueError) as e:
                compose_named(over + ["trainer.default_local_dir=/tmp/x"], "_2_sokoban")
            assert f"{tag}: RAGEN's image env" in str(e.value) and "SimpleSokoban" in str(e.value)
            continue
        cfg = compose_named(over + ["trainer.default_local_dir=/tmp/x"], "_2_sokoban")
        spec = cfg.custom_envs[tag]
        assert spec.env_type == entry["env_type"] and spec.max_actions_per_traj == entry["max_actions_per_traj"]
        for k, v in given.items():
            if isinstance(v, dict):
                assert {str(a): b for a, b in spec.env_config[k].items()} == {str(a): b for a, b in v.items()}, k
        env = make_env(spec.env_type, dict(spec.env_config or {}))
        assert isinstance(env.reset(seed=1), str)


def test_sept_2025_bandit_names_a_fixed_pair_of_arms():
    from ragen_turn.envs import make_env

    names = RAGEN["5eb79b8"]["envs_yaml"]["Bandit"]["env_config"]
    env = make_env("bandit", dict(names))
    for seed in range(6):
        env.reset(seed=seed)
        assert sorted(env.ACTION_LOOKUP.values()) == sorted([names["lo_arm_name"], names["hi_arm_name"]])
        assert env.hi_arm_name == names["hi_arm_name"]
    with pytest.raises(ValueError, match="go together"):
        make_env("bandit", {"lo_arm_name": "Phoenix"})


def test_a_tag_nowhere_gets_our_message_not_hydras():
    with pytest.raises(ValueError) as e:
        compose_named(["custom_envs.SokobanNowhere.max_actions_per_traj=5", "trainer.default_local_dir=/tmp/x"],
                      "_2_sokoban")
    msg = str(e.value)
    assert "custom_envs.SokobanNowhere: no such env tag here" in msg and "Could not override" not in msg


# a line may stop only naming the replacement: these keys are refused here with our message
REFUSED_IN_LINES = ("trainer.n_gpus_per_node=", "tensor_model_parallel_size=",
                    "lora.rank=", "--config-name webshop_3b_train")


def line_config(args):
    """RAGEN's command line ``args`` (``train`` or ``eval``, then its arguments) as our command line would compose
    it, checked; a line without ``--config-name`` is RAGEN's default, its base."""
    from ragen_turn.ragen_keys import ragen_config_name

    args = list(args[1:])
    if "--config-name" not in args:
        args = ["--config-name", "base", *args]
    args = ragen_config_name(args)
    i = args.index("--config-name")
    name, args = args[i + 1], args[:i] + args[i + 2:]
    args = [f"model_path={MODEL_DIR}" if a.startswith("model_path=") else a for a in args]
    args = [a for a in args if not a.startswith("trainer.default_local_dir=")]
    return compose_named(args + ["trainer.default_local_dir=/tmp/ragen_turn_lines"], name)


@pytest.mark.parametrize("commit", COMMITS)
def test_ragens_readme_and_script_lines_run_or_stop_naming_the_replacement(commit):
    """Every train / eval line of RAGEN's README (and train_all.sh) composes and passes the checks, or stops with our
    message naming the replacement (REFUSED_IN_LINES), never Hydra's generic one."""
    ran, stopped = 0, 0
    for args in RAGEN[commit]["lines"]:
        try:
            line_config(args)
            ran += 1
        except ValueError as e:
            msg = str(e)
            assert "Could not override" not in msg, (args, msg)
            assert any(k.split("=")[0] in msg for k in REFUSED_IN_LINES), (args, msg)
            assert any(k in " ".join(args) for k in REFUSED_IN_LINES), (args, msg)
            stopped += 1
    assert ran + stopped == len(RAGEN[commit]["lines"]) and ran >= len(RAGEN[commit]["lines"]) // 2


# ---------------------------------------------------------------- an env file written as RAGEN's docs teach
def test_a_ragen_style_env_file_trains_unedited(tmp_path):
    """tests/ragen_doc_env/env.py imports ``ragen.env.base`` and ``ragen.utils`` as RAGEN's env files do; without
    RAGEN installed, env_module= provides them (ours) and 2 steps train."""
    run = tmp_path / "run"
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT / "tests")}
    res = subprocess.run(["bash", str(ROOT / "train.sh"), "echo_word", "grpo", "env_module=ragen_doc_env",
                          *[o for o in TINY if not o.startswith("trainer.total_training_steps")],
                          "trainer.total_training_steps=2", f"trainer.default_local_dir={run}"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "env echo_word: ragen_doc_env.env.EchoWordEnv" in res.stdout
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 2


def test_ragen_aliases_never_shadow_a_real_ragen(tmp_path):
    """With a ``ragen`` package on the path the aliases are not installed; without one they are, and they are ours."""
    (tmp_path / "ragen").mkdir()
    (tmp_path / "ragen" / "__init__.py").write_text("REAL = True\n")
    code = ("import sys; sys.path.insert(0, sys.argv[1]) if sys.argv[1] else None\n"
            "from ragen_turn.envs.ragen_aliases import install\n"
            "print(install())\n"
            "import ragen; print(getattr(ragen, 'REAL', False))\n"
            "if not ragen.__dict__.get('REAL'):\n"
            "    from ragen.env.base import BaseLanguageBasedEnv\n"
            "    from ragen_turn.envs import BaseLanguageBasedEnv as Ours\n"
            "    print(BaseLanguageBasedEnv is Ours)\n")
    real = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
    assert real.stdout.split() == ["False", "True"], real.stderr
    alias = subprocess.run([sys.executable, "-c", code, ""], cwd=ROOT, capture_output=True, text=True)
    assert alias.stdout.split() == ["True", "False", "True"], alias.stderr


# ---------------------------------------------------------------- the warm start, announced before it starts
def test_a_warm_start_is_announced_before_it_starts_with_its_time_and_skip_keys(tmp_path, monkeypatch, capsys):
    """An uncached warm start (the tiny model's copy pretraining, then SFT) is said in one line before the model is
    built: what, about how long here (a probe), the keys that skip it; once cached, nothing is said."""
    from ragen_turn.engines.local.trainer import build_trainer
    from ragen_turn.warmstart import warmstart_notice

    monkeypatch.setenv("RAGEN_TURN_CACHE_DIR", str(tmp_path / "cache"))
    over = ["env=sokoban", "model.copy_pretrain_steps=3", "model.warmstart.enable=true", "model.warmstart.episodes=8",
            "model.warmstart.steps=2", "model.warmstart.batch_size=4", "model.warmstart.micro_batch_size=4"]
    build_trainer(micro_config(over, run_dir=tmp_path / "run"), log=print)  # the copy pretraining prints too
    lines = capsys.readouterr().out.splitlines()
    notice = next(i for i, x in enumerate(lines) if x.startswith("[warmstart] before step 1"))
    copy = next(i for i, x in enumerate(lines) if "copy pretraining step" in x)
    assert notice < copy
    said = lines[notice]
    assert "copy pretraining of the tiny model (3 steps, about" in said and "SFT on 8 solver demonstrations" in said
    assert "on this machine" in said and "model.copy_pretrain_steps=0 model.warmstart.enable=false" in said
    again = []
    assert warmstart_notice(micro_config(over, run_dir=tmp_path / "run2"), log=again.append) == {} and again == []


def test_the_committed_warm_start_is_copied_and_said_not_announced_as_a_build(tmp_path, monkeypatch, capsys):
    """The main job on an empty cache: the committed model and warm start (model.pinned_cache) are copied, each copy
    said once ("copied the committed ..."), and no build is announced (.ci/run greps the first line)."""
    from ragen_turn.compose import compose_config
    from ragen_turn.warmstart import warmstart_notice

    monkeypatch.setenv("RAGEN_TURN_CACHE_DIR", str(tmp_path / "cache"))
    cfg = compose_config(["env=sokoban", "algo=turn_ppo", f"trainer.default_local_dir={tmp_path / 'run'}"])
    assert warmstart_notice(cfg) == {}
    out = capsys.readouterr().out
    assert "copied the committed warmstart" in out and "copied the committed model tiny-" in out, out
    assert "[warmstart] before step 1" not in out, out
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted(
        p.name for p in (ROOT / cfg.model.pinned_cache).iterdir()), out
