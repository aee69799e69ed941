"""Read byte expressions back from a JSON report without evaluating code.

A report's ``*_expr`` strings are sympy's ``str()`` of byte counts in the model's symbolic input dims, for example
``512*B*(floor(H/2 - 1/2) + 1) + 4096``. A report read back (``report --baseline OLD.json``) is an artifact a CI job
downloads from an earlier run: untrusted input. ``sympy.sympify`` and ``sympy.parse_expr`` run Python's ``eval`` on
their input (sympy documentation, "sympify": "it uses eval ... don't use it on unsanitized input"), so they are never
given such text. :func:`parse` instead reads it with Python's own parser (:func:`ast.parse`, which builds a syntax
tree and runs nothing) and builds the sympy expression from an allow-list of node kinds: the grammar onnxfuse writes.

Grammar (Python expression syntax): integer and decimal numbers; names (each a symbol); ``+ - * /`` and ``**``
(the exponent a small integer constant); parentheses; calls of ``floor``, ``ceiling``, ``Max``, ``Min`` and ``Mod``.
Anything else (attributes, subscripts, strings, keywords, lambdas, other calls, comparisons) is refused.

Work is bounded as well as length: an expression whose expansion could exceed :data:`MAX_TERMS` terms (plus one per
character) is refused while it is read, before sympy builds or expands anything of that size.
"""

from __future__ import annotations

import ast
import math
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import sympy

#: Longest expression text accepted, in characters. The largest that onnxfuse writes for the shared real models
#: is under 2,000; a report's expressions are sums over nodes, so a model 100x larger still fits.
MAX_CHARS = 200_000

#: Largest absolute exponent of ``**`` (the largest onnxfuse writes is 2 or 3: a volume of three dims). It keeps
#: ``10**10**10`` from making sympy build a number with 10^10 digits.
MAX_EXPONENT = 16

#: Most digits of one number literal: Python's own limit for converting an int to and from text
#: (``sys.int_info.default_max_str_digits``, 4300), which sympy's ``str()`` of the report obeys too, so every number
#: onnxfuse writes fits. A chain of k stride-2 convs writes 2**k (``floor(H/2**k - 1/2**k)``): 0.3 k digits.
MAX_DIGITS = 4300

#: Work budget of one expression: at most this many terms plus one per character of its text, counted as the
#: terms the fully expanded expression could have (:func:`expanded_terms_bound`). ``sympy.expand`` (the baseline
#: gate) and the report's leading terms (which also drop floor and ceiling) cost about 0.2 ms per term they build, so
#: a short text whose expansion grows without limit (``(a+b+c+d+e+f+g+h)**16``: 245,157 terms) is refused before
#: any expansion; an expression onnxfuse writes is a sum of products of a few small sums, well inside the budget.
MAX_TERMS = 10_000

_FUNCTIONS = ("floor", "ceiling", "Max", "Min", "Mod")


class ExpressionError(ValueError):
    """The text is not a byte expression of the grammar in the module docstring (the message says why)."""


def parse(text: str, symbols: dict[str, sympy.Symbol] | None = None) -> sympy.Expr:
    """The sympy expression of a report's ``*_expr`` string, built without ``eval``.

    Args:
        text: the expression (see the module docstring for the grammar), at most :data:`MAX_CHARS` characters.
        symbols: name -> the sympy symbol to use for it; a name not given becomes
            ``onnxfuse.analysis.symbolic.make_symbol(name)`` (integer, positive), as the report's own symbols are.

    Returns:
        A ``sympy.Expr`` (a number for a constant expression).

    Raises:
        ExpressionError: ``text`` is not a str, too long, not Python expression syntax, nested too deeply, or uses
            something outside the grammar (its message names the first such part).
    """
    if not isinstance(text, str):
        raise ExpressionError(f"expected an expression string, got {type(text).__name__}")
    if len(text) > MAX_CHARS:
        raise ExpressionError(f"expression of {len(text)} characters (at most {MAX_CHARS})")
    terms = _top_level_terms(text)
    builder = _Builder(symbols or {}, MAX_TERMS + len(text))
    try:
        return builder.add(terms)[0] if len(terms) > 1 else builder.build(terms[0][0])[0]
    except RecursionError:
        raise ExpressionError("expression nested too deeply") from None


def _top_level_terms(text: str) -> list[tuple[ast.AST, bool]]:
    """The terms of ``text``'s outermost sum, each parsed on its own (``ast.parse``), with True for a subtracted
    one. Python's parser nests ``a + b + ...`` one level per term and gives up (RecursionError) past about 2,500
    of them, a sum onnxfuse can write for a large model; split at the ``+``/``-`` outside parentheses that
    follow an operand (not a sign, not the ``e-5`` of a number), it reads any number of terms.

    Raises:
        ExpressionError: a term is not Python expression syntax (the whole is not an expression).
    """
    pieces: list[tuple[str, bool]] = []
    depth, start, negative = 0, 0, False
    for i, ch in enumerate(text):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch in "+-" and depth == 0:
            before = text[start:i].rstrip()
            if before and (before[-1].isalnum() or before[-1] in "_).") and not _EXPONENT_MARK.search(before):
                pieces.append((text[start:i], negative))
                start, negative = i + 1, ch == "-"
    pieces.append((text[start:], negative))
    out: list[tuple[ast.AST, bool]] = []
    for piece, minus in pieces:
        try:
            out.append((ast.parse(piece.strip(), mode="eval").body, minus))
        except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
            raise ExpressionError(f"not an expression ({type(exc).__name__})") from None
    return out


#: The end of a number's mantissa before its exponent sign (``1.5e`` of ``1.5e-5``): a ``-`` there is no term's.
_EXPONENT_MARK = re.compile(r"(?:^|[^A-Za-z0-9_.])(?:[0-9]+\.?[0-9]*|\.[0-9]+)[eE]$")


def expanded_terms_bound(text: str) -> int:
    """An upper bound on the number of terms of ``sympy.expand`` of the expression ``text`` (floor and ceiling
    counted as their arguments' terms, so that it also bounds the expansion with them dropped), plus the terms of
    every function's arguments (expanded too): the work budget :func:`parse` checks.

    Raises:
        ExpressionError: as :func:`parse` (the count itself is not limited here).
    """
    if not isinstance(text, str) or len(text) > MAX_CHARS:
        parse(text)  # raises the same one-line error as parse
    parts = _top_level_terms(text)
    builder = _Builder({}, None)
    try:
        terms = builder.add(parts)[1] if len(parts) > 1 else builder.build(parts[0][0])[1]
    except RecursionError:
        raise ExpressionError("expression nested too deeply") from None
    return terms + builder.work


def _check_digits(*numbers: sympy.Expr) -> None:
    """Refuse numbers whose sum or product could have more than :data:`MAX_DIGITS` digits (bounded by the sum of
    their numerators' and denominators' bits): what onnxfuse writes has no such number (sympy's ``str`` would not
    write it), and building it costs time quadratic in its digits.

    Raises:
        ExpressionError: the bound exceeds :data:`MAX_DIGITS` decimal digits.
    """
    bits = 0
    for number in numbers:
        if number.is_Rational:
            bits += int(number.p).bit_length() + int(number.q).bit_length()
    if bits > _MAX_BITS:
        raise ExpressionError(f"numbers that combine into one of more than {MAX_DIGITS} digits")


#: :data:`MAX_DIGITS` in bits (log2(10) = 3.3219... bits per decimal digit).
_MAX_BITS = int(MAX_DIGITS * 3.33)


class _Builder:
    """Turns an allow-listed Python syntax tree into a sympy expression (node kinds: see :func:`parse`), counting
    the terms each part could expand to (:func:`expanded_terms_bound`) before sympy builds it: a part past the
    budget is refused, so no intermediate result is ever large.

    ``build`` returns ``(expression, terms)``: the sympy expression and the bound on its expanded terms (a sum: the
    sum of its parts'; a product or quotient: their product; a power ``**n``: the multinomial count
    ``C(t + |n| - 1, |n|)`` of a ``t``-term base; floor and ceiling: their argument's; Max, Min and Mod: one term,
    their arguments' terms go to :attr:`work`, which the budget also counts)."""

    def __init__(self, symbols: dict[str, sympy.Symbol], budget: int | None):
        import sympy

        self.sympy = sympy
        self.symbols = dict(symbols)
        self.functions = {name: getattr(sympy, name) for name in _FUNCTIONS}
        self.budget = budget
        self.work = 0  # terms of every function's arguments (sympy.expand expands inside them too)

    def _check(self, terms: int) -> int:
        if self.budget is not None and terms + self.work > self.budget:
            raise ExpressionError(f"its expansion could have more than {self.budget} terms (the work budget of "
                                  f"{MAX_TERMS} terms plus one per character); not a byte expression onnxfuse writes")
        return terms

    def build(self, node: ast.AST) -> tuple[sympy.Expr, int]:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return self._number(node.value), 1
        if isinstance(node, ast.Name):
            return self._symbol(node.id), 1
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            value, terms = self.build(node.operand)
            return (-value if isinstance(node.op, ast.USub) else value), terms
        if isinstance(node, ast.BinOp):
            if isinstance(node.op, (ast.Add, ast.Sub)):
                return self._sum(node)
            left, lt = self.build(node.left)
            if isinstance(node.op, ast.Pow):
                # onnxfuse writes powers of dims only (H**2): a power of a number or of a power would let a short
                # text build a number of millions of digits ((9**16)**16...)
                if left.is_number or (isinstance(node.left, ast.BinOp) and isinstance(node.left.op, ast.Pow)):
                    raise ExpressionError("a power of a number or of a power is not a byte expression")
                exponent = self._exponent(node.right)
                return left ** exponent, self._check(math.comb(lt + abs(int(exponent)) - 1, abs(int(exponent))))
            if not isinstance(node.op, (ast.Mult, ast.Div)):
                raise ExpressionError(f"operator {type(node.op).__name__} is not allowed")
            right, rt = self.build(node.right)
            terms = self._check(lt * rt)
            # the coefficients multiply: each factor is checked before the next, so no product grows far past
            # the limit (a rational's normalization costs quadratic time in its digits)
            _check_digits(left.as_coeff_Mul()[0], right.as_coeff_Mul()[0])
            if isinstance(node.op, ast.Mult):
                return left * right, terms
            if right == 0:
                raise ExpressionError("division by zero")
            return left / right, terms
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in self.functions \
                and not node.keywords and node.args:
            built = [self.build(a) for a in node.args]
            args = [a for a, _ in built]
            name = node.func.id
            if (name in ("floor", "ceiling") and len(args) != 1) or (name == "Mod" and len(args) != 2):
                raise ExpressionError(f"{name} with {len(args)} arguments")
            if name == "Mod" and args[1] == 0:
                raise ExpressionError("Mod by zero")
            self.work += sum(t for _, t in built)
            # floor and ceiling count as their argument: the report's leading terms drop them, then expand
            return self.functions[name](*args), self._check(built[0][1] if name in ("floor", "ceiling") else 1)
        raise ExpressionError(f"{type(node).__name__} is not allowed in a byte expression")

    def _sum(self, node: ast.BinOp) -> tuple[sympy.Expr, int]:
        """A chain ``a + b - c + ...`` (Python parses it as a left-leaning tree, one level per term) as one sympy
        ``Add`` of all its terms: adding them one at a time would flatten the growing sum again at each step
        (quadratic in the number of terms) and recurse once per term."""
        right: list[tuple[ast.AST, bool]] = []
        spine: ast.AST = node
        while isinstance(spine, ast.BinOp) and isinstance(spine.op, (ast.Add, ast.Sub)):
            right.append((spine.right, isinstance(spine.op, ast.Sub)))
            spine = spine.left
        return self.add([(spine, False), *reversed(right)])

    def add(self, operands: list[tuple[ast.AST, bool]]) -> tuple[sympy.Expr, int]:
        """The sum of ``operands`` (each subtracted when its flag is True) as one sympy ``Add``, and its terms."""
        parts = []
        terms = 0
        for operand, negative in operands:
            value, t = self.build(operand)
            parts.append(-value if negative else value)
            terms = self._check(terms + t)
        # like terms (the same product of symbols) get one coefficient: the sum of theirs, whose denominator is at
        # most the product of their denominators; H/n1 + H/n2 + ... would build one of the digits of all of them
        like: dict[sympy.Expr, list[sympy.Expr]] = {}
        for part in parts:
            coefficient, rest = part.as_coeff_Mul()
            like.setdefault(rest, []).append(coefficient)
        for coefficients in like.values():
            if len(coefficients) > 1:
                _check_digits(*coefficients)
        return self.sympy.Add(*parts), terms

    def _number(self, value: int | float) -> sympy.Expr:
        if isinstance(value, float):
            if value != value or value in (float("inf"), float("-inf")):
                raise ExpressionError("a number that is not finite")
            return self.sympy.Float(value)
        if len(str(abs(value))) > MAX_DIGITS:
            raise ExpressionError(f"a number of more than {MAX_DIGITS} digits")
        return self.sympy.Integer(value)

    def _symbol(self, name: str) -> sympy.Symbol:
        found = self.symbols.get(name)
        if found is None:
            from onnxfuse.analysis.symbolic import make_symbol

            found = self.symbols[name] = make_symbol(name)
        return found

    def _exponent(self, node: ast.AST) -> sympy.Expr:
        sign = 1
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            sign, node = -1, node.operand
        if not (isinstance(node, ast.Constant) and type(node.value) is int and node.value <= MAX_EXPONENT):
            raise ExpressionError(f"an exponent other than an integer of at most {MAX_EXPONENT}")
        return self.sympy.Integer(sign * node.value)
