"""The local trainer's checkpoints: writing ``checkpoints/step_N`` crash-safely, resuming from one, and what
``trainer_state.pt`` holds (step, optimizer moments, the global RNG states).

:class:`CheckpointMixin` is part of :class:`~ragen_turn.engines.local.trainer.StarPOTrainer` (it reads the
trainer's actor, critic, optimizers and config); the directory layout, atomic commits, checksums and rotation are
``engines/checkpoints.py``'s, shared with the verl engine.
"""
from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any, Dict

import numpy as np
import torch

from ragen_turn.engines import checkpoints as ckpt
from ragen_turn.engines.rundir import crash_point, writing
from ragen_turn.models import CriticModel
from ragen_turn.runfiles import TRAINER_STATE_FILE


class CheckpointMixin:
    """Save, resume and the checkpoint to name when a run stops (:class:`StarPOTrainer`'s)."""

    def checkpoint_note(self) -> str:
        """Which checkpoint to go back to, for the line that stops a run."""
        good, newest = ckpt.last_good(self.ckpt_dir), ckpt.newest_complete(self.ckpt_dir)
        if good is not None:
            return (f"The last good checkpoint (the step after it updated soundly) is {good}: resume from it with "
                    f"trainer.resume=true trainer.resume_from={ckpt.LAST_GOOD}")
        if newest is not None:
            return f"The last complete checkpoint is {newest} (resume with trainer.resume=true)"
        return f"No checkpoint was written in {self.ckpt_dir}"

    def save_checkpoint(self) -> Path:
        """Write ``checkpoints/step_N`` so that a crash at any moment leaves the previous checkpoints loadable:
        staged in ``.tmp_step_N``, renamed into place, ``latest`` replaced atomically, old ones rotated
        (``engines/checkpoints.py``)."""
        tmp = ckpt.begin(self.ckpt_dir, self.step)
        try:
            with writing(tmp / "actor"):
                if self.lora:  # actor/: the merged model (plain transformers); actor_adapter/: the adapter (peft)
                    self.lora.save(tmp / "actor", tmp / ckpt.ADAPTER_DIR)
                else:
                    self.actor.save_pretrained(tmp / "actor")
                crash_point("actor written")
                self.tokenizer.save_pretrained(tmp / "actor")
                crash_point("tokenizer written")
            state = {"format": TRAINER_STATE_FORMAT, "step": self.step, "nonfinite_in_a_row": self.nonfinite_in_a_row,
                     "kl_ctrl": None if self.kl_ctrl is None else float(self.kl_ctrl.value),
                     "actor_optim": self.actor_optim.state_dict(), "rng": rng_states()}
            with writing(tmp / "critic"):
                if self.shared_critic:
                    self.critic.save_value_head(tmp / "critic")
                elif self.critic is not None:
                    self.critic.save_pretrained(tmp / "critic")
                    state["critic_optim"] = self.critic_optim.state_dict()
                if self.value_norm is not None:
                    state["value_norm"] = self.value_norm.state_dict()
                crash_point("critic written")
            with writing(tmp / TRAINER_STATE_FILE):
                torch.save(state, tmp / TRAINER_STATE_FILE)
            crash_point("trainer state written")
            final = ckpt.commit(tmp, self.step)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)  # a failed write frees its space; the older checkpoints stay
            raise
        ckpt.rotate(self.ckpt_dir, self.cfg.trainer.keep_checkpoints)
        self.unconfirmed = final
        return final

    def _load_optimizer(self, optim: torch.optim.Optimizer, state: dict, name: str) -> None:
        """The optimizer's moments from a checkpoint; its hyperparameters (lr, weight decay, betas) stay the
        config's (``load_state_dict`` alone would bring back the checkpoint's and ignore, e.g., a new lr)."""
        mine = [{k: g[k] for k in HYPERPARAMS if k in g} for g in optim.param_groups]
        optim.load_state_dict(state)
        for i, (g, want) in enumerate(zip(optim.param_groups, mine)):
            saved = {**g, "lr": g.get("initial_lr", g["lr"])}  # its config lr, not where a warm-up had it
            changed = {k: (saved[k], v) for k, v in want.items() if saved[k] != v}
            g.update(want)
            g["initial_lr"] = g["lr"]
            if changed:
                self.log(f"[ragen_turn] resume: {name} optimizer group {i} takes the config's "
                         + ", ".join(f"{k} {old} -> {new}" for k, (old, new) in changed.items()))

    def load_checkpoint(self) -> bool:
        """Resume: ``trainer.resume_from`` when set, else the newest complete checkpoint whose files match their
        sha256 (``latest`` is read first; a missing, empty, garbage or stale one is said and passed over); one that
        fails its checksum or its load is said and the next older one tried. Checkpoints after the loaded step
        are removed."""
        name = self.cfg.trainer.get("resume_from")
        self.load_unverified = bool(self.cfg.trainer.get("load_unverified", False))
        if name:
            path = ckpt.find(self.ckpt_dir, name, verify=True, allow_unverified=self.load_unverified)
            self._load_state(path)
        else:
            tried: tuple = ()
            while True:
                path = ckpt.resume_point(self.ckpt_dir, log=self.log, skip=tried,
                                         allow_unverified=self.load_unverified)
                if path is None:
                    if ckpt.step_dirs(self.ckpt_dir):
                        raise FileNotFoundError(
                            f"trainer.resume=true: no checkpoint in {self.ckpt_dir} loads (see the lines above); "
                            "trainer.overwrite=true starts the run over")
                    self.log(f"[ragen_turn] trainer.resume=true but no checkpoint in {self.ckpt_dir}: starting fresh")
                    return False
                try:
                    self._load_state(path)
                    break
                except Exception as e:  # a file the checksum did not catch (no sha256 in its manifest)
                    self.log(f"[ragen_turn] checkpoint {path} failed to load ({type(e).__name__}: "
                             f"{str(e).strip()[:200]}); trying an older one")
                    tried += (path.name,)
        ckpt.drop_after(self.ckpt_dir, self.step, log=self.log)
        self.unconfirmed = path
        self.log(f"[ragen_turn] resumed from {path} at step {self.step}")
        return True

    def _load_state(self, path: Path) -> None:
        """Weights, optimizer moments, step and RNG states from checkpoint directory ``path``."""
        from transformers import AutoModelForCausalLM

        state = load_trainer_state(path / TRAINER_STATE_FILE)
        if self.lora:  # the frozen base is the one this run built (model.path, warm start); the adapter is saved
            if not (path / ckpt.ADAPTER_DIR).is_dir():
                raise FileNotFoundError(f"{path} has no {ckpt.ADAPTER_DIR}/: a full fine-tuning checkpoint cannot "
                                        "resume a LoRA run (actor_rollout_ref.model.lora_rank=0 resumes it)")
            self.lora.load_adapter(path / ckpt.ADAPTER_DIR)
        else:
            loaded = AutoModelForCausalLM.from_pretrained(path / "actor", dtype=self.dtype, local_files_only=True)
            self.actor.load_state_dict(loaded.state_dict())
        self._load_optimizer(self.actor_optim, state["actor_optim"], "actor")
        if self.shared_critic:
            self.critic.load_value_head(path / "critic")
        elif self.critic is not None:
            loaded_c = CriticModel.from_pretrained(path / "critic", dtype=self.cfg.dtype)
            self.critic.load_state_dict(loaded_c.state_dict())
            self._load_optimizer(self.critic_optim, state["critic_optim"], "critic")
        if self.value_norm is not None:
            if "value_norm" not in state:
                raise ValueError(f"{path} holds no value-target statistics: it was written without "
                                 "critic.target_norm=true, which this run has (resume it with the same setting)")
            self.value_norm.load_state_dict(state["value_norm"])
        self.step = int(state["step"])
        self.nonfinite_in_a_row = int(state["nonfinite_in_a_row"])
        if self.kl_ctrl is not None and state.get("kl_ctrl") is not None:  # the adaptive coefficient goes on
            self.kl_ctrl.value = float(state["kl_ctrl"])
        restore_rng_states(state["rng"])


# trainer_state.pt holds tensors and plain types only (loads with torch.load(weights_only=True): no pickle from a
# run dir); format 1 (before issue #59) held numpy's RNG state as an ndarray, which loads with numpy's array
# reconstruction allowed (NUMPY_ARRAY_GLOBALS) and nothing else
TRAINER_STATE_FORMAT = 2


def rng_states() -> Dict[str, Any]:
    """Python's, numpy's and torch's global RNG states as tensors and plain types (``weights_only`` loadable)."""
    name, key, pos, has_gauss, cached = np.random.get_state()
    return {"python": random.getstate(), "torch": torch.get_rng_state(),
            "numpy": {"name": str(name), "key": torch.from_numpy(key.astype(np.int64)), "pos": int(pos),
                      "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}}


def restore_rng_states(rng: Dict[str, Any]) -> None:
    """Set the global RNGs from :func:`rng_states` (or a format-1 state: numpy's tuple)."""
    random.setstate(tuple(rng["python"][:1]) + (tuple(rng["python"][1]),) + tuple(rng["python"][2:]))
    n = rng["numpy"]
    if isinstance(n, dict):
        n = (n["name"], n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    np.random.set_state(n)
    torch.set_rng_state(rng["torch"])


def _numpy_array_globals() -> list:
    core = getattr(np, "_core", None) or np.core
    return [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def load_trainer_state(path: Path) -> Dict[str, Any]:
    """``trainer_state.pt`` with ``torch.load(weights_only=True)``: tensors and plain types, never code. A format-1
    file (numpy's RNG state as an ndarray) loads with numpy's array reconstruction allowed and nothing else."""
    with torch.serialization.safe_globals(_numpy_array_globals()):
        return torch.load(path, weights_only=True)


HYPERPARAMS = ("lr", "weight_decay", "betas")  # an optimizer's settings that come from the config, also on resume
