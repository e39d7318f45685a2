"""Warm start (SFT on solver demonstrations): demonstrations, the loss going down, the cache and its key."""
from __future__ import annotations

import copy
import json

import pytest
import torch
from omegaconf import OmegaConf

from helpers import micro_config, tiny_tokenizer
from ragen_turn.models import load_model_and_tokenizer
from ragen_turn.warmstart import cache_dir, collect_demonstrations, warmstart, warmstart_key, warmstart_seed

WS = ["model.warmstart.enable=true", "model.warmstart.episodes=16", "model.warmstart.steps=30",
      "model.warmstart.batch_size=8", "model.warmstart.lr=3e-3", "agent_proxy.max_turn=5",
      "model.warmstart.actions_per_turn=[2,3]", "custom_envs.SimpleSokoban.max_actions_per_traj=15"]


def test_key_and_seed_pinning():
    tok = tiny_tokenizer()
    per_seed = [micro_config(WS + [f"seed={s}"]) for s in (0, 1)]
    assert [warmstart_seed(c) for c in per_seed] == [0, 1]
    assert warmstart_key(per_seed[0], tok) != warmstart_key(per_seed[1], tok)
    pinned = [micro_config(WS + [f"seed={s}", "model.warmstart.seed=0"]) for s in (0, 1, 2)]
    assert [warmstart_seed(c) for c in pinned] == [0, 0, 0]
    # pinning to the run's own seed is the same SFT as leaving it null (the key does not see the spelling)
    assert {warmstart_key(c, tok) for c in pinned} == {warmstart_key(per_seed[0], tok)}
    # anything that changes the SFT changes the key
    assert warmstart_key(micro_config(WS + ["model.warmstart.steps=31"]), tok) != warmstart_key(per_seed[0], tok)
    assert warmstart_key(micro_config(WS + ["agent_proxy.max_turn=4"]), tok) != warmstart_key(per_seed[0], tok)
    # the model it starts from: a copy-pretrained tiny model is another start; 0 steps is the plain model's key
    assert warmstart_key(micro_config(WS + ["model.copy_pretrain_steps=5"]), tok) != warmstart_key(per_seed[0], tok)
    assert warmstart_key(micro_config(WS + ["model.copy_pretrain_steps=0"]), tok) == warmstart_key(per_seed[0], tok)
    assert warmstart_key(micro_config(WS + ["model.rl_lr=1e-5"]), tok) == warmstart_key(per_seed[0], tok)  # RL only
    # where a committed copy may come from is not what the SFT is
    assert warmstart_key(micro_config(WS + ["model.pinned_cache=/x"]), tok) == warmstart_key(per_seed[0], tok)
    # rewards the demonstrations never see (Sokoban's deadlock penalty and distance shaping), and an end by deadlock
    # that the solver never reaches, share the SFT
    env_keys = ["deadlock_penalty=-3", "end_on_deadlock=true", "distance_shaping=0.25"]
    dead = micro_config(WS + [f"+custom_envs.SimpleSokoban.env_config.{k}" for k in env_keys])
    assert dead.custom_envs.SimpleSokoban.env_config.deadlock_penalty == -3
    assert dead.custom_envs.SimpleSokoban.env_config.end_on_deadlock is True
    assert warmstart_key(dead, tok) == warmstart_key(per_seed[0], tok)
    assert warmstart_key(micro_config(WS + ["custom_envs.SimpleSokoban.env_config.max_steps=50"]), tok) \
        != warmstart_key(per_seed[0], tok)  # not every env key is left out
    # mixed precision changes the numbers, so the key; off (null) keeps the key it had before the option existed
    assert (warmstart_key(micro_config(WS + ["model.warmstart.autocast=bfloat16"]), tok)
            != warmstart_key(per_seed[0], tok))
    assert warmstart_key(micro_config(WS + ["model.warmstart.autocast=null"]), tok) == warmstart_key(per_seed[0], tok)


def test_sweeps_pin_the_warm_start():
    for sweep in ("algos", "gamma_lambda", "batch_design", "critic_lr"):
        assert warmstart_seed(micro_config([f"+sweep={sweep}", "seed=2"])) == 0, sweep


def test_demonstrations_solve_and_sft_lowers_the_loss_then_caches(tmp_path, monkeypatch):
    monkeypatch.setenv("RAGEN_TURN_CACHE_DIR", str(tmp_path))
    cfg = micro_config(WS)
    model, tok = load_model_and_tokenizer(OmegaConf.to_container(cfg.model, resolve=True))
    demos = collect_demonstrations(cfg, tok, 8, seed=3)
    assert demos.batch_size == 8 and bool(demos.success.all())  # the solver finishes within the turn budget
    assert int(demos.response_mask.sum()) > 0
    lines = []
    trained = warmstart(model, tok, cfg, log=lines.append)
    path = cache_dir(cfg, tok)
    stats = json.loads((path / "warmstart.json").read_text())
    first = float(next(l for l in lines if "sft step 1/" in l).split("nll ")[1].split()[0])
    assert stats["sft/final_nll"] < 0.7 * first, (first, stats)
    assert stats["demo_success"] == 1.0
    # a second run loads the cached weights instead of training again
    fresh, _ = load_model_and_tokenizer(OmegaConf.to_container(cfg.model, resolve=True))
    lines2 = []
    loaded = warmstart(fresh, tok, cfg, log=lines2.append)
    assert any("loaded cached warm start" in l for l in lines2) and not any("sft step" in l for l in lines2)
    for (n, p), q in zip(trained.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(p.cpu(), q.cpu()), n


def test_sft_under_bf16_autocast_learns_like_float32_and_keeps_float32_weights():
    """autocast=bfloat16 runs the forward's matmuls in bf16 (fp32 weights, grads, AdamW): the loss falls as in float32,
    to within bf16's rounding, and the weights it leaves are float32 and differ from the float32 run's."""
    from ragen_turn.warmstart import sft

    cfg32, cfg16 = micro_config(WS), micro_config(WS + ["model.warmstart.autocast=bfloat16"])
    model, tok = load_model_and_tokenizer(OmegaConf.to_container(cfg32.model, resolve=True))
    demos = collect_demonstrations(cfg32, tok, 8, seed=3)
    runs = {}
    for name, cfg in (("fp32", cfg32), ("bf16", cfg16)):
        m = copy.deepcopy(model)
        lines = []
        stats = sft(m, demos, cfg, torch.device("cpu"), log=lines.append)
        first = float(next(l for l in lines if "sft step 1/" in l).split("nll ")[1].split()[0])
        runs[name] = (first, stats["sft/final_nll"], m)
    (f32, last32, m32), (f16, last16, m16) = runs["fp32"], runs["bf16"]
    assert abs(f16 - f32) < 0.05 * f32  # the same first batch, rounded in bf16
    assert last16 < 0.7 * f16 and abs(last16 - last32) < 0.15 * last32
    assert all(p.dtype == torch.float32 for p in m16.parameters())
    assert any(not torch.equal(p, q) for p, q in zip(m16.parameters(), m32.parameters()))


def test_sft_in_micro_batches_takes_the_batch_step(monkeypatch):
    """micro_batch_size only splits each batch's forward and backward (length-sorted): the same NLL and weights as
    the whole batch in one forward, to float rounding."""
    from ragen_turn.warmstart import sft

    cfg = micro_config(WS + ["model.warmstart.steps=3"])
    model, tok = load_model_and_tokenizer(OmegaConf.to_container(cfg.model, resolve=True))
    demos = collect_demonstrations(cfg, tok, 8, seed=3)
    assert demos.attention_mask.sum(dim=1).unique().numel() > 1  # rows of several lengths: the chunks differ
    from ragen_turn.rollout import Trajectory

    chunks = []  # the widths of the micro-batches each SFT step ran
    split = Trajectory.micro_batches
    monkeypatch.setattr(Trajectory, "micro_batches", lambda self, size: chunks.append(
        [len(c) for c in split(self, size)]) or split(self, size))
    runs = {}
    for micro in (0, 3):
        chunks.clear()
        run_cfg = micro_config(WS + ["model.warmstart.steps=3", f"model.warmstart.micro_batch_size={micro}"])
        m = copy.deepcopy(model)
        runs[micro] = (sft(m, demos, run_cfg, torch.device("cpu"), log=lambda s: None)["sft/final_nll"], m)
        assert chunks == [[8]] * 3 if micro == 0 else chunks == [[3, 3, 2]] * 3, (micro, chunks)
    assert runs[3][0] == pytest.approx(runs[0][0], rel=1e-5)
    moved = [not torch.equal(p, q) for p, q in zip(runs[0][1].parameters(), model.parameters())]
    assert any(moved)
    for p, q in zip(runs[0][1].parameters(), runs[3][1].parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6)
    assert warmstart_key(micro_config(WS + ["model.warmstart.micro_batch_size=3"]), tok) == \
        warmstart_key(micro_config(WS), tok)  # memory and speed only: the same cached warm start


def test_fit_turn_budget_makes_demonstrations_finish_in_the_turns():
    """One action per answer runs out of turns on rooms with long solutions; fit_turn_budget answers at least
    ceil(solution left / turns left) actions, so every room whose solution fits the action budget is solved."""
    tok = tiny_tokenizer()
    base = ["agent_proxy.max_turn=5", "model.warmstart.actions_per_turn=[1,1]", "es_manager.train.env_groups=1"]
    plain = collect_demonstrations(micro_config(base), tok, 128, seed=3)
    fit = collect_demonstrations(micro_config(base + ["model.warmstart.fit_turn_budget=true"]), tok, 128, seed=3)
    assert [e.env_seed for e in plain.episodes] == [e.env_seed for e in fit.episodes]  # the same rooms
    assert plain.success.mean() < 0.9  # RAGEN's rooms: a quarter need more than 5 steps
    assert fit.success.mean() > 0.98
    for e in fit.episodes:
        assert e.num_turns <= 5 and all(t.count("||") <= 4 for t in e.texts)


def test_state_plan_think_restates_the_grid_and_plans_ahead():
    """model.warmstart.think=state_plan (the long_turns setting): each demonstration turn is
    <think>State:\\n<the grid of this turn's observation>\\nPlan: <the solver's whole plan>.</think><answer><the
    plan's first 1-2 moves></answer>, and the demonstrations still solve the rooms."""
    import re

    cfg = micro_config(["+setting=long_turns", "actor_rollout_ref.rollout.response_length=96",
                        "agent_proxy.max_turn=5", "custom_envs.SimpleSokoban.max_actions_per_traj=15"])
    assert cfg.agent_proxy.enable_think and cfg.model.warmstart.think == "state_plan"
    tok = tiny_tokenizer()
    demos = collect_demonstrations(cfg, tok, 6, seed=5)
    assert bool(demos.success.all())
    turn = re.compile(r"State:\n(.*?)\nYou have.*?<\|im_start\|>assistant\n<think>State:\n(.*?)\nPlan: (.*?)\.</think>"
                      r"<answer>(.*?)</answer>", re.DOTALL)
    n_turns = 0
    for i in range(demos.batch_size):
        text = tok.decode(demos.input_ids[i][demos.attention_mask[i].bool()])
        for obs, restated, plan, answer in turn.findall(text):
            n_turns += 1
            assert restated == obs.strip()                       # the think copies the grid it was shown
            plan, moves = plan.split(", "), answer.split(" || ")
            assert 1 <= len(moves) <= 2 and plan[:len(moves)] == moves  # the answer is the plan's start
    assert n_turns >= demos.batch_size
    # think tokens: the long turns this setting is for (about 60 sampled tokens per turn at 6x6)
    per_turn = demos.response_mask.sum(1).float() / demos.turn_mask.sum(1).float()
    assert float(per_turn.mean()) > 45
    # the think format is part of the cache key; an unknown one stops before any work
    assert warmstart_key(cfg, tok) != warmstart_key(micro_config(["+setting=long_turns", "model.warmstart.think=plan"]),
                                                    tok)
    from ragen_turn.warmstart import warmstart_enabled

    with __import__("pytest").raises(ValueError, match="model.warmstart.think"):
        warmstart_enabled(micro_config(["model.warmstart.think=free"]))


@pytest.mark.parametrize("think", ["simulate", "state_simulate"])
def test_simulate_think_writes_the_grid_after_each_action_but_the_last(think):
    """model.warmstart.think=simulate: a two-action answer thinks ``<first action>:\n<the grid after it>``, a
    one-action answer thinks nothing; state_simulate puts ``State:\n<the grid before the turn>`` first in both;
    checked by replaying each demonstration in a fresh env of the same seed."""
    import re

    from envs.sokoban.env import SokobanEnv

    cfg = micro_config(["agent_proxy.enable_think=true", f"model.warmstart.think={think}", "agent_proxy.max_turn=5",
                        "actor_rollout_ref.rollout.response_length=160", "model.warmstart.actions_per_turn=[1,2]",
                        "custom_envs.SimpleSokoban.max_actions_per_traj=10"])
    tok = tiny_tokenizer()
    demos = collect_demonstrations(cfg, tok, 8, seed=3)
    answer = re.compile(r"<\|im_start\|>assistant\n<think>(.*?)</think><answer>(.*?)</answer>", re.DOTALL)
    env_cfg = OmegaConf.to_container(cfg.custom_envs.SimpleSokoban.env_config, resolve=True)
    seen = {1: 0, 2: 0}
    for i, ep in enumerate(demos.episodes):
        env = SokobanEnv(env_cfg)
        env.reset(seed=ep.env_seed)
        for thought, moves in answer.findall(tok.decode(demos.input_ids[i][demos.attention_mask[i].bool()])):
            moves = moves.split(" || ")
            seen[len(moves)] += 1
            state = [f"State:\n{env.render().strip()}"] if think == "state_simulate" else []
            if len(moves) == 1:
                assert thought == "\n".join(state)
            else:
                first = env.copy()
                first.step(moves[0])
                assert thought == "\n".join(state + [f"{moves[0]}:\n{first.render().strip()}"])
            for m in moves:
                env.step(m)
        assert env.success == ep.success
    assert seen[1] and seen[2]  # both kinds of answer were checked
    with pytest.raises(ValueError, match="env.copy"):
        from ragen_turn.warmstart import THINK_FORMATS
        THINK_FORMATS[think](object(), ["Up", "Left"], ["Up", "Left"])


def test_actions_as_shown_writes_webshop_ids_as_the_page_shows_them():
    """model.warmstart.actions_as_shown=true (env=webshop): demonstrations click products by the ASIN as the page
    prints it (capitals, copyable), not WebShop's lower-case label, and still buy the goal; the option is part of
    the cache key only when on (earlier keys stay), and an env with no as_shown() is refused by name."""
    import re

    pytest.importorskip("bm25s")
    tok = tiny_tokenizer()
    base = ["env=webshop", "es_manager.train.env_groups=1", "agent_proxy.max_turn=9",
            "actor_rollout_ref.rollout.response_length=32"]
    assert micro_config(base).model.warmstart.actions_as_shown  # config/env/webshop.yaml turns it on
    off, on = base + ["model.warmstart.actions_as_shown=false"], base + ["model.warmstart.actions_as_shown=true"]
    plain = collect_demonstrations(micro_config(off), tok, 4, seed=1)
    shown = collect_demonstrations(micro_config(on), tok, 4, seed=1)
    assert bool(shown.success.all()) and bool(plain.success.all())

    def clicks(demos):
        return [c for e in demos.episodes for t in e.texts for c in re.findall(r"click\[(b0\w{8})\]", t, re.I)]

    assert clicks(plain) and all(c == c.lower() for c in clicks(plain))
    assert clicks(shown) and all(c == c.upper() for c in clicks(shown))
    assert [c.lower() for c in clicks(shown)] == clicks(plain)
    assert warmstart_key(micro_config(off), tok) != warmstart_key(micro_config(on), tok)
    assert (warmstart_key(micro_config([]), tok)
            == warmstart_key(micro_config(["model.warmstart.actions_as_shown=false"]), tok))
    with pytest.raises(ValueError, match="actions_as_shown"):
        collect_demonstrations(micro_config(["model.warmstart.actions_as_shown=true"]), tok, 2, seed=1)


def test_build_makes_the_warm_start_once(tmp_path, monkeypatch):
    """warmstart.build(cfg) makes the warm start those runs will load (scripts/compare.sh calls it before its
    parallel runs); a second call loads it; a config without a warm start gives None."""
    from ragen_turn.warmstart import build

    monkeypatch.setenv("RAGEN_TURN_CACHE_DIR", str(tmp_path))
    cfg = micro_config(WS + ["model.warmstart.steps=2", "model.warmstart.episodes=4"])
    lines = []
    path = build(cfg, log=lines.append)
    assert any("sft step 2/2" in ln for ln in lines) and (path / "warmstart.json").is_file()
    assert str(path).startswith(str(tmp_path))
    lines = []
    assert build(cfg, log=lines.append) == path and any("loaded cached warm start" in ln for ln in lines)
    assert build(micro_config(["model.warmstart.enable=false"])) is None


def test_build_copies_a_pinned_warm_start_instead_of_training(tmp_path, monkeypatch):
    """model.pinned_cache=DIR: a committed warm start under DIR/warmstart/<key> is copied into an empty cache and
    loaded, with no SFT, weights equal to the pinned ones; a DIR without the config's key builds as usual and
    says so."""
    from ragen_turn.warmstart import build

    cfg = micro_config(WS + ["model.warmstart.steps=2", "model.warmstart.episodes=4"])
    monkeypatch.setenv("RAGEN_TURN_CACHE_DIR", str(tmp_path / "first"))
    made = build(cfg, log=lambda s: None)
    pinned = tmp_path / "pinned"
    import shutil
    shutil.copytree(made, pinned / "warmstart" / made.name)
    (pinned / "warmstart" / "0123456789abcdef").mkdir()  # an unfinished entry beside it: never copied
    monkeypatch.setenv("RAGEN_TURN_CACHE_DIR", str(tmp_path / "second"))
    lines = []
    path = build(micro_config(WS + ["model.warmstart.steps=2", "model.warmstart.episodes=4",
                                    f"model.pinned_cache={pinned}"]), log=lines.append)
    assert path.name == made.name and str(path).startswith(str(tmp_path / "second"))
    assert not (tmp_path / "second" / "warmstart" / "0123456789abcdef").exists()
    assert any("loaded cached warm start" in ln for ln in lines) and not any("sft step" in ln for ln in lines)
    from safetensors.torch import load_file
    a, b = load_file(made / "model.safetensors"), load_file(path / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # a config whose key the pinned folder lacks: built here, and the log says why
    lines = []
    other = build(micro_config(WS + ["model.warmstart.steps=3", "model.warmstart.episodes=4",
                                     f"model.pinned_cache={pinned}"]), log=lines.append)
    assert other.name != made.name and any("has no warm start for key" in ln for ln in lines)
    assert any("sft step 3/3" in ln for ln in lines)


def test_the_committed_cache_holds_the_default_configs_model_and_warm_start():
    """`bash train.sh sokoban turn_ppo` starts from the committed base model and warm start
    (config/env_model/sokoban_tiny.yaml's model.pinned_cache) only while the default config still gives their hash and
    key: a change to the default's model or SFT must come with a new committed pair (or the main command silently
    spends its first 12 minutes building one)."""
    from pathlib import Path

    from transformers import AutoTokenizer

    from ragen_turn.config import model_config
    from ragen_turn.models import tiny
    from ragen_turn.compose import compose_config

    cfg = compose_config(["env=sokoban", "algo=turn_ppo"])
    pinned = Path(__file__).resolve().parents[1] / cfg.model.pinned_cache
    base = pinned / f"tiny-{tiny.config_hash(tiny.tiny_config(model_config(cfg)))}"
    assert (base / "ragen_turn_model.json").is_file(), sorted(p.name for p in pinned.iterdir())
    key = warmstart_key(cfg, AutoTokenizer.from_pretrained(base))
    assert (pinned / "warmstart" / key / "warmstart.json").is_file(), \
        sorted(p.name for p in (pinned / "warmstart").iterdir())
    # the RL settings and the evaluation split are not part of it
    for o in (["model.rl_lr=3e-4", "trainer.total_training_steps=3"], ["es_manager.val.seeds=dev", "seed=0"]):
        assert warmstart_key(compose_config(["env=sokoban", "algo=turn_ppo"] + o),
                             AutoTokenizer.from_pretrained(base)) == key


def test_sft_lr_schedule_warms_up_from_zero():
    """``warmup_steps`` ramps the rate from 0 (a 1-step SFT with 1 warm-up step changes nothing); ``cosine`` and
    ``constant`` are transformers' schedules; the key sees the schedule; a bad name is refused."""
    from ragen_turn.config import validate_config
    from ragen_turn.warmstart import sft

    tok = tiny_tokenizer()
    base = micro_config(WS)
    demos = collect_demonstrations(base, tok, 4, seed=3)
    changed = {}
    for sched, warm in (("constant", 0), ("cosine", 0), ("cosine", 1), ("constant", 1)):
        cfg = micro_config(WS + ["model.warmstart.steps=1", "model.warmstart.batch_size=4",
                                 f"model.warmstart.lr_schedule={sched}", f"model.warmstart.warmup_steps={warm}"])
        torch.manual_seed(0)
        model, _ = load_model_and_tokenizer(OmegaConf.to_container(cfg.model, resolve=True))
        before = [p.detach().clone() for p in model.parameters()]
        sft(model, demos, cfg, torch.device("cpu"), log=lambda s: None)
        changed[sched, warm] = any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert changed == {("constant", 0): True, ("cosine", 0): True, ("cosine", 1): False, ("constant", 1): False}
    cos = micro_config(WS + ["model.warmstart.lr_schedule=cosine"])
    assert warmstart_key(cos, tok) != warmstart_key(base, tok)
    same = micro_config(WS + ["model.warmstart.lr_schedule=constant", "model.warmstart.warmup_steps=0"])
    assert warmstart_key(same, tok) == warmstart_key(base, tok)  # the defaults spelled out: the same SFT
    with pytest.raises(Exception, match="lr_schedule"):
        validate_config(micro_config(WS + ["model.warmstart.lr_schedule=linear"]))
