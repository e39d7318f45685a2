"""What a run logs, the same for both engines: episode metrics, the progress line, ``metrics.jsonl``.

``metrics.jsonl`` holds one JSON object per logged step (non-finite numbers as ``null``). A resumed
run keeps the lines up to its checkpoint's step and drops the rest (:func:`truncate_metrics`), so
the log never holds two lines for one step.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

import numpy as np
import torch

from ragen_turn.rollout import Trajectory


def episode_metrics(batch: Trajectory, prefix: str = "env") -> Dict[str, float]:
    """Means over the batch's episodes, and RAGEN's per-tag ones.

    ``invalid_action_rate``: of the actions the model named, those dropped (not the env's) or that the env
    called invalid; ``effective_action_rate``: of the actions named, those that changed the env's state.
    ``<tag>/success`` per env tag; ``pass@<G>`` (overall and per tag): the share of env groups (G episodes
    on one seed) with at least one success.
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
    groups: Dict[int, List[Any]] = {}
    for e in eps:
        groups.setdefault(e.group_id, []).append(e)
    size = max(len(g) for g in groups.values())
    out[f"{prefix}/pass@{size}"] = float(np.mean([any(e.success for e in g) for g in groups.values()]))
    for tag in sorted({e.tag for e in eps}):
        mine = [g for g in groups.values() if g[0].tag == tag]
        out[f"{prefix}/{tag}/success"] = float(np.mean([e.success for g in mine for e in g]))
        out[f"{prefix}/{tag}/pass@{size}"] = float(np.mean([any(e.success for e in g) for g in mine]))
    return out


def run_header(cfg: Any, trainer: str, start: int, n_episodes: int, out_dir: Any, device: Optional[Any] = None) -> str:
    """The line a run prints before its first step: trainer, algorithm, batch, steps, output directory."""
    dev = f" device={device}" if device is not None else ""
    return (f"[ragen_turn] {cfg.trainer.experiment_name}: {trainer}, algo={cfg.algo.name} "
            f"loss={cfg.actor_rollout_ref.actor.policy_loss.loss_mode} adv={cfg.algorithm.adv_estimator} "
            f"critic={cfg.critic.level}{dev} batch={n_episodes} episodes, "
            f"steps {start}->{cfg.trainer.total_training_steps}, out={out_dir}")


def progress_line(m: Mapping[str, Any]) -> str:
    """One line per step: reward, success, clip fractions, KL, entropy, value loss, speed; held-out scores."""
    def f(key, fmt="{:.3f}"):
        v = m.get(key)
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)

    parts = [f"step {int(m.get('step', 0)):4d}"]
    if "env/reward" in m:
        parts += [f"reward {f('env/reward')}", f"success {f('env/success')}",
                  f"clip_tok {f('actor/clip_frac_token')}", f"clip_turn {f('actor/clip_frac_turn')}",
                  f"kl {f('actor/approx_kl', '{:.4f}')}", f"ent {f('actor/entropy')}",
                  f"vloss {f('critic/value_loss')}",
                  f"tok/s {f('perf/tokens_per_s', '{:.0f}')}", f"{f('perf/step_s', '{:.1f}')}s"]
    if "val/success" in m:
        parts += [f"| val success {f('val/success')} reward {f('val/reward')} invalid "
                  f"{f('val/invalid_action_rate')}"]
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
    """Append one line (keys sorted) to ``metrics.jsonl``."""
    clean = {k: jsonable(v) for k, v in metrics.items()}
    with open(path, "a") as f:
        f.write(json.dumps(clean, sort_keys=True) + "\n")


def check_run_dir(out_dir: Any, resume: bool, overwrite: bool) -> None:
    """A run directory that already holds a run (a non-empty ``metrics.jsonl``) needs ``resume`` or ``overwrite``."""
    existing = Path(out_dir) / "metrics.jsonl"
    if not resume and not overwrite and existing.is_file() and existing.stat().st_size > 0:
        raise FileExistsError(f"{Path(out_dir)} already holds a run ({existing}): trainer.resume=true continues "
                              "it, trainer.overwrite=true starts it over, or set another trainer.experiment_name "
                              "/ trainer.default_local_dir")


def truncate_metrics(path: Path, step: int) -> None:
    """Resume rule: keep the lines of steps ``<= step`` (the checkpoint's step); ``step == 0`` (a fresh run)
    removes the log."""
    path = Path(path)
    if not path.exists():
        return
    if step <= 0:
        path.unlink()
        return
    lines = [ln for ln in path.read_text().splitlines() if ln.strip() and json.loads(ln).get("step", 0) <= step]
    path.write_text("".join(ln + "\n" for ln in lines))
