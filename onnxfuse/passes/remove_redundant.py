"""Remove nodes that pass their input through unchanged, and compose Transpose chains.

Before => after::

    Identity(x) -> y                         =>  readers of y read x
    Dropout(x) -> y            (inference)   =>  readers of y read x
    Cast(x, to=dtype of x) -> y              =>  readers of y read x
    Transpose(x, identity perm) -> y         =>  readers of y read x
    Transpose(x, p) -> Transpose(., q) -> y  =>  readers of y read x       when p[q[i]] == i for every axis i
    Transpose(x, p) -> Transpose(., q) -> y  =>  Transpose(x, r) -> y     r[i] = p[q[i]], otherwise

Exporters leave these between a Conv and what follows it (paddle2onnx: ``Conv -> Add -> Identity -> Relu``), and
they break the chains the fusion passes look for. Dropout is the identity at inference (ONNX Operators.md,
Dropout: "If training_mode is false ... the output Y is the input"). A Transpose pair composes to
``out[i] = x[p[q[i]]]`` (Operators.md, Transpose: output axis i is input axis perm[i]), the identity exactly
when p[q[i]] == i; the first Transpose stays when something else reads its output (then a pair that does not
cancel is left as it is: composing would save nothing). Both Transposes of a pair must be in the same graph (a
pair split between a graph and an If/Loop/Scan body is left alone). A lossy Cast round trip
(float32 -> float16 -> float32) is two Casts that each change the dtype, so it is never matched.

When the removed node's output is a graph output (exporters often end a graph, or every Loop body, in an
Identity), the node that computes its input takes over the graph output's name, so the model's interface stays
the same; that needs an input computed by a node of the same graph that is no graph output itself and is read
by no node of a subgraph (it is renamed).

Skipped when:
    intermediate-is-graph-output   the node's output is a graph output and its input cannot take over the name
                                   (a graph input, a constant, another graph output, a tensor of an enclosing
                                   graph or one a subgraph reads)
    dropout-training-mode          Dropout's training_mode is true or computed at run time
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


def _perm(node: gs.Node, ctx: Context) -> list[int] | None:
    perm = node.attrs.get("perm")
    if perm is not None:
        return [int(p) for p in perm]
    shape = ctx.shape(node.inputs[0])
    return None if shape is None else list(range(len(shape)))[::-1]  # default: reverse the axes


def _read(t: gs.Tensor, ctx: Context) -> bool:
    return bool(t.name) and (bool(edit.consumers(t)) or edit.is_graph_output(t, ctx.graph))


class RemoveRedundant(Pass[BypassMatch]):
    """Identity / inference Dropout / Cast to the same dtype / cancelling Transpose pair => nothing."""

    name = "remove_redundant"
    kind = RewriteKind.CANONICALIZE
    summary = ("remove Identity, inference Dropout, Cast to the same dtype and Transposes that cancel; compose "
               "Transpose pairs")
    reasons = (Reason.GRAPH_OUTPUT, Reason.DROPOUT_TRAINING, Reason.DROPOUT_MASK)
    anchors = ("Identity", "Dropout", "Cast", "Transpose")

    def match(self, node: gs.Node, ctx: Context) -> BypassMatch | Skip | None:
        if not is_op(node, *self.anchors) or not node.inputs or not node.outputs:
            return None
        if node.op == "Transpose":
            return self._transpose(node, ctx)
        source = node.inputs[0]
        if node.op == "Cast":
            to, dtype = node.attrs.get("to"), ctx.dtype(source)
            try:
                if dtype is None or np_dtype(int(to)) != dtype:
                    return None
            except (KeyError, TypeError, ValueError):
                return None
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
        if match.perm is not None:
            node.attrs["perm"] = list(match.perm)
            edit.replace_input(ctx.edit_order, node, 0, match.source, match.removed)
            return Fusion(self.name, node.name, node.op, original, None, original[-1][2], self.kind)
        out = node.outputs[0]
        edit.bypass(ctx.edit_order, node, match.source, match.removed)
        if match.takes_output:
            edit.take_over_output(ctx.graph, out, match.source)
        # node and op "": nothing computes it now
        return Fusion(self.name, "", "", original, None, original[-1][2], self.kind)


def _bypass(nodes: list[gs.Node], source: gs.Tensor, removed: list[gs.Node], ctx: Context) -> BypassMatch | Skip:
    """Bypass ``nodes[-1]`` (readers of its output read ``source``), taking over its output's name when that is
    a graph output and :func:`_takeover_blocker` allows it."""
    out = nodes[-1].outputs[0]
    if not edit.is_graph_output(out, ctx.graph):
        return BypassMatch(nodes, source=source, removed=removed)
    why = _takeover_blocker(source, ctx)
    if why:
        return skip(Reason.GRAPH_OUTPUT, f"{out.name} is a graph output and {why}", nodes, out)
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
