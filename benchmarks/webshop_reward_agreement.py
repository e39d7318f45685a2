"""How often our WebShop reward equals WebShop's own ``get_reward`` (web_agent_site/engine/goal.py).

    python benchmarks/webshop_reward_agreement.py --webshop /path/to/WebShop [--n 5000] [--spacy-model en_core_web_sm]

``--webshop``: a checkout of princeton-nlp/WebShop (only ``web_agent_site/engine/{goal,normalize}.py`` are imported;
needs ``thefuzz`` and ``rich``). ``--spacy-model``: a spaCy pipeline both sides tag titles with (WebShop's real
setting); without it both use a stand-in tagger (a word is a noun when our built-in filter keeps it), which measures
every rule but the tagger. Pairs: a random goal of the shipped catalog and a random product (the goal's own product
30% of the time) with random options; then every goal's expert purchase. Prints the share of equal rewards for our
built-in rules and for ``spacy_model`` mode (WebShop's rules).
"""
from __future__ import annotations

import argparse
import random
import re
import sys
import types


class _Token:
    def __init__(self, text: str, pos: str):
        self.text, self.pos_ = text, pos


def standin_tagger(text: str):
    """Tokens of ``text`` tagged NOUN when the built-in content-word filter keeps them."""
    from ragen_turn.envs.webshop.reward import title_content_words

    keep = set(title_content_words(text))
    return [_Token(w, "NOUN" if w.lower() in keep else "X") for w in re.findall(r"[A-Za-z0-9]+|[^\sA-Za-z0-9]", text)]


def load_webshop_goal(webshop_dir: str, nlp):
    """WebShop's goal module, with ``spacy.load`` answering ``nlp`` (its module-level model load)."""
    import importlib

    fake = types.ModuleType("spacy")
    fake.load = lambda name: nlp
    real = sys.modules.get("spacy")
    sys.modules["spacy"] = fake
    sys.path.insert(0, webshop_dir)
    try:
        goal = importlib.import_module("web_agent_site.engine.goal")
    finally:
        if real is not None:
            sys.modules["spacy"] = real
    goal.print = lambda *a, **k: None
    return goal


def expert_options(product, goal) -> dict:
    gopts = goal["goal_options"]
    if isinstance(gopts, dict):
        return dict(gopts)
    out: dict = {}
    for o in gopts:
        for k, vals in product.options.items():
            if o in vals and k not in out:
                out[k] = o
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--webshop", required=True, help="a checkout of princeton-nlp/WebShop")
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--spacy-model", default=None, help="a spaCy pipeline (default: the stand-in tagger)")
    args = ap.parse_args()

    from ragen_turn.envs.webshop import WebShopEnv
    from ragen_turn.envs.webshop import reward as ours

    nlp = ours.load_spacy(args.spacy_model) if args.spacy_model else standin_tagger
    W = load_webshop_goal(args.webshop, nlp)
    cat = WebShopEnv().catalog
    products = [cat.product(i) for i in range(len(cat))]
    rnd = random.Random(args.seed)
    equal = {"built-in": 0, "spacy_model": 0}
    for _ in range(args.n):
        g = rnd.choice(cat.goals)
        p = cat.get(g["asin"]) if rnd.random() < 0.3 else rnd.choice(products)
        options = {k: rnd.choice(v) for k, v in p.options.items()}
        view = p.reward_view()
        want = W.get_reward(view, g, p.price, options)
        equal["built-in"] += abs(want - ours.get_reward(view, g, p.price, options)[0]) < 1e-9
        equal["spacy_model"] += abs(want - ours.get_reward(view, g, p.price, options, nlp=nlp)[0]) < 1e-9
    expert = {"built-in": 0, "spacy_model": 0}
    for g in cat.goals:
        p = cat.get(g["asin"])
        options = expert_options(p, g)
        want = W.get_reward(p.reward_view(), g, p.price, options)
        expert["built-in"] += abs(want - ours.get_reward(p.reward_view(), g, p.price, options)[0]) < 1e-9
        expert["spacy_model"] += abs(want - ours.get_reward(p.reward_view(), g, p.price, options, nlp=nlp)[0]) < 1e-9
    tagger = args.spacy_model or "stand-in (built-in filter as tagger)"
    print(f"tagger: {tagger}; fuzzy ratio: {ours.fuzzy_ratio().__module__}")
    for k in equal:
        print(f"{k:12s} random pairs {equal[k]}/{args.n} ({equal[k] / args.n:.3f}), "
              f"expert purchases {expert[k]}/{len(cat.goals)}")


if __name__ == "__main__":
    main()
