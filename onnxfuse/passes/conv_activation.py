"""Fuse a Conv and the activation after it into ``com.microsoft::FusedConv``.

Before => after::

    Conv(X, W[, B]) -> act            =>  FusedConv(X, W[, B], activation=act, activation_params=...)
    FusedConv(X, W, B, Z) -> act      =>  FusedConv(X, W, B, Z, activation=act, ...)   (Z from conv_residual)

Activations and their ``activation_params`` (onnxruntime ``contrib_ops/cpu/fused_conv.cc``; ONNX defaults
written explicitly because the kernel has none): Relu, Tanh, Sigmoid, HardSwish: none; LeakyRelu: [alpha]
(default 0.01); Clip: [min, max] (attributes before opset 11, constant inputs since; a missing bound is float32
lowest / max); HardSigmoid: [alpha, beta] (defaults 0.2, 0.5). The weights need not be constant.

Skipped when:
    intermediate-has-other-consumers   the conv output is read by another node too (SiLU's x * Sigmoid(x))
    intermediate-is-graph-output       the conv output is a graph output
    target-allows-no-contrib-ops       target onnx
    dtype-has-no-fusedconv-kernel      the conv is not float32 (no float16/float64 FusedConv kernel)
    activation-not-supported-by-target e.g. Sigmoid on cpu+cuda or cuda
    clip-bounds-not-constant           a Clip bound is computed at run time
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
from onnxfuse.passes._checks import describe, is_op, private_check, qdq_check, replaced, skip
from onnxfuse.passes.base import Context, Pass
from onnxfuse.passes.fusedconv import (
    FusedConvMatch,
    clip_bounds,
    fusable_conv,
    has_z,
    target_check,
    to_fused_conv,
)
from onnxfuse.records import Fusion, Reason, RewriteKind, Skip

ACTIVATIONS = ("Relu", "Tanh", "Sigmoid", "LeakyRelu", "Clip", "HardSigmoid", "HardSwish")


def activation_params(ctx: Context, act: gs.Node) -> list[float] | None:
    """The FusedConv ``activation_params`` for activation node ``act``; None for a Clip with run-time bounds."""
    if act.op == "LeakyRelu":
        return [float(act.attrs.get("alpha", 0.01))]
    if act.op == "HardSigmoid":
        return [float(act.attrs.get("alpha", 0.2)), float(act.attrs.get("beta", 0.5))]
    if act.op == "Clip":
        bounds = clip_bounds(ctx, act)
        return None if bounds is None else list(bounds)
    return []


def _is_silu(x: gs.Tensor, sigmoid: gs.Node) -> bool:
    """True when ``x`` is read only by ``sigmoid`` and by a Mul of ``x`` and the sigmoid's output."""
    readers = edit.consumers(x)
    return len(readers) == 2 and any(
        is_op(r, "Mul") and {id(t) for t in r.inputs} == {id(x), id(sigmoid.outputs[0])} for r in readers)


class ConvActivation(Pass[FusedConvMatch]):
    """Conv -> activation => FusedConv(activation)."""

    name = "conv_activation"
    kind = RewriteKind.FUSE
    summary = "fuse Conv + Relu/Tanh/Sigmoid/LeakyRelu/Clip/HardSigmoid/HardSwish into FusedConv"
    reasons = (Reason.NOT_PRIVATE, Reason.GRAPH_OUTPUT, Reason.NO_CONTRIB_OPS, Reason.DTYPE_NO_KERNEL,
               Reason.ACTIVATION_UNSUPPORTED, Reason.CLIP_BOUNDS_NOT_CONSTANT, Reason.QDQ, Reason.SLOWER_AT_ORT_LEVEL,
               Reason.NEEDS_NEWER_ORT, Reason.MADE_BY_ORT_ITSELF)
    anchors = ACTIVATIONS

    def match(self, node: gs.Node, ctx: Context) -> FusedConvMatch | Skip | None:
        if not is_op(node, *self.anchors):
            return None
        conv = edit.producer(node.inputs[0])
        if not fusable_conv(conv):
            return None
        nodes, out = [conv, node], node.outputs[0]
        if node.op == "Sigmoid" and _is_silu(conv.outputs[0], node):
            return skip(Reason.NOT_PRIVATE, f"{conv.outputs[0].name} * Sigmoid({conv.outputs[0].name}) is SiLU, "
                        "which FusedConv cannot express", nodes, out)
        bad = (private_check([conv.outputs[0]], [node], ctx, nodes, out) or qdq_check(conv, out, nodes)
               or target_check(ctx, conv, node.op, nodes, out, has_z(conv)))
        if bad:
            return bad
        params = activation_params(ctx, node)
        if params is None:
            return skip(Reason.CLIP_BOUNDS_NOT_CONSTANT, f"Clip {node.name} has a bound computed at run time",
                        nodes, out)
        return FusedConvMatch(nodes, node.op, params)

    def rewrite(self, match: FusedConvMatch, ctx: Context) -> Fusion:
        conv, act = match.nodes
        original = replaced(match.nodes)
        to_fused_conv(ctx, conv, match.activation, match.params, None, act, [act])
        return describe(self, conv, original, match.activation)
