"""What WebShop's text pages show that both the env and its expert planner read: the navigation labels and the
item page's option buttons (the env renders them, :mod:`.solver` plans clicks on them)."""
from __future__ import annotations

from typing import List, Optional, Tuple

from .catalog import Product

BACK_TO_SEARCH = "back to search"
NEXT_PAGE = "next >"
PREV_PAGE = "< prev"
BUY_NOW = "buy now"
SUB_PAGES = ("description", "features", "reviews", "attributes")
SEARCH_ACTION_HINT = "search[<your query>]"


def option_layout(p: Product) -> List[Tuple[str, List[Tuple[str, Optional[str]]]]]:
    """The item page's options in page order: ``(type, [(value, click key or None), ...])``.

    A value's key is None when an earlier button (navigation, or the same value of an earlier option type)
    already owns its label.
    """
    taken = {BACK_TO_SEARCH, PREV_PAGE}
    layout = []
    for opt_type, values in p.options.items():
        row = []
        for v in values:
            key = " ".join(v.split())
            row.append((v, None if key in taken else key))
            taken.add(key)
        layout.append((opt_type, row))
    return layout
