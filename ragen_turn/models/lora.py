"""LoRA on the actor (``actor_rollout_ref.model.lora_rank / lora_alpha / target_modules``, verl's keys), with peft.

    lora = add_lora(model, rank=8, alpha=16)     # model: a transformers causal LM, now with adapter layers in place
    lora.model is model                          # the same module: code that runs `model` runs it with the adapter
    with lora.adapter_off():                     # the base model (the reference policy for a KL term)
        ...
    lora.save(actor_dir, adapter_dir)            # the merged model (plain transformers) + the adapter (peft)
    lora.load_adapter(adapter_dir)               # a checkpoint's adapter back into the live model

Only the adapter's ``lora_A`` / ``lora_B`` matrices train; the base weights are frozen and never rewritten (the
merged weights W + (alpha / rank) B A are computed out of place, so saving leaves the base bit-identical).
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Union

import torch

INSTALL_HINT = "LoRA needs peft: pip install 'ragen_turn[lora]' (or pip install peft)"
ADAPTER = "default"  # peft's name for the one adapter


def peft_available() -> bool:
    try:
        import peft  # noqa: F401
    except ImportError:
        return False
    return True


def _target_modules(target_modules: Any) -> Union[str, List[str]]:
    """verl's ``target_modules``: ``all-linear`` (every linear layer but the output head) or a list of names."""
    if isinstance(target_modules, str):
        return target_modules
    return [str(m) for m in target_modules]


class Lora:
    """A causal LM with one LoRA adapter injected in place (``model``: the transformers module itself, its
    ``forward`` now adds the adapter) and its peft wrapper (``peft``: saving, switching the adapter off)."""

    def __init__(self, peft_model):
        self.peft = peft_model
        self.model = peft_model.get_base_model()

    def trainable(self) -> Dict[str, torch.nn.Parameter]:
        """The adapter's parameters by name (the only ones with ``requires_grad``)."""
        return {n: p for n, p in self.model.named_parameters() if p.requires_grad}

    @contextlib.contextmanager
    def adapter_off(self) -> Iterator[None]:
        """The base model inside the block (peft's ``disable_adapter``): no copy of the weights."""
        with self.peft.disable_adapter():
            yield

    @torch.no_grad()
    def merged_state_dict(self) -> Dict[str, torch.Tensor]:
        """The plain model's state dict (its own key names) with W + delta W in each adapted layer; out of place."""
        from peft.tuners.lora import LoraLayer

        state = self.model.state_dict()
        merged: Dict[str, torch.Tensor] = {}
        for name, mod in self.model.named_modules():
            if isinstance(mod, LoraLayer) and (ADAPTER in mod.lora_A or ADAPTER in mod.lora_embedding_A):
                base = mod.get_base_layer().weight
                merged[f"{name}.weight"] = (base + mod.get_delta_weight(ADAPTER).to(base.dtype)).detach()
        out = {}
        for k, v in state.items():
            if ".lora_" in k:
                continue
            plain = k.replace(".base_layer.", ".")
            out[plain] = merged.get(plain, v)
        return out

    def save(self, actor_dir: Path, adapter_dir: Optional[Path] = None) -> None:
        """``actor_dir``: the merged model, loadable with ``AutoModelForCausalLM.from_pretrained`` (no peft needed);
        ``adapter_dir``: the adapter alone (``adapter_config.json`` + ``adapter_model.safetensors``), for peft's
        ``PeftModel.from_pretrained(<base>, adapter_dir)``. Kept apart: transformers reads a directory holding an
        ``adapter_config.json`` as an adapter on the base model it names."""
        state = {k: v.contiguous() for k, v in self.merged_state_dict().items()}
        self.model.save_pretrained(actor_dir, state_dict=state)
        if adapter_dir is not None:
            self.peft.save_pretrained(adapter_dir)

    def load_adapter(self, adapter_dir: Path) -> None:
        """The adapter weights saved by :meth:`save` into the live model (a resume)."""
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        weights = load_file(str(Path(adapter_dir) / "adapter_model.safetensors"))
        result = set_peft_model_state_dict(self.peft, weights)
        missing = [k for k in getattr(result, "unexpected_keys", []) if ".lora_" in k]
        if missing:
            raise ValueError(f"{adapter_dir}: adapter weights that fit no layer of the model: {missing[:3]}")


def add_lora(model: torch.nn.Module, rank: int, alpha: float, target_modules: Any = "all-linear",
             dropout: float = 0.0) -> Lora:
    """Freeze ``model`` and inject a LoRA adapter (peft's default init: A random, B zero, so the model's outputs
    are unchanged until it trains). Returns the :class:`Lora`; ``model`` itself now runs with the adapter."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as e:
        raise ImportError(INSTALL_HINT) from e
    config = LoraConfig(r=int(rank), lora_alpha=float(alpha), target_modules=_target_modules(target_modules),
                        lora_dropout=float(dropout), bias="none", task_type="CAUSAL_LM")
    return Lora(get_peft_model(model, config))


def lora_of(model: torch.nn.Module, model_cfg: Any) -> Optional[Lora]:
    """:func:`add_lora` with verl's keys (``actor_rollout_ref.model``: ``lora_rank``, ``lora_alpha``,
    ``target_modules``), or None at rank 0 (full fine-tuning)."""
    from ragen_turn.cfg_get import cfg_get

    rank = int(cfg_get(model_cfg, "lora_rank", 0) or 0)
    if rank <= 0:
        return None
    return add_lora(model, rank, float(cfg_get(model_cfg, "lora_alpha", 16)),
                    cfg_get(model_cfg, "target_modules", "all-linear"))
