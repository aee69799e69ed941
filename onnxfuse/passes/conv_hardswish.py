"""Fuse a Conv and a HardSwish written out as elementwise ops into FusedConv(activation="HardSwish").

HardSwish(x) = x * max(0, min(1, x / 6 + 1/2)) (ONNX Operators.md, HardSwish-14) = x * Clip(x + 3, 0, 6) / 6.
Exporters without the opset-14 op write it out; these forms are matched (Mul operands in either order, the
constants to float32 precision; the HardSwish op itself is handled by conv_activation).

Before => after (x = Conv(X, W[, B]) or a FusedConv without activation)::

    Mul(x, HardSigmoid(x, alpha=1/6, beta=0.5))
    Div(Mul(x, Clip(Add(x, 3), 0, 6)), 6)          Mul(Mul(x, Clip(Add(x, 3), 0, 6)), 1/6)
    Mul(x, Div(Clip(Add(x, 3), 0, 6), 6))          Mul(x, Mul(Clip(Add(x, 3), 0, 6), 1/6))
        =>  FusedConv(X, W[, B], activation="HardSwish")

with x the output of a Conv; x is read twice, both times inside the pattern. onnxruntime's own optimizer
matches none of these (it has no HardSwish fusion), so this is where an offline pass pays off most on CPU.

Skipped when:
    intermediate-has-other-consumers   x or an inner tensor is read outside the pattern
    intermediate-is-graph-output       x or an inner tensor is a graph output
    target-allows-no-contrib-ops       target onnx
    dtype-has-no-fusedconv-kernel      the conv is not float32
    activation-not-supported-by-target HardSwish on cpu+cuda or cuda
    quantized-conv                     the conv is part of a QDQ pattern
    slower-than-unfused-at-ort-level   the form runs slower than the unfused original at the chosen onnxruntime
                                       level (``providers.CPU_SLOWER_AT``)
    form-needs-newer-onnxruntime       the form does not load in the onnxruntime release given by --ort-version
                                       (``providers.FORM_MIN_ORT``: FusedConv(HardSwish) needs 1.30)
    form-made-by-onnxruntime-itself    the form needs a newer onnxruntime than the input model, and onnxruntime's
                                       own graph at --ort-level runs no fewer kernels with it than without
                                       (``onnxfuse.passes.portable``; the chain stays as it was, portable)
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from onnxfuse.ir import edit
from onnxfuse.passes._checks import describe, is_op, private_check, qdq_check, replaced
from onnxfuse.passes.base import Context, Pass
from onnxfuse.passes.fusedconv import (
    FusedConvMatch,
    clip_bounds,
    close,
    fusable_conv,
    has_z,
    scalar,
    target_check,
    to_fused_conv,
)
from onnxfuse.records import Fusion, Reason, RewriteKind, Skip


def _relu6_plus3(ctx: Context, t: gs.Tensor) -> tuple[gs.Tensor, list[gs.Node]] | None:
    """``(x, [Add, Clip])`` when ``t = Clip(Add(x, 3), 0, 6)``."""
    clip = edit.producer(t)
    if not is_op(clip, "Clip"):
        return None
    bounds = clip_bounds(ctx, clip)
    if bounds is None:
        return None
    lo, hi = bounds
    if not (close(lo, 0.0) and close(hi, 6.0)):
        return None
    add = edit.producer(clip.inputs[0])
    if not is_op(add, "Add"):
        return None
    for side in (0, 1):
        if close(scalar(ctx, add.inputs[1 - side]), 3.0):
            return add.inputs[side], [add, clip]
    return None


def _divided_by_6(ctx: Context, node: gs.Node | None) -> gs.Tensor | None:
    """The tensor t when ``node`` is Div(t, 6), Mul(t, 1/6) or Mul(1/6, t)."""
    if is_op(node, "Div") and close(scalar(ctx, node.inputs[1]), 6.0):
        return node.inputs[0]
    if is_op(node, "Mul"):
        for side in (0, 1):
            if close(scalar(ctx, node.inputs[1 - side]), 1.0 / 6.0):
                return node.inputs[side]
    return None


def _gate(ctx: Context, t: gs.Tensor) -> tuple[gs.Tensor, list[gs.Node]] | None:
    """``(x, nodes)`` when ``t`` is HardSigmoid(x, 1/6, 0.5) or Clip(x + 3, 0, 6) / 6."""
    node = edit.producer(t)
    if is_op(node, "HardSigmoid") and close(float(node.attrs.get("alpha", 0.2)), 1.0 / 6.0) and close(
            float(node.attrs.get("beta", 0.5)), 0.5):
        return node.inputs[0], [node]
    inner = _divided_by_6(ctx, node)
    if inner is not None:
        found = _relu6_plus3(ctx, inner)
        if found:
            return found[0], found[1] + [node]
    return None


def _find(ctx: Context, node: gs.Node) -> tuple[gs.Node, list[gs.Node]] | None:
    """``(conv, pattern nodes in order, anchor last)`` for a written-out HardSwish ending at ``node``."""
    # x * gate(x)
    if is_op(node, "Mul"):
        for side in (0, 1):
            x, other = node.inputs[side], node.inputs[1 - side]
            gate = _gate(ctx, other)
            if gate and gate[0] is x and fusable_conv(edit.producer(x)):
                return edit.producer(x), gate[1] + [node]
    # (x * relu6(x + 3)) / 6
    product = _divided_by_6(ctx, node)
    mul = edit.producer(product) if product is not None else None
    if is_op(mul, "Mul"):
        for side in (0, 1):
            x, other = mul.inputs[side], mul.inputs[1 - side]
            found = _relu6_plus3(ctx, other)
            if found and found[0] is x and fusable_conv(edit.producer(x)):
                return edit.producer(x), found[1] + [mul, node]
    return None


class ConvHardSwish(Pass[FusedConvMatch]):
    """Conv -> written-out HardSwish => FusedConv(activation="HardSwish")."""

    name = "conv_hardswish"
    kind = RewriteKind.FUSE
    summary = "fuse Conv + HardSwish written out as Mul/Add/Clip/Div or HardSigmoid into FusedConv"
    reasons = (Reason.NOT_PRIVATE, Reason.GRAPH_OUTPUT, Reason.NO_CONTRIB_OPS, Reason.DTYPE_NO_KERNEL,
               Reason.ACTIVATION_UNSUPPORTED, Reason.QDQ, Reason.SLOWER_AT_ORT_LEVEL, Reason.NEEDS_NEWER_ORT,
               Reason.MADE_BY_ORT_ITSELF)
    anchors = ("Mul", "Div")

    def match(self, node: gs.Node, ctx: Context) -> FusedConvMatch | Skip | None:
        if not is_op(node, *self.anchors):
            return None
        found = _find(ctx, node)
        if found is None:
            return None
        conv, inner = found
        nodes, out = [conv, *inner], node.outputs[0]
        intermediates = [conv.outputs[0]] + [n.outputs[0] for n in inner[:-1]]
        bad = (private_check(intermediates, inner, ctx, nodes, out) or qdq_check(conv, out, nodes)
               or target_check(ctx, conv, "HardSwish", nodes, out, has_z(conv)))
        return bad or FusedConvMatch(nodes, "HardSwish")

    def rewrite(self, match: FusedConvMatch, ctx: Context) -> Fusion:
        conv, last = match.nodes[0], match.nodes[-1]
        original = replaced(match.nodes)
        to_fused_conv(ctx, conv, "HardSwish", [], None, last, match.nodes[1:])
        return describe(self, conv, original, "HardSwish")
