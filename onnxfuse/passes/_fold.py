"""Fold math the conv passes share: output-channel scaling of Conv/ConvTranspose weights, the checks every
fold makes first, and writing folded weights back as fresh initializers.

Folds compute in float64 and store the result in the weight's dtype (float16 weights stay float16).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from onnxfuse import graph as g
from onnxfuse.passes._checks import private_check, qdq_check, skip
from onnxfuse.passes.base import Context, Match, Reason, Skip


@dataclass
class FoldMatch(Match):
    """A fold of the node after a Conv/ConvTranspose into its weights.

    Attributes:
        weight: W', the conv weight's shape, in float64 or already in ``dtype``; None keeps W.
        bias: B' in float64, shape [M]; None keeps B (or no bias).
        dtype: the conv weight's dtype, which W' and B' are stored in.
    """

    weight: np.ndarray | None
    bias: np.ndarray | None
    dtype: np.dtype


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
    return conv_parts(conv, ctx, nodes, output)


def conv_parts(conv: gs.Node, ctx: Context, nodes: list[gs.Node], output: gs.Tensor):
    """``(W, B or None, None)`` as constant arrays for a fold, or ``(None, None, Skip)``.

    B is None when the conv has no bias. Folds need float16/float32/float64 weights.
    """
    w, why = ctx.constant(conv.inputs[1])
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
    if weight is not None:
        conv.inputs[1] = g.new_constant(ctx.namer, f"{base}.weight_folded", weight.astype(dtype, copy=False))
    if bias is None:
        return
    b = g.new_constant(ctx.namer, f"{base}.bias_folded", np.asarray(bias).astype(dtype).reshape(-1))
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
    if int(bn.attrs.get("training_mode", 0)) or any(t.outputs or g.is_graph_output(t, ctx.graph) for t in extra):
        return skip(Reason.TRAINING_MODE, "BatchNormalization is in training mode", nodes, output)
    return None
