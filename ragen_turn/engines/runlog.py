"""What a run logs, the same for both engines: episode metrics, the progress line (with an ETA), ``metrics.jsonl``,
and the summary block a run ends with.

``metrics.jsonl`` holds one JSON object per logged step (non-finite numbers as ``null``). A resumed
run keeps the lines up to its checkpoint's step and drops the rest (:func:`truncate_metrics`), so
the log never holds two lines for one step.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch

from ragen_turn.engines.rundir import atomic_write_text, writing
from ragen_turn.rollout import Trajectory
from ragen_turn.runtime import fmt_duration
from ragen_turn.runfiles import CONFIG_FILE, METRICS_FILE, PROVENANCE_FILE, VAL_SUCCESS, read_metrics


def episode_metrics(batch: Trajectory, prefix: str = "env") -> Dict[str, float]:
    """Means over the batch's episodes, and RAGEN's per-tag ones.

    ``invalid_action_rate``: of the actions the model named, those dropped (not the env's) or that the env
    called invalid; ``effective_action_rate``: of the actions named, those that changed the env's state.
    ``<tag>/success`` and ``<tag>/actions`` per env tag; ``pass@<G>`` (overall and per tag): the share of env groups
    (G episodes on one seed) with at least one success.
    """
    eps = batch.episodes
    named = sum(e.num_actions + e.num_dropped_actions for e in eps)
    invalid = sum(e.num_dropped_actions + e.num_actions - e.num_valid_actions for e in eps)
    n_turns = sum(e.num_turns for e in eps)
    out = {
        f"{prefix}/success": float(np.mean([e.success for e in eps])),
        f"{prefix}/reward": float(np.mean([e.total_reward for e in eps])),
        f"{prefix}/turns": float(np.mean([e.num_turns for e in eps])),
        f"{prefix}/actions": float(np.mean([e.num_actions for e in eps])),
        f"{prefix}/invalid_action_rate": invalid / max(named, 1),
        f"{prefix}/effective_action_rate": sum(e.num_effective_actions for e in eps) / max(named, 1),
        f"{prefix}/format_error_rate": sum(e.format_errors for e in eps) / max(n_turns, 1),
        f"{prefix}/truncated": float(np.mean([e.truncated for e in eps])),
        f"{prefix}/response_tokens": float(batch.response_mask.sum(dim=1).mean()),
    }
    # env-specific numbers (search_qa: em, f1, searches): mean over the episodes whose env reports them
    for k in sorted({k for e in eps for k in e.metrics}):
        out[f"{prefix}/{k}"] = float(np.mean([e.metrics[k] for e in eps if k in e.metrics]))
    groups: Dict[int, List[Any]] = {}
    for e in eps:
        groups.setdefault(e.group_id, []).append(e)
    size = max(len(g) for g in groups.values())
    out[f"{prefix}/pass@{size}"] = float(np.mean([any(e.success for e in g) for g in groups.values()]))
    for tag in sorted({e.tag for e in eps}):
        mine = [g for g in groups.values() if g[0].tag == tag]
        out[f"{prefix}/{tag}/success"] = float(np.mean([e.success for g in mine for e in g]))
        out[f"{prefix}/{tag}/actions"] = float(np.mean([e.num_actions for g in mine for e in g]))
        out[f"{prefix}/{tag}/pass@{size}"] = float(np.mean([any(e.success for e in g) for g in mine]))
    return out


# RAGEN's metric names (RAGEN's es_manager / ctx_manager, its trainer and the verl functions it calls: actor and
# critic losses, compute_data_metrics, compute_timing_metrics) -> ours, for the numbers we compute with RAGEN's
# meaning. ``<tag>`` is an env tag, ``<G>`` the group size. An entry whose two names are equal is a number we log
# under RAGEN's (verl's) own name. docs/ragen_keys.md ("RAGEN's metric names") shows this table (a test checks it).
RAGEN_METRICS: Dict[str, str] = {
    "train/<tag>/success": "env/<tag>/success",
    "train/<tag>/pass@<G>": "env/<tag>/pass@<G>",
    "train/<tag>/num_actions": "env/<tag>/actions",
    "train/response_length": "env/response_tokens",
    "val-env/<tag>/success": "val/<tag>/success",
    "val-env/<tag>/pass@<G>": "val/<tag>/pass@<G>",
    "val-env/<tag>/num_actions": "val/<tag>/actions",
    "val-env/response_length": "val/response_tokens",
    "actor/pg_clipfrac": "actor/clip_frac_token",
    "actor/pg_clipfrac_lower": "actor/dual_clip_frac",
    "critic/vf_loss": "critic/value_loss",
    "timing_s/step": "perf/step_s",
    "timing_s/gen": "perf/rollout_s",
    "timing_s/testing": "perf/val_s",
    "actor/ppo_kl": "actor/ppo_kl",
    "actor/pg_loss": "actor/pg_loss",
    "actor/entropy": "actor/entropy",
    "actor/kl_loss": "actor/kl_loss",
    "actor/grad_norm": "actor/grad_norm",
    "actor/lr": "actor/lr",
    "actor/reward_kl_penalty": "actor/reward_kl_penalty",
    "actor/reward_kl_penalty_coeff": "actor/reward_kl_penalty_coeff",
    "critic/vf_clipfrac": "critic/vf_clipfrac",
    "critic/grad_norm": "critic/grad_norm",
    "critic/lr": "critic/lr",
    "critic/score/mean": "critic/score/mean",
    "critic/score/max": "critic/score/max",
    "critic/score/min": "critic/score/min",
    "critic/rewards/mean": "critic/rewards/mean",
    "critic/rewards/max": "critic/rewards/max",
    "critic/rewards/min": "critic/rewards/min",
    "critic/advantages/mean": "critic/advantages/mean",
    "critic/advantages/max": "critic/advantages/max",
    "critic/advantages/min": "critic/advantages/min",
    "rollout/in_group_std": "rollout/in_group_std",
    "rollout/in_group_max": "rollout/in_group_max",
    "rollout/in_group_mean": "rollout/in_group_mean",
    "rollout/chosen_in_group_std": "rollout/chosen_in_group_std",
    "rollout/chosen_in_group_max": "rollout/chosen_in_group_max",
    "rollout/chosen_in_group_mean": "rollout/chosen_in_group_mean",
}


def _pattern(name: str) -> "re.Pattern[str]":
    """A table name as a regex: ``<tag>`` one path part, ``<G>`` a number."""
    return re.compile(re.escape(name).replace(re.escape("<tag>"), r"(?P<tag>[^/]+)")
                      .replace(re.escape("<G>"), r"(?P<G>\d+)") + "$")


_RENAMES = [(_pattern(ours), ragen) for ragen, ours in RAGEN_METRICS.items() if ragen != ours]


def with_ragen_names(metrics: Mapping[str, Any]) -> Dict[str, Any]:
    """``metrics`` plus a copy of each of our numbers under RAGEN's name (:data:`RAGEN_METRICS`), for wandb: a
    RAGEN user's panels fill. A RAGEN name the engine already logs (verl's own ``critic/vf_loss``, ...) is kept."""
    out = dict(metrics)
    for key, value in metrics.items():
        for pat, ragen in _RENAMES:
            m = pat.match(key)
            if m:
                g = m.groupdict()
                out.setdefault(ragen.replace("<tag>", g.get("tag") or "").replace("<G>", g.get("G") or ""), value)
    return out


def run_header(cfg: Any, trainer: str, start: int, n_episodes: int, out_dir: Any, device: Optional[Any] = None) -> str:
    """The line a run prints before its first step: trainer, algorithm, batch, steps, output directory."""
    dev = f" device={device}" if device is not None else ""
    return (f"[ragen_turn] {cfg.trainer.experiment_name}: {trainer}, algo={cfg.algo.name} "
            f"loss={cfg.actor_rollout_ref.actor.policy_loss.loss_mode} adv={cfg.algorithm.adv_estimator} "
            f"critic={cfg.critic.level}{dev} batch={n_episodes} episodes, "
            f"steps {start}->{cfg.trainer.total_training_steps}, out={out_dir}")


def progress_line(m: Mapping[str, Any], total: Optional[int] = None, timing: str = "") -> str:
    """One line per step: reward, success, clip fractions, KL, entropy, value loss, speed; held-out scores;
    ``step N/total`` and ``timing`` (e.g. ``eta(...)``) when given."""
    def f(key, fmt="{:.3f}"):
        v = m.get(key)
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)

    step = int(m.get("step", 0))
    parts = [f"step {step:4d}" + (f"/{total}" if total is not None else "")]
    if "env/reward" in m:
        parts += [f"reward {f('env/reward')}", f"success {f('env/success')}",
                  f"clip_tok {f('actor/clip_frac_token')}", f"clip_turn {f('actor/clip_frac_turn')}",
                  f"kl {f('actor/approx_kl', '{:.4f}')}", f"ent {f('actor/entropy')}",
                  f"vloss {f('critic/value_loss')}",
                  f"tok/s {f('perf/tokens_per_s', '{:.0f}')}", f"{f('perf/step_s', '{:.1f}')}s"]
    if "val/success" in m:
        score = f" score {f('val/score')}" if "val/score" in m else ""  # WebShop's score (purchase reward)
        parts += [f"| val success {f('val/success')}{score} reward {f('val/reward')} invalid "
                  f"{f('val/invalid_action_rate')}"]
    if timing:
        parts.append(f"| {timing}")
    return "  ".join(parts)


def jsonable(v: Any) -> Any:
    """A metric value as JSON: numpy / one-element tensors as Python numbers, non-finite floats as None."""
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v if isinstance(v, (int, float, str, bool, type(None))) else str(v)


def append_metrics(path: Path, metrics: Mapping[str, Any]) -> None:
    """Append one line (keys sorted) to ``metrics.jsonl``; a full disk raises ``DiskFull`` naming the file."""
    clean = {k: jsonable(v) for k, v in metrics.items()}
    with writing(path), open(path, "a") as f:
        f.write(json.dumps(clean, sort_keys=True) + "\n")


def weights_sha256(model: torch.nn.Module) -> str:
    """sha256 of a model's parameters and buffers (names, dtypes, shapes and bytes, in state-dict order)."""
    import hashlib

    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        t = t.detach().to("cpu").contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def record_provenance(out_dir: Path, step: int, actor: Optional[torch.nn.Module] = None,
                      identity: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Append where and with what this process runs the run to ``<run>/provenance.json`` (one entry per start or
    resume): the step it starts at, the CPU model, torch's thread count (the order of its float reductions follows
    it: one seed gives other numbers with other thread counts), the GPU if any, Python / torch / transformers
    versions, what the run trains (``identity``: ``rundir.identity_of``, read by a resume's check) and, on a fresh
    start, the sha256 of the actor's starting weights (the warm start: an SFT on another CPU type ends at other
    weights, so two runs of one config match only when these do). Returns the entry."""
    import platform
    import sys

    import transformers

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    entry: Dict[str, Any] = {"step": int(step), "cpu": cpu, "torch_threads": torch.get_num_threads(),
                             "python": sys.version.split()[0],
                             "torch": torch.__version__, "transformers": transformers.__version__,
                             "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    if actor is not None and step == 0:
        entry["start_weights_sha256"] = weights_sha256(actor)
    if identity is not None:  # what the run trains (rundir.identity_of): a resume is checked against it too
        entry["identity"] = dict(identity)
    path = Path(out_dir) / PROVENANCE_FILE
    try:
        entries = json.loads(path.read_text()) if step > 0 and path.is_file() else []
    except (OSError, ValueError):
        entries = []
    atomic_write_text(path, json.dumps(entries + [entry], indent=1) + "\n")
    return entry


def write_generations(path: Path, step: int, episodes: List[Any], texts: List[str]) -> None:
    """``trainer.log_val_generations``: episodes of the held-out evaluation at ``step`` with their decoded text
    (prompts and responses), one JSON line each (``step``, ``tag``, ``env_seed``, ``reward``, ``success``,
    ``text``), appended to ``path`` (``val_generations.jsonl`` in the run dir; a resume truncates it like
    ``metrics.jsonl``)."""
    for e, text in zip(episodes, texts):
        append_metrics(path, {"step": step, "tag": e.tag, "env_seed": e.env_seed, "reward": e.total_reward,
                              "success": bool(e.success), "text": text})


def truncate_metrics(path: Path, step: int, log: Callable[[str], None] = print) -> None:
    """Resume rule: keep the lines of steps ``<= step`` (the checkpoint's step); ``step == 0`` (a fresh run)
    removes the log. A torn last line is dropped (:func:`read_metrics`). The file is replaced atomically."""
    path = Path(path)
    if not path.exists():
        return
    if step <= 0:
        path.unlink()
        return
    rows = [r for r in read_metrics(path, log) if r.get("step", 0) <= step]
    atomic_write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))


def held_out_history(rows: List[Mapping[str, Any]], key: str = VAL_SUCCESS) -> List[Tuple[int, float]]:
    """``[(step, value)]`` of the held-out evaluations in a run's metrics rows (null values left out)."""
    return [(int(r["step"]), float(r[key])) for r in rows if r.get(key) is not None]


def val_split_name(cfg: Any) -> str:
    """What the val episodes are called in logs: "held-out", or "dev" with ``es_manager.val.seeds=dev`` (the seed
    range for choosing settings, whose numbers are not held-out results)."""
    return "dev" if cfg.es_manager.val.get("seeds", "heldout") == "dev" else "held-out"


def run_summary(cfg: Any, out_dir: Path, elapsed: Optional[float] = None, checkpoint: Optional[Path] = None,
                note: str = "") -> Tuple[str, Dict[str, Any]]:
    """The block a run ends with (and a finished run prints again on resume): held-out success before / last /
    best, elapsed time, where the checkpoint and the metrics are, and the commands to run next.

    Returns ``(text, summary)``; ``summary`` holds the same numbers (for a multirun's table)."""
    out_dir = Path(out_dir)
    rows = read_metrics(out_dir / METRICS_FILE) if (out_dir / METRICS_FILE).is_file() else []
    hist = held_out_history(rows)
    steps = max((int(r.get("step", 0)) for r in rows), default=0)
    summary: Dict[str, Any] = {"run": str(out_dir), "steps": steps, "elapsed_s": elapsed,
                               "init": None, "last": None, "best": None, "best_step": None}
    lines = [f"[ragen_turn] {note or 'done'}: {cfg.trainer.experiment_name}, step {steps} of "
             f"{cfg.trainer.total_training_steps}" + (f" in {fmt_duration(elapsed)}" if elapsed is not None else "")]
    if hist:
        init = hist[0] if hist[0][0] == 0 else None
        after = [h for h in hist if h[0] > 0]
        best = max(after, key=lambda h: h[1]) if after else None
        summary.update(init=init[1] if init else None, last=hist[-1][1],
                       best=best[1] if best else None, best_step=best[0] if best else None)
        parts = []
        if init:
            parts.append(f"{init[1]:.3f} at step 0 (before RL)")
        parts.append(f"{hist[-1][1]:.3f} at step {hist[-1][0]}")
        if best:
            parts.append(f"best {best[1]:.3f} at step {best[0]}")
        n_val = cfg.es_manager.val.env_groups * cfg.es_manager.val.group_size
        split = val_split_name(cfg)
        lines.append(f"  {split} success ({n_val} episodes): " + " -> ".join(parts[:2]) +
                     (f" ({parts[2]})" if len(parts) > 2 else ""))
        if any("val/score" in r for r in rows):  # WebShop: its score (the purchase's reward), and the return
            for key in ("val/score", "val/reward"):
                h = held_out_history(rows, key)
                lines.append(f"  {split} {key[4:]}: " + " -> ".join(f"{v:.3f} at step {s}" for s, v in (h[0], h[-1])))
    if checkpoint is not None:
        lines.append(f"  checkpoint: {checkpoint}")
    lines.append(f"  metrics:    {out_dir / METRICS_FILE}  (config: {out_dir / CONFIG_FILE})")
    lines.append(f"  next:       bash eval.sh {cfg.env.name} {out_dir}    # held-out evaluation of the last checkpoint")
    lines.append(f"              .venv/bin/python -m ragen_turn.report {out_dir}    "
                 f"# table and curves in {out_dir / 'report'}")
    return "\n".join(lines), summary
