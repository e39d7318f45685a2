"""Prompt building and action parsing (RAGEN's ctx_manager), token in / token out.

The conversation is kept as token ids. Turn 0's prompt is the chat template applied to
``[system, user(obs_0)]`` with a generation prompt. After the model samples a response (kept as
the exact sampled ids, never re-templated), the environment's reply is appended as the template's
tokens that close the assistant message, hold the next user message and open the next assistant
message. Those come from rendering the template around a placeholder assistant message, so any
chat template works (ChatML, Llama, the tiny model's); ``response_mask`` covers only sampled ids.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

_PLACEHOLDER = "\u2063PLACEHOLDER\u2063"
_USER_PLACEHOLDER = "\u2063USERTEXT\u2063"


@dataclass
class ContextConfig:
    """The prompt/answer format (``agent_proxy.*`` keys)."""

    max_turn: int = 5
    action_sep: str = "||"
    max_actions_per_turn: int = 5
    enable_think: bool = False
    max_context_tokens: int = 4096
    response_length: int = 64  # max new tokens per turn
    format_penalty: float = -0.1
    include_env_instruction: bool = True  # False: the system prompt has only the answer format (tiny models)

    def __post_init__(self) -> None:
        if self.max_turn < 1:
            raise ValueError(f"agent_proxy.max_turn must be >= 1, got {self.max_turn}")
        if self.max_actions_per_turn < 1:
            raise ValueError(f"agent_proxy.max_actions_per_turn must be >= 1, got {self.max_actions_per_turn}")
        if not self.action_sep:
            raise ValueError("agent_proxy.action_sep must be a non-empty string")
        if self.response_length < 1:
            raise ValueError("actor_rollout_ref.rollout.response_length must be >= 1")


def context_config(cfg: Any) -> ContextConfig:
    """The ``ContextConfig`` of a run config (``agent_proxy.*``, the rollout's response length, the format penalty)."""
    ap = cfg.agent_proxy
    return ContextConfig(max_turn=ap.max_turn, action_sep=ap.action_sep, max_actions_per_turn=ap.max_actions_per_turn,
                         enable_think=ap.enable_think, max_context_tokens=ap.max_context_tokens,
                         response_length=cfg.actor_rollout_ref.rollout.response_length,
                         format_penalty=cfg.es_manager.format_penalty,
                         include_env_instruction=ap.get("include_env_instruction", True))


def check_context_fits(cfg: Any, tokenizer: Any) -> None:
    """Before any warm start, env or rollout: the shortest first prompt any env can have (the bare system prompt,
    the turn header and an empty state: no env text) plus one response fits ``agent_proxy.max_context_tokens``;
    else ``ValueError`` naming the key (the rollout would refuse it only at its first prompt)."""
    ctx = context_config(cfg)
    ids = ChatFormatter(tokenizer).first_prompt(system_prompt("", ctx, raw=True), user_message("", 0, ctx))
    need = len(ids) + ctx.response_length
    if need > ctx.max_context_tokens:
        raise ValueError(f"agent_proxy.max_context_tokens={ctx.max_context_tokens}: too small for any first turn: the "
                         f"shortest first prompt (system prompt and turn header, no env text: {len(ids)} tokens) plus "
                         f"one response (actor_rollout_ref.rollout.response_length={ctx.response_length}) needs "
                         f"{need}")


def answer_format(cfg: ContextConfig) -> str:
    if cfg.enable_think:
        return "<think> [your thoughts] </think> <answer> [your answer] </answer>"
    return "<answer> [your answer] </answer>"


def system_prompt(env_instruction: str, cfg: ContextConfig, raw: bool = False) -> str:
    """The system message. ``raw``: the env reads the whole response (its instruction gives the format)."""
    rules = env_instruction.strip() + "\n" if cfg.include_env_instruction and env_instruction else ""
    if raw:
        return ("You are a helpful agent. " + rules).strip()
    return (
        "You are a helpful agent. " + rules +
        f"Give up to {cfg.max_actions_per_turn} actions per turn, separated by {cfg.action_sep}. "
        f"Always answer in the format: {answer_format(cfg)}"
    )


def takes_raw_response(env: Any) -> bool:
    """True for envs that parse the whole response themselves (``response_format = "raw"``, e.g. search_qa)."""
    return getattr(env, "response_format", "answer") == "raw"


def user_message(obs: str, turn: int, cfg: ContextConfig, reward: Optional[float] = None,
                 feedback: str = "") -> str:
    parts = []
    if reward is not None:
        parts.append(f"Reward: {reward:.2f}")
    if feedback:
        parts.append(feedback)
    parts.append(f"Turn {turn + 1}:")
    parts.append("State:\n" + obs.strip())
    parts.append(f"You have {cfg.max_turn - turn} turns left.")
    return "\n".join(parts)


# RAGEN's answer extraction (ctx_manager): a *search* for the first answer block, so text before it is
# allowed; with enable_think the answer must follow a think block (whitespace between them only)
_THINK_ANSWER = re.compile(r"<think>(.*?)</think>\s*<answer>(.*?)</answer>", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_SPECIAL = ("<think>", "</think>", "<answer>", "</answer>", "<|im_start|>", "<|im_end|>")


def parse_response(text: str, cfg: ContextConfig) -> Tuple[List[str], bool]:
    """Split a response into actions, as RAGEN's context manager does.

    Returns ``(actions, format_ok)``. The first ``<answer>...</answer>`` anywhere in the text counts
    (with ``enable_think``: the first ``<think>...</think>`` directly followed by one); tag and
    chat-template tokens left inside it are removed, the rest is split on ``action_sep`` and at
    most ``max_actions_per_turn`` non-empty actions are kept. No answer, or an empty one, gives
    ``([], False)``: an invalid turn with the format penalty, never an exception.
    """
    if not isinstance(text, str):
        return [], False
    m = (_THINK_ANSWER if cfg.enable_think else _ANSWER).search(text)
    if not m:
        return [], False
    answer = m.group(m.lastindex)
    for tok in _SPECIAL:
        answer = answer.replace(tok, "")
    actions = [a.strip() for a in answer.split(cfg.action_sep)]
    actions = [a for a in actions if a][: cfg.max_actions_per_turn]
    return actions, bool(actions)


_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)


def think_text(text: str) -> str:
    """The reasoning of a response, as RAGEN reads it for its collapse measures: the think block an
    answer follows, else the first think block ('' if none); tags removed, stripped."""
    if not isinstance(text, str):
        return ""
    m = _THINK_ANSWER.search(text) or _THINK.search(text)
    if not m:
        return ""
    think = m.group(1)
    for tok in _SPECIAL:
        think = think.replace(tok, "")
    return think.strip()


class ChatFormatter:
    """Token-level chat formatting for one tokenizer (cached per tokenizer)."""

    def __init__(self, tokenizer: Any):
        self.tok = tokenizer
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("the tokenizer has no chat_template; set one (the tiny model and SmolLM2 ship one)")
        probe = self._render([("system", "S"), ("user", "U"), ("assistant", _PLACEHOLDER), ("user", _USER_PLACEHOLDER)],
                             True)
        head, sep, _ = probe.partition(_PLACEHOLDER)
        if not sep:
            raise ValueError("the chat template dropped the assistant message; cannot build multi-turn prompts")
        # Text the template puts after an assistant message and before the next user content.
        tail = probe[len(head) + len(_PLACEHOLDER):]
        self._between_prefix, _, rest = tail.partition(_USER_PLACEHOLDER)
        self._after_user = rest  # closes the user message and opens the assistant one
        ids = self.tok(self._between_prefix, add_special_tokens=False)["input_ids"]
        self._end_of_turn_id = ids[0] if ids else None

    def _render(self, msgs: Sequence[Tuple[str, str]], add_generation_prompt: bool) -> str:
        return self.tok.apply_chat_template([{"role": r, "content": c} for r, c in msgs], tokenize=False,
                                            add_generation_prompt=add_generation_prompt)

    def encode(self, text: str) -> List[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def first_prompt(self, system: str, user: str) -> List[int]:
        """Token ids of ``[system, user]`` with the generation prompt."""
        return self.encode(self._render([("system", system), ("user", user)], True))

    def env_turn(self, user: str, last_response_ids: Sequence[int]) -> List[int]:
        """Tokens between the last sampled response and the next one: close, user message, open.

        If the response already ended with the template's end-of-message token (the model sampled
        it as its stop token), that token is not added twice.
        """
        ids = self.encode(self._between_prefix + user + self._after_user)
        if last_response_ids and self._end_of_turn_id is not None and ids and ids[0] == self._end_of_turn_id \
                and last_response_ids[-1] == self._end_of_turn_id:
            ids = ids[1:]
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=True)
