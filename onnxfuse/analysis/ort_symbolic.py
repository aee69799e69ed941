"""onnxruntime's ``SymbolicShapeInference`` (``onnxruntime/python/tools/symbolic_shape_infer.py``, a module
that is not part of onnxruntime's public API), driven and extended for :func:`onnxfuse.analysis.symbolic.infer`.

Everything here depends on that class's private state (``known_vi_``, ``suggested_merge_``, ``symbolic_dims_``,
``dispatcher_``...) and on its module-level names (``SymbolicShapeInference``, ``get_shape_from_sympy_shape``,
``sympy``, which :func:`_patched` replaces while :func:`run` runs); an onnxruntime release that changes them
breaks only this module. The additions (see :mod:`onnxfuse.analysis.symbolic`): ConvTranspose and Upsample
output sizes, Pad with an ``axes`` input (opset 18), Resize by scales without ``simplify``, If branches of
different rank, a node it cannot infer gets new symbols instead of ending the inference, merges in a fixed order,
and no file written.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import onnx

if TYPE_CHECKING:
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference as _Base
else:
    _Base = object


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


class _Additions(_Base):
    """The overrides and new op handlers of :func:`_inference_class`, mixed in before onnxruntime's class (its
    methods' ``super()`` is onnxruntime's)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.dispatcher_["ConvTranspose"] = self._infer_ConvTranspose
        self.dispatcher_["Upsample"] = self._infer_Upsample
        self.dispatcher_["Pad"] = self._infer_Pad
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
        # and with it the report's expressions. The same preference (a number, an input dim, a plain symbol,
        # the shortest expression), with ties broken in a fixed order: input dims as the graph inputs list
        # them, else by name.
        import sympy

        ssi = _ssi()
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
        import sympy

        ssi = _ssi()
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
        ssi = _ssi()
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
        import sympy

        ssi = _ssi()
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

    def _infer_Pad(self, node):
        # ONNX Pad-18 and later: an optional 4th input ``axes`` (negative counts from the back) names the axes
        # that ``pads`` (length 2 * len(axes): every begin, then every end) pads; out[a] = in[a] + begin + end.
        # onnxruntime's handler asserts len(pads) == 2 * rank, so an axes input ended its inference.
        ssi = _ssi()
        if ssi.get_opset(self.out_mp_) < 18 or len(node.input) < 4 or not node.input[3]:
            super()._infer_Pad(node)
            return
        x = self._get_sympy_shape(node, 0)
        pads, axes = self._try_get_value(node, 1), self._try_get_value(node, 3)
        if pads is None or axes is None or len(pads) != 2 * len(axes):
            self._set_output(node, self._new_symbolic_shape(len(x), node))
            return
        out, n = list(x), len(axes)
        for i, a in enumerate(int(a) for a in axes):
            out[a] = out[a] + int(pads[i]) + int(pads[i + n])
        self._set_output(node, out)

    def _scaled(self, node, scales):
        # ONNX Resize/Upsample: out[i] = floor(in[i] * scale[i]); exact rationals, no simplify()
        import sympy
        x = self._get_sympy_shape(node, 0)
        return [sympy.floor(d * sympy.Rational(repr(float(s)))) for d, s in zip(x, scales, strict=False)]

    def _infer_Upsample(self, node):
        ssi = _ssi()
        scales = ssi.get_attribute(node, "scales") or self._try_get_value(node, 1)
        if scales is None or len(scales) != len(self._get_shape(node, 0)):
            self._set_output(node, self._new_symbolic_shape(self._get_shape_rank(node, 0), node))
        else:
            self._set_output(node, self._scaled(node, scales))

    def _infer_Resize(self, node):
        ssi = _ssi()
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


def _inference_class() -> type:
    """A subclass of onnxruntime's ``SymbolicShapeInference`` with :class:`_Additions`."""
    return type("Inference", (_Additions, _ssi().SymbolicShapeInference),
                {"__doc__": "onnxruntime's inference with the additions of the module docstring.",
                 "__module__": __name__})


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
def _patched() -> Iterator[type]:
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


def run(prepared: onnx.ModelProto) -> tuple[str, onnx.ModelProto | None, dict[str, Any]]:
    """Run onnxruntime's inference on ``prepared`` (a skeleton whose input dims carry the symbol names; not
    modified) the way ``SymbolicShapeInference.infer_shapes`` does, without writing its temporary file.

    Returns ``(failure, inferred model or None, merges)``: ``failure`` is why the inference stopped early ('' when
    it finished), the inferred model has every value_info it could derive (dims as ``dim_value`` or as sympy
    expressions printed in ``dim_param``), and ``merges`` maps each dim onnxruntime assumed equal to another to
    that other. Never raises for a model onnx can load: onnxruntime's assertions become ``failure``.
    """
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
    return failure, inferred, merges
