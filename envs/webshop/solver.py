"""WebShop's expert planner (``WebShopEnv.solve``): the actions from the env's current page to buying the goal
product with the goal's options.

Every function reads the env's state (goal, page, results, selected options) and never steps it. The target and
its plan from the search page are found once per goal (:func:`solve_target`, cached on the env); the plan from any
other page is then the shorter of going on from there and starting a new search.
"""
from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .catalog import Product
from .pages import BACK_TO_SEARCH, BUY_NOW, NEXT_PAGE, PREV_PAGE, option_layout
from .reward import get_reward, normalize_color, token_set_ratio

_PRICE_CLAUSE_RE = re.compile(r",?\s*and price lower than [0-9.,]+ dollars\s*$")


def _shorter(a: List[str], b: List[str]) -> List[str]:
    """The shorter plan (``a`` on a tie)."""
    return list(a) if len(a) <= len(b) else list(b)


def solve(env: Any) -> Optional[List[str]]:
    """The remaining expert actions from the current page to buying the goal product with the goal's options.

    Exact for the current state: stepping the env with the returned actions, in order, buys the goal product
    (its ASIN) with options that match the goal, so the purchase scores 1.0 on the shipped catalog. Calling it
    again after any number of those actions (or after other actions) gives the plan from the new state:

    * search page: ``search[q]`` with the first of the goal's query, the instruction (without its price
      clause) and the product title whose top results hold the target, ``next >`` up to its results page,
      ``click[<asin>]``, one ``click[<value>]`` per goal option not yet selected, ``click[buy now]``;
    * results page: page to the target when it is in the current results (``next >`` / ``< prev``),
      otherwise ``back to search`` and the search plan, whichever is shorter;
    * item page of another product: ``< prev`` back to the results, or ``back to search`` when the target is
      not in them; item page of the target: the missing options and ``buy now``;
    * description / features / reviews page: ``< prev`` to the item page, or ``back to search``.

    Labels are the exact lower-case clickables (``click[b0abc12345]``, ``click[next >]``). Returns ``[]`` once
    the episode is over and None when no search finds any product. When no search puts the goal's ASIN among
    the top ``search_return_n`` results (possible on WebShop's full data), the target is the found product
    with the highest reward for the goal.
    """
    if env.goal is None:
        raise RuntimeError("call reset() before solve()")
    if env.done or env.page == "done":
        return []
    found = solve_target(env)
    if found is None:
        return None
    target, search_plan = found
    if env.page == "search":
        return list(search_plan)
    fresh = [f"click[{BACK_TO_SEARCH}]"] + search_plan
    if env.page == "results":
        return results_plan(env, target, fresh)
    if env.item == target:
        plan = item_plan(env, target, env.options)
    else:  # another product: back to its results page, or a new search
        plan = _shorter([f"click[{PREV_PAGE}]"] + results_plan(env, target, fresh), fresh)
    if env.page == "item":
        return plan
    return _shorter([f"click[{PREV_PAGE}]"] + plan, fresh)  # a sub page keeps the item and its options


def option_choice(env: Any, p: Product) -> Dict[str, Tuple[str, str]]:
    """``{type: (value, click key)}``: the clickable option values of ``p`` that match the goal's options.

    Exact matches first, then the best fuzzy match (as the reward judges options) per goal option; one
    value per option type and per goal option.
    """
    opts = env.goal.get("goal_options") or []
    goal = list(opts.items()) if isinstance(opts, Mapping) else [(None, o) for o in opts]
    later = {BUY_NOW, "description", "features", "reviews"} | ({"attributes"} if env.config.show_attrs else set())
    cands = []
    for opt_type, values in option_layout(p):
        for v, key in values:
            if key is None or key in later:
                continue  # not clickable as an option on the page
            for gi, (gtype, gval) in enumerate(goal):
                if gtype is not None and str(gtype).lower() != opt_type:
                    continue
                g = " ".join(str(gval).lower().split())
                if g == key or g == v:
                    score = 1000.0
                else:
                    score = float(token_set_ratio(normalize_color(g), normalize_color(v)))
                    if score <= 0:
                        continue
                cands.append((-score, gi, opt_type, v, key))
    chosen: Dict[str, Tuple[str, str]] = {}
    used = set()
    for _, gi, opt_type, v, key in sorted(cands, key=lambda c: c[:2]):
        if gi in used or opt_type in chosen:
            continue
        chosen[opt_type] = (v, key)
        used.add(gi)
    return chosen


def item_plan(env: Any, idx: int, selected: Mapping[str, str]) -> List[str]:
    """From the item page of product ``idx`` with ``selected`` options: the missing options, then buy."""
    p = env.catalog.product(idx)
    choice = option_choice(env, p)
    plan = [f"click[{key}]" for opt_type, (v, key) in
            sorted(choice.items(), key=lambda kv: list(p.options).index(kv[0])) if selected.get(opt_type) != v]
    return plan + [f"click[{BUY_NOW}]"]


def page_walk(results: List[int], idx: int, from_page: int, per_page: int) -> Optional[List[str]]:
    """Paging clicks from results page ``from_page`` to the page showing ``idx`` (None if not in results)."""
    if idx not in results:
        return None
    page = results.index(idx) // per_page + 1
    if page >= from_page:
        return [f"click[{NEXT_PAGE}]"] * (page - from_page)
    return [f"click[{PREV_PAGE}]"] * (from_page - page)


def results_plan(env: Any, target: int, fresh: List[str]) -> List[str]:
    """From the current results page (and the same result list)."""
    walk = page_walk(env.results, target, env.results_page, env.config.results_per_page)
    if walk is None:
        return list(fresh)
    stay = walk + [f"click[{env.catalog.product(target).asin.lower()}]"] + item_plan(env, target, {})
    return _shorter(stay, fresh)


def candidate_queries(env: Any) -> List[str]:
    """The searches to try, in order: the goal's query, its instruction without the price clause, the product's
    name (lower case, brackets removed, cut at a word to fit ``max_action_chars``)."""
    g = env.goal
    room = env.config.max_action_chars - len("search[]")
    out: List[str] = []
    for q in (g.get("query"), _PRICE_CLAUSE_RE.sub("", str(g.get("instruction_text") or "")), g.get("name")):
        q = " ".join(str(q or "").lower().replace("[", " ").replace("]", " ").split())
        while len(q) > room:
            q = q.rsplit(" ", 1)[0] if " " in q else q[:room]
        if q and q not in out:
            out.append(q)
    return out


def solve_target(env: Any) -> Optional[Tuple[int, List[str]]]:
    """(target product index, plan from the search page), cached per goal on the env (``env._solve_cache``)."""
    key = (env.goal_index, id(env.goal))
    if env._solve_cache is not None and env._solve_cache[0] == key:
        return env._solve_cache[1]
    per_page = env.config.results_per_page
    goal_idx = env.catalog.index_of(env.goal["asin"])
    searches = []
    found = None
    for q in candidate_queries(env):
        results = env.search_engine.search(q, k=env.config.search_return_n)
        searches.append((q, results))
        walk = None if goal_idx is None else page_walk(results, goal_idx, 1, per_page)
        if walk is not None:
            found = (goal_idx, q, walk)
            break
    if found is None:  # the goal's product is out of reach: the best product any of the searches shows
        best = None
        for q, results in searches:
            for i in results:
                p = env.catalog.product(i)
                opts = {t: v for t, (v, _) in option_choice(env, p).items()}
                r = get_reward(p.reward_view(), env.goal, p.price, opts)[0]
                if best is None or r > best[0]:
                    best = (r, i, q, page_walk(results, i, 1, per_page))
        found = None if best is None else best[1:]
    out = None
    if found is not None:
        idx, q, walk = found
        out = (idx, [f"search[{q}]"] + walk + [f"click[{env.catalog.product(idx).asin.lower()}]"]
               + item_plan(env, idx, {}))
    env._solve_cache = (key, out)
    return out
