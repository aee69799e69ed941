"""Turn a 2-D MatMul by a constant matrix followed by a per-feature bias Add into one Gemm.

Before => after (X is [M, K], W a constant [K, N], b broadcasts along the last axis: [N], [1, N], [1] or [])::

    MatMul(X, W) -> Add(b) or Add(b, matmul)   =>  Gemm(X, W, b)      (alpha = beta = 1, no transposes)

Math (ONNX Operators.md, Gemm: ``Y = alpha * A @ B + beta * C``, C unidirectionally broadcast to [M, N]): with
alpha = beta = 1 this is ``X @ W + b``, the same arithmetic in the same order, so the result is the original's up
to the kernel's summation order. b is reused as Gemm's C as it is (no copy). The Gemm can then take the folds of
``gemm_batchnorm``/``gemm_affine``/``batchnorm_gemm`` and the activation of ``gemm_activation``.

Skipped when:
    intermediate-has-other-consumers   the MatMul output is read by another node too
    intermediate-is-graph-output       the MatMul output is a graph output
    matmul-input-not-2d                X is not 2-D (a batched [B, S, K] MatMul, or a rank shape inference does
                                       not know), or W is not a 2-D matrix: Gemm is 2-D only
    weights-not-constant               W is computed at run time
    initializer-is-graph-input         W or b is an overridable initializer (IR < 4 style)
    constant-not-per-feature           b varies along another axis than the last (a [M, N] or [M, 1] constant)
    dtype-not-foldable                 W is not float16/float32/float64
    quantized-conv                     the MatMul is part of a QuantizeLinear/DequantizeLinear pattern
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_graphsurgeon as gs

from onnxfuse import graph as g
from onnxfuse.passes._checks import describe, is_op, private_check, replaced, skip
from onnxfuse.passes._fold import FOLDABLE_DTYPES
from onnxfuse.passes._gemm import gemm_qdq_check, per_feature
from onnxfuse.passes.base import Context, Fusion, Match, Pass, Reason, Skip


@dataclass
class MatMulAddMatch(Match):
    """A MatMul -> Add pair; ``bias`` is the Add's constant operand, which becomes Gemm's C."""

    bias: gs.Tensor


class MatMulAdd(Pass[MatMulAddMatch]):
    """MatMul(X, W) -> Add(b) => Gemm(X, W, b)."""

    name = "matmul_add"
    summary = "turn a 2-D MatMul by a constant matrix + bias Add into Gemm"
    reasons = (Reason.NOT_PRIVATE, Reason.GRAPH_OUTPUT, Reason.MATMUL_NOT_2D, Reason.WEIGHTS_NOT_CONSTANT,
               Reason.INITIALIZER_IS_INPUT, Reason.NOT_PER_FEATURE, Reason.DTYPE_NOT_FOLDABLE, Reason.QDQ)
    anchors = ("Add",)

    def match(self, node: gs.Node, ctx: Context) -> MatMulAddMatch | Skip | None:
        if not is_op(node, *self.anchors) or len(node.inputs) != 2:
            return None
        for side in (0, 1):
            mm = g.producer(node.inputs[side])
            if not is_op(mm, "MatMul"):
                continue
            b_tensor = node.inputs[1 - side]
            b, why = ctx.constant(b_tensor)
            if b is None and why != Reason.INITIALIZER_IS_INPUT:
                continue  # a run-time operand (a residual Add), not a bias
            nodes, out = [mm, node], node.outputs[0]
            if b is None:
                return skip(why, f"bias {b_tensor.name} is an initializer listed as a graph input (overridable)",
                            nodes, out)
            bad = private_check([mm.outputs[0]], [node], ctx, nodes, out) or gemm_qdq_check(mm, out, nodes)
            if bad:
                return bad
            return self._check(mm, b, ctx, nodes, out) or MatMulAddMatch(nodes, bias=b_tensor)
        return None

    @staticmethod
    def _check(mm: gs.Node, b, ctx: Context, nodes: list[gs.Node], out: gs.Tensor) -> Skip | None:
        x_shape = ctx.shape(mm.inputs[0])
        if x_shape is None or len(x_shape) != 2:
            rank = "of unknown rank" if x_shape is None else f"{len(x_shape)}-D"
            return skip(Reason.MATMUL_NOT_2D, f"MatMul input {mm.inputs[0].name} is {rank}; Gemm takes 2-D only",
                        nodes, out)
        w, why = ctx.constant(mm.inputs[1])
        if w is None:
            reason = why if why == Reason.INITIALIZER_IS_INPUT else Reason.WEIGHTS_NOT_CONSTANT
            return skip(reason, f"MatMul weight {mm.inputs[1].name} is not a constant", nodes, out)
        if w.ndim != 2:
            return skip(Reason.MATMUL_NOT_2D, f"MatMul weight {mm.inputs[1].name} is {w.ndim}-D, not a matrix",
                        nodes, out)
        if w.dtype not in FOLDABLE_DTYPES:
            return skip(Reason.DTYPE_NOT_FOLDABLE, f"{w.dtype} MatMul is left as it is", nodes, out)
        if per_feature(b, int(w.shape[1])) is None:
            return skip(Reason.NOT_PER_FEATURE, f"bias of shape {list(b.shape)} does not broadcast along the last "
                        f"axis of a [M, {w.shape[1]}] output only", nodes, out)
        return None

    def rewrite(self, match: MatMulAddMatch, ctx: Context) -> Fusion:
        mm, add = match.nodes
        original = replaced(match.nodes)
        mm.op = "Gemm"
        mm.inputs.append(match.bias)
        g.replace_chain(ctx.order, mm, add, [add])
        return describe(self.name, mm, original)
