"""WebShop env: loader, search, pages and actions, reward, caching, gymnasium wrapper."""
from __future__ import annotations

import importlib.util
import json
import os
import time
import warnings

import pytest

pytest.importorskip("bm25s")

from ragen_turn.envs import REGISTERED_ENVS, make_env  # noqa: E402
from ragen_turn.envs.webshop import (  # noqa: E402
    SHIPPED_DATA_DIR, BM25SearchEngine, WebShopDataError, WebShopEnv, WebShopEnvConfig, clear_search_cache,
    get_search_engine, load_catalog,
)
from ragen_turn.envs.webshop import catalog as C  # noqa: E402
from ragen_turn.envs.webshop import reward as R  # noqa: E402
from ragen_turn.envs.webshop.jsonstream import iter_json_records, read_record  # noqa: E402
from ragen_turn.envs.webshop.search import Tokenizer, light_stem  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAV = {"click[back to search]", "click[< prev]", "click[next >]", "click[description]", "click[features]",
       "click[reviews]", "click[attributes]", "click[buy now]"}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("webshop_cache"))


@pytest.fixture(scope="module")
def make(cache_dir):
    def _make(**kw):
        kw.setdefault("cache_dir", cache_dir)
        return WebShopEnv(WebShopEnvConfig(**kw))
    return _make


def run_expert(env: WebShopEnv, seed: int, mode=None):
    """Follow the env's expert (``env.solve()``) one action at a time until the episode ends."""
    env.reset(seed=seed, mode=mode)
    return play_expert(env)


def play_expert(env: WebShopEnv, check_plan: bool = True):
    """Step ``env.solve()[0]`` until done; every planned action is valid and the plan stays consistent."""
    plan = env.solve()
    while True:
        action = plan[0]
        assert action.startswith("search[") or action in env.get_available_actions(), (action, env.render())
        obs, r, done, info = env.step(action)
        assert info["action_is_valid"] and info["action_is_effective"], (action, obs)
        new = env.solve()
        if check_plan:
            assert new == plan[1:], (action, plan, new)  # the plan from the next state is the rest of this one
        if done:
            assert new == []
            return obs, r, done, info
        plan = new


# ---------------------------------------------------------------------------------------------- loader
def test_shipped_catalog_files_and_format():
    names = sorted(os.listdir(SHIPPED_DATA_DIR))
    assert names == ["items_human_ins.json", "items_ins_v2.json", "items_shuffle.json"]
    assert sum(os.path.getsize(os.path.join(SHIPPED_DATA_DIR, n)) for n in names) < 1_000_000
    with open(os.path.join(SHIPPED_DATA_DIR, "items_shuffle.json")) as f:
        raw = json.load(f)
    assert isinstance(raw, list) and 200 <= len(raw) <= 1000
    for key in ("asin", "name", "category", "query", "product_category", "pricing", "customization_options",
                "full_description", "small_description", "images"):
        assert all(key in p for p in raw), key
    assert len({p["category"] for p in raw}) >= 5
    assert all(p["pricing"].startswith("$") for p in raw)
    with open(os.path.join(SHIPPED_DATA_DIR, "items_human_ins.json")) as f:
        human = json.load(f)
    some = next(iter(human.values()))[0]
    assert set(some) >= {"asin", "instruction", "instruction_attributes", "instruction_options"}


def test_generator_script_reproduces_shipped_catalog():
    spec = importlib.util.spec_from_file_location("mk", os.path.join(REPO, "scripts", "make_webshop_catalog.py"))
    mk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mk)
    products, ins_v2, human = mk.generate_catalog(mk.DEFAULT_NUM_PRODUCTS, mk.DEFAULT_SEED)
    for name, obj in (("items_shuffle.json", products), ("items_ins_v2.json", ins_v2),
                      ("items_human_ins.json", human)):
        with open(os.path.join(SHIPPED_DATA_DIR, name)) as f:
            assert json.load(f) == obj, name
    other, _, _ = mk.generate_catalog(50, 1)
    assert [p["asin"] for p in other] != [p["asin"] for p in products[:50]]


def test_loader_on_shipped_catalog(cache_dir):
    cat = load_catalog(SHIPPED_DATA_DIR)
    assert len(cat) == 300 and not cat.lazy
    for i in range(len(cat)):
        p = cat.product(i)
        assert p.asin == p.asin.upper() and len(p.asin) == 10 and cat.index_of(p.asin) == i
        assert p.name and p.query == p.query.lower() and "›" in p.product_category
        assert p.attributes and p.price > 0 and p.price_tag.startswith("$")
        assert p.pricing[0] <= p.price <= p.pricing[-1]
        for opt_type, values in p.options.items():
            assert opt_type == opt_type.lower() and values and all(v == v.lower() and "/" not in v for v in values)
    assert sum(bool(cat.product(i).options) for i in range(len(cat))) > 250
    assert any(" | " in v for i in range(len(cat)) for vs in cat.product(i).options.values() for v in vs)
    goals = cat.goals
    assert len(goals) > 250
    for g in goals:
        p = cat.get(g["asin"])
        assert g["attributes"] and all(a in p.attributes for a in g["attributes"])
        assert all(any(o in vs for vs in p.options.values()) for o in g["goal_options"])
        assert g["price_upper"] > p.price and g["price_upper"] % 10 == 0
        assert g["instruction_text"].endswith(f", and price lower than {g['price_upper']:.2f} dollars")
    # reloading gives the same goal order (WebShop's seeded shuffle)
    again = C.Catalog(C.resolve_data_files(SHIPPED_DATA_DIR))
    assert again.goals == goals
    # num_products keeps the first N records, and only their goals
    sub = load_catalog(SHIPPED_DATA_DIR, num_products=100)
    assert list(sub.asins) == list(cat.asins[:100])
    assert {g["asin"] for g in sub.goals} <= set(sub.asins) and len(sub.goals) < len(goals)
    # synthetic goals (human_goals=False): one goal per option combination, options as a dict
    syn = load_catalog(SHIPPED_DATA_DIR, human_goals=False)
    assert len(syn.goals) > len(goals) and all(isinstance(g["goal_options"], dict) for g in syn.goals)


def _write_tiny(d):
    products = [
        {"asin": "B000000001", "name": "Acme Red Running Shoes", "category": "fashion", "query": "Running Shoes ",
         "product_category": "Clothing › Shoes › Running", "pricing": "$25.50",
         "customization_options": {"Color": [{"value": "Red/Black", "image": None}, {"value": "Blue", "image": None}],
                                   "Size": [{"value": "9", "image": None}, {"value": "10", "image": None}]},
         "full_description": "Light running shoes with a rubber sole.", "small_description": ["LIGHT: only 200 g"],
         "images": ["x.jpg"], "average_rating": 4.5},
        {"asin": "B000000002", "name": "Zen Green Tea Bags", "category": "food", "query": "green tea",
         "product_category": "Grocery › Beverages › Tea", "pricing": "$4.99 - $8.49",
         "customization_options": None, "full_description": "Organic tea.", "small_description": "ORGANIC",
         "images": []},
        {"asin": "B000000001", "name": "Duplicate ASIN, dropped", "category": "x", "query": "x",
         "product_category": "", "pricing": "", "customization_options": {}, "full_description": "",
         "small_description": [], "images": []},
        {"asin": "nan", "name": "Bad ASIN, dropped", "category": "x", "query": "x", "product_category": "",
         "pricing": "", "customization_options": {}, "full_description": "", "small_description": [], "images": []},
        {"asin": "B000000003", "name": "Oak Bookshelf", "category": "furniture", "query": "bookshelf",
         "product_category": "Home › Furniture › Bookcases", "pricing": None, "customization_options": {},
         "full_description": "Five shelves.", "small_description": [], "images": []},
    ]
    ins_v2 = {"B000000001": {"attributes": ["rubber sole", "lightweight"], "instruction": "i need running shoes",
                             "instruction_attributes": ["rubber sole"]},
              "B000000002": {"attributes": ["usda organic"], "instruction": None, "instruction_attributes": []}}
    human = {"B000000001": [
        {"asin": "B000000001", "instruction": "i need lightweight running shoes with a rubber sole in size 10.",
         "instruction_attributes": ["rubber sole", "lightweight"], "instruction_options": ["10", "red | black"]},
        {"asin": "B000000001", "instruction": "no attributes: skipped", "instruction_attributes": [],
         "instruction_options": []}],
        "B000000002": [{"asin": "B000000002", "instruction": "organic green tea", "instruction_attributes":
                        ["usda organic"], "instruction_options": []}],
        "B999999999": [{"asin": "B999999999", "instruction": "not in the catalog", "instruction_attributes": ["x"],
                        "instruction_options": []}]}
    for name, obj in (("items_shuffle.json", products), ("items_ins_v2.json", ins_v2),
                      ("items_human_ins.json", human)):
        with open(os.path.join(d, name), "w") as f:
            json.dump(obj, f, indent=1)


def test_loader_on_handwritten_three_product_file(tmp_path, cache_dir):
    _write_tiny(str(tmp_path))
    cat = load_catalog(str(tmp_path))
    assert list(cat.asins) == ["B000000001", "B000000002", "B000000003"]
    shoes, tea, shelf = (cat.product(i) for i in range(3))
    assert shoes.name == "Acme Red Running Shoes" and shoes.query == "running shoes"
    assert shoes.options == {"color": ["red | black", "blue"], "size": ["9", "10"]}
    assert shoes.pricing == [25.5] and shoes.price == 25.5 and shoes.price_tag == "$25.5"
    assert shoes.attributes == ["rubber sole", "lightweight"] and shoes.rating == 4.5
    assert tea.pricing == [4.99, 8.49] and tea.price_tag == "$4.99 to $8.49" and 4.99 <= tea.price <= 8.49
    assert tea.bullets == ["ORGANIC"] and tea.options == {} and tea.rating == "N.A."
    assert shelf.pricing == [100.0] and shelf.attributes == []
    assert cat.index_of("b000000002") == 1 and cat.get("B000000009") is None
    assert len(cat.goals) == 2
    g = next(g for g in cat.goals if g["asin"] == "B000000001")
    assert g["instruction_text"].startswith("i need lightweight running shoes with a rubber sole in size 10, and")
    assert g["price_upper"] in (40.0, 50.0, 60.0) and g["goal_options"] == ["10", "red | black"]
    assert g["query"] == "running shoes" and g["name"] == shoes.name
    # search finds each product by its exact title; a query without indexed words finds nothing
    eng = BM25SearchEngine(cat, cache_dir=None)
    for i in range(3):
        assert eng.search(cat.product(i).name)[0] == i
    assert eng.search("the of and") == [] and eng.search("zzzz") == []
    # the env runs on it, and the scripted expert earns 1.0
    env = WebShopEnv({"data_dir": str(tmp_path), "cache_dir": cache_dir, "split": "all"})
    for seed in range(len(cat.goals)):
        obs, r, done, info = run_expert(env, seed)
        assert done and r == 1.0 and info["success"], info


def test_missing_files_give_a_clear_error(tmp_path, cache_dir):
    with pytest.raises(WebShopDataError) as e:
        WebShopEnv({"data_dir": str(tmp_path / "nowhere"), "cache_dir": cache_dir})
    msg = str(e.value)
    assert "does not exist" in msg and "data_dir" in msg and "setup.sh" in msg and "README" in msg
    assert isinstance(e.value, FileNotFoundError)
    with pytest.raises(WebShopDataError, match="items_shuffle.json"):
        load_catalog(str(tmp_path))
    _write_tiny(str(tmp_path))
    os.remove(tmp_path / "items_human_ins.json")
    with pytest.raises(WebShopDataError, match="items_human_ins.json"):
        load_catalog(str(tmp_path))
    assert len(load_catalog(str(tmp_path), human_goals=False).goals) == 4  # 2 colours x 2 sizes
    (tmp_path / "items_shuffle.json").write_text('[{"asin": "B1", "name": ')
    with pytest.raises(WebShopDataError, match="Cannot read"):
        load_catalog(str(tmp_path), human_goals=False)


def test_lazy_mode_matches_in_memory(tmp_path):
    mem = load_catalog(SHIPPED_DATA_DIR)
    lazy = C.Catalog(C.resolve_data_files(SHIPPED_DATA_DIR), lazy=True, cache_dir=str(tmp_path))
    assert lazy.lazy and os.path.exists(tmp_path / f"catalog_{lazy.key}.npz")
    assert len(lazy) == len(mem) and lazy.goals == mem.goals
    assert all(lazy.product(i) == mem.product(i) for i in range(0, len(mem), 7))
    assert [p.asin for p in lazy.iter_products()] == list(mem.asins)
    again = C.Catalog(C.resolve_data_files(SHIPPED_DATA_DIR), lazy=True, cache_dir=str(tmp_path))  # offsets cached
    assert again.goals == mem.goals and again.product(5) == mem.product(5)
    a, b = BM25SearchEngine(mem), BM25SearchEngine(lazy)
    assert a.search("bluetooth speaker waterproof") == b.search("bluetooth speaker waterproof")
    lazy.close()
    again.close()


def test_json_stream_offsets(tmp_path):
    items = [{"k": i, "s": "caf\u00e9 \u203a \U0001F600" * (i % 5)} for i in range(200)]
    p = tmp_path / "a.json"
    p.write_text(json.dumps(items, ensure_ascii=False, indent=1), encoding="utf-8")
    recs = list(iter_json_records(str(p), chunk_bytes=13))
    assert [v for _, v, _, _ in recs] == items
    fd = os.open(p, os.O_RDONLY)
    try:
        assert all(read_record(fd, off, n) == v for _, v, off, n in recs)
    finally:
        os.close(fd)
    p.write_text(json.dumps({"a": 1, "b": [1, 2]}))
    assert [(k, v) for k, v, _, _ in iter_json_records(str(p), chunk_bytes=2)] == [("a", 1), ("b", [1, 2])]


# ---------------------------------------------------------------------------------------------- search
def test_search_finds_exact_titles_and_caches(cache_dir):
    clear_search_cache()  # an engine an earlier test built (with another cache_dir) would be handed back
    cat = load_catalog(SHIPPED_DATA_DIR)
    eng = get_search_engine(cat, cache_dir=cache_dir)
    ranks = []
    for i in range(len(cat)):
        hits = eng.search(cat.product(i).name.lower(), k=50)
        ranks.append(hits.index(i) if i in hits else 99)
    assert sum(r == 0 for r in ranks) >= 0.95 * len(cat) and max(ranks) <= 2
    hits = eng.search("wireless earbuds", k=50)
    assert 0 < len(hits) <= 50 and cat.product(hits[0]).query == "wireless earbuds"
    assert eng.search("wireless earbuds", k=5) == hits[:5]
    assert light_stem("shoes") == "shoe" and light_stem("dresses") == "dress" and light_stem("berries") == "berry"
    assert light_stem("glass") == "glass" and Tokenizer()("The Shoes and a DRESS") == ["shoe", "dress"]
    # the index is on disk: a fresh engine in a fresh process-cache loads it and answers the same
    clear_search_cache()
    again = get_search_engine(cat, cache_dir=cache_dir)
    assert again is not eng and again.loaded_from_cache
    assert again.search("wireless earbuds", k=50) == hits


def test_many_envs_share_catalog_and_index(make):
    first = make()
    t = time.perf_counter()
    envs = [make() for _ in range(64)]
    assert time.perf_counter() - t < 2.0
    assert all(e.catalog is first.catalog and e.search_engine is first.search_engine for e in envs)
    assert REGISTERED_ENVS["webshop"] is WebShopEnv
    env = make_env("webshop", {"cache_dir": first.config.cache_dir, "split": "val", "max_steps": 9})
    assert isinstance(env, WebShopEnv) and env.config.max_turns == 9 and env.catalog is first.catalog


# --------------------------------------------------------------------------------------- pages, actions
def test_pages_navigation_and_paging(make):
    env = make()
    obs = env.reset(seed=0)
    assert obs.startswith("WebShop [SEP] Instruction: [SEP] " + env.goal["instruction_text"])
    assert "Available actions: search[<your query>]" in obs
    assert env.get_available_actions() == ["search[<your query>]"]
    obs, r, done, info = env.step("search[shampoo conditioner hair cream]")
    assert info["action_is_valid"] and info["action_is_effective"] and r == 0.0 and not done
    total = len(env.results)
    assert 20 < total <= 50
    assert f"Page 1 (Total results: {total})" in obs and "Back to Search" in obs and " [SEP] " in obs
    acts = env.get_available_actions()
    assert acts[:2] == ["click[back to search]", "click[next >]"] and "click[< prev]" not in acts
    products = [a for a in acts if a not in NAV]
    assert len(products) == 10 and all(a[6:-1].upper() in obs for a in products)
    assert "Available actions: " + ", ".join(acts) in obs
    env.step("click[Next >]")  # labels are case-insensitive
    assert env.results_page == 2 and "click[< prev]" in env.get_available_actions()
    while "click[next >]" in env.get_available_actions():
        env.step("click[next >]")
    assert env.results_page == (total + 9) // 10
    env.step("click[< prev]")
    assert env.results_page == (total + 9) // 10 - 1
    item = [a for a in env.get_available_actions() if a not in NAV][0]
    obs, _, _, info = env.step(item.upper().replace("CLICK", "click"))
    assert info["action_is_valid"] and env.page == "item"
    p = env.product
    assert p.name in obs and f"Price: {p.price_tag}" in obs and "Buy Now" in obs
    acts = env.get_available_actions()
    for label in ("back to search", "< prev", "description", "features", "reviews", "buy now"):
        assert f"click[{label}]" in acts
    assert all(f"click[{v}]" in acts for vs in p.options.values() for v in vs)
    obs, _, _, info = env.step("click[description]")
    assert env.page == "sub" and env.get_available_actions() == ["click[back to search]", "click[< prev]"]
    env.step("click[< prev]")
    assert env.page == "item" and env.product is p
    env.step("click[features]")
    env.step("click[< prev]")
    env.step("click[< prev]")
    assert env.page == "results" and env.item is None
    env.step("click[back to search]")
    assert env.page == "search" and env.keywords is None
    # a query of stop words only: an empty results page
    obs, _, _, info = env.step("search[the and of]")
    assert info["action_is_valid"] and "Total results: 0" in obs
    assert env.get_available_actions() == ["click[back to search]"]


def test_option_selection_and_effectiveness(make):
    env = make()
    env.reset(seed=1)
    env.step(f"search[{env.goal['name']}]")
    env.step(f"click[{env.goal['asin'].lower()}]")
    p = env.product
    opt_type, values = next((k, v) for k, v in p.options.items() if len(v) > 1)
    _, _, _, info = env.step(f"click[{values[0]}]")
    assert info["action_is_valid"] and info["action_is_effective"] and env.options == {opt_type: values[0]}
    _, _, _, info = env.step(f"click[{values[0]}]")
    assert info["action_is_valid"] and not info["action_is_effective"]
    env.step(f"click[{values[1]}]")
    assert env.options == {opt_type: values[1]}
    env.step("click[< prev]")
    assert env.options == {}


def test_observation_is_short_and_truncated(make):
    env = make(max_text_chars=40)
    env.reset(seed=2)
    env.step(f"search[{env.goal['name']}]")
    env.step(f"click[{env.goal['asin'].lower()}]")
    obs, _, _, _ = env.step("click[description]")
    body = obs.split("\n")[0].split(" [SEP] ")[-1]
    assert len(body) <= 40 and body.endswith("...")
    full = make()
    full.reset(seed=2)
    for a in (f"search[{full.goal['query']}]", "click[next >]"):
        obs, _, _, _ = full.step(a)
        assert len(obs) < 3000
    rich = make(observation_mode="text_rich")
    rich.reset(seed=2)
    rich.step(f"search[{rich.goal['name']}]")
    obs, _, _, _ = rich.step(f"click[{rich.goal['asin'].lower()}]")
    assert "[button] Buy Now [button_]" in obs
    value = next(iter(rich.product.options.values()))[0]
    obs, _, _, _ = rich.step(f"click[{value}]")
    assert f"[clicked button] {value} [clicked button_]" in obs and "You have selected" in obs


def test_compact_observation_mode(make):
    env, full = make(observation_mode="compact"), make()
    obs = env.reset(seed=2)
    assert obs.splitlines() == ["WebShop", "Instruction: " + env.goal["instruction_text"], "Search"]
    assert env.config.show_available_actions is False and full.config.show_available_actions is True
    assert make(observation_mode="compact", show_available_actions=True).config.show_available_actions
    full.reset(seed=2)
    for action in env.solve()[:-1]:
        obs, _, _, info = env.step(action)
        full_obs, _, _, _ = full.step(action)
        assert info["action_is_valid"] and env._state_key() == full._state_key()
        assert "[SEP]" not in obs and "Available actions" not in obs and "Instruction" not in obs
        assert len(obs) < 0.8 * len(full_obs)
        if env.page == "results":  # one line per result; every label on the page
            lines = obs.splitlines()
            for a in env.get_available_actions():
                label = a[6:-1]
                assert any(line.lower().startswith(label) or line.lower() == label for line in lines), label
            p = env.catalog.product(env.results[0])
            assert f"{p.asin} {p.name} {p.price_tag}" in lines
    assert env.page == "item" and ("You have selected" in obs) == bool(env.options)
    *_, info = play_expert(env)
    assert info["reward"] == 1.0
    with pytest.raises(ValueError):
        WebShopEnvConfig(show_available_actions="yes")


@pytest.mark.parametrize("action,reason", [
    ("click[nothing here]", "not a clickable label"),
    ("search[shoes]", "no search box"),
    ("click[buy now", "malformed brackets"),
    ("search]shoes[", "malformed brackets"),
    ("click[[buy now]]", "malformed brackets"),
    ("click[]", "needs a label"),
    ("click[   ]", "needs a label"),
    ("x" * 10_240, "characters long"),
    ("buy[now]", "unknown action"),
    ("I think I should buy it", "expected search"),
    (None, "must be a string"),
    (12, "must be a string"),
])
def test_invalid_actions_are_rejected_with_penalty(make, action, reason):
    env = make(format_penalty=-0.25)
    env.reset(seed=3)
    env.step(f"search[{env.goal['query']}]")
    before = (env.render(), env._state_key())
    obs, r, done, info = env.step(action)
    assert r == -0.25 and not done
    assert info["action_is_valid"] is False and info["action_is_effective"] is False and info["success"] is False
    assert reason in info["feedback"] and obs.startswith("Invalid action: ")
    assert obs.endswith(before[0]) and (env.render(), env._state_key()) == before


def test_invalid_actions_on_search_page(make):
    env = make()
    env.reset(seed=4)
    for action, reason in (("click[buy now]", "nothing to click"), ("search[ ]", "query is empty"),
                           ("search[]", "query is empty"), ("x" * 10_240, "characters long"),
                           ("search[a[b]c]", "malformed brackets"), ("click[search]", "nothing to click")):
        obs, r, done, info = env.step(action)
        assert r == env.config.format_penalty == -0.1 and not info["action_is_valid"] and reason in info["feedback"]
        assert env.page == "search"


def test_max_turns_ends_episode(make):
    env = make(max_turns=3)
    env.reset(seed=5)
    _, _, done, _ = env.step("search[tea]")
    assert not done
    _, r, done, info = env.step("click[bogus]")
    assert not done and r == -0.1
    _, r, done, info = env.step("click[back to search]")
    assert done and r == 0.0 and info["truncated"] and not info["success"]
    assert env.get_available_actions() == [] and "Available actions" not in env.render()
    obs, r, done, info = env.step("search[tea]")  # stepping a finished episode does not raise
    assert done and r == 0.0 and not info["action_is_valid"]
    env.reset(seed=5)
    assert not env.done and env.turns == 0 and env.page == "search"


# ---------------------------------------------------------------------------------------------- reward
def test_scripted_expert_scores_one_on_20_goals(make):
    env = make(split="train")
    for seed in range(20):
        obs, r, done, info = run_expert(env, seed)
        assert done and r == 1.0 and info["success"] and info["exact_product"], (seed, info)
        assert info["r_type"] == info["r_att"] == info["r_price"] == 1.0
        assert info.get("r_option", 1.0) == 1.0 and info["query_match"] and info["category_match"]
        assert abs(info["w_att"] + info.get("w_option", 0.0) + info["w_price"] - 1.0) < 1e-9
        assert "Thank you for shopping" in obs and env.get_available_actions() == []


def test_solve_plans_from_the_search_page(make):
    env = make(split="train")
    for seed in range(20):
        env.reset(seed=seed)
        g = env.goal
        plan = env.solve()
        assert plan[0] == f"search[{g['query']}]" and plan[-1] == "click[buy now]"
        assert f"click[{g['asin'].lower()}]" in plan
        assert set(plan[1:plan.index(f"click[{g['asin'].lower()}]")]) <= {"click[next >]"}
        assert len(plan) <= 9  # fits WebShop's 9-turn budget (config/env/webshop.yaml)
        assert env.turns == 0 and env.page == "search" and env.solve() == plan  # solve() does not step the env
    with pytest.raises(RuntimeError, match="reset"):
        make().solve()


def test_as_shown_writes_the_label_as_the_page_does_and_is_the_same_action(make):
    """as_shown maps each planned click to the page's own text (ASINs in capitals, "Buy Now"); stepping the shown
    form does exactly what the lower-case form does (labels match case-insensitively), so the expert still scores
    1.0; searches and unknown labels come back unchanged."""
    env = make(split="train", observation_mode="compact")
    for seed in range(5):
        env.reset(seed=seed)
        assert env.as_shown("search[red shoes]") == "search[red shoes]"
        while not env.done:
            action = env.solve()[0]
            shown = env.as_shown(action)
            assert shown.lower() == action
            if action.startswith("click["):
                label = shown[len("click["):-1]
                lines = env.render().splitlines()
                assert label in lines or any(l.startswith(label + " ") for l in lines)
            if action == f"click[{env.goal['asin'].lower()}]":
                assert shown == f"click[{env.goal['asin']}]" != action
            if action == "click[buy now]":
                assert shown == "click[Buy Now]"
            _, r, done, info = env.step(shown)
            assert info["action_is_valid"]
        assert r == 1.0
    env.reset(seed=0)
    assert env.as_shown("click[b0notthere1]") == "click[b0notthere1]"
    assert env.as_shown("nonsense") == "nonsense"


def test_episode_metrics_report_webshops_score_without_penalties(make):
    """Every step reports score (the purchase reward, 0 until a purchase; no format penalty) and purchased."""
    env = make(split="train", observation_mode="compact")
    env.reset(seed=1)
    _, r, _, info = env.step("click[nothing here]")
    assert r < 0 and info["episode_metrics"] == {"score": 0.0, "purchased": 0.0}
    while not env.done:
        _, r, _, info = env.step(env.solve()[0])
    assert info["episode_metrics"] == {"score": r, "purchased": 1.0} and r == 1.0


def test_solve_step_by_step_scores_one_on_20_goals(make):
    env = make(split="train")
    for seed in range(20):
        env.reset(seed=seed)
        steps = 0
        while not env.done:
            obs, r, done, info = env.step(env.solve()[0])
            steps += 1
        assert r == 1.0 and info["success"] and info["exact_product"] and steps <= 9, (seed, info)
        assert env.solve() == []


def test_solve_recovers_from_wrong_actions(make):
    env = make(split="train", max_turns=40)
    for seed in range(20):
        env.reset(seed=seed)
        g = env.goal
        target = f"click[{g['asin'].lower()}]"
        env.step(env.solve()[0])  # the search
        wrong = next(a for a in env.get_available_actions() if a not in NAV and a != target)
        env.step(wrong)  # a wrong product
        assert env.page == "item" and env.solve()[0] == "click[< prev]"
        env.step("click[description]")  # a sub page of the wrong product
        assert env.solve()[0] in ("click[< prev]", "click[back to search]")
        *_, info = play_expert(env)
        assert info["reward"] == 1.0 and info["exact_product"], (seed, info)

        # a search that misses the target, then paging away: back to search
        env.reset(seed=seed)
        env.step("search[zzzz qqqq]")
        assert env.solve()[0] == "click[back to search]"
        *_, info = play_expert(env)
        assert info["reward"] == 1.0

        # the target with a wrong option selected, seen from its reviews page
        env.reset(seed=seed)
        while env.page != "item":
            env.step(env.solve()[0])
        p = env.product
        opts = g["goal_options"]
        goal_values = set(opts.values() if isinstance(opts, dict) else opts)
        other = next((v for vs in p.options.values() for v in vs if v not in goal_values), None)
        if other is not None:
            env.step(f"click[{other}]")
        env.step("click[reviews]")
        assert env.solve()[0] == "click[< prev]"
        *_, info = play_expert(env)
        assert info["reward"] == 1.0 and info.get("r_option", 1.0) == 1.0

        # the target on a later results page, after paging past it
        env.reset(seed=seed)
        env.step(env.solve()[0])
        while "click[next >]" in env.get_available_actions() and target in env.get_available_actions():
            env.step("click[next >]")
        *_, info = play_expert(env)
        assert info["reward"] == 1.0


def test_solve_random_detours_and_other_modes(make):
    import random

    rng = random.Random(0)
    for kw in ({"split": "all"}, {"split": "all", "observation_mode": "text_rich", "show_attrs": True},
               {"split": "all", "observation_mode": "compact"}, {"split": "all", "human_goals": False}):
        env = make(max_turns=60, **kw)
        for trial in range(60):
            env.reset(seed=trial)
            for _ in range(rng.randint(0, 8)):
                acts = [a for a in env.get_available_actions() if a != "click[buy now]"]
                a = rng.choice(acts)
                if a.startswith("search["):
                    a = f"search[{rng.choice(['tea', 'shoes', 'black', env.goal['query']])}]"
                env.step(a)
            *_, info = play_expert(env)
            assert info["reward"] == 1.0 and info["exact_product"], (kw, trial, info)


def test_solve_falls_back_to_the_best_found_product(make):
    env = make(split="all")
    env.reset(seed=0)
    env.goal = dict(env.goal, asin="B000000000")  # a goal product that no search can show
    plan = env.solve()
    assert plan[0].startswith("search[") and plan[-1] == "click[buy now]"
    *_, info = play_expert(env)
    assert info["reward"] > 0.5 and not info["exact_product"]


def test_wrong_purchases_score_below_one_with_the_right_part_missing(make):
    env = make(split="all")
    cat = env.catalog
    # right product, options not chosen: only the option part is lost
    seed = next(i for i, g in enumerate(cat.goals) if g["goal_options"])
    env.reset(seed=seed)
    g = env.goal
    env.step(f"search[{g['name']}]")
    env.step(f"click[{g['asin'].lower()}]")
    _, r, done, info = env.step("click[buy now]")
    n_att, n_opt = len(g["attributes"]), len(g["goal_options"])
    assert done and not info["success"] and info["r_option"] == 0.0
    assert info["r_type"] == info["r_att"] == info["r_price"] == 1.0
    assert r == pytest.approx((n_att + 1) / (n_att + n_opt + 1))
    # a product of another category: the type part drops
    env.reset(seed=seed)
    other = next(i for i in range(len(cat)) if cat.product(i).category != cat.get(g["asin"]).category)
    env.step(f"search[{cat.product(other).name}]")
    _, _, _, info = env.step(f"click[{cat.product(other).asin.lower()}]")
    assert info["action_is_valid"]
    _, r, done, info = env.step("click[buy now]")
    assert r < 0.5 and not info["query_match"] and not info["category_match"] and info["r_type"] < 1.0
    # over the price bound: only the price part is lost
    p = cat.get(g["asin"])
    goal = dict(g, price_upper=p.price - 1)
    r, parts = R.get_reward(p.reward_view(), goal, p.price, {})
    assert parts["r_price"] == 0.0 and parts["r_att"] == 1.0 and r < 1.0
    # a wrong option value
    goal = {"name": p.name, "query": p.query, "product_category": p.product_category, "attributes": [],
            "goal_options": {"size": "xx-large"}, "price_upper": 1e6}
    r, parts = R.get_reward(p.reward_view(), goal, p.price, {"size": "small"})
    assert parts["r_option"] == 0.0 and r == pytest.approx(0.5)


def test_reward_helpers():
    assert R.token_set_ratio("essential oil", "essential oils") > 85
    assert R.token_set_ratio("cool powder snow", "powder snow") == 100
    assert R.token_set_ratio("tea bag", "earl grey") < 50 and R.token_set_ratio("", "x") == 0
    assert R.normalize_color("Navy Blue") == "navy blue" and R.normalize_color("dark gray") == "grey"
    assert R.normalize_color("xl") == "xl"
    t = R.get_type_reward({"name": "Acme Basketball Shoe", "query": "q1", "product_category": "a › b › c"},
                          {"name": "Acme Basketball Shoe", "query": "q1", "product_category": "c › b › a"})
    assert t == {"r_type": 1.0, "query_match": True, "category_match": True, "title_score": 1.0}
    t = R.get_type_reward({"name": "Steel Eyebrow Tweezers", "query": "x", "product_category": "d › e"},
                          {"name": "Kitchen Cabinet Knob", "query": "y", "product_category": "a › d"})
    assert t["r_type"] == 0.0 and t["title_score"] == 0.0 and not t["category_match"]
    purchased = {"name": "N", "Title": "", "Attributes": [], "BulletPoints": ["Has essential oils"],
                 "Description": "made with natural ingredients"}
    goal = {"attributes": ["tea tree", "essential oils", "natural ingredients"]}
    assert R.get_attribute_reward(purchased, goal) == (pytest.approx(2 / 3), 2)
    r_opt, n = R.get_option_reward({"Title": "", "BulletPoints": [], "Description": ""}, ["grey", "XL", "pack of 12"],
                                   {"color": "grey", "size": "XL", "count": "pack of 12", "extra": "grey"})
    assert (r_opt, n) == (1.0, 3)  # capped at the number of goal options
    assert R.get_option_reward({}, [], {"a": "b"}) == (None, 0)


# ---------------------------------------------------------------------------------------------- config
def test_config_validation_and_splits(make):
    cfg = WebShopEnvConfig.from_dict({"split": "eval", "max_steps": 7, "num_products": 100})
    assert cfg.split == "val" and cfg.max_turns == 7 and cfg.data_dir is None
    for bad in ({"split": "holdout"}, {"num_products": 0}, {"num_products": "1k"}, {"max_turns": 0},
                {"observation_mode": "html"}, {"format_penalty": "x"}, {"split_ranges": {"test": [5, 2]}},
                {"max_action_chars": -1}):
        with pytest.raises(ValueError):
            WebShopEnvConfig.from_dict(bad)
    with pytest.raises(ValueError, match="unknown"):
        WebShopEnvConfig.from_dict({"nope": 1})
    assert C.split_range(12087, "test") == range(0, 500)
    assert C.split_range(12087, "val") == range(500, 1500)
    assert C.split_range(12087, "train") == range(1500, 12087)
    assert C.split_range(310, "test") == range(0, 31) and C.split_range(310, "train") == range(62, 310)
    assert C.split_range(310, "test", {"test": [0, 10], "train": [10, None]}) == range(0, 10)
    env = make()
    parts = {s: set(env.goal_indices(s)) for s in ("train", "val", "test")}
    assert not (parts["train"] & parts["val"]) and not (parts["train"] & parts["test"])
    assert len(parts["train"] | parts["val"] | parts["test"]) == len(env.catalog.goals)
    env.reset(seed=7, mode="test")
    assert env.goal_index in parts["test"]
    a = env.reset(seed=11)
    b = make().reset(seed=11)
    assert a == b and env.goal_index in parts["train"]
    assert len({make().reset(seed=s) for s in range(10)}) > 5
    with pytest.raises(ValueError, match="no goals"):
        make(split="test", split_ranges={"test": [0, 0], "train": [0, None]})
    assert "search[" in WebShopEnv.instruction and "click[" in WebShopEnv.instruction


# ---------------------------------------------------------------------------------------------- gymnasium
def test_gymnasium_check_env(cache_dir):
    from gymnasium.utils.env_checker import check_env
    from ragen_turn.envs.webshop import WebShopGymEnv

    env = WebShopGymEnv({"cache_dir": cache_dir}, render_mode="ansi")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_env(env)
    obs, info = env.reset(seed=3)
    assert env.observation_space.contains(obs) and "goal_index" in info
    obs, r, term, trunc, info = env.step("search[" + env.env.goal["query"] + "]")
    assert env.observation_space.contains(obs) and not term and not trunc and r == 0.0
    obs, r, term, trunc, info = env.step("click[" + env.env.goal["asin"].lower() + "]")
    obs, r, term, trunc, info = env.step("click[buy now]")
    assert term and not trunc and 0.0 <= r <= 1.0
    short = WebShopGymEnv({"cache_dir": cache_dir, "max_turns": 1})
    short.reset(seed=0)
    _, _, term, trunc, _ = short.step("search[tea]")
    assert trunc and not term


def test_env_config_argument_is_coerced_or_refused_by_name():
    """envs.base.coerce_config (WebShop's and search QA's __init__): keywords, a dict merged with keywords, or the
    config class; anything else, or a config class plus keywords, is a TypeError naming the class."""
    from envs.base import coerce_config
    from envs.webshop.config import WebShopEnvConfig

    assert coerce_config(WebShopEnvConfig, None, {"num_products": 7}).num_products == 7
    assert coerce_config(WebShopEnvConfig, {"num_products": 5}, {"num_products": 9}).num_products == 9
    cfg = WebShopEnvConfig(num_products=3)
    assert coerce_config(WebShopEnvConfig, cfg, {}) is cfg
    with pytest.raises(TypeError, match="WebShopEnvConfig or keyword arguments, not both"):
        coerce_config(WebShopEnvConfig, cfg, {"num_products": 4})
    with pytest.raises(TypeError, match="config must be a WebShopEnvConfig or a dict, got int"):
        coerce_config(WebShopEnvConfig, 5, {})


# ---------------------------------------------------------------- WebShop's own reward rules (env_config.spacy_model)
class _Tok:
    def __init__(self, text, pos):
        self.text, self.pos_ = text, pos


def fake_nlp(nouns):
    """A stand-in spaCy pipeline: tokens split on spaces, tagged NOUN when listed (PROPN for capitalised ones)."""
    def nlp(text):
        return [_Tok(w, ("PROPN" if w[:1].isupper() else "NOUN") if w.lower() in nouns else "ADJ")
                for w in text.split()]
    return nlp


def test_webshop_type_reward_follows_webshops_rule_with_a_tagger():
    nlp = fake_nlp({"shoe", "shoes", "lace", "boot"})
    goal = {"name": "Shoe lace shoe", "query": "Shoes", "product_category": "A › B › C"}
    # WebShop divides by the goal's nouns with repeats: {shoe, lace} & {shoe} = 1 of 3
    bought = {"name": "running shoe", "query": "boots", "product_category": "a › b › x"}
    parts = R.webshop_type_reward(bought, goal, nlp)
    assert parts["title_score"] == pytest.approx(1 / 3) and parts["r_type"] == 1.0  # title 1/3 > 0.2
    assert parts["query_match"] is False and parts["category_match"] is False  # case kept: 'a' != 'A'
    built_in = R.get_type_reward(bought, goal)
    assert built_in["category_match"] is True  # the built-in rule lower-cases the categories
    assert R.get_type_reward(bought, goal, nlp) == parts
    assert R.webshop_type_reward({"name": "red boot", "query": "x", "product_category": ""}, goal, nlp)["r_type"] == 0.0
    assert R.spacy_nouns(nlp, "Shoe with lace") == ["shoe", "lace"]


def test_webshop_option_rule_and_colours():
    assert R.webshop_color("dark navy blue") == "blue"  # WebShop's first listed colour contained, not the longest
    assert R.webshop_color("Navy") == "Navy"             # as is: WebShop does not lower-case here
    # WebShop's fuzzy rule counts a near size as a match; the built-in rule matches sizes exactly
    goal_opts = ["3 ounce (pack of 4)", "orange"]
    chosen = {"size": "3 ounce (pack of 12)", "flavor name": "orange"}
    assert R.webshop_option_reward(chosen, goal_opts) == (1.0, 2)
    product = {"Title": "t", "BulletPoints": [], "Description": ""}
    assert R.get_option_reward(product, goal_opts, chosen) == (0.5, 1)
    assert R.webshop_option_reward({}, []) == (None, 0)


def test_spacy_model_reaches_the_purchase(make, monkeypatch, tmp_path):
    import ragen_turn.envs.webshop.env as E

    seen = []

    def load(path):
        seen.append(path)
        return fake_nlp(set())  # no nouns: WebShop's title score is 0.2, the type reward rests on query/category

    monkeypatch.setattr(E, "load_spacy", load)
    env = make(spacy_model=str(tmp_path / "en_core_web_sm"))
    assert seen == [str(tmp_path / "en_core_web_sm")]
    obs, r, done, info = run_expert(env, seed=3)
    assert done and info["title_score"] == 0.2 and info["r_type"] == 1.0 and r == pytest.approx(info["reward"])


def test_spacy_model_errors_name_the_key(tmp_path):
    R.load_spacy.cache_clear()
    with pytest.raises(ValueError, match="spacy_model"):
        R.load_spacy(str(tmp_path / "no_such_model"))  # spaCy missing, or the model: either way the key is named
    with pytest.raises(ValueError, match="spacy_model"):
        WebShopEnvConfig(spacy_model="")
