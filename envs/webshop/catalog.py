"""WebShop catalog: products and goals read from WebShop's own JSON files.

Files (names as in WebShop's ``web_agent_site/utils.py`` and ``setup.sh``), all in one ``data_dir``:

* ``items_shuffle.json`` (all 1.18M products) or ``items_shuffle_1000.json`` (the 1k subset): a JSON
  array of scraped products with ``asin``, ``name``, ``category``, ``query``, ``product_category``
  (breadcrumb joined by ``›``), ``pricing`` (``"$12.99"`` or ``"$12.99 - $15.99"``),
  ``customization_options`` (``{option type: [{"value": ..., "image": ...}]}``), ``full_description``,
  ``small_description`` (bullet points) and more (images, brand, ...), which are ignored.
* ``items_ins_v2.json`` / ``items_ins_v2_1000.json``: ``{asin: {"attributes": [...], "instruction": ...,
  "instruction_attributes": [...]}}``: the product's attributes, plus WebShop's synthetic instruction.
* ``items_human_ins.json``: ``{asin: [{"instruction": ..., "instruction_attributes": [...],
  "instruction_options": [...]}, ...]}``: the human-written goals (WebShop's default goal set).
* ``reviews.json`` (optional): ``[{"asin": ..., "reviews": [...], "average_rating": ...}]``.

Products are normalised as WebShop's ``load_products`` does (option types and values lower-cased, ``/`` in
values shown as `` | ``, prices parsed from the ``$`` string, duplicate or malformed ASINs dropped,
``num_products`` keeps the first N records). Goals are built as in WebShop's ``get_human_goals`` /
``get_synthetic_goals`` (instruction + ``, and price lower than X dollars`` from a price bound 2-4 steps
of $10 above the product's price) and shuffled with WebShop's seed 233, so goal indices, and the
train / val / test index ranges, refer to the same goals as in WebShop. Differences: the price of a
product with a price range and each goal's price bound are drawn from generators seeded by the ASIN
(WebShop draws them from the unseeded global generator), so they are reproducible.

The product file is read with a streaming parser. Small catalogs are kept in memory; large ones
(``lazy_load``) keep only each record's byte offset, read records back on demand, and cache the offset
table on disk.
"""
from __future__ import annotations

import bisect
import contextlib
import gc
import glob
import hashlib
import itertools
import logging
import os
import random
import re
import threading
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .jsonstream import iter_json_records, read_record

PRICE_RANGE = [10.0 * i for i in range(1, 100)]
GOAL_SHUFFLE_SEED = 233
NO_PRICE_BOUND = 1_000_000.0
LAZY_FILE_BYTES = 512 * 1024 * 1024
LAZY_MIN_PRODUCTS = 200_000
_CATALOG_FORMAT_VERSION = 1

log = logging.getLogger(__name__)

DATA_HELP = (
    "Get WebShop's data with its setup script (https://github.com/princeton-nlp/WebShop, "
    "`./setup.sh -d small` for the 1k subset or `-d all` for all 1.18M products; the files land in "
    "WebShop/data/), then point the env at that folder: env.webshop.data_dir=/path/to/WebShop/data "
    "(Hydra) or WebShopEnvConfig(data_dir=...). Leave data_dir unset (null) to use the small catalog "
    "shipped with ragen_turn. See envs/webshop/README.md."
)


class WebShopDataError(FileNotFoundError):
    """WebShop's data files are missing or unreadable; the message says where to put them."""


# ----------------------------------------------------------------------------------------- products
@dataclass
class Product:
    asin: str
    name: str
    category: str = ""
    query: str = ""
    product_category: str = ""
    description: str = ""
    bullets: List[str] = field(default_factory=list)
    pricing: List[float] = field(default_factory=lambda: [100.0])
    price_tag: str = "$100.0"
    price: float = 100.0
    options: Dict[str, List[str]] = field(default_factory=dict)
    attributes: List[str] = field(default_factory=list)
    rating: Any = "N.A."
    reviews: List[Dict[str, Any]] = field(default_factory=list)

    @property
    def title(self) -> str:
        return self.name

    def reward_view(self) -> Dict[str, Any]:
        """The product under WebShop's key names, as :func:`reward.get_reward` reads it."""
        return {"name": self.name, "Title": self.name, "query": self.query,
                "product_category": self.product_category, "Attributes": self.attributes,
                "BulletPoints": self.bullets, "Description": self.description}

    def search_text(self) -> str:
        """The text WebShop indexes: title, description, first bullet point and the options, lower-cased."""
        opts = ", and ".join(f"{k}: {', '.join(v)}" for k, v in self.options.items())
        first_bullet = self.bullets[0] if self.bullets else ""
        return " ".join([self.name, self.description, first_bullet, opts]).lower()


def parse_pricing(pricing: Any) -> List[float]:
    """``"$12.99"`` -> [12.99]; ``"$10.99 - $15.49"`` -> [10.99, 15.49]; empty -> [100.0] (WebShop's default)."""
    values: List[float] = []
    if isinstance(pricing, (int, float)) and not isinstance(pricing, bool):
        values = [float(pricing)]
    elif isinstance(pricing, str):
        for piece in pricing.split("$")[1:]:
            digits = re.sub(r"[^\d.]", "", piece)
            try:
                values.append(float(Decimal(digits)))
            except (InvalidOperation, ValueError):
                continue
    elif isinstance(pricing, (list, tuple)):
        for p in pricing:
            values.extend(parse_pricing(p if not isinstance(p, str) or "$" in p else "$" + p))
    return values[:2] if values else [100.0]


def price_tag(pricing: Sequence[float]) -> str:
    return f"${pricing[0]}" if len(pricing) == 1 else f"${pricing[0]} to ${pricing[1]}"


def _hash32(*parts: Any) -> int:
    """A stable 32-bit hash (CRC-32) of the parts; the same on every machine and Python version."""
    return zlib.crc32("|".join(map(str, parts)).encode("utf-8"))


def product_price(asin: str, pricing: Sequence[float]) -> float:
    """The price paid: the single price, or a point of the range drawn from a generator seeded by the ASIN."""
    if len(pricing) == 1:
        return float(pricing[0])
    lo, hi = float(pricing[0]), float(pricing[1])
    return lo + (hi - lo) * (_hash32("price", asin) / 2 ** 32)


def normalize_options(customization_options: Any) -> Dict[str, List[str]]:
    options: Dict[str, List[str]] = {}
    if not isinstance(customization_options, dict):
        return options
    for name, contents in customization_options.items():
        if contents is None:
            continue
        values = []
        for c in contents if isinstance(contents, (list, tuple)) else [contents]:
            v = c.get("value") if isinstance(c, dict) else c
            if v is None:
                continue
            v = str(v).strip().replace("/", " | ").lower()
            if v and v not in values:
                values.append(v)
        if values:
            options[str(name).lower()] = values
    return options


def _as_list_of_str(x: Any) -> List[str]:
    if x is None:
        return []
    if isinstance(x, str):
        return [x] if x else []
    if isinstance(x, (list, tuple)):
        return [str(v) for v in x if v is not None and str(v) != ""]
    return [str(x)]


def _normalize_reviews(reviews: Any) -> List[Dict[str, Any]]:
    out = []
    for r in reviews or []:
        if not isinstance(r, dict):
            continue
        out.append({"title": str(r.get("title", "") or ""),
                    "score": r.get("score", r.get("stars", "")),
                    "body": str(r.get("body", r.get("review", "")) or "")})
    return out


def valid_asin(asin: Any) -> bool:
    return isinstance(asin, str) and asin not in ("", "nan") and len(asin) <= 10


def normalize_product(raw: Mapping[str, Any], attrs: Optional[Mapping[str, Any]] = None,
                      review_entry: Optional[Mapping[str, Any]] = None) -> Optional[Product]:
    """One raw ``items_shuffle`` record (+ its ``items_ins_v2`` entry) -> :class:`Product`; None if unusable."""
    if not isinstance(raw, dict):
        return None
    asin = str(raw.get("asin", "")).strip()
    if not valid_asin(asin):
        return None
    pricing = parse_pricing(raw.get("pricing"))
    rating = raw.get("average_rating", "N.A.")
    reviews = raw.get("reviews", [])
    if review_entry:
        rating = review_entry.get("average_rating", rating)
        reviews = review_entry.get("reviews", reviews)
    return Product(
        asin=asin,
        name=str(raw.get("name") or raw.get("Title") or ""),
        category=str(raw.get("category") or ""),
        query=str(raw.get("query") or "").lower().strip(),
        product_category=str(raw.get("product_category") or ""),
        description=str(raw.get("full_description") or raw.get("Description") or ""),
        bullets=_as_list_of_str(raw.get("small_description", raw.get("BulletPoints"))),
        pricing=pricing,
        price_tag=price_tag(pricing),
        price=product_price(asin, pricing),
        options=normalize_options(raw.get("customization_options")),
        attributes=_as_list_of_str((attrs or {}).get("attributes")),
        rating=rating if rating not in (None, "") else "N.A.",
        reviews=_normalize_reviews(reviews if isinstance(reviews, list) else []),
    )


# -------------------------------------------------------------------------------------------- files
@dataclass
class DataFiles:
    products: str
    attributes: Optional[str]
    human: Optional[str]
    reviews: Optional[str]

    def identity(self) -> Tuple:
        out = []
        for p in (self.products, self.attributes, self.human, self.reviews):
            if p is None:
                out.append(None)
            else:
                st = os.stat(p)
                out.append((os.path.abspath(p), st.st_size, st.st_mtime_ns))
        return tuple(out)


def _pick(data_dir: str, stem: str, preferred: Sequence[str]) -> Optional[str]:
    for name in preferred:
        p = os.path.join(data_dir, name)
        if os.path.isfile(p):
            return p
    found = sorted(glob.glob(os.path.join(data_dir, f"{stem}*.json")))
    return found[0] if found else None


def resolve_data_files(data_dir: str, human_goals: bool = True, num_products: Optional[int] = None) -> DataFiles:
    """Find WebShop's files in ``data_dir``; raise :class:`WebShopDataError` saying what is missing."""
    if not os.path.isdir(data_dir):
        raise WebShopDataError(f"WebShop data folder {data_dir!r} does not exist. {DATA_HELP}")
    small_first = num_products is not None and num_products <= 1000
    order = ["items_shuffle_1000.json", "items_shuffle.json"] if small_first else \
        ["items_shuffle.json", "items_shuffle_1000.json"]
    products = _pick(data_dir, "items_shuffle", order)
    if products is None:
        raise WebShopDataError(
            f"No WebShop product file in {data_dir!r}: expected items_shuffle.json (all products) or "
            f"items_shuffle_1000.json (1k subset), next to items_ins_v2*.json and items_human_ins.json. {DATA_HELP}")
    suffix = os.path.basename(products)[len("items_shuffle"):]  # "_1000.json" or ".json"
    attributes = _pick(data_dir, "items_ins_v2", [f"items_ins_v2{suffix}", "items_ins_v2.json",
                                                    "items_ins_v2_1000.json"])
    human = _pick(data_dir, "items_human_ins", ["items_human_ins.json"])
    if human_goals and human is None:
        raise WebShopDataError(
            f"No items_human_ins.json in {data_dir!r} (WebShop's human goals; set human_goals=false to use the "
            f"synthetic goals of items_ins_v2*.json instead). {DATA_HELP}")
    if not human_goals and attributes is None:
        raise WebShopDataError(f"Synthetic goals need items_ins_v2.json (or items_ins_v2_1000.json) in {data_dir!r}. "
                               f"{DATA_HELP}")
    reviews = os.path.join(data_dir, "reviews.json")
    return DataFiles(products, attributes, human, reviews if os.path.isfile(reviews) else None)


# ------------------------------------------------------------------------------------------ catalog
class _LRU:
    def __init__(self, maxsize: int):
        self.maxsize = maxsize
        self.d: "OrderedDict[int, Product]" = OrderedDict()
        self.lock = threading.Lock()

    def get(self, k: int) -> Optional[Product]:
        with self.lock:
            v = self.d.get(k)
            if v is not None:
                self.d.move_to_end(k)
            return v

    def put(self, k: int, v: Product) -> None:
        with self.lock:
            self.d[k] = v
            self.d.move_to_end(k)
            while len(self.d) > self.maxsize:
                self.d.popitem(last=False)


class Catalog:
    """Products (indexed 0..N-1 in file order) and the shuffled goal list.

    ``product(i)``, ``get(asin)``, ``index_of(asin)``, ``iter_products()``, ``goals``,
    ``split_indices(split)``. Build it with :func:`load_catalog`, which caches it per process.
    """

    def __init__(self, files: DataFiles, num_products: Optional[int] = None, human_goals: bool = True,
                 lazy: Optional[bool] = None, cache_dir: Optional[str] = None):
        self.files = files
        self.num_products = num_products
        self.human_goals = human_goals
        if lazy is None:
            lazy = (os.path.getsize(files.products) > LAZY_FILE_BYTES
                    and (num_products is None or num_products > LAZY_MIN_PRODUCTS))
        self.lazy = bool(lazy)
        self.key = hashlib.sha1(repr((_CATALOG_FORMAT_VERSION, files.identity(), num_products, human_goals))
                                .encode()).hexdigest()[:16]
        self._reviews = self._load_reviews()
        if self.lazy:
            self._init_lazy(cache_dir)
        else:
            self._init_memory()
        if self.lazy:
            order = np.argsort(self._asins, kind="stable")
            self._sorted_asins = self._asins[order]
            self._sorted_pos = order
        else:
            self._asin_to_index = {p.asin: i for i, p in enumerate(self._products)}
        self.goals: List[Dict[str, Any]] = self._build_goals()

    # ---- loading
    def _raw_products(self) -> Iterator[Tuple[Any, int, int]]:
        try:
            for _, raw, off, n in iter_json_records(self.files.products, limit=self.num_products):
                yield raw, off, n
        except (OSError, ValueError) as e:
            raise WebShopDataError(f"Cannot read WebShop products from {self.files.products!r}: {e}. "
                                   f"{DATA_HELP}") from e

    def _load_reviews(self) -> Dict[str, Mapping[str, Any]]:
        if not self.files.reviews:
            return {}
        out = {}
        for _, r, _, _ in iter_json_records(self.files.reviews):
            if isinstance(r, Mapping) and "asin" in r:
                out[str(r["asin"])] = r
        return out

    def _load_attributes(self, wanted: Optional[set]) -> Dict[str, Any]:
        """asin -> items_ins_v2 entry (memory mode) for the wanted ASINs."""
        out: Dict[str, Any] = {}
        if not self.files.attributes:
            return out
        for asin, entry, _, _ in iter_json_records(self.files.attributes):
            if wanted is None or asin in wanted:
                out[asin] = entry
        return out

    def _init_memory(self) -> None:
        raws, seen = [], set()
        for raw, _, _ in self._raw_products():
            asin = str(raw.get("asin", "")).strip() if isinstance(raw, dict) else ""
            if not valid_asin(asin) or asin in seen:
                continue
            seen.add(asin)
            raws.append(raw)
        attrs = self._load_attributes(seen)
        self._products: List[Product] = []
        for raw in raws:
            asin = str(raw["asin"]).strip()
            p = normalize_product(raw, attrs.get(asin), self._reviews.get(asin))
            if p is not None:
                self._products.append(p)
        self._attr_entries = attrs
        self._asins = np.array([p.asin for p in self._products], dtype="U10")

    def _init_lazy(self, cache_dir: Optional[str]) -> None:
        cache_path = os.path.join(cache_dir, f"catalog_{self.key}.npz") if cache_dir else None
        loaded = False
        if cache_path and os.path.isfile(cache_path):
            try:
                with np.load(cache_path, allow_pickle=False) as z:
                    self._asins = z["asins"]
                    self._offsets, self._lengths = z["offsets"], z["lengths"]
                    self._attr_asins, self._attr_offsets, self._attr_lengths = \
                        z["attr_asins"], z["attr_offsets"], z["attr_lengths"]
                loaded = True
            except (OSError, KeyError, ValueError):
                loaded = False
        if not loaded:
            asins, offs, lens, seen = [], [], [], set()
            for raw, off, n in self._raw_products():
                asin = str(raw.get("asin", "")).strip() if isinstance(raw, dict) else ""
                if not valid_asin(asin) or asin in seen:
                    continue
                seen.add(asin)
                asins.append(asin)
                offs.append(off)
                lens.append(n)
            self._asins = np.array(asins, dtype="U10")
            self._offsets = np.array(offs, dtype=np.int64)
            self._lengths = np.array(lens, dtype=np.int64)
            a_asins, a_offs, a_lens = [], [], []
            if self.files.attributes:
                for asin, _, off, n in iter_json_records(self.files.attributes):
                    if asin in seen:
                        a_asins.append(asin)
                        a_offs.append(off)
                        a_lens.append(n)
            del seen
            order = np.argsort(np.array(a_asins, dtype="U10"), kind="stable")
            self._attr_asins = np.array(a_asins, dtype="U10")[order]
            self._attr_offsets = np.array(a_offs, dtype=np.int64)[order]
            self._attr_lengths = np.array(a_lens, dtype=np.int64)[order]
            if cache_path:
                tmp = f"{cache_path}.{os.getpid()}.tmp.npz"
                try:
                    os.makedirs(cache_dir, exist_ok=True)
                    np.savez(tmp, asins=self._asins, offsets=self._offsets, lengths=self._lengths,
                             attr_asins=self._attr_asins, attr_offsets=self._attr_offsets,
                             attr_lengths=self._attr_lengths)
                    os.replace(tmp, cache_path)
                except OSError as e:
                    log.warning("webshop: could not cache the catalog offsets in %s (%s)", cache_path, e)
                    if os.path.exists(tmp):
                        os.remove(tmp)
        self._fd = os.open(self.files.products, os.O_RDONLY)
        self._attr_fd = os.open(self.files.attributes, os.O_RDONLY) if self.files.attributes else None
        self._cache = _LRU(4096)

    # ---- access
    def __len__(self) -> int:
        return len(self._asins)

    @property
    def asins(self) -> np.ndarray:
        return self._asins

    def index_of(self, asin: str) -> Optional[int]:
        """Index of a product by ASIN (exact, else upper-cased: click labels are lower-case)."""
        if not self.lazy:
            i = self._asin_to_index.get(asin)
            return self._asin_to_index.get(str(asin).upper()) if i is None else i
        for a in dict.fromkeys((str(asin), str(asin).upper())):
            j = int(np.searchsorted(self._sorted_asins, a))
            if j < len(self._sorted_asins) and self._sorted_asins[j] == a:
                return int(self._sorted_pos[j])
        return None

    def _attr_entry(self, asin: str) -> Optional[Mapping[str, Any]]:
        if not self.lazy:
            return self._attr_entries.get(asin)
        if self._attr_fd is None:
            return None
        j = int(np.searchsorted(self._attr_asins, asin))
        if j < len(self._attr_asins) and self._attr_asins[j] == asin:
            return read_record(self._attr_fd, self._attr_offsets[j], self._attr_lengths[j])
        return None

    def product(self, i: int) -> Product:
        if not self.lazy:
            return self._products[i]
        p = self._cache.get(i)
        if p is None:
            raw = read_record(self._fd, self._offsets[i], self._lengths[i])
            asin = str(self._asins[i])
            p = normalize_product(raw, self._attr_entry(asin), self._reviews.get(asin))
            self._cache.put(i, p)
        return p

    def get(self, asin: str) -> Optional[Product]:
        i = self.index_of(asin)
        return None if i is None else self.product(i)

    def iter_products(self, with_attributes: bool = True) -> Iterator[Product]:
        """All products in index order (streams the file in lazy mode; ``with_attributes=False`` skips reading
        ``items_ins_v2`` there, for callers that only need the product text)."""
        if not self.lazy:
            yield from self._products
            return
        i = 0
        for raw, _, _ in self._raw_products():
            if i >= len(self._asins):
                break
            asin = str(raw.get("asin", "")).strip() if isinstance(raw, dict) else ""
            if asin != self._asins[i]:
                continue  # dropped record (malformed or duplicate ASIN)
            attrs = self._attr_entry(asin) if with_attributes else None
            yield normalize_product(raw, attrs, self._reviews.get(asin))
            i += 1

    # ---- goals
    def _goal_base(self, p: Product, n: int) -> Tuple[float, str]:
        """WebShop's price bound: one of the 2nd..4th multiples of $10 above the price (seeded by ASIN)."""
        k = bisect.bisect_right(PRICE_RANGE, p.price)
        above = PRICE_RANGE[k:k + 4]
        if len(above) >= 2:  # the larger of two distinct candidates, picked by a hash of (asin, n)
            h = _hash32("goal", p.asin, n)
            i = h % len(above)
            j = (h // len(above)) % (len(above) - 1)
            j += j >= i
            upper = max(above[i], above[j])
            return upper, f", and price lower than {upper:.2f} dollars"
        return NO_PRICE_BOUND, ""

    def _goal(self, p: Product, n: int, text: str, attributes: List[str], goal_options: Any) -> Dict[str, Any]:
        upper, price_text = self._goal_base(p, n)
        return {"asin": p.asin, "category": p.category, "query": p.query, "name": p.name,
                "product_category": p.product_category, "instruction_text": text + price_text,
                "attributes": attributes, "price_upper": upper, "goal_options": goal_options, "weight": 1.0}

    def _build_goals(self) -> List[Dict[str, Any]]:
        goals: List[Dict[str, Any]] = []
        if self.human_goals:
            human: Dict[str, Any] = {}
            try:
                for asin, entries, _, _ in iter_json_records(self.files.human):
                    if self.index_of(asin) is not None:
                        human[asin] = entries
            except (OSError, ValueError) as e:
                raise WebShopDataError(f"Cannot read {self.files.human!r}: {e}. {DATA_HELP}") from e
            # products in file order, their instructions in file order (WebShop's get_human_goals)
            for i in sorted(self.index_of(a) for a in human):
                p = self.product(i)
                entries = human[p.asin]
                for n, ins in enumerate(entries if isinstance(entries, list) else [entries]):
                    if not isinstance(ins, Mapping):
                        continue
                    attrs = _as_list_of_str(ins.get("instruction_attributes"))
                    if not attrs:
                        continue
                    opts = ins.get("instruction_options") or []
                    opts = list(opts.values()) if isinstance(opts, Mapping) else _as_list_of_str(opts)
                    text = str(ins.get("instruction", "")).strip(".")
                    goals.append(self._goal(p, n, text, attrs, [o.lower() for o in opts]))
        else:
            for p in self.iter_products():
                entry = self._attr_entry(p.asin) or {}
                text = entry.get("instruction")
                attrs = _as_list_of_str(entry.get("instruction_attributes"))
                if not text or not attrs:
                    continue
                names = sorted(p.options)
                for n, combo in enumerate(itertools.product(*(p.options[k] for k in names))):
                    goal_options = dict(zip(names, combo))
                    opt_text = ", and ".join(f"{k}: {v}" for k, v in goal_options.items())
                    opt_text = f" with {opt_text}" if opt_text else ""
                    goals.append(self._goal(p, n, f"{text}{opt_text}", attrs, goal_options))
        random.Random(GOAL_SHUFFLE_SEED).shuffle(goals)
        return goals

    def split_indices(self, split: str, split_ranges: Optional[Mapping[str, Sequence[Optional[int]]]] = None) -> range:
        return split_range(len(self.goals), split, split_ranges)

    def close(self) -> None:
        for name in ("_fd", "_attr_fd"):
            fd = getattr(self, name, None)
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
                setattr(self, name, None)


def split_range(n_goals: int, split: str,
                split_ranges: Optional[Mapping[str, Sequence[Optional[int]]]] = None) -> range:
    """Goal index range of a split: WebShop's (test [0, 500), val [500, 1500), train [1500, n)) for more than
    3000 goals, else the first 10% / next 10% / rest; ``split_ranges`` overrides; ``all`` is everything."""
    if split == "all":
        return range(n_goals)
    if split_ranges and split in split_ranges:
        start, end = split_ranges[split]
        end = n_goals if end is None else min(int(end), n_goals)
        return range(min(int(start), end), end)
    if split_ranges:
        raise ValueError(f"webshop: split {split!r} is not in split_ranges {dict(split_ranges)}")
    if n_goals > 3000:
        bounds = {"test": (0, 500), "val": (500, 1500), "train": (1500, n_goals)}
    else:
        a = max(1, n_goals // 10) if n_goals >= 3 else 0
        bounds = {"test": (0, a), "val": (a, 2 * a), "train": (2 * a, n_goals)}
    if split not in bounds:
        raise ValueError(f"webshop: unknown split {split!r}")
    return range(*bounds[split])


@contextlib.contextmanager
def gc_paused():
    """Pause the cyclic garbage collector while building millions of small objects (it would rescan them
    over and over; loading 100k products is ~3x faster without it)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# ------------------------------------------------------------------------------------- process cache
_CATALOGS: Dict[Tuple, Catalog] = {}
_CATALOG_LOCK = threading.Lock()


def load_catalog(data_dir: str, num_products: Optional[int] = None, human_goals: bool = True,
                 lazy: Optional[bool] = None, cache_dir: Optional[str] = None) -> Catalog:
    """The catalog of ``data_dir``, built once per process (keyed by the files' paths, sizes and mtimes)."""
    files = resolve_data_files(data_dir, human_goals=human_goals, num_products=num_products)
    key = (files.identity(), num_products, bool(human_goals), lazy)
    with _CATALOG_LOCK:
        cat = _CATALOGS.get(key)
        if cat is None:
            with gc_paused():
                cat = Catalog(files, num_products=num_products, human_goals=human_goals, lazy=lazy,
                              cache_dir=cache_dir)
            _CATALOGS[key] = cat
        return cat


def clear_catalog_cache() -> None:
    with _CATALOG_LOCK:
        for c in _CATALOGS.values():
            c.close()
        _CATALOGS.clear()


__all__ = ["Product", "Catalog", "DataFiles", "WebShopDataError", "load_catalog", "clear_catalog_cache",
           "resolve_data_files", "normalize_product", "parse_pricing", "split_range", "PRICE_RANGE", "DATA_HELP"]
