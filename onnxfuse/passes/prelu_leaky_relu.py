"""Turn a ``PRelu`` whose slope is one value everywhere into ``LeakyRelu(alpha=slope)``.

Before => after::

    PRelu(X, slope)    (every element of the constant slope equal to a)   =>  LeakyRelu(X, alpha=a)

Both compute ``f(x) = x if x >= 0 else slope * x`` elementwise (ONNX Operators.md, PRelu: "f(x) = slope * x for
x < 0, f(x) = x for x >= 0", the slope broadcast to X unidirectionally; LeakyRelu: "f(x) = alpha * x for x < 0,
f(x) = x for x >= 0"); with one slope value the two are the same function, and the product ``a * x`` is the same
float32 multiplication, so the rewrite is exact. A slope that differs between channels (the usual
``nn.PReLU(num_parameters=C)``) has no LeakyRelu form and stays a PRelu.

Why: onnxruntime fuses Conv + LeakyRelu itself (ConvActivationFusion at ORT_ENABLE_EXTENDED, the NCHWc Conv's
activation at ORT_ENABLE_ALL, ``core/optimizer/conv_activation_fusion.cc``, ``nchwc_transformer.cc``) and
onnxfuse's conv_activation fuses it into FusedConv on target ``cpu``; a PRelu it fuses nowhere, and at
ORT_ENABLE_ALL it sits between a reorder pair out of and back into the blocked layout. LeakyRelu is standard ONNX
(since opset 6), so the rewrite is made for every target.

Only float32: onnxruntime's CPU kernels of PRelu and LeakyRelu are registered for float only
(``core/providers/cpu/activation/activations.cc``, ``core/providers/cpu/math/element_wise_ops.cc``), and
LeakyRelu's ``alpha`` is a float32 attribute, which a float64 slope would lose precision in and a float16 model
would compute differently (float32 alpha times a float16 x).

Skipped when:
    parameters-not-constant        the slope is computed at run time
    initializer-is-graph-input     the slope is an initializer that is also a graph input
    prelu-slope-not-uniform        the slope has more than one distinct value (per-channel PRelu), or a NaN
    prelu-slope-shape              the slope does not broadcast to X without growing it (more axes than X, an axis
                                   longer than X's, X's rank unknown for a slope of rank > 1, or an empty slope)
    prelu-dtype-not-float32        X is not float32 (or its dtype is unknown)
    slower-than-unfused-at-ort-level  the form is measured slower at the --ort-level (``providers.CPU_SLOWER_AT``,
                                   ``REWRITE_FORMS``; none is today)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from onnxfuse.ort.providers import REWRITE_FORMS
from onnxfuse.passes._checks import is_op, replaced, skip, speed_rule
from onnxfuse.passes.base import Context, Match, Pass
from onnxfuse.records import Fusion, Reason, RewriteKind, Skip


@dataclass
class PReluMatch(Match):
    """``nodes`` = [PRelu]; ``alpha`` is the one slope value (float32, as a Python float)."""

    alpha: float = 0.0


def _broadcasts_into(slope_shape: tuple[int, ...], x_shape: tuple | None) -> str | None:
    """None when a slope of ``slope_shape`` broadcasts to ``x_shape`` unidirectionally (ONNX Broadcasting.md: the
    result has X's shape), else why not. ``x_shape``: ints, strings for symbolic dims, None for unknown dims; None
    when even the rank is unknown."""
    if int(np.prod(slope_shape, dtype=np.int64)) == 0:
        return "the slope is empty"
    if x_shape is None:
        return None if len(slope_shape) <= 1 else f"X's rank is unknown and the slope has shape {list(slope_shape)}"
    if len(slope_shape) > len(x_shape):
        return f"the slope {list(slope_shape)} has more axes than X {list(x_shape)}"
    for s, x in zip(reversed(slope_shape), reversed(x_shape), strict=False):
        if s != 1 and isinstance(x, int) and s != x:
            return f"the slope {list(slope_shape)} does not broadcast to X {list(x_shape)}"
        if s != 1 and not isinstance(x, int):
            return f"the slope {list(slope_shape)} may not broadcast to X {list(x_shape)} (a dim is not known)"
    return None


class PReluLeakyRelu(Pass[PReluMatch]):
    """PRelu(X, uniform constant slope a) => LeakyRelu(X, alpha=a)."""

    name = "prelu_leaky_relu"
    kind = RewriteKind.CANONICALIZE
    summary = "turn a PRelu whose constant slope is one value into LeakyRelu, which onnxruntime fuses into the Conv"
    reasons = (Reason.PARAMS_NOT_CONSTANT, Reason.INITIALIZER_IS_INPUT, Reason.PRELU_NOT_UNIFORM,
               Reason.PRELU_SLOPE_SHAPE, Reason.PRELU_DTYPE, Reason.SLOWER_AT_ORT_LEVEL)
    anchors = ("PRelu",)

    def match(self, node: gs.Node, ctx: Context) -> PReluMatch | Skip | None:
        if not is_op(node, *self.anchors) or len(node.inputs) != 2 or not node.outputs:
            return None
        x, slope_t = node.inputs
        nodes, out = [node], node.outputs[0]
        dtype = ctx.dtype(x) or ctx.dtype(slope_t)
        if dtype != np.dtype(np.float32):
            name = "unknown" if dtype is None else str(dtype)
            return skip(Reason.PRELU_DTYPE, f"X of {node.name} is {name}; LeakyRelu runs in float32 here only",
                        nodes, out)
        slope, why = ctx.constant(slope_t)
        if slope is None:
            reason = why or Reason.PARAMS_NOT_CONSTANT
            return skip(reason, f"the slope {slope_t.name} of {node.name} is not a constant", nodes, out)
        slope = np.asarray(slope)
        bad_shape = _broadcasts_into(tuple(int(d) for d in slope.shape), ctx.shape(x))
        if bad_shape:
            return skip(Reason.PRELU_SLOPE_SHAPE, bad_shape, nodes, out)
        flat = slope.reshape(-1).astype(np.float32)
        first = flat[0]
        if not np.all(flat == first):  # a NaN compares unequal, so a NaN slope is refused too
            distinct = np.unique(flat).size
            return skip(Reason.PRELU_NOT_UNIFORM, f"the slope of {node.name} has {distinct} distinct values "
                        f"(per-channel PRelu)", nodes, out)
        return speed_rule(PReluMatch(nodes, alpha=float(first)), ctx, REWRITE_FORMS[self.name])

    def rewrite(self, match: PReluMatch, ctx: Context) -> Fusion:
        (node,) = match.nodes
        original = replaced(match.nodes)
        del node.inputs[1]  # graphsurgeon's synchronized list also drops the node from the slope's readers
        node.op = "LeakyRelu"
        node.attrs = {"alpha": match.alpha}
        return Fusion(self.name, node.name, node.op, original, None, node.outputs[0].name, self.kind)
