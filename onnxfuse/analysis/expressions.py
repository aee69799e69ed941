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
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import sympy

#: Longest expression text accepted, in characters. The largest that onnxfuse writes for the shared real models
#: is under 2,000; a report's expressions are sums over nodes, so a model 100x larger still fits.
MAX_CHARS = 200_000

#: Largest absolute exponent of ``**`` (the largest onnxfuse writes is 2 or 3: a volume of three dims). It keeps
#: ``10**10**10`` from making sympy build a number with 10^10 digits.
MAX_EXPONENT = 16

#: Most digits of one number literal (byte counts of the largest models have 13).
MAX_DIGITS = 40

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
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise ExpressionError(f"not an expression ({type(exc).__name__})") from None
    try:
        return _Builder(symbols or {}).build(tree.body)
    except RecursionError:
        raise ExpressionError("expression nested too deeply") from None


class _Builder:
    """Turns an allow-listed Python syntax tree into a sympy expression (node kinds: see :func:`parse`)."""

    def __init__(self, symbols: dict[str, sympy.Symbol]):
        import sympy

        self.sympy = sympy
        self.symbols = dict(symbols)
        self.functions = {name: getattr(sympy, name) for name in _FUNCTIONS}

    def build(self, node: ast.AST) -> sympy.Expr:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return self._number(node.value)
        if isinstance(node, ast.Name):
            return self._symbol(node.id)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            value = self.build(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp):
            left = self.build(node.left)
            if isinstance(node.op, ast.Pow):
                # onnxfuse writes powers of dims only (H**2): a power of a number or of a power would let a short
                # text build a number of millions of digits ((9**16)**16...)
                if left.is_number or (isinstance(node.left, ast.BinOp) and isinstance(node.left.op, ast.Pow)):
                    raise ExpressionError("a power of a number or of a power is not a byte expression")
                return left ** self._exponent(node.right)
            right = self.build(node.right)
            if isinstance(node.op, ast.Add):
                return left + right
            if isinstance(node.op, ast.Sub):
                return left - right
            if isinstance(node.op, ast.Mult):
                return left * right
            if isinstance(node.op, ast.Div):
                if right == 0:
                    raise ExpressionError("division by zero")
                return left / right
            raise ExpressionError(f"operator {type(node.op).__name__} is not allowed")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in self.functions \
                and not node.keywords and node.args:
            args = [self.build(a) for a in node.args]
            name = node.func.id
            if (name in ("floor", "ceiling") and len(args) != 1) or (name == "Mod" and len(args) != 2):
                raise ExpressionError(f"{name} with {len(args)} arguments")
            if name == "Mod" and args[1] == 0:
                raise ExpressionError("Mod by zero")
            return self.functions[name](*args)
        raise ExpressionError(f"{type(node).__name__} is not allowed in a byte expression")

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
