"""Held-out evaluation of a checkpoint: ``bash eval.sh <env> <checkpoint_dir> [overrides]``.

Prints success rate, mean reward, mean turns and invalid-action rate on the val env groups
(seeds that training never uses) as a table, and writes them as JSON beside the checkpoint
(``eval_<env>.json``) or to ``+eval_output=PATH``.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

from ragen_turn.train import CONFIG_DIR, quiet_transformers

COLUMNS = [("success", "val/success"), ("mean reward", "val/reward"), ("mean turns", "val/turns"),
           ("invalid actions", "val/invalid_action_rate"), ("format errors", "val/format_error_rate")]


def resolve_checkpoint(path: str) -> Path:
    """A checkpoint dir (with actor/), a run dir (uses checkpoints/latest) or an HF model dir."""
    p = Path(path).expanduser()
    if (p / "checkpoints" / "latest").is_file():
        p = p / "checkpoints" / (p / "checkpoints" / "latest").read_text().strip()
    if (p / "actor" / "config.json").is_file():
        return p / "actor"
    if (p / "config.json").is_file():
        return p
    raise FileNotFoundError(f"{path!r} is not a checkpoint: expected <run>/checkpoints/latest, <ckpt>/actor/config.json "
                            "or a Hugging Face model directory")


def format_table(metrics: dict, title: str) -> str:
    head = "| model | episodes | " + " | ".join(c for c, _ in COLUMNS) + " |"
    sep = "|" + "---|" * (len(COLUMNS) + 2)
    row = f"| {title} | {int(metrics['episodes'])} | " + " | ".join(f"{metrics[k]:.3f}" for _, k in COLUMNS) + " |"
    return "\n".join([head, sep, row])


def evaluate_checkpoint(cfg: DictConfig) -> dict:
    import torch

    from ragen_turn.engines.local.trainer import evaluate_policy, pick_device, validate_config
    from ragen_turn.models import load_model_and_tokenizer
    from ragen_turn.rollout import EnvGroupManager

    ckpt = resolve_checkpoint(str(cfg.checkpoint))
    with open_dict(cfg):
        cfg.model.path = str(ckpt)
        cfg.model.warmstart.enable = False
    validate_config(cfg)
    device = pick_device(cfg.device)
    model, tok = load_model_and_tokenizer(OmegaConf.to_container(cfg.model, resolve=True), device="cpu",
                                          dtype=cfg.dtype)
    model.to(device)
    torch.manual_seed(cfg.seed)
    envs = EnvGroupManager(cfg.custom_envs, cfg.es_manager.val, "val")
    t0 = time.time()
    m = evaluate_policy(model, tok, cfg, envs, device, "val", log=lambda line: print(line, flush=True))
    m["episodes"] = len(envs)
    m["seconds"] = time.time() - t0
    m["checkpoint"] = str(ckpt)
    return m


@hydra.main(config_path=CONFIG_DIR, config_name="base", version_base="1.3")
def main(cfg: DictConfig) -> None:
    quiet_transformers()
    if "checkpoint" not in cfg:
        print("error: give the checkpoint: +checkpoint=DIR (or use eval.sh)", file=sys.stderr)
        sys.exit(2)
    try:
        OmegaConf.resolve(cfg)
        m = evaluate_checkpoint(cfg)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(format_table(m, Path(m["checkpoint"]).parent.name))
    out = Path(cfg.get("eval_output") or Path(m["checkpoint"]).parent / f"eval_{cfg.env.name}.json")
    out.write_text(json.dumps(m, indent=2, sort_keys=True) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
