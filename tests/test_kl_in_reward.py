"""The KL penalty in the reward (verl's ``algorithm.use_kl_in_reward``, ``kl_ctrl``, ``kl_penalty``): hand cases
for the controllers, the per-token penalty and how each estimator takes it; the local engine's 2-step run; and,
under .venv-verl, the same numbers as verl's ``apply_kl_penalty``, ``AdaptiveKLController``, token GAE and GRPO.
"""
from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
import torch

from ragen_turn.algos import KLController, compute_grpo_advantages, compute_bi_level_gae, kl_controller, reward_kl
from ragen_turn.engines.advantages import compute_advantages, reward_kl_penalty
from ragen_turn.rollout import Trajectory

from helpers import micro_config

needs_verl = pytest.mark.skipif(importlib.util.find_spec("verl") is None, reason="verl is not installed")


# ------------------------------------------------------------------------------------------------ controllers
def test_fixed_controller_keeps_its_coefficient():
    c = KLController(0.05)
    c.update(3.0, 100)
    assert c.value == 0.05


@pytest.mark.parametrize("kl,expected", [(0.2, 0.1 * 1.02), (0.05, 0.1 * 0.98), (0.11, 0.1 * (1 + 0.1 * 10 / 100))])
def test_adaptive_controller_hand_cases(kl, expected):
    """beta *= 1 + clip(kl / target - 1, -0.2, 0.2) * n / horizon (target 0.1, n 10 rows, horizon 100)."""
    c = KLController(0.1, "adaptive", target_kl=0.1, horizon=100)
    c.update(kl, 10)
    assert c.value == pytest.approx(expected, rel=1e-12)


def test_controller_from_config_and_bad_adaptive_settings():
    assert kl_controller({"use_kl_in_reward": False, "kl_ctrl": {"kl_coef": 0.3}}) is None
    c = kl_controller({"use_kl_in_reward": True, "kl_ctrl": {"type": "adaptive", "kl_coef": 0.3, "target_kl": 2.0,
                                                             "horizon": 7}})
    assert (c.value, c.kind, c.target_kl, c.horizon) == (0.3, "adaptive", 2.0, 7)
    with pytest.raises(ValueError, match="horizon"):
        KLController(0.1, "adaptive", horizon=0)


def test_reward_kl_hand_case():
    """k1 per token (old - ref) on the response only; the step's KL: mean over rows of each row's token mean."""
    old = torch.tensor([[-1.0, -2.0, -7.0], [-0.5, -0.5, -0.5]])
    ref = torch.tensor([[-1.5, -1.0, 0.0], [-0.5, -1.5, -0.5]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 0.0]])
    kld, kl = reward_kl(old, ref, mask, "kl")
    assert torch.allclose(kld, torch.tensor([[0.5, -1.0, 0.0], [0.0, 1.0, 0.0]]))
    assert kl == pytest.approx(((0.5 - 1.0) / 2 + 1.0) / 2, rel=1e-6)
    kld3, _ = reward_kl(old, ref, mask, "low_var_kl")  # k3 = exp(ref - old) - (ref - old) - 1
    d = ref[0, 0] - old[0, 0]
    assert kld3[0, 0].item() == pytest.approx(float(torch.exp(d) - d - 1), rel=1e-6)


# ------------------------------------------------------------------------------------------------ estimators
def _batch():
    """3 episodes of one env group, 2 turns each, environment tokens between the turns."""
    turn_ids = torch.tensor([[0, 0, -1, 1, 1, -1], [0, -1, 1, 1, 1, -1], [0, 0, 0, -1, 1, -1]])
    rm = (turn_ids >= 0).float()
    b = Trajectory(input_ids=torch.ones(3, 6, dtype=torch.long), attention_mask=torch.ones(3, 6), response_mask=rm,
                   turn_ids=turn_ids, turn_rewards=torch.tensor([[0.0, 1.0], [0.5, 0.0], [0.0, 0.0]]),
                   turn_mask=torch.ones(3, 2), group_ids=torch.zeros(3, dtype=torch.long),
                   success=torch.zeros(3), episode_rewards=torch.tensor([1.0, 0.5, 0.0]))
    g = torch.Generator().manual_seed(0)
    b.old_logp = -torch.rand(3, 6, generator=g) * rm
    b.ref_logp = -torch.rand(3, 6, generator=g) * rm
    return b


HAND = ["agent_proxy.reward_normalization.method=identity", "algorithm.norm_adv=false", "algorithm.gamma=1.0",
        "algorithm.lam=1.0", "algorithm.norm_adv_by_std_in_grpo=false", "algorithm.use_kl_in_reward=true",
        "algorithm.kl_ctrl.kl_coef=0.5"]


def _penalised(algo):
    cfg = micro_config([f"algo={algo}"] + HAND)
    b = _batch()
    penalty, m = reward_kl_penalty(b, cfg, kl_controller(cfg.algorithm))
    kld = (b.old_logp - b.ref_logp) * b.response_mask
    assert torch.allclose(penalty, -0.5 * kld)
    assert m["actor/reward_kl_penalty_coeff"] == 0.5
    return cfg, b, penalty, kld


def _turn_sums(x, b):
    return torch.stack([torch.stack([x[i][b.turn_ids[i] == h].sum() for h in range(2)]) for i in range(3)])


def test_token_gae_takes_the_penalty_on_each_token():
    """verl's GAE on token_level_scores - beta * kl: with gamma = lam = 1 and values 0, A_t is the sum of the
    rewards of the response tokens from t on (the turn reward on its turn's last token)."""
    cfg, b, penalty, kld = _penalised("token_ppo")
    b.values = torch.zeros(3, 6)
    compute_advantages(b, cfg, penalty)
    for i in range(3):
        r = -0.5 * kld[i].clone()
        for h in range(2):
            r[(b.turn_ids[i] == h).nonzero().max()] += b.turn_rewards[i, h]
        expected = torch.tensor([r[t:][b.response_mask[i, t:].bool()].sum() for t in range(6)]) * b.response_mask[i]
        assert torch.allclose(b.advantages[i], expected, atol=1e-6), i


def test_grpo_scores_lose_the_summed_penalty():
    """verl's GRPO sums token_level_rewards: the episode's score minus beta x its summed KL."""
    cfg, b, penalty, kld = _penalised("grpo")
    compute_advantages(b, cfg, penalty)
    scores = b.turn_rewards.sum(dim=1) - 0.5 * kld.sum(dim=1)
    expected = compute_grpo_advantages(scores, b.group_ids, norm_by_std=False)[:, None] * b.response_mask
    assert torch.allclose(b.advantages, expected, atol=1e-6)
    cfg_off = micro_config(["algo=grpo"] + HAND[:-2])
    b_off = _batch()
    compute_advantages(b_off, cfg_off)
    assert not torch.allclose(b_off.advantages, b.advantages)  # the penalty changed something


def test_turn_gae_sums_the_penalty_into_each_turn():
    """Turn GAE without a critic (values 0), gamma = lam = 1: A_h = sum over turns l >= h of (r_l - beta x the KL
    summed over turn l's tokens)."""
    cfg, b, penalty, kld = _penalised("turn_ppo")
    compute_advantages(b, cfg, penalty)
    r = b.turn_rewards - 0.5 * _turn_sums(kld, b)
    turn_adv = torch.stack([r[:, 1] + r[:, 0], r[:, 1]], dim=1)
    for i in range(3):
        for h in range(2):
            on = b.turn_ids[i] == h
            assert torch.allclose(b.advantages[i][on], turn_adv[i, h].expand(int(on.sum())), atol=1e-6)
    assert torch.allclose(b.turn_returns, turn_adv, atol=1e-6)


def test_bi_level_gae_gets_the_penalty_per_turn():
    cfg, b, penalty, kld = _penalised("bi_level_gae")
    b.values = torch.rand(3, 6, generator=torch.Generator().manual_seed(1)) * b.response_mask
    compute_advantages(b, cfg, penalty)
    adv, _ = compute_bi_level_gae(b.turn_rewards - 0.5 * _turn_sums(kld, b), b.values, b.response_mask, 1.0, 1.0,
                                  0.95, "rewards")
    assert torch.allclose(b.advantages, adv, atol=1e-6)


def test_penalty_off_changes_nothing_and_needs_ref_logprobs():
    cfg = micro_config(["algo=grpo"])
    b = _batch()
    assert reward_kl_penalty(b, cfg, kl_controller(cfg.algorithm)) == (None, {})
    b.ref_logp = None
    with pytest.raises(ValueError, match="reference log-probs"):
        reward_kl_penalty(b, cfg, KLController(0.1))


# ------------------------------------------------------------------------------------------------ config
def test_ragens_use_base_line_composes_and_leaves_the_reward_alone():
    """RAGEN's $USE_BASE sets kl_ctrl.kl_coef without use_kl_in_reward: as in verl and RAGEN, no penalty."""
    from ragen_turn.config import validate_config

    cfg = micro_config(["algorithm.kl_ctrl.kl_coef=0.001", "actor_rollout_ref.actor.kl_loss_coef=0.001",
                        "actor_rollout_ref.actor.clip_ratio_high=0.2",
                        "actor_rollout_ref.rollout.rollout_filter_ratio=1"])
    validate_config(cfg)
    assert cfg.algorithm.kl_ctrl.kl_coef == 0.001 and kl_controller(cfg.algorithm) is None


@pytest.mark.parametrize("given,ours", [("k1", "kl"), ("k2", "mse"), ("k3", "low_var_kl"), ("low-var-kl", "low_var_kl"),
                                        ("k3+", "low_var_kl"), ("abs", "abs")])
def test_verls_estimator_names(given, ours):
    assert micro_config([f"algorithm.kl_penalty={given}"]).algorithm.kl_penalty == ours


@pytest.mark.parametrize("override,names", [("algorithm.kl_penalty=full", "algorithm.kl_penalty"),
                                            ("algorithm.kl_ctrl.type=pid", "algorithm.kl_ctrl.type"),
                                            ("algorithm.kl_ctrl.horizon=0", "algorithm.kl_ctrl.horizon")])
def test_bad_settings_stop_naming_the_key(override, names):
    from ragen_turn.config import validate_config

    with pytest.raises(ValueError, match=names.replace(".", r"\.")):
        validate_config(micro_config([override]))


# ------------------------------------------------------------------------------------------------ local engine
def test_local_two_steps_with_the_adaptive_penalty(tmp_path):
    """2 steps: the reference is the starting actor, so step 1's KL is 0 and step 2's (after an update) is not;
    the adaptive coefficient logged at step 2 is step 1's after its update (KL 0: x (1 - 0.2 n / horizon))."""
    from ragen_turn.engines.local.trainer import build_trainer

    from test_local_engine import mixed_policy

    cfg = micro_config(["algo=grpo", "algorithm.use_kl_in_reward=true", "algorithm.kl_penalty=low_var_kl",
                        "algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.kl_coef=0.2",
                        "algorithm.kl_ctrl.horizon=40", "actor_rollout_ref.actor.optim.lr=1e-2"], run_dir=tmp_path)
    tr = build_trainer(cfg, log=lambda *a, **k: None)
    assert tr.ref is not None and not cfg.actor_rollout_ref.actor.use_kl_loss
    tr.sampler = mixed_policy(tr.tokenizer)
    tr.fit()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    s1, s2 = [r for r in rows if r["step"] in (1, 2)]
    assert s1["actor/reward_kl_penalty"] == 0.0 and s1["actor/reward_kl_penalty_coeff"] == pytest.approx(0.2)
    assert s2["actor/reward_kl_penalty_coeff"] == pytest.approx(0.2 * (1 - 0.2 * s1["env/kept_episodes"] / 40))
    assert s2["actor/reward_kl_penalty"] > 0
    assert "actor/kl_loss" not in s2  # the in-reward KL adds no KL loss


# ------------------------------------------------------------------------------------------------ against verl
@needs_verl
@pytest.mark.parametrize("kind", ["kl", "abs", "mse", "low_var_kl"])
@pytest.mark.parametrize("ctrl", ["fixed", "adaptive"])
def test_same_numbers_as_verls_apply_kl_penalty(kind, ctrl):
    from verl import DataProto
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.ray_trainer import apply_kl_penalty

    cfg = {"type": ctrl, "kl_coef": 0.3, "target_kl": 0.05, "horizon": 50}
    theirs = core_algos.get_kl_controller(type("C", (), cfg)())
    ours = kl_controller({"use_kl_in_reward": True, "kl_ctrl": cfg})
    g = torch.Generator().manual_seed(3)
    for step in range(4):
        mask = (torch.rand(6, 9, generator=g) > 0.3).float()
        old, ref = -torch.rand(6, 9, generator=g) * 2, -torch.rand(6, 9, generator=g) * 2
        scores = torch.randn(6, 9, generator=g) * mask
        data = DataProto.from_dict(tensors={"response_mask": mask, "token_level_scores": scores,
                                            "old_log_probs": old, "ref_log_prob": ref})
        data, their_m = apply_kl_penalty(data, theirs, kl_penalty=kind)
        kld, kl = reward_kl(old, ref, mask, kind)
        beta = ours.value
        ours.update(kl, 6)
        assert torch.allclose(data.batch["token_level_rewards"], scores - beta * kld, atol=1e-6), step
        assert their_m["actor/reward_kl_penalty"] == pytest.approx(kl, rel=1e-5, abs=1e-7)
        assert their_m["actor/reward_kl_penalty_coeff"] == pytest.approx(beta, rel=1e-12)
        assert theirs.value == pytest.approx(ours.value, rel=1e-12)


@needs_verl
def test_token_gae_and_grpo_with_the_penalty_match_verl():
    """One turn per row (verl's layout: the response tokens contiguous): our estimators with the penalty against
    verl's GAE and GRPO on token_level_rewards = scores - beta * kl."""
    from verl.trainer.ppo import core_algos

    lens = torch.tensor([5, 3, 6, 4])
    mask = (torch.arange(6)[None, :] < lens[:, None]).float()
    turn_ids = torch.where(mask.bool(), 0, -1)
    g = torch.Generator().manual_seed(5)
    old, ref = -torch.rand(4, 6, generator=g) * mask, -torch.rand(4, 6, generator=g) * mask
    values = torch.randn(4, 6, generator=g) * mask
    b = Trajectory(input_ids=torch.ones(4, 6, dtype=torch.long), attention_mask=torch.ones(4, 6), response_mask=mask,
                   turn_ids=turn_ids, turn_rewards=torch.tensor([[1.0], [0.0], [0.5], [1.0]]),
                   turn_mask=torch.ones(4, 1), group_ids=torch.tensor([0, 0, 1, 1]), success=torch.zeros(4),
                   episode_rewards=torch.zeros(4))
    b.old_logp, b.ref_logp, b.values = old, ref, values
    scores = torch.zeros(4, 6).scatter(1, (lens - 1)[:, None], b.turn_rewards)
    kld, _ = reward_kl(old, ref, mask, "kl")
    token_rewards = scores - 0.2 * kld
    for algo in ("token_ppo", "grpo"):
        cfg = micro_config([f"algo={algo}", "agent_proxy.reward_normalization.method=identity",
                            "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.kl_coef=0.2",
                            "algorithm.gamma=0.9", "algorithm.lam=0.8"])
        penalty, _ = reward_kl_penalty(b, cfg, kl_controller(cfg.algorithm))
        compute_advantages(b, cfg, penalty)
        if algo == "token_ppo":
            adv, ret = core_algos.compute_gae_advantage_return(token_rewards, values, mask, 0.9, 0.8)
            assert torch.allclose(b.returns, ret, atol=1e-5)
        else:
            adv, _ = core_algos.compute_grpo_outcome_advantage(token_rewards, mask, np.array([0, 0, 1, 1]))
        assert torch.allclose(b.advantages, adv * mask, atol=1e-5), algo  # verl's whitening leaves the padding on


@needs_verl
def test_verl_config_builds_the_reference_for_the_reward_penalty(tmp_path):
    """Our keys reach verl's algorithm config, and verl builds a reference worker for it (no KL loss)."""
    from verl.trainer.ppo.utils import need_reference_policy

    from ragen_turn.models import export_model
    from test_verl import MICRO_MODEL_CFG, verl_cfg

    model_dir = str(export_model("tiny", tmp_path / "tiny_hf", model_cfg=MICRO_MODEL_CFG))
    _, vcfg = verl_cfg(model_dir, "algorithm.use_kl_in_reward=true", "algorithm.kl_penalty=k3",
                       "algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.horizon=77")
    assert vcfg.algorithm.use_kl_in_reward and vcfg.algorithm.kl_penalty == "low_var_kl"
    assert (vcfg.algorithm.kl_ctrl.type, vcfg.algorithm.kl_ctrl.horizon) == ("adaptive", 77)
    assert need_reference_policy(vcfg) and not vcfg.actor_rollout_ref.actor.use_kl_loss


class FakeRefWG:
    """The reference worker group: every token's log-prob -0.3 (the fake actor's are 0: k1 = 0.3 a token)."""

    def compute_ref_log_prob(self, td):
        from verl.utils import tensordict_utils as tu

        n = int(td["input_ids"].values().numel())
        return tu.get_tensordict({"log_probs": torch.full((n,), -0.3)})


@needs_verl
@pytest.mark.parametrize("algo", ["grpo", "turn_ppo"])
def test_verl_trainer_applies_the_penalty(tmp_path, algo, monkeypatch):
    """Our verl trainer's train_step (fake worker groups: test_verl) with the adaptive penalty: verl's metric names,
    the controller's update between the steps, and verl's critic/rewards below critic/score by beta x the KL."""
    import tempfile

    from ragen_turn.models import export_model
    from test_verl import MICRO_MODEL_CFG, _trainer_with_fake_workers

    model_dir = str(export_model("tiny", tmp_path / "tiny_hf", model_cfg=MICRO_MODEL_CFG))
    t, _ = _trainer_with_fake_workers(model_dir, tmp_path / "run", algo, "algorithm.use_kl_in_reward=true",
                                      "algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.kl_coef=0.1",
                                      "algorithm.kl_ctrl.target_kl=0.1", "algorithm.kl_ctrl.horizon=100")
    assert t.use_reference_policy
    t.ref_in_actor, t.ref_policy_wg = False, FakeRefWG()
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    seen, own = [], t.compute_advantages

    def compute_advantages(batch, traj):
        out = own(batch, traj)
        seen.append({k: batch.batch[k].clone() for k in ("token_level_scores", "token_level_rewards", "response_mask")})
        return out

    t.compute_advantages = compute_advantages
    t.fit()
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    s1, s2 = [r for r in rows if r["step"] in (1, 2)]
    assert s1["actor/reward_kl_penalty"] == pytest.approx(0.3, rel=1e-5)
    assert s1["actor/reward_kl_penalty_coeff"] == pytest.approx(0.1)
    n = s1["env/kept_episodes"]
    assert s2["actor/reward_kl_penalty_coeff"] == pytest.approx(0.1 * (1 + 0.2 * n / 100), rel=1e-6)
    # verl's token_level_rewards (its critic/rewards/* metrics): each response token's score minus beta x 0.3
    for m, beta in zip(seen, (s1["actor/reward_kl_penalty_coeff"], s2["actor/reward_kl_penalty_coeff"])):
        expected = m["token_level_scores"] - beta * 0.3 * m["response_mask"].float()
        assert torch.allclose(m["token_level_rewards"], expected, atol=1e-6)
    assert s2["critic/rewards/mean"] < s2["critic/score/mean"]
