"""Remove nodes that pass their input through unchanged.

Before => after::

    Identity(x) -> y                         =>  readers of y read x
    Dropout(x) -> y            (inference)   =>  readers of y read x
    Cast(x, to=dtype of x) -> y              =>  readers of y read x
    Transpose(x, p) -> Transpose(., q) -> y  =>  readers of y read x       when p[q[i]] == i for every axis i

Exporters leave these between a Conv and what follows it (paddle2onnx: ``Conv -> Add -> Identity -> Relu``), and
they break the chains the fusion passes look for. Dropout is the identity at inference (ONNX Operators.md,
Dropout: "If training_mode is false ... the output Y is the input"). A Transpose pair composes to
``out[i] = x[p[q[i]]]`` (Operators.md, Transpose), the identity exactly when p[q[i]] == i; the first Transpose
stays when something else reads its output. A lossy Cast round trip (float32 -> float16 -> float32) is two Casts
that each change the dtype, so it is never matched.

Skipped when:
    intermediate-is-graph-output   the node's output is a graph output (removing it would rename an output)
    dropout-training-mode          Dropout's training_mode is true or computed at run time
    dropout-mask-used              Dropout's mask output is read
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from onnxfuse import graph as g
from onnxfuse.passes._checks import is_op, replaced, skip
from onnxfuse.passes.base import Context, Fusion, Match, Pass, Reason, Skip


@dataclass
class BypassMatch(Match):
    """``nodes[-1]``'s readers will read ``source``; ``nodes`` (all of them) are then deleted."""

    source: gs.Tensor | None = None
    removed: list[gs.Node] = field(default_factory=list)


def _perm(node: gs.Node, ctx: Context) -> list[int] | None:
    perm = node.attrs.get("perm")
    if perm is not None:
        return [int(p) for p in perm]
    shape = ctx.shape(node.inputs[0])
    return None if shape is None else list(range(len(shape)))[::-1]  # default: reverse the axes


def _read(t: gs.Tensor, ctx: Context) -> bool:
    return bool(t.name) and (bool(g.consumers(t)) or g.is_graph_output(t, ctx.graph))


class RemoveRedundant(Pass[BypassMatch]):
    """Identity / inference Dropout / Cast to the same dtype / cancelling Transpose pair => nothing."""

    name = "remove_redundant"
    summary = "remove Identity, inference Dropout, Cast to the same dtype and Transpose pairs that cancel"
    reasons = (Reason.GRAPH_OUTPUT, Reason.DROPOUT_TRAINING, Reason.DROPOUT_MASK)
    anchors = ("Identity", "Dropout", "Cast", "Transpose")

    def match(self, node: gs.Node, ctx: Context) -> Match | Skip | None:
        if not is_op(node, *self.anchors) or not node.inputs or not node.outputs:
            return None
        source, removed = node.inputs[0], []
        if node.op == "Cast":
            to, dtype = node.attrs.get("to"), ctx.dtype(source)
            try:
                if dtype is None or np.dtype(onnx.helper.tensor_dtype_to_np_dtype(int(to))) != dtype:
                    return None
            except (KeyError, TypeError, ValueError):
                return None
        if node.op == "Transpose":
            first = g.producer(source)
            if not is_op(first, "Transpose"):
                return None
            p, q = _perm(first, ctx), _perm(node, ctx)
            if p is None or q is None or len(p) != len(q) or any(p[q[i]] != i for i in range(len(q))):
                return None
            source = first.inputs[0]
            if len(g.consumers(first.outputs[0])) == 1 and not g.is_graph_output(first.outputs[0], ctx.graph):
                removed = [first]
        nodes, out = [*removed, node], node.outputs[0]
        if node.op == "Dropout":
            bad = self._dropout_check(node, ctx, nodes, out)
            if bad:
                return bad
        if g.is_graph_output(out, ctx.graph):
            return skip(Reason.GRAPH_OUTPUT, f"{out.name} is a graph output", nodes, out)
        return BypassMatch(nodes, source=source, removed=removed)

    @staticmethod
    def _dropout_check(node: gs.Node, ctx: Context, nodes: list[gs.Node], out: gs.Tensor) -> Skip | None:
        if len(node.outputs) > 1 and _read(node.outputs[1], ctx):
            return skip(Reason.DROPOUT_MASK, f"the mask output {node.outputs[1].name} is read", nodes, out)
        if len(node.inputs) > 2 and node.inputs[2].name:
            mode, _ = ctx.constant(node.inputs[2])
            if mode is None or bool(np.asarray(mode).reshape(-1)[0]):
                return skip(Reason.DROPOUT_TRAINING, f"training_mode {node.inputs[2].name} is "
                            + ("true" if mode is not None else "not a constant"), nodes, out)
        return None

    def rewrite(self, match: BypassMatch, ctx: Context) -> Fusion:
        node = match.nodes[-1]
        original = replaced(match.nodes)
        g.bypass(ctx.order, node, match.source, match.removed)
        return Fusion(self.name, "", "", original, None, original[-1][2])  # node and op: nothing computes it now
