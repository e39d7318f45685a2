#!/usr/bin/env python
"""Generate a synthetic WebShop catalog in WebShop's own JSON formats.

Writes three files into ``--out`` (default: ``envs/webshop/data``, the catalog shipped with the package):

* ``items_shuffle.json``   products, as WebShop's scraped ``items_shuffle*.json`` records
* ``items_ins_v2.json``    ``{asin: {"attributes", "instruction", "instruction_attributes"}}``
* ``items_human_ins.json`` ``{asin: [{"asin", "instruction", "instruction_attributes", "instruction_options"}]}``

Products are drawn from five categories (WebShop's beauty, electronics, fashion, food, furniture), five
product types each, with brands, option types (colour, size, scent, ...), attributes, prices and
descriptions; goal instructions are sampled from each product's own attributes and option values, so every
goal can be met exactly by its product. The output depends only on ``--seed`` and ``--num-products``.

    python scripts/make_webshop_catalog.py                       # the shipped catalog (300 products, seed 0)
    python scripts/make_webshop_catalog.py --num-products 100000 --out /tmp/ws100k
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import random
import string
from typing import Any, Dict, List, Tuple

DEFAULT_NUM_PRODUCTS = 300
DEFAULT_SEED = 0
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO_ROOT, "envs", "webshop", "data")

COLORS = ["black", "white", "navy blue", "grey", "red", "pink", "green", "beige", "brown", "light blue"]
CLOTHING_SIZES = ["small", "medium", "large", "x-large", "xx-large"]
SHOE_SIZES = ["6", "7", "7.5", "8", "8.5", "9", "10", "11"]

# (query, breadcrumb, nouns, {option type: values}, attribute pool, (price lo, price hi))
CATALOG_SPEC: Dict[str, List[Tuple[str, str, List[str], Dict[str, List[str]], List[str], Tuple[float, float]]]] = {
    "beauty": [
        ("hair shampoo", "Beauty & Personal Care › Hair Care › Shampoo & Conditioner › Shampoos",
         ["Shampoo", "Clarifying Shampoo", "Moisturizing Shampoo"],
         {"size": ["8 fl oz (pack of 1)", "16 fl oz (pack of 1)", "16 fl oz (pack of 2)"],
          "scent": ["lavender", "coconut", "unscented", "citrus"]},
         ["sulfate free", "paraben free", "natural ingredients", "dry hair", "hair growth", "tea tree",
          "argan oil", "cruelty free", "color treated"], (6, 38)),
        ("face moisturizer", "Beauty & Personal Care › Skin Care › Face › Creams & Moisturizers",
         ["Face Moisturizer", "Day Cream", "Night Cream"],
         {"size": ["1.7 ounce", "3.4 ounce"]},
         ["hyaluronic acid", "fine lines", "dry skin", "sensitive skin", "fragrance free", "anti aging",
          "oil free", "vitamin c"], (9, 60)),
        ("lipstick", "Beauty & Personal Care › Makeup › Lips › Lipstick",
         ["Matte Lipstick", "Liquid Lipstick", "Lip Stain"],
         {"color": ["ruby red", "nude pink", "berry", "coral", "mauve"]},
         ["long lasting", "cruelty free", "highly pigmented", "easy apply", "paraben free"], (5, 28)),
        ("nail polish", "Beauty & Personal Care › Foot, Hand & Nail Care › Nail Art & Polish › Nail Polish",
         ["Nail Polish", "Gel Nail Polish", "Nail Lacquer Set"],
         {"color": ["classic red", "soft pink", "midnight blue", "clear", "glitter gold"]},
         ["quick dry", "long lasting", "non toxic", "high gloss", "chip resistant"], (4, 25)),
        ("hair extensions", "Beauty & Personal Care › Hair Care › Hair Extensions, Wigs & Accessories › Extensions",
         ["Clip in Hair Extensions", "Tape in Hair Extensions", "Ponytail Extension"],
         {"color": ["natural black", "dark brown", "ash blonde", "auburn"], "size": ["16 inch", "20 inch", "24 inch"]},
         ["natural looking", "human hair", "heat resistant", "easy use", "long lasting"], (15, 90)),
    ],
    "electronics": [
        ("wireless earbuds", "Electronics › Headphones, Earbuds & Accessories › Earbuds",
         ["Wireless Earbuds", "Bluetooth Earbuds", "Sport Earbuds"],
         {"color": ["black", "white", "navy blue", "rose gold"]},
         ["noise cancelling", "wireless bluetooth", "long battery life", "water resistant", "fast charging",
          "hands free", "stereo sound"], (18, 140)),
        ("hdmi cable", "Electronics › Accessories & Supplies › Audio & Video Accessories › Cables › HDMI Cables",
         ["HDMI Cable", "Braided HDMI Cable", "Right Angle HDMI Cable"],
         {"size": ["3 ft", "6 ft", "10 ft", "15 ft"], "color": ["black", "grey"]},
         ["high speed", "gold plated", "4k ultra hd", "ethernet", "plug play"], (5, 30)),
        ("phone case", "Cell Phones & Accessories › Cases, Holsters & Sleeves › Basic Cases",
         ["Phone Case", "Clear Phone Case", "Wallet Phone Case"],
         {"color": ["black", "clear", "pink", "green"], "style": ["iphone 13", "iphone 14", "galaxy s22"]},
         ["shockproof", "wireless charging", "slim fit", "tempered glass", "card holder"], (6, 35)),
        ("bluetooth speaker",
         "Electronics › Portable Audio & Video › Portable Speakers & Docks › Portable Bluetooth Speakers",
         ["Bluetooth Speaker", "Portable Speaker", "Waterproof Speaker"],
         {"color": ["black", "blue", "red", "grey"]},
         ["waterproof", "long battery life", "stereo sound", "wireless bluetooth", "built in microphone",
          "easy carry"], (20, 160)),
        ("laptop stand", "Electronics › Computers & Accessories › Laptop Accessories › Stands",
         ["Laptop Stand", "Adjustable Laptop Stand", "Foldable Laptop Riser"],
         {"color": ["silver", "space grey", "black"]},
         ["height adjustable", "aluminum alloy", "heat dissipation", "non slip", "easy assemble"], (15, 70)),
    ],
    "fashion": [
        ("men's t-shirt", "Clothing, Shoes & Jewelry › Men › Clothing › Shirts › T-Shirts",
         ["T-Shirt", "Crew Neck Tee", "Graphic T-Shirt"],
         {"color": COLORS[:7], "size": CLOTHING_SIZES},
         ["machine wash", "cotton spandex", "short sleeve", "regular fit", "classic fit", "moisture wicking"],
         (8, 35)),
        ("women's sneakers", "Clothing, Shoes & Jewelry › Women › Shoes › Fashion Sneakers",
         ["Sneakers", "Running Shoes", "Walking Shoes"],
         {"color": ["white", "black", "pink", "grey", "black/white"], "size": SHOE_SIZES},
         ["rubber sole", "non slip", "lace up", "memory foam", "breathable mesh", "lightweight"], (25, 110)),
        ("women's dress", "Clothing, Shoes & Jewelry › Women › Clothing › Dresses › Casual",
         ["Maxi Dress", "Wrap Dress", "Sundress"],
         {"color": ["floral", "black", "red", "navy blue", "green"], "size": CLOTHING_SIZES[:4]},
         ["machine wash", "long sleeve", "short sleeve", "high waist", "polyester spandex", "pocket"], (18, 60)),
        ("men's jeans", "Clothing, Shoes & Jewelry › Men › Clothing › Jeans",
         ["Slim Fit Jeans", "Straight Leg Jeans", "Relaxed Jeans"],
         {"color": ["dark wash", "light wash", "black"], "size": ["30w x 30l", "32w x 32l", "34w x 32l", "36w x 34l"]},
         ["machine wash", "button closure", "stretch fabric", "regular fit", "cotton blend"], (20, 70)),
        ("winter jacket", "Clothing, Shoes & Jewelry › Men › Clothing › Jackets & Coats › Down Jackets",
         ["Puffer Jacket", "Winter Coat", "Hooded Parka"],
         {"color": ["black", "olive green", "navy blue", "khaki"], "size": CLOTHING_SIZES},
         ["water resistant", "zipper closure", "hand wash", "windproof", "detachable hood", "warm fleece"],
         (40, 180)),
    ],
    "food": [
        ("green tea", "Grocery & Gourmet Food › Beverages › Tea › Green",
         ["Green Tea Bags", "Matcha Green Tea", "Loose Leaf Green Tea"],
         {"flavor name": ["jasmine", "mint", "original", "lemon"],
          "size": ["20 count (pack of 1)", "20 count (pack of 6)", "100 count"]},
         ["caffeine free", "gluten free", "non gmo", "usda organic", "low calorie", "kosher certified"], (5, 32)),
        ("protein bar", "Grocery & Gourmet Food › Snack Foods › Bars › Protein Bars",
         ["Protein Bars", "Keto Protein Bars", "Vegan Protein Bars"],
         {"flavor name": ["chocolate chip", "peanut butter", "cookies and cream", "salted caramel"],
          "size": ["12 count", "24 count"]},
         ["gluten free", "high protein", "low sugar", "non gmo", "plant based", "keto friendly"], (12, 45)),
        ("coffee beans", "Grocery & Gourmet Food › Beverages › Coffee, Tea & Cocoa › Coffee › Whole Coffee Beans",
         ["Whole Bean Coffee", "Espresso Beans", "Dark Roast Coffee Beans"],
         {"size": ["12 ounce", "2 pound", "5 pound"]},
         ["fair trade", "usda organic", "medium roast", "dark roast", "single origin", "low acid"], (9, 55)),
        ("dark chocolate", "Grocery & Gourmet Food › Candy & Chocolate › Chocolate Bars",
         ["Dark Chocolate Bar", "Dark Chocolate Squares", "Sea Salt Dark Chocolate"],
         {"size": ["3 ounce (pack of 4)", "3 ounce (pack of 12)"],
          "flavor name": ["sea salt", "almond", "orange", "mint"]},
         ["dairy free", "fair trade", "low sugar", "gluten free", "non gmo"], (6, 40)),
        ("trail mix", "Grocery & Gourmet Food › Snack Foods › Trail Mix",
         ["Trail Mix", "Nut Mix", "Snack Mix Packs"],
         {"size": ["1.5 ounce (pack of 24)", "26 ounce"], "flavor name": ["classic", "tropical", "chocolate"]},
         ["high protein", "non gmo", "individually wrapped", "gluten free", "no artificial"], (8, 35)),
    ],
    "furniture": [
        ("office chair", "Home & Kitchen › Furniture › Home Office Furniture › Home Office Chairs",
         ["Office Chair", "Ergonomic Desk Chair", "Mesh Task Chair"],
         {"color": ["black", "grey", "white", "blue"]},
         ["lumbar support", "height adjustable", "easy assemble", "pu leather", "swivel wheels", "breathable mesh"],
         (60, 320)),
        ("bookshelf", "Home & Kitchen › Furniture › Home Office Furniture › Bookcases",
         ["Bookshelf", "Ladder Bookshelf", "Cube Storage Shelf"],
         {"color": ["rustic brown", "white", "black oak"], "size": ["3 tier", "4 tier", "5 tier"]},
         ["easy assemble", "metal frame", "engineered wood", "space saving", "living room"], (35, 190)),
        ("bed frame", "Home & Kitchen › Furniture › Bedroom Furniture › Beds, Frames & Bases › Bed Frames",
         ["Platform Bed Frame", "Metal Bed Frame", "Upholstered Bed Frame"],
         {"size": ["twin", "full", "queen", "king"], "color": ["black", "grey", "beige"]},
         ["easy assemble", "under bed storage", "noise free", "heavy duty", "no box spring needed"], (90, 480)),
        ("coffee table", "Home & Kitchen › Furniture › Living Room Furniture › Tables › Coffee Tables",
         ["Coffee Table", "Lift Top Coffee Table", "Round Coffee Table"],
         {"color": ["walnut", "white", "black", "natural"]},
         ["storage space", "living room", "solid wood", "easy assemble", "mid century"], (45, 260)),
        ("floor lamp", "Tools & Home Improvement › Lighting & Ceiling Fans › Lamps & Shades › Floor Lamps",
         ["Floor Lamp", "Arc Floor Lamp", "Tripod Floor Lamp"],
         {"color": ["black", "brass", "white"]},
         ["living room", "dimmable light", "energy efficient", "easy assemble", "led bulb", "foot switch"],
         (25, 150)),
    ],
}

ADJECTIVES = ["Premium", "Classic", "Everyday", "Deluxe", "Essential", "Modern", "Pro", "Signature",
              "Ultra", "Original", "Advanced", "Daily"]
BRAND_SYLLABLES = ["vel", "ora", "kes", "trix", "lum", "ina", "zen", "dor", "mar", "quo", "bry", "tal",
                   "nix", "aro", "sol", "vex", "pim", "ral", "cor", "ely"]
GENERIC_SENTENCES = {
    "beauty": ["Gentle enough for daily use.", "Dermatologist tested formula.", "Made without harsh chemicals.",
               "Leaves a fresh, clean finish."],
    "electronics": ["Backed by an 18 month warranty.", "Compatible with most devices.",
                    "Compact design for travel.", "Tested for durability."],
    "fashion": ["Designed for all day comfort.", "True to size fit.", "Easy to pair with any outfit.",
                "Soft fabric that keeps its shape."],
    "food": ["Packed fresh for great taste.", "A smart snack for work or school.", "Perfect for sharing.",
             "Made in small batches."],
    "furniture": ["Sturdy construction for everyday use.", "All hardware and tools included.",
                  "Fits small apartments and large homes.", "Simple to clean with a damp cloth."],
}
TEMPLATES = [
    "i'm looking for {a} {attrs} {query}{opts}",
    "i need {a} {query} that is {attrs}{opts}",
    "find me {a} {attrs} {query}{opts}",
    "i want to buy {a} {query} which is {attrs}{opts}",
    "i am looking for {a} {query} with {attrs}{opts}",
]


def _article(phrase: str) -> str:
    head = phrase.split()[-1] if phrase.split() else ""
    if head.endswith("s") and not head.endswith("ss"):
        return "some"
    return "an" if phrase[:1] in "aeiou" else "a"


def _brand(rng: random.Random) -> str:
    return "".join(rng.sample(BRAND_SYLLABLES, rng.choice([2, 2, 3]))).capitalize()


def _asin(rng: random.Random, used: set) -> str:
    alphabet = string.ascii_uppercase + string.digits
    while True:
        a = "B0" + "".join(rng.choice(alphabet) for _ in range(8))
        if a not in used:
            used.add(a)
            return a


def _title_case(s: str) -> str:
    return " ".join(w[:1].upper() + w[1:] for w in s.split())


def _opts_phrase(goal_options: Dict[str, str]) -> str:
    parts = []
    for k, v in goal_options.items():
        if k == "color":
            parts.append(f"{v} color")
        elif k == "size":
            parts.append(f"size {v}")
        else:
            parts.append(f"{v} {k}")
    return (" in " + " and ".join(parts)) if parts else ""


def make_product(rng: random.Random, category: str, spec, used_asins: set,
                 brands: List[str]) -> Tuple[Dict, Dict, List]:
    query, breadcrumb, nouns, option_spec, attr_pool, (plo, phi) = spec
    asin = _asin(rng, used_asins)
    brand = rng.choice(brands)
    noun = rng.choice(nouns)
    attrs = rng.sample(attr_pool, rng.randint(3, min(5, len(attr_pool))))
    title_attrs = rng.sample(attrs, rng.choice([1, 2]))
    extra = rng.choice(["", "", f" - {rng.choice([2, 3, 4, 6])} Pack", " for Daily Use", " (New Version)"])
    name = f"{brand} {rng.choice(ADJECTIVES)} {noun} {_title_case(' '.join(title_attrs))}{extra}"

    options: Dict[str, List[Dict[str, Any]]] = {}
    if rng.random() > 0.08:  # a few products have no options
        for opt_name, values in option_spec.items():
            if rng.random() < 0.15 and len(option_spec) > 1:
                continue
            k = rng.randint(min(2, len(values)), len(values))
            picked = set(rng.sample(values, k))
            chosen = [v for v in values if v in picked]
            key = opt_name.title() if opt_name != "flavor name" else "Flavor Name"
            options[key] = [{"value": _title_case(v), "image": None} for v in chosen]

    cents = rng.choice([0.99, 0.49, 0.95, 0.0])
    price = round(rng.uniform(plo, phi)) + cents
    if rng.random() < 0.15:
        pricing = f"${price:.2f} - ${price + rng.choice([2, 4, 5, 8]):.2f}"
    else:
        pricing = f"${price:.2f}"

    desc_sents = [f"The {brand} {noun.lower()} is a {rng.choice(ADJECTIVES).lower()} choice for anyone shopping "
                  f"for {query}.",
                  f"It is {attrs[0]} and {attrs[1]}.", rng.choice(GENERIC_SENTENCES[category])]
    if len(attrs) > 2 and rng.random() < 0.5:
        desc_sents.append(f"Customers love that it is {attrs[2]}.")
    bullets = [f"{a.upper()}: {rng.choice(GENERIC_SENTENCES[category])}" for a in attrs[: rng.randint(2, len(attrs))]]
    bullets.append(f"WHAT YOU GET: {noun.lower()} by {brand}, ready to use.")

    product = {
        "asin": asin,
        "name": name,
        "category": category,
        "query": query,
        "product_category": breadcrumb,
        "pricing": pricing,
        "customization_options": options,
        "full_description": " ".join(desc_sents),
        "small_description": bullets,
        "images": [f"https://example.com/img/{asin}.jpg"],
        "average_rating": round(rng.uniform(3.0, 5.0), 1),
        "brand": brand,
        "page": rng.randint(1, 5),
    }
    synthetic_attrs = rng.sample(attrs, min(len(attrs), rng.randint(1, 2)))
    ins_v2 = {
        "attributes": attrs,
        "instruction": f"i am looking for {_article(' '.join(synthetic_attrs + [query]))} "
                       f"{' and '.join(synthetic_attrs)} {query}",
        "instruction_attributes": synthetic_attrs,
    }
    human: List[Dict[str, Any]] = []
    n_goals = 0 if rng.random() < 0.2 else rng.choice([1, 1, 2])
    for _ in range(n_goals):
        g_attrs = rng.sample(attrs, rng.randint(1, min(2, len(attrs))))
        goal_options = {}
        for key, vals in options.items():
            if rng.random() < 0.85:
                goal_options[key.lower()] = rng.choice(vals)["value"].replace("/", " | ").lower()
        attrs_text = " and ".join(g_attrs)
        template = rng.choice(TEMPLATES)
        article = _article(f"{attrs_text} {query}" if "{a} {attrs}" in template else query)
        text = template.format(a=article, attrs=attrs_text, query=query, opts=_opts_phrase(goal_options))
        human.append({"asin": asin, "instruction": text + rng.choice(["", ".", ""]),
                      "instruction_attributes": g_attrs, "instruction_options": list(goal_options.values())})
    return product, ins_v2, human


def generate_catalog(num_products: int = DEFAULT_NUM_PRODUCTS, seed: int = DEFAULT_SEED):
    """Returns ``(products, items_ins_v2, items_human_ins)`` as WebShop's three JSON structures."""
    gc_was_enabled = gc.isenabled()
    gc.disable()  # many small objects: the cyclic collector would only slow this down
    try:
        return _generate(num_products, seed)
    finally:
        if gc_was_enabled:
            gc.enable()


def _generate(num_products: int, seed: int):
    rng = random.Random(seed)
    brands = sorted({_brand(rng) for _ in range(60)})
    types = [(cat, spec) for cat, specs in CATALOG_SPEC.items() for spec in specs]
    used: set = set()
    products, ins_v2, human = [], {}, {}
    for i in range(num_products):
        cat, spec = types[i % len(types)] if i < len(types) else rng.choice(types)
        p, ins, hum = make_product(rng, cat, spec, used, brands)
        products.append(p)
        ins_v2[p["asin"]] = ins
        if hum:
            human[p["asin"]] = hum
    rng.shuffle(products)  # WebShop's file is shuffled (items_shuffle)
    return products, ins_v2, human


def _write_array(path: str, items: List[Any]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write("[\n")
        for i, it in enumerate(items):
            f.write(json.dumps(it, ensure_ascii=False))
            f.write(",\n" if i + 1 < len(items) else "\n")
        f.write("]\n")


def _write_object(path: str, d: Dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write("{\n")
        keys = list(d)
        for i, k in enumerate(keys):
            f.write(f"{json.dumps(k)}: {json.dumps(d[k], ensure_ascii=False)}")
            f.write(",\n" if i + 1 < len(keys) else "\n")
        f.write("}\n")


def write_catalog(out_dir: str, num_products: int = DEFAULT_NUM_PRODUCTS, seed: int = DEFAULT_SEED) -> Dict[str, str]:
    products, ins_v2, human = generate_catalog(num_products, seed)
    os.makedirs(out_dir, exist_ok=True)
    paths = {name: os.path.join(out_dir, name) for name in
             ("items_shuffle.json", "items_ins_v2.json", "items_human_ins.json")}
    _write_array(paths["items_shuffle.json"], products)
    _write_object(paths["items_ins_v2.json"], ins_v2)
    _write_object(paths["items_human_ins.json"], human)
    return paths


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-products", type=int, default=DEFAULT_NUM_PRODUCTS)
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--out", default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    paths = write_catalog(args.out, args.num_products, args.seed)
    total = sum(os.path.getsize(p) for p in paths.values())
    print(f"wrote {args.num_products} products to {args.out} ({total / 1024:.0f} KiB): "
          + ", ".join(os.path.basename(p) for p in paths.values()))


if __name__ == "__main__":
    main()
