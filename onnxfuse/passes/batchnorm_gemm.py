"""Fold an inference-mode BatchNormalization that feeds a Gemm (directly or through a Flatten) into its weights.

Before => after (X is the BN input: [M, C], or [M, C, d1, ...] flattened at axis 1 into [M, K = C * d1 * ...])::

    BatchNormalization(X) -> Gemm(A, B[, C], alpha, beta, transA=0, transB)
        =>  Gemm(X, B', C', alpha, beta=1, transA=0, transB)
    BatchNormalization(X) -> Flatten(axis=1) -> Gemm(...)
        =>  Flatten(X) -> Gemm(..., B', C', ...)          (the Flatten stays: only the BN is gone)

Math (ONNX Operators.md, BatchNormalization and Gemm): BN(x) = x * s + t per channel with
``s = scale / sqrt(var + epsilon)`` and ``t = bias - mean * s``. Flatten at axis 1 keeps each sample's features
in channel-major order, so Gemm input feature k belongs to channel ``k // (K / C)``; s and t repeated that way
give per-feature vectors s_k, t_k. With B' = B as [K, N] (B^T when transB = 1)::

    alpha * (A * s_k + t_k) @ B' + beta * C = alpha * A @ (s_k[:, None] * B') + (beta * C + alpha * t_k @ B')
    B'' = B with input feature k times s_k[k]    row k of B, or column k when transB = 1
    C'  = beta * C + alpha * (t_k @ B')         C = 0 when absent; beta becomes 1

Computed in float64 in ``match`` and stored in B's dtype. No exporter-specific shape is needed: the BN output
is 2-D when it feeds the Gemm directly, and any rank is fine behind a Flatten at axis 1.

Skipped when:
    intermediate-has-other-consumers   the BN (or Flatten) output is read by another node too
    intermediate-is-graph-output       the BN (or Flatten) output is a graph output
    gemm-input-transposed              transA = 1: the BN's channels would be Gemm's rows (samples), not features
    flatten-reorders-features          the Flatten's axis is not 1 (it mixes samples into features, or features
                                       into samples), or is negative on an input of unknown rank
    weights-not-constant               B or C is computed at run time
    initializer-is-graph-input         B, C or a BN parameter is an overridable initializer (IR < 4 style)
    parameters-not-constant            a BN parameter (scale, bias, mean, var) is computed at run time
    batchnorm-training-mode            training_mode=1, spatial=0, or the running-statistics outputs are used
    parameter-shape-mismatch           the BN parameters' count does not divide K (or differ from each other),
                                       or B / C does not have a Gemm shape
    dtype-not-foldable                 B is not float16/float32/float64
    fold-not-finite                    B'' or C' would hold inf/NaN or overflow B's dtype
    quantized-conv                     the Gemm is part of a QuantizeLinear/DequantizeLinear pattern
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from onnxfuse import graph as g
from onnxfuse.passes._checks import describe, is_op, private_check, replaced, skip
from onnxfuse.passes._fold import fold_fits
from onnxfuse.passes._gemm import (
    GemmAttrs,
    GemmFoldMatch,
    c_matrix,
    gemm_parts,
    gemm_qdq_check,
    in_features,
    out_features,
    scale_in_features,
    set_gemm_weights,
)
from onnxfuse.passes.base import Context, Fusion, Pass, Reason, Skip
from onnxfuse.passes.gemm_batchnorm import batchnorm_scale_shift


class BatchNormGemm(Pass[GemmFoldMatch]):
    """BatchNormalization -> (Flatten ->) Gemm => (Flatten ->) Gemm with the BN folded into B and C."""

    name = "batchnorm_gemm"
    summary = "fold BatchNormalization (inference mode) into the Gemm it feeds, through a Flatten at axis 1"
    reasons = (Reason.NOT_PRIVATE, Reason.GRAPH_OUTPUT, Reason.GEMM_TRANS_A, Reason.FLATTEN_REORDERS,
               Reason.WEIGHTS_NOT_CONSTANT, Reason.INITIALIZER_IS_INPUT, Reason.PARAMS_NOT_CONSTANT,
               Reason.TRAINING_MODE, Reason.PARAM_SHAPE, Reason.DTYPE_NOT_FOLDABLE, Reason.FOLD_NOT_FINITE,
               Reason.QDQ)

    def match(self, node: gs.Node, ctx: Context) -> GemmFoldMatch | Skip | None:
        if not is_op(node, "Gemm"):
            return None
        flatten = g.producer(node.inputs[0])
        bn = g.producer(flatten.inputs[0]) if is_op(flatten, "Flatten") else flatten
        flatten = flatten if flatten is not bn else None
        if not is_op(bn, "BatchNormalization"):
            return None
        between = [flatten] if flatten is not None else []
        nodes, out = [bn, *between, node], node.outputs[0]
        intermediates = [bn.outputs[0]] + [f.outputs[0] for f in between]
        bad = private_check(intermediates, [*between, node], ctx, nodes, out) or gemm_qdq_check(node, out, nodes)
        if bad:
            return bad
        attrs = GemmAttrs.of(node)
        if attrs.trans_a:
            return skip(Reason.GEMM_TRANS_A, "Gemm has transA=1: the BN channels are its rows, not its input "
                        "features", nodes, out)
        if flatten is not None:
            bad = self._flatten_check(flatten, bn, ctx, nodes, out)
            if bad:
                return bad
        b, c, bad = gemm_parts(node, ctx, nodes, out)
        if bad:
            return bad
        s, t, bad = batchnorm_scale_shift(bn, ctx, nodes, out, None)
        if bad:
            return bad
        k, n = in_features(b, attrs.trans_b), out_features(b, attrs.trans_b)
        if k % s.size or (flatten is None and s.size != k):
            return skip(Reason.PARAM_SHAPE, f"{s.size} BatchNormalization channels do not match the Gemm's {k} "
                        "input features", nodes, out)
        s_k, t_k = np.repeat(s, k // s.size), np.repeat(t, k // s.size)
        with np.errstate(all="ignore"):
            b_kn = b.astype(np.float64).T if attrs.trans_b else b.astype(np.float64)
            new_b = scale_in_features(b, attrs.trans_b, s_k)
            new_c = attrs.beta * c_matrix(c, n) + attrs.alpha * (t_k @ b_kn)
        return fold_fits(b.dtype, new_b, new_c, nodes, out) or GemmFoldMatch(nodes, b=new_b, c=new_c, dtype=b.dtype)

    @staticmethod
    def _flatten_check(flatten: gs.Node, bn: gs.Node, ctx: Context, nodes: list[gs.Node],
                       out: gs.Tensor) -> Skip | None:
        axis = int(flatten.attrs.get("axis", 1))
        if axis < 0:
            shape = ctx.shape(bn.inputs[0])
            if shape is None:
                return skip(Reason.FLATTEN_REORDERS, f"Flatten axis {axis} on an input of unknown rank", nodes, out)
            axis += len(shape)
        if axis != 1:
            return skip(Reason.FLATTEN_REORDERS, f"Flatten at axis {axis} does not keep one sample's features per "
                        "row (axis 1 does)", nodes, out)
        return None

    def rewrite(self, match: GemmFoldMatch, ctx: Context) -> Fusion:
        bn, *between, gemm = match.nodes
        original = replaced([bn, gemm])  # a Flatten stays in the graph, so it is not part of the fused node
        (between[0] if between else gemm).inputs[0] = bn.inputs[0]
        set_gemm_weights(gemm, ctx, match.b, match.c, match.dtype)
        g.replace_chain(ctx.order, gemm, gemm, [bn])
        return describe(self.name, gemm, original)
