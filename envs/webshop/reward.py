"""WebShop's purchase reward, without its heavy NLP dependencies.

The structure follows WebShop's ``web_agent_site/engine/goal.py::get_reward``::

    reward = r_type * (n_attr_matched + n_option_matched + r_price) / (n_goal_attrs + n_goal_options + 1)

* ``r_type`` (product type): 1 when the purchase is of the goal's type, judged from the search query the
  product was scraped under, its category breadcrumb (>= 2 shared levels), and the overlap of the titles'
  content words; 0.5 when none of the three agrees, 0.1 when the title overlap is below 0.1, 0 when it is 0.
* attributes: a goal attribute counts when a fuzzy match (> 85) with one of the product's attributes exists,
  or when it occurs verbatim in the title, bullet points or description.
* options: each chosen option counts when it matches a goal option (exactly for ``size``, fuzzily otherwise)
  or occurs in the product's text; colours are reduced to a base colour name first.
* price: 1 when the price paid is at most the goal's bound.

Lightweight equivalents (documented deviations from WebShop):

* ``thefuzz.fuzz.token_set_ratio`` is re-implemented on :class:`difflib.SequenceMatcher` (same token-set
  construction; difflib's ratio instead of python-Levenshtein's, which agree closely on short phrases).
* spaCy's noun / proper-noun filter of the titles is replaced (unless ``env_config.spacy_model`` names a spaCy
  pipeline: then the type reward is WebShop's own, :func:`webshop_type_reward`) by a content-word filter: lower-cased
  alphanumeric words of two or more characters that are not stop words, pure numbers, units or common
  marketing adjectives (:data:`TITLE_FILLER`). Identical titles still score 1, unrelated ones 0.
* WebShop's colour table is replaced by :data:`BASE_COLORS`: an option value that contains a base colour
  as a whole phrase is reduced to the longest such colour.
* The option count is capped at the number of goal options (WebShop can count more matches than goal
  options when extra chosen options happen to occur in the product's text, which pushes the reward
  above 1); the reward is therefore always in [0, 1].
"""
from __future__ import annotations

import functools
import re
from difflib import SequenceMatcher
from typing import Any, Dict, List, Mapping, Sequence

EXACT_MATCH_OPTIONS = ("size",)
FUZZY_THRESHOLD = 85

_NON_ALNUM = re.compile(r"[^0-9a-z]+")

#: English stop words dropped from titles before the type comparison
STOP_WORDS = frozenset(
    "a an and are as at be but by for from if in into is it its no not of on or such that the their then "
    "there these they this to was will with without your you our we i me my x".split()
)
#: words that carry no product type (units, pack counts, marketing adjectives)
TITLE_FILLER = frozenset(
    "new pack packs count ct pcs pc piece pieces set sets oz fl ounce ounces lb lbs inch inches in cm mm ml "
    "g kg ft feet size sizes color colors colour premium best great quality high low ultra super extra mini "
    "large small medium big long short soft hard light heavy perfect gift gifts portable professional "
    "original classic deluxe natural upgraded latest version model style design home men women mens "
    "womens man woman unisex adult adults kids kid boys girls one two three four five six".split()
)
#: base colour names; an option value is reduced to the longest one it contains
BASE_COLORS = tuple(sorted({
    "black", "white", "grey", "gray", "silver", "gold", "rose gold", "red", "dark red", "wine red",
    "burgundy", "maroon", "pink", "hot pink", "purple", "violet", "lavender", "blue", "navy", "navy blue",
    "light blue", "sky blue", "royal blue", "teal", "turquoise", "aqua", "green", "dark green", "olive",
    "olive green", "army green", "mint", "mint green", "yellow", "mustard", "orange", "coral", "peach",
    "brown", "dark brown", "coffee", "khaki", "beige", "tan", "camel", "cream", "ivory", "off white",
    "clear", "transparent", "multicolor", "multi color", "charcoal",
}, key=lambda c: (-len(c), c)))
_COLOR_RES = tuple((c, re.compile(r"(?<![0-9a-z])" + re.escape(c) + r"(?![0-9a-z])")) for c in BASE_COLORS)


def process_text(s: Any) -> str:
    """Lower-case, replace everything but letters and digits by spaces, collapse spaces."""
    return " ".join(_NON_ALNUM.sub(" ", str(s).lower()).split())


def _ratio(a: str, b: str) -> float:
    if not a and not b:
        return 0.0
    return SequenceMatcher(None, a, b, autojunk=False).ratio()


def token_set_ratio(a: Any, b: Any) -> int:
    """0..100 similarity of two phrases as token sets (stand-in for ``thefuzz.fuzz.token_set_ratio``).

    Shared tokens (sorted) form a common core; each side's remainder is appended to it; the best pairwise
    similarity among the core and the two extended strings is returned. A phrase whose tokens are a subset of
    the other's therefore scores 100.
    """
    ta, tb = set(process_text(a).split()), set(process_text(b).split())
    if not ta or not tb:
        return 0
    inter = " ".join(sorted(ta & tb))
    rest_a = " ".join(sorted(ta - tb))
    rest_b = " ".join(sorted(tb - ta))
    ca = f"{inter} {rest_a}".strip()
    cb = f"{inter} {rest_b}".strip()
    best = max(_ratio(inter, ca), _ratio(inter, cb), _ratio(ca, cb))
    return int(round(100 * best))


def normalize_color(value: Any) -> str:
    """Reduce an option value to the longest base colour it names; other values are returned lower-cased."""
    v = str(value).strip().lower()
    for color, rx in _COLOR_RES:
        if rx.search(v):
            return "grey" if color == "gray" else color
    return v


def title_content_words(title: str) -> List[str]:
    """Content words of a product title (the stand-in for spaCy's NOUN/PROPN tokens)."""
    out = []
    for w in process_text(title).split():
        if len(w) < 2 or w in STOP_WORDS or w in TITLE_FILLER or w.isdigit():
            continue
        if not any(ch.isalpha() for ch in w):
            continue
        out.append(w)
    return out


def _category_levels(breadcrumb: str) -> set:
    return {x.strip().lower() for x in str(breadcrumb or "").split("›") if x.strip()}


SPACY_NOUN_TAGS = ("PNOUN", "NOUN", "PROPN")  # WebShop's tag list ("PNOUN" is not a spaCy tag; kept as WebShop has it)


@functools.lru_cache(maxsize=4)
def load_spacy(model: str) -> Any:
    """``spacy.load(model)`` (a model directory, or an installed model package's name), once per process. Raises a
    ``ValueError`` naming ``spacy_model`` and the way out when spaCy or the model is missing."""
    try:
        import spacy
    except ImportError:
        raise ValueError(f"webshop env_config.spacy_model={model!r} needs spaCy (pip install spacy), or set it to null "
                         "for the built-in noun filter") from None
    try:
        return spacy.load(model)
    except OSError as e:
        raise ValueError(f"webshop env_config.spacy_model={model!r}: spaCy cannot load it ({e}); give the directory of "
                         "an English pipeline with a tagger (e.g. en_core_web_sm, WebShop's), or null for the "
                         "built-in noun filter") from None


def spacy_nouns(nlp: Any, title: str) -> List[str]:
    """WebShop's title words for the type reward: the lower-cased text of every token ``nlp`` tags as a noun or
    proper noun, in order, repeats kept."""
    return [t.text.lower() for t in nlp(title) if t.pos_ in SPACY_NOUN_TAGS]


def webshop_type_reward(purchased: Mapping[str, Any], goal: Mapping[str, Any], nlp: Any) -> Dict[str, Any]:
    """WebShop's ``get_type_reward`` to the letter, with ``nlp`` (a spaCy pipeline) as its noun tagger: the query
    must be equal as is, categories share >= 2 stripped levels (case kept), and the title score divides the shared
    distinct nouns by the goal's noun count with repeats."""
    query_match = purchased.get("query") == goal.get("query")
    bought_levels = [x.strip() for x in str(purchased.get("product_category", "")).split("›")]
    goal_levels = [x.strip() for x in str(goal.get("product_category", "")).split("›")]
    category_match = len(set(bought_levels) & set(goal_levels)) >= 2
    bought = spacy_nouns(nlp, str(purchased.get("name", purchased.get("Title", ""))))
    desired = spacy_nouns(nlp, str(goal.get("name", "")))
    title_score = 0.2 if not desired else len(set(bought) & set(desired)) / len(desired)
    return dict(r_type=_r_type(query_match, category_match, title_score), query_match=query_match,
                category_match=category_match, title_score=title_score)


def _r_type(query_match: bool, category_match: bool, title_score: float) -> float:
    """WebShop's type score from its three signals: 1 if any agrees, else 0.5; 0.1 below a title score of 0.1; 0
    at 0."""
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return r_type


# WebShop's colour vocabulary (web_agent_site/engine/normalize.py), data needed for its option rule: an option
# value becomes the first of these it contains
WEBSHOP_COLORS = tuple("""alabaster apricot aqua ash asphalt azure banana beige black blue blush bordeaux bronze brown
burgundy camel camo caramel champagne charcoal cheetah chestnut chocolate christmas coffee cognac
copper coral cranberry cream crystal dark denim eggplant elephant espresso fuchsia gold granite
grape graphite grass gray green grey heather indigo ivory ivy khaki lavender lemon leopard light
lilac lime magenta maroon mauve merlot midnight mint mocha multicolor mushroom mustard natural navy
nude olive orange peach pewter pink plum purple rainbow red rose royal rust sand sapphire seashell
silver skull slate steel stone stonewash sunflower tan taupe teal tiger turquoise violet walnut
wheat white wine yellow""".split())


def webshop_color(value: str) -> str:
    """WebShop's ``normalize_color``: the first colour of :data:`WEBSHOP_COLORS` that ``value`` contains (as is)."""
    return next((c for c in WEBSHOP_COLORS if c in value), value)


def fuzzy_ratio() -> Any:
    """``thefuzz.fuzz.token_set_ratio`` (WebShop's) when thefuzz is installed, else :func:`token_set_ratio`."""
    try:
        from thefuzz import fuzz
        return fuzz.token_set_ratio
    except ImportError:
        return token_set_ratio


def webshop_attribute_reward(purchased: Mapping[str, Any], goal: Mapping[str, Any]) -> tuple:
    """WebShop's ``get_attribute_reward``: ``(r_attr, n_matched)``; a goal attribute counts on a fuzzy match (> 85)
    with a product attribute, else when it occurs as written in the lower-cased title, bullet points or description."""
    ratio = fuzzy_ratio()
    goal_attrs = list(goal.get("attributes", []) or [])
    texts = _product_text(purchased)
    n = sum(1 for g in goal_attrs
            if any(ratio(p, g) > FUZZY_THRESHOLD for p in purchased.get("Attributes", []) or [])
            or any(str(g) in t for t in texts))
    return (n / len(goal_attrs) if goal_attrs else 0.0), n


def webshop_option_reward(chosen_options: Mapping[str, str], goal_options: Sequence[str]) -> tuple:
    """WebShop's ``get_option_reward``: ``(r_option or None, n_matched)``; each goal option counts when some chosen
    option matches it fuzzily (> 85) after WebShop's colour normalisation (so ``3 ounce (pack of 12)`` matches
    ``3 ounce (pack of 4)``, as in WebShop)."""
    ratio = fuzzy_ratio()
    chosen = [webshop_color(str(o)) for o in chosen_options.values()]
    goals = [webshop_color(str(o)) for o in goal_options]
    n = sum(1 for g in goals if any(ratio(c, g) > FUZZY_THRESHOLD for c in chosen))
    return (n / len(goals) if goals else None), n


def get_type_reward(purchased: Mapping[str, Any], goal: Mapping[str, Any], nlp: Any = None) -> Dict[str, Any]:
    """The type reward: WebShop's own (:func:`webshop_type_reward`) when ``nlp`` (a spaCy pipeline) is given, else
    the built-in content-word filter (lower-cased query and categories, distinct words)."""
    if nlp is not None:
        return webshop_type_reward(purchased, goal, nlp)
    query_match = str(purchased.get("query", "")).strip().lower() == str(goal.get("query", "")).strip().lower()
    category_match = len(_category_levels(purchased.get("product_category", ""))
                         & _category_levels(goal.get("product_category", ""))) >= 2
    desired = set(title_content_words(goal.get("name", "")))
    bought = set(title_content_words(purchased.get("name", purchased.get("Title", ""))))
    title_score = 0.2 if not desired else len(desired & bought) / len(desired)
    return dict(r_type=_r_type(query_match, category_match, title_score), query_match=query_match,
                category_match=category_match, title_score=title_score)


def _product_text(purchased: Mapping[str, Any]) -> tuple:
    bullets = purchased.get("BulletPoints", []) or []
    if isinstance(bullets, str):
        bullets = [bullets]
    return (str(purchased.get("Title", "")).lower(), " ".join(map(str, bullets)).lower(),
            str(purchased.get("Description", "")).lower())


def get_attribute_reward(purchased: Mapping[str, Any], goal: Mapping[str, Any]) -> tuple:
    """Returns ``(r_attr, n_matched)``: the fraction of goal attributes the product has."""
    goal_attrs = list(goal.get("attributes", []) or [])
    product_attrs = list(purchased.get("Attributes", []) or [])
    texts = None
    n = 0
    for g in goal_attrs:
        if any(token_set_ratio(p, g) > FUZZY_THRESHOLD for p in product_attrs):
            n += 1
            continue
        if texts is None:
            texts = _product_text(purchased)
        gl = str(g).lower()
        if any(gl in t for t in texts):
            n += 1
    return (n / len(goal_attrs) if goal_attrs else 0.0), n


def get_option_reward(purchased: Mapping[str, Any], goal_options: Sequence[str],
                      chosen_options: Mapping[str, str]) -> tuple:
    """Returns ``(r_option or None when the goal has no options, n_matched)``; n is capped at len(goal_options)."""
    goal_norm = [normalize_color(o) for o in goal_options]
    texts = None
    n = 0
    for key, value in chosen_options.items():
        v = normalize_color(value)
        matched = False
        if str(key).strip().lower() in EXACT_MATCH_OPTIONS:
            matched = v in goal_norm
        else:
            matched = any(token_set_ratio(g, v) > FUZZY_THRESHOLD for g in goal_norm)
        if not matched:
            if texts is None:
                texts = _product_text(purchased)
            matched = bool(v) and any(v in t for t in texts)
        n += int(matched)
    n = min(n, len(goal_norm))
    return (n / len(goal_norm) if goal_norm else None), n


def get_reward(purchased: Mapping[str, Any], goal: Mapping[str, Any], price: float,
               chosen_options: Mapping[str, str], nlp: Any = None) -> tuple:
    """WebShop's reward of buying ``purchased`` at ``price`` with ``chosen_options`` for ``goal``.

    ``purchased`` uses WebShop's product keys (``name``/``Title``, ``query``, ``product_category``,
    ``Attributes``, ``BulletPoints``, ``Description``); ``goal`` its goal keys (``name``, ``query``,
    ``product_category``, ``attributes``, ``goal_options`` (list or dict), ``price_upper``).
    Returns ``(reward in [0, 1], parts)``; ``parts`` holds WebShop's verbose info (r_type, r_att, w_att,
    r_option, w_option, r_price, w_price, query_match, category_match, title_score). ``nlp``: a spaCy pipeline
    (``env_config.spacy_model``): WebShop's own rules throughout (its noun tagger for the type reward, its option
    and attribute rules and colours, thefuzz when installed); None: the built-in rules below.
    """
    goal_options = goal.get("goal_options", []) or []
    if isinstance(goal_options, Mapping):
        goal_options = list(goal_options.values())
    goal_options = [str(o) for o in goal_options]
    n_attrs = len(goal.get("attributes", []) or [])
    denom = n_attrs + len(goal_options) + 1

    type_parts = get_type_reward(purchased, goal, nlp)
    price_upper = float(goal.get("price_upper", 1e6))
    r_price = float(price is not None and float(price) <= price_upper)
    if nlp is None:
        r_att, n_att = get_attribute_reward(purchased, goal)
        r_option, n_opt = get_option_reward(purchased, goal_options, chosen_options)
    else:  # WebShop's own rules throughout
        r_att, n_att = webshop_attribute_reward(purchased, goal)
        r_option, n_opt = webshop_option_reward(chosen_options, goal_options)

    reward = (n_att + n_opt + r_price) / denom * type_parts["r_type"]
    reward = min(1.0, max(0.0, reward))
    parts: Dict[str, Any] = dict(
        r_type=float(type_parts["r_type"]), r_att=float(r_att), w_att=n_attrs / denom,
        r_price=r_price, w_price=1.0 / denom,
        query_match=bool(type_parts["query_match"]), category_match=bool(type_parts["category_match"]),
        title_score=float(type_parts["title_score"]),
    )
    if r_option is not None:  # as in WebShop, the option part is absent when the goal names no option
        parts["r_option"] = float(r_option)
        parts["w_option"] = len(goal_options) / denom
    return reward, parts


__all__ = ["get_reward", "get_type_reward", "webshop_type_reward", "load_spacy", "spacy_nouns", "webshop_color",
           "webshop_option_reward", "webshop_attribute_reward", "get_attribute_reward", "get_option_reward",
           "token_set_ratio",
           "normalize_color", "title_content_words", "process_text"]
