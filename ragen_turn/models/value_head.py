"""Critic: a transformer backbone + scalar value head (`CriticModel`), saved and loaded beside its actor.

Shapes: B = batch, T = tokens, H = hidden size. Masks are 0/1 integer or bool tensors.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .last_layer import hidden_where_read, last_layer_supported
from .logprobs import base_model, model_inputs, positions_from_mask

VALUE_HEAD_FILE = "value_head.safetensors"
CRITIC_CONFIG_FILE = "critic_config.json"


class CriticModel(torch.nn.Module):
    """Value model: a transformer backbone (e.g. `Qwen2Model`) + `Linear(H, 1)` value head, kept in float32.

    `forward(input_ids[B,T], attention_mask[B,T], position_ids[B,T] | None) -> values[B,T]` (float32):
    `values[:, t]` is V read at the hidden state of token t. Padding positions hold arbitrary numbers: mask them.
    The turn critic reads V(s_h) at the last token before turn h's first response token (docs/SPEC.md, "Critic").

    The head is zero-initialised by default (`init_std=0.0`), so a fresh critic predicts 0 everywhere.
    """

    def __init__(self, backbone: torch.nn.Module, init_std: float = 0.0):
        super().__init__()
        self.backbone = base_model(backbone)
        hidden = self.backbone.config.hidden_size
        self.value_head = torch.nn.Linear(hidden, 1, dtype=torch.float32)
        with torch.no_grad():
            if init_std > 0:
                self.value_head.weight.normal_(0.0, init_std)
            else:
                self.value_head.weight.zero_()
            self.value_head.bias.zero_()
        self.init_std = float(init_std)

    @property
    def config(self):
        return self.backbone.config

    @classmethod
    def from_causal_lm(cls, causal_lm: torch.nn.Module, init_std: float = 0.0) -> "CriticModel":
        """A separate critic initialised from the actor: deep copy of the actor's backbone (no lm_head) + new head."""
        backbone = copy.deepcopy(base_model(causal_lm))
        for p in backbone.parameters():
            p.requires_grad_(True)
        critic = cls(backbone, init_std=init_std)
        device = next(backbone.parameters()).device
        critic.value_head.to(device)
        return critic

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                position_ids: torch.Tensor | None = None, causal: bool = False,
                read: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids[B,T], attention_mask[B,T], position_ids[B,T] (default: from the mask) -> values[B,T] float32.
        ``causal``: right-padded rows run plain causal attention (:func:`~ragen_turn.models.logprobs.model_inputs`).
        ``read`` ``[B,T]`` bool (optional): only these positions' values are wanted; on a plain Qwen2 / Llama body
        the last layer then runs there only (:mod:`~ragen_turn.models.last_layer`) and the values elsewhere are 0."""
        if position_ids is None:
            position_ids = positions_from_mask(attention_mask)
        mask, position_ids = model_inputs(attention_mask, position_ids, causal)
        if read is not None and last_layer_supported(self.backbone):
            hidden = hidden_where_read(self.backbone, input_ids, mask, position_ids, read)   # [n, H]
            values = self.values_from_hidden(hidden[None])[0]                                # [n]
            return values.new_zeros(input_ids.shape).index_put(read.bool().nonzero(as_tuple=True), values)
        out = self.backbone(input_ids=input_ids, attention_mask=mask, position_ids=position_ids, use_cache=False)
        hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]     # [B,T,H]
        return self.values_from_hidden(hidden)

    def values_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden[B,T,H] (the backbone's last hidden state) -> values[B,T] float32."""
        w, b = self.value_head.weight, self.value_head.bias
        return F.linear(hidden.float(), w.float(), b.float()).squeeze(-1)

    @torch.no_grad()
    def fit_head(self, features: torch.Tensor, targets: torch.Tensor, ridge: float = 1e-3) -> None:
        """Set the value head to the ridge least-squares fit of ``targets`` ``[N]`` on ``features`` ``[N, H]``
        (the backbone's last hidden states where the values are read): ``min_w,b |X w + b - y|^2 + ridge N |w|^2``
        (in float64; the bias is not penalised), the backbone left as it is."""
        X = features.double()
        Xb = torch.cat([X, torch.ones(len(X), 1, dtype=X.dtype, device=X.device)], dim=1)
        reg = torch.eye(Xb.shape[1], dtype=X.dtype, device=X.device) * ridge * len(X)
        reg[-1, -1] = 0.0
        w = torch.linalg.solve(Xb.T @ Xb + reg, Xb.T @ targets.double())
        self.value_head.weight.copy_(w[:-1].float()[None])
        self.value_head.bias.copy_(w[-1:].float())

    @classmethod
    def on_shared_backbone(cls, causal_lm: torch.nn.Module, init_std: float = 0.0) -> "CriticModel":
        """A value head on the actor's own backbone (no copy: the parameters are the actor's)."""
        critic = cls(causal_lm, init_std=init_std)
        critic.value_head.to(next(causal_lm.parameters()).device)
        return critic

    def save_value_head(self, save_dir: str | Path) -> None:
        """Only the head (value_head.safetensors): for a critic on a shared backbone saved with its actor."""
        from safetensors.torch import save_file

        save_dir = Path(save_dir)
        save_dir.mkdir(parents=True, exist_ok=True)
        head = {k: v.detach().float().cpu().contiguous() for k, v in self.value_head.state_dict().items()}
        save_file(head, str(save_dir / VALUE_HEAD_FILE))

    def load_value_head(self, load_dir: str | Path) -> None:
        from safetensors.torch import load_file

        self.value_head.load_state_dict(load_file(str(Path(load_dir) / VALUE_HEAD_FILE)))

    def gradient_checkpointing_enable(self, **kwargs: Any) -> None:
        self.backbone.gradient_checkpointing_enable(**kwargs)

    def save_pretrained(self, save_dir: str | Path) -> None:
        """Backbone via its `save_pretrained` (config.json + model.safetensors), head as value_head.safetensors."""
        self.backbone.save_pretrained(save_dir)
        self.save_value_head(save_dir)
        (Path(save_dir) / CRITIC_CONFIG_FILE).write_text(json.dumps(
            {"hidden_size": self.value_head.in_features, "init_std": self.init_std}, indent=2) + "\n")

    @classmethod
    def from_pretrained(cls, load_dir: str | Path, dtype: Any = None, device: Any = "cpu") -> "CriticModel":
        """Inverse of `save_pretrained`; `dtype` is the backbone's (the head stays float32)."""
        from transformers import AutoModel

        load_dir = Path(load_dir)
        kwargs = {"local_files_only": True}
        if dtype is not None:
            from .hf import torch_dtype
            kwargs["dtype"] = torch_dtype(dtype)
        backbone = AutoModel.from_pretrained(load_dir, **kwargs)
        meta = json.loads((load_dir / CRITIC_CONFIG_FILE).read_text()) if (load_dir / CRITIC_CONFIG_FILE).is_file() \
            else {}
        critic = cls(backbone, init_std=meta.get("init_std", 0.0))
        critic.load_value_head(load_dir)
        return critic.to(device)
