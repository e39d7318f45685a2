"""config/setting/*.yaml: the comparison settings compose, pass the config checks and make the demonstrations
they are meant to (long_horizon: LargerSokoban, one move per turn, up to 20 turns; long_turns: a long think)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers import micro_config, tiny_tokenizer
from ragen_turn.config import validate_config
from ragen_turn.compose import compose_config
from ragen_turn.warmstart import collect_demonstrations, warmstart_key

BASE = ["actor_rollout_ref.rollout.response_length=16"]
ASSETS = Path(__file__).resolve().parents[1] / "assets"


@pytest.mark.parametrize("setting", ["long_horizon", "long_turns"])
def test_setting_composes_and_validates(setting):
    validate_config(micro_config([f"+setting={setting}"]))
    cfg = compose_config([f"+setting={setting}", "seed=3"])
    assert cfg.trainer.default_local_dir == f"runs/sokoban_{setting}_turn_ppo_tiny_s3"  # never the default's dir


def test_long_horizon_is_one_move_per_turn_on_larger_sokoban():
    cfg = micro_config(["+setting=long_horizon"])
    assert list(cfg.env.train_tags) == ["LargerSokoban"] and list(cfg.env.val_tags) == ["LargerSokoban"]
    assert cfg.agent_proxy.max_actions_per_turn == 1 and cfg.custom_envs.LargerSokoban.max_actions_per_traj == 20
    assert compose_config(["+setting=long_horizon"]).agent_proxy.max_turn == 20
    cfg = micro_config(["+setting=long_horizon", "agent_proxy.max_turn=20"] + BASE)
    tok = tiny_tokenizer()
    demos = collect_demonstrations(cfg, tok, 4, seed=1)
    assert bool(demos.success.all())
    for i in range(demos.batch_size):
        text = tok.decode(demos.input_ids[i][demos.attention_mask[i].bool()])
        answers = re.findall(r"assistant\n<answer>(.*?)</answer>", text)
        assert answers and all(a in ("Up", "Down", "Left", "Right") for a in answers)  # one move per turn
        assert len(answers) == int(demos.turn_mask[i].sum())


@pytest.mark.parametrize("setting", ["long_horizon", "long_turns"])
def test_the_committed_warm_start_is_the_one_the_comparison_loads(setting):
    """assets/<setting>/warmstart/ holds exactly one warm start, under the key of the comparison's config
    (`scripts/compare.sh <setting>`: `+sweep=compare`), so a change to the setting's warm-start keys cannot leave
    the comparison silently training a new one (or the page describing another)."""
    cfg = compose_config(["env=sokoban", f"+setting={setting}", "+sweep=compare"])
    tok = tiny_tokenizer()
    committed = sorted(p.name for p in (ASSETS / setting / "warmstart").iterdir())
    assert committed == [warmstart_key(cfg, tok)]


def test_smollm2_gpu_setting_is_smollm2_with_one_sft_for_every_run():
    """config/setting/smollm2_gpu.yaml picks SmolLM2 itself (no committed warm start: it is built on the GPU) and
    pins the SFT seed, so the comparison's 20 runs share one warm start; the batch splits into whole micro-batches."""
    runs = [compose_config(["env=sokoban", "+setting=smollm2_gpu", "+sweep=compare", f"algo={a}", f"seed={s}"])
            for a, s in (("turn_ppo", 0), ("grpo", 4))]
    for cfg in runs:
        validate_config(cfg)
        assert cfg.model.name == "smollm2-135m" and cfg.model.warmstart.enable and cfg.model.warmstart.seed == 0
        kept = cfg.es_manager.train.env_groups * cfg.es_manager.train.group_size
        assert kept % cfg.ppo_mini_batch_size == 0 and cfg.ppo_mini_batch_size % cfg.micro_batch_size_per_gpu == 0
    assert runs[0].model.warmstart == runs[1].model.warmstart
    assert runs[1].trainer.default_local_dir == "runs/compare/sokoban_smollm2_gpu_grpo_smollm2-135m_s4"
    assert not (ASSETS / "smollm2_gpu").exists()
