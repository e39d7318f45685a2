"""Search-QA env: scoring, protocol parsing, shipped data, retrieval + cache, expert, real-data loaders, fuzzing."""
from __future__ import annotations

import gzip
import importlib.util
import json
import os
import random

import pytest

pytest.importorskip("bm25s")

from hypothesis import given, settings, strategies as st  # noqa: E402

from ragen_turn.envs import REGISTERED_ENVS, make_env  # noqa: E402
from ragen_turn.envs.search_qa import (  # noqa: E402
    SHIPPED_DATA_DIR, Corpus, SearchQADataError, SearchQAEnv, SearchQAEnvConfig, choice_letter, clear_data_cache,
    clear_retriever_cache, exact_match, f1_score, get_retriever, load_questions, normalize_answer, parse_action,
    register_retriever,
)
from ragen_turn.envs.search_qa.retrieval import RETRIEVERS, top_k_rows  # noqa: E402
from ragen_turn.envs.search_qa.scoring import answer_in_text  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPLITS = ("train", "val", "test")


@pytest.fixture
def cache_dir(tmp_path):
    clear_retriever_cache()
    clear_data_cache()
    yield str(tmp_path / "cache")
    clear_retriever_cache()
    clear_data_cache()


@pytest.fixture(scope="module")
def env_val(tmp_path_factory):
    return SearchQAEnv(split="val", cache_dir=str(tmp_path_factory.mktemp("sqa")))


def _read_gz(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


# ------------------------------------------------------------------------------------------------ scoring
@pytest.mark.parametrize("text,norm", [
    ("The Eiffel Tower!", "eiffel tower"), ("  a  Tale of an   Apple. ", "tale of apple"), ("U.S.A.", "usa"),
    ("Theory", "theory"), ("A", ""), ("1,874", "1874"), ("Rock-'n'-Roll", "rocknroll"), ("", ""),
])
def test_normalize_answer_hand_cases(text, norm):
    assert normalize_answer(text) == norm


def test_exact_match_and_f1_hand_cases():
    assert exact_match("the Marwick", ["Marwick"]) == 1.0 and exact_match("Marwick city", ["Marwick"]) == 0.0
    assert exact_match("412 KM.", ["412 km", "412"]) == 1.0 and exact_match("x", "x") == 1.0
    assert exact_match("", ["Marwick"]) == 0.0
    # F1: "marwick old town" vs "marwick town": common 2, p = 2/3, r = 1 -> 0.8
    assert f1_score("Marwick old town", ["Marwick town"]) == pytest.approx(0.8)
    assert f1_score("Marwick", ["nothing", "the Marwick"]) == 1.0
    assert f1_score("", ["Marwick"]) == 0.0 and f1_score("the", ["a"]) == 0.0
    assert f1_score("x b b", ["b b c"]) == pytest.approx(2 / 3)  # counts, not sets (a set overlap gives 0.5)
    assert f1_score("a b b", ["b b c"]) == pytest.approx(0.8)  # "a" is an article: p = 1, r = 2/3
    assert answer_in_text(["Zorbin Kell"], "born to zorbin kell, in 1800") and not answer_in_text(["Kel"], "Kell")


@pytest.mark.parametrize("text,letter", [
    ("C", "C"), ("(b) aspirin", "B"), ("d.", "D"), ("Option E", "E"), ("The answer is A", "A"), ("answer: c", "C"),
    ("aspirin", None), ("F", None), ("", None), ("A) insulin", "A"),
])
def test_choice_letter(text, letter):
    assert choice_letter(text) == letter


# ------------------------------------------------------------------------------------------------ protocol
@pytest.mark.parametrize("text,expected", [
    ("<search> Veldoria </search>", ("search", "Veldoria")),
    ("<think>hmm</think>\n<search>a b</search> trailing", ("search", "a b")),
    ("<answer> Marwick </answer>", ("answer", "Marwick")),
    ("<search>x</search><answer>y</answer>", ("search", "x")),
    ("<answer>y</answer><search>x</search>", ("answer", "y")),
    ("<answer>x</search></answer>", (None, "no <search>")),  # cut at the first </search>, as Search-R1 does
    ("<search>unclosed", (None, "no <search>")),
    ("<search></search>", ("search", "")),
    ("plain text", (None, "no <search>")),
    (None, (None, "must be text")),
])
def test_parse_action(text, expected):
    kind, content = parse_action(text)
    assert kind == expected[0]
    assert (content == expected[1]) if kind else (expected[1] in content)


def test_search_observation_answer_and_metrics(env_val):
    env = env_val
    obs = env.reset(seed=1)
    item = env.item
    assert obs == f"Question: {item.question}" and item.question.endswith("?")
    obs, r, done, info = env.step(f"<search> {item.queries[0]} </search>")
    assert r == 0.0 and not done and info["action_is_valid"] and info["action_is_effective"]
    assert obs.startswith("<information>Doc 1(Title: ") and obs.endswith("</information>")
    docs = obs[len("<information>"):-len("</information>")].split("\n")
    assert 1 <= len(docs) <= 3 and all(d.startswith(f"Doc {i}(Title: ") for i, d in enumerate(docs, 1))
    assert docs[0].startswith(f"Doc 1(Title: {item.queries[0]}) ")  # the subject's own passage ranks first
    assert info["retrieved"][0] == env.corpus.index_of(item.support[0]) and env.render() == obs
    obs, r, done, info = env.step(f"<think>so</think><answer>the {item.golden_answers[0].upper()}.</answer>")
    assert done and r == 1.0 and info["success"] and info["em"] == 1.0 and info["f1"] == 1.0
    assert info["episode_metrics"] == {"em": 1.0, "f1": 1.0, "searches": 1.0, "retrieval_hit": info["retrieval_hit"]}
    obs2, r, done, info = env.step("<answer>again</answer>")  # a finished episode does not raise or score again
    assert done and r == 0.0 and not info["action_is_valid"] and obs2 == obs


def test_wrong_answer_f1_and_partial_credit(env_val):
    env = env_val
    env.reset(seed=3)
    gold = env.item.golden_answers[0]
    _, r, done, info = env.step(f"<answer>{gold} extra words</answer>")
    assert done and r == 0.0 and not info["success"] and info["em"] == 0.0
    assert info["f1"] == pytest.approx(f1_score(f"{gold} extra words", [gold])) and 0 < info["f1"] < 1


def test_invalid_turns_penalty_search_cap_and_turn_cap(cache_dir):
    env = SearchQAEnv(split="val", cache_dir=cache_dir, max_searches=1, max_turns=4, format_penalty=-0.25, topk=2)
    env.reset(seed=0)
    obs, r, done, info = env.step("I think the answer is Paris")
    assert r == -0.25 and not done and not info["action_is_valid"] and info["action"] == "invalid"
    assert obs.startswith("Invalid response: ") and "<search> query </search>" in obs and "feedback" in info
    _, r, _, info = env.step("<search>   </search>")
    assert r == -0.25 and "empty" in info["feedback"]
    obs, r, _, info = env.step(f"<search>{env.item.queries[0]}</search>")
    assert r == 0.0 and info["action_is_valid"] and obs.count("Doc ") <= 2
    obs, r, done, info = env.step(f"<search>{env.item.queries[0]}</search>")  # over the cap: refused, turn 4 of 4
    assert r == -0.25 and "no searches left" in obs and done and info["truncated"] and not info["success"]
    assert info["searches"] == 1.0 and info["episode_metrics"]["em"] == 0.0
    env.reset(seed=0)
    assert env.turns == 0 and env.searches == 0 and not env.done


def test_no_match_and_long_query(env_val):
    env = env_val
    env.reset(seed=2)
    obs, r, done, info = env.step("<search>the of and</search>")  # stop words only: nothing to score
    assert obs == "<information>No passage matches the query.</information>" and info["action_is_valid"]
    assert not info["action_is_effective"]
    obs, r, done, info = env.step("<search>" + "zz " * 10_000 + "</search>")
    assert info["action_is_valid"] and not done


def test_seeds_pick_questions_deterministically(env_val, cache_dir):
    other = SearchQAEnv(split="val", cache_dir=cache_dir)
    for s in (0, 5, 10**9 + 7):
        assert env_val.reset(seed=s) == other.reset(seed=s)
    n = len(env_val.questions())
    assert env_val.reset(seed=n + 4) == env_val.reset(seed=4)
    assert env_val.reset(seed=0, mode="test") != env_val.reset(seed=0)


# ------------------------------------------------------------------------------------------------ fuzzing
_PIECES = ["<search>", "</search>", "<answer>", "</answer>", "<think>", "</think>", "<information>", "</",
           "<", ">", " ", "\n", "Veldoria", "the", "1874", "<|im_end|>", "\x00", "é", "?", "[", "]", "{}", "\\"]


def _check_step(env, text):
    obs, r, done, info = env.step(text)
    assert isinstance(obs, str) and isinstance(r, float) and isinstance(done, bool)
    assert r in (0.0, 1.0, env.config.format_penalty)
    assert {"success", "action_is_valid", "action_is_effective", "em", "f1"} <= set(info)
    return done


def test_fuzz_tag_soup_never_raises(env_val):
    rng = random.Random(0)
    env = env_val
    for episode in range(300):
        env.reset(seed=episode)
        for _ in range(env.config.max_turns + 2):
            text = "".join(rng.choice(_PIECES) for _ in range(rng.randint(0, 12)))
            if _check_step(env, text):
                break


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(max_size=300), st.binary(max_size=50), st.integers(), st.none(),
                 st.lists(st.text(max_size=5), max_size=3)))
def test_fuzz_any_input_never_raises(env_val, action):
    env_val.reset(seed=7)
    _check_step(env_val, action)


# ------------------------------------------------------------------------------------------------ shipped data
def test_shipped_files_small_and_in_search_r1_format():
    names = sorted(os.listdir(SHIPPED_DATA_DIR))
    assert names == ["corpus.jsonl.gz", "test.jsonl.gz", "train.jsonl.gz", "val.jsonl.gz"]
    assert sum(os.path.getsize(os.path.join(SHIPPED_DATA_DIR, n)) for n in names) < 2_000_000
    corpus = _read_gz(os.path.join(SHIPPED_DATA_DIR, "corpus.jsonl.gz"))
    assert 2000 <= len(corpus) <= 5000 and all(set(r) == {"id", "contents", "split"} for r in corpus)
    assert all(len(r["contents"].split("\n")) == 2 for r in corpus)
    for split in SPLITS:
        qs = load_questions(os.path.join(SHIPPED_DATA_DIR, f"{split}.jsonl.gz"))
        assert len(qs) >= 500 and all(q.question.endswith("?") and q.golden_answers for q in qs)
        hops = {q.hops for q in qs}
        assert hops == {1, 2} and sum(q.hops == 2 for q in qs) > 0.3 * len(qs)
        assert all(len(q.queries) == len(q.support) == q.hops for q in qs)


def test_splits_share_no_entity():
    corpus = {r["id"]: r for r in _read_gz(os.path.join(SHIPPED_DATA_DIR, "corpus.jsonl.gz"))}
    title = {pid: r["contents"].split("\n")[0] for pid, r in corpus.items()}
    entities = {}
    for split in SPLITS:
        ents = set()
        for q in load_questions(os.path.join(SHIPPED_DATA_DIR, f"{split}.jsonl.gz")):
            assert all(corpus[pid]["split"] == split for pid in q.support)
            ents |= {title[pid] for pid in q.support} | set(q.queries)
            ents |= {a for a in q.golden_answers if a in title.values()}  # answers that are entities
        entities[split] = ents
    assert not entities["train"] & entities["val"] and not entities["train"] & entities["test"]
    assert not entities["val"] & entities["test"]
    assert len(set(title.values())) == len(title)  # names are unique across the knowledge base


def test_generator_script_reproduces_shipped_data(tmp_path):
    spec = importlib.util.spec_from_file_location("mk", os.path.join(REPO, "scripts", "make_search_qa_data.py"))
    mk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mk)
    corpus, questions = mk.generate(mk.DEFAULT_COUNTRIES, mk.DEFAULT_SEED)
    assert _read_gz(os.path.join(SHIPPED_DATA_DIR, "corpus.jsonl.gz")) == corpus
    for split in SPLITS:
        assert _read_gz(os.path.join(SHIPPED_DATA_DIR, f"{split}.jsonl.gz")) == questions[split]
    # byte-identical files (gzip header without a time stamp)
    mk._write_jsonl_gz(str(tmp_path / "val.jsonl.gz"), iter(questions["val"]))
    assert (tmp_path / "val.jsonl.gz").read_bytes() == open(os.path.join(SHIPPED_DATA_DIR, "val.jsonl.gz"), "rb").read()
    other, _ = mk.generate(10, 1)
    assert [r["contents"] for r in other] != [r["contents"] for r in corpus[: len(other)]]


def test_generator_scales_past_the_two_syllable_names():
    """About 24k two-syllable names exist and every world takes 11 of them: 2500 worlds (50k passages) used to spin
    forever looking for a new one (the 1M-passage benchmark never finished). Names widen by a syllable instead,
    stay unique, and the first 150 worlds still have the shipped text."""
    from ragen_turn.envs.search_qa.kb import Names, generate

    corpus, _ = generate(countries=2500, seed=0, with_questions=False)
    titles = [r["contents"].split("\n", 1)[0].lower() for r in corpus]
    assert len(corpus) == 2500 * 20 and len(set(titles)) == len(titles)
    names = Names(random.Random(0))
    drawn = [names.word(2, 2) for _ in range(30000)]  # more than the two-syllable names there are
    assert len(set(drawn)) == 30000 and max(map(len, drawn)) > 5 >= max(map(len, drawn[:1000]))
    shipped = _read_gz(os.path.join(SHIPPED_DATA_DIR, "corpus.jsonl.gz"))  # same text (splits depend on the count)
    assert [r["contents"] for r in corpus[:3000]] == [r["contents"] for r in shipped]


@pytest.mark.parametrize("split", ["val", "test"])
def test_expert_scores_exact_match_on_every_held_out_question(env_val, split):
    env = env_val
    n = len(env.questions(split))
    for s in range(n):
        env.reset(seed=s, mode=split)
        steps = 0
        while True:
            plan = env.solve()
            _, r, done, info = env.step(plan[0])
            steps += 1
            rest = env.solve()  # the rest of the plan, or less when a search already showed a later hop's passage
            assert done or (rest and rest == plan[len(plan) - len(rest):])
            if done:
                break
        assert r == 1.0 and info["em"] == 1.0, env.item.question
        assert steps <= env.item.hops + 1 and info["searches"] <= env.item.hops


def test_expert_recovers_after_wrong_searches(env_val):
    env = env_val
    env.reset(seed=11)
    hops = env.item.hops
    env.step("<search> the weather </search>")
    env.step("nonsense")
    plan = env.solve()
    assert plan[-1] == f"<answer> {env.item.golden_answers[0]} </answer>"
    assert len(plan) <= env.config.max_searches - 1 + 1 and len(plan) >= 2
    for action in plan:
        _, r, done, info = env.step(action)
    assert done and (r == 1.0) == (env.config.max_searches - 1 >= hops)


# ------------------------------------------------------------------------------------------------ retrieval
def test_top_k_rows_ties_and_zeros():
    import numpy as np

    s = np.array([0.0, 2.0, 1.0, 2.0, 0.5, 2.0], dtype=np.float32)
    assert top_k_rows(s, 2) == [1, 3] and top_k_rows(s, 4) == [1, 3, 5, 2] and top_k_rows(s, 10) == [1, 3, 5, 2, 4]
    assert top_k_rows(np.zeros(4), 3) == [] and top_k_rows(s, 0) == []


def test_bm25_index_built_once_and_cached_on_disk(cache_dir):
    path = os.path.join(SHIPPED_DATA_DIR, "corpus.jsonl.gz")
    corpus = Corpus(path)
    r1 = get_retriever("bm25", corpus, cache_dir=cache_dir, k1=0.9, b=0.4)
    assert not r1.loaded_from_cache and os.path.isdir(r1.cache_path)
    assert get_retriever("bm25", corpus, cache_dir=cache_dir, k1=0.9, b=0.4) is r1  # once per process
    clear_retriever_cache()
    r2 = get_retriever("bm25", Corpus(path), cache_dir=cache_dir, k1=0.9, b=0.4)
    assert r2.loaded_from_cache
    for q in ("Vreidudrous", "painter born 1874", "The Quiet Letter"):
        assert r1.search(q, 5) == r2.search(q, 5)
    r3 = get_retriever("bm25", corpus, cache_dir=cache_dir, k1=1.2, b=0.75)  # other parameters: another index
    assert r3.cache_path != r1.cache_path


def test_a_registered_retriever_plugs_in(cache_dir):
    class FirstRows:
        def __init__(self, corpus, cache_dir=None):
            self.corpus = corpus

        def search(self, query, k):
            return list(range(k))

    register_retriever("first_rows", FirstRows)
    try:
        env = SearchQAEnv(split="val", retriever="first_rows", cache_dir=cache_dir)
        env.reset(seed=0)
        obs, *_ = env.step("<search>anything</search>")
        assert obs.count("Doc ") == 3 and f"(Title: {env.corpus.passage(0).title})" in obs
        with pytest.raises(ValueError, match="unknown retriever"):
            SearchQAEnv(split="val", retriever="nope", cache_dir=cache_dir)
    finally:
        RETRIEVERS.pop("first_rows")


# ------------------------------------------------------------------------------------------------ real data
def _write_jsonl(path, records, gz=False):
    opener = gzip.open if gz else open
    with opener(path, "wt", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return str(path)


WIKI = [
    {"id": "0", "contents": '"Evan Morris"\nEvan Morris was a lobbyist born in 1977 in Washington.'},
    {"id": "1", "contents": '"Marwick Press"\nMarwick Press is a publisher founded by Evan Morris.'},
    {"id": "2", "contents": '"Paris"\nParis is the capital of France.'},
]


def test_corpus_loader_search_r1_format_gz_and_lazy(tmp_path):
    plain = _write_jsonl(tmp_path / "wiki.jsonl", WIKI)
    gz = _write_jsonl(tmp_path / "wiki.jsonl.gz", WIKI, gz=True)
    a, b, c = Corpus(plain, lazy=False), Corpus(gz), Corpus(plain, lazy=True)
    assert c.lazy and not a.lazy and len(a) == len(b) == len(c) == 3
    assert a.passage(0).title == "Evan Morris" and a.passage(0).text.startswith("Evan Morris was a lobbyist")
    assert [c.passage(i) for i in (2, 0, 1)] == [a.passage(i) for i in (2, 0, 1)]
    assert list(c.iter_passages()) == list(a.iter_passages()) == list(b.iter_passages())
    assert len(Corpus(plain, max_passages=2)) == 2 and a.index_of("2") == 2
    with pytest.raises(SearchQADataError, match="gunzip"):
        Corpus(gz, lazy=True)


def test_corpus_loader_errors_name_the_file_and_the_key(tmp_path):
    with pytest.raises(SearchQADataError, match=r"corpus file not found at .*nope\.jsonl.*corpus_path"):
        Corpus(str(tmp_path / "nope.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1, "contents": "a\\nb"}\nnot json\n')
    with pytest.raises(SearchQADataError, match=r"bad\.jsonl:2 is not JSON"):
        Corpus(str(bad))
    bad.write_text('{"id": 1, "body": "x"}\n')
    with pytest.raises(SearchQADataError, match="needs 'contents'"):
        Corpus(str(bad))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(SearchQADataError, match="holds no passages"):
        Corpus(str(empty))


def test_qa_jsonl_loader_and_an_env_on_real_files(tmp_path, cache_dir):
    corpus = _write_jsonl(tmp_path / "wiki.jsonl", WIKI)
    qa = _write_jsonl(tmp_path / "test.jsonl", [
        {"id": "q1", "question": "who founded marwick press?", "golden_answers": ["Evan Morris", "Evan L. Morris"]},
        {"question": "what is the capital of france?", "golden_answers": "Paris", "extra": 1},
    ])
    items = load_questions(qa, split="test")
    assert [i.qid for i in items] == ["q1", "test-1"] and items[1].golden_answers == ["Paris"]
    assert not items[0].is_choice and items[0].queries == []
    assert len(load_questions(qa, max_items=1)) == 1
    env = make_env("search_qa", {"corpus_path": corpus, "qa_path": qa, "split": "test", "cache_dir": cache_dir})
    env.reset(seed=0)
    assert env.solve() == ["<search> who founded marwick press? </search>", "<answer> Evan Morris </answer>"]
    obs, *_ = env.step(env.solve()[0])
    assert obs.startswith("<information>Doc 1(Title: Marwick Press) Marwick Press is a publisher")
    _, r, done, info = env.step("<answer>evan l morris</answer>")
    assert done and r == 1.0 and info["retrieval_hit"] == 1.0


def test_qa_parquet_loader_plain_and_search_r1_processed(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    plain = tmp_path / "train.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "question": ["q one?", "q two?"],
                             "golden_answers": [["x", "y"], ["z"]]}), plain)
    items = load_questions(str(plain))
    assert [(i.qid, i.question, i.golden_answers) for i in items] == [("a", "q one?", ["x", "y"]),
                                                                       ("b", "q two?", ["z"])]
    processed = tmp_path / "nq_search.parquet"  # Search-R1's scripts/data_process output: target under reward_model
    pq.write_table(pa.table({"question": ["who?"], "prompt": [[{"role": "user", "content": "Answer ... who?"}]],
                             "reward_model": [{"style": "rule", "ground_truth": {"target": ["Evan Morris"]}}]}),
                   processed)
    assert load_questions(str(processed))[0].golden_answers == ["Evan Morris"]


def test_parquet_without_pyarrow_says_how_to_install(tmp_path, monkeypatch):
    import builtins

    f = tmp_path / "x.parquet"
    f.write_bytes(b"PAR1")
    real_import = builtins.__import__

    def no_pyarrow(name, *a, **kw):
        if name.startswith("pyarrow"):
            raise ImportError("no pyarrow")
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    with pytest.raises(SearchQADataError, match=r"pip install -e '\.\[parquet\]'"):
        load_questions(str(f))


def test_mcqa_loader_formats_and_letter_scoring(tmp_path, cache_dir):
    corpus = _write_jsonl(tmp_path / "med.jsonl", [
        {"id": "m0", "contents": "Aspirin\nAspirin inhibits cyclooxygenase."},
        {"id": "m1", "contents": "Insulin\nInsulin lowers blood glucose."},
    ])
    qa = _write_jsonl(tmp_path / "medqa.jsonl", [
        # MedQA: options dict, answer = the option's text, answer_idx = the letter
        {"question": "Which drug inhibits cyclooxygenase?", "options": {"A": "Insulin", "B": "Aspirin", "C": "Heparin"},
         "answer": "Aspirin", "answer_idx": "B"},
        {"question": "Which hormone lowers glucose?", "options": ["Glucagon", "Insulin", "Cortisol", "Adrenaline"],
         "answer": "b"},
        {"question": "Pick C.", "A": "one", "B": "two", "C": "three", "D": "four", "E": "five", "answer": "three"},
    ])
    items = load_questions(qa, qa_format="mcqa")
    assert [i.golden_answers for i in items] == [["B"], ["B"], ["C"]] and all(i.is_choice for i in items)
    assert items[1].choices == {"A": "Glucagon", "B": "Insulin", "C": "Cortisol", "D": "Adrenaline"}
    assert list(items[2].choices) == ["A", "B", "C", "D", "E"]
    assert [i.is_choice for i in load_questions(qa)] == [True, True, True]  # auto: options and no golden answers
    env = SearchQAEnv(corpus_path=corpus, qa_path=qa, qa_format="mcqa", split="test", cache_dir=cache_dir)
    obs = env.reset(seed=0)
    assert obs == ("Question: Which drug inhibits cyclooxygenase?\nOptions:\nA. Insulin\nB. Aspirin\nC. Heparin")
    assert env.solve()[-1] == "<answer> B </answer>"
    _, r, done, info = env.step("<answer>(B) Aspirin</answer>")
    assert r == 1.0 and info["em"] == info["f1"] == 1.0
    env.reset(seed=0)
    _, r, _, info = env.step("<answer>Aspirin</answer>")  # the option's text is not its letter
    assert r == 0.0 and info["em"] == 0.0


def test_question_loader_errors(tmp_path):
    with pytest.raises(SearchQADataError, match=r"question file not found at .*qa_path"):
        load_questions(str(tmp_path / "missing.parquet"))
    bad = _write_jsonl(tmp_path / "a.jsonl", [{"query": "x?", "golden_answers": ["y"]}])
    with pytest.raises(SearchQADataError, match="no 'question'"):
        load_questions(bad)
    bad = _write_jsonl(tmp_path / "b.jsonl", [{"question": "x?"}])
    with pytest.raises(SearchQADataError, match="no 'golden_answers'"):
        load_questions(bad)
    bad = _write_jsonl(tmp_path / "c.jsonl", [{"question": "x?", "options": {"A": "1", "B": "2"}, "answer": "Z"}])
    with pytest.raises(SearchQADataError, match="option letters"):
        load_questions(bad, qa_format="mcqa")
    bad = _write_jsonl(tmp_path / "d.jsonl", [{"question": "x?", "golden_answers": ["y"]}])
    with pytest.raises(SearchQADataError, match="needs 'options'"):
        load_questions(bad, qa_format="mcqa")
    (tmp_path / "e.csv").write_text("question,answer\n")
    with pytest.raises(SearchQADataError, match="must be .parquet, .jsonl"):
        load_questions(str(tmp_path / "e.csv"))


def test_config_checks_name_the_key():
    for bad, key in (({"topk": 0}, "topk"), ({"split": "dev2"}, "split"), ({"qa_format": "csv"}, "qa_format"),
                     ({"max_searches": -1}, "max_searches"), ({"format_penalty": "x"}, "format_penalty"),
                     ({"corpus_path": ""}, "corpus_path"), ({"bm25_b": 2.0}, "bm25_b"), ({"nope": 1}, "nope")):
        with pytest.raises(ValueError, match=key):
            SearchQAEnvConfig.from_dict(bad)
    for name, what in (("corpus_path", "corpus file"), ("qa_path", "question file")):  # said before any data loads
        with pytest.raises(SearchQADataError, match=f"{what} not found at '/nonexistent/x.jsonl'.*{name}="):
            SearchQAEnvConfig.from_dict({name: "/nonexistent/x.jsonl"})
    cfg = SearchQAEnvConfig(max_searches=2)
    assert cfg.max_turns == 3 and SearchQAEnvConfig(split="dev").split == "val"
    assert REGISTERED_ENVS["search_qa"] is SearchQAEnv


# ------------------------------------------------------------------------------------------------ rollout, warm start
@pytest.fixture(scope="module")
def search_tokenizer():
    from ragen_turn.models.tiny_tokenizer import build_tokenizer

    return build_tokenizer(corpus="search_qa")


def test_search_qa_tokenizer_tags_and_names(search_tokenizer):
    from ragen_turn.models.tiny_tokenizer import SEARCH_TAG_TOKENS, TAG_TOKENS, build_tokenizer

    tok, default = search_tokenizer, build_tokenizer()
    assert len(tok) == 2048
    for t in TAG_TOKENS + SEARCH_TAG_TOKENS:
        assert len(tok(t, add_special_tokens=False).input_ids) == 1, t
    corpus = _read_gz(os.path.join(SHIPPED_DATA_DIR, "corpus.jsonl.gz"))
    per_word, names = {}, {}
    for split in ("train", "val"):
        texts = [r["contents"].replace("\n", " ") for r in corpus if r["split"] == split][:200]
        ids = [tok(t, add_special_tokens=False).input_ids for t in texts]
        assert all(tok.decode(i) == t for i, t in zip(ids, texts))
        per_word[split] = sum(map(len, ids)) / sum(len(t.split()) for t in texts)
        titles = [" " + r["contents"].split("\n")[0] for r in corpus if r["split"] == split][:200]
        names[split] = sum(len(tok(t, add_special_tokens=False).input_ids) for t in titles) / len(titles)
        n_default = sum(len(default(t, add_special_tokens=False).input_ids) for t in texts)
        assert n_default > 1.4 * sum(map(len, ids))  # the Sokoban / WebShop tokenizer spells names out
    # no shipped name is in the tokenizer's text: held-out names split like train names
    assert abs(per_word["val"] / per_word["train"] - 1) < 0.1 and abs(names["val"] / names["train"] - 1) < 0.1
    assert build_tokenizer(corpus="search_qa").backend_tokenizer.to_str() == tok.backend_tokenizer.to_str()


def _search_cfg(extra=()):
    from helpers import micro_config

    return micro_config(["env=search_qa", "actor_rollout_ref.rollout.response_length=24", "agent_proxy.max_turn=4",
                         "es_manager.train.env_groups=16", "es_manager.train.group_size=1", *extra])


def test_expert_rollout_through_the_chat_format(search_tokenizer):
    from ragen_turn.engines.local.trainer import context_config, episode_metrics
    from ragen_turn.rollout import ChatFormatter, EnvGroupManager, TextPolicy, Trajectory, run_episodes

    cfg = _search_cfg()
    tok = search_tokenizer
    envs = EnvGroupManager(cfg.custom_envs, cfg.es_manager.train, "train")
    assert envs.slots[0].instruction.startswith("Answer the question with the help of a search engine")
    eps = run_episodes(envs.assign_seeds(0, 0), TextPolicy(tok, lambda slot: slot.env.solve()[0]),
                       ChatFormatter(tok), context_config(cfg))
    assert all(e.success and e.format_errors == 0 for e in eps)
    assert all(e.turn_rewards[-1] == 1.0 and sum(e.turn_rewards) == 1.0 for e in eps)
    assert all(e.metrics["em"] == 1.0 and e.num_turns == e.metrics["searches"] + 1 for e in eps)
    batch = Trajectory.from_episodes(eps, tok.pad_token_id)
    m = episode_metrics(batch, "val")
    assert m["val/success"] == m["val/em"] == m["val/f1"] == 1.0 and 1 <= m["val/searches"] <= 2
    text = tok.decode(batch.input_ids[0][batch.attention_mask[0].bool()].tolist())
    assert "<information>Doc 1(Title: " in text and "Give up to" not in text  # no <answer>-list format line
    resp = tok.decode(batch.input_ids[0][batch.response_mask[0].bool()].tolist())
    assert "<information>" not in resp and resp.count("<search>") == eps[0].metrics["searches"]


def test_malformed_responses_count_as_format_errors(search_tokenizer):
    from ragen_turn.engines.local.trainer import context_config, episode_metrics
    from ragen_turn.rollout import ChatFormatter, EnvGroupManager, TextPolicy, Trajectory, run_episodes

    cfg = _search_cfg(["es_manager.format_penalty=-0.2"])
    tok = search_tokenizer
    envs = EnvGroupManager(cfg.custom_envs, cfg.es_manager.train, "train")
    eps = run_episodes(envs.assign_seeds(0, 0), TextPolicy(tok, lambda slot: "<answer>Up || Down</ans"),
                       ChatFormatter(tok), context_config(cfg))
    assert all(e.format_errors == 4 and e.turn_rewards == [-0.2] * 4 and not e.success for e in eps)
    m = episode_metrics(Trajectory.from_episodes(eps, tok.pad_token_id), "env")
    assert m["env/format_error_rate"] == 1.0 and m["env/em"] == m["env/f1"] == 0.0


def test_warmstart_demonstrations_are_the_expert_responses(search_tokenizer):
    from ragen_turn.warmstart import collect_demonstrations, demo_responder

    cfg = _search_cfg(["agent_proxy.enable_think=true"])
    demos = collect_demonstrations(cfg, search_tokenizer, 8, seed=1)
    assert demos.batch_size == 8 and float(demos.success.mean()) == 1.0
    from ragen_turn.rollout import EnvGroupManager

    slot = EnvGroupManager(cfg.custom_envs, cfg.es_manager.train, "train").assign_seeds(0, 0)[0]
    slot.env.reset(seed=slot.seed)
    first = demo_responder(cfg, 0)(slot)
    assert first == "<think>I need to look this up.</think>" + slot.env.solve()[0]


def test_env_configs_refuse_unknown_keys_naming_the_env():
    """search_qa's and webshop's ``from_dict`` (one helper, envs/base.py ``known_keys_config``): an unknown key stops
    naming the env, the key and the known ones; known keys build the config."""
    from ragen_turn.envs.search_qa.config import SearchQAEnvConfig
    from ragen_turn.envs.webshop.config import WebShopEnvConfig

    for cls, name in ((SearchQAEnvConfig, "search_qa"), (WebShopEnvConfig, "webshop")):
        with pytest.raises(ValueError, match=rf"^{name}: unknown config key\(s\) \['topkk'\]; known: \[.*'max_turns'"):
            cls.from_dict({"topkk": 3, "max_turns": 4})
        assert cls.from_dict({"max_turns": 4}) == cls(max_turns=4)
