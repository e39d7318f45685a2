"""The text the embedded `tiny` model's tokenizer is trained on (`ragen_turn.models.tiny_tokenizer`): Sokoban /
WebShop agent prompts, grids, page text and digits, generated deterministically (`build_corpus`), and the copies of
the search-QA prompt text (`SEARCH_QA_CHAT`) its `search_qa` corpus adds.
"""
from __future__ import annotations

import random

GRID_SYMBOLS = "#_OX√PS"
ACTION_WORDS = ["Up", "Down", "Left", "Right"]
ACTION_SEP = "||"

# Copies of the prompt text a search-QA episode shows (system prompt, user message, the env's feedback, the warm
# start's think lines). They stay copies: generating them from the live code would retrain the tokenizer whenever
# that text changes. tests/test_tiny_corpus.py fails when a copy no longer matches the real text.
SEARCH_QA_CHAT = ["You are a helpful agent.", "Turn 1:", "State:", "You have 3 turns left.", "Reward: 0.00",
                  "Invalid response: no <search> ... </search> or <answer> ... </answer> found.",
                  "<think>I need to look this up.</think>", "<think>I know the answer now.</think>"]


_SOKOBAN_SYSTEM = [
    "You are a helpful assistant. You first think about the reasoning process and then give the answer.",
    "You are solving the Sokoban puzzle. You are the player and you need to push all boxes to targets. "
    "When you are right next to a box, you can push it by moving in the same direction. "
    "You cannot push a box through a wall, and you cannot pull a box.",
    "The meaning of each symbol in the state is:\n#: wall, _: empty, O: target, √: box on target, X: box, "
    "P: player, S: player on target",
    "Symbols: # Wall | _ Floor | O Target | X Box | P You | √ Box on Target | S You on Target",
    "Your available actions are:\nUp, Down, Left, Right",
    "You can make up to {n} actions, separated by the action separator \" || \"",
    "Rules: push boxes only, no pulling. Avoid walls. Do not push a box into a corner.",
    "Rewards: -0.1 per move, +1.0 for a box on a target, +10.0 when all boxes are placed. "
    "Format penalty: -0.1 for an invalid answer.",
    "Always output: <think> [Your thoughts] </think> <answer> [your answer] </answer> with no extra text. "
    "Strictly follow this format. Max response length: {m} words (tokens).",
    "The answer should be a sequence of actions, like <answer>Right || Right || Up</answer>",
    "The observation is a 2D grid of the current state of the Sokoban game.",
    "Decide your next action(s).",
]

_WEBSHOP_SYSTEM = [
    "You are browsing an online shop. Based on the instruction, find the product that matches the description. "
    "You need to a) first search for the product, b) click the product you want, c) select its options, "
    "and d) click Buy Now.",
    "Your available actions are: search[keywords], click[value]. Only click values shown on the page.",
    "Instruction: i need a {adj} {noun}, and price lower than {price} dollars",
    "Instruction: i am looking for {color} {noun} in size {size}, and price lower than {price} dollars",
    "Instruction: find me a {adj} {color} {noun} for {who}, with price lower than {price} dollars",
    "Available actions: {actions}",
    "You have {n} actions left.",
]

_THOUGHTS = [
    "The box is {dir} of me and the target is {dir2}, so I should push it {dir3}.",
    "I am {dir} of the box. I need to go around it first.",
    "Moving {dir3} pushes the box onto the target.",
    "There is a wall {dir}, so I cannot move that way.",
    "The player should move {dir3} to reach the box.",
    "I should search for the product first.",
    "This product matches the color and the size, so I will click it.",
    "The price is lower than the budget. I will select the options and buy now.",
    "None of these results match. I will go to the next page.",
    "I need to go back to search and try other keywords.",
]

_DIRS = ["above", "below", "left", "right", "up", "down"]

_PRODUCT_WORDS = (
    "shirt t-shirt dress pants jeans shorts skirt jacket coat hoodie sweater socks shoes sneakers boots sandals "
    "hat cap bag backpack wallet watch necklace bracelet earrings ring sunglasses scarf gloves belt "
    "hair extension wig shampoo conditioner lotion cream serum mask lipstick nail polish perfume brush "
    "phone case charger cable headphones earbuds speaker keyboard mouse monitor laptop tablet camera "
    "pillow blanket sheet curtain rug lamp chair table desk shelf mirror candle vase frame towel "
    "coffee tea snack cookies chocolate candy nuts chips sauce spice oil honey protein vitamin "
    "toy puzzle game book pen notebook bottle cup mug plate bowl knife pan pot kettle "
    "women men girls boys baby kids unisex adult "
    "cotton leather wool silk polyester linen denim plastic metal wood glass ceramic steel "
    "natural organic vegan gluten free sugar free long short slim loose fit soft lightweight waterproof "
    "wireless portable rechargeable machine washable non-slip easy to clean high quality"
).split()
_COLORS = "black white red blue green yellow pink purple grey gray brown beige navy gold silver multicolor".split()
_SIZES = "x-small small medium large x-large xx-large 3x-large one size 6 7 8 9 10 11 12 32 34 36".split()
_WHO = ["women", "men", "kids", "my daughter", "my son", "a gift", "the office", "travel", "the kitchen"]
_PAGE_WORDS = [
    "Back to Search", "Next >", "< Prev", "Buy Now", "Description", "Features", "Reviews", "Attributes",
    "Rating: N.A.", "Price:", "Page 1 (Total results: 50)", "size", "color", "style", "flavor name",
    "Instruction:", "[SEP]", "WebShop",
]


def _grid(rng: random.Random, rows: int, cols: int) -> list[str]:
    """Random Sokoban-like rows: walls around, floor inside, a few boxes/targets/player."""
    out = ["#" * cols]
    for _ in range(rows - 2):
        inner = [rng.choice("_______#OX√PS") for _ in range(cols - 2)]
        out.append("#" + "".join(inner) + "#")
    out.append("#" * cols)
    return out


def _asin(rng: random.Random) -> str:
    return "B0" + "".join(rng.choice("0123456789ABCDEFGHJKLMNPQRSTUVWXYZ") for _ in range(8))


def _price(rng: random.Random) -> str:
    return f"{rng.randint(1, 199)}.{rng.randint(0, 99):02d}"


def _product_title(rng: random.Random) -> str:
    return " ".join(rng.choice(_PRODUCT_WORDS) for _ in range(rng.randint(3, 9))).title() if rng.random() < 0.5 \
        else " ".join(rng.choice(_PRODUCT_WORDS) for _ in range(rng.randint(3, 9)))


def _actions(rng: random.Random, k: int, sep: str = " || ") -> str:
    return sep.join(rng.choice(ACTION_WORDS) for _ in range(k))


def build_corpus(seed: int = 0, n_episodes: int = 300) -> list[str]:
    """Deterministic training text for the BPE (a list of documents)."""
    rng = random.Random(seed)
    docs: list[str] = []
    fill = lambda s: s.format(  # noqa: E731
        n=rng.randint(1, 10), m=rng.choice([50, 100, 128, 200]), adj=rng.choice(_PRODUCT_WORDS),
        noun=rng.choice(_PRODUCT_WORDS), color=rng.choice(_COLORS), size=rng.choice(_SIZES),
        price=_price(rng), who=rng.choice(_WHO), dir=rng.choice(_DIRS), dir2=rng.choice(_DIRS),
        dir3=rng.choice(ACTION_WORDS).lower(),
        actions=", ".join(rng.sample(["search[...]", "click[back to search]", "click[next >]",
                                      "click[< prev]", "click[buy now]", "click[description]"], 3)))
    # Sokoban episodes in RAGEN's context format
    for _ in range(n_episodes):
        parts = [fill(s) for s in _SOKOBAN_SYSTEM if rng.random() < 0.7]
        size = rng.choice([(6, 6), (8, 8), (7, 7), (6, 8)])
        for turn in range(1, rng.randint(2, 6)):
            grid = "\n".join(_grid(rng, *size))
            left = rng.randint(1, 20)
            parts.append(f"Turn {turn}:\nState:\n{grid}\nYou have {left} actions left. "
                         f"Always output: <think> [Your thoughts] </think> <answer> [your answer] </answer> "
                         f"with no extra text. Strictly follow this format. Max response length: 100 words (tokens).")
            k = rng.randint(1, 4)
            sep = rng.choice([" || ", " || ", "||", ", "])
            thought = " ".join(fill(rng.choice(_THOUGHTS)) for _ in range(rng.randint(1, 2)))
            parts.append(f"<think>{thought}</think><answer>{_actions(rng, k, sep)}</answer>")
            parts.append(f"<think> {thought} </think> <answer> {_actions(rng, k, sep)} </answer>")
            parts.append(f"Reward:\n{rng.choice(['-0.1', '0.9', '-0.2', '10.9', '0', '-1', '1.0', '0.0'])}\n")
        docs.append("\n".join(parts))
    # WebShop episodes
    for _ in range(n_episodes):
        parts = [fill(s) for s in _WEBSHOP_SYSTEM if rng.random() < 0.7]
        query = " ".join(rng.choice(_PRODUCT_WORDS + _COLORS) for _ in range(rng.randint(2, 6)))
        results = []
        for _ in range(rng.randint(2, 6)):
            results += [_asin(rng), _product_title(rng), "$" + _price(rng)]
        page = " [SEP] ".join(["Back to Search", f"Page {rng.randint(1, 5)} (Total results: {rng.randint(1, 50)})",
                               "Next >"] + results)
        item = " [SEP] ".join(["Back to Search", "< Prev", rng.choice(["size", "color", "style"])]
                              + rng.sample(_SIZES, 3) + rng.sample(_COLORS, 3)
                              + [_product_title(rng), f"Price: ${_price(rng)}", "Rating: N.A.", "Description",
                                 "Features", "Reviews", "Buy Now"])
        parts += [
            f"Instruction: [SEP] {fill(rng.choice(_WEBSHOP_SYSTEM[2:5]))[13:]} [SEP] Search",
            f"<think>{fill(rng.choice(_THOUGHTS[5:]))}</think><answer>search[{query}]</answer>",
            f"Instruction: [SEP] {page}",
            f"<think>{fill(rng.choice(_THOUGHTS[5:]))}</think><answer>click[{results[0].lower()}]</answer>",
            f"Instruction: [SEP] {item}",
            f"<answer>click[{rng.choice(_SIZES)}]</answer> <answer>click[{rng.choice(_COLORS)}]</answer> "
            f"<answer>click[buy now]</answer> <answer>click[Buy Now]</answer> <answer>click[next >]</answer> "
            f"<answer>click[back to search]</answer> <answer>click[< prev]</answer>",
            "Reward:\n" + rng.choice(["0", "0.5", "1.0", "0.75", "0.33"]),
            " ".join(rng.choice(_PAGE_WORDS) for _ in range(5)),
        ]
        docs.append("\n".join(parts))
    # digits, numbers and a little generic English
    docs.append(" ".join(str(rng.randint(0, 10 ** rng.randint(1, 6))) for _ in range(2000)))
    docs.append(" ".join(f"{rng.randint(-20, 20) / 10:.1f}" for _ in range(500)))
    generic = ("the a an and or of to in on at for with is are was be it this that I you we they he she "
               "not no yes can will should must need go move push pull box wall target player step turn state "
               "action actions reward done success valid invalid format answer think search click product page "
               "first then next last only all each one two three four five left right up down above below "
               "User Assistant System user assistant system").split()
    for _ in range(200):
        docs.append(" ".join(rng.choice(generic) for _ in range(30)).capitalize() + ".")
    return docs

