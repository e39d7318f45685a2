"""Supervised warm start on solver demonstrations (SFT before RL), cached on disk.

Demonstrations are real rollouts: a scripted policy that answers each turn with the next few
actions of the environment's optimal solution (``env.solve()``), through the same prompt builder
and token layout as RL, so SFT trains exactly the tokens RL will sample. The loss is the negative
log-likelihood of the response tokens only. The result is cached under
``<cache>/warmstart/<hash>`` keyed on everything that changes it (model, env, prompt format,
warm-start settings), so the first run pays for it once. :func:`build` makes it without a run.
"""
from __future__ import annotations

import hashlib
import json
import numbers
import os
import random
import time
from pathlib import Path
from typing import Any, Dict, List

import torch
from omegaconf import DictConfig, OmegaConf

from ragen_turn.runtime import eta
from ragen_turn.models import default_cache_root, sequence_logprobs
from ragen_turn.models.tiny import DEFAULT_CONFIG as TINY_DEFAULTS
from ragen_turn.rollout import (
    ChatFormatter,
    EnvGroupManager,
    EnvSlot,
    TextPolicy,
    Trajectory,
    context_config,
    declared_actions,
    run_episodes,
    takes_raw_response,
)

WARMSTART_VERSION = 2  # 2: Sokoban rooms from RAGEN's generator rules


def _action_name(env: Any, action: Any) -> str:
    """A solver's action as the model writes it: the name of an id the env declares (numpy integers too)."""
    lookup = declared_actions(env) or {}
    if isinstance(action, numbers.Integral) and not isinstance(action, bool):
        for k, name in lookup.items():
            if k == int(action):
                return str(name)
    return str(action)


def warmstart_enabled(cfg: DictConfig, log=print) -> bool:
    """Resolve ``model.warmstart.enable`` (true | false | auto) before any work.

    ``auto`` warm-starts when every train env can make demonstrations (has ``solve()``) and otherwise says so
    in one line and trains from the base model; ``true`` without a solver is an error naming the key."""
    from ragen_turn.envs import get_env_class

    enable = cfg.model.get("warmstart", {}).get("enable", False)
    if enable not in (True, False, "auto"):
        raise ValueError(f"model.warmstart.enable must be true, false or auto, got {enable!r}")
    think = cfg.model.get("warmstart", {}).get("think", "plan")
    if think not in THINK_FORMATS:
        raise ValueError(f"model.warmstart.think must be one of {sorted(THINK_FORMATS)}, got {think!r}")
    if enable is False:
        return False
    types = {cfg.custom_envs[t].env_type for t in cfg.es_manager.train.env_configs.tags}
    lacking = sorted(t for t in types if not callable(getattr(get_env_class(t), "solve", None)))
    if not lacking:
        return True
    if enable is True:
        raise ValueError(f"model.warmstart.enable=true needs env.solve() for demonstrations, and env_type "
                         f"{', '.join(lacking)} has none: set model.warmstart.enable=auto (RL from the base model) "
                         "or false")
    log(f"[warmstart] skipped: env_type {', '.join(lacking)} has no solve() to make demonstrations; "
        "RL starts from the base model (model.warmstart.enable=auto)")
    return False


# What a demonstration's <think> block says (agent_proxy.enable_think), by ``model.warmstart.think``.
# Each is ``(env, actions, plan) -> str``: the env before the turn, this turn's action names, the solver's whole
# remaining plan (names).
THINK_FORMATS = {
    # the actions of this turn (a short think: about 10 tokens)
    "plan": lambda env, actions, plan: f"The plan is {', '.join(actions)}.",
    # the grid restated, then the whole remaining plan; the answer is its first action(s). A long think of a form
    # a solver can write and a small model can learn (copy the state, plan ahead): about 60 tokens at 6x6
    "state_plan": lambda env, actions, plan: f"State:\n{env.render().strip()}\nPlan: {', '.join(plan)}.",
    # each action but the last, then the grid after it: what the answer's next action is planned on, written out
    # (a one-action answer thinks nothing). Needs env.copy(); about 45 tokens per extra action at 6x6
    "simulate": lambda env, actions, plan: "\n".join(f"{a}:\n{b}" for a, b in zip(actions, _grids_after(env, actions))),
    # the grid restated, then simulate's steps: one grid more in every turn (about 75 tokens more at 8x8), for turns of
    # 200+ tokens (benchmarks/one_update.py --setting long_turns_300)
    "state_simulate": lambda env, actions, plan: "\n".join(
        [f"{a}:\n{b}" for a, b in zip(["State"] + actions, _grids_after(env, actions, before=True))]),
}


def _grids_after(env: Any, actions: List[str], before: bool = False) -> List[str]:
    """The rendered grid after each of ``actions`` but the last, stepped on a copy of ``env`` (``before``: the grid
    before the first action first)."""
    if not callable(getattr(env, "copy", None)):
        raise ValueError(f"model.warmstart.think=simulate / state_simulate needs env.copy(), and "
                         f"{type(env).__name__} has none")
    sim, grids = env.copy(), ([env.render().strip()] if before else [])
    for a in actions[:-1]:
        sim.step(a)
        grids.append(sim.render().strip())
    return grids


def demo_responder(cfg: DictConfig, seed: int):
    """``respond(slot) -> str``: the next 1..k solver actions in the answer format (``k`` drawn from
    ``warmstart.actions_per_turn``; with ``warmstart.fit_turn_budget`` at least ``ceil(solution left / turns
    left)``, so a demonstration finishes within ``agent_proxy.max_turn`` whenever the solution allows). With
    ``warmstart.actions_as_shown`` each action is written as the page shows it (``env.as_shown``: WebShop's
    ``click[B0ABC12345]`` where its solver says ``click[b0abc12345]``), which a model copies from the page."""
    ws = cfg.model.warmstart
    apt = ws.actions_per_turn
    lo, hi = (apt, apt) if isinstance(apt, int) else (int(apt[0]), int(apt[-1]))
    rng = random.Random(seed)
    sep = f" {cfg.agent_proxy.action_sep} "
    think = THINK_FORMATS[ws.get("think", "plan")] if cfg.agent_proxy.enable_think else None

    fit = bool(ws.get("fit_turn_budget", False))
    as_shown = bool(ws.get("actions_as_shown", False))
    turns_taken: Dict[int, int] = {}  # answers given so far per slot (one episode per slot)

    def respond(slot: EnvSlot) -> str:
        env = slot.env
        plan = env.solve() if hasattr(env, "solve") else None
        if plan is None:
            raise ValueError(f"env {type(env).__name__} cannot produce demonstrations (no solve() or unsolvable state)")
        if takes_raw_response(env):  # the plan's first entry is the whole response (search_qa's <search> ...)
            why = "I need to look this up." if plan[0].lstrip().startswith("<search>") else "I know the answer now."
            return (f"<think>{why}</think>" if think else "") + plan[0]
        cap = int(cfg.agent_proxy.max_actions_per_turn)
        k = rng.randint(int(lo), int(min(hi, cap)))
        turn = turns_taken.get(id(slot), 0)
        turns_taken[id(slot)] = turn + 1
        if fit:  # enough actions per answer that the rest of the solution fits the turns left
            k = max(k, min(cap, -(-len(plan) // max(1, int(cfg.agent_proxy.max_turn) - turn))))
        names = [_action_name(env, a) for a in plan]
        actions = names[:k] or [_action_name(env, env.get_all_actions()[0])]
        if as_shown:
            if not callable(getattr(env, "as_shown", None)):
                raise ValueError(f"model.warmstart.actions_as_shown=true needs env.as_shown(action), and "
                                 f"{type(env).__name__} has none: set it to false for this env")
            actions = [env.as_shown(a) for a in actions]
        body = f"<answer>{sep.join(actions)}</answer>"
        if think is not None:
            body = f"<think>{think(env, actions, names)}</think>" + body
        return body

    return respond


def collect_demonstrations(cfg: DictConfig, tokenizer: Any, n_episodes: int, seed: int) -> Trajectory:
    """Solver rollouts on train-range seeds (never the held-out val seeds)."""
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


def _demo_env_spec(env_spec: Any) -> Dict[str, Any]:
    """An env's part of the warm-start key: its config, less the keys the demonstrations never see (Sokoban's
    ``deadlock_penalty`` and ``distance_shaping`` are rewards, and the solver never ends an episode by a deadlock
    (``end_on_deadlock``): its episodes and the SFT loss are the same under any value; WebShop's ``spacy_model``
    only scores the purchase)."""
    spec = OmegaConf.to_container(env_spec, resolve=True)
    for k in ("deadlock_penalty", "end_on_deadlock", "distance_shaping", "spacy_model"):
        (spec.get("env_config") or {}).pop(k, None)  # RAGEN's entries may say env_config: null
    for k in ("max_workers", "parallel_friendly"):  # RAGEN's env worker pool: not what the demonstrations are
        spec.pop(k, None)
    return spec


def warmstart_key(cfg: DictConfig, tokenizer: Any) -> str:
    model = OmegaConf.to_container(cfg.model, resolve=True)
    model["warmstart"].pop("seed", None)  # counted once, as "seed" below
    model["warmstart"].pop("enable", None)  # whether it runs, not what it trains
    model["warmstart"].pop("micro_batch_size", None)  # memory and speed: the same batch loss in any micro-batches
    # keys at their defaults are left out, so caches made before the key existed keep their keys
    for k, default in (("lr_schedule", "constant"), ("warmup_steps", 0), ("actions_as_shown", False),
                       ("autocast", None)):
        if model["warmstart"].get(k, default) == default:
            model["warmstart"].pop(k, None)
    for k in ("copy_pretrain_steps", "copy_pretrain_max_gap", "copy_pretrain_small_alphabet"):  # as the tiny hash
        if not model.get("copy_pretrain_steps") or model.get(k, TINY_DEFAULTS[k]) == TINY_DEFAULTS[k]:
            model.pop(k, None)
    model.pop("rl_lr", None)  # the RL actor's lr: not part of the warm start
    model.pop("pinned_cache", None)  # where a committed copy may come from, not what it is
    parts = {
        "version": WARMSTART_VERSION,
        "model": model,
        "model_path": cfg.get("model_path"),  # null unless a yaml sets it (then model.path too): kept, as the
                                               # existing warm starts' cache keys hash it
        "envs": {t: _demo_env_spec(cfg.custom_envs[t]) for t in cfg.es_manager.train.env_configs.tags},
        "agent_proxy": OmegaConf.to_container(cfg.agent_proxy, resolve=True),
        "response_length": cfg.actor_rollout_ref.rollout.response_length,
        "format_penalty": cfg.es_manager.format_penalty,
        "dtype": cfg.dtype,
        "vocab": len(tokenizer),
        "seed": warmstart_seed(cfg),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def sft(model: torch.nn.Module, demos: Trajectory, cfg: DictConfig, device: torch.device,
        log=print) -> Dict[str, float]:
    """Response-token NLL, AdamW, ``warmstart.steps`` steps of ``warmstart.batch_size`` episodes (each forward and
    backward in length-sorted micro-batches of ``warmstart.micro_batch_size``: the batch's loss, less padding); the
    learning rate follows ``warmstart.lr_schedule`` (transformers' ``constant_with_warmup`` or ``cosine``, to 0 at
    the last step) after ``warmstart.warmup_steps`` of linear warm-up. ``warmstart.autocast: bfloat16`` runs the
    forward under ``torch.autocast`` (matmuls in bf16, weights, gradients and AdamW in the model's dtype): on a CPU
    with AVX512-BF16 an SFT step of the tiny model takes about 0.6x the float32 time (benchmarks/bench_sft.py)."""
    import contextlib
    import functools

    from transformers import get_scheduler

    ws = cfg.model.warmstart
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=ws.lr, weight_decay=0.0)
    schedule = {"constant": "constant_with_warmup", "cosine": "cosine"}[ws.get("lr_schedule", "constant")]
    sched = get_scheduler(schedule, opt, num_warmup_steps=int(ws.get("warmup_steps", 0)),
                          num_training_steps=max(1, int(ws.steps)))
    autocast = ws.get("autocast")
    amp = functools.partial(torch.autocast, device.type, dtype=getattr(torch, autocast)) if autocast \
        else contextlib.nullcontext
    g = torch.Generator().manual_seed(warmstart_seed(cfg) + 1)
    n = demos.batch_size
    order = torch.randperm(n, generator=g)
    pos = 0
    t0 = shown = time.time()
    losses: List[float] = []
    for step in range(int(ws.steps)):
        if pos + ws.batch_size > n:
            order, pos = torch.randperm(n, generator=g), 0
        batch = demos.select(order[pos:pos + ws.batch_size])
        pos += ws.batch_size
        n_tokens = batch.response_mask.sum().clamp(min=1)
        opt.zero_grad(set_to_none=True)
        loss = 0.0
        for idx in batch.micro_batches(int(ws.get("micro_batch_size") or 0) or batch.batch_size):
            mb = batch.select(idx).to(device)
            mask = mb.response_mask
            with amp():
                logp = sequence_logprobs(model, mb.input_ids, mb.attention_mask, mb.position_ids, token_mask=mask)
            part = -(logp * mask).sum() / n_tokens.to(device)  # this micro-batch's share of the batch mean
            part.backward()
            loss += part.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss))
        done = step + 1
        if done % max(1, int(ws.steps) // 20) == 0 or done in (1, int(ws.steps)) or time.time() - shown >= 30:
            shown = time.time()
            recent = losses[-max(1, int(ws.steps) // 20):]
            log(f"[warmstart] sft step {done}/{ws.steps}  nll {sum(recent) / len(recent):.4f}  "
                f"{eta(done, int(ws.steps), shown - t0)}")
    model.eval()
    return {"sft/final_nll": float(sum(losses[-10:]) / max(len(losses[-10:]), 1)), "sft/seconds": time.time() - t0,
            "sft/steps": float(ws.steps), "sft/demo_episodes": float(n)}


def cache_dir(cfg: DictConfig, tokenizer: Any) -> Path:
    return default_cache_root(cfg.model) / "warmstart" / warmstart_key(cfg, tokenizer)


def warmstart(model: torch.nn.Module, tokenizer: Any, cfg: DictConfig, log=print) -> torch.nn.Module:
    """Return ``model`` after SFT on demonstrations, loading the cached result when it exists."""
    from transformers import AutoModelForCausalLM

    from ragen_turn.runtime import pick_device

    path = cache_dir(cfg, tokenizer)
    if (path / "warmstart.json").is_file():
        loaded = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=model.dtype)
        model.load_state_dict(loaded.state_dict())
        log(f"[warmstart] loaded cached warm start {path}")
        return model
    ws = cfg.model.warmstart
    if cfg.model.get("pinned_cache"):  # the run expected a committed one: say why there was none
        log(f"[warmstart] model.pinned_cache {cfg.model.pinned_cache} has no warm start for key {path.name} (this "
            "config's SFT differs from the committed ones): building one")
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


def warmstart_dir(cfg: DictConfig, model_path: str | Path, log=print) -> Path:
    """The warm-started copy of the model in ``model_path`` as a Hugging Face directory (model + tokenizer).

    For engines that load from a path (verl): the same cache entry the local engine's :func:`warmstart`
    reads and writes, built here first when it is missing.
    """
    from ragen_turn.models import load_hf

    model, tokenizer = load_hf(model_path, device="cpu", dtype=cfg.dtype)
    path = cache_dir(cfg, tokenizer)
    if (path / "warmstart.json").is_file():
        log(f"[warmstart] cached warm start {path}")
    else:
        warmstart(model, tokenizer, cfg, log=log)
    del model
    if torch.cuda.is_available():  # the workers start next: give back what the SFT held on the GPU
        torch.cuda.empty_cache()
    return path


def build(cfg: DictConfig, log=print) -> Path | None:
    """Build (or load) the warm start of a run config once, e.g. before many runs that share it start in parallel
    (``scripts/compare.sh``); its cache directory, or None when the config warm-starts nothing. A committed warm
    start in ``model.pinned_cache`` (``<folder>/warmstart/<key>/``) is copied into the cache first
    (models.seed_cache)."""
    from ragen_turn.config import model_config
    from ragen_turn.models import load_model_and_tokenizer

    if not warmstart_enabled(cfg, log):
        return None
    model, tokenizer = load_model_and_tokenizer(model_config(cfg), device="cpu", dtype=cfg.dtype)
    tokenizer.padding_side = "left"
    path = cache_dir(cfg, tokenizer)
    warmstart(model, tokenizer, cfg, log=log)
    return path


# ---------------------------------------------------------------- what a run builds before step 1, said first
SKIP_KEYS = {"copy": "model.copy_pretrain_steps=0", "sft": "model.warmstart.enable=false"}


def _silent(*_a, **_k) -> None:
    pass


def _tiny_parts(cfg: DictConfig):
    """(tiny's config, its cache dir, whether it is built) for ``model=tiny``; None for other models."""
    from ragen_turn.models import MARKER_FILE, seed_cache
    from ragen_turn.models import tiny

    if str(cfg.model.get("name")) != "tiny" or cfg.model.get("path"):
        return None
    model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
    if model_cfg.get("pinned_cache"):  # committed models count as built: copied here, said once (see seed_cache)
        seed_cache(model_cfg["pinned_cache"], model_cfg)
    tcfg = tiny.tiny_config(model_cfg)
    path = default_cache_root(model_cfg) / f"tiny-{tiny.config_hash(tcfg)}"
    return tcfg, path, (path / MARKER_FILE).is_file()


def warmstart_plan(cfg: DictConfig) -> Dict[str, Any]:
    """What this run builds before step 1 that the cache does not hold: ``copy`` (the tiny model's copy
    pretraining, its steps) and ``sft`` (the warm start: (demonstration episodes, SFT steps)); ``tokenizer`` the
    model's tokenizer (for a probe)."""
    from transformers import AutoTokenizer

    from ragen_turn.models import tiny_tokenizer

    plan: Dict[str, Any] = {}
    sft_on = warmstart_enabled(cfg, log=_silent)
    tiny = _tiny_parts(cfg)
    if tiny is not None:
        tcfg, path, built = tiny
        if not built and int(tcfg.get("copy_pretrain_steps", 0)) > 0:
            plan["copy"] = int(tcfg["copy_pretrain_steps"])
        if not (sft_on or plan):
            return plan
        tok = AutoTokenizer.from_pretrained(path) if built else \
            tiny_tokenizer.build_tokenizer(seed=0, corpus=tcfg["tokenizer_corpus"])
    elif cfg.model.get("path") and sft_on:
        try:
            tok = AutoTokenizer.from_pretrained(str(cfg.model.path))
        except (OSError, ValueError):  # not a model directory: loading the model says so
            return plan
    else:
        return plan
    if sft_on and not (cache_dir(cfg, tok) / "warmstart.json").is_file():
        plan["sft"] = (int(cfg.model.warmstart.episodes), int(cfg.model.warmstart.steps))
    if plan:
        plan["tokenizer"] = tok
    return plan


def probe_seconds(cfg: DictConfig, plan: Dict[str, Any]) -> Dict[str, float]:
    """Seconds each part of ``plan`` should take on this machine, from a 2-step probe of each on a fresh tiny model
    (the real copy-task and SFT steps, on real batches): ``copy``, ``demos`` (the demonstration episodes), ``sft``.
    Models other than tiny are not probed ({})."""
    from ragen_turn.models import tiny
    from ragen_turn.models.copy_pretrain import copy_pretrain
    from ragen_turn.runtime import pick_device

    parts = _tiny_parts(cfg)
    if parts is None:
        return {}
    tok = plan["tokenizer"]
    tok.padding_side = "left"
    model = tiny.build_model({**parts[0], "copy_pretrain_steps": 0}, tok)
    out: Dict[str, float] = {}
    if "copy" in plan:
        out["copy"] = copy_pretrain(model, tok, 2, log=_silent)["seconds"] / 2 * plan["copy"]
    if "sft" in plan:
        episodes, steps = plan["sft"]
        ws = cfg.model.warmstart
        n = max(1, min(int(ws.batch_size), episodes))
        t0 = time.time()
        demos = collect_demonstrations(cfg, tok, n, seed=warmstart_seed(cfg) + 10_007)
        out["demos"] = (time.time() - t0) / n * episodes
        probe = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
        probe.model.warmstart.steps = 2
        out["sft"] = sft(model, demos, probe, pick_device(cfg.device), log=_silent)["sft/seconds"] / 2 * steps
    return out


def warmstart_notice(cfg: DictConfig, log=print) -> Dict[str, Any]:
    """Before a run builds what it starts from (the cache lacks it): one line saying what it is, about how long it
    should take on this machine (:func:`probe_seconds`) and the keys that skip it; returns the plan ({}: nothing)."""
    from ragen_turn.runtime import fmt_duration

    plan = warmstart_plan(cfg)
    if not plan:
        return plan
    from ragen_turn.rollout.context import check_context_fits

    check_context_fits(cfg, plan["tokenizer"])  # a context too small for any first turn stops before the probe
    secs = probe_seconds(cfg, plan)
    what = []
    if "copy" in plan:
        what.append(f"copy pretraining of the tiny model ({plan['copy']} steps"
                    + (f", about {fmt_duration(secs['copy'])}" if "copy" in secs else "") + ")")
    if "sft" in plan:
        episodes, steps = plan["sft"]
        took = secs.get("demos", 0.0) + secs.get("sft", 0.0)
        what.append(f"SFT on {episodes} solver demonstrations ({steps} steps"
                    + (f", about {fmt_duration(took)}" if "sft" in secs else "") + ")")
    total = f"about {fmt_duration(sum(secs.values()))} on this machine (a 2-step probe of each part, timed here)" \
        if secs else "its first steps print an ETA"
    skip = " ".join(SKIP_KEYS[k] for k in ("copy", "sft") if k in plan)
    log(f"[warmstart] before step 1 this run builds its warm start (once: later runs with the same model and env "
        f"settings load it from the cache): {'; then '.join(what)}: {total}. To skip it and start RL from the "
        f"untrained model: {skip}")
    return plan
