"""Turn a 2-D MatMul by a constant matrix followed by a constant bias Add into one Gemm.

Before => after (X is [M, K], W a constant [K, N], b broadcasts to [M, N] without growing it: [N], [1, N], [1],
[], [M, N] or [M, 1], M a known number for the last two)::

    MatMul(X, W) -> Add(b) or Add(b, matmul)   =>  Gemm(X, W, b)      (alpha = beta = 1, no transposes)
    Transpose(A, perm=[1, 0]) -> MatMul(., W) -> Add(b)
                                               =>  Gemm(A, W, b, transA=1)

Math (ONNX Operators.md, Gemm: ``Y = alpha * A @ B + beta * C``, C unidirectionally broadcast to [M, N]): with
alpha = beta = 1 this is ``X @ W + b``, the same arithmetic in the same order, so the result is the original's up
to the kernel's summation order. Gemm's C must be unidirectionally broadcastable to [M, N] (Operators.md, Gemm;
Broadcasting.md), which every shape above is, and the Add's output is [M, N] for exactly those shapes too. b is
reused as Gemm's C as it is (no copy). A 2-D Transpose that only this MatMul reads is Gemm's ``transA``
(Operators.md, Gemm: "A' = transpose(A) if transA else A"): the same values, one node and one tensor fewer.
The Gemm can then take the folds of ``gemm_batchnorm``/``gemm_affine``/``batchnorm_gemm`` and the activation of
``gemm_activation``.

Skipped when:
    intermediate-has-other-consumers   the MatMul output is read by another node too
    intermediate-is-graph-output       the MatMul output is a graph output
    matmul-input-not-2d                X is not 2-D (a batched [B, S, K] MatMul, or a rank shape inference does
                                       not know), or W is not a 2-D matrix: Gemm is 2-D only
    weights-not-constant               W is computed at run time
    initializer-is-graph-input         W or b is an overridable initializer (a graph input, IR >= 4)
    constant-not-per-feature           b does not broadcast to [M, N] as Gemm's C must: rank above 2, a column
                                       count other than 1 or N, or rows other than 1 while M is symbolic or
                                       different (the Add would then grow the output)
    parameters-not-constant            b is computed at run time (a run-time operand shaped like a bias: [N],
                                       [1], [], or [1, N] while M is a known number other than 1; an operand
                                       of the output's own shape is a residual and is left alone unlisted)
    dtype-not-foldable                 W is not float16/float32/float64
    quantized-gemm                     the MatMul is part of a QuantizeLinear/DequantizeLinear pattern
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_graphsurgeon as gs

from onnxfuse.ir import edit
from onnxfuse.passes._checks import describe, is_op, private_check, replaced, skip
from onnxfuse.passes._gemm import gemm_qdq_check, matmul_weight
from onnxfuse.passes.base import Context, Match, Pass
from onnxfuse.records import Fusion, Reason, RewriteKind, Skip


@dataclass
class MatMulAddMatch(Match):
    """A MatMul -> Add pair; ``bias`` is the Add's constant operand, which becomes Gemm's C."""

    bias: gs.Tensor
    transposed: gs.Node | None = None


class MatMulAdd(Pass[MatMulAddMatch]):
    """MatMul(X, W) -> Add(b) => Gemm(X, W, b)."""

    name = "matmul_add"
    kind = RewriteKind.FUSE
    summary = "turn a 2-D MatMul by a constant matrix + bias Add into Gemm"
    reasons = (Reason.NOT_PRIVATE, Reason.GRAPH_OUTPUT, Reason.MATMUL_NOT_2D, Reason.WEIGHTS_NOT_CONSTANT,
               Reason.INITIALIZER_IS_INPUT, Reason.NOT_PER_FEATURE, Reason.DTYPE_NOT_FOLDABLE, Reason.QDQ_GEMM,
               Reason.PARAMS_NOT_CONSTANT)
    anchors = ("Add",)

    def match(self, node: gs.Node, ctx: Context) -> MatMulAddMatch | Skip | None:
        if not is_op(node, *self.anchors) or len(node.inputs) != 2:
            return None
        for side in (0, 1):
            mm = edit.producer(node.inputs[side])
            if not is_op(mm, "MatMul"):
                continue
            b_tensor = node.inputs[1 - side]
            b, why = ctx.constant(b_tensor)
            nodes, out = [mm, node], node.outputs[0]
            if b is None and why != Reason.INITIALIZER_IS_INPUT:
                if not _run_time_bias(mm, b_tensor, ctx):
                    continue  # a run-time operand (a residual Add), not a bias
                bad = private_check([mm.outputs[0]], [node], ctx, nodes, out) or gemm_qdq_check(mm, out, nodes)
                return bad or skip(Reason.PARAMS_NOT_CONSTANT, f"bias {b_tensor.name} is computed at run time; "
                                   "matmul_add makes a Gemm with a constant bias only", nodes, out)
            if b is None:  # why is INITIALIZER_IS_INPUT: any other reason returned or continued above
                return skip(Reason.INITIALIZER_IS_INPUT,
                            f"bias {b_tensor.name} is an initializer listed as a graph input (overridable)", nodes, out)
            bad = private_check([mm.outputs[0]], [node], ctx, nodes, out) or gemm_qdq_check(mm, out, nodes)
            if bad:
                return bad
            return self._check(mm, b, ctx, nodes, out) or MatMulAddMatch(nodes, bias=b_tensor,
                                                                          transposed=_private_transpose(mm, ctx))
        return None

    @staticmethod
    def _check(mm: gs.Node, b, ctx: Context, nodes: list[gs.Node], out: gs.Tensor) -> Skip | None:
        x_shape = ctx.shape(mm.inputs[0])
        if x_shape is None or len(x_shape) != 2:
            rank = "of unknown rank" if x_shape is None else f"{len(x_shape)}-D"
            return skip(Reason.MATMUL_NOT_2D, f"MatMul input {mm.inputs[0].name} is {rank}; Gemm takes 2-D only",
                        nodes, out)
        w, bad = matmul_weight(mm, ctx, nodes, out)
        if w is None:
            return bad
        if not _c_broadcasts(b, x_shape[0], int(w.shape[1])):
            return skip(Reason.NOT_PER_FEATURE, f"bias of shape {list(b.shape)} does not broadcast to the "
                        f"[{x_shape[0]}, {w.shape[1]}] output as Gemm's C must", nodes, out)
        return None

    def rewrite(self, match: MatMulAddMatch, ctx: Context) -> Fusion:
        mm, add = match.nodes
        t = match.transposed
        original = replaced(([t] if t is not None else []) + match.nodes)
        if t is not None:
            edit.replace_input(ctx.edit_order, mm, 0, t.inputs[0], [t])
            mm.attrs["transA"] = 1
        mm.op = "Gemm"
        mm.inputs.append(match.bias)
        edit.replace_chain(ctx.edit_order, mm, add, [add])
        return describe(self, mm, original)


def _private_transpose(mm: gs.Node, ctx: Context) -> gs.Node | None:
    """The Transpose(perm=[1, 0], or the default reversal of a 2-D tensor) that computes the MatMul's first input
    when only the MatMul reads its output, in the same graph; else None."""
    t = edit.producer(mm.inputs[0])
    if not is_op(t, "Transpose") or not t.inputs or (ctx.members and id(t) not in ctx.members):
        return None
    shape = ctx.shape(t.inputs[0])
    perm = t.attrs.get("perm")
    if shape is None or len(shape) != 2 or (perm is not None and [int(p) for p in perm] != [1, 0]):
        return None
    out = t.outputs[0]
    if len(edit.consumers(out)) != 1 or edit.is_graph_output(out, ctx.graph):
        return None
    return t


def _run_time_bias(mm: gs.Node, b: gs.Tensor, ctx: Context) -> bool:
    """True when the run-time Add operand ``b`` is shaped like a bias of the 2-D MatMul output, never like a
    residual: rank 0 or 1 (``[N]``, ``[1]``, ``[]``), or ``[1, N]`` while the output has a known row count other
    than 1. A residual has the output's own shape."""
    shape, y_shape = ctx.shape(b), ctx.shape(mm.outputs[0])
    if shape is None or y_shape is None or len(y_shape) != 2 or not all(isinstance(d, int) for d in shape):
        return False
    if len(shape) <= 1:
        return True
    return len(shape) == 2 and shape[0] == 1 and isinstance(y_shape[0], int) and y_shape[0] != 1


def _c_broadcasts(b, m: int | str | None, n: int) -> bool:
    """True when a bias of ``b``'s shape is a valid Gemm C for a [m, n] output that the Add leaves [m, n]:
    unidirectionally broadcastable to [m, n] (ONNX Broadcasting.md), its rows 1 or m where m is a known number
    (a symbolic or unknown m could be 1 at run time, and the Add would then give b's row count)."""
    if b.ndim > 2:
        return False
    rows, cols = (1,) * (2 - b.ndim) + tuple(int(d) for d in b.shape)
    return cols in (1, n) and (rows == 1 or (isinstance(m, int) and rows == m))
