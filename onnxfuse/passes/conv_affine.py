"""Fold a per-output-channel constant Add, Sub, Mul or Div into the Conv or ConvTranspose that feeds it.

Before => after (c broadcasts per output channel: shape [1, M, 1, 1], [M, 1, 1], [1], [] and the like)::

    Add(conv, c) or Add(c, conv)   =>  Conv(X, W, B + c)
    Sub(conv, c)                   =>  Conv(X, W, B - c)
    Sub(c, conv)                   =>  Conv(X, -W, c - B)
    Mul(conv, c) or Mul(c, conv)   =>  Conv(X, W * c[m], B * c)
    Div(conv, c)                   =>  Conv(X, W / c[m], B / c)

conv(X, W) is linear in W and B is added per channel, so these identities are exact in real arithmetic; the
math runs in float64 and is stored in the weight's dtype. Broadcasting follows ONNX Operators.md, "Broadcasting
in ONNX" (numpy rules, shapes right-aligned), so a constant shaped [M] lines up with the *last* axis, not the
channels, and is refused. B = 0 when the conv has none.

A weight computed from compact constants (int8 x scale, DequantizeLinear, ConstantOfShape...; see
``_fold.compact_weight``) stays compact: Add and Sub(conv, c) change only B; the factor of W (c, 1/c, -1) goes
into its per-channel scale or into a small ``Mul(W, factor)`` before the conv, and onnxruntime computes W' when
it loads the model.

Skipped when:
    intermediate-has-other-consumers   the conv output is read by another node too
    intermediate-is-graph-output       the conv output is a graph output
    weights-not-constant               W or B is computed at run time (W computed from constants only folds,
                                       except a grouped ConvTranspose's); also when c is a graph input shaped per
                                       channel ([1, M, 1, 1]...): an export that feeds every parameter at run
                                       time (with constant weights such a c stays conv_residual's refusal)
    initializer-is-graph-input         W, B or c is an overridable initializer (a graph input, IR >= 4)
    constant-not-per-channel           c varies along another axis, or has more dims than the output
    conv-output-is-divisor             Div(c, conv): 1/conv is not linear
    zero-in-divisor                    Div(conv, c) with a zero in c
    dtype-not-foldable                 W is not float16/float32/float64
    fold-not-finite                    W' or B' would hold inf/NaN or overflow W's dtype (c holds inf, 1/c
                                       overflows)
    quantized-conv                     the conv is part of a QDQ pattern
    fold-copies-shared-weight          W is also read by other nodes (so it stays) and its folded copy would
                                       grow the whole model past 1 MiB plus --materialize-weights (passes/_growth.py)
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from onnxfuse.ir import edit
from onnxfuse.passes._checks import CONV_OPS, describe, is_op, replaced, skip
from onnxfuse.passes._fold import (
    CompactWeight,
    ConvFoldMatch,
    compact_scale,
    fold_fits,
    fold_inputs,
    out_channels,
    scale_output_channels,
    set_compact_scale,
    set_weights,
)
from onnxfuse.passes.base import Context, Pass
from onnxfuse.records import Fusion, Reason, RewriteKind, Skip


def per_channel(c: np.ndarray, rank: int, m: int) -> np.ndarray | None:
    """``c`` as a length-``m`` float64 vector if it broadcasts against a rank-``rank`` NCHW-style output with
    ``m`` channels only along the channel axis (axis 1), else None."""
    if c.ndim > rank:
        return None
    aligned = (1,) * (rank - c.ndim) + tuple(c.shape)
    for axis, dim in enumerate(aligned):
        if dim != 1 and not (axis == 1 and dim == m):
            return None
    return np.broadcast_to(c.astype(np.float64).reshape(aligned[1]), (m,)).copy()


class ConvAffine(Pass[ConvFoldMatch]):
    """Conv/ConvTranspose -> Add/Sub/Mul/Div by a per-channel constant => Conv/ConvTranspose."""

    name = "conv_affine"
    kind = RewriteKind.FOLD
    summary = "fold Add/Sub (bias) and Mul/Div (scale) by per-channel constants into the preceding Conv"
    reasons = (Reason.NOT_PRIVATE, Reason.GRAPH_OUTPUT, Reason.WEIGHTS_NOT_CONSTANT, Reason.INITIALIZER_IS_INPUT,
               Reason.NOT_PER_CHANNEL, Reason.CONV_IS_DIVISOR, Reason.ZERO_DIVISOR, Reason.DTYPE_NOT_FOLDABLE,
               Reason.FOLD_NOT_FINITE, Reason.QDQ, Reason.SHARED_WEIGHT_GROWTH)
    anchors = ("Add", "Sub", "Mul", "Div")

    def match(self, node: gs.Node, ctx: Context) -> ConvFoldMatch | Skip | None:
        if not is_op(node, *self.anchors) or len(node.inputs) != 2:
            return None
        for side in (0, 1):
            conv = edit.producer(node.inputs[side])
            if not is_op(conv, *CONV_OPS):
                continue
            c_tensor = node.inputs[1 - side]
            c, why = ctx.constant(c_tensor)
            nodes, out = [conv, node], node.outputs[0]
            if c is None and why != Reason.INITIALIZER_IS_INPUT:
                # a run-time operand: a residual Add, not an affine constant; but a per-channel graph input after a
                # conv whose weights are graph inputs too is an export that feeds every parameter at run time
                bad = fold_inputs(conv, node, ctx, nodes, out)[2] if self._per_channel_input(conv, c_tensor,
                                                                                            ctx) else None
                if bad is not None and bad.reason in (Reason.WEIGHTS_NOT_CONSTANT, Reason.INITIALIZER_IS_INPUT):
                    return bad
                continue
            if c is None:  # why is INITIALIZER_IS_INPUT: any other reason continued above
                return skip(Reason.INITIALIZER_IS_INPUT,
                            f"{c_tensor.name} is an initializer listed as a graph input (overridable)", nodes, out)
            if node.op == "Div" and side == 1:
                return skip(Reason.CONV_IS_DIVISOR, f"{c_tensor.name} / conv output is not linear", nodes, out)
            w, b, bad = fold_inputs(conv, node, ctx, nodes, out)
            if bad:
                return bad
            m = out_channels(conv, w.shape)
            vec = per_channel(c, w.ndim, m)
            if vec is None:
                return skip(Reason.NOT_PER_CHANNEL,
                            f"constant of shape {list(c.shape)} does not broadcast per output channel "
                            f"of a rank-{w.ndim} output with {m} channels", nodes, out)
            if node.op == "Div" and not np.all(vec):
                return skip(Reason.ZERO_DIVISOR, f"{c_tensor.name} contains a zero", nodes, out)
            if isinstance(w, CompactWeight):
                return self._compact(conv, node.op, side == 0, w, b, vec, ctx, nodes, out)
            new_w, new_b = self._fold(conv, node.op, side == 0, w, b, vec)
            bad = fold_fits(w.dtype, new_w, new_b, nodes, out)
            return bad or ConvFoldMatch(nodes, new_w, new_b, w.dtype)
        return None

    def _compact(self, conv: gs.Node, op: str, conv_first: bool, w: CompactWeight, b: np.ndarray | None,
                 c: np.ndarray, ctx: Context, nodes: list[gs.Node], out: gs.Tensor) -> ConvFoldMatch | Skip:
        """The fold for a weight computed from compact constants: W's factor per output channel (1 for Add and
        Sub(conv, c): bias only, W untouched; -1, c, 1/c otherwise) goes into its computation
        (``_fold.compact_scale``), B' is computed as for constant weights."""
        with np.errstate(all="ignore"):
            b64 = np.zeros_like(c) if b is None else np.broadcast_to(b.astype(np.float64).reshape(-1), c.shape)
            if op == "Add":
                factor, new_b = None, b64 + c
            elif op == "Sub":
                factor, new_b = (None, b64 - c) if conv_first else (np.full_like(c, -1.0), c - b64)
            elif op == "Mul":
                factor, new_b = c, (None if b is None else b64 * c)
            else:  # Div(conv, c)
                factor, new_b = 1.0 / c, (None if b is None else b64 / c)
        compact = None
        if factor is not None:
            compact, bad = compact_scale(conv, w, factor, ctx, nodes, out)
            if bad:
                return bad
        bad = fold_fits(w.dtype, None, new_b, nodes, out)
        return bad or ConvFoldMatch(nodes, None, new_b, w.dtype, compact)

    @staticmethod
    def _per_channel_input(conv: gs.Node, c: gs.Tensor, ctx: Context) -> bool:
        """True when ``c`` is a graph input (no producer) whose static shape broadcasts per output channel only
        (``[1, M, 1, 1]``, ``[M, 1, 1]``, ``[1]``...; never the conv output's full shape): shaped like a bias or
        scale."""
        shape, y_shape = ctx.shape(c), ctx.shape(conv.outputs[0])
        if edit.producer(c) is not None or not isinstance(c, gs.Variable) or shape is None or y_shape is None:
            return False
        if not all(isinstance(d, int) for d in shape) or len(shape) > len(y_shape) or len(y_shape) < 3:
            return False
        aligned = (1,) * (len(y_shape) - len(shape)) + tuple(shape)
        return aligned != tuple(y_shape) and all(d == 1 or (axis == 1 and d == y_shape[1])
                                                 for axis, d in enumerate(aligned))

    @staticmethod
    def _fold(conv: gs.Node, op: str, conv_first: bool, w: np.ndarray, b: np.ndarray | None, c: np.ndarray):
        """``(W', B')`` in float64; None for what stays as it is."""
        with np.errstate(all="ignore"):
            b64 = np.zeros_like(c) if b is None else np.broadcast_to(b.astype(np.float64).reshape(-1), c.shape)
            if op == "Add":
                return None, b64 + c
            if op == "Sub":
                return (None, b64 - c) if conv_first else (-w.astype(np.float64), c - b64)
            if op == "Mul":
                return scale_output_channels(conv, w, c), (None if b is None else b64 * c)
            return scale_output_channels(conv, w, 1.0 / c), (None if b is None else b64 / c)  # Div(conv, c)

    def rewrite(self, match: ConvFoldMatch, ctx: Context) -> Fusion:
        conv, op_node = match.nodes
        original = replaced(match.nodes)
        slot = ctx.edit_order.slot(conv)
        set_weights(conv, ctx, match.weight, match.bias, match.dtype)
        edit.replace_chain(ctx.edit_order, conv, op_node, [op_node])
        if match.scale is not None:
            set_compact_scale(conv, ctx, match.scale, slot)
        return describe(self, conv, original)
