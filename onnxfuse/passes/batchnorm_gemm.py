"""Fold an inference-mode BatchNormalization that feeds a Gemm (directly, or through a Flatten or Reshape that
keeps the samples on axis 0) into its weights.

Before => after (X is the BN input: [M, C], or [M, C, d1, ...] flattened into [M, K = C * d1 * ...])::

    BatchNormalization(X) -> Gemm(A, B[, C], alpha, beta, transA=0, transB)
        =>  Gemm(X, B', C', alpha, beta=1, transA=0, transB)
    BatchNormalization(X) -> Flatten(axis=1) or Reshape(to [M, K]) -> Gemm(...)
        =>  Flatten(X) or Reshape(X) -> Gemm(..., B', C', ...)     (it stays: only the BN is gone)

The Flatten or Reshape that stays writes a tensor of a new name (``<name>_unnormalized``): it now holds X's
features, not the BN's (``_checks.renew_output``), so ``onnxfuse verify --layers`` does not compare it with the
input's tensor of the old name.

Math (ONNX Operators.md, BatchNormalization and Gemm): BN(x) = x * s + t per channel with
``s = scale / sqrt(var + epsilon)`` and ``t = bias - mean * s``. Flatten at axis 1, and a row-major Reshape that
keeps axis 0 (torch's ``x.view(x.size(0), -1)``), keep each sample's features in channel-major order, so Gemm
input feature k belongs to channel ``k // (K / C)``; s and t repeated that way give per-feature vectors s_k, t_k.
With B' = B as [K, N] (B^T when transB = 1)::

    alpha * (X * s_k + t_k) @ B' + beta * C = alpha * X @ (s_k[:, None] * B') + (beta * C + alpha * t_k @ B')
    B'' = B with input feature k times s_k[k]    row k of B, or column k when transB = 1
    C'  = beta * C + alpha * (t_k @ B')         C = 0 when absent; beta becomes 1

Computed in float64 in ``match`` and stored in B's dtype. No exporter-specific shape is needed: the BN output
is 2-D when it feeds the Gemm directly, and any rank is fine behind a Flatten at axis 1 or such a Reshape.

Skipped when:
    intermediate-has-other-consumers   the BN (or Flatten/Reshape) output is read by another node too
    intermediate-is-graph-output       the BN (or Flatten/Reshape) output is a graph output
    gemm-input-transposed              transA = 1: the BN's channels would be Gemm's rows (samples), not features
    flatten-reorders-features          the Flatten's axis is not 1 (it mixes samples into features, or features
                                       into samples), or is negative on an input of unknown rank; a Reshape
                                       whose shape is not a constant [0, x] or [-1, K] and that shape inference
                                       does not show keeping axis 0
    weights-not-constant               B or C is computed at run time
    initializer-is-graph-input         B, C or a BN parameter is an overridable initializer (a graph input, IR >= 4)
    parameters-not-constant            a BN parameter (scale, bias, mean, var) is computed at run time
    batchnorm-training-mode            training_mode=1, or the running-statistics outputs are used
    batchnorm-spatial-0                spatial=0 (opset < 9: per-element statistics)
    parameter-shape-mismatch           the BN parameters' count does not divide K (or differ from each other),
                                       or B / C does not have a Gemm shape
    dtype-not-foldable                 B is not float16/float32/float64
    fold-not-finite                    B'' or C' would hold inf/NaN or overflow B's dtype
    quantized-gemm                     the Gemm is part of a QuantizeLinear/DequantizeLinear pattern
"""

from __future__ import annotations

import math

import numpy as np
import onnx_graphsurgeon as gs

from onnxfuse.ir import edit
from onnxfuse.passes._checks import describe, is_op, private_check, renew_output, replaced, skip
from onnxfuse.passes._fold import batchnorm_scale_shift, fold_fits
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
from onnxfuse.passes.base import Context, Pass
from onnxfuse.records import Fusion, Reason, RewriteKind, Skip

#: Nodes that may sit between the BN and the Gemm: they turn the BN output into the Gemm's 2-D input.
RESHAPE_OPS = ("Flatten", "Reshape")


class BatchNormGemm(Pass[GemmFoldMatch]):
    """BatchNormalization -> (Flatten/Reshape ->) Gemm => (Flatten/Reshape ->) Gemm with the BN folded into B, C."""

    name = "batchnorm_gemm"
    kind = RewriteKind.FOLD
    summary = "fold BatchNormalization (inference mode) into the Gemm it feeds, through a Flatten or Reshape"
    reasons = (Reason.NOT_PRIVATE, Reason.GRAPH_OUTPUT, Reason.GEMM_TRANS_A, Reason.FLATTEN_REORDERS,
               Reason.WEIGHTS_NOT_CONSTANT, Reason.INITIALIZER_IS_INPUT, Reason.PARAMS_NOT_CONSTANT,
               Reason.TRAINING_MODE, Reason.PARAM_SHAPE, Reason.DTYPE_NOT_FOLDABLE, Reason.FOLD_NOT_FINITE,
               Reason.QDQ_GEMM, Reason.BN_SPATIAL)
    anchors = ("Gemm",)

    def match(self, node: gs.Node, ctx: Context) -> GemmFoldMatch | Skip | None:
        if not is_op(node, *self.anchors):
            return None
        reshape = edit.producer(node.inputs[0])
        bn = edit.producer(reshape.inputs[0]) if is_op(reshape, *RESHAPE_OPS) and reshape.inputs else reshape
        reshape = reshape if reshape is not bn else None
        if not is_op(bn, "BatchNormalization"):
            return None
        between = [reshape] if reshape is not None else []
        nodes, out = [bn, *between, node], node.outputs[0]
        intermediates = [bn.outputs[0]] + [r.outputs[0] for r in between]
        bad = private_check(intermediates, [*between, node], ctx, nodes, out) or gemm_qdq_check(node, out, nodes)
        if bad:
            return bad
        attrs = GemmAttrs.of(node)
        if attrs.trans_a:
            return skip(Reason.GEMM_TRANS_A, "Gemm has transA=1: the BN channels are its rows, not its input "
                        "features", nodes, out)
        if reshape is not None:
            check = self._flatten_check if reshape.op == "Flatten" else self._reshape_check
            bad = check(reshape, bn, ctx, nodes, out)
            if bad:
                return bad
        b, c, bad = gemm_parts(node, ctx, nodes, out)
        if bad:
            return bad
        s, t, bad = batchnorm_scale_shift(bn, ctx, nodes, out, None)
        if bad:
            return bad
        k, n = in_features(b, attrs.trans_b), out_features(b, attrs.trans_b)
        if k % s.size or (reshape is None and s.size != k):
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

    @staticmethod
    def _reshape_check(reshape: gs.Node, bn: gs.Node, ctx: Context, nodes: list[gs.Node],
                       out: gs.Tensor) -> Skip | None:
        """A Reshape to 2-D keeps one sample's features per row, in order, when it keeps axis 0: its shape is a
        constant ``[0, x]`` (0 copies the dim unless ``allowzero``; ONNX Operators.md, Reshape) or ``[-1, K]``
        with K the product of the BN input's static dims after the first (torch's dynamo exporter writes
        ``x.flatten(1)`` so), or shape inference gives the output's first dim as the very dim (number or symbol)
        of the BN input's."""
        target, _ = ctx.constant(reshape.inputs[1]) if len(reshape.inputs) > 1 else (None, None)
        x_shape, y_shape = ctx.shape(bn.inputs[0]), ctx.shape(reshape.outputs[0])
        if target is not None and target.size == 2:
            first, second = (int(v) for v in target.reshape(-1))
            if first == 0 and not int(reshape.attrs.get("allowzero", 0)):
                return None
            rest = x_shape[1:] if x_shape else None
            if first == -1 and rest and all(isinstance(d, int) for d in rest) and math.prod(rest) == second:
                return None
        if x_shape and y_shape and len(y_shape) == 2 and x_shape[0] is not None and x_shape[0] == y_shape[0]:
            return None
        shown = "a run-time shape" if target is None else str(target.reshape(-1).tolist())
        return skip(Reason.FLATTEN_REORDERS, f"Reshape to {shown} is not known to keep axis 0 (the samples) of "
                    f"the BN output (shapes {x_shape} -> {y_shape})", nodes, out)

    def rewrite(self, match: GemmFoldMatch, ctx: Context) -> Fusion:
        bn, *between, gemm = match.nodes
        original = replaced([bn, gemm])  # a Flatten/Reshape stays in the graph: it is not part of the fused node
        (between[0] if between else gemm).inputs[0] = bn.inputs[0]
        if between:  # the Flatten/Reshape stays, and now reshapes X, not BN(X): its output is another value
            renew_output(between[0], ctx, "unnormalized")
        set_gemm_weights(gemm, ctx, match.b, match.c, match.dtype)
        edit.replace_chain(ctx.edit_order, gemm, gemm, [bn])
        return describe(self, gemm, original)
