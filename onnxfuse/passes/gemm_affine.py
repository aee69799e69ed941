"""Fold a per-output-feature constant Add, Sub, Mul or Div into the Gemm that feeds it.

Before => after (Y = Gemm(...) is [M, N]; c broadcasts along the last axis only: [N], [1, N], [1], [])::

    Add(gemm, c) or Add(c, gemm)   =>  Gemm(A, B, beta * C + c)
    Sub(gemm, c)                   =>  Gemm(A, B, beta * C - c)
    Sub(c, gemm)                   =>  Gemm(A, -B, c - beta * C)
    Mul(gemm, c) or Mul(c, gemm)   =>  Gemm(A, B * c[n], beta * C * c)
    Div(gemm, c)                   =>  Gemm(A, B / c[n], beta * C / c)

Math (ONNX Operators.md, Gemm: ``Y = alpha * A' @ B' + beta * C``): Y is linear in B' and C, and scaling output
feature n scales column n of B' (row n of B when transB = 1). alpha, transA and transB are kept; the new C holds
``beta * C`` so beta becomes 1 (C = 0 when absent). Computed in float64 in ``match``, stored in B's dtype.
Broadcasting follows ONNX Operators.md, "Broadcasting in ONNX" (numpy rules, right-aligned).

A B computed from compact constants (int8 x scale, ConstantOfShape...; ``_fold.compact_weight``) stays compact:
Add and Sub(gemm, c) change only C; B's factor (c, 1/c, -1) goes into its per-feature scale or a small
``Mul(B, factor)`` before the Gemm, and onnxruntime computes B' at load.

Skipped when:
    intermediate-has-other-consumers   the Gemm output is read by another node too
    intermediate-is-graph-output       the Gemm output is a graph output
    weights-not-constant               B or C is computed at run time
    initializer-is-graph-input         B, C or c is an overridable initializer (a graph input, IR >= 4)
    constant-not-per-feature           c varies along the rows (a [M, 1] or [M, N] constant) or has rank > 2
    gemm-output-is-divisor             Div(c, gemm): 1/Y is not linear
    zero-in-divisor                    Div(gemm, c) with a zero in c
    parameter-shape-mismatch           B or C does not have a Gemm shape
    dtype-not-foldable                 B is not float16/float32/float64
    fold-not-finite                    B' or C' would hold inf/NaN or overflow B's dtype
    quantized-gemm                     the Gemm is part of a QuantizeLinear/DequantizeLinear pattern
    fold-copies-shared-weight          B is also read by other nodes (so it stays) and its folded copy would
                                       grow the whole model past 1 MiB plus --materialize-weights (passes/_growth.py)
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from onnxfuse.ir import edit
from onnxfuse.passes._checks import describe, is_op, replaced, skip
from onnxfuse.passes._fold import CompactWeight, compact_scale_axis, fold_fits, set_compact_scale
from onnxfuse.passes._gemm import (
    GemmAttrs,
    GemmFoldMatch,
    c_matrix,
    gemm_fold_inputs,
    out_features,
    per_feature,
    scale_out_features,
    set_gemm_weights,
)
from onnxfuse.passes.base import Context, Pass
from onnxfuse.records import Fusion, Reason, RewriteKind, Skip


class GemmAffine(Pass[GemmFoldMatch]):
    """Gemm -> Add/Sub/Mul/Div by a per-feature constant => Gemm with folded B and C."""

    name = "gemm_affine"
    kind = RewriteKind.FOLD
    summary = "fold Add/Sub (bias) and Mul/Div (scale) by per-feature constants into the preceding Gemm"
    reasons = (Reason.NOT_PRIVATE, Reason.GRAPH_OUTPUT, Reason.WEIGHTS_NOT_CONSTANT, Reason.INITIALIZER_IS_INPUT,
               Reason.NOT_PER_FEATURE, Reason.GEMM_IS_DIVISOR, Reason.ZERO_DIVISOR, Reason.PARAM_SHAPE,
               Reason.DTYPE_NOT_FOLDABLE, Reason.FOLD_NOT_FINITE, Reason.QDQ_GEMM, Reason.SHARED_WEIGHT_GROWTH)
    anchors = ("Add", "Sub", "Mul", "Div")

    def match(self, node: gs.Node, ctx: Context) -> GemmFoldMatch | Skip | None:
        if not is_op(node, *self.anchors) or len(node.inputs) != 2:
            return None
        for side in (0, 1):
            gemm = edit.producer(node.inputs[side])
            if not is_op(gemm, "Gemm"):
                continue
            c_tensor = node.inputs[1 - side]
            const, why = ctx.constant(c_tensor)
            if const is None and why != Reason.INITIALIZER_IS_INPUT:
                continue  # a run-time operand (a residual Add), not an affine constant
            nodes, out = [gemm, node], node.outputs[0]
            if const is None:  # why is INITIALIZER_IS_INPUT: any other reason continued above
                return skip(Reason.INITIALIZER_IS_INPUT,
                            f"{c_tensor.name} is an initializer listed as a graph input (overridable)", nodes, out)
            if node.op == "Div" and side == 1:
                return skip(Reason.GEMM_IS_DIVISOR, f"{c_tensor.name} / Gemm output is not linear", nodes, out)
            b, c, bad = gemm_fold_inputs(gemm, node, ctx, nodes, out, compact=True)
            if bad:
                return bad
            attrs = GemmAttrs.of(gemm)
            n = out_features(b, attrs.trans_b)
            vec = per_feature(const, n)
            if vec is None:
                return skip(Reason.NOT_PER_FEATURE, f"constant of shape {list(const.shape)} does not broadcast "
                            f"along the last axis of a [M, {n}] Gemm output only", nodes, out)
            if node.op == "Div" and not np.all(vec):
                return skip(Reason.ZERO_DIVISOR, f"{c_tensor.name} contains a zero", nodes, out)
            compact = None
            if isinstance(b, CompactWeight):
                factor, new_c = self._compact_fold(node.op, side == 0, attrs, c, vec)
                new_b = None
                if factor is not None:
                    axis = 0 if attrs.trans_b else 1
                    compact, bad = compact_scale_axis(gemm, b, axis, n, factor, ctx, nodes, out)
                    if bad:
                        return bad
            else:
                new_b, new_c = self._fold(node.op, side == 0, attrs, b, c, vec)
            bad = fold_fits(b.dtype, new_b, new_c, nodes, out)
            return bad or GemmFoldMatch(nodes, b=new_b, c=new_c, dtype=b.dtype, scale=compact)
        return None

    @staticmethod
    def _compact_fold(op: str, gemm_first: bool, attrs: GemmAttrs, c: np.ndarray | None, vec: np.ndarray):
        """``(factor per output feature or None, C')`` in float64 for a B computed from compact constants: the
        factor goes into B's computation (``_fold.compact_scale_axis``), None leaves B as it is."""
        with np.errstate(all="ignore"):
            c_eff = attrs.beta * c_matrix(c, vec.size)
            if op == "Add":
                return None, c_eff + vec
            if op == "Sub":
                return (None, c_eff - vec) if gemm_first else (np.full_like(vec, -1.0), vec - c_eff)
            scale = vec if op == "Mul" else 1.0 / vec
            return scale, (None if c is None else c_eff * scale)

    @staticmethod
    def _fold(op: str, gemm_first: bool, attrs: GemmAttrs, b: np.ndarray, c: np.ndarray | None, vec: np.ndarray):
        """``(B', C')`` in float64; None for what stays as it is."""
        n = vec.size
        with np.errstate(all="ignore"):
            c_eff = attrs.beta * c_matrix(c, n)
            if op == "Add":
                return None, c_eff + vec
            if op == "Sub":
                return (None, c_eff - vec) if gemm_first else (-b.astype(np.float64), vec - c_eff)
            scale = vec if op == "Mul" else 1.0 / vec
            return scale_out_features(b, attrs.trans_b, scale), (None if c is None else c_eff * scale)

    def rewrite(self, match: GemmFoldMatch, ctx: Context) -> Fusion:
        gemm, op_node = match.nodes
        original = replaced(match.nodes)
        slot = ctx.edit_order.slot(gemm)
        set_gemm_weights(gemm, ctx, match.b, match.c, match.dtype)
        edit.replace_chain(ctx.edit_order, gemm, op_node, [op_node])
        if match.scale is not None:
            set_compact_scale(gemm, ctx, match.scale, slot)
        return describe(self, gemm, original)
