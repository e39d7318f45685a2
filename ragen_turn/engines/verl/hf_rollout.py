"""A Hugging Face transformers rollout for verl (``actor_rollout_ref.rollout.name=hf``): CPU, or a GPU without vLLM.

On a GPU machine each server loads its model on its actor worker's GPU (:func:`server_device`; untested on a
GPU so far); on the CPU platform, on cpu. Draws are made on CPU in every case (the logits of each step are
copied to the host), from each request's own CPU generator, so a seed gives the same tokens on both.

verl 0.9.1 registers only server rollouts (vLLM, SGLang, TensorRT-LLM); its old ``HFRollout`` is
synchronous and unregistered. This module adds one more server rollout through verl's two rollout
registries, so verl's own ``LLMServerManager``, load balancer, ``AgentLoopManager`` and
``CheckpointEngineManager`` drive it exactly as they drive vLLM:

- ``RolloutReplicaRegistry.register("hf", ...)`` -> :class:`HFReplica`: one :class:`HFServer` Ray actor per
  replica (one per actor worker: tensor parallel size 1), named ``hf_server_<replica rank>``.
- verl's rollout registry (``verl.workers.rollout.base._ROLLOUT_REGISTRY``, read by
  ``get_rollout_class``) -> :class:`HFServerAdapter`, the rollout object inside each hybrid
  actor worker. verl calls its ``update_weights`` after every actor update with the actor's full
  parameters; the adapter sends them to its server.

:class:`HFServer` serves verl's token-in/token-out ``generate(request_id, prompt_ids, sampling_params)``
-> ``TokenOutput``. Requests that arrive together (the agent loops of one turn) are sampled as one
left-padded batch with a KV cache (:func:`sample_batch`). Each request samples from its own
``torch.Generator`` seeded by ``sampling_params["seed"]`` (the verl engine's agent loop sets one per
episode and turn), so which requests share a batch does not change what is sampled.
Supported sampling parameters (vLLM's names): ``max_tokens``, ``temperature`` (0 = greedy), ``top_p``,
``top_k`` (-1 or 0 = off), ``seed``, ``stop`` (strings; the output keeps them, as vLLM's
``include_stop_str_in_output``), ``stop_token_ids``; ``logprobs`` are always returned (of the sampled
tokens, under the temperature-scaled distribution). Generation also stops at the tokenizer's and
the generation config's end-of-sequence ids.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import ray
import torch
from verl.workers.rollout import base as rollout_base
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, RolloutReplicaRegistry, TokenOutput

from ragen_turn.models.kv_cache import check_decode, compiled_step, feed_back, to_static
from ragen_turn.models.logprobs import positions_from_mask

logger = logging.getLogger(__name__)

ROLLOUT_NAME = "hf"
SERVER_PREFIX = "hf_server_"


def server_name(replica_rank: int) -> str:
    return f"{SERVER_PREFIX}{int(replica_rank)}"


# ------------------------------------------------------------------------------------------------
# sampling (pure torch; CPU-testable)
# ------------------------------------------------------------------------------------------------
@dataclass
class Request:
    """One generation request: ``prompt_ids`` and vLLM-named sampling parameters."""

    prompt_ids: List[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: Optional[int] = None
    stop: Tuple[str, ...] = ()
    stop_token_ids: Tuple[int, ...] = ()
    generator: Optional[torch.Generator] = field(default=None, repr=False)

    @classmethod
    def from_params(cls, prompt_ids: Sequence[int], params: Dict[str, Any], default_max_tokens: int) -> "Request":
        stop = params.get("stop") or ()
        stop = (stop,) if isinstance(stop, str) else tuple(s for s in stop if s)
        seed = params.get("seed")
        req = cls(prompt_ids=[int(t) for t in prompt_ids],
                  max_tokens=int(params.get("max_tokens") or default_max_tokens),
                  temperature=float(params.get("temperature", 1.0)), top_p=float(params.get("top_p", 1.0)),
                  top_k=int(params.get("top_k", -1) or -1), seed=None if seed is None else int(seed), stop=stop,
                  stop_token_ids=tuple(int(t) for t in (params.get("stop_token_ids") or ())))
        if req.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {req.max_tokens}")
        if req.temperature < 0 or not 0 < req.top_p <= 1:
            raise ValueError(f"bad sampling parameters: temperature={req.temperature}, top_p={req.top_p}")
        return req


def pick(logits: torch.Tensor, req: Request) -> Tuple[int, float]:
    """``logits [V]`` -> (token id, its log-prob under the temperature-scaled distribution).

    Greedy when ``temperature`` is 0 (log-prob under the raw logits); else top-k, then top-p (the
    smallest prefix of the sorted probabilities reaching ``top_p``), then one draw from ``req.generator``.
    """
    logits = logits.float()
    if req.temperature == 0:
        tok = int(logits.argmax())
        return tok, float(torch.log_softmax(logits, -1)[tok])
    logp = torch.log_softmax(logits / req.temperature, dim=-1)
    probs = logp.exp()
    if 0 < req.top_k < probs.numel():
        kth = probs.topk(req.top_k).values[-1]
        probs = probs.masked_fill(probs < kth, 0.0)
    if req.top_p < 1.0:
        sorted_p, order = probs.sort(descending=True)
        drop = sorted_p.cumsum(0) - sorted_p > req.top_p
        probs = torch.zeros_like(probs).scatter(0, order, sorted_p.masked_fill(drop, 0.0))
    tok = int(torch.multinomial(probs, 1, generator=req.generator))
    return tok, float(logp[tok])


@torch.no_grad()
def sample_batch(model: Any, requests: Sequence[Request], pad_id: int, eos_ids: Iterable[int],
                 detokenize: Any = None, decode: str = "dynamic",
                 step: Any = None) -> List[Tuple[List[int], List[float]]]:
    """Sample every request; returns ``(token ids, log-probs)`` per request, stop token/string included.

    One left-padded prefill of all prompts, then one token per step with the KV cache until every
    request has hit an end id (``eos_ids`` or its ``stop_token_ids``), one of its ``stop`` strings
    (checked on ``detokenize(tail of its tokens)``) or its ``max_tokens``. ``decode`` is the cache of the
    steps after the prefill (:mod:`ragen_turn.models.kv_cache`; the same samples in every mode) and ``step``
    the callable that runs them (the model, or its compiled step for ``compiled``).
    """
    B = len(requests)
    width = max(len(r.prompt_ids) for r in requests)
    max_new = max(r.max_tokens for r in requests)
    device = next(model.parameters()).device
    ids = torch.full((B, width), int(pad_id), dtype=torch.long)
    attn = torch.zeros(B, width, dtype=torch.long)
    for b, r in enumerate(requests):
        ids[b, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids, dtype=torch.long)
        attn[b, width - len(r.prompt_ids):] = 1
    pos = positions_from_mask(attn)
    attn, last_pos = attn.to(device), pos[:, -1:].to(device)
    out = model(input_ids=ids.to(device), attention_mask=attn, position_ids=pos.to(device),
                use_cache=True, logits_to_keep=1)
    cache, logits = out.past_key_values, out.logits[:, -1].float().cpu()  # picks draw from CPU generators
    static = to_static(model, cache, attn, max_new) if check_decode(decode) != "dynamic" else None
    if static is not None:
        cache, attn = static
    step = step if (step is not None and static is not None) else model
    eos = set(int(t) for t in eos_ids)
    results: List[Tuple[List[int], List[float]]] = [([], []) for _ in requests]
    done = [False] * B
    for k in range(max_new):  # the k-th new token; fed back, its keys/values go to slot width + k
        nxt = torch.full((B,), int(pad_id), dtype=torch.long)
        for b, r in enumerate(requests):
            if done[b]:
                continue
            tok, lp = pick(logits[b], r)
            toks, lps = results[b]
            toks.append(tok)
            lps.append(lp)
            nxt[b] = tok
            done[b] = (tok in eos or tok in r.stop_token_ids or len(toks) >= r.max_tokens
                       or (bool(r.stop) and detokenize is not None
                           and any(s in detokenize(toks[-16:]) for s in r.stop)))
        if all(done):
            break
        logits, attn, last_pos, cache = feed_back(step, nxt, attn, last_pos, cache, static is not None, width + k,
                                                  device)
        logits = logits.float().cpu()  # picks draw from CPU generators
    return results


def server_device(gpu_ids: Sequence[str], visible: Optional[str], cuda: bool) -> str:
    """Where a server samples: its actor worker's GPU, as this process numbers it, or ``cpu``.

    ``gpu_ids``: the Ray GPU ids of the worker (``get_accelerator_ids()["GPU"]``: the node's visible device
    ids); ``visible``: this process's ``CUDA_VISIBLE_DEVICES`` (Ray leaves it as the node's for an actor
    without GPUs); ``cuda``: whether torch sees a GPU here. On the CPU platform the worker's GPU is a logical
    Ray slot and torch sees none: ``cpu``.
    """
    if not cuda or not gpu_ids:
        return "cpu"
    gid = str(gpu_ids[0])
    order = [x.strip() for x in visible.split(",")] if visible else None
    if order is None:
        return f"cuda:{int(gid)}"
    if gid not in order:
        raise ValueError(f"the actor worker's GPU {gid} is not among this process's "
                         f"CUDA_VISIBLE_DEVICES={visible}")
    return f"cuda:{order.index(gid)}"


def end_ids(tokenizer: Any, generation_config: Any = None) -> List[int]:
    """End-of-sequence ids: the tokenizer's and the generation config's (an int or a list)."""
    ids = set()
    for t in (getattr(tokenizer, "eos_token_id", None), getattr(generation_config, "eos_token_id", None)):
        for x in (t if isinstance(t, (list, tuple)) else [t]):
            if isinstance(x, int) and x >= 0:
                ids.add(x)
    return sorted(ids)


# ------------------------------------------------------------------------------------------------
# the server (a Ray actor) and the replica that launches it
# ------------------------------------------------------------------------------------------------
class HFServer:
    """verl's token-in/token-out server interface over a transformers causal LM (see the module docstring).

    Holds its own copy of the policy, loaded from ``model_config.local_path`` and replaced by
    :meth:`load_weights` after every actor update. ``generate`` calls that arrive while a batch is
    being sampled wait and form the next batch.
    """

    def __init__(self, config: Any, model_config: Any, replica_rank: int = 0, gpu_ids: Sequence[str] = ()):
        import os

        from transformers import AutoModelForCausalLM
        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.config import HFModelConfig, RolloutConfig

        self.config = omega_conf_to_dataclass(config, dataclass_type=RolloutConfig)
        self.model_config = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        self.replica_rank = int(replica_rank)
        # on a GPU machine the server shares its actor worker's GPU; on the CPU platform it stays on cpu
        self.device = server_device(gpu_ids, os.environ.get("CUDA_VISIBLE_DEVICES"),
                                    torch.cuda.is_available())
        self.model = AutoModelForCausalLM.from_pretrained(
            self.model_config.local_path, dtype=getattr(torch, str(self.config.dtype)),
            attn_implementation="sdpa", trust_remote_code=self.model_config.trust_remote_code,
        ).to(self.device).eval()
        self.tokenizer = self.model_config.tokenizer
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.eos_ids = end_ids(self.tokenizer, getattr(self.model, "generation_config", None))
        self.default_max_tokens = int(self.config.response_length)
        # actor_rollout_ref.rollout.decode, mapped to rollout.engine_kwargs.hf.decode (vLLM's options: .vllm)
        hf_kwargs = (getattr(self.config, "engine_kwargs", None) or {}).get("hf") or {}
        self.decode = check_decode(str(hf_kwargs.get("decode", "dynamic")))
        self._step = compiled_step(self.model, self.device) if self.decode == "compiled" else self.model
        logger.warning("hf rollout server %d samples on %s (decode=%s)", self.replica_rank, self.device, self.decode)
        self.global_steps: Optional[int] = None
        self._queue: List[Tuple[Request, asyncio.Future]] = []
        self._worker: Optional[asyncio.Task] = None
        self._fallback = torch.Generator().manual_seed(int(getattr(self.config, "seed", 0) or 0) + self.replica_rank)
        self.requests_served = 0

    # ---- generation
    async def generate(self, request_id: str, prompt_ids: List[int], sampling_params: Dict[str, Any],
                       image_data: Any = None, video_data: Any = None, **kwargs) -> TokenOutput:
        if image_data is not None or video_data is not None:
            raise ValueError("the hf rollout serves text only")
        req = Request.from_params(prompt_ids, sampling_params, self.default_max_tokens)
        req.generator = (torch.Generator().manual_seed(req.seed) if req.seed is not None else self._fallback)
        fut = asyncio.get_running_loop().create_future()
        self._queue.append((req, fut))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain())
        tokens, logprobs = await fut
        return TokenOutput(token_ids=tokens, log_probs=logprobs, stop_reason="completed", num_preempted=0,
                           extra_fields={"global_steps": self.global_steps})

    async def _drain(self) -> None:
        while self._queue:
            await asyncio.sleep(0)  # let the requests sent together arrive
            batch, self._queue = self._queue, []
            try:
                outs = await asyncio.to_thread(sample_batch, self.model, [r for r, _ in batch], self.pad_id,
                                               self.eos_ids, self.tokenizer.decode, self.decode, self._step)
            except Exception as e:  # hand the error to every waiting request
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(e)
                continue
            self.requests_served += len(batch)
            for (_, fut), res in zip(batch, outs):
                if not fut.done():
                    fut.set_result(res)

    # ---- weights
    def load_weights(self, named_tensors: Dict[str, torch.Tensor]) -> int:
        """Replace the model's parameters by ``named_tensors`` (the actor's, HF names); returns how many.

        Raises on a name the model does not have, or when a parameter stays unset (tied
        embeddings excepted: ``lm_head.weight`` follows the input embeddings).
        """
        own = self.model.state_dict()
        unknown = sorted(set(named_tensors) - set(own))
        if unknown:
            raise KeyError(f"actor weights not in the rollout model: {unknown[:5]}")
        tied = {"lm_head.weight"} if getattr(self.model.config, "tie_word_embeddings", False) else set()
        missing = sorted(set(own) - set(named_tensors) - tied)
        if missing:
            raise KeyError(f"rollout parameters the actor did not send: {missing[:5]}")
        self.model.load_state_dict(named_tensors, strict=False)
        return len(named_tensors)

    def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = int(global_steps)

    def parameter_checksum(self) -> float:
        """Sum of all parameters (tests check that weight sync reached the server)."""
        return float(sum(p.double().sum() for p in self.model.parameters()))

    # ---- verl's control calls (nothing to free or resume: the model stays where it was loaded)
    async def wake_up(self, tags: Optional[List[str]] = None) -> None:
        return None

    async def sleep(self) -> None:
        return None

    async def clear_kv_cache(self) -> None:
        return None

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        return None

    async def abort_all_requests(self, reject_request: bool = False) -> Dict[str, Any]:
        return {"aborted_count": 0, "request_ids": []}

    async def resume_generation(self) -> None:
        return None

    async def start_profile(self, **kwargs) -> None:
        return None

    async def stop_profile(self) -> None:
        return None


class HFReplica(RolloutReplica):
    """verl rollout replica ``hf``: launches one :class:`HFServer` next to its (hybrid) actor worker."""

    async def launch_servers(self) -> None:
        if len(self.workers) != self.world_size:
            raise RuntimeError(f"hf replica {self.replica_rank}: {len(self.workers)} workers for world size "
                               f"{self.world_size}")
        node_id, gpu_ids = await self.workers[0].__ray_call__.remote(
            lambda w: (ray.get_runtime_context().get_node_id(),
                       list(ray.get_runtime_context().get_accelerator_ids().get("GPU", []))))
        name = server_name(self.replica_rank)
        server = ray.remote(HFServer).options(
            name=name, num_cpus=0, max_concurrency=self.max_concurrency,
            scheduling_strategy=ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(node_id=node_id,
                                                                                               soft=False),
        ).remote(config=self.config, model_config=self.model_config, replica_rank=self.replica_rank,
                 gpu_ids=gpu_ids)
        self.servers = [server]
        self._server_handle = server
        self._server_address = name  # the load balancer's key (there is no HTTP endpoint)


class HFServerAdapter(BaseRollout):
    """The ``hf`` rollout inside verl's hybrid actor worker: sends the actor's weights to its server.

    verl's ``ActorRolloutRefWorker.update_weights`` (naive checkpoint engine) calls
    :meth:`update_weights` on every rank with the actor's full parameters, in HF names.
    """

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, replica_rank: int = -1):
        import os

        super().__init__(config, model_config, device_mesh)
        tp = int(self.config.tensor_model_parallel_size) * int(self.config.data_parallel_size) * int(
            self.config.pipeline_model_parallel_size)
        if tp != 1:
            raise ValueError(f"the hf rollout runs one server per actor worker: rollout tensor/data/pipeline "
                             f"parallel sizes must be 1 (got a world size of {tp})")
        rank = int(os.environ.get("RANK", 0))
        self.replica_rank = rank if replica_rank == -1 else int(replica_rank)
        self.server_handle = None

    def _server(self):
        if self.server_handle is None:
            self.server_handle = ray.get_actor(server_name(self.replica_rank))
        return self.server_handle

    async def resume(self, tags: List[str]) -> None:
        return None

    async def release(self) -> None:
        return None

    @torch.no_grad()
    async def update_weights(self, weights, global_steps: Optional[int] = None, wire_format: str = "named_tensors",
                             **kwargs) -> None:
        if wire_format != "named_tensors":
            raise ValueError(f"the hf rollout takes full named tensors, not {wire_format!r}")
        if kwargs.get("peft_config") is not None:
            raise ValueError("the hf rollout does not take LoRA adapters")
        named = {}
        for name, tensor in weights:
            if hasattr(tensor, "full_tensor"):  # a DTensor shard -> the full parameter (collective)
                tensor = tensor.full_tensor()
            named[name] = tensor.detach().to("cpu", copy=True)
        server = self._server()
        await server.load_weights.remote(named)
        if global_steps is not None:
            await server.set_global_steps.remote(global_steps)


def register_all() -> None:
    """``hf`` in verl's rollout-replica registry and its rollout registry (idempotent)."""
    RolloutReplicaRegistry.register(ROLLOUT_NAME, lambda: HFReplica)
    rollout_base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = f"{__name__}.HFServerAdapter"


register_all()
