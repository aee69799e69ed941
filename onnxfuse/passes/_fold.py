"""Fold math the conv passes share: output-channel scaling of Conv/ConvTranspose weights, the checks every
fold makes first, and writing folded weights back as fresh initializers.

Folds compute in float64 and store the result in the weight's dtype (float16 weights stay float16).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from onnxfuse.ir import constants, edit
from onnxfuse.passes import _growth
from onnxfuse.passes._checks import computed_from_constants, is_op, private_check, qdq_check, skip
from onnxfuse.passes.base import Context, Match
from onnxfuse.records import Reason, Skip


@dataclass
class ConvFoldMatch(Match):
    """A fold of the node after a Conv/ConvTranspose (BatchNormalization, Mul/Add/Sub/Div by a constant) into the
    conv's weights.

    Attributes:
        weight: W', the conv weight's shape, in float64 or already in ``dtype``; None keeps W.
        scale: for a weight computed from compact constants (:class:`CompactWeight`), the per-output-channel
            scale that makes W' from W without materializing W; None otherwise.
        bias: B' in float64, shape [M]; None keeps B (or no bias).
        dtype: the conv weight's dtype, which W' and B' are stored in.
    """

    weight: np.ndarray | None
    bias: np.ndarray | None
    dtype: np.dtype
    scale: CompactScale | None = None


def out_channels(conv: gs.Node, weight_shape: tuple) -> int:
    """Number of output channels M of a Conv (W is [M, C/group, k...]) or ConvTranspose
    (W is [C, M/group, k...]; ONNX Operators.md, ConvTranspose)."""
    if conv.op == "ConvTranspose":
        return int(weight_shape[1]) * int(conv.attrs.get("group", 1))
    return int(weight_shape[0])


def scale_output_channels(conv: gs.Node, weight: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``weight`` with output channel m multiplied by ``scale[m]``, in float64.

    Conv: W[m, ...] *= s[m]. ConvTranspose: W is [C, M/group, k...] and output channel m = gi * (M/group) + j
    is W[gi * C/group : (gi + 1) * C/group, j, ...], so W is viewed as [group, C/group, M/group, k...].
    """
    s = np.asarray(scale, dtype=np.float64)
    spatial = (1,) * (weight.ndim - 2)
    if conv.op == "ConvTranspose":
        group = int(conv.attrs.get("group", 1))
        c_in, m_per_group = weight.shape[0], weight.shape[1]
        view = weight.reshape((group, c_in // group, m_per_group, *weight.shape[2:]))
        view = np.multiply(view, s.reshape((group, 1, m_per_group, *spatial)), dtype=np.float64)
        return view.reshape(weight.shape)
    # one pass: the float64 product without a float64 copy of the weight first (the same values: float16/32 ->
    # float64 is exact)
    return np.multiply(weight, s.reshape((-1, 1, *spatial)), dtype=np.float64)


def scaled_weight(conv: gs.Node, weight: np.ndarray, scale: np.ndarray, nodes: list[gs.Node],
                  output: gs.Tensor) -> tuple[np.ndarray | None, Skip | None]:
    """``(W', None)``: :func:`scale_output_channels` computed in float64 and stored in ``weight``'s dtype (the
    bytes ``scale_output_channels(...).astype(dtype)`` gives), or ``(None, Skip)`` where :func:`fold_fits`
    refuses the float64 values.

    A Conv's W' is computed straight into ``weight``'s dtype (numpy's ufunc casts each float64 buffer), without a
    float64 copy of the whole weight. When every stored value is finite and below the dtype's largest finite
    value in magnitude, every float64 value was within it too (rounding is monotonic, and a float64 value above
    it rounds to it or to inf); only otherwise are the float64 values computed and checked as fold_fits does.
    """
    dtype = weight.dtype
    with np.errstate(all="ignore"):
        if conv.op != "Conv":
            wide = scale_output_channels(conv, weight, scale)
            bad = fold_fits(dtype, wide, None, nodes, output)
            return (None, bad) if bad else (wide.astype(dtype), None)
        s = np.asarray(scale, dtype=np.float64).reshape((-1,) + (1,) * (weight.ndim - 1))
        out = np.empty(weight.shape, dtype)
        np.multiply(weight, s, out=out, dtype=np.float64, casting="same_kind")
        limit = float(np.finfo(dtype).max)
        if out.size and not (-limit < float(out.min()) and float(out.max()) < limit):
            bad = fold_fits(dtype, scale_output_channels(conv, weight, scale), None, nodes, output)
            if bad:
                return None, bad
    return out, None


def fold_inputs(conv: gs.Node, anchor: gs.Node, ctx: Context, nodes: list[gs.Node], output: gs.Tensor):
    """What every fold checks first: the conv output is read only by ``anchor`` and is no graph output, no QDQ,
    constant weights. Returns ``(W, B or None, None)`` or ``(None, None, Skip)`` (see :func:`conv_parts`)."""
    bad = private_check([conv.outputs[0]], [anchor], ctx, nodes, output) or qdq_check(conv, output, nodes)
    if bad:
        return None, None, bad
    w, b, bad = conv_parts(conv, ctx, nodes, output)
    # a compact weight folds into its scale (small); an array gets a folded copy: the model's growth is bounded
    grows = bad or _growth.check(conv, ctx, {1: w if isinstance(w, np.ndarray) else None, 2: b}, nodes, output)
    return (None, None, grows) if grows else (w, b, None)


def conv_parts(conv: gs.Node, ctx: Context, nodes: list[gs.Node], output: gs.Tensor):
    """``(W, B or None, None)`` as constant arrays for a fold, or ``(None, None, Skip)``.

    B is None when the conv has no bias. Folds need float16/float32/float64 weights. W is a
    :class:`CompactWeight` instead of an array when it is computed from compact constants (see
    :func:`compact_weight`); B is an array either way.
    """
    w: np.ndarray | CompactWeight | None
    w, why = ctx.constant(conv.inputs[1])
    if w is None and why != Reason.INITIALIZER_IS_INPUT:
        w = compact_weight(conv, ctx)
    if w is None:
        detail = (f"weight {conv.inputs[1].name} is an initializer listed as a graph input (overridable); pass "
                  "--constant-initializer-inputs if it never changes" if why == Reason.INITIALIZER_IS_INPUT
                  else f"weight {conv.inputs[1].name} is not a constant")
        return None, None, skip(why if why == Reason.INITIALIZER_IS_INPUT else Reason.WEIGHTS_NOT_CONSTANT,
                                detail, nodes, output)
    if w.dtype not in FOLDABLE_DTYPES:
        return None, None, skip(Reason.DTYPE_NOT_FOLDABLE, f"{w.dtype} weights cannot be folded", nodes, output)
    b = None
    if len(conv.inputs) > 2 and conv.inputs[2].name:
        b, why = ctx.constant(conv.inputs[2])
        if b is None:
            return None, None, skip(why if why == Reason.INITIALIZER_IS_INPUT else Reason.WEIGHTS_NOT_CONSTANT,
                                    f"bias {conv.inputs[2].name} is not a constant", nodes, output)
    return w, b, None


def fold_fits(dtype: np.dtype, weight: np.ndarray | None, bias: np.ndarray | None, nodes: list[gs.Node],
              output: gs.Tensor) -> Skip | None:
    """Skip a fold whose float64 results hold inf/NaN or exceed the largest finite value of ``dtype`` (they
    would round to inf when stored: a BN with var + epsilon = 0, a Mul by inf, a Div by 1e-39)."""
    limit = float(np.finfo(dtype).max)
    for name, values in (("weights", weight), ("bias", bias)):
        # min/max propagate NaN, and NaN compares False: one test covers inf, NaN and overflow without the
        # temporary arrays of isfinite() and abs()
        if values is not None and values.size and not (-limit <= float(values.min())
                                                       and float(values.max()) <= limit):
            return skip(Reason.FOLD_NOT_FINITE, f"the folded {name} would not be finite in {dtype}", nodes, output)
    return None


FOLDABLE_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def set_weights(conv: gs.Node, ctx: Context, weight: np.ndarray | None, bias: np.ndarray | None,
                dtype: np.dtype) -> None:
    """Give ``conv`` new, freshly named weight and bias initializers of ``dtype``; None leaves that input as is.

    Never edits a tensor in place, so a weight shared with another node stays as it was.
    """
    base = conv.name or conv.outputs[0].name
    _growth.spend(conv, ctx, {1: weight, 2: None if bias is None else np.asarray(bias).astype(dtype)})
    if weight is not None:
        conv.inputs[1] = constants.new_constant(ctx.namer, f"{base}.weight_folded", weight.astype(dtype, copy=False))
    if bias is None:
        return
    b = constants.new_constant(ctx.namer, f"{base}.bias_folded", np.asarray(bias).astype(dtype).reshape(-1))
    if len(conv.inputs) > 2:
        conv.inputs[2] = b
    else:
        conv.inputs.append(b)


def batchnorm_scale_shift(bn: gs.Node, ctx: Context, nodes: list[gs.Node], output: gs.Tensor,
                          features: int | None):
    """``(s, t, None)`` with ``BN(x) = x * s + t`` per channel (float64 vectors, ONNX Operators.md,
    BatchNormalization: ``s = scale / sqrt(var + epsilon)``, ``t = bias - mean * s``, epsilon default 1e-5 as
    float32), or
    ``(None, None, Skip)`` for a BN with spatial=0 (``batchnorm-spatial-0``), in training mode or with its
    running statistics used (``batchnorm-training-mode``), with run-time parameters, or whose parameters do not
    all have ``features`` values (the scale's count when ``features`` is None; ``parameter-shape-mismatch``)."""
    bad = batchnorm_mode_check(bn, ctx, nodes, output)
    if bad:
        return None, None, bad
    params = []
    for t in bn.inputs[1:5]:
        value, why = ctx.constant(t)
        if value is None:
            assert why is not None  # Context.constant gives a reason with every None
            return None, None, skip(why, f"BatchNormalization parameter {t.name} is not a constant", nodes, output)
        params.append(value)
    features = params[0].size if features is None else features
    if any(p.size != features for p in params):
        return None, None, skip(Reason.PARAM_SHAPE, f"BatchNormalization parameters do not have {features} "
                                "values", nodes, output)
    scale, bias, mean, var = (p.astype(np.float64).reshape(-1) for p in params)
    with np.errstate(all="ignore"):
        # epsilon is a float32 attribute (ONNX Operators.md); onnxruntime adds it as float32 even to float64
        # data (batch_norm.h), so the default is float32(1e-5), not the double 1e-5: with the double, a float64
        # fold missed onnxruntime by 5e-13, and var = -1e-5 gave a huge finite scale instead of inf
        eps = float(np.float32(bn.attrs.get("epsilon", 1e-5)))
        s = scale / np.sqrt(var + eps)
        return s, bias - mean * s, None


def batchnorm_mode_check(bn: gs.Node, ctx: Context, nodes: list[gs.Node], output: gs.Tensor) -> Skip | None:
    """Skip a BatchNormalization with spatial=0 (``batchnorm-spatial-0``) or in training mode, or whose
    running-statistics outputs are read (``batchnorm-training-mode``); None otherwise. Reads attributes and
    edges only, no parameter values (:func:`batchnorm_scale_shift` makes this check first)."""
    if int(bn.attrs.get("spatial", 1)) == 0:
        return skip(Reason.BN_SPATIAL, "BatchNormalization has spatial=0 (per-element statistics)", nodes, output)
    extra = [t for t in bn.outputs[1:] if t.name]
    if int(bn.attrs.get("training_mode", 0)) or any(t.outputs or edit.is_graph_output(t, ctx.graph) for t in extra):
        return skip(Reason.TRAINING_MODE, "BatchNormalization is in training mode", nodes, output)
    return None


# ---------------------------------------------------------------------------------------------------------------
# Weights computed from compact constants


@dataclass(frozen=True)
class CompactWeight:
    """A conv weight W that the model computes from constants when it loads rather than storing it as floats:
    int8 values times a scale (``Mul(Cast(int8), scale)``), ``DequantizeLinear`` of an int8 weight (outside an
    activation QDQ pattern), ``ConstantOfShape``/``Expand``/``Tile`` of one value. ``constant_fold`` leaves such
    a computation in place when its float result would be larger than its compact inputs (``fold-grows-model``);
    the folds then scale W through its computation (:func:`compact_scale`) and onnxruntime computes W' at load.

    Attributes:
        tensor: W, the conv's weight input (a computed tensor, no constant).
        shape: W's static shape (ints), from onnx shape inference (``Context.shape``).
        dtype: W's dtype (float16/float32/float64).
    """

    tensor: gs.Tensor
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def ndim(self) -> int:
        """W's rank."""
        return len(self.shape)


def compact_weight(conv: gs.Node, ctx: Context, min_rank: int = 3) -> CompactWeight | None:
    """Input 1 (the weight) of ``conv`` (or of a Gemm, with ``min_rank`` 2) as a :class:`CompactWeight` when it is
    computed only from constants (no graph input, no overridable initializer: ``_checks.computed_from_constants``)
    and its shape (of at least ``min_rank`` dims) and float dtype are known; None otherwise."""
    w = conv.inputs[1]
    if not computed_from_constants(w, ctx):
        return None
    shape, dtype = ctx.shape(w), ctx.dtype(w)
    if shape is None or not all(isinstance(d, int) and d >= 0 for d in shape) or len(shape) < min_rank:
        return None
    if dtype is None or np.dtype(dtype) not in FOLDABLE_DTYPES:
        return None
    return CompactWeight(w, tuple(shape), np.dtype(dtype))


@dataclass(frozen=True)
class CompactScale:
    """How W' = W * s[m] (s per output channel m) is written without materializing W (see
    :func:`compact_scale`).

    Attributes:
        node: the Mul or DequantizeLinear that computes W, whose constant scale input ``index`` is replaced by
            ``value``; None when a ``Mul(W, value)`` is appended before the conv instead.
        index: the replaced input of ``node`` (unused when ``node`` is None).
        value: the new scale constant in float64: the old scale times s, in a shape that broadcasts the same way
            (a DequantizeLinear's per-axis [M]; a Mul's constant aligned to W's rank with M on the channel axis),
            or s shaped [M, 1, ...] (Conv) / [1, M, 1, ...] (ConvTranspose) for an appended Mul.
        dtype: the dtype ``value`` is stored in (the replaced scale's, or W's for an appended Mul).
        shape: W's shape (the appended Mul's output shape).
    """

    node: gs.Node | None
    index: int
    value: np.ndarray
    dtype: np.dtype
    shape: tuple[int, ...]


def _channel_axis(conv: gs.Node) -> int:
    """The axis of W that holds output channels: 0 for Conv, 1 for ConvTranspose (group 1)."""
    return 1 if conv.op == "ConvTranspose" else 0


def compact_scale(conv: gs.Node, cw: CompactWeight, scale: np.ndarray, ctx: Context, nodes: list[gs.Node],
                  output: gs.Tensor) -> tuple[CompactScale | None, Skip | None]:
    """``(CompactScale, None)`` that multiplies output channel m of the compact weight ``cw`` by ``scale[m]``
    (float64, [M] or one value), or ``(None, Skip)``.

    When W is read by ``conv`` alone and computed by a ``Mul`` with a constant operand that varies along the
    output-channel axis only (int8 x per-channel scale), that operand is replaced by operand x scale; when it is
    computed by a ``DequantizeLinear`` with a per-axis scale on that axis (no ``block_size``), its scale is
    replaced by scale x s (ONNX Operators.md, DequantizeLinear: y = (x - zero_point) * x_scale, so scaling
    x_scale scales y). Otherwise a ``Mul(W, s)`` is appended before the conv. The int8/compact constants are
    never touched. Skips with ``weights-not-constant`` for a grouped ConvTranspose (its output channels are not
    one axis of W) and with ``fold-not-finite`` when the new scale would not be finite in its dtype.
    """
    if conv.op == "ConvTranspose" and int(conv.attrs.get("group", 1)) != 1:
        return None, skip(Reason.WEIGHTS_NOT_CONSTANT, f"weight {cw.tensor.name} is computed at load time and a "
                          "grouped ConvTranspose's output channels are not one axis of it", nodes, output)
    return compact_scale_axis(conv, cw, _channel_axis(conv), out_channels(conv, cw.shape), scale, ctx, nodes,
                              output)


def compact_scale_axis(reader: gs.Node, cw: CompactWeight, axis: int, m: int, scale: np.ndarray, ctx: Context,
                       nodes: list[gs.Node], output: gs.Tensor) -> tuple[CompactScale | None, Skip | None]:
    """:func:`compact_scale` for the weight ``cw`` of ``reader`` (a Conv/ConvTranspose, or a Gemm: axis 1 of B,
    or 0 with ``transB``) whose ``m`` output channels lie along ``axis``."""
    rank = cw.ndim
    s = np.broadcast_to(np.asarray(scale, dtype=np.float64).reshape(-1), (m,))
    channel_shape = tuple(m if a == axis else 1 for a in range(rank))
    found = _scale_input(edit.producer(cw.tensor), cw, ctx, axis, m) if _private(cw.tensor, reader, ctx) else None
    if found is None:
        result = CompactScale(None, 0, s.reshape(channel_shape), cw.dtype, cw.shape)
    else:
        node, index, old = found
        with np.errstate(all="ignore"):
            if node.op == "DequantizeLinear":
                value = old.astype(np.float64) * s
            else:
                aligned = (1,) * (rank - old.ndim) + tuple(old.shape)
                value = old.astype(np.float64).reshape(aligned) * s.reshape(channel_shape)
        result = CompactScale(node, index, value, old.dtype, cw.shape)
    return (None, bad) if (bad := fold_fits(result.dtype, result.value, None, nodes, output)) else (result, None)


def _private(w: gs.Tensor, conv: gs.Node, ctx: Context) -> bool:
    """True when ``w`` is read by ``conv`` only and is no graph output (its producer may then be edited)."""
    return all(r is conv for r in edit.consumers(w)) and not edit.is_graph_output(w, ctx.graph)


def _scale_input(p: gs.Node | None, cw: CompactWeight, ctx: Context, axis: int, m: int):
    """``(node, input index, scale value)`` of the per-output-channel constant scale of W's producer ``p`` (see
    :func:`compact_scale`), or None."""
    if is_op(p, "Mul") and len(p.inputs) == 2:
        for i in (0, 1):
            c, _ = ctx.constant(p.inputs[i])
            other, _ = ctx.constant(p.inputs[1 - i])
            if c is None or other is not None or c.dtype != cw.dtype or c.ndim > cw.ndim:
                continue
            aligned = (1,) * (cw.ndim - c.ndim) + tuple(c.shape)
            if all(d == 1 or (a == axis and d == m) for a, d in enumerate(aligned)):
                return p, i, c
        return None
    if is_op(p, "DequantizeLinear") and len(p.inputs) > 1 and not int(p.attrs.get("block_size", 0)):
        c, _ = ctx.constant(p.inputs[1])
        dq_axis = int(p.attrs.get("axis", 1))
        if c is not None and c.ndim == 1 and c.shape[0] == m and m > 1 and c.dtype == cw.dtype \
                and dq_axis % cw.ndim == axis:
            return p, 1, c
    return None


def set_compact_scale(conv: gs.Node, ctx: Context, scale: CompactScale, slot: int) -> None:
    """Apply ``scale`` (from :func:`compact_scale`) to ``conv``'s (or a Gemm's) weight: replace the scale input of its
    producer by a fresh constant, or insert ``Mul(W, value)`` into ``ctx.edit_order`` at ``slot`` (a free slot
    before the conv, after W's producer) and make the conv read its output. Never edits a tensor in place."""
    base = conv.name or conv.outputs[0].name
    const = constants.new_constant(ctx.namer, f"{base}.weight_scale_folded", scale.value.astype(scale.dtype))
    if scale.node is not None:
        scale.node.inputs[scale.index] = const
        return
    w = conv.inputs[1]
    out = gs.Variable(ctx.namer.fresh(f"{base}.weight_scaled"), dtype=scale.dtype, shape=list(scale.shape))
    mul = gs.Node("Mul", name=ctx.namer.fresh(f"{base}.weight_scale"), inputs=[w, const], outputs=[out])
    conv.inputs[1] = out
    ctx.edit_order.place(mul, slot)
    ctx.members.add(id(mul))
