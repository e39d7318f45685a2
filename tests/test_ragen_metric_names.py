"""RAGEN's metric names (issue 60): the table in code (``engines/runlog.RAGEN_METRICS``) is the one in
docs/ragen_keys.md; wandb gets every number under our name and RAGEN's, with equal values (a local 2-step run);
``actor/ppo_kl`` / ``actor/pg_clipfrac`` / ``actor/pg_clipfrac_lower`` are verl's numbers (under .venv-verl)."""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch

from ragen_turn.engines.runlog import RAGEN_METRICS, with_ragen_names

from helpers import micro_config

ROOT = Path(__file__).resolve().parent.parent
needs_verl = pytest.mark.skipif(importlib.util.find_spec("verl") is None, reason="verl is not installed")


def test_the_docs_table_is_the_code_table():
    doc = (ROOT / "docs" / "ragen_keys.md").read_text().split("## RAGEN's metric names", 1)[1]
    rows = re.findall(r"^\| `([^`]+)` \| `([^`]+)` \|", doc.split("\n## ", 1)[0], flags=re.M)
    assert dict(rows) == RAGEN_METRICS and len(rows) == len(RAGEN_METRICS)


def test_with_ragen_names_copies_ours_and_keeps_what_is_there():
    m = {"env/CoordSokoban/success": 0.25, "env/CoordSokoban/pass@4": 0.5, "val/Bandit/actions": 1.0,
         "env/success": 0.3, "critic/value_loss": 0.7, "critic/vf_loss": 0.6, "perf/step_s": 2.0, "step": 3}
    out = with_ragen_names(m)
    assert {k: out[k] for k in m} == m  # ours stay
    assert out["train/CoordSokoban/success"] == 0.25 and out["train/CoordSokoban/pass@4"] == 0.5
    assert out["val-env/Bandit/num_actions"] == 1.0 and out["timing_s/step"] == 2.0
    assert out["critic/vf_loss"] == 0.6  # verl's own number is kept
    assert "train/success" not in out and len(out) == len(m) + 4


def test_a_local_run_logs_ragens_names_with_equal_values(tmp_path):
    """2 steps of turn_ppo (a critic) with logger=wandb: every table entry whose number the run has is logged under
    RAGEN's name with our value; metrics.jsonl keeps ours only."""
    from ragen_turn.engines.local.trainer import build_trainer

    from test_local_engine import mixed_policy

    class FakeWandb:
        logged: list = []

        def log(self, data, step):
            self.logged.append(dict(data))

    cfg = micro_config(["algo=turn_ppo", "logger=wandb", "trainer.test_freq=1"], run_dir=tmp_path)
    tr = build_trainer(cfg, log=lambda *a, **k: None)
    tr.sampler = mixed_policy(tr.tokenizer)
    tr.wandb = FakeWandb()
    tr.fit()
    logged = tr.wandb.logged
    assert [d["step"] for d in logged] == [0, 1, 2]
    last = logged[-1]
    tag = next(k.split("/")[1] for k in last if k.startswith("env/") and k.endswith("/success") and k.count("/") == 2)
    G = cfg.es_manager.train.group_size
    expected = {f"train/{tag}/success": f"env/{tag}/success", f"train/{tag}/pass@{G}": f"env/{tag}/pass@{G}",
                f"train/{tag}/num_actions": f"env/{tag}/actions", "train/response_length": "env/response_tokens",
                f"val-env/{tag}/success": f"val/{tag}/success", "actor/pg_clipfrac": "actor/clip_frac_token",
                "actor/pg_clipfrac_lower": "actor/dual_clip_frac", "critic/vf_loss": "critic/value_loss",
                "timing_s/step": "perf/step_s", "timing_s/gen": "perf/rollout_s", "timing_s/testing": "perf/val_s"}
    for ragen, ours in expected.items():
        assert last[ragen] == last[ours], ragen
    for same in ("actor/ppo_kl", "critic/score/mean", "critic/rewards/min", "critic/advantages/max",
                 "rollout/in_group_std", "actor/pg_loss", "critic/vf_clipfrac"):
        assert same in last, same
    assert last["critic/score/mean"] == last["critic/rewards/mean"]  # no in-reward KL
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert f"env/{tag}/success" in rows[-1] and f"train/{tag}/success" not in rows[-1]


def test_ppo_kl_is_k1_by_hand():
    from ragen_turn.algos import get_policy_loss_fn

    old = torch.tensor([[-1.0, -2.0, -0.5]])
    new = torch.tensor([[-1.5, -1.0, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    _, m = get_policy_loss_fn("token_ppo")(old_log_prob=old, log_prob=new, advantages=torch.ones(1, 3),
                                           response_mask=mask, config={})
    assert m["actor/ppo_kl"] == pytest.approx(((-1.0 + 1.5) + (-2.0 + 1.0)) / 2)


@needs_verl
def test_token_ppo_metrics_under_verls_names_are_verls():
    """Our token_ppo against verl's vanilla PPO loss (dual clip on): ppo_kl, pg_clipfrac, pg_clipfrac_lower."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla
    from verl.utils.config import omega_conf_to_dataclass

    from ragen_turn.algos import get_policy_loss_fn

    g = torch.Generator().manual_seed(0)
    old = -torch.rand(6, 10, generator=g) * 3
    new = old + torch.randn(6, 10, generator=g) * 0.4
    adv = torch.randn(6, 10, generator=g)
    mask = (torch.rand(6, 10, generator=g) > 0.2).float()
    actor = omega_conf_to_dataclass(OmegaConf.create({
        "_target_": "verl.workers.config.FSDPActorConfig", "strategy": "fsdp", "ppo_mini_batch_size": 6,
        "ppo_micro_batch_size_per_gpu": 6, "clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28,
        "clip_ratio_c": 3.0, "loss_agg_mode": "token-mean", "rollout_n": 1}))
    _, theirs = compute_policy_loss_vanilla(old, new, adv, mask, loss_agg_mode="token-mean", config=actor)
    _, ours = get_policy_loss_fn("token_ppo")(old_log_prob=old, log_prob=new, advantages=adv, response_mask=mask,
                                              config={"clip_ratio_low": 0.2, "clip_ratio_high": 0.28,
                                                      "clip_ratio_c": 3.0})
    named = with_ragen_names(ours)
    for k in ("actor/ppo_kl", "actor/pg_clipfrac", "actor/pg_clipfrac_lower"):
        assert named[k] == pytest.approx(float(theirs[k]), abs=1e-6), k


@needs_verl
def test_the_verl_trainer_logs_ragens_names_to_its_tracker(tmp_path, monkeypatch):
    """Our verl trainer (fake worker groups: test_verl) hands wandb's tracker ours and RAGEN's names."""
    import tempfile

    from ragen_turn.models import export_model
    from test_verl import MICRO_MODEL_CFG, _trainer_with_fake_workers

    class FakeTracker:
        logged: list = []

        def log(self, data, step):
            self.logged.append(dict(data))

    model_dir = str(export_model("tiny", tmp_path / "tiny_hf", model_cfg=MICRO_MODEL_CFG))
    t, _ = _trainer_with_fake_workers(model_dir, tmp_path / "run", "turn_ppo")
    t._make_tracker = FakeTracker
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    t.fit()
    last = FakeTracker.logged[-1]
    tag = next(k.split("/")[1] for k in last if k.startswith("env/") and k.endswith("/success") and k.count("/") == 2)
    assert last[f"train/{tag}/success"] == last[f"env/{tag}/success"]
    assert last[f"val-env/{tag}/success"] == last[f"val/{tag}/success"]
    assert last["actor/pg_clipfrac"] == last["actor/clip_frac_token"] and "critic/vf_loss" in last
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert f"train/{tag}/success" not in rows[-1]
