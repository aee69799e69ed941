"""Remove nodes that pass their input through unchanged, and compose Transpose chains.

Before => after::

    Identity(x) -> y                         =>  readers of y read x
    Dropout(x) -> y            (inference)   =>  readers of y read x
    Cast(x, to=dtype of x) -> y              =>  readers of y read x
    Transpose(x, identity perm) -> y         =>  readers of y read x
    Transpose(x, p) -> Transpose(., q) -> y  =>  readers of y read x       when p[q[i]] == i for every axis i
    Transpose(x, p) -> Transpose(., q) -> y  =>  Transpose(x, r) -> y     r[i] = p[q[i]], otherwise
    Cast(x: T, to=W) -> Cast(., to=T) -> y   =>  readers of y read x       when every T value is exactly a W value
    Dropout(x, ratio=0, training_mode=1)     =>  readers of y read x
    Pad(x, pads all 0) -> y                  =>  readers of y read x
    Squeeze(x, A) -> Unsqueeze(., A) -> y    =>  readers of y read x       (and Unsqueeze(x, A) -> Squeeze(., A))

Exporters leave these between a Conv and what follows it (paddle2onnx: ``Conv -> Add -> Identity -> Relu``), and
they break the chains the fusion passes look for. Dropout is the identity at inference (ONNX Operators.md,
Dropout: "If training_mode is false ... the output Y is the input"). A Transpose pair composes to
``out[i] = x[p[q[i]]]`` (Operators.md, Transpose: output axis i is input axis perm[i]), the identity exactly
when p[q[i]] == i; the first Transpose stays when something else reads its output (then a pair that does not
cancel is left as it is: composing would save nothing). Both Transposes of a pair must be in the same graph (a
pair split between a graph and an If/Loop/Scan body is left alone). A lossy Cast round trip
(float32 -> float16 -> float32) is two Casts that each change the dtype, so it is never matched; a widening round
trip (float16 -> float32 -> float16, int8 -> int32 -> int8: :data:`WIDENING`) gives back x exactly (Operators.md,
Cast: every value of the narrower type is a value of the wider one, and casting it back is exact). Dropout in
training mode with ratio 0 drops nothing and scales by 1 / (1 - 0): its output is its input (Operators.md,
Dropout: ``output = scale * data * mask``, ``scale = 1 / (1 - ratio)``). A Pad whose pads are all 0 adds
nothing, whatever its mode (Operators.md, Pad). Squeeze removes axes of extent 1 and Unsqueeze inserts them
(Operators.md), so a Squeeze of axes A followed by an Unsqueeze of the same axes A (normalized in the same rank),
or the other way round, gives back x's shape and its elements in their order: audio exports write each Conv1d as
``Unsqueeze -> Conv -> Squeeze``, leaving ``Squeeze -> Unsqueeze`` between two convs.

When the removed node's output is a graph output (exporters often end a graph, or every Loop body, in an
Identity), the node that computes its input takes over the graph output's name, so the model's interface stays
the same; that needs an input computed by a node of the same graph that is no graph output itself and is read
by no node of a subgraph (it is renamed). Where the input cannot take the name (a graph input, a constant,
another graph output, ...), the graph output still needs a node to write it under its own name: the no-op (or
the pair) becomes one ``Identity(x)`` (Operators.md, Identity), the same values; only a lone Identity is left as
it is.

Skipped when:
    intermediate-is-graph-output   the node is an Identity, its output is a graph output and its input cannot
                                   take over the name (a graph input, a constant, another graph output, a
                                   tensor of an enclosing graph or one a subgraph reads): the minimal form
    dropout-training-mode          Dropout's training_mode is true (and its ratio is not a constant 0) or
                                   computed at run time
    dropout-mask-used              Dropout's mask output is read
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_graphsurgeon as gs

from onnxfuse.ir import edit
from onnxfuse.model.dtypes import np_dtype
from onnxfuse.passes._checks import is_op, replaced, skip
from onnxfuse.passes.base import Context, Match, Pass
from onnxfuse.records import Fusion, Reason, RewriteKind, Skip

#: Casts whose round trip ``T -> W -> T`` is exact: every value of T is a value of W (ONNX TensorProto types).
WIDENING = frozenset({
    (np.dtype(np.float16), np.dtype(np.float32)), (np.dtype(np.float16), np.dtype(np.float64)),
    (np.dtype(np.float32), np.dtype(np.float64)),
    *((np.dtype(a), np.dtype(b)) for a, b in [
        (np.int8, np.int16), (np.int8, np.int32), (np.int8, np.int64), (np.int16, np.int32), (np.int16, np.int64),
        (np.int32, np.int64), (np.uint8, np.uint16), (np.uint8, np.uint32), (np.uint8, np.uint64),
        (np.uint8, np.int16), (np.uint8, np.int32), (np.uint8, np.int64), (np.uint16, np.uint32),
        (np.uint16, np.uint64), (np.uint16, np.int32), (np.uint16, np.int64), (np.uint32, np.uint64),
        (np.uint32, np.int64)]),
})


@dataclass
class BypassMatch(Match):
    """``nodes[-1]``'s readers will read ``source``; ``nodes`` (all of them) are then deleted.

    With ``perm`` set, ``nodes[-1]`` (a Transpose) stays and reads ``source`` with that perm instead; only
    ``removed`` is deleted. With ``takes_output``, ``source`` becomes the graph output ``nodes[-1]`` wrote, under
    that output's name.
    """

    source: gs.Tensor | None = None
    removed: list[gs.Node] = field(default_factory=list)
    perm: list[int] | None = None
    takes_output: bool = False
    #: ``nodes[-1]`` becomes ``Identity(source)`` writing its graph output (whose name no other tensor can take)
    as_identity: bool = False


def _perm(node: gs.Node, ctx: Context) -> list[int] | None:
    perm = node.attrs.get("perm")
    if perm is not None:
        return [int(p) for p in perm]
    shape = ctx.shape(node.inputs[0])
    return None if shape is None else list(range(len(shape)))[::-1]  # default: reverse the axes


def _read(t: gs.Tensor, ctx: Context) -> bool:
    return bool(t.name) and (bool(edit.consumers(t)) or edit.is_graph_output(t, ctx.graph))


class RemoveRedundant(Pass[BypassMatch]):
    """Identity / inference Dropout / Cast to the same dtype / cancelling Transpose or Squeeze/Unsqueeze pair =>
    nothing."""

    name = "remove_redundant"
    kind = RewriteKind.CANONICALIZE
    summary = ("remove Identity, inference Dropout, Cast to the same dtype, widening Cast round trips, zero Pads "
               "and Transposes or Squeeze/Unsqueeze pairs that cancel; compose Transpose pairs")
    reasons = (Reason.GRAPH_OUTPUT, Reason.DROPOUT_TRAINING, Reason.DROPOUT_MASK)
    anchors = ("Identity", "Dropout", "Cast", "Transpose", "Pad", "Squeeze", "Unsqueeze")

    def match(self, node: gs.Node, ctx: Context) -> BypassMatch | Skip | None:
        if not is_op(node, *self.anchors) or not node.inputs or not node.outputs:
            return None
        if node.op == "Transpose":
            return self._transpose(node, ctx)
        if node.op == "Pad":
            return _bypass([node], node.inputs[0], [], ctx) if _zero_pads(node, ctx) else None
        if node.op in ("Squeeze", "Unsqueeze"):
            return self._squeeze_pair(node, ctx)
        source = node.inputs[0]
        if node.op == "Cast":
            to, dtype = _cast_to(node), ctx.dtype(source)
            if to is None or dtype is None:
                return None
            if to != dtype:
                return self._cast_round_trip(node, to, dtype, ctx)
        nodes, out = [node], node.outputs[0]
        if node.op == "Dropout":
            bad = self._dropout_check(node, ctx, nodes, out)
            if bad:
                return bad
        return _bypass(nodes, source, [], ctx)

    @staticmethod
    def _transpose(node: gs.Node, ctx: Context) -> BypassMatch | Skip | None:
        """A Transpose with the identity perm, or the second of a pair in one graph (see the module docstring)."""
        q = _perm(node, ctx)
        if q is None:
            return None
        if q == list(range(len(q))):
            return _bypass([node], node.inputs[0], [], ctx)
        first = edit.producer(node.inputs[0])
        if not is_op(first, "Transpose") or not first.inputs or (ctx.members and id(first) not in ctx.members):
            return None  # no pair, or its first Transpose is in an enclosing graph
        p = _perm(first, ctx)
        if p is None or len(p) != len(q):
            return None
        source, composed = first.inputs[0], [p[q[i]] for i in range(len(q))]
        private = len(edit.consumers(first.outputs[0])) == 1 and not edit.is_graph_output(first.outputs[0], ctx.graph)
        removed = [first] if private else []
        if composed == list(range(len(q))):
            return _bypass([*removed, node], source, removed, ctx)
        if not private:
            return None
        return BypassMatch([first, node], source=source, removed=removed, perm=composed)

    @staticmethod
    def _squeeze_pair(node: gs.Node, ctx: Context) -> BypassMatch | Skip | None:
        """Squeeze(x, A) -> Unsqueeze(., A) or Unsqueeze(x, A) -> Squeeze(., A) in one graph: ``node``'s readers
        read x; the first node goes too when nothing else reads it. The axes must be constants, normalized in the
        rank of x (a Squeeze without axes: x's extents must be known)."""
        other = "Unsqueeze" if node.op == "Squeeze" else "Squeeze"
        first = edit.producer(node.inputs[0])
        if not is_op(first, other) or not first.inputs or (ctx.members and id(first) not in ctx.members):
            return None
        source = first.inputs[0]
        shape = ctx.shape(source)
        if shape is None:
            return None
        axes = [_squeeze_axes(n, ctx) for n in (first, node)]
        if axes[0] is None or axes[1] is None:
            return None
        rank = len(shape) + (len(axes[0]) if first.op == "Unsqueeze" else 0)  # the rank both axes lists count in
        if not axes[0] and first.op == "Squeeze":  # no axes: every axis of extent 1, if all are known
            if not all(isinstance(d, int) for d in shape):
                return None
            axes[0] = [i for i, d in enumerate(shape) if d == 1]
        if not axes[0] or not axes[1] or {a % rank for a in axes[0]} != {a % rank for a in axes[1]}:
            return None
        private = len(edit.consumers(first.outputs[0])) == 1 and not edit.is_graph_output(first.outputs[0], ctx.graph)
        removed = [first] if private else []
        return _bypass([*removed, node], source, removed, ctx)

    @staticmethod
    def _cast_round_trip(node: gs.Node, to: np.dtype, dtype: np.dtype, ctx: Context) -> BypassMatch | Skip | None:
        """Cast(x: T, to=W) -> Cast(., to=T) with (T, W) in :data:`WIDENING`: the second Cast's readers read x;
        the first goes too when nothing else reads it."""
        first = edit.producer(node.inputs[0])
        if not is_op(first, "Cast") or not first.inputs or (ctx.members and id(first) not in ctx.members):
            return None
        source = first.inputs[0]
        if ctx.dtype(source) != to or (to, dtype) not in WIDENING:
            return None
        private = len(edit.consumers(first.outputs[0])) == 1 and not edit.is_graph_output(first.outputs[0], ctx.graph)
        removed = [first] if private else []
        return _bypass([*removed, node], source, removed, ctx)

    @staticmethod
    def _dropout_check(node: gs.Node, ctx: Context, nodes: list[gs.Node], out: gs.Tensor) -> Skip | None:
        if len(node.outputs) > 1 and _read(node.outputs[1], ctx):
            where = "a graph output" if edit.is_graph_output(node.outputs[1], ctx.graph) else "read by another node"
            return skip(Reason.DROPOUT_MASK, f"the mask output {node.outputs[1].name} is used ({where}): removing "
                        "the Dropout would leave it without a producer", nodes, out)
        if len(node.inputs) > 2 and node.inputs[2].name:
            mode, _ = ctx.constant(node.inputs[2])
            ratio = ctx.constant(node.inputs[1])[0] if len(node.inputs) > 1 and node.inputs[1].name else None
            if mode is not None and ratio is not None and float(np.asarray(ratio).reshape(-1)[0]) == 0.0:
                return None  # ratio 0 keeps every element and scales by 1: the identity in training mode too
            if mode is None or bool(np.asarray(mode).reshape(-1)[0]):
                return skip(Reason.DROPOUT_TRAINING, f"training_mode {node.inputs[2].name} is "
                            + ("true" if mode is not None else "not a constant"), nodes, out)
        return None

    def rewrite(self, match: BypassMatch, ctx: Context) -> Fusion:
        node = match.nodes[-1]
        original = replaced(match.nodes)
        if match.perm is not None:
            node.attrs["perm"] = list(match.perm)
            edit.replace_input(ctx.edit_order, node, 0, match.source, match.removed)
            return Fusion(self.name, node.name, node.op, original, None, original[-1][2], self.kind)
        out = node.outputs[0]
        if match.as_identity:
            assert match.source is not None
            node.op, node.attrs, node.domain = "Identity", {}, ""
            node.inputs, node.outputs = [match.source], [out]
            edit.replace_input(ctx.edit_order, node, 0, match.source, match.removed)
            return Fusion(self.name, node.name, node.op, original, None, out.name, self.kind)
        edit.bypass(ctx.edit_order, node, match.source, match.removed)
        if match.takes_output:
            edit.take_over_output(ctx.graph, out, match.source)
        # node and op "": nothing computes it now
        return Fusion(self.name, "", "", original, None, original[-1][2], self.kind)


def _squeeze_axes(node: gs.Node, ctx: Context) -> list[int] | None:
    """Squeeze/Unsqueeze ``axes`` (attribute before opset 13, input since), [] when absent, None when computed."""
    if "axes" in node.attrs:
        return [int(a) for a in node.attrs["axes"]]
    if len(node.inputs) > 1 and node.inputs[1].name:
        value, _ = ctx.constant(node.inputs[1])
        return None if value is None else [int(a) for a in np.asarray(value).reshape(-1)]
    return []


def _cast_to(node: gs.Node) -> np.dtype | None:
    try:
        return np_dtype(int(node.attrs.get("to")))
    except (KeyError, TypeError, ValueError):
        return None


def _zero_pads(node: gs.Node, ctx: Context) -> bool:
    """True when the Pad's pads (the attribute before opset 11, a constant input since) are all 0."""
    if "pads" in node.attrs:
        pads = np.asarray(node.attrs["pads"])
    elif len(node.inputs) > 1 and node.inputs[1].name:
        value = ctx.constant(node.inputs[1])[0]
        if value is None:
            return False
        pads = np.asarray(value)
    else:
        return False
    return pads.size > 0 and not np.any(pads)


def _bypass(nodes: list[gs.Node], source: gs.Tensor, removed: list[gs.Node], ctx: Context) -> BypassMatch | Skip:
    """Bypass ``nodes[-1]`` (readers of its output read ``source``), taking over its output's name when that is
    a graph output and :func:`_takeover_blocker` allows it."""
    out = nodes[-1].outputs[0]
    if not edit.is_graph_output(out, ctx.graph):
        return BypassMatch(nodes, source=source, removed=removed)
    why = _takeover_blocker(source, ctx)
    if why and len(nodes) == 1 and nodes[0].op == "Identity":
        return skip(Reason.GRAPH_OUTPUT, f"{out.name} is a graph output and {why}", nodes, out)
    if why:  # the output keeps its name: one Identity copies the source to it
        return BypassMatch(nodes, source=source, removed=removed, as_identity=True)
    return BypassMatch(nodes, source=source, removed=removed, takes_output=True)


def _takeover_blocker(source: gs.Tensor, ctx: Context) -> str | None:
    """Why ``source`` cannot be renamed to stand as a graph output of ``ctx.graph``, or None when it can: it
    must be computed by a node of ``ctx.graph``, be no graph output itself, and be read by nodes of
    ``ctx.graph`` only (a subgraph node reads an outer tensor by name)."""
    if isinstance(source, gs.Constant):
        return f"its input {source.name} is a constant"
    producer = edit.producer(source)
    if producer is None:
        return f"its input {source.name} is a graph input"
    if ctx.members and id(producer) not in ctx.members:
        return f"its input {source.name} comes from an enclosing graph"
    if edit.is_graph_output(source, ctx.graph):
        return f"its input {source.name} is a graph output too"
    if ctx.members and any(id(r) not in ctx.members for r in edit.consumers(source)):
        return f"its input {source.name} is read inside a subgraph"
    return None
