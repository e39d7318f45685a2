"""RAGEN compatibility: bring your own env (env_module=), RAGEN-style discrete envs training, the optional warm
start."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ragen_style_envs as rs
from helpers import TEST_DEVICE, micro_config, tiny_tokenizer
from ragen_turn.envs import import_env_modules, make_env
from ragen_turn.rollout import TextPolicy

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent


def _quiet(*a, **k):
    pass


def valid_policy(tok):
    """A scripted policy that names a valid action of the env it plays (read from the env's own lookup)."""
    def respond(slot):
        names = list((slot.env.config.action_lookup or slot.env.ACTION_LOOKUP).values())
        best = "Gold" if "Gold" in names else ("Right" if "Right" in names else names[0])
        return f"<answer>{best}</answer>"

    return TextPolicy(tok, respond)


# ---------------------------------------------------------------- env_module and the env= group
def test_env_module_registers_envs_and_offers_them_as_env_groups():
    cfg = micro_config(["env=corridor", "env_module=ragen_style_envs", "custom_envs.corridor.env_config.length=6",
                        "custom_envs.corridor.max_actions_per_traj=8"])
    assert cfg.env_module == "ragen_style_envs"
    assert list(cfg.custom_envs) == ["corridor"] and cfg.env.name == "corridor"
    assert cfg.es_manager.train.env_configs.tags == ["corridor"]
    spec = cfg.custom_envs.corridor
    assert spec.env_type == "corridor" and spec.max_actions_per_traj == 8
    assert spec.env_config.length == 6 and spec.env_config.max_steps == 10  # the config dataclass's defaults
    env = make_env("corridor", dict(spec.env_config))
    assert env.config.length == 6


def test_unknown_env_module_is_a_clear_error():
    with pytest.raises(ValueError, match="env_module='no_such_pkg.envs' cannot be imported"):
        import_env_modules("no_such_pkg.envs")
    with pytest.raises(ValueError, match="env_module='no_such_pkg' cannot be imported"):
        micro_config(["env_module=no_such_pkg"])


# ---------------------------------------------------------------- the warm start is optional
def test_warmstart_auto_skips_envs_without_solve_and_true_stops_before_work():
    from ragen_turn.warmstart import warmstart_enabled

    lines = []
    cfg = micro_config(["env=corridor", "env_module=ragen_style_envs", "model.warmstart.enable=auto"])
    assert warmstart_enabled(cfg, lines.append) is False
    assert len(lines) == 1 and "no solve()" in lines[0] and "base model" in lines[0]
    assert warmstart_enabled(micro_config(["model.warmstart.enable=auto"]), lines.append) is True  # Sokoban solves
    with pytest.raises(ValueError, match="model.warmstart.enable=true needs env.solve"):
        warmstart_enabled(micro_config(["env=corridor", "env_module=ragen_style_envs", "model.warmstart.enable=true"]))
    with pytest.raises(ValueError, match="model.warmstart.enable must be"):
        warmstart_enabled(micro_config(["model.warmstart.enable=sometimes"]))


def test_numpy_integer_actions_from_a_solver_become_names():
    from ragen_turn.warmstart import _action_name

    env = make_env("sokoban")
    env.reset(seed=0)
    assert [_action_name(env, a) for a in (np.int64(1), np.int32(4), 2)] == ["Up", "Right", "Down"]
    assert _action_name(env, "Left") == "Left"


# ---------------------------------------------------------------- RAGEN-style envs train
@pytest.mark.parametrize("env_name,algo", [("corridor", "turn_ppo"), ("two_doors", "grpo")])
def test_ragen_style_envs_train_two_steps_through_env_module(env_name, algo, tmp_path):
    from ragen_turn.engines.local.trainer import build_trainer

    cfg = micro_config([f"env={env_name}", "env_module=ragen_style_envs", f"algo={algo}",
                        "model.warmstart.enable=auto", "actor_rollout_ref.rollout.response_length=24"],
                       run_dir=tmp_path)
    lines = []
    trainer = build_trainer(cfg, log=lines.append)
    assert any("[warmstart] skipped" in line for line in lines)
    trainer.sampler = valid_policy(trainer.tokenizer)
    before = sum(rs.STEPS.values())
    last = trainer.fit()
    assert last["step"] == 2
    steps = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [m for m in steps if "env/reward" in m]
    assert len(train) == 2
    # every scripted action reached the env's step as an id (its assertion would fail on a name)
    assert sum(rs.STEPS.values()) - before >= sum(m["env/actions"] for m in train) * 4 > 0
    assert all(m["env/success"] == 1.0 for m in train)


def test_train_sh_with_env_module_runs(tmp_path):
    """The command line: bash train.sh <registered env> <algo> env_module=<module> (model sampling, no warm start)."""
    env = {**os.environ, "PYTHONPATH": str(TESTS) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "PYTHON": sys.executable}
    micro = ["model.hidden_size=32", "model.num_hidden_layers=1", "model.num_attention_heads=2",
             "model.num_key_value_heads=1", "model.intermediate_size=64", "es_manager.train.env_groups=2",
             "es_manager.train.group_size=2", "es_manager.val.env_groups=2", "agent_proxy.max_turn=2",
             "ppo_mini_batch_size=2", "trainer.total_training_steps=2", "trainer.test_freq=0", "trainer.save_freq=0",
             f"device={TEST_DEVICE}", f"trainer.default_local_dir={tmp_path / 'run'}"]
    res = subprocess.run(["bash", "train.sh", "corridor", "turn_ppo", "env_module=ragen_style_envs", *micro],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "[warmstart] skipped: env_type corridor has no solve()" in res.stdout
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps] == [0, 1, 2]
    bad = subprocess.run(["bash", "train.sh", "corridor", "turn_ppo", "env_module=no_such_pkg", *micro],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "env_module='no_such_pkg' cannot be imported" in bad.stderr


# ---------------------------------------------------------------- RAGEN-2's collapse measures
def test_collapse_measures_hand_case():
    import math

    import torch

    from ragen_turn.algos.collapse import collapse_measures

    p = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.6, 0.2]], dtype=torch.float64).log()  # p(z_i | x_j)
    col = torch.tensor([0, 1, 0])
    m = collapse_measures(p, 3 * p, col)
    matched = np.log([0.9, 0.8, 0.6])
    marginal = np.log([0.5, 0.5, 0.4])
    assert m["collapse/mi_estimate"] == pytest.approx(np.mean(matched - marginal))
    assert m["collapse/mi_upper_bound"] == pytest.approx(math.log(2))
    assert m["collapse/conditional_entropy_est"] == pytest.approx(-np.mean(matched))
    assert m["collapse/reasoning_entropy_est"] == pytest.approx(-np.mean(marginal))
    assert m["collapse/mi_zscore"] == pytest.approx(np.mean((matched - marginal) / (np.std(marginal) + 1e-3)))
    assert m["collapse/retrieval_accuracy"] == pytest.approx(1.0) and m["collapse/retrieval_chance_level"] == 0.5
    # summed log-probs (3x each log-prob here): the same measures on sequences
    sm = 3 * matched
    sq = np.log([(0.9 ** 3 + 0.1 ** 3) / 2, (0.2 ** 3 + 0.8 ** 3) / 2, (0.6 ** 3 + 0.2 ** 3) / 2])
    assert m["collapse/mi_seq_estimate"] == pytest.approx(np.mean(sm - sq))
    assert m["collapse/mi_zscore_seq"] == pytest.approx(np.mean((sm - sq) / (np.std(sq) + 1e-3)))
    assert m["collapse/conditional_entropy_seq_est"] == pytest.approx(-np.mean(sm))


def test_collapse_measures_see_template_collapse():
    import torch

    from ragen_turn.algos.collapse import collapse_measures

    g = torch.Generator().manual_seed(0)
    same = torch.randn(12, 1, generator=g).expand(12, 4)  # reasoning as likely after any prompt
    col = torch.arange(12) % 4
    m = collapse_measures(same, same, col)
    assert m["collapse/mi_estimate"] == pytest.approx(0.0, abs=1e-12) and m["collapse/mi_zscore"] == pytest.approx(0.0)
    tied = torch.randn(12, 4, generator=g) - 5 * torch.nn.functional.one_hot(col, 4).logical_not()
    m2 = collapse_measures(tied, tied, col)
    assert 0 < m2["collapse/mi_estimate"] <= m2["collapse/mi_upper_bound"] + 1e-9
    assert collapse_measures(same[:, :1], same[:, :1], torch.zeros(12, dtype=torch.long)) == {}  # one prompt


def test_collapse_metrics_on_real_episodes():
    """Cross log-probs from the micro model agree with scoring each [x_j, <think>, z_i] alone."""
    import torch

    from ragen_turn.engines.local.collapse import collapse_metrics, cross_logprobs, first_turn_pairs
    from ragen_turn.models import load_model_and_tokenizer, sequence_logprobs
    from ragen_turn.rollout import ChatFormatter, EnvGroupManager, context_config, run_episodes

    cfg = micro_config(["agent_proxy.enable_think=true", "actor_rollout_ref.rollout.response_length=48",
                        "es_manager.train.env_groups=3", "es_manager.train.group_size=2"])
    model, tok = load_model_and_tokenizer({k: v for k, v in dict(cfg.model).items() if k != "warmstart"})
    thoughts = iter(["<think>box left</think><answer>Left</answer>", "<think>up</think><answer>Up</answer>",
                     "no think", "<think>push it</think><answer>Down</answer>"] * 3)
    envs = EnvGroupManager(cfg.custom_envs, cfg.es_manager.train, "train")
    eps = run_episodes(envs.assign_seeds(0, 0), TextPolicy(tok, lambda s: next(thoughts)), ChatFormatter(tok),
                       context_config(cfg))
    enc = lambda t: list(tok(t, add_special_tokens=False)["input_ids"])  # noqa: E731
    prompts, reasoning, groups = first_turn_pairs(eps, enc)
    assert len(prompts) == 3 and len(reasoning) == 5  # one of the six first answers does not think
    mean, total = cross_logprobs(model, prompts, reasoning, tok.pad_token_id, "cpu", micro_batch_size=2)
    for i, z in enumerate(reasoning):
        for j, g in enumerate(sorted(prompts)):
            ids = torch.tensor([prompts[g] + z])
            lp = sequence_logprobs(model, ids, torch.ones_like(ids))[0, len(prompts[g]):].detach()
            assert float(total[i, j]) == pytest.approx(float(lp.sum()), abs=1e-4)
            assert float(mean[i, j]) == pytest.approx(float(lp.mean()), abs=1e-4)
    m = collapse_metrics(model, tok, eps, "cpu")
    assert m["collapse/first_turn_valid_rate"] == pytest.approx(5 / 6)
    for key in ("collapse/mi_estimate", "collapse/mi_zscore", "collapse/conditional_entropy_est"):
        assert np.isfinite(m[key]), key


# ---------------------------------------------------------------- RAGEN's config keys
MAPPED = [  # RAGEN override(s) -> our key: value in the resolved config
    (["algo=token_ppo", "algorithm.bi_level_gae=True"], {"algorithm.adv_estimator": "bi_level_gae",
                                                          "algorithm.bi_level_gae_turn_ends": "rewards"}),
    (["algo=token_ppo", "algorithm.adv_estimator=gae"], {"algorithm.adv_estimator": "token_gae"}),
    (["algo=bi_level_gae", "algorithm.adv_estimator=gae", "algorithm.bi_level_gae=True"],
     {"algorithm.adv_estimator": "bi_level_gae"}),
    (["algorithm.bi_level_gae=False"], {"algorithm.adv_estimator": "turn_gae"}),
    (["actor_rollout_ref.rollout.val_kwargs.temperature=0.5"], {"actor_rollout_ref.rollout.val_temperature": 0.5}),
    (["actor_rollout_ref.rollout.val_kwargs.do_sample=False", "actor_rollout_ref.rollout.val_kwargs.temperature=0.5"],
     {"actor_rollout_ref.rollout.val_temperature": 0.0}),
    (["actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean"],
     {"actor_rollout_ref.actor.policy_loss.loss_agg_mode": "seq-mean-token-mean"}),
    (["actor_rollout_ref.actor.kl_loss_type=low-var-kl"], {"actor_rollout_ref.actor.kl_loss_type": "low_var_kl"}),
    (["actor_rollout_ref.actor.kl_loss_type=k2"], {"actor_rollout_ref.actor.kl_loss_type": "mse"}),
    (["trainer.logger=[console,wandb]"], {"logger": "wandb"}),
    (["trainer.logger=[console]"], {"logger": "console"}),
    (["trainer.project_name=myproj"], {"wandb.project": "myproj"}),
    (["seed.train=7"], {"seed": 7}),  # the run name: tests/test_run_names.py
    (["agent_proxy.max_context_window=-1", "agent_proxy.context_window_mode=full"], {"agent_proxy.max_turn": 2}),
    (["actor_rollout_ref.rollout.rollout_filter_value=0.5", "actor_rollout_ref.rollout_filter_strategy=top_k"],
     {"actor_rollout_ref.rollout.rollout_filter_ratio": 0.5,
      "actor_rollout_ref.rollout.rollout_filter_strategy": "top_k"}),
    (["actor_rollout_ref.rollout.rollout_filter_value=1.0"],
     {"actor_rollout_ref.rollout.rollout_filter_ratio": 1.0,
      "actor_rollout_ref.rollout.rollout_filter_strategy": "top_p"}),
    # RAGEN-2's command (its README: the strategy's path there lacks ".rollout")
    (["actor_rollout_ref.rollout_filter_strategy=top_p", "actor_rollout_ref.rollout.rollout_filter_value=0.9"],
     {"actor_rollout_ref.rollout.rollout_filter_ratio": 0.9,
      "actor_rollout_ref.rollout.rollout_filter_strategy": "top_p"}),
    (["actor_rollout_ref.model.path=/models/q"], {"model.path": "/models/q"}),
    (["enable_response_mask=True"], {"agent_proxy.max_turn": 2}),
    (["algorithm.kl_penalty=k3"], {"algorithm.kl_penalty": "low_var_kl"}),  # verl's names for its estimators
    (["critic.ppo_mini_batch_size=2", "critic.ppo_micro_batch_size_per_gpu=2"], {"ppo_mini_batch_size": 2}),
    (["actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1"],
     {"ppo_mini_batch_size": 4, "micro_batch_size_per_gpu": 1}),
    (["actor_rollout_ref.rollout.max_model_len=3600"], {"agent_proxy.max_context_tokens": 3600}),
    (["trainer.n_gpus_per_node=1"], {"engine.name": "local"}),
    (["engine=verl", "model=tiny", "trainer.n_gpus_per_node=4", "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
      "actor_rollout_ref.rollout.tensor_model_parallel_size=2"],
     {"trainer.n_gpus_per_node": 4, "engine.verl.gpu_memory_utilization": 0.3, "engine.verl.rollout_tp": 2}),
    (["lora.rank=0", "lora.alpha=64", "lora.target_modules=all-linear"], {"seed": 0}),
    (["lora.rank=64", "lora.alpha=32", "lora.target_modules=[q_proj,v_proj]"],
     {"actor_rollout_ref.model.lora_rank": 64, "actor_rollout_ref.model.lora_alpha": 32.0,
      "actor_rollout_ref.model.target_modules": ["q_proj", "v_proj"]}),
    (["collapse_detection.compute_freq=3", "collapse_detection.num_samples=all"],
     {"trainer.collapse_freq": 3, "trainer.collapse_num_samples": None}),
]

STOPPED = [  # RAGEN override(s) -> the message names our key
    (["actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-max"], "actor_rollout_ref.actor.policy_loss.loss_agg_mode"),
    (["actor_rollout_ref.actor.kl_loss_type=full"], "actor_rollout_ref.actor.kl_loss_type"),
    (["trainer.logger=[console,tensorboard]"], "our key is logger"),
    (["agent_proxy.max_context_window=1"], "agent_proxy.max_context_tokens"),
    (["agent_proxy.context_window_mode=single_turn"], "agent_proxy.max_context_tokens"),
    (["enable_response_mask=False"], "response_mask"),
    (["algorithm.kl_penalty=full"], "algorithm.kl_penalty takes kl (k1)"),
    (["critic.ppo_mini_batch_size=1"], "set ppo_mini_batch_size"),
    (["critic.ppo_micro_batch_size_per_gpu=1"], "set micro_batch_size_per_gpu"),
    (["actor_rollout_ref.rollout.tensor_model_parallel_size=2"], "engine.verl.rollout_tp"),
    (["trainer.n_gpus_per_node=8"], "trainer.n_gpus_per_node"),
    (["critic.model.lora_rank=8"], "actor_rollout_ref.model.lora_rank"),
    (["algo=grpo", "algorithm.adv_estimator=grpo", "algorithm.bi_level_gae=True"], "algorithm.adv_estimator=gae"),
]


@pytest.mark.parametrize("overrides,expected", MAPPED)
def test_ragen_keys_map_onto_ours_visibly(overrides, expected):
    from omegaconf import OmegaConf

    cfg = micro_config(overrides)
    for key, value in expected.items():
        assert OmegaConf.select(cfg, key) == value, key
    given = [o.split("=", 1)[0] for o in overrides if not o.startswith(("algo=", "engine=", "model="))]
    recorded = " ".join(cfg.ragen_aliases)
    assert all(k in recorded for k in given), (given, dict(cfg.ragen_aliases))  # visible in the resolved config


def test_ragens_filter_keys_are_ours():
    """RAGEN's rollout_filter_* keys (but its value, our rollout_filter_ratio) are our keys, under the same names."""
    from ragen_turn.config import FilterSpec, validate_config

    r = "actor_rollout_ref.rollout."
    cfg = micro_config([r + "rollout_filter_strategy=top_k_abs", r + "rollout_filter_ratio=1",
                        r + "rollout_filter_type=smallest", r + "rollout_filter_metric=reward",
                        r + "rollout_filter_include_zero=False",
                        r + "rollout_filter_top_p_prob_mode=softmax", r + "rollout_filter_selection_eps=0.02"])
    assert FilterSpec.from_config(cfg.actor_rollout_ref.rollout) == FilterSpec(
        value=1.0, strategy="top_k_abs", direction="smallest", metric="reward", include_zero=False,
        top_p_prob_mode="softmax", selection_eps=0.02)
    assert not cfg.ragen_aliases
    default = FilterSpec.from_config(micro_config([]).actor_rollout_ref.rollout)
    assert default.keeps_all and default.strategy == "top_k" and default.metric == "reward_variance"
    legacy = FilterSpec.from_config(micro_config([r + "rollout_filter_type=mean"]).actor_rollout_ref.rollout)
    assert (legacy.direction, legacy.metric) == ("largest", "reward")  # our earlier value: largest mean
    with pytest.raises(ValueError, match="rollout_filter_strategy"):
        validate_config(micro_config([r + "rollout_filter_strategy=top_q"]))
    with pytest.raises(ValueError, match="rollout_filter_ratio=1.5: rollout_filter_strategy=top_k takes a fraction"):
        validate_config(micro_config([r + "rollout_filter_value=1.5", r + "rollout_filter_strategy=top_k"]))
    with pytest.raises(ValueError, match="top_k_abs takes a whole number"):
        validate_config(micro_config([r + "rollout_filter_ratio=1.5", r + "rollout_filter_strategy=top_k_abs"]))


@pytest.mark.parametrize("overrides,names", STOPPED)
def test_ragen_keys_without_our_meaning_stop_naming_our_key(overrides, names):
    with pytest.raises(ValueError) as e:
        micro_config(overrides)
    assert names in str(e.value)


def test_every_ragen_key_is_tested_and_in_the_docs_table():
    from ragen_turn.ragen_keys import ALIASES

    from test_ragen_first_day import TESTED_KEYS  # verl's keys and RAGEN's Sept 2025 ones (issue 60)
    from test_ragen_first_hour import RAGEN_KEYS  # every RAGEN key with a sample value and its outcome

    tested = {o.split("=", 1)[0] for ovs, _ in MAPPED + STOPPED for o in ovs} | {k for k, *_ in RAGEN_KEYS}
    tested |= TESTED_KEYS
    doc = (ROOT / "docs" / "ragen_keys.md").read_text()
    for a in ALIASES:
        assert a.key in tested, a.key
        assert f"`{a.key}`" in doc, a.key


def test_ragen_keys_stop_the_command_line_before_work(tmp_path):
    res = subprocess.run(["bash", "train.sh", "sokoban", "turn_ppo", "critic.model.lora_rank=8",
                          f"trainer.default_local_dir={tmp_path / 'run'}"],
                         cwd=ROOT, env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 2 and "critic.model.lora_rank=8" in res.stderr and \
        "actor_rollout_ref.model.lora_rank" in res.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_readme_env_example_registers_and_plays(tmp_path, monkeypatch):
    """The README's `my_envs.py` as written: it registers, composes as env=lamps and its solve() solves it."""
    from ragen_turn.rollout import ChatFormatter, EnvGroupManager, context_config, run_episodes

    readme = (ROOT / "README.md").read_text()
    block = readme.split("For example, `my_envs.py`:", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "my_envs.py").write_text(block)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = micro_config(["env=lamps", "env_module=my_envs", "custom_envs.lamps.env_config.max_steps=4",
                        "actor_rollout_ref.rollout.response_length=32", "agent_proxy.max_turn=3"])
    assert cfg.custom_envs.lamps.env_config.max_steps == 4
    tok = tiny_tokenizer()
    envs = EnvGroupManager(cfg.custom_envs, cfg.es_manager.train, "train")

    def respond(slot):
        return "<answer>" + " || ".join(slot.env.ACTION_LOOKUP[a] for a in slot.env.solve()) + "</answer>"

    eps = run_episodes(envs.assign_seeds(0, 0), TextPolicy(tok, respond), ChatFormatter(tok), context_config(cfg))
    assert all(e.success and e.num_turns == 1 for e in eps)


# ---------------------------------------------------------------- RAGEN's metrics
def test_episode_metrics_per_tag_pass_at_k_and_effective_rate():
    from ragen_turn.engines.runlog import episode_metrics
    from ragen_turn.rollout import Episode, Trajectory

    def ep(g, tag, success, actions, valid, effective, dropped):
        return Episode(token_ids=[1, 2], response_mask=[0, 1], turn_ids=[-1, 0], turn_rewards=[1.0], group_id=g,
                       env_seed=g, tag=tag, success=success, num_actions=actions, num_valid_actions=valid,
                       num_effective_actions=effective, num_dropped_actions=dropped)

    eps = [ep(0, "A", True, 2, 2, 1, 0), ep(0, "A", False, 1, 1, 1, 1),   # group 0: one success
           ep(1, "A", False, 0, 0, 0, 3), ep(1, "A", False, 2, 1, 0, 0),   # group 1: none
           ep(2, "B", True, 1, 1, 1, 0), ep(2, "B", True, 1, 1, 1, 0)]     # group 2: both
    m = episode_metrics(Trajectory.from_episodes(eps, 0), "val")
    assert m["val/pass@2"] == pytest.approx(2 / 3)
    assert m["val/A/success"] == pytest.approx(1 / 4) and m["val/A/pass@2"] == pytest.approx(1 / 2)
    assert m["val/B/success"] == 1.0 and m["val/B/pass@2"] == 1.0
    assert m["val/A/actions"] == pytest.approx(5 / 4) and m["val/B/actions"] == 1.0  # RAGEN's <tag>/num_actions
    named = 7 + 4  # actions that reached the env + names dropped before it
    assert m["val/effective_action_rate"] == pytest.approx(4 / named)
    assert m["val/invalid_action_rate"] == pytest.approx((4 + 1) / named)


def test_collapse_measures_are_logged_every_collapse_freq_steps_when_thinking(tmp_path):
    from ragen_turn.engines.local.collapse import collapse_due
    from ragen_turn.engines.local.trainer import build_trainer

    cfg = micro_config(["agent_proxy.enable_think=true", "trainer.collapse_freq=2", "trainer.total_training_steps=3",
                        "actor_rollout_ref.rollout.response_length=48", "es_manager.train.env_groups=3"],
                       run_dir=tmp_path)
    assert [collapse_due(cfg, s) for s in (1, 2, 3, 4)] == [True, True, False, True]
    assert not collapse_due(micro_config(["trainer.collapse_freq=2"]), 2)  # no thinking, no measure
    trainer = build_trainer(cfg, log=_quiet)
    moves = iter(["Up", "Down", "Left", "Right"] * 100)
    trainer.sampler = TextPolicy(trainer.tokenizer,
                                 lambda s: f"<think>try {next(moves)}</think><answer>{next(moves)}</answer>")
    trainer.fit()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    have = {m["step"]: "collapse/mi_estimate" in m for m in lines if m["step"] > 0}
    assert have == {1: True, 2: True, 3: False}
    first = lines[1]
    for key in ("collapse/mi_zscore", "collapse/conditional_entropy_est", "collapse/first_turn_valid_rate"):
        assert np.isfinite(first[key]), key
    assert 0 <= first["collapse/retrieval_accuracy"] <= 1


def test_entry_points_register_envs(monkeypatch):
    """An installed package's ``ragen_turn.envs`` entry point is loaded (a module, or a function to call)."""
    import importlib.metadata as md

    import ragen_turn.envs as envs

    calls = []
    eps = [md.EntryPoint("doors", "ragen_style_envs", "ragen_turn.envs"),
           md.EntryPoint("fn", "tests_fake_pkg:setup", "ragen_turn.envs"),
           md.EntryPoint("broken", "no_such_module_xyz", "ragen_turn.envs")]
    fake = __import__("types").ModuleType("tests_fake_pkg")
    fake.setup = lambda: calls.append("called")
    monkeypatch.setitem(sys.modules, "tests_fake_pkg", fake)
    monkeypatch.setattr(md, "entry_points", lambda group=None: [e for e in eps if e.group == group])
    monkeypatch.setattr(envs, "_IMPORT_ERRORS", {})
    envs._load_entry_points()
    assert "two_doors" in envs.REGISTERED_ENVS and calls == ["called"]
    assert "no_such_module_xyz" in envs._IMPORT_ERRORS["broken"]


@pytest.mark.parametrize("override,key", [
    ("algorithm.bi_level_gae_turn_ends=tokens", "algorithm.bi_level_gae_turn_ends"),
    ("trainer.collapse_freq=-1", "trainer.collapse_freq"),
    ("trainer.collapse_num_samples=1", "trainer.collapse_num_samples"),
    ("model.warmstart.enable=maybe", "model.warmstart.enable"),
])
def test_new_keys_are_checked_before_work(override, key):
    from ragen_turn.config import validate_config

    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        validate_config(micro_config([override]))


def test_validate_config_maps_ragen_keys_and_imports_env_modules():
    """The one config check maps RAGEN's keys held on the config and imports env_module before checking envs."""
    from omegaconf import OmegaConf, open_dict

    from ragen_turn.config import validate_config

    cfg = micro_config(["algo=token_ppo"])
    with open_dict(cfg):
        OmegaConf.update(cfg, "ragen_keys.algorithm.bi_level_gae", True, force_add=True)
    validate_config(cfg)
    assert cfg.algorithm.adv_estimator == "bi_level_gae" and "algorithm.bi_level_gae=True" in cfg.ragen_aliases
