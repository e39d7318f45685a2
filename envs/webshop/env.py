"""WebShop's text-mode shopping environment behind RAGEN's language-env interface.

Pages and clickable labels follow WebShop's text environment (``web_agent_text_env.py``):

* search page: ``search[<query>]`` is the only action;
* results page: ``back to search``, ``< prev`` / ``next >`` (10 results a page out of the top 50), and one
  product id (ASIN) per result;
* item page: ``back to search``, ``< prev`` (to the results), every option value (one selected per option
  type), ``description``, ``features``, ``reviews`` (``attributes`` with ``show_attrs``) and ``buy now``;
* description / features / reviews pages: ``back to search`` and ``< prev`` (to the item).

Labels are matched case-insensitively. ``buy now`` ends the episode with WebShop's reward
(:mod:`.reward`); the episode is also cut off after ``max_turns`` actions. Every step's ``info["episode_metrics"]``
holds ``score`` (WebShop's score: the purchase's reward, 0 while nothing is bought; unlike the episode return it
has no format penalties) and ``purchased``. Any action that cannot be
carried out (not ``search[...]`` / ``click[...]``, a label not on the page, a search away from the search
page, an empty query, an overlong input) is rejected with an explanation and ``format_penalty``.
"""
from __future__ import annotations

import os

import random
import re
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from ..base import BaseLanguageBasedEnv, coerce_config, check_seed
from . import solver
from .catalog import Catalog, Product, load_catalog
from .config import WebShopEnvConfig, default_cache_dir, normalize_split
from .pages import BACK_TO_SEARCH, BUY_NOW, NEXT_PAGE, PREV_PAGE, SEARCH_ACTION_HINT, option_layout
from .reward import get_reward, load_spacy
from .search import BM25SearchEngine, get_search_engine

_ACTION_RE = re.compile(r"^\s*([A-Za-z_]+)\s*\[(.*)\]\s*$", re.DOTALL)

INSTRUCTION = (
    "You are shopping on WebShop, a simulated online store. Buy the product that best matches the "
    "instruction: the right kind of product, with the requested attributes and options (such as color or "
    "size), under the price limit. Answer with exactly one action per turn:\n"
    "- search[keywords]: search the store (only on the search page);\n"
    "- click[label]: click a button or link shown on the page: a product id in the results, an option value, "
    "'description', 'features', 'reviews', '< prev', 'next >', 'back to search', or 'buy now'.\n"
    "Each observation lists the actions available. Select the options you need before clicking 'buy now'; "
    "buying ends the episode and scores the purchase from 0 to 1."
)


def _truncate(text: str, n: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: max(0, n - 3)].rstrip() + "..."


class WebShopEnv(BaseLanguageBasedEnv):
    """WebShop in text mode. ``reset(seed) -> obs``; ``step(action) -> (obs, reward, done, info)``."""

    instruction: str = INSTRUCTION

    def __init__(self, config: Union[WebShopEnvConfig, Mapping[str, Any], None] = None, **kwargs: Any) -> None:
        config = coerce_config(WebShopEnvConfig, config, kwargs)
        super().__init__(config)
        cfg = config
        self._nlp = load_spacy(os.path.expanduser(str(cfg.spacy_model))) if cfg.spacy_model else None
        cache_dir = default_cache_dir() if cfg.cache_dir is None else (cfg.cache_dir or None)
        self.catalog: Catalog = load_catalog(cfg.resolved_data_dir, num_products=cfg.num_products,
                                             human_goals=cfg.human_goals, lazy=cfg.lazy_load, cache_dir=cache_dir)
        self.search_engine: BM25SearchEngine = get_search_engine(self.catalog, cache_dir=cache_dir,
                                                                 k1=cfg.bm25_k1, b=cfg.bm25_b)
        self._split_cache: Dict[str, range] = {}
        self.goal_indices(cfg.split)  # validates the split now
        self._rng = random.Random()
        self.goal: Optional[Dict[str, Any]] = None
        self.goal_index: Optional[int] = None
        self._clear_session()
        self.turns = 0
        self.done = False
        self._obs = ""
        self._clickables: Dict[str, Tuple[str, Any]] = {}
        self._shown: Dict[str, str] = {}  # clickable label -> its text on the page
        self._solve_cache: Optional[Tuple[Any, Any]] = None  # (goal key, (target, plan from the search page))

    # ------------------------------------------------------------------ goals
    def goal_indices(self, split: Optional[str] = None) -> range:
        """Indices into ``catalog.goals`` of a split (default: the configured one)."""
        split = normalize_split(split or self.config.split)
        r = self._split_cache.get(split)
        if r is None:
            r = self.catalog.split_indices(split, self.config.split_ranges)
            if len(r) == 0:
                raise ValueError(f"webshop: split {split!r} has no goals ({len(self.catalog.goals)} goals in "
                                 f"{self.config.resolved_data_dir!r}); adjust split_ranges or num_products")
            self._split_cache[split] = r
        return r

    @property
    def instruction_text(self) -> str:
        return self.goal["instruction_text"] if self.goal else ""

    # ------------------------------------------------------------------ API
    def reset(self, seed: Optional[int] = None, mode: Optional[str] = None) -> str:
        """Start an episode; ``seed`` picks the goal within the split (``mode`` may name another split)."""
        seed = check_seed(seed)
        goals = self.goal_indices(mode)
        if seed is None:
            seed = self._rng.randrange(2 ** 31)
        self.goal_index = goals[int(seed) % len(goals)]
        self.goal = self.catalog.goals[self.goal_index]
        self._clear_session()
        self.turns = 0
        self.done = False
        self._render()
        return self._obs

    def step(self, action: str) -> Tuple[str, float, bool, Dict[str, Any]]:
        if self.goal is None:
            self.reset()
        info: Dict[str, Any] = {"success": False, "action_is_valid": False, "action_is_effective": False}
        if self.done:
            info.update(page=self.page, turn=self.turns, feedback="The episode is over; call reset().")
            return self._obs, 0.0, True, info
        self.turns += 1
        info["turn"] = self.turns
        before = self._state_key()
        reward = 0.0
        error = None
        try:
            error = self._apply(action, info)
        except Exception as e:  # never let a bad action crash a rollout
            error = f"the action could not be carried out ({type(e).__name__})"
        if error is not None:
            reward = float(self.config.format_penalty)
            info["feedback"] = f"Invalid action: {error}."
        else:
            info["action_is_valid"] = True
            info["action_is_effective"] = self._state_key() != before
            if self.page == "done":
                reward = float(info.get("reward", 0.0))
                info["success"] = reward >= 1.0 - 1e-9
                self.done = True
        if not self.done and self.turns >= self.config.max_turns:
            self.done = True
            info["truncated"] = True
        self._render()
        info["page"] = self.page
        # WebShop's score (the purchase's reward, 0 until something is bought) as the run's env/score, val/score
        info["episode_metrics"] = {"score": float(self._reward), "purchased": float(self.page == "done")}
        obs = self._obs if error is None else f"Invalid action: {error}.\n{self._obs}"
        return obs, reward, self.done, info

    def render(self, mode: str = "text") -> str:
        return self._obs

    def close(self) -> None:
        """Nothing to release per env: the catalog and index are shared by the process."""

    def get_available_actions(self) -> List[str]:
        if self.done or self.page == "done":
            return []
        if self.page == "search":
            return [SEARCH_ACTION_HINT]
        return [f"click[{label}]" for label in self._clickables]

    def get_all_actions(self) -> List[str]:
        return self.get_available_actions()

    def as_shown(self, action: str) -> str:
        """``action`` with its click label written as the current page shows it (``click[b0abc12345]`` ->
        ``click[B0ABC12345]``, ``click[buy now]`` -> ``click[Buy Now]``): the same action, since labels match
        case-insensitively, in the form a model can copy from the page. Other actions come back unchanged."""
        m = _ACTION_RE.match(action) if isinstance(action, str) else None
        if m is None or m.group(1).lower() != "click":
            return action
        shown = self._shown.get(" ".join(m.group(2).lower().split()))
        return action if shown is None else f"{m.group(1)}[{shown}]"

    # ------------------------------------------------------------------ expert planner
    def solve(self) -> Optional[List[str]]:
        """The remaining expert actions from the current page to buying the goal product with the goal's options
        (``[]`` once the episode is over, None when no search finds a product): see :func:`.solver.solve`."""
        return solver.solve(self)

    # ------------------------------------------------------------------ session state
    def _clear_session(self) -> None:
        self.page = "search"
        self.keywords: Optional[str] = None
        self.results: List[int] = []
        self.results_page = 1
        self.item: Optional[int] = None
        self.options: Dict[str, str] = {}
        self.sub_page: Optional[str] = None
        self._reward = 0.0

    def _state_key(self) -> Tuple:
        return (self.page, self.keywords, self.results_page, self.item, tuple(sorted(self.options.items())),
                self.sub_page)

    @property
    def product(self) -> Optional[Product]:
        return None if self.item is None else self.catalog.product(self.item)

    # ------------------------------------------------------------------ actions
    def _apply(self, action: Any, info: Dict[str, Any]) -> Optional[str]:
        """Carry out ``action``; return None, or why it is invalid."""
        cfg = self.config
        if not isinstance(action, str):
            return f"an action must be a string, got {type(action).__name__}"
        if len(action) > cfg.max_action_chars:
            return f"the action is {len(action)} characters long; the limit is {cfg.max_action_chars}"
        m = _ACTION_RE.match(action)
        if m is None:
            if "[" in action or "]" in action:
                return "malformed brackets; write search[<query>] or click[<label>]"
            return "expected search[<query>] or click[<label>]"
        verb, arg = m.group(1).lower(), m.group(2).strip()
        if verb == "search":
            if self.page != "search":
                return "there is no search box on this page; click[back to search] first"
            if "[" in arg or "]" in arg:
                return "malformed brackets in the search query"
            query = " ".join(arg.lower().split())
            if not query:
                return "the search query is empty"
            self.keywords = query
            self.results = self.search_engine.search(query, k=cfg.search_return_n)
            self.results_page = 1
            self.item, self.options, self.sub_page = None, {}, None
            self.page = "results"
            return None
        if verb != "click":
            return f"unknown action {verb!r}; use search[<query>] or click[<label>]"
        label = " ".join(arg.lower().split())
        if not label:
            return "click[] needs a label"
        target = self._clickables.get(label)
        if target is None:
            if "[" in label or "]" in label:
                return "malformed brackets; write click[<label>] with one label"
            if self.page == "search":
                return f"nothing to click on the search page; use {SEARCH_ACTION_HINT}"
            return f"{arg!r} is not a clickable label on this page"
        self._click(label, target, info)
        return None

    def _click(self, label: str, target: Tuple[str, Any], info: Dict[str, Any]) -> None:
        kind, value = target
        if kind == "back":
            self._clear_session()
        elif kind == "next":
            self.results_page += 1
        elif kind == "prev":
            if self.page == "results":
                self.results_page -= 1
            elif self.page == "item":  # back to the results; WebShop clears the selection
                self.page, self.item, self.options = "results", None, {}
            else:  # sub page -> item page
                self.page, self.sub_page = "item", None
        elif kind == "product":
            self.page, self.item, self.options, self.sub_page = "item", value, {}, None
        elif kind == "option":
            opt_type, opt_value = value
            self.options[opt_type] = opt_value
        elif kind == "sub":
            self.page, self.sub_page = "sub", value
        elif kind == "buy":
            self._buy(info)

    def _buy(self, info: Dict[str, Any]) -> None:
        p = self.product
        reward, parts = get_reward(p.reward_view(), self.goal, p.price, self.options, nlp=self._nlp)
        self.page = "done"
        info["reward"] = reward
        info.update(parts)
        info["reward_parts"] = dict(parts)
        info.update(purchased_asin=p.asin, goal_asin=self.goal["asin"], purchased_options=dict(self.options),
                    purchased_price=p.price, exact_product=p.asin == self.goal["asin"])
        self._reward = reward

    # ------------------------------------------------------------------ rendering
    def _render(self) -> None:
        cfg = self.config
        rich = cfg.observation_mode == "text_rich"
        compact = cfg.observation_mode == "compact"
        segs: List[str] = []
        click: Dict[str, Tuple[str, Any]] = {}
        shown: Dict[str, str] = {}

        def button(text: str, key: str, target: Tuple[str, Any], selected: bool = False) -> None:
            click[key] = target
            shown[key] = text
            if rich:
                segs.append(f"[clicked button] {text} [clicked button_]" if selected else f"[button] {text} [button_]")
            else:
                segs.append(text)

        instr = ["Instruction:", self.instruction_text]
        if compact:  # the instruction only on the search page; later turns have it in the history
            segs_instr, instr = ["Instruction: " + self.instruction_text], []
        else:
            segs_instr = instr
        if self.page == "search":
            segs += ["WebShop"] + segs_instr
            if rich:
                segs.append("[button] Search [button_]")
            else:
                segs.append("Search")
        elif self.page == "results":
            per = cfg.results_per_page
            total = len(self.results)
            segs += instr
            button("Back to Search", BACK_TO_SEARCH, ("back", None))
            segs.append(f"Page {self.results_page} (Total results: {total})")
            if self.results_page > 1:
                button("< Prev", PREV_PAGE, ("prev", None))
            if self.results_page * per < total:
                button("Next >", NEXT_PAGE, ("next", None))
            for idx in self.results[(self.results_page - 1) * per: self.results_page * per]:
                p = self.catalog.product(idx)
                button(p.asin, p.asin.lower(), ("product", idx))
                if compact:
                    segs[-1] = f"{p.asin} {p.name} {p.price_tag}"
                else:
                    segs += [p.name, p.price_tag]
        elif self.page == "item":
            p = self.product
            segs += instr
            button("Back to Search", BACK_TO_SEARCH, ("back", None))
            button("< Prev", PREV_PAGE, ("prev", None))
            for opt_type, values in option_layout(p):
                segs.append(opt_type)
                for v, key in values:
                    if key is None:  # a value shared by two option types: the first type keeps it
                        segs.append(v)
                        continue
                    button(v, key, ("option", (opt_type, v)), selected=self.options.get(opt_type) == v)
            segs += [p.name, f"Price: {p.price_tag}", f"Rating: {p.rating}"]
            button("Description", "description", ("sub", "description"))
            button("Features", "features", ("sub", "features"))
            button("Reviews", "reviews", ("sub", "reviews"))
            if cfg.show_attrs:
                button("Attributes", "attributes", ("sub", "attributes"))
            button("Buy Now", BUY_NOW, ("buy", None))
            if (rich or compact) and self.options:
                segs.insert(0, "You have selected " + ", ".join(f"{k}: {v}" for k, v in self.options.items()) + ".")
        elif self.page == "sub":
            p = self.product
            segs += instr
            button("Back to Search", BACK_TO_SEARCH, ("back", None))
            button("< Prev", PREV_PAGE, ("prev", None))
            n = cfg.max_text_chars
            if self.sub_page == "description":
                segs.append(_truncate(p.description, n) or "No description.")
            elif self.sub_page == "features":
                segs += [_truncate(b, n) for b in p.bullets] or ["No features listed."]
            elif self.sub_page == "reviews":
                if not p.reviews:
                    segs.append("No reviews yet.")
                for r in p.reviews[:5]:
                    segs += [x for x in (_truncate(r.get("title", ""), 120), str(r.get("score", "")),
                                         _truncate(r.get("body", ""), n)) if x]
            else:
                segs += list(p.attributes) or ["No attributes."]
        else:  # done
            p = self.product
            segs += ["Thank you for shopping with us!", "Purchased", p.asin if p else ""]
            segs += [f"{k}: {v}" for k, v in self.options.items()]
            segs += ["Your score (min 0.0, max 1.0)", f"{self._reward:.4f}"]
        # option labels must not shadow navigation: navigation keys were inserted first and are kept
        self._clickables = click
        self._shown = shown
        text = ("\n" if rich or compact else " [SEP] ").join(s for s in segs if s != "")
        if cfg.show_available_actions:
            actions = self.get_available_actions()
            if actions:
                text += "\nAvailable actions: " + ", ".join(actions)
        self._obs = text


__all__ = ["WebShopEnv", "INSTRUCTION"]
