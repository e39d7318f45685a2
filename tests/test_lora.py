"""LoRA on the actor (actor_rollout_ref.model.lora_rank / lora_alpha / target_modules): only the adapter trains,
the reference policy is the base with the adapter off, checkpoints hold the merged model (plain transformers) and
the adapter, and a resume gives the run that never stopped."""
from __future__ import annotations

import json

import pytest
import torch

from ragen_turn.config import model_config
from ragen_turn.engines.local.trainer import build_trainer
from ragen_turn.models import load_model_and_tokenizer, sequence_logprobs

from helpers import micro_config, resume_vs_uninterrupted
from test_local_engine import RESUME_ATOL, RESUME_RTOL, mixed_policy

pytest.importorskip("peft")

LORA = ["actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8",
        "actor_rollout_ref.actor.optim.lr=1e-2"]


def _quiet(*a, **k):
    pass


def _latest(run_dir):
    ckpts = run_dir / "checkpoints"
    return ckpts / (ckpts / "latest").read_text().strip()


def test_lora_trains_only_the_adapter_and_saves_a_merged_model(tmp_path):
    """Two steps of turn_ppo with a KL loss: the base weights stay bit-identical, every adapter matrix moves, the
    critic (a full copy) trains; the reference log-probs are the base model's; the checkpoint's actor/ loads with
    plain transformers and gives the adapter model's log-probs."""
    from transformers import AutoModelForCausalLM

    cfg = micro_config(LORA + ["algo=turn_ppo", "actor_rollout_ref.actor.use_kl_loss=true",
                               "actor_rollout_ref.actor.kl_loss_coef=0.1", "trainer.save_freq=1"], run_dir=tmp_path)
    tr = build_trainer(cfg, log=_quiet)
    tr.sampler = mixed_policy(tr.tokenizer)  # reward variance in every group
    named = dict(tr.actor.named_parameters())
    adapter = {n for n, p in named.items() if p.requires_grad}
    assert adapter and all(".lora_A." in n or ".lora_B." in n for n in adapter)
    assert {id(p) for g in tr.actor_optim.param_groups for p in g["params"]} == {id(named[n]) for n in adapter}
    before = {n: p.detach().clone() for n, p in named.items()}
    critic0 = [p.detach().clone() for p in tr.critic.parameters()]
    assert tr.ref is tr.actor  # no copy of the model for the reference

    base, _ = load_model_and_tokenizer(model_config(cfg))  # the model the run started from
    batch = tr.rollout(0)
    tr.score(batch)
    want = tr._forward_all(lambda *a: tr.logprobs(base, *a), batch)  # the same micro-batches, the plain model
    assert torch.equal(batch.ref_logp, want)

    tr.fit()
    row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert row["step"] == 2 and "actor/kl_loss" in row
    for n, p in tr.actor.named_parameters():
        if n in adapter:
            assert not torch.equal(p, before[n]), f"adapter weight {n} did not move"
        else:
            assert torch.equal(p, before[n]), f"base weight {n} changed"
    assert any(not torch.equal(p, q) for p, q in zip(tr.critic.parameters(), critic0))  # full critic trains

    ckpt = _latest(tmp_path)
    assert (ckpt / "actor_adapter" / "adapter_config.json").is_file()
    assert not (ckpt / "actor" / "adapter_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(ckpt / "actor", local_files_only=True)
    assert not any("lora" in k for k in merged.state_dict())
    with torch.no_grad():
        ids, am, pos = batch.input_ids, batch.attention_mask, batch.position_ids
        ours = sequence_logprobs(tr.actor, ids, am, pos, token_mask=batch.response_mask)
        theirs = sequence_logprobs(merged, ids, am, pos, token_mask=batch.response_mask)
        plain = sequence_logprobs(base, ids, am, pos, token_mask=batch.response_mask)
    assert torch.allclose(ours, theirs, atol=1e-5), (ours - theirs).abs().max()
    assert not torch.allclose(ours, plain, atol=1e-4)  # the adapter changed the policy

    # peft reads the adapter onto the base it names
    from peft import PeftModel

    base2, _ = load_model_and_tokenizer(model_config(cfg))
    with torch.no_grad():
        PeftModel.from_pretrained(base2, ckpt / "actor_adapter")  # injects the adapter into base2
        peft_lp = sequence_logprobs(base2, ids, am, pos, token_mask=batch.response_mask)
    assert torch.allclose(ours, peft_lp, atol=1e-5)


def test_lora_resume_matches_the_uninterrupted_run(tmp_path):
    common = LORA + ["algo=turn_ppo", "trainer.save_freq=1", "trainer.total_training_steps=3"]
    full, resumed, a, b = resume_vs_uninterrupted(tmp_path, common, stop_at=2)
    assert [r["step"] for r in a] == [r["step"] for r in b] == [0, 1, 2, 3]
    for ra, rb in zip(a, b):
        for k in ra:
            if not k.startswith("perf/"):
                assert ra[k] == pytest.approx(rb[k], rel=RESUME_RTOL, abs=RESUME_ATOL), (ra["step"], k)
    for (n, p1), p2 in zip(full.actor.named_parameters(), resumed.actor.parameters()):
        assert torch.allclose(p1, p2, atol=1e-6), n


def test_lora_keys_are_checked_before_any_work():
    from ragen_turn.config import validate_config

    with pytest.raises(ValueError, match=r"actor_rollout_ref\.model\.lora_rank=-1"):
        validate_config(micro_config(["actor_rollout_ref.model.lora_rank=-1"]))
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.model\.target_modules"):
        validate_config(micro_config(["actor_rollout_ref.model.target_modules=[]"]))
    with pytest.raises(ValueError, match=r"critic\.model\.lora_rank=8.*actor_rollout_ref\.model\.lora_rank"):
        micro_config(["critic.model.lora_rank=8"])
    cfg = micro_config(["lora.rank=64", "lora.alpha=64"])  # RAGEN's keys set the actor's
    assert (cfg.actor_rollout_ref.model.lora_rank, cfg.actor_rollout_ref.model.lora_alpha) == (64, 64.0)


@pytest.mark.parametrize("guard,flag", [
    (["actor_rollout_ref.actor.max_update_kl=1e-12", "actor_rollout_ref.actor.step_scale=live"],
     "actor/update_rolled_back"),
    (["actor_rollout_ref.actor.optim.lr=1e30"], "actor/weights_unsound"),
])
def test_lora_update_guards_put_the_adapter_back(guard, flag, tmp_path):
    """The rollback (max_update_kl) and the weights' soundness check restore the adapter (only it is copied)
    and never touch the frozen base."""
    cfg = micro_config(LORA + ["algo=grpo", "trainer.total_training_steps=1", "trainer.max_nonfinite_steps=5",
                               *guard], run_dir=tmp_path)
    tr = build_trainer(cfg, log=_quiet)
    tr.sampler = mixed_policy(tr.tokenizer)
    before = {n: p.detach().clone() for n, p in tr.actor.named_parameters()}
    tr.fit()
    row = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()][-1]
    assert row[flag] == 1.0, row
    for n, p in tr.actor.named_parameters():
        assert torch.equal(p, before[n]), n


def test_train_sh_base_lora_trains(tmp_path):
    """RAGEN's ``--config-name base-lora`` (its base + LoRA rank 64, alpha 64, all-linear) trains: its checkpoint
    holds the adapter beside the merged model."""
    from omegaconf import OmegaConf

    from helpers import ONE_STEP_RUN, sh

    run = tmp_path / "run"
    res = sh("train.sh", "--config-name", "base-lora", *ONE_STEP_RUN, f"trainer.default_local_dir={run}", timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "algo=token_ppo" in res.stdout
    cfg = OmegaConf.load(run / "config.yaml")
    m = cfg.actor_rollout_ref.model
    assert (m.lora_rank, m.lora_alpha, m.target_modules) == (64, 64, "all-linear")
    assert (cfg.actor_rollout_ref.actor.optim.lr, cfg.critic.optim.lr) == (1e-5, 1e-4)
    ckpt = _latest(run)
    assert (ckpt / "actor_adapter" / "adapter_config.json").is_file() and (ckpt / "actor" / "config.json").is_file()


def test_a_resume_that_switches_lora_on_or_off_is_refused_naming_the_key(tmp_path):
    full = build_trainer(micro_config(["algo=grpo", "trainer.total_training_steps=1"], run_dir=tmp_path), log=_quiet)
    full.fit()
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.model\.lora_rank: 0 -> 4"):
        build_trainer(micro_config(LORA + ["algo=grpo", "trainer.resume=true"], run_dir=tmp_path), log=_quiet)
