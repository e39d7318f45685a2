"""The multi-turn rollout loop, engine-agnostic.

A *policy* is anything with ``generate(prompts: list[list[int]], max_new_tokens: int) ->
list[list[int]]``: the local engine's sampler, a scripted solver (warm-start demonstrations,
tests) or a remote engine. Every active episode is advanced one turn per ``generate`` call, so
sampling is batched across the whole env batch.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence

from .context import ChatFormatter, ContextConfig, parse_response, system_prompt, takes_raw_response, user_message
from .env_manager import EnvSlot
from .trajectory import Episode


class Policy(Protocol):
    def generate(self, prompts: List[List[int]], max_new_tokens: int) -> List[List[int]]:
        ...


class _Live:
    """State of one episode while it runs."""

    def __init__(self, slot: EnvSlot, ids: List[int]):
        self.slot = slot
        self.ep = Episode(token_ids=list(ids), response_mask=[0] * len(ids), turn_ids=[-1] * len(ids),
                          turn_rewards=[], group_id=slot.group_id, env_seed=slot.seed, tag=slot.tag)
        self.done = False
        self.actions_left = slot.max_actions

    def add(self, ids: Sequence[int], turn: int | None, logprobs: Optional[Sequence[float]] = None) -> None:
        if logprobs is not None and len(self.ep.sampled_logprobs) == len(self.ep.token_ids):  # kept aligned
            self.ep.sampled_logprobs.extend(logprobs)
        elif turn is None and len(self.ep.sampled_logprobs) == len(self.ep.token_ids) > 0:
            self.ep.sampled_logprobs.extend([0.0] * len(ids))
        self.ep.token_ids.extend(ids)
        self.ep.response_mask.extend([1 if turn is not None else 0] * len(ids))
        self.ep.turn_ids.extend([turn if turn is not None else -1] * len(ids))


def throttled(log: Callable[[str], None], seconds: float) -> Callable[[str], None]:
    """``log`` that drops lines coming less than ``seconds`` after the last one it printed."""
    last = [time.time()]

    def emit(line: str) -> None:
        now = time.time()
        if now - last[0] >= seconds:
            last[0] = now
            log(line)

    return emit


def run_episodes(slots: Sequence[EnvSlot], policy: Policy, formatter: ChatFormatter,
                 cfg: ContextConfig, log: Optional[Callable[[str], None]] = None) -> List[Episode]:
    """Play one episode in every slot (already seeded) and return them in slot order.

    ``log``, if given, gets one progress line per turn (active episodes, elapsed seconds).
    """
    t0 = time.time()
    if hasattr(policy, "reset_cache"):  # cached keys/values belong to the weights of one rollout
        policy.reset_cache()
    try:
        return _play(slots, policy, formatter, cfg, log, t0)
    finally:
        if hasattr(policy, "reset_cache"):
            policy.reset_cache()


def _play(slots: Sequence[EnvSlot], policy: Policy, formatter: ChatFormatter, cfg: ContextConfig,
          log: Optional[Callable[[str], None]], t0: float) -> List[Episode]:
    live: List[_Live] = []
    for slot in slots:
        obs = slot.env.reset(seed=slot.seed)
        ids = formatter.first_prompt(system_prompt(slot.instruction, cfg, takes_raw_response(slot.env)),
                                     user_message(str(obs), 0, cfg))
        if len(ids) + cfg.response_length > cfg.max_context_tokens:
            raise ValueError(f"the first prompt ({len(ids)} tokens) plus one response "
                             f"(actor_rollout_ref.rollout.response_length={cfg.response_length}) does not fit "
                             f"agent_proxy.max_context_tokens={cfg.max_context_tokens}")
        live.append(_Live(slot, ids))

    for turn in range(cfg.max_turn):
        active = [s for s in live if not s.done]
        if not active:
            break
        if log is not None:
            spent = time.time() - t0  # later turns have fewer active episodes: the ETA is an upper bound
            bound = f", ETA <= {spent / turn * (cfg.max_turn - turn):.0f}s" if turn else ""
            log(f"[rollout] turn {turn + 1}/{cfg.max_turn}: {len(active)}/{len(live)} episodes active, "
                f"{spent:.0f}s{bound}")
        if hasattr(policy, "observe"):  # scripted policies read the env state of each prompt
            policy.observe([s.slot for s in active])
        responses = policy.generate([s.ep.token_ids for s in active], cfg.response_length)
        if len(responses) != len(active):
            raise RuntimeError(f"policy returned {len(responses)} responses for {len(active)} prompts")
        logprobs = getattr(policy, "last_logprobs", None) or [None] * len(active)  # the sampler's, when it keeps them
        for s, resp, lps in zip(active, responses, logprobs):
            resp = list(resp)
            if not resp:
                raise RuntimeError("policy returned an empty response (it must sample at least one token)")
            if lps is not None and turn == 0:  # the first prompt's tokens: 0 (no log-prob)
                s.ep.sampled_logprobs = [0.0] * len(s.ep.token_ids)
            s.add(resp, turn, lps)
            text = formatter.decode(resp)
            s.ep.texts.append(text)
            reward, feedback = _step_env(s, text, cfg)
            s.ep.turn_rewards.append(reward)
            if not s.done and (turn == cfg.max_turn - 1 or s.actions_left <= 0):
                s.done, s.ep.truncated = True, True  # out of turns or actions before the env ended: truncated
            if not s.done:
                obs = s.slot.env.render()
                env_ids = formatter.env_turn(user_message(str(obs), turn + 1, cfg, reward, feedback), resp)
                # Context-window policy: if the next observation plus a full response would not fit,
                # the episode ends here (truncated); the history is never cut, so tokens stay exact.
                if len(s.ep.token_ids) + len(env_ids) + cfg.response_length > cfg.max_context_tokens:
                    s.done, s.ep.truncated = True, True
                else:
                    s.add(env_ids, None)
    return [s.ep for s in live]


def declared_actions(env: Any) -> Optional[Dict[Any, str]]:
    """The env's action id -> name table when it declares one (RAGEN's ``env.config.action_lookup``, else
    the env's ``ACTION_LOOKUP``); ``None`` for envs whose actions are free text. Read it every turn: an
    env may draw its table at reset (RAGEN's Bandit)."""
    lookup = getattr(getattr(env, "config", None), "action_lookup", None) or getattr(env, "ACTION_LOOKUP", None)
    return dict(lookup) if lookup else None


def env_action_ids(env: Any) -> Optional[Dict[str, Any]]:
    """Lower-cased action name -> the id the env is stepped with (``None``: free-text actions)."""
    lookup = declared_actions(env)
    return None if lookup is None else {str(name).lower(): k for k, name in lookup.items()}


def _step_env(s: _Live, text: str, cfg: ContextConfig) -> tuple[float, str]:
    """RAGEN's env-state manager step: parse the response, map action names to the env's ids (when it
    declares them), drop the names it does not know, step the env with the rest (within the episode's
    action budget). One ``format_penalty`` per turn when the answer is missing or any action was
    dropped. Returns (turn reward, feedback text).

    An env that takes the raw response (search_qa) gets the whole text as its one action and scores the
    format itself (a response it calls invalid counts as a format error)."""
    raw = takes_raw_response(s.slot.env)
    if raw:
        actions, ok = [text], True
    else:
        actions, ok = parse_response(text, cfg)
    ids = None if raw else env_action_ids(s.slot.env)
    valid = actions if ids is None else [ids[a.lower()] for a in actions if a.lower() in ids]
    dropped = len(actions) - len(valid)
    reward = 0.0
    feedback = ""
    if not ok:
        s.ep.format_errors += 1
        feedback = "Invalid format: no valid <answer> ... </answer>."
    elif dropped:
        feedback = f"{dropped} invalid action(s) ignored."
    if dropped or not valid:
        reward += cfg.format_penalty
    s.ep.num_dropped_actions += dropped
    invalid = 0
    for action in valid[: max(s.actions_left, 0)]:
        _, r, done, info = s.slot.env.step(action)
        reward += float(r)
        s.actions_left -= 1
        s.ep.num_actions += 1
        is_valid = bool(info.get("action_is_valid", True))
        s.ep.num_valid_actions += int(is_valid)
        invalid += int(not is_valid)
        s.ep.num_effective_actions += int(bool(info.get("action_is_effective", True)))
        if not is_valid and raw:
            s.ep.format_errors += 1
        s.ep.metrics.update(info.get("episode_metrics") or {})
        if info.get("success"):
            s.ep.success = True
        if done:
            s.done = True
            break
    s.ep.turn_format_ok.append(bool(ok) and not (raw and invalid))
    s.ep.turn_invalid.append(dropped + invalid)
    if invalid and not feedback and not raw:  # a raw env's observation already says what was wrong
        feedback = f"{invalid} invalid action(s)."
    return reward, feedback


class TextPolicy:
    """A scripted policy: ``respond(slot) -> str`` for each active env slot (demonstrations, tests).

    Its responses are tokenized like the model's would be sampled, so a scripted rollout has the
    same token layout as a sampled one.
    """

    def __init__(self, tokenizer: Any, respond: Callable[[EnvSlot], str]):
        self.tok = tokenizer
        self.respond = respond
        self._slots: List[EnvSlot] = []

    def observe(self, slots: List[EnvSlot]) -> None:
        self._slots = list(slots)

    def generate(self, prompts: List[List[int]], max_new_tokens: int) -> List[List[int]]:
        if len(self._slots) != len(prompts):
            raise RuntimeError("TextPolicy.generate called without observe() for the same prompts")
        return [list(self.tok(self.respond(slot), add_special_tokens=False)["input_ids"])[:max_new_tokens]
                for slot in self._slots]
