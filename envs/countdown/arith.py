"""Scoring of a Countdown answer without ``eval``: RAGEN's format and correctness checks on a parsed expression."""
from __future__ import annotations

import ast
import itertools
import operator
import re
from typing import List, Optional, Sequence

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPONENT = 64  # a larger power counts as not equal to the target (Python would compute it, for ages)


def uses_numbers(equation: str, nums: Sequence[int]) -> bool:
    """RAGEN's format check: the digit runs of ``equation`` are exactly ``nums`` (as a multiset)."""
    return sorted(int(n) for n in re.findall(r"\d+", equation)) == sorted(int(n) for n in nums)


def evaluate(equation: str) -> Optional[complex]:
    """The value of an arithmetic expression (numbers, + - * / // % **, unary +/-, parentheses), as Python
    computes it; None for anything else, a syntax error, a division by zero or an overflow."""
    try:
        tree = ast.parse(equation.lstrip(" \t"), mode="eval")
        return _value(tree.body)
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError, TypeError, RecursionError, MemoryError):
        return None


def _value(node: ast.AST):
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError("exponent too large")
        return _BINARY[type(node.op)](left, right)
    raise ValueError(f"not arithmetic: {type(node).__name__}")


def equals_target(equation: str, target: float) -> bool:
    """RAGEN's correctness check: the expression's value is within 1e-5 of ``target``."""
    value = evaluate(equation)
    try:
        return value is not None and abs(value - target) < 1e-5
    except TypeError:
        return False


def has_plus_minus_solution(nums: Sequence[int], target: int) -> bool:
    """RAGEN's data filter: some choice of signs of the (first four, zero-padded) numbers sums to ``target``."""
    padded = (list(nums) + [0] * 4)[:4]
    return any(sum(s * n for s, n in zip(signs, padded)) == target
               for signs in itertools.product((1, -1), repeat=4))


def plus_minus_equation(nums: Sequence[int], target: int) -> Optional[str]:
    """An equation of every number in ``nums`` with + and - only that equals ``target`` (None if none): the
    positive terms first, e.g. ``44 + 19 - 35``."""
    for signs in itertools.product((1, -1), repeat=len(nums)):
        if sum(s * n for s, n in zip(signs, nums)) != target:
            continue
        pos = [n for s, n in zip(signs, nums) if s > 0]
        neg = [n for s, n in zip(signs, nums) if s < 0]
        if not pos:
            continue
        text = " + ".join(str(n) for n in pos) + "".join(f" - {n}" for n in neg)
        if equals_target(text, target):
            return text
    return None


__all__: List[str] = ["uses_numbers", "evaluate", "equals_target", "has_plus_minus_solution",
                      "plus_minus_equation"]
