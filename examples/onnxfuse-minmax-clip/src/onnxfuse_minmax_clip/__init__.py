"""An onnxfuse plugin: a clamp written as ``Min(Max(x, lo), hi)`` (or ``Max(Min(x, hi), lo)``) becomes one
``Clip(x, lo, hi)``.

Before => after::

    Conv -> Max(., 0) -> Min(., 6)   =>   Conv -> Clip(., 0, 6)   (=> FusedConv(Clip) by onnxfuse's conv_activation)

Some exporters write ReLU6 (and other clamps) as a Max and a Min; onnxruntime's FusedConv and onnxfuse's
``conv_activation`` know ``Clip``, so the two ops, and the intermediate tensor between them, become one op the
Conv can absorb. For ``lo <= hi``, ``min(max(x, lo), hi) = max(min(x, hi), lo) = clip(x, lo, hi)`` (ONNX
Operators.md, Clip-11+: min and max are inputs, "output = min(max(input, min), max)"). Clip takes its bounds as
inputs from opset 11.

Skipped when:
    intermediate-has-other-consumers   the inner Max/Min output is read by another node too
    intermediate-is-graph-output       the inner Max/Min output is a graph output
    clip-bounds-not-constant           a bound is computed at run time
    declined-by-plugin                 a bound holds more than one value, has more dims than x (broadcasting would
                                       grow the output), lo > hi, x is not floating point, or the opset is below 11
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from onnxfuse.passes.plugin import (
    Context,
    Fusion,
    Match,
    Pass,
    Reason,
    RewriteKind,
    Skip,
    describe,
    edit,
    is_op,
    new_constant,
    private_check,
    replaced,
    skip,
)

__all__ = ["MinMaxClip", "MinMaxClipMatch"]

_OTHER = {"Min": "Max", "Max": "Min"}


@dataclass
class MinMaxClipMatch(Match):
    """``nodes`` = [inner Max/Min, outer Min/Max]; ``x`` the clamped tensor, ``lo``/``hi`` the bounds (0-d arrays
    of x's dtype)."""

    x: gs.Tensor | None = None
    lo: np.ndarray | None = None
    hi: np.ndarray | None = None


class MinMaxClip(Pass[MinMaxClipMatch]):
    """Min(Max(x, lo), hi) or Max(Min(x, hi), lo) with constant scalar bounds, lo <= hi => Clip(x, lo, hi)."""

    name = "minmax_clip"
    kind = RewriteKind.FUSE
    summary = "fuse Min(Max(x, lo), hi) with constant bounds into Clip(x, lo, hi) (example plugin)"
    reasons = (Reason.NOT_PRIVATE, Reason.GRAPH_OUTPUT, Reason.CLIP_BOUNDS_NOT_CONSTANT, Reason.PLUGIN_DECLINED)
    anchors = ("Min", "Max")

    def match(self, node: gs.Node, ctx: Context) -> MinMaxClipMatch | Skip | None:
        if not is_op(node, *self.anchors) or len(node.inputs) != 2:
            return None
        inner, outer_bound = self._split(node, _OTHER[node.op])
        if inner is None or len(inner.inputs) != 2:
            return None
        x, inner_bound = self._split_tensor(inner, ctx)
        nodes, out = [inner, node], node.outputs[0]
        bad = private_check([inner.outputs[0]], [node], ctx, nodes, out)
        if bad:
            return bad
        values = []
        for bound in (inner_bound, outer_bound):
            value, _ = ctx.constant(bound)
            if value is None:
                return skip(Reason.CLIP_BOUNDS_NOT_CONSTANT, f"the bound {bound.name} is computed at run time",
                            nodes, out)
            values.append(np.asarray(value))
        lo, hi = (values[0], values[1]) if inner.op == "Max" else (values[1], values[0])
        dtype, rank = ctx.dtype(x), ctx.shape(x)
        why = None
        if ctx.opset < 11:
            why = f"opset {ctx.opset} < 11: Clip takes its bounds as attributes"
        elif dtype is None or not np.issubdtype(dtype, np.floating):
            why = f"{x.name} is not floating point ({dtype})"
        elif lo.size != 1 or hi.size != 1:
            why = f"a bound holds {max(lo.size, hi.size)} values; Clip takes one"
        elif rank is None or max(lo.ndim, hi.ndim) > len(rank):
            why = f"a bound has more dims than {x.name}: Max/Min broadcast the output to them, Clip does not"
        elif float(lo.reshape(())) > float(hi.reshape(())):
            why = f"lo {lo.reshape(()).item()} > hi {hi.reshape(()).item()}"
        if why:
            return skip(Reason.PLUGIN_DECLINED, why, nodes, out)
        return MinMaxClipMatch(nodes, x=x, lo=lo.reshape(()).astype(dtype), hi=hi.reshape(()).astype(dtype))

    @staticmethod
    def _split(node: gs.Node, inner_op: str) -> tuple[gs.Node | None, gs.Tensor]:
        """The inner node (a producer of ``inner_op`` of one input) and ``node``'s other input."""
        for i in (0, 1):
            producer = edit.producer(node.inputs[i])
            if is_op(producer, inner_op):
                return producer, node.inputs[1 - i]
        return None, node.inputs[0]

    @staticmethod
    def _split_tensor(inner: gs.Node, ctx: Context) -> tuple[gs.Tensor, gs.Tensor]:
        """``(x, bound)`` of the inner node: the bound is the constant input (the second one if neither is)."""
        a, b = inner.inputs
        return (b, a) if ctx.constant(a)[0] is not None and ctx.constant(b)[0] is None else (a, b)

    def bounds(self, match: MinMaxClipMatch) -> tuple[np.ndarray, np.ndarray]:
        """The Clip's ``(min, max)`` for ``match``."""
        assert match.lo is not None and match.hi is not None
        return match.lo, match.hi

    def rewrite(self, match: MinMaxClipMatch, ctx: Context) -> Fusion:
        inner, outer = match.nodes
        original = replaced(match.nodes)
        lo, hi = self.bounds(match)
        inner.op, inner.attrs = "Clip", {}
        inner.inputs = [match.x, new_constant(ctx.namer, f"{inner.name}_min", lo),
                        new_constant(ctx.namer, f"{inner.name}_max", hi)]
        edit.replace_chain(ctx.edit_order, inner, outer, [outer])
        return describe(self, inner, original)
