"""Symbolic tensor shapes: every dim as a sympy expression in the model's own symbolic input dims.

onnxruntime's ``SymbolicShapeInference`` (``onnxruntime/python/tools/symbolic_shape_infer.py``) does the work:
it derives output dims such as ``floor((H - 1)/2) + 1`` for a strided Conv and follows shape arithmetic
(Shape -> Gather -> Concat -> Reshape) with sympy. It runs on the weight-stripped skeleton
(:func:`onnxfuse.model.proto.skeleton`), so it costs what the graph structure costs, not what the weights weigh.
This module adds what the report needs on top:

* **Symbols.** Each symbolic dim of a graph input becomes one sympy symbol (integer, positive), named after the
  model's ``dim_param`` made a valid identifier (``p2o.DynamicDimension.0`` -> ``p2o_DynamicDimension_0``);
  inputs that share a ``dim_param`` share the symbol. Dims stored as ``dim_value: -1``/``0`` or left empty get
  a name from the input and axis (``x_2``). :func:`symbol_table` records where each symbol comes from.
* **Unknown, never guessed.** A dim that inference had to invent (the output length of NonZero, the trip
  count of a Loop, the output of an If whose branches give different shapes) is a symbol that is not an input
  symbol; such tensors are unknown and :attr:`SymbolicShapes.reasons` says why. When onnxruntime's inference
  cannot finish, the rest falls back to ``onnx.shape_inference`` dims (numbers and input dim names only).
* **Ops it lacks.** ConvTranspose (output size from the ONNX ConvTranspose spec, "output_shape" section), Pad
  with an ``axes`` input (ONNX Pad-18),
  Upsample, Resize by scales without sympy's slow ``simplify``, and If branches of different rank
  (:mod:`onnxfuse.analysis.ort_symbolic`, the only module that touches onnxruntime's class).
* **No side effects.** ``SymbolicShapeInference.infer_shapes`` writes ``sym_shape_infer_temp.onnx`` into the
  working directory when it stops early; :func:`onnxfuse.analysis.ort_symbolic.run` drives the class itself and
  writes nothing.
"""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import onnx

from onnxfuse.analysis import ort_symbolic
from onnxfuse.model import proto
from onnxfuse.model.proto import is_placeholder_dim, proto_graphs

if TYPE_CHECKING:
    import sympy

# sympy (about 0.5 s to import) is imported inside the functions that need it: a model whose dims are all
# numbers gets plain ``int`` byte counts (:func:`static_shapes`) and never imports it.

#: Ops whose output size depends on the values of their inputs, not only on shapes.
DATA_DEPENDENT_OPS = {"NonZero", "NonMaxSuppression", "Unique", "Compress", "TopK", "Range", "ConstantOfShape",
                      "Reshape", "Expand", "Tile", "Resize", "Upsample", "Slice", "Pad", "OneHot", "StringSplit"}

#: Names sympy parses as something other than a plain symbol (functions, constants) in the strings that
#: onnxruntime's inference writes; a dim named like one of them gets a trailing underscore.
_RESERVED = {"floor", "ceiling", "Mod", "Max", "Min", "Piecewise", "Eq", "Ne", "And", "Or", "Not", "sqrt",
             "Abs", "sign", "N", "S", "E", "I", "O", "Q", "pi", "oo", "nan", "zoo", "beta", "gamma", "zeta",
             "lambda", "Symbol", "Integer", "Rational", "Float", "true", "false", "Function", "Lambda"}


def make_symbol(name: str) -> sympy.Symbol:
    """The sympy symbol of an input dim: integer and positive (a tensor dim of a run is at least 1)."""
    import sympy

    return sympy.Symbol(name, integer=True, positive=True)


def _plain_symbol(name: str) -> bool:
    """True when ``sympy.sympify(name)`` reads ``name`` as a plain symbol (not ``sequence``, ``N``, ``E``...)."""
    import sympy

    try:
        got = sympy.sympify(name)
    except (sympy.SympifyError, SyntaxError, TypeError, ValueError, AttributeError):
        return False
    return isinstance(got, sympy.Symbol) and got.name == name


def _identifier(text: str, taken: set[str]) -> str:
    name = re.sub(r"\W", "_", text, flags=re.ASCII) or "dim"
    if name[0].isdigit():
        name = f"d_{name}"
    if keyword.iskeyword(name) or name in _RESERVED or not _plain_symbol(name):
        name += "_"
    base, n = name, 1
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    taken.add(name)
    return name


@dataclass
class SymbolTable:
    """The symbols of a model's graph inputs.

    Attributes:
        symbols: symbol name -> ``{"input": graph input name, "axis": K, "dim_param": model's name or None}``
            (the first input and axis where the dim appears).
        dims: ``(input name, axis)`` -> symbol name, for every symbolic input dim.
    """

    symbols: dict[str, dict] = field(default_factory=dict)
    dims: dict[tuple[str, int], str] = field(default_factory=dict)

    def sympy_symbols(self) -> dict[str, sympy.Symbol]:
        """Symbol name -> sympy symbol (as :func:`make_symbol` makes it)."""
        return {name: make_symbol(name) for name in self.symbols}

    def int_values(self, input_shapes: dict[str, tuple[int, ...]]) -> dict[str, int]:
        """Symbol name -> size bound by concrete ``input_shapes`` (input name -> dims), without sympy."""
        out = {}
        for (inp, axis), name in self.dims.items():
            dims = input_shapes.get(inp)
            if dims is not None and axis < len(dims):
                out[name] = int(dims[axis])
        return out

    def values(self, input_shapes: dict[str, tuple[int, ...]]) -> dict[sympy.Symbol, int]:
        """Symbol -> size bound by concrete ``input_shapes`` (input name -> dims)."""
        out = {}
        for (inp, axis), name in self.dims.items():
            dims = input_shapes.get(inp)
            if dims is not None and axis < len(dims):
                import sympy

                out[make_symbol(name)] = sympy.Integer(int(dims[axis]))
        return out


def symbol_table(model: onnx.ModelProto) -> SymbolTable:
    """One symbol per symbolic dim of the graph inputs of ``model`` (initializers excluded), see the module
    docstring for the naming."""
    table, taken, by_param = SymbolTable(), set[str](), dict[str, str]()
    inits = {t.name for t in model.graph.initializer}
    for vi in model.graph.input:
        tt = vi.type.tensor_type
        if vi.name in inits or not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
            continue
        for axis, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value") and d.dim_value > 0:
                continue
            if d.dim_param and not is_placeholder_dim(d.dim_param):  # "?" and the like: one symbol per dim
                if d.dim_param not in by_param:
                    by_param[d.dim_param] = _identifier(d.dim_param, taken)
                    table.symbols[by_param[d.dim_param]] = {"input": vi.name, "axis": axis, "dim_param": d.dim_param}
                table.dims[(vi.name, axis)] = by_param[d.dim_param]
            else:
                name = _identifier(f"{vi.name}_{axis}", taken)
                table.symbols[name] = {"input": vi.name, "axis": axis, "dim_param": None}
                table.dims[(vi.name, axis)] = name
    return table


# Results


@dataclass
class SymbolicShapes:
    """Shapes of the tensors of a model as sympy expressions in the input symbols.

    Attributes:
        table: the input symbols.
        shapes: tensor name -> tuple of dims (``sympy.Expr`` in the input symbols, or None for a dim whose
            size is unknown), or None when even the rank is unknown.
        elem_types: tensor name -> ONNX ``TensorProto.DataType``.
        reasons: tensor name -> why its size is unknown (only for tensors with an unknown dim).
        assumptions: dims that onnxruntime's inference assumed equal (where an elementwise op or MatMul
            combines two tensors, the model can only run when they are), as ``"a == b"`` strings (sides and
            list sorted, so the same model always gives the same list).
        failure: why onnxruntime's inference stopped early ('' when it finished).
        at_input_shapes: the shapes are ``int`` dims at the input shapes given (``onnx.shape_inference`` with
            those shapes applied), not expressions; ``table`` is then empty (the dims are fixed).
    """

    table: SymbolTable
    shapes: dict[str, tuple | None]
    elem_types: dict[str, int]
    reasons: dict[str, str]
    assumptions: list[str]
    failure: str = ""
    at_input_shapes: bool = False


def _prepare(skel: onnx.ModelProto, table: SymbolTable) -> onnx.ModelProto:
    """A copy of ``skel`` whose input dims carry the symbol names and without stale value_info."""
    out = onnx.ModelProto()
    out.CopyFrom(skel)
    renames = {}
    for vi in out.graph.input:
        if not vi.type.HasField("tensor_type"):
            continue
        for axis, d in enumerate(vi.type.tensor_type.shape.dim):
            name = table.dims.get((vi.name, axis))
            if name is not None:
                if d.dim_param and not is_placeholder_dim(d.dim_param):
                    renames[d.dim_param] = name
                d.Clear()
                d.dim_param = name
    for graph, _ in proto_graphs(out.graph):
        del graph.value_info[:]
        for vi in graph.output:
            if vi.type.HasField("tensor_type"):
                for d in vi.type.tensor_type.shape.dim:
                    if d.dim_param:
                        if d.dim_param in renames:
                            d.dim_param = renames[d.dim_param]
                        else:
                            d.Clear()
    return out


def _reason(op: str, name: str) -> str:
    where = f"{op} {name}".strip()
    if op == "Loop":
        return f"{where}: the trip count is known only at run time"
    if op == "If":
        return f"{where}: the branch taken depends on run-time values and the branches give different shapes"
    if op in DATA_DEPENDENT_OPS:
        return f"{where}: its output size depends on the values of its inputs"
    return f"{where}: shape inference cannot derive its output size"


def derived_shapes(skel: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, tuple]]:
    """A copy of ``skel`` without declared shapes (:func:`onnxfuse.model.proto.strip_declared_shapes`) and what
    ``onnx.shape_inference`` derives for it (:func:`onnxfuse.analysis.shapes.infer`): shapes computed from the inputs
    and the ops, never taken from a ``value_info`` or graph output the model merely states."""
    from onnxfuse.analysis import shapes

    derived = onnx.ModelProto()
    derived.CopyFrom(skel)
    proto.strip_declared_shapes(derived)
    return derived, shapes.infer(derived)[0]


def static_shapes(skel: onnx.ModelProto, info: dict[str, tuple] | None, table: SymbolTable
                  ) -> SymbolicShapes | None:
    """The shapes of a model with no symbolic dim, as plain ``int`` tuples, when ``info`` (tensor name ->
    ``(shape, dtype)`` from :func:`onnxfuse.analysis.shapes.infer` on ``skel``, i.e. ``onnx.shape_inference`` with data
    propagation; see :func:`derived_shapes`) gives every node input and output of every graph of ``skel`` a
    shape of numbers. None otherwise: then only onnxruntime's inference can say more, and :func:`infer` runs it.

    On such a model onnxruntime's inference has nothing symbolic to derive; this path gives the same numbers
    without importing sympy (about 0.5 s) or onnxruntime's inference (its cost grows with the node count).
    """
    if table.symbols or info is None:
        return None
    shapes: dict[str, tuple | None] = {}
    for name, (shape, _) in info.items():
        if shape is not None and all(type(d) is int and d >= 0 for d in shape):
            shapes[name] = shape
    for graph, _ in proto_graphs(skel.graph):
        for node in graph.node:
            for name in (*node.input, *node.output):
                if name and name not in shapes:
                    return None
    return SymbolicShapes(table, shapes, {}, {}, [])


def infer(skel: onnx.ModelProto, fallback: dict[str, tuple] | None = None) -> SymbolicShapes:
    """Symbolic shapes of every tensor of ``skel`` (a :func:`onnxfuse.model.proto.skeleton`; not modified).

    ``fallback`` (tensor name -> ``(shape, dtype)`` as :func:`onnxfuse.analysis.shapes.infer` returns) supplies the
    tensors that onnxruntime's inference leaves out; its named dims count only when they are input dims.
    A model without symbolic dims whose every tensor ``onnx.shape_inference`` sizes from the ops alone
    (:func:`derived_shapes`) gets those shapes (:func:`static_shapes`: ``int`` dims, no sympy, no onnxruntime).
    Never raises for a model onnx can load: an inference failure leaves tensors unknown, with the reason.
    """
    table = symbol_table(skel)
    if not table.symbols:
        static = static_shapes(*derived_shapes(skel), table)
        if static is not None:
            return static
    import sympy

    syms = table.sympy_symbols()
    failure, inferred, merges = ort_symbolic.run(_prepare(skel, table))
    shapes, elem = _inferred_shapes(inferred, syms) if inferred is not None else ({}, {})
    for name, (shape, _) in (fallback or {}).items():
        known = shapes.get(name)
        if shape is not None and (known is None or None in known):
            shapes[name] = tuple(sympy.Integer(d) if isinstance(d, int) and d >= 0 else
                                 (_renamed_symbol(table, syms, d) if isinstance(d, str) else None) for d in shape)
    reasons: dict[str, str] = {}
    for graph, _ in proto_graphs(skel.graph):
        for node in graph.node:
            inherited = next((reasons[i] for i in node.input if i in reasons), None)
            for o in node.output:
                got = shapes.get(o)
                if o and (got is None or None in got):
                    reasons[o] = inherited or failure or _reason(node.op_type, node.name)
    # onnxruntime records each merge in whichever direction its set iteration met it (it varies with
    # PYTHONHASHSEED); "a == b" is symmetric, so print both sides and the list in a fixed order
    assumptions = sorted({" == ".join(sorted((str(a), str(b)))) for a, b in merges.items()})
    return SymbolicShapes(table, shapes, elem, reasons, assumptions, failure)


def _inferred_shapes(inferred: onnx.ModelProto, syms: dict[str, sympy.Symbol]
                     ) -> tuple[dict[str, tuple | None], dict[str, int]]:
    """``(tensor name -> shape, tensor name -> elem type)`` of every tensor value_info, input and output of every
    graph of ``inferred`` (onnxruntime's result). A dim is a sympy expression in the input symbols ``syms``, or
    None where onnxruntime invented a symbol, left the dim empty or wrote something sympy cannot read; a name
    met twice keeps its first shape unless that one has an unknown dim."""
    import sympy

    parse_cache: dict[str, sympy.Expr | None] = {}

    def parse(text: str) -> sympy.Expr | None:
        if text not in parse_cache:
            try:
                expr = sympy.sympify(text, locals=syms)
                parse_cache[text] = expr if isinstance(expr, sympy.Expr) else None
            except (sympy.SympifyError, SyntaxError, TypeError, ValueError, AttributeError):
                parse_cache[text] = None
        return parse_cache[text]

    inputs = set(syms.values())

    def dim_of(d: onnx.TensorShapeProto.Dimension) -> sympy.Expr | None:
        if d.HasField("dim_value"):
            return sympy.Integer(d.dim_value) if d.dim_value >= 0 else None
        if not d.dim_param:
            return None
        expr = parse(d.dim_param)
        return expr if expr is not None and expr.free_symbols <= inputs else None

    shapes: dict[str, tuple | None] = {}
    elem: dict[str, int] = {}
    for graph, _ in proto_graphs(inferred.graph):
        for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
            tt = vi.type.tensor_type
            if not vi.type.HasField("tensor_type") or not vi.name:
                continue
            if tt.elem_type:
                elem.setdefault(vi.name, tt.elem_type)
            shape = tuple(dim_of(d) for d in tt.shape.dim) if tt.HasField("shape") else None
            known = shapes.get(vi.name)
            if known is None or None in known:
                shapes[vi.name] = shape
    return shapes, elem


def _renamed_symbol(table: SymbolTable, syms: dict[str, sympy.Symbol], dim_param: str) -> sympy.Symbol | None:
    """The symbol (of ``syms``) that ``table`` made of the model's ``dim_param``, or None."""
    for name, info in table.symbols.items():
        if info["dim_param"] == dim_param:
            return syms.get(name)
    return None


# ---------------------------------------------------------------------------------------------------------------
# Expressions


def evaluate(expr: sympy.Expr | int | None, values: dict[sympy.Symbol, int]) -> int | None:
    """``expr`` at the symbol ``values`` as an int, or None when ``expr`` is None or a symbol is unbound."""
    if expr is None or isinstance(expr, int):
        return expr
    import sympy

    got = sympy.sympify(expr.xreplace(values) if values and expr.free_symbols else expr)
    return int(got) if got.is_Integer else None


def growth_share(part: sympy.Expr, whole: sympy.Expr) -> float | None:
    """Limit of ``part / whole`` as every symbol grows at the same rate: the ratio of their leading coefficients
    (floor and ceiling do not change it). Computed exactly at every symbol = 2**40 and checked at a second point
    with the symbols in other proportions; None when ``whole`` does not grow or the two disagree (the limit
    depends on the ratio of the symbols, say H against W), or when both are plain ints; either may be a plain
    int."""
    if type(part) is int and type(whole) is int:
        return None
    import sympy

    part, whole = sympy.sympify(part), sympy.sympify(whole)  # one side may be a plain int (a side of no symbol)
    symbols = sorted(whole.free_symbols | part.free_symbols, key=str)
    if not symbols:
        return None
    big = sympy.Integer(2) ** 40
    shares = []
    for point in ({s: big for s in symbols}, {s: big * (2 + i % 3) for i, s in enumerate(symbols)}):
        w, p = whole.xreplace(point), part.xreplace(point)
        if not (w.is_number and p.is_number) or w == 0:
            return None
        shares.append(float(p / w))
    if abs(shares[0] - shares[1]) > 1e-6:
        return None
    small = {s: sympy.Integer(1) for s in symbols}  # a whole that does not grow has no share "as dims grow"
    if whole.xreplace({s: big for s in symbols}) == whole.xreplace(small):
        return None
    return shares[0]


def _printer_class():
    from sympy.printing.str import StrPrinter

    class Printer(StrPrinter):
        """sympy's ``str()`` with each subexpression printed once: the same floor chains recur in every row."""

        def __init__(self) -> None:
            super().__init__()
            self._memo: dict[Any, str] = {}

        def _print(self, expr, **kwargs):
            if kwargs:
                return super()._print(expr, **kwargs)
            try:
                return self._memo[expr]
            except KeyError:
                text = self._memo[expr] = super()._print(expr)
                return text
            except TypeError:
                return super()._print(expr)

    return Printer


def printer():
    """A function that prints sympy expressions (and plain ints) as ``str()`` does, faster on many related
    expressions (keep one per report; it remembers what it printed). sympy is imported at the first
    expression that is not an int."""
    doprint = None

    def text(expr) -> str:
        nonlocal doprint
        if type(expr) is int:
            return str(expr)
        if doprint is None:
            doprint = _printer_class()().doprint
        return doprint(expr)

    return text
