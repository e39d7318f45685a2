"""LoRA on the verl engine: our keys become verl's (the actor only; the critic stays full), and two real steps
(a local Ray cluster, verl's FSDP2 workers on CPU, the hf rollout) train the adapter and leave the base as it was.

Needs verl 0.9.1 and peft (the verl and lora extras, as CI installs them in .venv-verl).
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest
import torch

from helpers import micro_config

pytestmark = pytest.mark.skipif(importlib.util.find_spec("verl") is None or importlib.util.find_spec("peft") is None,
                                reason="needs verl and peft (pip install -e '.[verl,lora]')")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MICRO = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64)
LORA = ["actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8",
        "actor_rollout_ref.model.target_modules=[q_proj,v_proj,up_proj]"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from ragen_turn.models import export_model

    return export_model("tiny", tmp_path_factory.mktemp("tiny_hf"), model_cfg=MICRO)


def test_lora_keys_map_to_verls_actor_only(model_dir):
    from ragen_turn.engines.verl import build_verl_config
    from ragen_turn.engines.verl.config import check_verl_config

    cfg = micro_config(["engine=verl", "model=tiny", f"model.path={model_dir}", "model.warmstart.enable=false",
                        "algo=turn_ppo", "actor_rollout_ref.actor.use_kl_loss=true", *LORA])
    vcfg = build_verl_config(cfg)
    m = vcfg.actor_rollout_ref.model
    assert (m.lora_rank, m.lora_alpha, list(m.target_modules)) == (4, 8, ["q_proj", "v_proj", "up_proj"])
    assert m.lora.merge is True  # the rollout gets base + adapter as plain tensors
    assert vcfg.critic.model.get("lora_rank", 0) == 0  # the critic is fully fine-tuned
    built = check_verl_config(vcfg)  # verl's own classes and checks accept it
    assert built["model"].lora_rank == 4 and built["model"].target_modules == ["q_proj", "v_proj", "up_proj"]
    plain = build_verl_config(micro_config(["engine=verl", "model=tiny", f"model.path={model_dir}",
                                            "model.warmstart.enable=false"]))
    assert plain.actor_rollout_ref.model.lora_rank == 0 and not plain.actor_rollout_ref.model.lora.get("merge")


def _shard(path):
    state = torch.load(path, weights_only=False, map_location="cpu")
    return {k: (v.to_local() if hasattr(v, "to_local") else v) for k, v in state.items()}


def test_two_verl_steps_train_only_the_adapter(model_dir, tmp_path):
    """Two steps with verl's real workers (as CI's verl run), a KL loss to the reference (verl: the actor with its
    adapter off): the adapter moved, the base weights are the model's own, the critic has no adapter."""
    from safetensors.torch import load_file

    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "ragen_turn.train", "env=sokoban", "algo=turn_ppo", "engine=verl", "model=tiny",
           f"model.path={model_dir}", "model.warmstart.enable=false", *[f"model.{k}={v}" for k, v in MICRO.items()],
           "trainer.total_training_steps=2", "es_manager.train.env_groups=2", "es_manager.train.group_size=4",
           "ppo_mini_batch_size=8", "micro_batch_size_per_gpu=4", "es_manager.val.env_groups=2",
           "agent_proxy.max_turn=2", "actor_rollout_ref.rollout.response_length=8",
           "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.optim.lr=1e-2", *LORA,
           f"trainer.default_local_dir={run}"]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert math.isfinite(rows[-1]["actor/pg_loss"]) and rows[-1]["actor/kl_loss"] > 0  # adapter on vs off

    actor = _shard(run / "global_step_2" / "actor" / "model_world_size_1_rank_0.pt")
    lora_b = {k: v for k, v in actor.items() if ".lora_B." in k}
    assert lora_b and all(float(v.abs().max()) > 0 for v in lora_b.values())  # B starts at zero: it trained
    assert all(any(f".{t}." in k for t in ("q_proj", "v_proj", "up_proj")) for k in lora_b)
    base = load_file(str(model_dir / "model.safetensors"))
    prefix = "base_model.model."
    for k, v in actor.items():
        if ".lora_" in k:
            continue
        name = k[len(prefix):].replace(".base_layer.", ".")
        if name == "lm_head.weight" and name not in base:  # tied to the input embeddings
            name = "model.embed_tokens.weight"
        assert torch.equal(v.float(), base[name].float()), f"base weight {name} changed"
    critic = _shard(run / "global_step_2" / "critic" / "model_world_size_1_rank_0.pt")
    assert not any("lora" in k for k in critic)
