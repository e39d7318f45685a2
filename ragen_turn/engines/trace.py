"""The trajectory trace both engines write: a sample of each step's episodes, turn by turn, with their credit.

``trainer.trace_episodes`` = N > 0: each training step, after the rollout filter, the lowest-numbered env groups
are taken whole until they hold at least N episodes (so ``ceil(N / G)`` groups of G), and one JSON line is
appended to ``<run>/trace.jsonl`` (``runfiles.TRACE_FILE``) holding, per episode and turn, what the credit
assignment saw and did (:func:`episode_record` lists the fields). N = 0: no tracer is built (nothing is
computed or written).

What the two engines record differs only in *when* the update statistics are read (``update.when``):

- ``loss`` (local engine): from the fresh log-probs of the actor's loss itself, in the last PPO epoch that
  visited the episode (the ratio each turn had when its gradient was taken);
- ``after_update`` (verl engine, whose loss runs in the actor workers): from one extra forward of the traced
  rows after the step's actor update (``_compute_old_log_prob`` on those rows only): the ratio where the update
  left each turn, with the clip flags the loss's own code gives at that ratio.

Both go through :func:`ragen_turn.algos.unit_stats` (the loss's units, objective and clipping-bias correction),
so no loss maths lives here. Sizes: the size per step is bounded by the sample (episodes x turns x
``response_length`` tokens, each a short string and up to four numbers) plus :data:`OBS_CHARS` characters of
observation per turn (docs/usage.md gives the bound and measured sizes).
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import torch

from ragen_turn.algos import turn_start_values, unit_stats
from ragen_turn.engines.rundir import writing
from ragen_turn.rollout import Trajectory
from ragen_turn.rollout.context import think_text

OBS_CHARS = 600  # the tail of each turn's observation kept (the first turn's prompt starts with the system prompt)
DIGITS = 5  # significant digits of every recorded number
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def num(x: Any) -> Optional[float]:
    """A recorded number: ``DIGITS`` significant digits, None when missing or not finite."""
    if x is None:
        return None
    x = float(x)
    return float(f"{x:.{DIGITS}g}") if math.isfinite(x) else None


def nums(xs) -> List[Optional[float]]:
    return [num(x) for x in (xs.tolist() if isinstance(xs, torch.Tensor) else xs)]


def trace_rows(group_ids: Sequence[int], n: int, keys: Optional[Sequence[Any]] = None) -> List[int]:
    """The rows to trace: whole env groups, lowest group id first, until at least ``n`` rows (none for n = 0).
    ``keys`` (one per row): rows whose key was already taken are copies (verl's copy-mode padding) and left out."""
    if n <= 0:
        return []
    rows: List[int] = []
    seen = set()
    for g in sorted(set(int(x) for x in group_ids)):
        if len(rows) >= n:
            break
        for i, gi in enumerate(group_ids):
            k = keys[i] if keys is not None else i
            if int(gi) == g and k not in seen:
                seen.add(k)
                rows.append(i)
    return rows


def split_response(text: str) -> Dict[str, str]:
    """``think`` and ``answer`` of a response ('' when it has none)."""
    m = _ANSWER.search(text)
    return {"think": think_text(text), "answer": m.group(1).strip() if m else ""}


def turn_segments(ids: Sequence[int], turn_ids: Sequence[int]) -> List[Dict[str, List[int]]]:
    """One row's tokens cut into turns: for each turn h, ``obs`` (the non-response tokens since the previous
    turn: the first prompt for turn 0) and ``resp`` (its response tokens), in order."""
    segs: List[Dict[str, List[int]]] = []
    obs: List[int] = []
    cur = -1
    for tok, h in zip(ids, turn_ids):
        h = int(h)
        if h < 0:
            obs.append(int(tok))
            cur = -1
            continue
        if h != cur:
            segs.append({"obs": obs, "resp": []})
            obs, cur = [], h
        segs[-1]["resp"].append(int(tok))
    return segs


def algo_record(cfg: Any) -> Dict[str, Any]:
    a = cfg.actor_rollout_ref.actor
    return {"adv_estimator": str(cfg.algorithm.adv_estimator), "policy_loss": str(a.policy_loss.loss_mode),
            "critic_level": str(cfg.critic.level), "clip_ratio_low": num(a.clip_ratio_low),
            "clip_ratio_high": num(a.clip_ratio_high),
            "response_length": int(cfg.actor_rollout_ref.rollout.response_length)}


class EpisodeTracer:
    """Builds one step's trace line (:meth:`begin` after the advantages, :meth:`observe` with the update's
    log-probs, :meth:`write`), for either engine. ``tokenizer`` decodes the tokens; ``loss_config``: the policy
    loss's config (``config.policy_loss_config``)."""

    def __init__(self, cfg: Any, path: Path, engine: str, tokenizer: Any, loss_config: Any):
        self.n = int(cfg.trainer.trace_episodes)
        self.path = Path(path)
        self.engine = engine
        self.tok = tokenizer
        self.loss_name = str(cfg.actor_rollout_ref.actor.policy_loss.loss_mode)
        self.loss_config = loss_config
        self.algo = algo_record(cfg)
        self.response_length = int(cfg.actor_rollout_ref.rollout.response_length)
        self.episodes: List[Dict[str, Any]] = []
        self._index: Dict[int, int] = {}  # id(Episode) -> position in self.episodes
        self.when: Optional[str] = None

    def _decode(self, ids: List[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False)

    def begin(self, batch: Trajectory, rows: Sequence[int], prefixes: Optional[Sequence[List[int]]] = None) -> None:
        """Records for ``rows`` of ``batch`` (advantages computed). ``prefixes``: per row, tokens before the
        row's ``input_ids`` (verl: the first prompt; its rows hold the response side only)."""
        self.episodes, self._index, self.when = [], {}, None
        H = batch.turn_mask.shape[1]
        v_turn = turn_start_values(batch.values, batch.turn_ids, H) if batch.values is not None else None
        ordinal: Dict[int, int] = {}
        for j, b in enumerate(rows):
            ep = batch.episodes[b]
            k = ordinal[ep.group_id] = ordinal.get(ep.group_id, -1) + 1
            am = batch.attention_mask[b].bool()
            ids = batch.input_ids[b][am].tolist()
            tids = batch.turn_ids[b][am].tolist()
            if prefixes is not None:
                ids, tids = list(prefixes[j]) + ids, [-1] * len(prefixes[j]) + tids
            rec = self.episode_record(batch, b, turn_segments(ids, tids), v_turn)
            rec.update(key=f"{ep.tag}/{ep.env_seed}/{k}", ordinal=k)
            self._index[id(ep)] = len(self.episodes)
            self.episodes.append(rec)

    def episode_record(self, batch: Trajectory, b: int, segs, v_turn) -> Dict[str, Any]:
        """One episode: ``tag``, ``env_seed``, ``group_id``, ``reward`` (its env return), ``success``,
        ``truncated``, ``clip_bias_scale`` (from the update, where the loss applies one) and ``turns``, each with
        ``h``, ``obs`` (its tail, :data:`OBS_CHARS`), ``think``, ``answer``, ``tokens`` (its response, one
        string per token), ``n_tokens``, ``capped`` (it sampled ``response_length`` tokens), ``reward`` (env),
        ``format_ok``, ``invalid`` (dropped or env-invalid actions), ``value`` (V(s_h): the critic before the
        turn's first token; null without a critic), ``return`` (turn critic: return_h; else the return at the
        turn's first token), ``adv`` (the mean over its tokens: the turn unit's A_h) and, per token, ``tok_adv``
        (where it varies in the turn), ``tok_value`` / ``tok_return`` (token critic); from the update
        (:meth:`observe`): ``log_ratio`` (the turn's, before clipping), ``clipped`` / ``dual`` / ``token_band`` /
        ``live`` (shares of its tokens) and ``tok_log_ratio``."""
        ep = batch.episodes[b]
        tid = batch.turn_ids[b]
        turns = []
        for h, seg in enumerate(segs):
            on = tid == h
            text = self._decode(seg["resp"])
            adv = batch.advantages[b][on].double()
            t = {"h": h, "obs": self._decode(seg["obs"])[-OBS_CHARS:], **split_response(text),
                 "tokens": [self._decode([i]) for i in seg["resp"]], "n_tokens": len(seg["resp"]),
                 "capped": len(seg["resp"]) >= self.response_length,
                 "reward": num(ep.turn_rewards[h]) if h < len(ep.turn_rewards) else None,
                 "format_ok": _at(getattr(ep, "turn_format_ok", None), h),
                 "invalid": _at(getattr(ep, "turn_invalid", None), h),
                 "value": num(v_turn[b, h]) if v_turn is not None else None,
                 "adv": num(adv.mean()) if adv.numel() else None}
            if batch.turn_returns is not None:
                t["return"] = num(batch.turn_returns[b, h])
            elif batch.returns is not None and adv.numel():
                t["return"] = num(batch.returns[b][on][0])
            if adv.numel() and float(adv.max() - adv.min()) > 1e-6:
                t["tok_adv"] = nums(adv)
            if batch.values is not None and batch.returns is not None and batch.turn_returns is None:
                t["tok_value"], t["tok_return"] = nums(batch.values[b][on]), nums(batch.returns[b][on])
            turns.append(t)
        return {"tag": ep.tag, "env_seed": int(ep.env_seed), "group_id": int(ep.group_id),
                "reward": num(ep.total_reward), "success": bool(ep.success), "truncated": bool(ep.truncated),
                "clip_bias_scale": None, "turns": turns}

    def rows_of(self, episodes: Sequence[Any]) -> List[int]:
        """The positions in ``episodes`` (a micro-batch's) of traced episodes."""
        return [i for i, e in enumerate(episodes) if id(e) in self._index]

    @torch.no_grad()
    def observe(self, episodes: Sequence[Any], old_log_prob: torch.Tensor, log_prob: torch.Tensor,
                advantages: torch.Tensor, response_mask: torch.Tensor, turn_ids: torch.Tensor, when: str,
                global_counts=None) -> None:
        """The update's view of the traced rows among ``episodes`` (tensors ``[b, T]`` for those rows, any
        device): :func:`ragen_turn.algos.unit_stats` with the loss's config; a later call for the same episode
        (a later PPO epoch) replaces an earlier one."""
        rows = self.rows_of(episodes)
        if not rows:
            return
        idx = torch.as_tensor(rows, device=log_prob.device)

        def pick(x: torch.Tensor) -> torch.Tensor:
            return x.index_select(0, idx)

        tids = pick(turn_ids)
        st = unit_stats(self.loss_name, pick(old_log_prob), pick(log_prob.detach()), pick(advantages),
                        pick(response_mask), self.loss_config, turn_ids=tids, global_counts=global_counts)
        st = {k: (v.cpu() if v is not None else None) for k, v in st.items()}
        tids = tids.cpu()
        self.when = when
        for j, r in enumerate(rows):
            rec = self.episodes[self._index[id(episodes[r])]]
            if st["clip_bias_scale"] is not None:
                rec["clip_bias_scale"] = num(st["clip_bias_scale"][j])
            for t in rec["turns"]:
                h = t["h"]
                t["log_ratio"] = num(st["turn_log_ratio"][j, h])
                for key in ("clipped", "dual", "token_band", "live"):
                    t[key] = num(st[f"turn_{key}"][j, h])
                t["tok_log_ratio"] = nums(st["token_log_ratio"][j][tids[j] == h])

    def write(self, step: int) -> None:
        """Append the step's line (``step``: as in ``metrics.jsonl``) and forget it."""
        if self.episodes:
            line = {"step": int(step), "engine": self.engine, "algo": self.algo, "update": {"when": self.when},
                    "episodes": self.episodes}
            with writing(self.path), open(self.path, "a") as f:
                f.write(json.dumps(line, sort_keys=True, allow_nan=False, separators=(",", ":")) + "\n")
        self.episodes, self._index = [], {}


LINE_KEYS = ("step", "engine", "algo", "update", "episodes")
EPISODE_KEYS = ("key", "ordinal", "tag", "env_seed", "group_id", "reward", "success", "truncated", "clip_bias_scale",
                "turns")
TURN_KEYS = ("h", "obs", "think", "answer", "tokens", "n_tokens", "capped", "reward", "format_ok", "invalid", "value",
             "return", "adv")
UPDATE_KEYS = ("log_ratio", "clipped", "dual", "token_band", "live", "tok_log_ratio")  # once the update was read


def check_record(line: Dict[str, Any]) -> None:
    """The schema of one ``trace.jsonl`` line, the same for both engines (docs/usage.md); a ValueError names
    what is missing or inconsistent."""
    missing = [k for k in LINE_KEYS if k not in line]
    if missing:
        raise ValueError(f"trace line of step {line.get('step')}: missing {missing}")
    when = line["update"].get("when")
    if when not in (None, "loss", "after_update"):
        raise ValueError(f"step {line['step']}: update.when={when!r}")
    for ep in line["episodes"]:
        if [k for k in EPISODE_KEYS if k not in ep] or not ep["turns"]:
            raise ValueError(f"step {line['step']} episode {ep.get('key')}: missing "
                             f"{[k for k in EPISODE_KEYS if k not in ep] or 'turns'}")
        for t in ep["turns"]:
            need = TURN_KEYS + (UPDATE_KEYS if when else ())
            if [k for k in need if k not in t]:
                raise ValueError(f"step {line['step']} episode {ep['key']} turn {t.get('h')}: missing "
                                 f"{[k for k in need if k not in t]}")
            if len(t["tokens"]) != t["n_tokens"] or (when and len(t["tok_log_ratio"]) != t["n_tokens"]):
                raise ValueError(f"step {line['step']} episode {ep['key']} turn {t['h']}: token lists of other "
                                 f"lengths than n_tokens={t['n_tokens']}")


def _at(xs: Optional[Sequence[Any]], h: int) -> Any:
    if not xs or h >= len(xs):
        return None
    x = xs[h]
    return bool(x) if isinstance(x, bool) else int(x)
