"""onnxfuse.analysis.expressions.parse: a report's byte expressions read back without eval (the --baseline gate's
input)."""

from __future__ import annotations

import pytest
import sympy

from onnxfuse.analysis import expressions
from onnxfuse.analysis.expressions import ExpressionError, parse
from onnxfuse.analysis.symbolic import make_symbol

H, W, N = (make_symbol(n) for n in ("H", "W", "N_"))


@pytest.mark.parametrize("expr", [
    512 * N * (sympy.floor(H / 2 - sympy.Rational(1, 2)) + 1) + 4096,
    sympy.Max(H, 2 * W) * sympy.Min(N, 3) + sympy.Mod(W, 7) - sympy.ceiling(H / 3),
    44 * N * H**2 * W + 896,
    sympy.Integer(-12),
    sympy.Float(1.5) * H,
])
def test_round_trip_of_what_onnxfuse_writes(expr):
    """What the report writes (sympy's str) reads back as the same expression."""
    assert parse(str(expr)) == expr


def test_names_use_the_given_symbols():
    mine = sympy.Symbol("H")
    assert parse("2*H", {"H": mine}) == 2 * mine


@pytest.mark.parametrize("text, why", [
    ("__import__('os').system('true')", "Call"),
    ("H.__class__", "Attribute"),
    ("H[0]", "Subscript"),
    ("'text'", "Constant"),
    ("lambda: 1", "Lambda"),
    ("floor(H, base=2)", "Call"),
    ("sqrt(H)", "Call"),
    ("H if W else N", "IfExp"),
    ("H < W", "Compare"),
    ("H // 2", "FloorDiv"),
    ("2**H", "power of a number"),
    ("10**10**10", "power of a number"),
    ("H**17", "exponent"),
    ("H**W", "exponent"),
    ("(H**16)**16", "or of a power"),
    ("((" + "9" * 40 + ")**16)**16", "power of a number"),
    ("1" * 4301, "not an expression|digits"),
    ("H/0", "division by zero"),
    ("Mod(H, 0)", "Mod by zero"),
    ("floor(H, W)", "floor with 2"),
    ("H +", "not an expression"),
    ("(" * 50_000 + "H" + ")" * 50_000, "nested|not an expression"),
])
def test_anything_outside_the_grammar_is_refused(text, why):
    with pytest.raises(ExpressionError, match=why):
        parse(text)


def test_length_is_bounded(monkeypatch):
    monkeypatch.setattr(expressions, "MAX_CHARS", 10)
    with pytest.raises(ExpressionError, match="characters"):
        parse("H + W + N_ + 1")
    with pytest.raises(ExpressionError, match="expected an expression string"):
        parse(12)
