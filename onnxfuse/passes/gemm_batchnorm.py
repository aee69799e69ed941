"""Fold an inference-mode BatchNormalization over the features of a Gemm output into the Gemm.

Before => after (Y is [M, N]; the BN normalizes axis 1, the N output features)::

    Gemm(A, B[, C], alpha, beta, transA, transB) -> BatchNormalization(scale, bias, mean, var, epsilon)
        =>  Gemm(A, B', C', alpha, beta=1, transA, transB)

Math (ONNX Operators.md, BatchNormalization: ``Z = (Y - mean) / sqrt(var + epsilon) * scale + bias``, and Gemm:
``Y = alpha * A' @ B' + beta * C``)::

    s  = scale / sqrt(var + epsilon)             per output feature n, epsilon default 1e-5
    B' = B with output feature n times s[n]      column n of B, or row n when transB = 1
    C' = beta * C * s + (bias - mean * s)        C = 0 when absent; beta becomes 1

alpha, transA and transB are kept. Computed in float64 in ``match`` and stored in B's dtype.

A B computed from compact constants (int8 x scale, ConstantOfShape...; ``_fold.compact_weight``) stays compact: s
goes into its per-feature scale or a small ``Mul(B, s)`` before the Gemm, and onnxruntime computes B' at load. A B
from DequantizeLinear stays a ``quantized-gemm`` refusal (``_gemm.gemm_qdq_check``).

Skipped when:
    intermediate-has-other-consumers   the Gemm output is read by another node too
    intermediate-is-graph-output       the Gemm output is a graph output
    weights-not-constant               B or C is computed at run time
    initializer-is-graph-input         B, C or a BN parameter is an overridable initializer (a graph input, IR >= 4)
    parameters-not-constant            a BN parameter (scale, bias, mean, var) is computed at run time
    batchnorm-training-mode            training_mode=1, or the running-statistics outputs are used
    batchnorm-spatial-0                spatial=0 (opset < 9: per-element statistics)
    parameter-shape-mismatch           a BN parameter does not have one value per output feature, or B / C
                                       does not have a Gemm shape
    dtype-not-foldable                 B is not float16/float32/float64
    fold-not-finite                    B' or C' would hold inf/NaN or overflow B's dtype (var + epsilon = 0)
    quantized-gemm                     the Gemm is part of a QuantizeLinear/DequantizeLinear pattern
    fold-copies-shared-weight          B is also read by other nodes (so it stays) and its folded copy would
                                       grow the whole model past 1 MiB plus --materialize-weights (passes/_growth.py)
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from onnxfuse.ir import edit
from onnxfuse.passes._checks import describe, is_op, replaced
from onnxfuse.passes._fold import (
    CompactWeight,
    batchnorm_scale_shift,
    compact_scale_axis,
    fold_fits,
    set_compact_scale,
)
from onnxfuse.passes._gemm import (
    GemmAttrs,
    GemmFoldMatch,
    c_matrix,
    gemm_fold_inputs,
    out_features,
    scale_out_features,
    set_gemm_weights,
)
from onnxfuse.passes.base import Context, Pass
from onnxfuse.records import Fusion, Reason, RewriteKind, Skip


class GemmBatchNorm(Pass[GemmFoldMatch]):
    """Gemm -> BatchNormalization => Gemm with folded B and C."""

    name = "gemm_batchnorm"
    kind = RewriteKind.FOLD
    summary = "fold BatchNormalization (inference mode) into the preceding Gemm"
    reasons = (Reason.NOT_PRIVATE, Reason.GRAPH_OUTPUT, Reason.WEIGHTS_NOT_CONSTANT, Reason.INITIALIZER_IS_INPUT,
               Reason.PARAMS_NOT_CONSTANT, Reason.TRAINING_MODE, Reason.PARAM_SHAPE, Reason.DTYPE_NOT_FOLDABLE,
               Reason.FOLD_NOT_FINITE, Reason.QDQ_GEMM, Reason.BN_SPATIAL, Reason.SHARED_WEIGHT_GROWTH)
    anchors = ("BatchNormalization",)

    def match(self, node: gs.Node, ctx: Context) -> GemmFoldMatch | Skip | None:
        if not is_op(node, *self.anchors):
            return None
        gemm = edit.producer(node.inputs[0])
        if not is_op(gemm, "Gemm"):
            return None
        nodes, out = [gemm, node], node.outputs[0]
        b, c, bad = gemm_fold_inputs(gemm, node, ctx, nodes, out, compact=True)
        if bad:
            return bad
        attrs = GemmAttrs.of(gemm)
        n = out_features(b, attrs.trans_b)
        s, t, bad = batchnorm_scale_shift(node, ctx, nodes, out, n)
        if bad:
            return bad
        compact = None
        with np.errstate(all="ignore"):
            if isinstance(b, CompactWeight):
                new_b = None
                compact, bad = compact_scale_axis(gemm, b, 0 if attrs.trans_b else 1, n, s, ctx, nodes, out)
                if bad:
                    return bad
            else:
                new_b = scale_out_features(b, attrs.trans_b, s)
            new_c = attrs.beta * c_matrix(c, n) * s + t
        return fold_fits(b.dtype, new_b, new_c, nodes, out) or GemmFoldMatch(nodes, b=new_b, c=new_c, dtype=b.dtype,
                                                                             scale=compact)

    def rewrite(self, match: GemmFoldMatch, ctx: Context) -> Fusion:
        gemm, bn = match.nodes
        original = replaced(match.nodes)
        slot = ctx.edit_order.slot(gemm)
        set_gemm_weights(gemm, ctx, match.b, match.c, match.dtype)
        edit.replace_chain(ctx.edit_order, gemm, bn, [bn])
        if match.scale is not None:
            set_compact_scale(gemm, ctx, match.scale, slot)
        return describe(self, gemm, original)
