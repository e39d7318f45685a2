"""The synthetic knowledge base shipped with the search-QA env: fictional worlds, their passages and questions.

A world is one country with its capital and three other cities, eight people, two companies, three novels, a river
and a mountain; every entity gets one short encyclopedia passage that states its attributes (years, occupations,
currencies, ...) and its relations to other entities of the same world (a city lies in a country, a person was born
in a city, a company was founded by a person, ...). Names are built from syllables and are unique across the whole
knowledge base.

Questions are single-hop (the answer is in the subject's own passage: one search for the subject's name) or
two-hop (the subject's passage names a bridge entity, whose passage holds the answer: two searches). Each
question keeps the expert's searches (``queries``) and the passages they must reach (``support``). Worlds are
split by country into train / val / test, so no entity of a split's questions appears in another split's.

:func:`generate` is deterministic in ``(countries, seed)``; ``scripts/make_search_qa_data.py`` writes its output.
"""
from __future__ import annotations

import random
from typing import Any, Dict, List, Tuple

DEFAULT_COUNTRIES = 150
DEFAULT_SEED = 0
SPLIT_FRACTIONS = (("train", 0.8), ("val", 0.1), ("test", 0.1))
TOKENIZER_SEED = 1  # the tokenizer's knowledge base: other names than the shipped one (seed 0)

# names are consonant-vowel syllables (with a final consonant or not): 70 syllables, so a tokenizer trained on other
# names of the same kind splits every name into a few syllable tokens, train and held-out names alike
ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z"]
VOWELS = ["a", "e", "i", "o", "u"]
CODAS = ["", "", "n", "r", "l", "s"]

REGIONS = ["northern", "southern", "eastern", "western", "central"]
OCCUPATIONS = ["painter", "poet", "architect", "physician", "astronomer", "composer", "sculptor", "chemist",
               "novelist", "engineer", "botanist", "historian", "mathematician", "philosopher", "diplomat",
               "cartographer", "violinist", "economist", "geologist", "journalist"]
INDUSTRIES = ["shipping", "textile", "publishing", "railway", "banking", "mining", "brewing", "glassmaking",
              "printing", "clockmaking", "insurance", "pottery"]
GENRES = ["mystery", "adventure", "historical", "romance", "satirical", "epic", "gothic", "pastoral"]
TITLE_ADJ = ["Silent", "Hidden", "Golden", "Broken", "Distant", "Crimson", "Quiet", "Endless", "Winter", "Last",
             "Pale", "Burning", "Hollow", "Silver", "Narrow", "Wandering"]
TITLE_NOUN = ["Harbor", "Garden", "Lantern", "Bridge", "Orchard", "Tower", "River", "Mirror", "Valley", "Letter",
              "Voyage", "Crown", "Meadow", "Window", "Island", "Compass", "Shadow", "Feather"]
COMPANY_SUFFIX = ["Works", "Company", "Press", "Mills", "Brothers", "Trading", "Foundry", "Holdings"]


class Names:
    """Unique syllable names (no name is reused anywhere in the knowledge base)."""

    MAX_MISSES = 64  # draws in a row that hit used names before a length range gets one more syllable

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set = set()
        self.widen: Dict[Tuple[int, int], int] = {}  # (lo, hi) -> extra syllables, once its names run out

    def word(self, lo: int = 2, hi: int = 3) -> str:
        """A new name of lo..hi syllables. About 24k two-syllable names exist: a knowledge base of thousands of
        worlds (the 1M-passage benchmark) uses them up, and from then on that range draws one syllable more (for
        the shipped 150 worlds this never happens, so their text does not depend on it)."""
        rng = self.rng
        misses = 0
        while True:
            extra = self.widen.get((lo, hi), 0)
            n = rng.randint(lo + extra, hi + extra)
            w = "".join(rng.choice(ONSETS) + rng.choice(VOWELS) + (rng.choice(CODAS) if i == n - 1 else "")
                        for i in range(n))
            w = w.capitalize()
            if w.lower() not in self.used:
                self.used.add(w.lower())
                return w
            misses += 1
            if misses >= self.MAX_MISSES:
                self.widen[(lo, hi)] = extra + 1
                misses = 0

    def person(self) -> str:
        while True:
            first, last = self.word(2, 2), self.word(2, 3)
            name = f"{first} {last}"
            if name.lower() not in self.used:
                self.used.add(name.lower())
                return name

    def unique(self, make) -> str:
        while True:
            s = make()
            if s.lower() not in self.used:
                self.used.add(s.lower())
                return s


def _a(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def _passage(pid: str, title: str, text: str, split: str, kind: str) -> Dict[str, Any]:
    return {"id": pid, "title": title, "text": text, "split": split, "kind": kind}


def make_world(rng: random.Random, names: Names, split: str, wid: int) -> Tuple[List[dict], Dict[str, dict]]:
    """One country and its entities: (passages, {entity name: record with its facts and passage id})."""
    ent: Dict[str, dict] = {}
    passages: List[dict] = []

    def add(kind: str, name: str, text: str, **facts) -> dict:
        pid = f"{split}-{wid}-{len(passages)}"
        passages.append(_passage(pid, name, text, split, kind))
        rec = {"kind": kind, "name": name, "pid": pid, **facts}
        ent[name] = rec
        return rec

    country = names.word(2, 3)
    currency = names.word(2, 2).lower()
    language = names.word(2, 2) + "ish"
    region = rng.choice(REGIONS)
    indep = rng.randint(1600, 1980)
    river = names.word(2, 2)
    mountain = names.word(2, 3)
    cities = [names.word(2, 3) for _ in range(4)]
    capital = cities[0]
    people = [names.person() for _ in range(8)]

    if rng.random() < 0.5:
        text = (f"{country} is a country in the {region} lands. Its capital is {capital}. The official language of "
                f"{country} is {language} and its currency is the {currency}. It became independent in {indep}.")
    else:
        text = (f"{country} is {_a(region)} country whose capital is {capital}. People in {country} speak {language} "
                f"and pay with the {currency}. The country gained independence in {indep}.")
    add("country", country, text, capital=capital, language=language, currency=currency, year=indep)

    length = rng.randint(80, 2400)
    add("river", river, f"The {river} is a river that flows through {country}. It is {length} km long.",
        country=country, length=length)
    height = rng.randint(900, 6500)
    add("mountain", mountain, f"{mountain} is a mountain in {country}. It rises to {height} metres.",
        country=country, height=height)
    for c in cities:
        year = rng.randint(700, 1850)
        on_river = rng.random() < 0.5
        extra = f" It lies on the {river}." if on_river else ""
        if rng.random() < 0.5:
            text = f"{c} is a city in {country}. It was founded in {year}.{extra}"
        else:
            text = f"{c} is a city of {country}, founded in {year}.{extra}"
        add("city", c, text, country=country, year=year, river=river if on_river else None)
    for p in people:
        city = rng.choice(cities)
        year = rng.randint(1700, 1990)
        occ = rng.choice(OCCUPATIONS)
        if rng.random() < 0.5:
            text = f"{p} was {_a(occ)} born in {city} in {year}."
        else:
            text = f"{p} (born {year} in {city}) is {_a(occ)}."
        add("person", p, text, birthplace=city, year=year, occupation=occ)
    for _ in range(2):
        founder = rng.choice(people)
        hq = rng.choice(cities)
        year = ent[founder]["year"] + rng.randint(20, 50)
        ind = rng.choice(INDUSTRIES)
        org = names.unique(lambda: f"{names.word(2, 2)} {rng.choice(COMPANY_SUFFIX)}")
        text = f"{org} is {_a(ind)} company founded in {year} by {founder}. Its headquarters are in {hq}."
        add("company", org, text, founder=founder, hq=hq, year=year, industry=ind)
    for _ in range(3):
        author = rng.choice(people)
        year = ent[author]["year"] + rng.randint(20, 60)
        genre = rng.choice(GENRES)
        book = names.unique(lambda: f"The {rng.choice(TITLE_ADJ)} {rng.choice(TITLE_NOUN)} of {names.word(2, 2)}")
        text = f"{book} is {_a(genre)} novel by {author}, first published in {year}."
        add("book", book, text, author=author, year=year, genre=genre)
    return passages, ent


def _q(question: str, answers, queries: List[str], support: List[str]) -> dict:
    answers = [answers] if isinstance(answers, str) else list(answers)
    return {"question": question, "golden_answers": [str(a) for a in answers], "hops": len(queries),
            "queries": queries, "support": support}


def world_questions(ent: Dict[str, dict]) -> List[dict]:
    """Every single-hop and two-hop question a world supports."""
    qs: List[dict] = []
    for name, e in ent.items():
        k, pid = e["kind"], e["pid"]
        one = lambda q, a: qs.append(_q(q, a, [name], [pid]))  # noqa: E731

        def two(q: str, a, bridge: str) -> None:
            qs.append(_q(q, a, [name, bridge], [pid, ent[bridge]["pid"]]))

        if k == "country":
            one(f"What is the capital of {name}?", e["capital"])
            one(f"What is the official language of {name}?", e["language"])
            one(f"What is the currency of {name}?", e["currency"])
            one(f"In what year did {name} become independent?", str(e["year"]))
            two(f"In what year was the capital of {name} founded?", str(ent[e["capital"]]["year"]), e["capital"])
        elif k == "city":
            one(f"In which country is {name}?", e["country"])
            one(f"In what year was {name} founded?", str(e["year"]))
            two(f"What is the capital of the country where {name} is located?", ent[e["country"]]["capital"],
                e["country"])
            two(f"What currency is used in the country where {name} is located?", ent[e["country"]]["currency"],
                e["country"])
        elif k == "person":
            one(f"Where was {name} born?", e["birthplace"])
            one(f"In what year was {name} born?", str(e["year"]))
            one(f"What was the occupation of {name}?", e["occupation"])
            two(f"In which country was {name} born?", ent[e["birthplace"]]["country"], e["birthplace"])
            two(f"In what year was the birthplace of {name} founded?", str(ent[e["birthplace"]]["year"]),
                e["birthplace"])
        elif k == "company":
            one(f"Who founded {name}?", e["founder"])
            one(f"Where is {name} headquartered?", e["hq"])
            one(f"In what year was {name} founded?", str(e["year"]))
            two(f"Where was the founder of {name} born?", ent[e["founder"]]["birthplace"], e["founder"])
            two(f"What was the occupation of the founder of {name}?", ent[e["founder"]]["occupation"], e["founder"])
            two(f"In which country is {name} headquartered?", ent[e["hq"]]["country"], e["hq"])
        elif k == "book":
            one(f"Who wrote {name}?", e["author"])
            one(f"In what year was {name} first published?", str(e["year"]))
            two(f"Where was the author of {name} born?", ent[e["author"]]["birthplace"], e["author"])
            two(f"In what year was the author of {name} born?", str(ent[e["author"]]["year"]), e["author"])
        elif k == "river":
            one(f"Which country does the {name} flow through?", e["country"])
            one(f"How long is the {name}?", [f"{e['length']} km", str(e["length"])])
            two(f"What is the capital of the country that the {name} flows through?", ent[e["country"]]["capital"],
                e["country"])
        elif k == "mountain":
            one(f"In which country is {name}?", e["country"])
            one(f"How high is {name}?", [f"{e['height']} metres", f"{e['height']} m", str(e["height"])])
    return qs


def split_of(i: int, n: int) -> str:
    edge = 0.0
    for name, frac in SPLIT_FRACTIONS:
        edge += frac
        if i < round(edge * n):
            return name
    return SPLIT_FRACTIONS[-1][0]


def generate(countries: int = DEFAULT_COUNTRIES, seed: int = DEFAULT_SEED,
             with_questions: bool = True) -> Tuple[List[dict], Dict[str, List[dict]]]:
    """(corpus records, {split: question records}); deterministic in (countries, seed)."""
    rng = random.Random(seed)
    names = Names(rng)
    corpus: List[dict] = []
    questions: Dict[str, List[dict]] = {name: [] for name, _ in SPLIT_FRACTIONS}
    for w in range(countries):
        split = split_of(w, countries)
        passages, ent = make_world(rng, names, split, w)
        corpus += [{"id": p["id"], "contents": f"{p['title']}\n{p['text']}", "split": split} for p in passages]
        if with_questions:
            questions[split] += world_questions(ent)
    for split, qs in questions.items():
        random.Random(f"{seed}-{split}").shuffle(qs)  # seeds of an env pick questions by index
        for i, q in enumerate(qs):
            q["id"] = f"{split}-{i}"
    questions = {s: [{"id": q["id"], **{k: v for k, v in q.items() if k != "id"}} for q in qs]
                 for s, qs in questions.items()}
    return corpus, questions


def tokenizer_corpus(countries: int = DEFAULT_COUNTRIES, seed: int = TOKENIZER_SEED) -> List[str]:
    """Text for a tokenizer of this env's language: the passages (as a search shows them) and the questions with
    the expert's searches and answers, of a knowledge base generated with another seed, so no shipped name (train
    or held-out) is in it and train and held-out names split into syllable tokens alike."""
    corpus, questions = generate(countries, seed)
    docs = []
    for r in corpus:
        title, _, text = r["contents"].partition("\n")
        docs.append(f"Doc 1(Title: {title}) {text}")
    for qs in questions.values():
        docs += [f"Question: {q['question']}\n" + "".join(f"<search> {x} </search>\n" for x in q["queries"])
                 + f"<answer> {q['golden_answers'][0]} </answer>" for q in qs]
    return docs
