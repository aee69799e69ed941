"""Fold a zero ``Pad`` in constant mode into the ``pads`` of the Conv it feeds.

Before => after::

    Pad(X, pads=[0, 0, t, l, 0, 0, b, r], mode=constant, value=0) -> Conv(., W, pads=[t0, l0, b0, r0])
        =>  Conv(X, W, pads=[t0 + t, l0 + l, b0 + b, r0 + r])

Conv pads its input with zeros on the spatial axes before sliding the kernel (ONNX Operators.md, Conv: "pads
... padding for the beginning and ending along each spatial axis"), so an explicit zero Pad of those axes is the
same computation; the Pad's intermediate tensor is never written. Pad's ``pads`` lists every axis as
``[x1_begin, x2_begin, ..., x1_end, x2_end, ...]`` (an attribute before opset 11, an input since, restricted to
``axes`` since opset 18); Conv's lists the spatial axes only, in the same order.

Skipped when:
    intermediate-has-other-consumers   the Pad output is read by another node too
    intermediate-is-graph-output       the Pad output is a graph output
    pad-mode-not-constant              mode is reflect, edge or wrap
    parameters-not-constant            pads, constant_value or axes are computed at run time
    pad-value-not-zero                 the constant value is not 0
    negative-pads                      a pad is negative (a crop)
    pad-on-batch-or-channel            the Pad pads axis 0 (N) or 1 (C)
    pad-axes-invalid                   the Pad's ``axes`` name an axis twice (-1 and 3 of a 4-d tensor too) or one
                                       the tensor does not have, or its pads are not two per axis of the Conv's
                                       input (ONNX Operators.md, Pad-18: "repeated axis is invalid"; onnxruntime
                                       refuses the model at load)
    conv-auto-pad-set                  the Conv has auto_pad SAME_UPPER or SAME_LOWER (its pads are computed from
                                       the input size); VALID means no padding (ONNX Operators.md, Conv:
                                       "VALID mean no padding") and folds like explicit zero pads
    initializer-is-graph-input         pads, constant_value or axes is (or is computed from) an initializer that
                                       a caller may feed (listed as a graph input, IR version 4 or later)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_graphsurgeon as gs

from onnxfuse.ir import edit
from onnxfuse.passes._checks import OVERRIDABLE, is_op, private_check, replaced, skip
from onnxfuse.passes.base import Context, Match, Pass
from onnxfuse.records import Fusion, Reason, RewriteKind, Skip


@dataclass
class PadConvMatch(Match):
    """``nodes`` = [Pad, Conv]; ``pads`` is the Conv's new ``pads`` attribute."""

    pads: list[int] = field(default_factory=list)


def _attr_str(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class PadConv(Pass[PadConvMatch]):
    """Pad(constant 0, spatial axes) -> Conv => Conv with larger pads."""

    name = "pad_conv"
    kind = RewriteKind.CANONICALIZE
    summary = "fold a zero constant-mode Pad of the spatial axes into the Conv's pads"
    reasons = (Reason.NOT_PRIVATE, Reason.GRAPH_OUTPUT, Reason.PAD_MODE, Reason.PARAMS_NOT_CONSTANT,
               Reason.PAD_VALUE, Reason.PAD_NEGATIVE, Reason.PAD_AXES, Reason.PAD_AXES_INVALID, Reason.AUTO_PAD,
               Reason.INITIALIZER_IS_INPUT)
    anchors = ("Conv",)

    def match(self, node: gs.Node, ctx: Context) -> PadConvMatch | Skip | None:
        if not is_op(node, *self.anchors) or len(node.inputs) < 2:
            return None
        pad = edit.producer(node.inputs[0])
        if not is_op(pad, "Pad"):
            return None
        nodes, out = [pad, node], node.outputs[0]
        bad = private_check([pad.outputs[0]], [node], ctx, nodes, out)
        if bad:
            return bad
        mode = _attr_str(pad.attrs.get("mode", "constant"))
        if mode != "constant":
            return skip(Reason.PAD_MODE, f"Pad mode is {mode}", nodes, out)
        pads = self._full_pads(pad, node, ctx)
        if isinstance(pads, tuple):
            return skip(*pads, nodes, out)
        value = self._value(pad, ctx)
        if value is None:
            if ctx.constant(pad.inputs[2])[1] == Reason.INITIALIZER_IS_INPUT:
                return skip(Reason.INITIALIZER_IS_INPUT, f"constant_value {pad.inputs[2].name} {OVERRIDABLE}",
                            nodes, out)
            return skip(Reason.PARAMS_NOT_CONSTANT, f"the constant_value of {pad.name} is computed at run time",
                        nodes, out)
        if value != 0:
            return skip(Reason.PAD_VALUE, f"Pad value is {value}, Conv pads with 0", nodes, out)
        if any(p < 0 for p in pads):
            return skip(Reason.PAD_NEGATIVE, f"Pad has negative pads {pads} (a crop)", nodes, out)
        rank = len(pads) // 2
        if pads[0] or pads[1] or pads[rank] or pads[rank + 1]:
            return skip(Reason.PAD_AXES, f"Pad pads axis 0 or 1 (N or C): {pads}", nodes, out)
        auto_pad = _attr_str(node.attrs.get("auto_pad", "NOTSET"))
        if auto_pad not in ("NOTSET", "VALID"):  # VALID: no padding, the same as explicit zero pads
            return skip(Reason.AUTO_PAD, f"the Conv has auto_pad={auto_pad}", nodes, out)
        spatial = rank - 2
        old = [0] * (2 * spatial) if auto_pad == "VALID" else \
            [int(p) for p in node.attrs.get("pads", [0] * (2 * spatial))]
        new = [old[i] + pads[2 + i] for i in range(spatial)] + [old[spatial + i] + pads[rank + 2 + i]
                                                              for i in range(spatial)]
        return PadConvMatch(nodes, pads=new)

    @staticmethod
    def _full_pads(pad: gs.Node, conv: gs.Node, ctx: Context) -> list[int] | tuple[Reason, str]:
        """Pad's pads for every axis as ``[begin..., end...]``, or ``(reason, detail)``: parameters not constant,
        or axes/pads that do not fit the Conv's input (see pad-axes-invalid in the module docstring)."""
        shape = ctx.shape(conv.inputs[1])
        if "pads" in pad.attrs:  # opset < 11
            full = [int(p) for p in pad.attrs["pads"]]
        else:
            if len(pad.inputs) < 2 or not pad.inputs[1].name:
                return Reason.PARAMS_NOT_CONSTANT, "Pad has no pads"
            values, why = ctx.constant(pad.inputs[1])
            if why == Reason.INITIALIZER_IS_INPUT:
                return why, f"pads {pad.inputs[1].name} {OVERRIDABLE}"
            if values is None:
                return Reason.PARAMS_NOT_CONSTANT, f"pads {pad.inputs[1].name} is computed at run time"
            full = [int(v) for v in np.asarray(values).reshape(-1)]
            if len(pad.inputs) >= 4 and pad.inputs[3].name:
                axes, why = ctx.constant(pad.inputs[3])  # opset 18+: pads of these axes only
                if why == Reason.INITIALIZER_IS_INPUT:
                    return why, f"axes {pad.inputs[3].name} {OVERRIDABLE}"
                if axes is None or shape is None:
                    return (Reason.PARAMS_NOT_CONSTANT,
                            f"axes {pad.inputs[3].name} is computed at run time or the rank is unknown")
                spread = PadConv._scatter(full, [int(a) for a in np.asarray(axes).reshape(-1)], len(shape))
                if isinstance(spread, str):
                    return Reason.PAD_AXES_INVALID, spread
                full = spread
        if shape is not None and len(full) != 2 * len(shape):
            return Reason.PAD_AXES_INVALID, f"Pad has {len(full)} pads; the {len(shape)}-d input needs {2 * len(shape)}"
        return full

    @staticmethod
    def _scatter(values: list[int], axes: list[int], rank: int) -> list[int] | str:
        """The pads of ``axes`` (``[begin..., end...]`` in axes order) spread over all ``rank`` axes, or the
        sentence saying why they cannot be: an axis out of range or named twice, or not two pads per axis."""
        if len(values) != 2 * len(axes):
            return f"Pad has {len(values)} pads for {len(axes)} axes {axes}; it needs two per axis"
        normal = [a + rank if a < 0 else a for a in axes]
        if any(not 0 <= a < rank for a in normal):
            return f"Pad axes {axes} name an axis that the {rank}-d input does not have"
        if len(set(normal)) != len(normal):
            return f"Pad axes {axes} name an axis twice"
        full = [0] * (2 * rank)
        for i, a in enumerate(normal):
            full[a], full[rank + a] = values[i], values[len(axes) + i]
        return full

    @staticmethod
    def _value(pad: gs.Node, ctx: Context) -> float | None:
        if "value" in pad.attrs:  # opset < 11
            return float(pad.attrs["value"])
        if len(pad.inputs) < 3 or not pad.inputs[2].name:
            return 0.0
        value, _ = ctx.constant(pad.inputs[2])
        return None if value is None else float(np.asarray(value).reshape(-1)[0])

    def rewrite(self, match: PadConvMatch, ctx: Context) -> Fusion:
        pad, conv = match.nodes
        original = replaced(match.nodes)
        conv.attrs["pads"] = match.pads
        conv.attrs.pop("auto_pad", None)  # VALID (no padding) is now the explicit pads; NOTSET is the default
        edit.bypass(ctx.edit_order, pad, pad.inputs[0])
        return Fusion(self.name, conv.name, conv.op, original, None, conv.outputs[0].name, self.kind)
