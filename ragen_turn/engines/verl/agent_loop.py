"""verl agent loop ``ragen_turn_env``: one multi-turn episode of our environments per sample.

The episode is played by the engine-agnostic :func:`ragen_turn.rollout.run_episodes` (the same loop
and chat formatting as the local engine), driven by a policy whose ``generate`` asks verl's LLM
server (vLLM / SGLang) for one turn. The sampled token ids are kept as they come (token in, token
out: never decoded and re-templated), so the trainer's old log-probs are exactly those of the
sampled tokens.

Output (verl's layout): ``prompt_ids`` = the first prompt (verl left-pads it to
``rollout.prompt_length``); ``response_ids`` = every later token, sampled and environment (right
padded to ``rollout.response_length``); ``response_mask`` 1 on sampled tokens, 0 on env/template
tokens; ``reward_score`` = the episode's total reward; ``extra_fields``: ``turn_rewards`` (one per
turn), ``turn_ids`` (per response token, -1 off the response), ``turn_scores`` (verl's name, the
same rewards) and ``ragen_episode`` (the episode's counters for metrics).

Each sample's ``non_tensor_batch`` gives ``env_tag``, ``env_seed``, ``group_id`` (and ``raw_prompt``,
which verl requires). ``run_episodes`` is synchronous, so the episode runs in a worker thread and
each turn's request is handed back to the agent-loop worker's event loop.
"""
from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Sequence
from uuid import uuid4

import numpy as np
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register

from ragen_turn.envs import import_env_modules, make_env
from ragen_turn.rollout import ChatFormatter, EnvSlot, context_config, run_episodes
from ragen_turn.rollout.trajectory import Episode

from .config import AGENT_LOOP_NAME

_EPISODE_FIELDS = ("turn_rewards", "group_id", "env_seed", "tag", "success", "num_actions", "num_valid_actions",
                   "num_effective_actions", "num_dropped_actions", "format_errors", "truncated", "metrics",
                   "turn_format_ok", "turn_invalid")


# ------------------------------------------------------------------------------------------------
# per-process state: env instances (reused across episodes) and the thread pool
# ------------------------------------------------------------------------------------------------
class _EnvPool:
    """Idle env instances by tag; an episode checks one out and returns it (envs are re-seeded by reset)."""

    def __init__(self) -> None:
        self._idle: Dict[str, List[Any]] = {}
        self._lock = threading.Lock()

    def take(self, tag: str, spec: Dict[str, Any]) -> Any:
        with self._lock:
            idle = self._idle.setdefault(tag, [])
            if idle:
                return idle.pop()
        return make_env(spec["env_type"], dict(spec.get("env_config") or {}))

    def give(self, tag: str, env: Any) -> None:
        with self._lock:
            self._idle.setdefault(tag, []).append(env)


ENV_POOL = _EnvPool()
_EXECUTOR: Optional[ThreadPoolExecutor] = None
_EXECUTOR_LOCK = threading.Lock()


def _executor(n: int) -> ThreadPoolExecutor:
    global _EXECUTOR
    with _EXECUTOR_LOCK:
        if _EXECUTOR is None:
            _EXECUTOR = ThreadPoolExecutor(max_workers=max(1, n), thread_name_prefix="ragen_env")
        return _EXECUTOR


class LockedTokenizer:
    """The tokenizer behind one lock: episodes run in threads, and a fast tokenizer's ``__call__``
    re-sets its Rust-side truncation/padding state, which concurrent calls must not interleave."""

    def __init__(self, tokenizer: Any):
        self._tok = tokenizer
        self._lock = threading.RLock()

    def __call__(self, *args, **kwargs):
        with self._lock:
            return self._tok(*args, **kwargs)

    def decode(self, *args, **kwargs):
        with self._lock:
            return self._tok.decode(*args, **kwargs)

    def apply_chat_template(self, *args, **kwargs):
        with self._lock:
            return self._tok.apply_chat_template(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tok, name)


_FORMATTERS: Dict[int, ChatFormatter] = {}


def formatter_for(tokenizer: Any) -> ChatFormatter:
    """One ChatFormatter (over a locked tokenizer) per tokenizer and process; verl builds an agent loop per sample."""
    with _EXECUTOR_LOCK:
        if id(tokenizer) not in _FORMATTERS:
            _FORMATTERS[id(tokenizer)] = ChatFormatter(LockedTokenizer(tokenizer))
        return _FORMATTERS[id(tokenizer)]


# ------------------------------------------------------------------------------------------------
# layout: one finished Episode -> verl's AgentLoopOutput
# ------------------------------------------------------------------------------------------------
def episode_summary(ep: Episode) -> Dict[str, Any]:
    return {k: getattr(ep, k) for k in _EPISODE_FIELDS}


def episode_from_summary(summary: Dict[str, Any]) -> Episode:
    """An Episode (without tokens) for the local engine's metric helpers."""
    return Episode(token_ids=[], response_mask=[], turn_ids=[], **{k: summary[k] for k in _EPISODE_FIELDS})


def episode_to_output(ep: Episode, prompt_length: int, response_length: int,
                      sampled_logprobs: Optional[Sequence[float]] = None, metrics: Optional[dict] = None
                      ) -> AgentLoopOutput:
    """verl's layout for one episode (see the module docstring).

    Raises ValueError when the first prompt exceeds ``prompt_length`` or the rest exceeds
    ``response_length`` (verl pads to those widths and cannot truncate without breaking turns).
    """
    if 1 not in ep.response_mask:
        raise ValueError("the episode has no sampled token")
    n_prompt = ep.response_mask.index(1)
    prompt_ids = list(ep.token_ids[:n_prompt])
    response_ids = list(ep.token_ids[n_prompt:])
    mask = [int(m) for m in ep.response_mask[n_prompt:]]
    if len(prompt_ids) > prompt_length:
        raise ValueError(f"the first prompt has {len(prompt_ids)} tokens > rollout.prompt_length={prompt_length}: "
                         "raise engine.verl.prompt_length")
    if len(response_ids) > response_length:
        raise ValueError(f"the episode after its first prompt has {len(response_ids)} tokens > "
                         f"rollout.response_length={response_length} (agent_proxy.max_context_tokens)")
    logprobs = None
    if sampled_logprobs is not None:
        if len(sampled_logprobs) != sum(mask):
            raise ValueError(f"{len(sampled_logprobs)} log-probs for {sum(mask)} sampled tokens")
        it = iter(sampled_logprobs)
        logprobs = [float(next(it)) if m else 0.0 for m in mask]
    turn_rewards = [float(r) for r in ep.turn_rewards]
    return AgentLoopOutput(
        prompt_ids=prompt_ids,
        response_ids=response_ids,
        response_mask=mask,
        response_logprobs=logprobs,
        reward_score=float(sum(turn_rewards)),
        num_turns=2 * ep.num_turns,  # verl counts chat messages (user + assistant)
        metrics=metrics or {},
        extra_fields={
            "turn_rewards": turn_rewards,
            "turn_scores": turn_rewards,
            "turn_ids": [int(t) for t in ep.turn_ids[n_prompt:]],
            "ragen_episode": episode_summary(ep),
        },
    )


# ------------------------------------------------------------------------------------------------
# the policy: one verl server request per turn, from the episode's thread
# ------------------------------------------------------------------------------------------------
STOP_STRINGS = ["</answer>"]  # as the local engine's sampler: a turn ends with its answer


def stop_token_ids(tokenizer: Any) -> List[int]:
    """The end-of-sequence id and the chat template's end-of-message id (``<|im_end|>``) when it has one."""
    ids = set()
    for t in (tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")):
        if isinstance(t, int) and t >= 0 and t != tokenizer.unk_token_id:
            ids.add(t)
    return sorted(ids)


def request_seed(episode_seed: int, turn: int) -> int:
    """The sampling seed of one turn's request (vLLM's ``seed``; the hf rollout's per-request generator)."""
    return int(np.random.SeedSequence([int(episode_seed), int(turn)]).generate_state(1, dtype=np.uint64)[0] % 2**63)


class ServerPolicy:
    """``Policy.generate`` over verl's async LLM server client, called from a worker thread.

    Each request asks for at most ``max_new_tokens``, stops at :data:`STOP_STRINGS` (kept in the
    output) or ``stop_token_ids``, and carries a seed from ``episode_seed`` and the turn, so a
    seeded run samples the same tokens whatever requests the server batches together.
    """

    def __init__(self, server_manager: Any, sampling_params: Dict[str, Any], loop: asyncio.AbstractEventLoop,
                 request_id: str, episode_seed: Optional[int] = None, stop_ids: Sequence[int] = ()):
        self.server = server_manager
        self.sampling_params = dict(sampling_params, stop=list(STOP_STRINGS), include_stop_str_in_output=True,
                                    stop_token_ids=list(stop_ids))
        self.loop = loop
        self.request_id = request_id
        self.episode_seed = episode_seed
        self.turn = 0
        self.logprobs: Optional[List[float]] = []
        self.num_preempted = 0

    def generate(self, prompts: List[List[int]], max_new_tokens: int) -> List[List[int]]:
        outs = []
        for ids in prompts:
            params = dict(self.sampling_params, max_tokens=int(max_new_tokens))
            if self.episode_seed is not None:
                params["seed"] = request_seed(self.episode_seed, self.turn)
            self.turn += 1
            coro = self.server.generate(request_id=self.request_id, prompt_ids=list(ids), sampling_params=params)
            out = asyncio.run_coroutine_threadsafe(coro, self.loop).result()
            tokens = list(out.token_ids)
            if self.logprobs is not None:
                if out.log_probs is not None and len(out.log_probs) == len(tokens):
                    self.logprobs.extend(float(x) for x in out.log_probs)
                else:
                    self.logprobs = None
            self.num_preempted += int(out.num_preempted or 0)
            outs.append(tokens)
        return outs


@register(AGENT_LOOP_NAME)
class RagenEnvAgentLoop(AgentLoopBase):
    """Plays one episode of ``custom_envs[env_tag]`` with seed ``env_seed`` (see the module docstring)."""

    def __init__(self, *args, **kwargs):
        kwargs.pop("tools", None)
        super().__init__(*args, **kwargs)
        self.rcfg = self.config.ragen
        import_env_modules(self.rcfg.get("env_module"))  # this worker's registry gets the run's own envs
        self.env_specs = OmegaConf.to_container(self.rcfg.custom_envs, resolve=True)
        self.ctx = context_config(self.rcfg)
        self.formatter = formatter_for(self.tokenizer)
        self.stop_ids = stop_token_ids(self.tokenizer)
        self.prompt_length = int(self.rollout_config.prompt_length)
        self.response_length = int(self.rollout_config.response_length)

    def play(self, tag: str, seed: int, group_id: int, policy: "ServerPolicy") -> Episode:
        """One episode, synchronously (runs in a worker thread): an env from the pool, run_episodes, back."""
        if tag not in self.env_specs:
            raise ValueError(f"env_tag {tag!r} is not in custom_envs ({sorted(self.env_specs)})")
        spec = self.env_specs[tag]
        env = ENV_POOL.take(tag, spec)
        try:
            slot = EnvSlot.of(tag, spec, env, group_id, seed)
            return run_episodes([slot], policy, self.formatter, self.ctx)[0]
        finally:
            ENV_POOL.give(tag, env)

    async def run(self, sampling_params: Dict[str, Any], **kwargs) -> AgentLoopOutput:
        loop = asyncio.get_running_loop()
        seed = kwargs.get("sample_seed")
        policy = ServerPolicy(self.server_manager, sampling_params, loop, uuid4().hex,
                              episode_seed=None if seed is None else int(seed), stop_ids=self.stop_ids)
        threads = int(self.rcfg.engine.verl.get("env_threads", 64))
        t0 = time.perf_counter()
        episode = await loop.run_in_executor(_executor(threads), self.play, str(kwargs["env_tag"]),
                                             int(kwargs["env_seed"]), int(kwargs["group_id"]), policy)
        metrics = {"generate_sequences": time.perf_counter() - t0, "num_preempted": policy.num_preempted}
        return episode_to_output(episode, self.prompt_length, self.response_length, policy.logprobs, metrics)

