"""Move a per-channel constant Add/Sub/Mul/Div, or an elementwise activation, from after a layout wrapper
(Transpose, Squeeze, Unsqueeze, Reshape) that follows a Conv to before it, where conv_affine folds it into the
Conv's weights and conv_activation (or onnxruntime) fuses the activation.

Before => after::

    Conv -> [wrappers] -> wrapper -> Add(., c)  =>  Conv -> [wrappers] -> Add(., c') -> wrapper
    Conv -> [wrappers] -> wrapper -> Relu       =>  Conv -> [wrappers] -> Relu -> wrapper

    Add(x, c) -> wrapper -> [wrappers] -> Conv   =>  wrapper -> Add(., c') -> [wrappers] -> Conv

(wrapper: Transpose, Squeeze, Unsqueeze or Reshape; Sub/Mul/Div as Add, but never c / x; Tanh, Sigmoid,
LeakyRelu, Clip, HardSigmoid, HardSwish as Relu). The first two feed conv_affine and conv_activation; the third
(TensorFlow's input normalization x * s[C] + o[C] on NHWC before the Transpose into the first Conv) feeds
affine_conv. An op with a Conv behind it moves towards that Conv only, so no op moves back and forth.

The exporters of TensorFlow graphs write NHWC convs as ``Transpose(NHWC->NCHW) -> Conv -> Transpose(NCHW->NHWC)``
with the bias or scale on the last axis after the second Transpose; audio toolkits write a Conv1d as
``Unsqueeze -> Conv(2-D) -> Squeeze`` followed by the affine. Each wrapper only moves elements (ONNX Operators.md,
Transpose: "output axis i is input axis perm[i]"; Squeeze/Unsqueeze remove/insert axes of extent 1; Reshape keeps
the row-major element order), so for an elementwise ``f`` ``f(wrap(x)) = wrap(f(x))`` exactly, and for a constant
``c`` that varies only along the output axis that holds the conv's output channels, ``wrap(x) op c =
wrap(x op c')`` with ``c'`` the same values shaped ``[1, M, 1, ...]`` on the conv side: every element meets the
same value of ``c``, computed by the same float operation. The channel axis is followed through each wrapper:
Transpose: the output axis ``j`` with ``perm[j] = a``; Squeeze: ``a`` minus the squeezed axes before it (refused when
``a`` itself is squeezed); Unsqueeze: the ``a``-th axis that is not inserted; Reshape: the output axis ``j`` of the
channel extent whose trailing product equals the input's trailing product after ``a`` (row-major order: the
channel index of flat element ``f`` is ``(f // post) % M`` on both sides). A constant of one value commutes with
any wrapper.

The move is made once per wrapper per round; the driver's fixpoint takes an op across a chain of wrappers and the
Transpose pair left behind cancels in remove_redundant (TensorFlow's NCHW->NHWC->NCHW between two convs).

Skipped when:
    intermediate-has-other-consumers   the wrapper's input or output, or a tensor between it and the Conv, is read
                                       by another node too (the moved op would change what that node reads)
    intermediate-is-graph-output       one of them is a graph output
    initializer-is-graph-input         c is an overridable initializer (a graph input, IR >= 4)
    constant-not-per-channel           c varies along an axis that is not the conv's channel axis after the
                                       wrappers, or broadcasts the wrapper's output to a larger shape
    conv-output-is-divisor             Div(c, wrapped conv): 1/conv is not linear, so nothing would fold
    layout-wrapper-shape-unknown       the rank or the extents the wrapper's axis mapping needs are not known
                                       (a Reshape with a dynamic shape, a Squeeze without axes on an unknown shape)
    layout-wrapper-splits-channels     the wrapper merges or splits the channel axis (a Reshape that folds channels
                                       into another axis, a Squeeze of a one-channel axis), so no axis carries it
    slower-than-unfused-at-ort-level   the form is measured slower at the --ort-level (``providers.CPU_SLOWER_AT``,
                                       ``REWRITE_FORMS``; none is today)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from onnxfuse.ir import constants, edit
from onnxfuse.ort.providers import REWRITE_FORMS
from onnxfuse.passes._checks import CONV_OPS, is_op, private_check, replaced, skip, speed_rule
from onnxfuse.passes.base import Context, Match, Pass
from onnxfuse.records import Fusion, Reason, RewriteKind, Skip

WRAPPERS = ("Transpose", "Squeeze", "Unsqueeze", "Reshape")
AFFINE = ("Add", "Sub", "Mul", "Div")
#: Elementwise activations that conv_activation fuses into FusedConv and onnxruntime into its Conv
#: (``core/optimizer/conv_activation_fusion.cc``); others would move for nothing.
ACTIVATIONS = ("Relu", "Tanh", "Sigmoid", "LeakyRelu", "Clip", "HardSigmoid", "HardSwish")


@dataclass
class LayoutMatch(Match):
    """``nodes`` = [wrapper, op] (an op after the wrapper, moved before it), or [op, wrapper] with ``forward`` (an
    affine before a wrapper that leads to a Conv, moved after it). ``data`` is the index of the op's run-time
    input; ``constant`` the new operand shaped for the op's new place (None for an activation, whose other inputs,
    Clip's bounds, are ``extra``: constants re-stored as fresh initializers so the op may run where the wrapper
    ran; with ``forward`` ``extra`` holds the wrapper's shape or axes input, re-stored the same way)."""

    data: int = 0
    constant: np.ndarray | None = None
    extra: tuple[tuple[int, np.ndarray], ...] = ()
    forward: bool = False


class _Refused(Exception):
    def __init__(self, reason: Reason, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def _ints(value) -> list[int]:
    return [int(v) for v in np.asarray(value).reshape(-1)]


def _axes(node: gs.Node, ctx: Context) -> list[int] | None:
    """Squeeze/Unsqueeze ``axes`` (attribute before opset 13, input since), [] when absent, None when computed."""
    if "axes" in node.attrs:
        return _ints(node.attrs["axes"])
    if len(node.inputs) > 1 and node.inputs[1].name:
        value, _ = ctx.constant(node.inputs[1])
        return None if value is None else _ints(value)
    return []


def _same_extent(a: list, b: list) -> bool:
    """True when the products of two dim lists are equal: the ints multiply, the symbolic names must match as a
    multiset (1s ignored)."""
    ints_a = math.prod(d for d in a if isinstance(d, int))
    ints_b = math.prod(d for d in b if isinstance(d, int))
    names_a = sorted(str(d) for d in a if not isinstance(d, int))
    names_b = sorted(str(d) for d in b if not isinstance(d, int))
    return ints_a == ints_b and names_a == names_b and None not in a and None not in b


def channel_axis(wrapper: gs.Node, axis: int, ctx: Context) -> int:
    """The axis of ``wrapper``'s output that holds the elements of its input's ``axis`` (the conv's channels).

    Raises:
        _Refused: with layout-wrapper-shape-unknown or layout-wrapper-splits-channels.
    """
    x, y = wrapper.inputs[0], wrapper.outputs[0]
    in_shape, out_shape = ctx.shape(x), ctx.shape(y)
    name = wrapper.name
    if in_shape is None:
        raise _Refused(Reason.LAYOUT_SHAPE, f"the rank of {x.name}, the input of {name}, is not known")
    rank = len(in_shape)
    if wrapper.op == "Transpose":
        perm = _ints(wrapper.attrs["perm"]) if "perm" in wrapper.attrs else list(range(rank))[::-1]
        return [p % rank for p in perm].index(axis)
    if wrapper.op == "Squeeze":
        axes = _axes(wrapper, ctx)
        if axes is None or (not axes and any(not isinstance(d, int) for d in in_shape)):
            raise _Refused(Reason.LAYOUT_SHAPE, f"the squeezed axes of {name} are not known")
        removed = {a % rank for a in axes} if axes else {i for i, d in enumerate(in_shape) if d == 1}
        if axis in removed:
            raise _Refused(Reason.LAYOUT_SPLIT, f"{name} squeezes the channel axis {axis}")
        return axis - sum(1 for a in removed if a < axis)
    if wrapper.op == "Unsqueeze":
        axes = _axes(wrapper, ctx)
        if axes is None:
            raise _Refused(Reason.LAYOUT_SHAPE, f"the inserted axes of {name} are not known")
        out_rank = rank + len(axes)
        inserted = {a % out_rank for a in axes}
        kept = [i for i in range(out_rank) if i not in inserted]
        return kept[axis]
    # Reshape: row-major order is kept, so the channel axis survives where an output axis of the same extent has
    # the same trailing product (and so the same leading product)
    target, _ = ctx.constant(wrapper.inputs[1]) if len(wrapper.inputs) > 1 else (None, None)
    if out_shape is None or target is None:
        raise _Refused(Reason.LAYOUT_SHAPE, f"the output shape of {name} is not known (a shape computed at run "
                       "time)")
    m, post = in_shape[axis], list(in_shape[axis + 1:])
    if m is None or None in post:
        raise _Refused(Reason.LAYOUT_SHAPE, f"the extents of {x.name} after axis {axis - 1} are not known")
    for j, d in enumerate(out_shape):
        if d == m and _same_extent(list(out_shape[j + 1:]), post) and _same_extent(list(out_shape[:j]),
                                                                                   list(in_shape[:axis])):
            return j
    if any(d is None for d in out_shape):
        raise _Refused(Reason.LAYOUT_SHAPE, f"the output shape of {name} is not fully known")
    raise _Refused(Reason.LAYOUT_SPLIT, f"{name} reshapes {list(in_shape)} to {list(out_shape)}: no output axis "
                   f"holds the {m} channels alone")


class LayoutWrapper(Pass[LayoutMatch]):
    """wrapper(conv side) -> per-channel affine or activation => affine or activation -> wrapper."""

    name = "layout_wrapper"
    kind = RewriteKind.CANONICALIZE
    summary = ("move a per-channel Add/Sub/Mul/Div or an activation from after a Transpose/Squeeze/Unsqueeze/"
               "Reshape of a Conv's output to before it, where it folds or fuses into the Conv (and a per-channel "
               "Add/Sub/Mul/Div before a wrapper into a Conv to after it, where affine_conv folds it)")
    reasons = (Reason.NOT_PRIVATE, Reason.GRAPH_OUTPUT, Reason.INITIALIZER_IS_INPUT, Reason.NOT_PER_CHANNEL,
               Reason.CONV_IS_DIVISOR, Reason.LAYOUT_SHAPE, Reason.LAYOUT_SPLIT, Reason.SLOWER_AT_ORT_LEVEL)
    anchors = AFFINE + ACTIVATIONS + WRAPPERS

    def match(self, node: gs.Node, ctx: Context) -> LayoutMatch | Skip | None:
        return speed_rule(self._find(node, ctx), ctx, REWRITE_FORMS[self.name])

    def _find(self, node: gs.Node, ctx: Context) -> LayoutMatch | Skip | None:
        if not is_op(node, *self.anchors) or not node.inputs or len(node.outputs) != 1:
            return None
        if node.op in WRAPPERS:
            return self._before_conv(node, ctx)
        sides = (0, 1) if node.op in AFFINE and len(node.inputs) == 2 else (0,)
        for side in sides:
            wrapper = edit.producer(node.inputs[side])
            if not is_op(wrapper, *WRAPPERS) or len(wrapper.outputs) != 1 or not wrapper.inputs:
                continue
            nodes, out = [wrapper, node], node.outputs[0]
            chain = self._to_conv(wrapper.inputs[0])
            if chain is None:
                continue
            bad = private_check([wrapper.inputs[0], wrapper.outputs[0]], nodes, ctx, nodes, out)
            inner = [n.outputs[0] for n in chain[:-1]]  # from the Conv to the wrapper's input
            bad = bad or private_check(inner, chain, ctx, nodes, out)
            if bad:
                return bad
            try:
                conv_axis = 1  # the conv's channel axis, followed through the wrappers before this one
                for n in chain[1:]:
                    if n.op in WRAPPERS:
                        conv_axis = channel_axis(n, conv_axis, ctx)
                axis = channel_axis(wrapper, conv_axis, ctx)
                return self._operands(node, side, wrapper, conv_axis, axis, ctx, nodes, out)
            except _Refused as refused:
                return skip(refused.reason, refused.detail, nodes, out)
        return None

    def _before_conv(self, wrapper: gs.Node, ctx: Context) -> LayoutMatch | Skip | None:
        """An Add/Sub/Mul/Div by a constant before ``wrapper``, whose output reaches input 0 of a Conv through
        wrappers only: the op moves after ``wrapper`` (affine_conv folds it into the Conv), its constant following
        the axis it varies along to the conv's channel axis (1)."""
        op = edit.producer(wrapper.inputs[0])
        if not is_op(op, *AFFINE) or len(op.inputs) != 2 or len(op.outputs) != 1:
            return None
        values = [ctx.constant(t) for t in op.inputs]
        runtime = [i for i, (v, why) in enumerate(values) if v is None and why != Reason.INITIALIZER_IS_INPUT]
        if len(runtime) != 1 or (op.op == "Div" and runtime[0] == 1):
            return None  # two run-time operands, two constants, or c / x (1/x is not affine)
        data = runtime[0]
        if self._to_conv(op.inputs[data]) is not None:
            return None  # a Conv before: the op moves towards it (folded there), never both ways
        nxt, wrappers, last = wrapper, [wrapper], wrapper.outputs[0]
        for _ in range(32):
            readers = edit.consumers(last)
            if len(readers) != 1:
                return None
            nxt = readers[0]
            if is_op(nxt, *CONV_OPS) and nxt.inputs[0] is last:
                break
            if len(nxt.outputs) != 1 or not (is_op(nxt, *WRAPPERS) or self._moved_affine(nxt, last)):
                return None
            if nxt.op in WRAPPERS:
                wrappers.append(nxt)
            last = nxt.outputs[0]
        else:
            return None
        nodes, out = [op, wrapper], wrapper.outputs[0]
        bad = private_check([op.outputs[0]], [wrapper], ctx, nodes, out)
        if bad:
            return bad
        c_tensor = op.inputs[1 - data]
        c = values[1 - data][0]
        if c is None:
            return skip(Reason.INITIALIZER_IS_INPUT, f"{c_tensor.name} is an initializer listed as a graph input "
                        "(overridable)", nodes, out)
        c = np.asarray(c)
        x_shape, y_shape = ctx.shape(op.inputs[data]), ctx.shape(wrapper.outputs[0])
        try:
            if x_shape is None or y_shape is None:
                raise _Refused(Reason.LAYOUT_SHAPE, f"the rank of {op.inputs[data].name} or of {out.name} is not "
                               "known")
            aligned = (1,) * (len(x_shape) - c.ndim) + tuple(c.shape)
            if c.ndim > len(x_shape) or any(d != 1 and d != x for d, x in zip(aligned, x_shape, strict=True)):
                return skip(Reason.NOT_PER_CHANNEL, f"{c_tensor.name} of shape {list(c.shape)} broadcasts "
                            f"{op.inputs[data].name} {list(x_shape)} to a larger shape", nodes, out)
            extra = []
            for i, t in enumerate(wrapper.inputs[1:], start=1):
                if t.name and edit.producer(t) is not None:  # a Constant node: re-stored where the wrapper moves
                    value, _ = ctx.constant(t)
                    if value is None:
                        raise _Refused(Reason.LAYOUT_SHAPE, f"input {t.name} of {wrapper.name} is computed at run "
                                       "time")
                    extra.append((i, np.asarray(value)))
            if c.size == 1:
                return LayoutMatch(nodes, data=data, constant=c.reshape((1,) * min(max(c.ndim, 1), len(y_shape))),
                                   extra=tuple(extra), forward=True)
            varying = [i for i, d in enumerate(aligned) if d != 1]
            axis = channel_axis(wrapper, varying[0], ctx) if len(varying) == 1 else -1
            landed = axis
            for w in wrappers[1:]:
                landed = channel_axis(w, landed, ctx) if landed >= 0 else -1
            if landed != 1:
                return skip(Reason.NOT_PER_CHANNEL, f"{c_tensor.name} of shape {list(c.shape)} does not vary along "
                            f"the axis that becomes the channel axis of the Conv after {wrapper.name}", nodes, out)
        except _Refused as refused:
            return skip(refused.reason, refused.detail, nodes, out)
        shape = [1] * len(y_shape)
        shape[axis] = int(aligned[varying[0]])
        return LayoutMatch(nodes, data=data, constant=c.reshape(shape).copy(), extra=tuple(extra), forward=True)

    @staticmethod
    def _moved_affine(node: gs.Node, data: gs.Tensor) -> bool:
        """True for an Add/Sub/Mul/Div of ``data`` by a constant (one moved after a wrapper before), not c / x."""
        if not is_op(node, *AFFINE) or len(node.inputs) != 2 or data not in node.inputs:
            return False
        side = 0 if node.inputs[0] is data else 1
        return constants.is_constant(node.inputs[1 - side]) and not (node.op == "Div" and side == 1)

    @staticmethod
    def _to_conv(t: gs.Tensor) -> list[gs.Node] | None:
        """The nodes from a Conv to the one that writes ``t`` (Conv first; wrappers, per-channel affines and
        activations moved before them), or None when the walk back from ``t`` meets anything else."""
        chain: list[gs.Node] = []
        for _ in range(32):
            n = edit.producer(t)
            if is_op(n, *CONV_OPS):
                return [n, *reversed(chain)]
            if not (is_op(n, *WRAPPERS) or is_op(n, *ACTIVATIONS) or is_op(n, *AFFINE)) or not n.inputs:
                return None
            if is_op(n, *AFFINE):  # the run-time operand must be the chain; the other a constant
                operands = [i for i in n.inputs if not constants.is_constant(i)]
                if len(operands) != 1:
                    return None
                t = operands[0]
            else:
                t = n.inputs[0]
            chain.append(n)
        return None

    @staticmethod
    def _operands(node: gs.Node, side: int, wrapper: gs.Node, conv_axis: int, axis: int, ctx: Context,
                  nodes: list[gs.Node], out: gs.Tensor) -> LayoutMatch | Skip | None:
        """The match for ``node`` after ``wrapper``, whose input holds the conv's channels on ``conv_axis`` and
        whose output on ``axis``; ``side`` is the input of ``node`` that ``wrapper`` feeds."""
        conv_side = wrapper.inputs[0]
        side_shape = ctx.shape(conv_side)
        if node.op in ACTIVATIONS:
            extra = []
            for i, t in enumerate(node.inputs[1:], start=1):
                if not t.name:
                    continue
                value, why = ctx.constant(t)
                if value is None:
                    return None if why != Reason.INITIALIZER_IS_INPUT else skip(
                        Reason.INITIALIZER_IS_INPUT, f"{t.name} of {node.name} is an overridable initializer",
                        nodes, out)
                extra.append((i, np.asarray(value)))
            return LayoutMatch(nodes, data=0, extra=tuple(extra))
        c_tensor = node.inputs[1 - side]
        c, why = ctx.constant(c_tensor)
        if c is None:
            if why == Reason.INITIALIZER_IS_INPUT:
                return skip(Reason.INITIALIZER_IS_INPUT, f"{c_tensor.name} is an initializer listed as a graph "
                            "input (overridable)", nodes, out)
            return None  # a run-time operand: a residual, not an affine constant
        if node.op == "Div" and side == 1:
            return skip(Reason.CONV_IS_DIVISOR, f"{c_tensor.name} / conv output is not linear", nodes, out)
        c = np.asarray(c)
        y_shape = ctx.shape(wrapper.outputs[0])
        if y_shape is None or side_shape is None:
            raise _Refused(Reason.LAYOUT_SHAPE, f"the rank of {wrapper.outputs[0].name} is not known")
        if c.ndim > len(y_shape):
            return skip(Reason.NOT_PER_CHANNEL, f"{c_tensor.name} of shape {list(c.shape)} has more axes than "
                        f"{wrapper.outputs[0].name}", nodes, out)
        rank = len(side_shape)
        if c.size == 1:
            return LayoutMatch(nodes, data=side, constant=c.reshape((1,) * min(max(c.ndim, 1), rank)).copy())
        aligned = (1,) * (len(y_shape) - c.ndim) + tuple(c.shape)
        varying = [i for i, d in enumerate(aligned) if d != 1]
        if varying != [axis] or y_shape[axis] != aligned[axis]:
            return skip(Reason.NOT_PER_CHANNEL, f"{c_tensor.name} of shape {list(c.shape)} does not vary along "
                        f"axis {axis} of {wrapper.outputs[0].name} {list(y_shape)} alone, the conv's channel "
                        f"axis there", nodes, out)
        shape = [1] * rank
        shape[conv_axis] = int(aligned[axis])
        return LayoutMatch(nodes, data=side, constant=c.reshape(shape).copy())

    def rewrite(self, match: LayoutMatch, ctx: Context) -> Fusion:
        if match.forward:
            return self._rewrite_forward(match, ctx)
        wrapper, node = match.nodes
        original = replaced(match.nodes)
        order = ctx.edit_order
        source, out = wrapper.inputs[0], node.outputs[0]
        moved = gs.Variable(ctx.namer.fresh(f"{out.name}_before_{wrapper.op.lower()}"), dtype=ctx.dtype(source),
                            shape=ctx.shape(source))
        node.inputs[match.data] = source
        if match.constant is not None:
            node.inputs[1 - match.data] = constants.new_constant(ctx.namer, f"{node.name}_c", match.constant)
        for i, value in match.extra:
            node.inputs[i] = constants.new_constant(ctx.namer, f"{node.name}_in{i}", np.array(value))
        node.outputs = [moved]
        wrapper.inputs[0] = moved
        wrapper.outputs = [out]  # the wrapper's old output tensor is left with neither producer nor reader
        # the op now runs where the wrapper ran (its inputs are the wrapper's input and fresh initializers), the
        # wrapper where the op ran (before every reader of the output)
        a, b = order.slot(wrapper), order.slot(node)
        order.delete([wrapper, node])
        order.place(node, a)
        order.place(wrapper, b)
        return Fusion(self.name, node.name, node.op, original, None, out.name, self.kind)

    def _rewrite_forward(self, match: LayoutMatch, ctx: Context) -> Fusion:
        """X -> op(c) -> wrapper -> Y  =>  X -> wrapper -> op(c') -> Y: the wrapper takes the op's slot (its
        inputs are X and fresh initializers), the op the wrapper's."""
        node, wrapper = match.nodes
        original = replaced(match.nodes)
        order = ctx.edit_order
        source, out = node.inputs[match.data], wrapper.outputs[0]
        moved = gs.Variable(ctx.namer.fresh(f"{node.name}_input_{wrapper.op.lower()}"), dtype=ctx.dtype(out),
                            shape=ctx.shape(out))
        for i, value in match.extra:
            wrapper.inputs[i] = constants.new_constant(ctx.namer, f"{wrapper.name}_in{i}", np.array(value))
        wrapper.inputs[0] = source
        wrapper.outputs = [moved]
        node.inputs[match.data] = moved
        if match.constant is not None:
            node.inputs[1 - match.data] = constants.new_constant(ctx.namer, f"{node.name}_c", match.constant)
        node.outputs = [out]
        a, b = order.slot(node), order.slot(wrapper)
        order.delete([wrapper, node])
        order.place(wrapper, a)
        order.place(node, b)
        return Fusion(self.name, node.name, node.op, original, None, out.name, self.kind)
