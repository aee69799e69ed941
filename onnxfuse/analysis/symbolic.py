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
* **Ops it lacks.** ConvTranspose (output size from the ONNX ConvTranspose spec, "output_shape" section),
  Upsample, Resize by scales without sympy's slow ``simplify``, and If branches of different rank.
* **No side effects.** ``SymbolicShapeInference.infer_shapes`` writes ``sym_shape_infer_temp.onnx`` into the
  working directory when it stops early; this module drives the class itself and writes nothing.
"""

from __future__ import annotations

import contextlib
import keyword
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import onnx

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
    table, taken, by_param = SymbolTable(), set(), {}
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


# ---------------------------------------------------------------------------------------------------------------
# onnxruntime's SymbolicShapeInference, with the additions listed in the module docstring


def _ssi():
    from onnxruntime.tools import symbolic_shape_infer

    return symbolic_shape_infer


_STR_CACHE: dict = {}


def _str(expr) -> str:
    """``str(expr)``, cached: printing nested floor expressions is most of onnxruntime's inference time."""
    try:
        return _STR_CACHE[expr]
    except KeyError:
        text = _STR_CACHE[expr] = str(expr)
        return text
    except TypeError:  # unhashable
        return str(expr)


def _shape_from_sympy(sympy_shape):
    ssi = _ssi()
    return [None if i is None else (int(i) if ssi.is_literal(i) else _str(i)) for i in sympy_shape]


def _flat_rounding(expr):
    """``expr`` with each rounding of a rounding flattened: ``R(Q(y)/s + r)``, where ``R`` and ``Q`` are floor or
    ceiling, ``s`` a positive integer and ``n = s*r`` an integer, becomes ``Q((y + n + d)/s)`` with ``d = 0`` when
    ``R`` is ``Q``, ``s - 1`` for a ceiling of a floor, ``1 - s`` for a floor of a ceiling. The same value for
    every real ``y``: ``floor((floor(y) + n)/s) = floor((y + n)/s)`` for integers ``n`` and ``s > 0`` (likewise
    ceiling; Graham, Knuth, Patashnik, Concrete Mathematics, eq. 3.10), and for an integer ``m``,
    ``ceiling(m/s) = floor((m + s - 1)/s)``, ``floor(m/s) = ceiling((m - s + 1)/s)``. Inner roundings are
    flattened first (bottom-up), so a chain of strided convs and ceil-mode pools gives one rounding of
    ``H/2**k + c``, not ``k`` nested ones. Anything else (ints, other expressions) is returned as it is."""
    import sympy

    if not isinstance(expr, sympy.Expr) or not expr.has(sympy.floor, sympy.ceiling):
        return expr

    def flat(f):
        arg = f.args[0]
        rounded = [t for t in sympy.Add.make_args(arg) if t.has(sympy.floor, sympy.ceiling)]
        if len(rounded) != 1:
            return f
        coeff, inner = rounded[0].as_coeff_Mul()
        if not isinstance(inner, (sympy.floor, sympy.ceiling)) or not coeff.is_Rational or coeff.p != 1 \
                or coeff.q < 1:
            return f
        s, rest = coeff.q, arg - rounded[0]
        if not (rest * s).is_integer:
            return f
        delta = 0 if type(inner) is type(f) else (s - 1 if isinstance(f, sympy.ceiling) else 1 - s)
        return type(inner)(inner.args[0] / s + rest + sympy.Rational(delta, s))

    return expr.replace(lambda e: isinstance(e, (sympy.floor, sympy.ceiling)), flat)


def _inference_class():
    import sympy

    ssi = _ssi()

    class Inference(ssi.SymbolicShapeInference):
        """onnxruntime's inference with the additions of the module docstring."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.dispatcher_["ConvTranspose"] = self._infer_ConvTranspose
            self.dispatcher_["Upsample"] = self._infer_Upsample
            self.dispatcher_ = {op: self._guarded(fn) for op, fn in self.dispatcher_.items()}

        def _guarded(self, fn):
            """A node the inference cannot handle (an input of unexpected rank after an unknown If) gets new
            symbols for its output dims, which makes its size unknown, instead of ending the inference."""
            def run(node):
                try:
                    fn(node)
                except Exception:
                    for i, o in enumerate(node.output):
                        vi = self.known_vi_.get(o)
                        if not o or vi is None:
                            continue
                        tt = vi.type.tensor_type
                        if not tt.elem_type:
                            first = self.known_vi_.get(node.input[0]) if node.input else None
                            tt.elem_type = (first.type.tensor_type.elem_type if first is not None else 0) or \
                                onnx.TensorProto.FLOAT
                        for di, d in enumerate(tt.shape.dim if tt.HasField("shape") else []):
                            d.Clear()
                            d.dim_param = _str(self._new_symbolic_dim_from_output(node, i, di))
            return run

        def _add_suggested_merge(self, symbols, apply=False):
            # onnxruntime keeps the first dim of a set() in iteration order, which changes with PYTHONHASHSEED,
            # and so did the report's expressions. The same preference (a number, an input dim, a plain symbol,
            # the shortest expression), with ties broken in a fixed order: input dims as the graph inputs list
            # them, else by name.
            if not hasattr(self, "input_order_"):
                dims = (d.dim_param for vi in self.out_mp_.graph.input
                        for d in vi.type.tensor_type.shape.dim if d.dim_param)
                self.input_order_ = {name: i for i, name in enumerate(dict.fromkeys(dims))}

            def rank(dim):
                if ssi.is_literal(dim):
                    return 0, 0, str(dim)
                if dim in self.input_symbols_:
                    return 1, self.input_order_.get(dim, len(self.input_order_)), dim
                if type(self.symbolic_dims_[dim]) is sympy.Symbol:
                    return 2, 0, dim
                return 3, len(dim), dim

            symbols = {self.suggested_merge_.get(d, d) if not ssi.is_literal(d) else d for d in symbols}
            ordered = sorted(symbols, key=rank)
            keep = ordered[0]
            for dim in ordered[1:]:
                if ssi.is_literal(keep) and ssi.is_literal(dim):
                    assert int(keep) == int(dim)
                self.suggested_merge_[dim] = int(keep) if ssi.is_literal(keep) else keep
                for k, v in self.suggested_merge_.items():
                    if v == dim:
                        self.suggested_merge_[k] = keep
            if apply and self.auto_merge_:
                self._apply_suggested_merge()

        def _onnx_infer_single_node(self, node):
            # Merge the dims that a broadcasting op requires equal *before* onnx infers it (onnxruntime does it
            # only from the second pass on): each late merge restarts the whole inference.
            if node.op_type in ("Add", "Sub", "Mul", "Div", "Where", "Sum") and node.output[0] not in self.known_vi_:
                in_shapes = [self._try_get_shape(node, i) for i in range(len(node.input))]
                if in_shapes and all(s is not None for s in in_shapes):
                    rank = max(len(s) for s in in_shapes)
                    for d in range(rank):
                        dims = [s[len(s) - rank + d] for s in in_shapes if len(s) + d >= rank]
                        if len(dims) > 1:
                            self._check_merged_dims(dims, allow_broadcast=True)
            try:
                super()._onnx_infer_single_node(node)
            except Exception:
                for o in node.output:
                    if o and o not in self.known_vi_:
                        vi = self.out_mp_.graph.value_info.add()
                        vi.name = o
                        self.known_vi_[o] = vi

        def _update_computed_dims(self, new_sympy_shape):
            for i, new_dim in enumerate(new_sympy_shape):
                if not ssi.is_literal(new_dim) and not isinstance(new_dim, str):
                    text = _str(new_dim)
                    if text in self.suggested_merge_:
                        merged = self.suggested_merge_[text]
                        new_sympy_shape[i] = sympy.Integer(int(merged)) if ssi.is_literal(merged) else \
                            self.symbolic_dims_[merged]
                    elif text not in self.symbolic_dims_:
                        self.symbolic_dims_[text] = new_dim

        def _infer_Constant(self, node):
            t = ssi.get_attribute(node, "value")
            if t is not None and _has_data(t):  # the skeleton leaves large weights without data
                super()._infer_Constant(node)

        def _get_value(self, node, idx):
            name = node.input[idx]
            if name not in self.sympy_data_ and name in self.initializers_ and \
                    not _has_data(self.initializers_[name]):
                raise _StrippedValue(name)
            return super()._get_value(node, idx)

        def _try_get_value(self, node, idx):
            try:
                return super()._try_get_value(node, idx)
            except _StrippedValue:
                return None

        def _set_output(self, node, sympy_shape):
            self._update_computed_dims(sympy_shape)
            vi = self.known_vi_[node.output[0]]
            vi.CopyFrom(onnx.helper.make_tensor_value_info(
                node.output[0], self.known_vi_[node.input[0]].type.tensor_type.elem_type,
                _shape_from_sympy(sympy_shape)))

        def _compute_conv_pool_shape(self, node, channels_last=False):
            # onnxruntime nests one rounding per strided Conv/Pool (floor(floor(H/2 - 1/2)/2) + 1 ...): flattened,
            # a chain's expressions keep a fixed size instead of growing with its depth
            return [_flat_rounding(d) for d in super()._compute_conv_pool_shape(node, channels_last)]

        def _infer_ConvTranspose(self, node):
            # ONNX ConvTranspose: out[i] = stride[i] * (in[i] - 1) + output_padding[i]
            #   + ((kernel[i] - 1) * dilation[i] + 1) - pad_begin[i] - pad_end[i]; SAME_*: in[i] * stride[i]
            x, w = self._get_sympy_shape(node, 0), self._get_sympy_shape(node, 1)
            rank = len(x) - 2
            get = ssi.get_attribute
            strides, dilations = get(node, "strides", [1] * rank), get(node, "dilations", [1] * rank)
            kernel = get(node, "kernel_shape", w[2:])
            out_pad, pads = get(node, "output_padding", [0] * rank), get(node, "pads", [0] * (2 * rank))
            out_shape, auto_pad = get(node, "output_shape"), get(node, "auto_pad", b"NOTSET").decode()
            out = [x[0], w[1] * get(node, "group", 1)]
            for i in range(rank):
                if out_shape:
                    out.append(sympy.Integer(out_shape[-rank + i]))
                elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
                    out.append(x[2 + i] * strides[i])
                else:
                    total_pad = 0 if auto_pad == "VALID" else pads[i] + pads[i + rank]
                    out.append(strides[i] * (x[2 + i] - 1) + out_pad[i] + (kernel[i] - 1) * dilations[i] + 1
                               - total_pad)
            self._set_output(node, out)

        def _scaled(self, node, scales):
            # ONNX Resize/Upsample: out[i] = floor(in[i] * scale[i]); exact rationals, no simplify()
            x = self._get_sympy_shape(node, 0)
            return [sympy.floor(d * sympy.Rational(repr(float(s)))) for d, s in zip(x, scales, strict=False)]

        def _infer_Upsample(self, node):
            scales = ssi.get_attribute(node, "scales") or self._try_get_value(node, 1)
            if scales is None or len(scales) != len(self._get_shape(node, 0)):
                self._set_output(node, self._new_symbolic_shape(self._get_shape_rank(node, 0), node))
            else:
                self._set_output(node, self._scaled(node, scales))

        def _infer_Resize(self, node):
            old = ssi.get_opset(self.out_mp_) <= 10
            scales = self._try_get_value(node, 1 if old else 2)
            sizes = None if old else self._try_get_value(node, 3)
            crop = ssi.get_attribute(node, "coordinate_transformation_mode") == b"tf_crop_and_resize"
            if sizes is None and scales is not None and len(scales) and not crop:
                self._set_output(node, self._scaled(node, scales))
            else:
                super()._infer_Resize(node)

        def _fuse_tensor_type(self, node, out_idx, dst_type, src_type):
            # If branches: outputs of different rank leave even the rank unknown; an untyped one takes the other
            kinds = (dst_type.WhichOneof("value"), src_type.WhichOneof("value"))
            if kinds == ("tensor_type", "tensor_type") and dst_type.tensor_type.HasField("shape") and \
                    src_type.tensor_type.HasField("shape") and \
                    len(dst_type.tensor_type.shape.dim) != len(src_type.tensor_type.shape.dim):
                dst_type.tensor_type.ClearField("shape")  # not even the rank is known
                return
            if None in kinds:
                if kinds[0] is None:
                    dst_type.CopyFrom(src_type)
                return
            super()._fuse_tensor_type(node, out_idx, dst_type, src_type)

    return Inference


class _StrippedValue(Exception):
    """An initializer value was asked for that the skeleton does not carry."""


def _has_data(t: onnx.TensorProto) -> bool:
    if t.data_location == onnx.TensorProto.EXTERNAL:
        return False
    fields = ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data")
    return any(len(getattr(t, f)) for f in fields) or 0 in t.dims


class _SympyWithoutSimplify:
    """The ``sympy`` module as onnxruntime's inference sees it, with ``simplify`` doing nothing: it only tidies
    slice lengths and resize sizes (the value is the same), and its first call imports ``sympy.physics`` (about
    1.5 s). Every other name is sympy's own."""

    @staticmethod
    def simplify(expr, *args, **kwargs):
        return expr

    def __getattr__(self, name):
        import sympy

        return getattr(sympy, name)


@contextlib.contextmanager
def _patched():
    """Make onnxruntime's inference use :func:`_inference_class` for subgraphs too (it builds them by the
    module-level name), the cached printer and no ``simplify``. Not thread-safe: inference runs one at a
    time."""
    ssi = _ssi()
    saved = ssi.SymbolicShapeInference, ssi.get_shape_from_sympy_shape, ssi.sympy
    ssi.SymbolicShapeInference, ssi.get_shape_from_sympy_shape = _inference_class(), _shape_from_sympy
    ssi.sympy = _SympyWithoutSimplify()
    try:
        yield ssi.SymbolicShapeInference
    finally:
        ssi.SymbolicShapeInference, ssi.get_shape_from_sympy_shape, ssi.sympy = saved
        _STR_CACHE.clear()


# ---------------------------------------------------------------------------------------------------------------
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
    """

    table: SymbolTable
    shapes: dict[str, tuple | None]
    elem_types: dict[str, int]
    reasons: dict[str, str]
    assumptions: list[str]
    failure: str = ""


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
    shapes: dict[str, tuple] = {}
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
    prepared = _prepare(skel, table)
    failure, inferred, merges = "", None, {}
    with _patched() as cls:
        engine = cls(2**31 - 1, True, True, 0)
        try:
            opset = _ssi().get_opset(prepared)
            if not opset or opset < 7:
                failure = "onnxruntime's symbolic shape inference needs opset 7 or later"
            else:
                engine._preprocess(prepared)
                finished = False
                while engine.run_:
                    finished = engine._infer_impl()
                engine._update_output_from_vi()
                if not finished:
                    failure = "onnxruntime's symbolic shape inference stopped before the end of the graph"
            inferred, merges = engine.out_mp_, dict(engine.suggested_merge_)
        except Exception as exc:  # onnxruntime's inference asserts on models it does not understand
            failure = f"onnxruntime's symbolic shape inference failed ({type(exc).__name__}: {exc})"[:300]
            inferred = getattr(engine, "out_mp_", None)
    parse_cache: dict[str, sympy.Expr | None] = {}

    def parse(text: str):
        if text not in parse_cache:
            try:
                expr = sympy.sympify(text, locals=syms)
                parse_cache[text] = expr if isinstance(expr, sympy.Expr) else None
            except (sympy.SympifyError, SyntaxError, TypeError, ValueError, AttributeError):
                parse_cache[text] = None
        return parse_cache[text]

    inputs = set(syms.values())

    def dim_of(d):
        if d.HasField("dim_value"):
            return sympy.Integer(d.dim_value) if d.dim_value >= 0 else None
        if not d.dim_param:
            return None
        expr = parse(d.dim_param)
        return expr if expr is not None and expr.free_symbols <= inputs else None

    shapes: dict[str, tuple | None] = {}
    elem: dict[str, int] = {}
    if inferred is not None:
        for graph, _ in proto_graphs(inferred.graph):
            for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
                tt = vi.type.tensor_type
                if not vi.type.HasField("tensor_type") or not vi.name:
                    continue
                if tt.elem_type:
                    elem.setdefault(vi.name, tt.elem_type)
                shape = tuple(dim_of(d) for d in tt.shape.dim) if tt.HasField("shape") else None
                if vi.name not in shapes or shapes[vi.name] is None or None in shapes[vi.name]:
                    shapes[vi.name] = shape
    for name, (shape, _) in (fallback or {}).items():
        if shape is not None and (shapes.get(name) is None or None in shapes[name]):
            shapes[name] = tuple(sympy.Integer(d) if isinstance(d, int) and d >= 0 else
                                 (syms.get(_renamed(table, d)) if isinstance(d, str) else None) for d in shape)
    reasons: dict[str, str] = {}
    for graph, _ in proto_graphs(skel.graph):
        for node in graph.node:
            inherited = next((reasons[i] for i in node.input if i in reasons), None)
            for o in node.output:
                if o and (shapes.get(o) is None or None in shapes[o]):
                    reasons[o] = inherited or failure or _reason(node.op_type, node.name)
    # onnxruntime records each merge in whichever direction its set iteration met it (it varies with
    # PYTHONHASHSEED); "a == b" is symmetric, so print both sides and the list in a fixed order
    assumptions = sorted({" == ".join(sorted((str(a), str(b)))) for a, b in merges.items()})
    return SymbolicShapes(table, shapes, elem, reasons, assumptions, failure)


def _renamed(table: SymbolTable, dim_param: str) -> str | None:
    for name, info in table.symbols.items():
        if info["dim_param"] == dim_param:
            return name
    return None


# ---------------------------------------------------------------------------------------------------------------
# Expressions


def evaluate(expr: sympy.Expr | int | None, values: dict[sympy.Symbol, int]) -> int | None:
    """``expr`` at the symbol ``values`` as an int, or None when ``expr`` is None or a symbol is unbound."""
    if expr is None or type(expr) is int:
        return expr
    import sympy

    got = sympy.sympify(expr.xreplace(values) if values and expr.free_symbols else expr)
    return int(got) if got.is_Integer else None


def growth_share(part: sympy.Expr, whole: sympy.Expr) -> float | None:
    """Limit of ``part / whole`` as every symbol grows at the same rate: the ratio of their leading coefficients
    (floor and ceiling do not change it). Computed exactly at every symbol = 2**40 and checked at a second point
    with the symbols in other proportions; None when ``whole`` does not grow or the two disagree (the limit
    depends on the ratio of the symbols, say H against W), or when both are plain ints."""
    if type(part) is int and type(whole) is int:
        return None
    import sympy

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

        def __init__(self):
            super().__init__()
            self._memo: dict = {}

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
