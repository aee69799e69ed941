"""Fold an inference-mode BatchNormalization into the Conv or ConvTranspose that feeds it.

Before => after::

    Conv(X, W[, B]) -> BatchNormalization(scale, bias, mean, var, epsilon)  =>  Conv(X, W', B')

Math (ONNX Operators.md, BatchNormalization: Y = (X - mean) / sqrt(var + epsilon) * scale + bias)::

    s  = scale / sqrt(var + epsilon)          per output channel m, epsilon default 1e-5
    W' = W * s[m]                             Conv: axis 0 of W; ConvTranspose: axis 1 within each group
    B' = (B - mean) * s + bias                B = 0 when the conv has none

Computed in float64 (in ``match``, so that a fold that overflows is refused) and stored in the conv weight's dtype
(BN-15 parameters may be another dtype).

A weight computed from compact constants (int8 x scale, DequantizeLinear, ConstantOfShape...; see
``_fold.compact_weight``) stays compact: s goes into its per-channel scale, or into a small ``Mul(W, s)`` before
the conv, and onnxruntime computes W' when it loads the model; only B' is stored.

Skipped when:
    intermediate-has-other-consumers   the conv output is read by another node too
    intermediate-is-graph-output       the conv output is a graph output
    weights-not-constant               W or B is computed at run time (W computed from constants only folds;
                                       not the W of a grouped ConvTranspose)
    initializer-is-graph-input         W, B or a BN parameter is an overridable initializer (a graph input, IR >= 4)
    parameters-not-constant            a BN parameter is computed at run time
    batchnorm-training-mode            training_mode=1, or the running-statistics outputs are used
    batchnorm-spatial-0                spatial=0 (opset < 9): statistics per element, not per channel
    parameter-shape-mismatch           a BN parameter does not have one value per output channel
    dtype-not-foldable                 W is not float16/float32/float64
    fold-not-finite                    W' or B' would hold inf/NaN or overflow W's dtype (var + epsilon = 0)
    quantized-conv                     the conv is part of a QDQ pattern
    fold-copies-shared-weight          W is also read by other nodes (so it stays) and its folded copy would
                                       grow the whole model past 1 MiB plus --materialize-weights (passes/_growth.py)
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from onnxfuse.ir import edit
from onnxfuse.passes._checks import CONV_OPS, describe, is_op, replaced
from onnxfuse.passes._fold import (
    CompactWeight,
    ConvFoldMatch,
    batchnorm_mode_check,
    batchnorm_scale_shift,
    compact_scale,
    fold_fits,
    fold_inputs,
    out_channels,
    scaled_weight,
    set_compact_scale,
    set_weights,
)
from onnxfuse.passes.base import Context, Pass
from onnxfuse.records import Fusion, Reason, RewriteKind, Skip


class ConvBatchNorm(Pass[ConvFoldMatch]):
    """Conv/ConvTranspose -> BatchNormalization => Conv/ConvTranspose with folded weights."""

    name = "conv_batchnorm"
    kind = RewriteKind.FOLD
    summary = "fold BatchNormalization (inference mode) into the preceding Conv or ConvTranspose"
    reasons = (Reason.NOT_PRIVATE, Reason.GRAPH_OUTPUT, Reason.WEIGHTS_NOT_CONSTANT, Reason.INITIALIZER_IS_INPUT,
               Reason.PARAMS_NOT_CONSTANT, Reason.TRAINING_MODE, Reason.PARAM_SHAPE, Reason.DTYPE_NOT_FOLDABLE,
               Reason.FOLD_NOT_FINITE, Reason.QDQ, Reason.BN_SPATIAL, Reason.SHARED_WEIGHT_GROWTH)
    anchors = ("BatchNormalization",)

    def match(self, node: gs.Node, ctx: Context) -> ConvFoldMatch | Skip | None:
        if not is_op(node, *self.anchors):
            return None
        conv = edit.producer(node.inputs[0])
        if not is_op(conv, *CONV_OPS):
            return None
        nodes, out = [conv, node], node.outputs[0]
        mode = batchnorm_mode_check(node, ctx, nodes, out)
        if mode is not None:
            return mode  # refused before the conv is looked at, whatever else is wrong with it
        w, b, bad = fold_inputs(conv, node, ctx, nodes, out)
        if bad:
            return bad
        s, t, bad = batchnorm_scale_shift(node, ctx, nodes, out, out_channels(conv, w.shape))
        if bad:
            return bad
        if isinstance(w, CompactWeight):
            new_w, compact, bad = None, *compact_scale(conv, w, s, ctx, nodes, out)
        else:
            (new_w, bad), compact = scaled_weight(conv, w, s, nodes, out), None
        if bad:
            return bad
        with np.errstate(all="ignore"):
            b64 = np.zeros_like(s) if b is None else b.astype(np.float64).reshape(-1)
            new_b = b64 * s + t
        bad = fold_fits(w.dtype, None, new_b, nodes, out)
        return bad or ConvFoldMatch(nodes, new_w, new_b, w.dtype, compact)

    def rewrite(self, match: ConvFoldMatch, ctx: Context) -> Fusion:
        conv, bn = match.nodes
        original = replaced(match.nodes)
        slot = ctx.edit_order.slot(conv)
        set_weights(conv, ctx, match.weight, match.bias, match.dtype)
        edit.replace_chain(ctx.edit_order, conv, bn, [bn])
        if match.scale is not None:
            set_compact_scale(conv, ctx, match.scale, slot)
        return describe(self, conv, original)
