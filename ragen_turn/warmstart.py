"""Supervised warm start on solver demonstrations (SFT before RL), cached on disk.

Demonstrations are real rollouts: a scripted policy that answers each turn with the next few
actions of the environment's optimal solution (``env.solve()``), through the same prompt builder
and token layout as RL, so SFT trains exactly the tokens RL will sample. The loss is the negative
log-likelihood of the response tokens only. The result is cached under
``<cache>/warmstart/<hash>`` keyed on everything that changes it (model, env, prompt format,
warm-start settings), so the first run pays for it once.

    python -m ragen_turn.warmstart env=sokoban model=tiny   # build (or load) it and report before/after
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import time
from pathlib import Path
from typing import Any, Dict, List

import torch
from omegaconf import DictConfig, OmegaConf

from ragen_turn.models import default_cache_root, sequence_logprobs
from ragen_turn.rollout import (ChatFormatter, EnvGroupManager, EnvSlot, TextPolicy, Trajectory, run_episodes,
                                takes_raw_response)

WARMSTART_VERSION = 1


def _action_name(env: Any, action: Any) -> str:
    lookup = getattr(env, "ACTION_LOOKUP", None) or {}
    if isinstance(action, (int,)) and action in lookup:
        return str(lookup[action])
    return str(action)


def demo_responder(cfg: DictConfig, seed: int):
    """``respond(slot) -> str``: the next 1..k solver actions in the answer format."""
    ws = cfg.model.warmstart
    apt = ws.actions_per_turn
    lo, hi = (apt, apt) if isinstance(apt, int) else (int(apt[0]), int(apt[-1]))
    rng = random.Random(seed)
    sep = f" {cfg.agent_proxy.action_sep} "
    think = cfg.agent_proxy.enable_think

    def respond(slot: EnvSlot) -> str:
        env = slot.env
        plan = env.solve() if hasattr(env, "solve") else None
        if plan is None:
            raise ValueError(f"env {type(env).__name__} cannot produce demonstrations (no solve() or unsolvable state)")
        if takes_raw_response(env):  # the plan's first entry is the whole response (search_qa's <search> ...)
            why = "I need to look this up." if plan[0].lstrip().startswith("<search>") else "I know the answer now."
            return (f"<think>{why}</think>" if think else "") + plan[0]
        k = rng.randint(int(lo), int(min(hi, cfg.agent_proxy.max_actions_per_turn)))
        actions = [_action_name(env, a) for a in list(plan)[:k]] or [_action_name(env, env.get_all_actions()[0])]
        body = f"<answer>{sep.join(actions)}</answer>"
        if think:
            body = f"<think>The plan is {', '.join(actions)}.</think>" + body
        return body

    return respond


def collect_demonstrations(cfg: DictConfig, tokenizer: Any, n_episodes: int, seed: int) -> Trajectory:
    """Solver rollouts on train-range seeds (never the held-out val seeds)."""
    from ragen_turn.engines.local.trainer import context_config

    split = OmegaConf.to_container(cfg.es_manager.train, resolve=True)
    tags = split["env_configs"]["tags"]
    n = max(1, n_episodes // len(tags))
    split.update(env_groups=n * len(tags), group_size=1, env_configs={"tags": tags, "n_groups": [n] * len(tags)})
    envs = EnvGroupManager(cfg.custom_envs, split, "train")
    formatter = ChatFormatter(tokenizer)
    episodes = run_episodes(envs.assign_seeds(seed, 10**6), TextPolicy(tokenizer, demo_responder(cfg, seed)),
                            formatter, context_config(cfg))
    envs.close()
    return Trajectory.from_episodes(episodes, tokenizer.pad_token_id)


def warmstart_seed(cfg: DictConfig) -> int:
    """``model.warmstart.seed``, or the run's ``seed`` when that is null (each RL seed gets its own SFT)."""
    ws_seed = cfg.model.warmstart.get("seed")
    return int(cfg.seed if ws_seed is None else ws_seed)


def warmstart_key(cfg: DictConfig, tokenizer: Any) -> str:
    model = OmegaConf.to_container(cfg.model, resolve=True)
    model["warmstart"].pop("seed", None)  # counted once, as "seed" below
    parts = {
        "version": WARMSTART_VERSION,
        "model": model,
        "model_path": cfg.get("model_path"),
        "envs": {t: OmegaConf.to_container(cfg.custom_envs[t], resolve=True)
                 for t in cfg.es_manager.train.env_configs.tags},
        "agent_proxy": OmegaConf.to_container(cfg.agent_proxy, resolve=True),
        "response_length": cfg.actor_rollout_ref.rollout.response_length,
        "format_penalty": cfg.es_manager.format_penalty,
        "dtype": cfg.dtype,
        "vocab": len(tokenizer),
        "seed": warmstart_seed(cfg),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def sft(model: torch.nn.Module, demos: Trajectory, cfg: DictConfig, device: torch.device, log=print) -> Dict[str, float]:
    """Response-token NLL, AdamW, ``warmstart.steps`` steps of ``warmstart.batch_size`` episodes."""
    ws = cfg.model.warmstart
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=ws.lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(warmstart_seed(cfg) + 1)
    n = demos.batch_size
    order = torch.randperm(n, generator=g)
    pos = 0
    t0 = time.time()
    losses: List[float] = []
    for step in range(int(ws.steps)):
        if pos + ws.batch_size > n:
            order, pos = torch.randperm(n, generator=g), 0
        mb = demos.select(order[pos:pos + ws.batch_size])
        pos += ws.batch_size
        ids, am = mb.input_ids.to(device), mb.attention_mask.to(device)
        mask = mb.response_mask.to(device)
        logp = sequence_logprobs(model, ids, am, mb.position_ids.to(device), token_mask=mask)
        loss = -(logp * mask).sum() / mask.sum().clamp(min=1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if (step + 1) % max(1, int(ws.steps) // 5) == 0 or step == 0:
            log(f"[warmstart] sft step {step + 1}/{ws.steps}  nll {loss.item():.4f}  {time.time() - t0:.0f}s")
    model.eval()
    return {"sft/final_nll": float(sum(losses[-10:]) / max(len(losses[-10:]), 1)), "sft/seconds": time.time() - t0,
            "sft/steps": float(ws.steps), "sft/demo_episodes": float(n)}


def cache_dir(cfg: DictConfig, tokenizer: Any) -> Path:
    return default_cache_root(cfg.model) / "warmstart" / warmstart_key(cfg, tokenizer)


def warmstart(model: torch.nn.Module, tokenizer: Any, cfg: DictConfig, log=print) -> torch.nn.Module:
    """Return ``model`` after SFT on demonstrations, loading the cached result when it exists."""
    from transformers import AutoModelForCausalLM

    from ragen_turn.engines.local.trainer import pick_device

    path = cache_dir(cfg, tokenizer)
    if (path / "warmstart.json").is_file():
        loaded = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=model.dtype)
        model.load_state_dict(loaded.state_dict())
        log(f"[warmstart] loaded cached warm start {path}")
        return model
    ws = cfg.model.warmstart
    t0 = time.time()
    demos = collect_demonstrations(cfg, tokenizer, int(ws.episodes), seed=warmstart_seed(cfg) + 10_007)
    succ = float(demos.success.mean())
    log(f"[warmstart] {demos.batch_size} solver demonstrations ({succ:.2f} solved within the turn budget, "
        f"{int(demos.response_mask.sum())} response tokens) in {time.time() - t0:.1f}s")
    stats = sft(model, demos, cfg, pick_device(cfg.device), log=log)
    stats["demo_success"] = succ
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "warmstart.json").write_text(json.dumps(stats, indent=2) + "\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(tmp, path)
    except OSError:  # another process finished first
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    log(f"[warmstart] saved to {path}")
    return model
