"""A RAGEN user's first hour (issue 49): every key of RAGEN's config/base.yaml and of its run scripts gets an outcome
(honoured, aliased, unused and listed once, or refused naming ours), never Hydra's generic message; envs.yaml
entries pasted unchanged; model_path; RAGEN's named runs (--config-name _2_sokoban); messages that name the way out.

RAGEN_KEYS is RAGEN's key list as data (RAGEN main 20daedc, 2026-04: the 127 leaf keys of config/base.yaml, then
the keys its scripts/runs/*.sh add): (key, a value RAGEN users pass that is accepted, a value that is refused or
None, the outcome). Values are chosen to fit the micro test config (a batch of 2 x 2 episodes), not RAGEN's sizes.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from helpers import ONE_STEP_RUN, micro_config, sh

ROOT = Path(__file__).resolve().parent.parent
H, A, U, R = "honoured", "aliased", "unused", "refused"
MODEL_DIR = str(ROOT / "tests")  # an existing directory stands in for a model path (nothing is loaded here)

RAGEN_KEYS = [
    # ---------------------------------------------------------------- config/base.yaml (127 leaf keys)
    ("system.CUDA_VISIBLE_DEVICES", "0", None, H),
    ("seed.train", "10000", None, A),
    ("seed.val", "123", None, U),
    ("micro_batch_size_per_gpu", "1", None, H),
    ("log_prob_micro_batch_size_per_gpu", "1", None, U),
    ("ppo_mini_batch_size", "2", None, H),
    ("model_path", MODEL_DIR, None, A),
    ("enable_response_mask", "True", "False", H),
    ("grpo_advantage_length_weight", "False", "True", R),
    ("lora.rank", "8", "-1", A),
    ("lora.alpha", "64", None, U),
    ("lora.target_modules", "all-linear", None, U),
    ("actor_rollout_ref.model.path", MODEL_DIR, None, A),
    ("actor_rollout_ref.model.lora_rank", "16", "-1", H),
    ("actor_rollout_ref.model.lora_alpha", "64", "0", H),
    ("actor_rollout_ref.model.target_modules", "all-linear", None, H),
    ("actor_rollout_ref.actor.ppo_mini_batch_size", "2", None, A),
    ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "1", None, A),
    ("actor_rollout_ref.actor.use_ref", "True", None, U),
    ("actor_rollout_ref.actor.entropy_coeff", "0.001", None, H),
    ("actor_rollout_ref.actor.use_kl_loss", "False", None, H),
    ("actor_rollout_ref.actor.kl_loss_coef", "0.000", None, H),
    ("actor_rollout_ref.actor.kl_loss_type", "kl", "full", A),
    ("actor_rollout_ref.actor.clip_ratio_low", "0.2", None, H),
    ("actor_rollout_ref.actor.clip_ratio_high", "0.28", None, H),
    ("actor_rollout_ref.actor.grpo_advantage_length_weight", "False", "True", R),
    ("actor_rollout_ref.actor.filter_loss_scaling", "none", "sqrt", R),
    ("actor_rollout_ref.actor.loss_agg_mode", "token-mean", "seq-mean-token-max", A),
    ("actor_rollout_ref.actor.optim.betas", "[0.9,0.999]", None, H),
    ("actor_rollout_ref.actor.optim.lr", "1e-6", None, H),
    ("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", "1", None, U),
    ("actor_rollout_ref.rollout.name", "vllm", None, A),
    ("actor_rollout_ref.rollout.load_format", "auto", None, U),
    ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", "1", None, U),
    ("actor_rollout_ref.rollout.tensor_model_parallel_size", "1", "2", A),
    ("actor_rollout_ref.rollout.max_model_len", "3600", None, A),
    ("actor_rollout_ref.rollout.prompt_length", "1", None, U),
    ("actor_rollout_ref.rollout.response_length", "8", None, H),
    ("actor_rollout_ref.rollout.gpu_memory_utilization", "0.3", None, A),
    ("actor_rollout_ref.rollout.max_num_batched_tokens", "8192", None, U),
    ("actor_rollout_ref.rollout.temperature", "1", None, H),
    ("actor_rollout_ref.rollout.rollout_filter_value", "1.0", None, A),
    ("actor_rollout_ref.rollout.rollout_filter_strategy", "top_p", "bogus", H),  # RAGEN-2's filter: our keys
    ("actor_rollout_ref.rollout.rollout_filter_type", "largest", "bogus", H),
    ("actor_rollout_ref.rollout.rollout_filter_include_zero", "True", None, H),
    ("actor_rollout_ref.rollout.rollout_filter_top_p_prob_mode", "linear", "bogus", H),
    ("actor_rollout_ref.rollout.rollout_filter_selection_eps", "0.01", None, H),
    ("actor_rollout_ref.rollout.rollout_filter_empty_stop_steps", "5", None, U),
    ("actor_rollout_ref.rollout.rollout_filter_metric", "reward_variance", "entropy", H),
    ("actor_rollout_ref.rollout.gradient_analysis_num_buckets", "6", None, U),
    ("actor_rollout_ref.rollout.gradient_analysis_bucket_mode", "quantile", None, U),
    ("actor_rollout_ref.rollout.enforce_eager", "True", None, U),
    ("actor_rollout_ref.rollout.free_cache_engine", "True", None, U),
    ("actor_rollout_ref.rollout.val_kwargs.do_sample", "True", None, A),
    ("actor_rollout_ref.rollout.val_kwargs.temperature", "0.5", None, A),
    ("critic.ppo_mini_batch_size", "2", "1", A),
    ("critic.ppo_micro_batch_size_per_gpu", "2", "1", A),
    ("critic.model.path", MODEL_DIR, "/elsewhere", U),
    ("critic.model.lora_rank", "0", "8", R),
    ("critic.model.lora_alpha", "64", None, U),
    ("critic.model.target_modules", "all-linear", None, U),
    ("critic.optim.betas", "[0.9,0.999]", "[0.8,0.99]", H),
    ("critic.optim.lr", "1e-5", None, H),
    ("data.max_prompt_length", "null", "4096", R),
    ("data.max_response_length", "null", "400", R),
    ("data.train_batch_size", "null", "128", R),
    ("algorithm.gamma", "1.0", None, H),
    ("algorithm.lam", "1.0", None, H),
    ("algorithm.high_level_gamma", "0.95", None, H),
    ("algorithm.adv_estimator", "gae", None, A),
    ("algorithm.bi_level_gae", "False", None, A),
    ("algorithm.zero_task_advantage", "False", "True", R),
    ("algorithm.norm_adv_by_std_in_grpo", "True", None, H),
    ("algorithm.soft_advantage_reweight", "False", "True", R),
    ("algorithm.kl_penalty", "kl", "full", A),
    ("algorithm.kl_ctrl.type", "fixed", "pid", H),
    ("algorithm.kl_ctrl.kl_coef", "0.000", "-1", H),
    ("trainer.project_name", "ragen", None, A),
    ("trainer.experiment_name", "test", None, H),
    ("trainer.local_log_dir", "results/", None, U),
    ("trainer.save_freq", "100", None, H),
    ("trainer.total_training_steps", "200", None, H),
    ("trainer.validation_steps", "1", "3", R),
    ("trainer.val_before_train", "True", None, H),
    ("trainer.n_gpus_per_node", "1", "8", A),
    ("trainer.test_freq", "10", None, H),
    ("trainer.generations_to_log_to_wandb.val", "20", None, A),
    ("trainer.logger", "[console]", "[console,tensorboard]", A),
    ("trainer.max_actor_ckpt_to_keep", "1", None, A),
    ("trainer.max_critic_ckpt_to_keep", "1", None, A),
    ("trainer.log_group_rv_table", "False", None, U),
    ("trainer.gradient_analysis_mode", "False", "True", R),
    ("trainer.gradient_analysis_every", "50", None, U),
    ("trainer.gradient_analysis_env_groups", "4", None, U),
    ("trainer.gradient_analysis_group_size", "4", None, U),
    ("trainer.gradient_analysis_log_prefilter", "False", None, U),
    ("trainer.gradient_analysis_only", "False", "True", R),
    ("trainer.exit_after_gradient_analysis", "False", "True", R),
    ("agent_proxy.context_window_mode", "full", "single_turn", R),
    ("agent_proxy.max_context_window", "-1", "1", R),
    ("agent_proxy.batch_adjust_mode", "copy", None, U),
    ("agent_proxy.max_turn", "5", None, H),
    ("agent_proxy.action_sep", "'||'", None, H),
    ("agent_proxy.max_actions_per_turn", "2", None, H),
    ("agent_proxy.use_turn_scores", "False", None, H),
    ("agent_proxy.enable_think", "True", None, H),
    ("agent_proxy.reward_normalization.grouping", "state", None, H),
    ("agent_proxy.reward_normalization.method", "identity", None, H),
    ("collapse_detection.compute_freq", "5", None, A),
    ("collapse_detection.micro_batch_size", "128", None, U),
    ("collapse_detection.first_turn_enabled", "true", None, U),
    ("collapse_detection.multi_turn_enabled", "true", None, U),
    ("collapse_detection.num_samples", "64", None, A),
    ("es_manager.format_penalty", "-0.1", None, H),
    ("es_manager.train.env_groups", "8", None, H),
    ("es_manager.train.group_size", "16", None, H),
    ("es_manager.train.env_configs.tags", "[CoordSokoban]", None, H),
    ("es_manager.train.env_configs.n_groups", "[2]", None, H),
    ("es_manager.val.env_groups", "2", None, H),
    ("es_manager.val.group_size", "1", None, H),
    ("es_manager.val.env_configs.tags", "[CoordSokoban]", None, H),
    ("es_manager.val.env_configs.n_groups", "[2]", None, H),
    ("ctx_manager.generation.gen_config.response_length", "8", None, A),
    ("ctx_manager.generation.gen_config.temperature", "1.0", None, A),
    ("ctx_manager.generation.gen_config.top_p", "1.0", None, A),
    ("ctx_manager.generation.gen_config.top_k", "50", "-5", A),
    ("ctx_manager.generation.gen_config.kwargs", "null", "{a:1}", R),
    # ---------------------------------------------------------------- keys RAGEN's scripts/runs/*.sh add
    ("actor_rollout_ref.actor.entropy_from_logits_with_chunking", "True", None, U),
    ("actor_rollout_ref.actor.checkpoint.save_contents", "[model,optimizer,extra]", None, U),
    ("critic.checkpoint.save_contents", "[model,optimizer,extra]", None, U),
    ("ray_kwargs.ray_init.num_cpus", "16", None, A),
    ("algorithm.use_kl_in_reward", "False", None, H),
    ("trainer.resume_mode", "disable", "resume_path", A),
    ("trainer.resume_from_path", "null", "/ckpts/global_step_100", R),
    ("trainer.default_local_dir", "/tmp/ragen_turn_key_walk_unused", None, H),
    # (scripts: custom_envs.CoordFrozenLake.env_config.success_rate): a key the entry does not list yet is added
    ("custom_envs.SimpleSokoban.env_config.cell_sep", "''", None, H),
]
BASE_YAML_KEYS = 127


# keys RAGEN users give together with another
WITH = {"critic.model.path": [f"model_path={MODEL_DIR}"], "algorithm.adv_estimator": ["algo=token_ppo"]}


def _compose(override):
    """The config for one RAGEN override on the micro config (``model_path`` picks model=hf)."""
    return micro_config(WITH.get(override.split("=", 1)[0], []) + [override])


def test_the_key_list_is_ragens():
    keys = [k for k, *_ in RAGEN_KEYS]
    assert len(keys) == len(set(keys))
    assert len(keys) - 9 == BASE_YAML_KEYS  # the base.yaml part of the list is whole
    assert {o for *_, o in RAGEN_KEYS} == {H, A, U, R}
    from ragen_turn.ragen_keys import ALIASES, BY_KEY

    assert len(ALIASES) == len(BY_KEY)  # one table entry per RAGEN key
    assert {a.outcome for a in ALIASES} <= {H, A, U, R}


@pytest.mark.parametrize("key,ok,bad,outcome", RAGEN_KEYS, ids=[k for k, *_ in RAGEN_KEYS])
def test_every_ragen_key_is_honoured_aliased_unused_or_refused(key, ok, bad, outcome):
    """RAGEN's usual value is accepted (unused ones are recorded as such); a value without a counterpart here stops
    before any work with a message that names the key, never Hydra's "Could not override"."""
    from ragen_turn.config import validate_config
    from ragen_turn.ragen_keys import BY_KEY, UNUSED_TAG

    cfg = _compose(f"{key}={ok}")
    validate_config(cfg)
    if key in BY_KEY:  # the docs table's outcome is the one tested here
        assert BY_KEY[key].outcome == outcome, key
    else:
        assert outcome == H, key  # a key of ours with RAGEN's name and meaning
    recorded = {k.split("=", 1)[0]: v for k, v in cfg.ragen_aliases.items()}
    if outcome == U and ok != "null":
        assert recorded[key].startswith(UNUSED_TAG), recorded
    if bad is not None:
        with pytest.raises(ValueError) as e:
            validate_config(_compose(f"{key}={bad}"))
        msg = str(e.value)
        assert "Could not override" not in msg and key.split(".")[-1] in msg, msg


def test_keys_that_change_nothing_stay_out_of_the_run_name():
    from ragen_turn.compose import compose_config

    plain = compose_config([]).trainer.experiment_name
    quiet = ["lora.alpha=64", "trainer.project_name=x", "system.CUDA_VISIBLE_DEVICES=0", "seed.val=1",
             "actor_rollout_ref.rollout.gpu_memory_utilization=0.3"]
    assert compose_config(quiet).trainer.experiment_name == plain
    assert compose_config(["algorithm.bi_level_gae=False"]).trainer.experiment_name != plain  # RAGEN's own meaning


def test_unused_keys_are_listed_once_in_the_log():
    from ragen_turn.ragen_keys import unused_lines

    cfg = micro_config(["actor_rollout_ref.rollout.name=vllm", "lora.alpha=64", "trainer.local_log_dir=results/",
                        "seed.val=123"])
    lines = unused_lines(cfg)
    assert len(lines) == 1 and lines[0].count("unused") == 1
    for k in ("actor_rollout_ref.rollout.name=vllm", "lora.alpha=64", "trainer.local_log_dir=results/", "seed.val=123"):
        assert lines[0].count(k) == 1, lines


@pytest.mark.parametrize("override,names", [
    ("lora.foo=1", "RAGEN's keys under lora"),
    ("system.GPUS=1", "system.CUDA_VISIBLE_DEVICES"),
    ("algorithm.gama=0.9", "did you mean algorithm.gamma"),
    ("trainer.foo.bar=1", "trainer.foo"),
])
def test_unknown_keys_get_our_message_before_hydra(override, names, tmp_path):
    with pytest.raises(ValueError, match="unknown key") as e:
        micro_config([override])
    assert names in str(e.value)
    res = subprocess.run([sys.executable, "-m", "ragen_turn.train", override,
                          f"trainer.default_local_dir={tmp_path / 'run'}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and names in res.stderr and "Could not override" not in res.stderr, res.stderr[-800:]
    assert "Traceback" not in res.stderr


def test_an_env_config_key_the_env_lacks_is_named_with_the_envs_keys(tmp_path):
    """RAGEN's scripts set env_config keys on the command line (custom_envs.<Tag>.env_config.<key>=...): a key the
    entry does not list is added, and one the env's config class lacks stops naming the known ones."""
    res = subprocess.run([sys.executable, "-m", "ragen_turn.train", "custom_envs.SimpleSokoban.env_config.dim_z=6",
                          f"trainer.default_local_dir={tmp_path / 'run'}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and "['dim_z']" in res.stderr and "dim_room" in res.stderr, res.stderr[-800:]
    assert "Could not override" not in res.stderr


def test_cuda_visible_devices_is_exported_before_torch_starts():
    """From the command line it is set before anything looks at a GPU (torch is not even imported yet)."""
    code = ("import os, sys; sys.argv = ['train', 'system.CUDA_VISIBLE_DEVICES=3,5'];"
            "from ragen_turn.compose import prepare_cli; prepare_cli();"
            "t = sys.modules.get('torch');"
            "print(os.environ['CUDA_VISIBLE_DEVICES'], t is not None and t.cuda.is_initialized())")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"})
    assert out.stdout.split() == ["3,5", "False"], out.stderr[-800:]


def test_cuda_visible_devices_from_a_config_is_set_and_recorded(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    cfg = micro_config(["system.CUDA_VISIBLE_DEVICES=1"])
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    assert "system.CUDA_VISIBLE_DEVICES=1" in cfg.ragen_aliases


def test_model_path_selects_the_real_model_defaults(tmp_path, capsys):
    from ragen_turn.ragen_keys import move_ragen_overrides

    for overrides in ([f"model_path={tmp_path}"], ["model=hf", f"model_path={tmp_path}"]):
        cfg = micro_config(overrides)
        assert cfg.model.name == "hf" and cfg.model.path == str(tmp_path)
        assert cfg.actor_rollout_ref.actor.optim.lr == 1e-6 and cfg.critic.optim.lr == 1e-5
        assert cfg.model.warmstart.enable is False  # no automatic SFT
        assert cfg.agent_proxy.max_context_tokens == 3600
    cfg = compose_config_named([f"model_path={tmp_path}"], "base")
    assert cfg.actor_rollout_ref.rollout.response_length == 400
    notes = []
    move_ragen_overrides([f"model_path={tmp_path}"], notes)
    assert len(notes) == 1 and "model=hf" in notes[0] and "lr 1e-6" in notes[0]
    with pytest.raises(ValueError, match="add model=hf"):
        micro_config(["model=tiny", f"model_path={tmp_path}"])


def test_model_path_in_a_yaml_file_reaches_model_path_through_the_table(tmp_path):
    """A top-level ``model_path:`` in a yaml file (no command line to rename it) becomes ``model.path`` through its
    entry in the alias table alone, so nothing past the config pipeline reads ``model_path``: the required
    ``model.path`` of ``model=hf`` is set, and the model the engines load is that directory."""
    from ragen_turn.compose import compose_config
    from ragen_turn.config import model_config

    (tmp_path / "setting").mkdir()
    (tmp_path / "setting" / "ragen_model.yaml").write_text(f"# @package _global_\nmodel_path: {tmp_path}\n")
    cfg = compose_config(["model=hf", f"hydra.searchpath=[file://{tmp_path}]", "+setting=ragen_model"])
    assert cfg.model.path == str(tmp_path) and model_config(cfg)["path"] == str(tmp_path)
    assert "model.path" not in OmegaConf.missing_keys(cfg)
    assert cfg.ragen_aliases[f"model_path={tmp_path}"] == f"model.path={tmp_path}"
    with pytest.raises(ValueError, match="model.path is required"):  # without it, model=hf still needs a path
        compose_config(["model=hf"], check=True)


def test_eval_of_a_model_path_run_loads_the_checkpoint_not_the_starting_model(tmp_path):
    """A run started with RAGEN's ``model_path=<dir>`` holds that key in its config; evaluating one of its
    checkpoints points ``model.path`` at the checkpoint, and finalizing the config must not map ``model_path``
    back over it (it did: the starting model was evaluated)."""
    from ragen_turn.compose import finalize
    from ragen_turn.evaluate import point_at_checkpoint

    start, ckpt = tmp_path / "start", tmp_path / "run" / "checkpoints" / "step_2" / "actor"
    start.mkdir()
    ckpt.mkdir(parents=True)
    cfg = micro_config([f"model_path={start}"])
    assert cfg.model.path == str(start) and cfg.ragen_keys.model_path == str(start)
    finalize(point_at_checkpoint(cfg, ckpt), check=False)
    assert cfg.model.path == str(ckpt) and cfg.model.warmstart.enable is False


def compose_config_named(overrides, name):
    from ragen_turn.compose import compose_config

    return compose_config(overrides, config_name=name)


def test_model_path_says_so_in_one_line_on_the_command_line(tmp_path):
    res = subprocess.run([sys.executable, "-m", "ragen_turn.train", f"model_path={tmp_path}", "ppo_mini_batch_size=0",
                          f"trainer.default_local_dir={tmp_path / 'run'}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and "ppo_mini_batch_size" in res.stderr  # refused before any model load
    assert res.stdout.count("model=hf") == 1 and f"model_path={tmp_path}" in res.stdout


def test_adv_estimator_gae_on_turn_ppo_names_the_algo():
    with pytest.raises(ValueError) as e:
        micro_config(["algorithm.adv_estimator=gae"])
    assert "use algo=token_ppo" in str(e.value) and "algo=grpo" in str(e.value)
    with pytest.raises(ValueError, match="use algo=grpo"):
        micro_config(["algorithm.adv_estimator=grpo"])
    assert micro_config(["algo=token_ppo", "algorithm.adv_estimator=gae"]).algorithm.adv_estimator == "token_gae"
    assert micro_config(["algo=grpo", "algorithm.adv_estimator=grpo"]).algorithm.adv_estimator == "grpo"


# ---------------------------------------------------------------- RAGEN's named runs
def test_named_config_2_sokoban_has_ragens_settings():
    cfg = compose_config_named(["model.warmstart.enable=false", "trainer.default_local_dir=/tmp/x"], "_2_sokoban")
    assert cfg.algo.name == "token_ppo" and cfg.algorithm.adv_estimator == "token_gae"
    assert list(cfg.es_manager.train.env_configs.tags) == ["CoordSokoban"]
    assert list(cfg.es_manager.val.env_configs.tags) == ["CoordSokoban"]
    assert (cfg.es_manager.train.env_groups, cfg.es_manager.train.group_size) == (8, 16)
    assert (cfg.es_manager.val.env_groups, cfg.es_manager.val.group_size) == (512, 1)
    assert cfg.custom_envs.CoordSokoban.env_config.observation_format == "grid_coord"
    ap = cfg.agent_proxy
    assert (ap.max_turn, ap.max_actions_per_turn, ap.enable_think, ap.use_turn_scores) == (5, 2, True, False)
    assert cfg.actor_rollout_ref.rollout.val_temperature == 0.5 and cfg.ppo_mini_batch_size == 32
    assert cfg.actor_rollout_ref.actor.entropy_coeff == 0.001 and cfg.algorithm.gamma == 1.0
    assert cfg.trainer.total_training_steps == 200 and cfg.trainer.experiment_name.startswith("sokoban-main")


@pytest.mark.parametrize("overrides,algo,adv", [
    (["algorithm.adv_estimator=grpo"], "grpo", "grpo"),
    (["algorithm.adv_estimator=gae"], "token_ppo", "token_gae"),
    (["algorithm.adv_estimator=gae", "algorithm.bi_level_gae=True"], "bi_level_gae", "bi_level_gae"),
    (["algo=turn_ppo"], "turn_ppo", "turn_gae"),
])
def test_named_runs_pick_the_algo_from_ragens_estimator(overrides, algo, adv):
    """RAGEN's scripts choose GRPO with --config-name _2_sokoban algorithm.adv_estimator=grpo (no algo=)."""
    cfg = compose_config_named(overrides + ["trainer.default_local_dir=/tmp/x"], "_2_sokoban")
    assert (cfg.algo.name, cfg.algorithm.adv_estimator) == (algo, adv)


def test_named_configs_compose_for_each_ragen_env():
    from ragen_turn.config import validate_config

    for name, env in (("_1_bandit", "bandit"), ("_3_frozen_lake", "frozen_lake"), ("_4_countdown", "countdown")):
        cfg = compose_config_named(["trainer.default_local_dir=/tmp/x"], name)
        validate_config(cfg)
        assert cfg.env.name == env and cfg.algo.name == "token_ppo"
        assert cfg.agent_proxy.max_turn == (5 if env == "frozen_lake" else 1)
    with pytest.raises(ValueError) as e:
        compose_config_named([], "_9_nothing")
    assert "available:" in str(e.value) and "_2_sokoban" in str(e.value) and "base" in str(e.value)


@pytest.mark.parametrize("name,tag", [("_2_sokoban", "CoordSokoban"), ("_1_bandit", "Bandit"),
                                      ("_3_frozen_lake", "FrozenLake"), ("_4_countdown", "Countdown")])
def test_train_sh_config_name_trains(tmp_path, name, tag):
    run = tmp_path / "run"
    res = sh("train.sh", "--config-name", name, *ONE_STEP_RUN, f"trainer.default_local_dir={run}", timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "algo=token_ppo" in res.stdout and f"env {tag}" in res.stdout
    cfg = OmegaConf.load(run / "config.yaml")
    assert list(cfg.es_manager.train.env_configs.tags) == [tag] and cfg.agent_proxy.enable_think
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()][-1] == 1


def test_train_sh_unknown_config_name_lists_the_named_configs():
    bad = subprocess.run(["bash", "train.sh", "--config-name", "_7_nothing"], cwd=ROOT,
                         env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "available: _1_bandit" in bad.stderr


# ---------------------------------------------------------------- envs.yaml entries pasted unchanged
ENTRY = """
  {tag}:
    env_type: {env_type}
    max_actions_per_traj: 7
    env_instruction: |
      Walk to the end.
    max_tokens: 100
    parallel_friendly: false
    max_workers: 32
    env_config: # RAGEN's comment style kept
{env_config}
"""


def _group_file(tmp_path, name, tag, env_type, env_config):
    d = tmp_path / "conf" / "env"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{name}.yaml").write_text(
        "# @package _global_\nenv:\n"
        f"  name: {name}\n  train_tags: [{tag}]\n  train_n_groups: ['${{es_manager.train.env_groups}}']\n"
        f"  val_tags: [{tag}]\n  val_n_groups: ['${{es_manager.val.env_groups}}']\ncustom_envs:"
        + ENTRY.format(tag=tag, env_type=env_type, env_config=env_config))
    return f"hydra.searchpath=[file://{tmp_path / 'conf'}]"


@pytest.mark.parametrize("name", ["corridor", "my_corridor"])  # the registered env's own name, or another
def test_an_envs_yaml_entry_reaches_an_env_module_class(tmp_path, name):
    """RAGEN's entry keys are accepted; its env_config (with RAGEN's action_lookup) builds the class registered
    through env_module=, not its config class's defaults; the unused keys are listed once."""
    from ragen_turn.config import env_config_lines
    from ragen_turn.ragen_keys import unused_lines
    from ragen_turn.rollout.env_manager import EnvGroupManager

    sp = _group_file(tmp_path, name, "LongCorridor", "corridor",
                     "      length: 9\n      action_lookup: {1: Left, 2: Right}")
    cfg = micro_config([f"env={name}", "env_module=ragen_style_envs", sp])
    assert list(cfg.custom_envs) == ["LongCorridor"]  # no generated default entry beside it
    envs = EnvGroupManager(cfg.custom_envs, cfg.es_manager.train, "train")
    env = envs.slots[0].env
    assert env.config.length == 9 and env.config.action_lookup == {1: "Left", 2: "Right"}
    assert type(env.config.action_lookup) is dict and envs.slots[0].max_actions == 7
    (line,) = [x for x in unused_lines(cfg) if "custom_envs" in x]
    assert "max_workers [LongCorridor=32]" in line and "parallel_friendly" in line
    assert any("LongCorridor" in x and "length=9" in x for x in env_config_lines(cfg))


def test_ragens_sokoban_entry_reaches_our_sokoban(tmp_path):
    from ragen_turn.rollout.env_manager import EnvGroupManager

    sp = _group_file(tmp_path, "rs", "CoordSokoban", "sokoban",
                     "      dim_x: 7\n      dim_y: 5\n      num_boxes: 1\n      max_steps: 100\n"
                     "      observation_format: \"grid_coord\"")
    cfg = micro_config(["env=rs", sp])
    env = EnvGroupManager(cfg.custom_envs, cfg.es_manager.train, "train").slots[0].env
    assert tuple(env.config.dim_room) == (7, 5) and env.config.observation_format == "grid_coord"


def test_an_entry_with_env_config_null_is_accepted(tmp_path):
    sp = _group_file(tmp_path, "nul", "Plain", "corridor", "")
    cfg = micro_config(["env=nul", "env_module=ragen_style_envs", sp])
    from ragen_turn.config import validate_config

    validate_config(cfg)
    assert cfg.custom_envs.Plain.env_config is None


def test_warm_start_key_reads_a_ragen_entry():
    """RAGEN's Countdown entry says env_config: null; its worker-pool keys are not part of what the demos are."""
    from ragen_turn.warmstart import _demo_env_spec

    spec = _demo_env_spec(OmegaConf.create({"env_type": "x", "env_config": None, "max_workers": 32,
                                            "parallel_friendly": False, "max_tokens": 100}))
    assert spec == {"env_type": "x", "env_config": None, "max_tokens": 100}


def test_env_log_line_names_keys_a_config_consumes(tmp_path):
    """A config class whose __post_init__ folds keys into another field and deletes them (RAGEN's SokobanEnvConfig
    does so with dim_x, dim_y) is logged with the entry's values, marked, and the field they made; not as None."""
    from dataclasses import dataclass
    from typing import Optional, Tuple

    import ragen_style_envs as rs
    from ragen_turn.config import env_config_lines
    from ragen_turn.envs import register_env

    @dataclass
    class FoldingConfig:
        size: Tuple[int, int] = (4, 4)
        w: Optional[int] = None
        h: Optional[int] = None
        action_lookup: Optional[dict] = None

        def __post_init__(self):
            if self.w is not None and self.h is not None:
                self.size = (self.w, self.h)
                delattr(self, "w")
                delattr(self, "h")

    register_env("folding_corridor", rs.CorridorEnv, FoldingConfig)
    sp = _group_file(tmp_path, "fold", "Folded", "folding_corridor", "      w: 7\n      h: 3")
    cfg = micro_config(["env=fold", "env_module=ragen_style_envs", sp])
    (line,) = [x for x in env_config_lines(cfg) if "Folded" in x]
    assert "w=7 (read by its __post_init__), h=3 (read by its __post_init__)" in line
    assert "size=(7, 3)" in line and "None" not in line


def test_env_instruction_empty_string_is_no_rules_null_is_the_envs_own():
    """RAGEN's Bandit entry says env_instruction: "" (RAGEN's prompt then has no rules text); null keeps the env's."""
    from ragen_turn.envs import make_env
    from ragen_turn.rollout import EnvSlot

    env = make_env("bandit")
    assert env.instruction
    assert EnvSlot.of("Bandit", {"env_instruction": ""}, env, 0).instruction == ""
    assert EnvSlot.of("Bandit", {"env_instruction": None}, env, 0).instruction == env.instruction
    assert EnvSlot.of("Bandit", {}, env, 3, seed=5).instruction == env.instruction
    slot = EnvSlot.of("B", {"env_instruction": "Pull.", "max_actions_per_traj": 1}, env, 3, seed=5)
    assert (slot.instruction, slot.max_actions, slot.group_id, slot.seed) == ("Pull.", 1, 3, 5)
