"""Held-out evaluation of a checkpoint: ``bash eval.sh <env> <checkpoint_dir> [overrides]``.

Prints success rate, mean reward, mean turns and invalid-action rate on the val env groups
(seeds that training never uses) as a table, and writes them as JSON into the run directory of the checkpoint
(``<run>/eval/<env>_<step>.json``), for a model outside any run under ``trainer.runs_dir``
(``<runs>/eval_<model>/eval_<env>.json``), or to ``eval.sh --out PATH`` (``+eval_output=PATH``): never into the
model directory it reads.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

from ragen_turn.compose import CONFIG_DIR, finalize
from ragen_turn.runfiles import CHECKPOINTS_DIR, CONFIG_FILE
from ragen_turn.runtime import quiet_transformers

COLUMNS = [("success", "val/success"), ("mean reward", "val/reward"), ("mean turns", "val/turns"),
           ("invalid actions", "val/invalid_action_rate"), ("format errors", "val/format_error_rate")]


def resolve_checkpoint(path: str) -> Path:
    """A checkpoint dir (with actor/), a run dir (its newest complete checkpoint, as a resume picks it) or an HF
    model dir."""
    from ragen_turn.engines.checkpoints import resume_point

    p = Path(path).expanduser()
    newest = resume_point(p / CHECKPOINTS_DIR, log=lambda line: print(line, file=sys.stderr))
    if newest is not None:
        p = newest
    if (p / "actor" / "config.json").is_file():
        return p / "actor"
    if (p / "config.json").is_file():
        return p
    raise FileNotFoundError(f"{path!r} is not a checkpoint: expected <run>/checkpoints/latest, "
                            "<ckpt>/actor/config.json or a Hugging Face model directory")


# env-specific episode metrics, shown when the env reports them (search_qa: success is EM; webshop: score)
ENV_COLUMNS = [("score", "val/score"), ("F1", "val/f1"), ("searches", "val/searches"),
               ("retrieval hit", "val/retrieval_hit")]


def format_table(metrics: dict, title: str) -> str:
    cols = COLUMNS + [c for c in ENV_COLUMNS if c[1] in metrics]
    head = "| model | episodes | " + " | ".join(c for c, _ in cols) + " |"
    sep = "|" + "---|" * (len(cols) + 2)
    row = f"| {title} | {int(metrics['episodes'])} | " + " | ".join(f"{metrics[k]:.3f}" for _, k in cols) + " |"
    return "\n".join([head, sep, row])


def point_at_checkpoint(cfg: DictConfig, ckpt: Path) -> DictConfig:
    """``cfg`` (in place) set to evaluate the model in ``ckpt`` as it is: ``model.path``, no warm start. RAGEN's
    ``model_path`` (the run's starting model; held under ``ragen_keys`` from the command line, or at the top
    level) is cleared, else the alias table would map it back onto ``model.path`` when the config is finalized."""
    with open_dict(cfg):
        cfg.model.path = str(ckpt)
        cfg.model.warmstart.enable = False
        cfg.model_path = None
        if OmegaConf.select(cfg, "ragen_keys.model_path", default=None) is not None:
            cfg.ragen_keys.model_path = None
    return cfg


def evaluate_checkpoint(cfg: DictConfig, on_envs=None) -> dict:
    """The val metrics of ``cfg.checkpoint``; ``on_envs`` (optional) then gets the played ``EnvGroupManager`` (each
    slot's env in its episode's last state, ``slot.seed`` its room). ``cfg`` is pointed at the checkpoint's model
    and finalized here (``compose.finalize``: RAGEN's keys, resolved, checked), in place."""
    import torch

    from ragen_turn.engines.local.trainer import evaluate_policy
    from ragen_turn.runtime import pick_device
    from ragen_turn.models import load_model_and_tokenizer
    from ragen_turn.rollout import EnvGroupManager

    ckpt = resolve_checkpoint(str(cfg.checkpoint))
    finalize(point_at_checkpoint(cfg, ckpt))
    device = pick_device(cfg.device)
    model, tok = load_model_and_tokenizer(OmegaConf.to_container(cfg.model, resolve=True), device="cpu",
                                          dtype=cfg.dtype)
    model.to(device)
    torch.manual_seed(cfg.seed)
    envs = EnvGroupManager(cfg.custom_envs, cfg.es_manager.val, "val")
    tags = [str(t) for t in cfg.es_manager.val.env_configs.tags]
    print(f"[eval] env={cfg.env.name}: held-out tags {', '.join(tags)} ({len(envs)} episodes)", flush=True)
    t0 = time.time()
    m = evaluate_policy(model, tok, cfg, envs, device, "val", log=lambda line: print(line, flush=True))
    if on_envs is not None:
        on_envs(envs)
    m["episodes"] = len(envs)
    m["seconds"] = time.time() - t0
    m["checkpoint"] = str(ckpt)
    m["env"], m["val_tags"] = str(cfg.env.name), tags
    return m


CONFIG_GROUPS = ("env", "model", "algo", "engine", "sweep", "paper")
# the model a command names (RAGEN's eval form: --config-name NAME model_path=<run>): the checkpoint evaluated, never a
# key laid over the run's config
MODEL_PATH_KEYS = ("model.path", "model_path", "actor_rollout_ref.model.path", "ragen_keys.model_path",
                   "ragen_keys.actor_rollout_ref.model.path")


def run_config_path(path: str) -> Path | None:
    """``<run>/config.yaml`` for a run dir or a checkpoint inside one (``<run>/checkpoints/step_N[/actor]``)."""
    p = Path(path).expanduser().resolve()
    for d in (p, *p.parents[:3]):
        if (d / CONFIG_FILE).is_file() and (d / CHECKPOINTS_DIR).is_dir():
            return d / CONFIG_FILE
    return None


def run_config_name(run_cfg: Path) -> str:
    """The ``--config-name`` a run was composed from (``base``, or one of RAGEN's named runs such as ``_2_sokoban``),
    as Hydra recorded it in ``<run>/hydra/.hydra/hydra.yaml``; ``base`` when it was not recorded."""
    import yaml

    recorded = run_cfg.parent / "hydra" / ".hydra" / "hydra.yaml"
    if not recorded.is_file():
        return "base"
    job = ((yaml.safe_load(recorded.read_text()) or {}).get("hydra") or {}).get("job") or {}
    return str(job.get("config_name") or "base")


def check_eval_matches_run(run_cfg: Path, env: str | None, config_name: str | None) -> None:
    """An ``<env>`` (``env=``) or ``--config-name`` given to eval that is not the run's stops (``ValueError`` naming
    both): a run is evaluated on its own env groups (its config's val tags)."""
    import yaml

    run = run_cfg.parent
    own = yaml.safe_load(run_cfg.read_text()) or {}
    own_env = str((own.get("env") or {}).get("name"))
    tags = ", ".join(str(t) for t in ((own.get("es_manager") or {}).get("val") or {}).get("env_configs", {})
                     .get("tags", []) or [])
    if env is not None and env != own_env:
        raise ValueError(f"env={env}: {run} trained on env={own_env} (held-out tags {tags}); a run is evaluated on "
                         f"its own envs: bash eval.sh {run} (or bash eval.sh {own_env} {run})")
    own_name = run_config_name(run_cfg)
    if config_name is not None and config_name.removesuffix(".yaml") != own_name:
        raise ValueError(f"--config-name {config_name}: {run} was trained with --config-name {own_name} "
                         f"(env={own_env}); leave --config-name out to evaluate it on its own envs: bash eval.sh {run}")


def config_for_eval(cfg: DictConfig, overrides: list[str], config_name: str | None = None) -> DictConfig:
    """Evaluate a run under its own settings (prompt format, turns, env groups, response length, model), with
    this command's overrides on top; config-group choices (``env=``, ``model=``, ...) stay the run's, and an
    ``env=`` or ``config_name`` (``--config-name``) other than the run's stops (:func:`check_eval_matches_run`).

    A run started from the command line recorded its Hydra overrides (``<run>/hydra/.hydra/overrides.yaml``) and
    its config name: the config is composed again from them plus ours, so interpolations follow
    (``es_manager.val.env_groups`` -> ``n_groups``). Otherwise ``<run>/config.yaml`` (resolved) gets our
    ``key=value`` overrides. For a plain model directory ``cfg`` is used as it is."""
    import yaml
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from ragen_turn.compose import compose_config

    run_cfg = run_config_path(str(cfg.checkpoint))
    if run_cfg is None:
        return cfg
    parser = OverridesParser.create()

    def key(o) -> str:
        return o.key_or_group.lstrip("+~")

    parsed = parser.parse_overrides(overrides)
    env = next((str(o.value()) for o in parsed if key(o) == "env" and not o.is_delete()), None)
    check_eval_matches_run(run_cfg, env, None if config_name in (None, "base") else config_name)
    ours = [o for o in parsed if key(o) not in CONFIG_GROUPS and key(o) not in MODEL_PATH_KEYS]
    recorded = run_cfg.parent / "hydra" / ".hydra" / "overrides.yaml"
    if recorded.is_file():
        theirs = parser.parse_overrides([str(x) for x in (yaml.safe_load(recorded.read_text()) or [])])
        last = {}
        for o in theirs + ours:  # the last value of a key wins (a sweep records algo= twice)
            last.pop(key(o), None)
            last[key(o)] = o.input_line
        name = run_config_name(run_cfg)
        print(f"[eval] settings of {run_cfg.parent} (--config-name {name}, its overrides + {len(ours)} of this "
              "command)")
        return compose_config(list(last.values()), config_name=name)
    base = OmegaConf.load(run_cfg)
    with open_dict(base):
        for o in ours:
            if not o.is_delete():
                OmegaConf.update(base, key(o), o.value(), force_add=True)
    print(f"[eval] settings of {run_cfg} (+ {len(ours)} override(s) of this command)")
    return base


@hydra.main(config_path=CONFIG_DIR, config_name="base", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    quiet_transformers()
    if "checkpoint" not in cfg:
        print("error: give the checkpoint: +checkpoint=DIR (or use eval.sh)", file=sys.stderr)
        sys.exit(2)
    try:
        cfg = config_for_eval(cfg, list(HydraConfig.get().overrides.task), HydraConfig.get().job.config_name)
        m = evaluate_checkpoint(cfg)  # finalizes cfg (the config pipeline, once)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    # a checkpoint's actor/ -> the step dir; a plain Hugging Face model dir -> itself
    home = Path(m["checkpoint"]).parent if Path(m["checkpoint"]).name == "actor" else Path(m["checkpoint"])
    print(format_table(m, home.name))
    out = eval_output_path(cfg, home)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(m, indent=2, sort_keys=True) + "\n")
    print(f"wrote {out}")


def eval_output_path(cfg: DictConfig, home: Path) -> Path:
    """Where the JSON goes: ``+eval_output`` (``eval.sh --out``); else the run directory the checkpoint belongs to
    (``<run>/eval/<env>_<step>.json``); else, for a model directory outside any run, a directory of its own under
    ``trainer.runs_dir`` (``<runs>/eval_<model>/eval_<env>.json``). Never into the model directory read."""
    if cfg.get("eval_output"):
        return Path(str(cfg.eval_output))
    env = cfg.env.name
    run_cfg = run_config_path(str(home))
    if run_cfg is not None:
        return run_cfg.parent / "eval" / f"{env}_{home.name}.json"  # not eval_*.json: report.py columns
    return Path(str(cfg.trainer.runs_dir)) / f"eval_{home.name}" / f"eval_{env}.json"


if __name__ == "__main__":
    from ragen_turn.compose import prepare_cli

    try:
        prepare_cli()  # RAGEN's keys, env_module=... and registered envs as env= choices, as for training
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    main()
