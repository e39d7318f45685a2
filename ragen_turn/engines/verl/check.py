"""Map an ``engine=verl`` config for a machine and run verl's own checks on it, without Ray or a GPU.

    python -m ragen_turn.engines.verl.check [--gpus N] [--installed vllm,sglang,flash_attn] OVERRIDES...

With no ``--gpus`` / ``--installed`` the machine is this one (:meth:`Host.this_machine`); with them, the
machine the run is for (e.g. ``--gpus 8 --installed vllm`` on a laptop). Prints the verl keys the GPU path
depends on (placement, rollout engines, batches, FSDP strategy and dtypes) and exits 0, or prints the error
(naming the key) and exits 2. The model directory is ``model.path`` or the built model (``model=tiny`` /
``smollm2-135m``), without the SFT warm start: the checks read only its config and tokenizer.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, Dict, List, Optional


def summary(vcfg: Any, built: Dict[str, Any]) -> List[str]:
    """One line per mapped value the GPU path depends on."""
    a, r = built["actor"], built["rollout"]
    t = vcfg.trainer
    lines = [
        f"trainer.device={t.device} n_gpus_per_node={t.n_gpus_per_node} nnodes={t.nnodes}",
        f"rollout.name={r.name} tensor_model_parallel_size={r.tensor_model_parallel_size} "
        f"gpu_memory_utilization={r.gpu_memory_utilization} dtype={r.dtype} engines={len(built['replicas'])}",
        f"data.train_batch_size={vcfg.data.train_batch_size} "
        f"actor.ppo_mini_batch_size={a.ppo_mini_batch_size} "
        f"actor.ppo_micro_batch_size_per_gpu={a.ppo_micro_batch_size_per_gpu} "
        f"rollout.log_prob_micro_batch_size_per_gpu={r.log_prob_micro_batch_size_per_gpu}",
        f"actor.strategy={a.strategy} fsdp_config.mixed_precision={dict(a.fsdp_config.mixed_precision)} "
        f"use_torch_compile={a.fsdp_config.use_torch_compile}",
        f"model.attn_implementation={vcfg.actor_rollout_ref.model.override_config.attn_implementation} "
        f"gradient_checkpointing={built['model'].enable_gradient_checkpointing}",
    ]
    if "critic" in built:
        c = built["critic"]
        lines.append(f"critic.strategy={c.strategy} "
                     f"ppo_micro_batch_size_per_gpu={c.ppo_micro_batch_size_per_gpu}")
    if "ref" in built:
        lines.append(f"ref.strategy={built['ref'].strategy} "
                     f"ppo_micro_batch_size_per_gpu={built['ref'].ppo_micro_batch_size_per_gpu}")
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ragen_turn.engines.verl.check",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", type=int, default=None, help="CUDA devices of the machine the run is for")
    ap.add_argument("--installed", default=None,
                    help="comma-separated: which of vllm, sglang, flash_attn it has")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, as for train.sh (engine=verl is added)")
    a = ap.parse_args(argv)
    from ragen_turn.engines.verl import require_verl

    require_verl()
    from ragen_turn.compose import compose_config
    from ragen_turn.models import resolve_model_path

    from .config import OPTIONAL_PACKAGES, Host, check_verl_config, to_verl_config

    here = Host.this_machine()
    installed = here.installed if a.installed is None else frozenset(x for x in a.installed.split(",") if x)
    unknown = sorted(installed - set(OPTIONAL_PACKAGES))
    if unknown:
        print(f"error: --installed takes {', '.join(OPTIONAL_PACKAGES)}; got {', '.join(unknown)}",
              file=sys.stderr)
        return 2
    host = Host(here.cuda_devices if a.gpus is None else a.gpus, installed)
    try:
        cfg = compose_config(["engine=verl", *a.overrides])  # the config pipeline; to_verl_config checks it
        path = cfg.model.get("path") or resolve_model_path(dict(cfg.model), dtype=cfg.dtype)
        vcfg = to_verl_config(cfg, model_path=str(path), host=host)
        built = check_verl_config(vcfg)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    have = ", ".join(sorted(host.installed)) or "none"
    print(f"[verl check] host: {host.cuda_devices} GPU(s), installed: {have}")
    for line in summary(vcfg, built):
        print("  " + line)
    print("[verl check] verl's config classes and checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
