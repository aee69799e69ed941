"""Fold a per-input-channel scale and offset before a Conv into the Conv's weights and bias.

Before => after (s, o constants that vary along the channel axis only: [C], [1, C, 1, 1], [C, 1, 1], [1], [])::

    Mul(X, s) -> Add(., o) -> Conv(., W, B)    =>  Conv(X, W', B')     (pads all 0)
    Add(X, o) -> Conv, Mul(X, s) -> Conv, Sub(X, o) -> Conv, Add -> Mul -> Conv: the same with s = 1 or o = 0

Math (ONNX Operators.md, Conv: ``Y[m] = B[m] + sum over c, k of W[m, c, k] * X'[c, k]``, X' the input at the
kernel's taps): with X' = s[c] * X + o[c] at every tap,
``Y[m] = (B[m] + sum_{c,k} W[m, c, k] * o[c]) + sum_{c,k} (W[m, c, k] * s[c]) * X[c, k]``, so
``W'[m, c, k] = W[m, c, k] * s[c]`` and ``B'[m] = B[m] + sum_{c,k} W[m, c, k] * o[c]``; with ``group`` g, input
channel c of output channel m is ``(m // (M / g)) * (C / g) + c``. It holds only where every tap reads the input
itself: a padded tap reads 0 in the original, not ``o[c]``, so the Conv's pads must all be 0 (auto_pad NOTSET
with zero pads, or VALID). Folded in float64, stored in W's dtype. (onnxslim and onnxscript's rewriter make the
same fold.)

Skipped when:
    intermediate-has-other-consumers   an output of the Mul/Add/Sub is read by another node too
    intermediate-is-graph-output       an output of the Mul/Add/Sub is a graph output
    constant-not-per-channel           s or o varies along an axis other than the channel axis, or broadcasts the
                                       input to a larger shape (or the shapes are unknown)
    conv-pads-not-zero                 the Conv pads its input (pads not all 0, or auto_pad SAME_*)
    weights-not-constant               W or B is computed at run time (or from compact constants)
    initializer-is-graph-input         W, B, s or o is an overridable initializer (a graph input, IR >= 4)
    dtype-not-foldable                 W is not float16/float32/float64
    fold-not-finite                    W' or B' would hold inf or NaN, or exceed W's dtype
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from onnxfuse.ir import edit
from onnxfuse.passes._checks import OVERRIDABLE, describe, is_op, private_check, replaced, skip
from onnxfuse.passes._fold import FOLDABLE_DTYPES, ConvFoldMatch, conv_parts, fold_fits, set_weights
from onnxfuse.passes.base import Context, Pass
from onnxfuse.passes.conv_affine import per_channel
from onnxfuse.records import Fusion, Reason, RewriteKind, Skip


@dataclass
class AffineConvMatch(ConvFoldMatch):
    """``nodes`` = [Conv, then the Mul/Add/Sub chain in execution order]; ``source`` is the chain's run-time input,
    which the Conv reads once the chain is gone."""

    source: gs.Tensor | None = None


#: The ops of the affine chain before the Conv (Sub only as X - o).
AFFINE_OPS = ("Mul", "Add", "Sub")


def _chain(conv: gs.Node, ctx: Context) -> list[tuple[gs.Node, gs.Tensor, gs.Tensor]]:
    """Up to two Mul/Add/Sub nodes that compute the conv's input, in execution order, each as ``(node, run-time
    operand, constant operand)``; the operand that is no constant must be the chain's own tensor."""
    found: list[tuple[gs.Node, gs.Tensor, gs.Tensor]] = []
    t = conv.inputs[0]
    while len(found) < 2:
        node = edit.producer(t)
        if not is_op(node, *AFFINE_OPS) or len(node.inputs) != 2 or (ctx.members and id(node) not in ctx.members):
            break
        sides = [i for i in (0, 1) if isinstance(node.inputs[i], gs.Constant) or
                 ctx.constant(node.inputs[i])[0] is not None]
        if len(sides) != 1 or (node.op == "Sub" and sides[0] != 1):
            break
        c = sides[0]
        found.insert(0, (node, node.inputs[1 - c], node.inputs[c]))
        t = node.inputs[1 - c]
    return found


def _zero_pads(conv: gs.Node) -> bool:
    auto_pad = conv.attrs.get("auto_pad", "NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
    if auto_pad == "VALID":
        return True
    return auto_pad == "NOTSET" and not any(int(p) for p in conv.attrs.get("pads", []))


class AffineConv(Pass[ConvFoldMatch]):
    """Mul/Add/Sub by per-input-channel constants -> Conv (pads 0) => Conv."""

    name = "affine_conv"
    kind = RewriteKind.FOLD
    summary = "fold a per-input-channel scale and offset (Mul/Add/Sub) before a Conv with zero pads into it"
    reasons = (Reason.NOT_PRIVATE, Reason.GRAPH_OUTPUT, Reason.NOT_PER_CHANNEL, Reason.CONV_PADS_NONZERO,
               Reason.WEIGHTS_NOT_CONSTANT, Reason.INITIALIZER_IS_INPUT, Reason.DTYPE_NOT_FOLDABLE,
               Reason.FOLD_NOT_FINITE)
    anchors = ("Conv",)

    def match(self, node: gs.Node, ctx: Context) -> ConvFoldMatch | Skip | None:
        if not is_op(node, *self.anchors) or len(node.inputs) < 2:
            return None
        chain = _chain(node, ctx)
        if not chain:
            return None
        nodes, out = [node] + [n for n, _, _ in chain], node.outputs[0]
        bad = private_check([n.outputs[0] for n, _, _ in chain], [node] + [n for n, _, _ in chain[1:]], ctx,
                            nodes, out)
        if bad:
            return bad
        for _, _, c_tensor in chain:
            if ctx.constant(c_tensor)[1] == Reason.INITIALIZER_IS_INPUT:
                return skip(Reason.INITIALIZER_IS_INPUT, f"{c_tensor.name} {OVERRIDABLE}", nodes, out)
        w, b, bad = conv_parts(node, ctx, nodes, out)
        if bad:
            return bad
        if not isinstance(w, np.ndarray):
            return skip(Reason.WEIGHTS_NOT_CONSTANT, f"weight {node.inputs[1].name} is computed from compact "
                        "constants; this fold needs it as one constant", nodes, out)
        if w.dtype not in FOLDABLE_DTYPES:
            return skip(Reason.DTYPE_NOT_FOLDABLE, f"{w.dtype} weights cannot be folded", nodes, out)
        group = int(node.attrs.get("group", 1))
        channels = int(w.shape[1]) * group
        scale, offset = np.ones(channels), np.zeros(channels)
        for op_node, x_tensor, c_tensor in chain:
            x_shape, y_shape = ctx.shape(x_tensor), ctx.shape(op_node.outputs[0])
            if x_shape is None or y_shape is None or tuple(x_shape) != tuple(y_shape) or None in x_shape:
                return skip(Reason.NOT_PER_CHANNEL, f"{op_node.name} does not keep its input's shape "
                            f"({x_shape} -> {y_shape}, or unknown): the constant would broadcast the input", nodes,
                            out)
            value = np.asarray(ctx.constant(c_tensor)[0])
            vec = per_channel(value, w.ndim, channels)
            if vec is None:
                return skip(Reason.NOT_PER_CHANNEL, f"{c_tensor.name} of shape {list(value.shape)}"
                            f" does not broadcast per input channel of a rank-{w.ndim} input with {channels} "
                            "channels", nodes, out)
            if op_node.op == "Mul":
                scale, offset = scale * vec, offset * vec
            else:
                offset = offset + vec if op_node.op == "Add" else offset - vec
        if not _zero_pads(node):
            return skip(Reason.CONV_PADS_NONZERO, f"the Conv pads its input (pads {node.attrs.get('pads')}, "
                        f"auto_pad {node.attrs.get('auto_pad', 'NOTSET')}): a padded tap reads 0, not the offset",
                        nodes, out)
        new_w, new_b = self._fold(w, b, scale, offset, group)
        bad = fold_fits(w.dtype, new_w, new_b, nodes, out)
        return bad or AffineConvMatch(nodes, new_w, new_b, w.dtype, source=chain[0][1])

    @staticmethod
    def _fold(w: np.ndarray, b: np.ndarray | None, scale: np.ndarray, offset: np.ndarray, group: int
              ) -> tuple[np.ndarray, np.ndarray]:
        """``(W', B')`` in float64 (see the module docstring)."""
        m, per_group = int(w.shape[0]), int(w.shape[1])
        first = (np.arange(m) // (m // group)) * per_group  # first input channel of each output channel's group
        index = first[:, None] + np.arange(per_group)[None, :]  # [M, C/group]
        spatial = (1,) * (w.ndim - 2)
        with np.errstate(all="ignore"):
            w64 = w.astype(np.float64)
            new_w = w64 * scale[index].reshape(m, per_group, *spatial)
            shift = (w64 * offset[index].reshape(m, per_group, *spatial)).reshape(m, -1).sum(axis=1)
            new_b = (np.zeros(m) if b is None else b.astype(np.float64).reshape(-1)) + shift
        return new_w, new_b

    def rewrite(self, match: ConvFoldMatch, ctx: Context) -> Fusion:
        assert isinstance(match, AffineConvMatch)
        conv, affine = match.nodes[0], match.nodes[1:]
        original = replaced(match.nodes)
        set_weights(conv, ctx, match.weight, match.bias, match.dtype)
        edit.replace_input(ctx.edit_order, conv, 0, match.source, list(affine))
        return describe(self, conv, original)
