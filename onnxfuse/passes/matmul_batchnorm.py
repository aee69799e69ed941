"""Fold an inference-mode BatchNormalization after a MatMul by a constant matrix into that matrix.

Before => after (W a constant [K, N]; zero or more Reshape/Transpose nodes between, each read by the next only)::

    MatMul(X, W) -> [Reshape | Transpose]* -> BatchNormalization(scale, bias, mean, var, epsilon)
        =>  MatMul(X, W') -> Add(t) -> [Reshape | Transpose]*

The pattern is onnxruntime's MatmulBNFusion (onnxruntime/core/optimizer/matmul_bn_fusion.cc), whose conditions
name no axis (the BN parameters must have N values); onnxfuse folds only where it is exact: where the BN's
channel axis (axis 1, ONNX Operators.md, BatchNormalization) is, traced back through the Transposes and
Reshapes, the last axis of the MatMul output, the N columns of W. A Transpose's output axis a is its input
axis ``perm[a]`` (Operators.md, Transpose); a Reshape's output axis a is its input axis j when both are known
numbers, equal, and the dims before them hold the same number of elements (the same row-major slices). The
matmul_add pass then makes the MatMul + Add one Gemm (with a Reshape pair where X is not 2-D).

Math (Operators.md, BatchNormalization: ``Z = (Y - mean) / sqrt(var + epsilon) * scale + bias``, per channel c;
MatMul: ``Y[..., n] = sum_k X[..., k] W[k, n]``)::

    s  = scale / sqrt(var + epsilon),  t = bias - mean * s       float64, epsilon default 1e-5 (float32)
    W' = W * s (column n times s[n]),  then Add(t) per column    t is [N]

Reshape and Transpose only move elements, so channel c of the BN is column c of the MatMul output everywhere.
With Reshapes/Transposes between, the Add and each of them but the last (which writes the BN's output) write
tensors of new names (``<name>_normalized``, ``_checks.renew_output``): they hold normalized values now, so no
name of the input means another value in the output (``onnxfuse verify --layers`` compares tensors by name).

Skipped when:
    intermediate-has-other-consumers   the MatMul output or a Reshape/Transpose output is read by another node
    intermediate-is-graph-output       one of them is a graph output
    weights-not-constant               W is computed at run time
    initializer-is-graph-input         W or a BN parameter is an overridable initializer (a graph input, IR >= 4)
    parameters-not-constant            a BN parameter is computed at run time
    batchnorm-training-mode            training_mode=1, or the running-statistics outputs are used
    batchnorm-spatial-0                spatial=0 (opset < 9: per-element statistics)
    parameter-shape-mismatch           a BN parameter does not have N values
    matmul-input-not-2d                W is not a 2-D matrix
    dtype-not-foldable                 W is not float16/float32/float64
    fold-not-finite                    W' or t would hold inf/NaN or overflow W's dtype (var + epsilon = 0)
    fold-copies-shared-weight          W is also read by other nodes and its folded copy would grow the model
                                       past 1 MiB plus --materialize-weights (passes/_growth.py)
    batchnorm-axis-not-matmul-feature  the BN's channel axis is another axis of the MatMul output than its last,
                                       or a Reshape's shapes are not known numbers where the axis is traced
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from onnxfuse.ir import constants, edit
from onnxfuse.passes import _growth
from onnxfuse.passes._checks import describe, is_op, private_check, renew_output, replaced, skip
from onnxfuse.passes._fold import batchnorm_mode_check, batchnorm_scale_shift, fold_fits
from onnxfuse.passes._gemm import matmul_weight
from onnxfuse.passes.base import Context, Match, Pass
from onnxfuse.records import Fusion, Reason, RewriteKind, Skip

#: the most Reshape/Transpose nodes looked through between the MatMul and the BN
MAX_CHAIN = 8


@dataclass
class MatMulBatchNormMatch(Match):
    """``nodes`` = [MatMul, *Reshape/Transpose, BatchNormalization]; ``w`` is W' and ``t`` the per-column shift,
    both float64 until stored in ``dtype``."""

    w: np.ndarray
    t: np.ndarray
    dtype: np.dtype


class MatMulBatchNorm(Pass[MatMulBatchNormMatch]):
    """MatMul(X, W) -> [Reshape | Transpose]* -> BatchNormalization => MatMul(X, W') -> Add(t) -> [...]."""

    name = "matmul_batchnorm"
    kind = RewriteKind.FOLD
    summary = "fold BatchNormalization (inference mode) over a MatMul's output columns into its constant matrix"
    reasons = (Reason.NOT_PRIVATE, Reason.GRAPH_OUTPUT, Reason.WEIGHTS_NOT_CONSTANT, Reason.INITIALIZER_IS_INPUT,
               Reason.PARAMS_NOT_CONSTANT, Reason.TRAINING_MODE, Reason.BN_SPATIAL, Reason.PARAM_SHAPE,
               Reason.MATMUL_NOT_2D, Reason.DTYPE_NOT_FOLDABLE, Reason.FOLD_NOT_FINITE, Reason.SHARED_WEIGHT_GROWTH,
               Reason.BN_AXIS_NOT_FEATURE)
    anchors = ("BatchNormalization",)

    def match(self, node: gs.Node, ctx: Context) -> MatMulBatchNormMatch | Skip | None:
        if not is_op(node, *self.anchors) or len(node.inputs) < 5:
            return None
        chain: list[gs.Node] = []
        p = edit.producer(node.inputs[0])
        while is_op(p, "Reshape", "Transpose") and p.inputs and len(chain) < MAX_CHAIN:
            chain.insert(0, p)
            p = edit.producer(p.inputs[0])
        if not is_op(p, "MatMul") or len(p.inputs) != 2:
            return None
        mm = p
        nodes, out = [mm, *chain, node], node.outputs[0]
        inner = [mm.outputs[0], *(c.outputs[0] for c in chain)]
        bad = private_check(inner, [*chain, node], ctx, nodes, out) or batchnorm_mode_check(node, ctx, nodes, out)
        if bad:
            return bad
        w, bad = matmul_weight(mm, ctx, nodes, out)
        if w is None:
            return bad
        why_axis = _channel_is_last(mm, chain, ctx)
        if why_axis:
            return skip(Reason.BN_AXIS_NOT_FEATURE, why_axis, nodes, out)
        s, t, bad = batchnorm_scale_shift(node, ctx, nodes, out, int(w.shape[1]))
        if bad:
            return bad
        with np.errstate(all="ignore"):
            new_w = w.astype(np.float64) * s[None, :]
        return (fold_fits(w.dtype, new_w, t, nodes, out) or _growth.check(mm, ctx, {1: new_w}, nodes, out)
                or MatMulBatchNormMatch(nodes, w=new_w, t=t, dtype=w.dtype))

    def rewrite(self, match: MatMulBatchNormMatch, ctx: Context) -> Fusion:
        mm, *chain, bn = match.nodes
        original = replaced(match.nodes)
        order = ctx.edit_order
        base = mm.name or mm.outputs[0].name
        _growth.spend(mm, ctx, {1: match.w})
        mm.inputs[1] = constants.new_constant(ctx.namer, f"{base}.weight_folded", match.w.astype(match.dtype))
        shift = constants.new_constant(ctx.namer, f"{base}.shift_folded", match.t.astype(match.dtype))
        y = mm.outputs[0]
        scaled = gs.Variable(ctx.namer.fresh(f"{base}.scaled"), dtype=ctx.dtype(y), shape=ctx.shape(y))
        mm.outputs = [scaled]
        bn.outputs = bn.outputs[:1]
        if not chain:  # the BN node becomes the Add, in its own slot, writing its own output
            bn.op, bn.attrs, bn.domain = "Add", {}, ""
            bn.name = ctx.namer.fresh(f"{base}.shift")
            bn.inputs = [scaled, shift]
            return describe(self, mm, original)
        add = gs.Node("Add", name=ctx.namer.fresh(f"{base}.shift"), inputs=[scaled, shift], outputs=[y])
        order.insert_before(add, order.slot(chain[0]))
        ctx.members.add(id(add))
        for node in (add, *chain[:-1]):  # they hold the normalized values now, not MatMul(X, W)'s: new names
            renew_output(node, ctx, "normalized")
        edit.replace_chain(order, chain[-1], bn, [bn])  # the last Reshape/Transpose writes the BN's output
        return describe(self, mm, original)


def _channel_is_last(mm: gs.Node, chain: list[gs.Node], ctx: Context) -> str | None:
    """None when the BN's channel axis (1) is the MatMul output's last axis through ``chain``; else why not."""
    axis = 1
    for node in reversed(chain):
        if node.op == "Transpose":
            shape = ctx.shape(node.inputs[0])
            perm = node.attrs.get("perm")
            if perm is None:
                if shape is None:
                    return f"the rank of {node.inputs[0].name} is not known"
                perm = list(range(len(shape)))[::-1]
            if axis >= len(perm):
                return f"Transpose {node.name} has no axis {axis}"
            axis = int(perm[axis])
            continue
        src, dst = ctx.shape(node.inputs[0]), ctx.shape(node.outputs[0])
        mapped = _reshape_axis(axis, src, dst)
        if mapped is None:
            return (f"Reshape {node.name} ({_dims(src)} -> {_dims(dst)}) does not keep the channel axis {axis} "
                    "as one input axis of known size")
        axis = mapped
    rank = ctx.shape(mm.outputs[0])
    if rank is None:
        return f"the rank of the MatMul output {mm.outputs[0].name} is not known"
    if axis != len(rank) - 1:
        return (f"the BatchNormalization's channel axis is axis {axis} of the MatMul output {_dims(rank)}, not its "
                "last (the columns of the constant weight)")
    return None


def _reshape_axis(axis: int, src: tuple | None, dst: tuple | None) -> int | None:
    """The input axis j of a Reshape ``src -> dst`` that output axis ``axis`` is (same size, the same number of
    elements before it), or None when there is none or a dim needed is not a known number."""
    if src is None or dst is None or axis >= len(dst):
        return None
    head, size = dst[:axis], dst[axis]
    if not isinstance(size, int) or not all(isinstance(d, int) for d in head):
        return None
    before = math.prod(head)
    count = 1
    for j, d in enumerate(src):
        if not isinstance(d, int):
            return None
        if count == before and d == size:
            return j
        count *= d
        if count > before:
            return None
    return None


def _dims(shape: tuple | None) -> str:
    return "?" if shape is None else "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
