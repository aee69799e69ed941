"""Matching checks the passes share: op tests, the private-intermediate and QDQ checks, and the records
(:class:`~onnxfuse.records.Skip`, :class:`~onnxfuse.records.Fusion`) a pass returns.
"""

from __future__ import annotations

from typing import TypeGuard, TypeVar

import onnx_graphsurgeon as gs

from onnxfuse.ir import constants, edit
from onnxfuse.model.domains import is_default_domain
from onnxfuse.passes.base import Context, Match, Pass
from onnxfuse.records import Fusion, Reason, Skip

CONV_OPS = ("Conv", "ConvTranspose")

#: The detail of an ``initializer-is-graph-input`` refusal, after the tensor's name.
OVERRIDABLE = ("is an initializer listed as a graph input, which a caller may feed (IR version 4 or later); pass "
               "--constant-initializer-inputs if nobody does")


def is_op(node: gs.Node | None, *ops: str) -> TypeGuard[gs.Node]:
    """True when ``node`` is one of the default-domain ``ops`` (so, for type checkers, not None)."""
    return node is not None and node.op in ops and is_default_domain(node.domain)


def skip(reason: Reason, detail: str, nodes: list[gs.Node], output: gs.Tensor) -> Skip:
    """Build a :class:`Skip` for ``nodes`` (Conv first) whose fused node would write ``output``."""
    return Skip(reason, detail, replaced(nodes), output.name)


M = TypeVar("M", bound=Match)


def speed_rule(found: M | Skip | None, ctx: Context, form: str) -> M | Skip | None:
    """``found`` (a pass's match), unless it is a :class:`Match` of ``form`` (``providers.REWRITE_FORMS``) and that
    form runs slower than the unfused original at the onnxruntime level of ``ctx.target``
    (``providers.CPU_SLOWER_AT``): then a ``slower-than-unfused-at-ort-level`` skip of its nodes."""
    if not isinstance(found, Match) or not ctx.target.slower(form):
        return found
    last = found.nodes[-1]
    return skip(Reason.SLOWER_AT_ORT_LEVEL, f"{form} runs slower than the unfused original in onnxruntime at level "
                f"{ctx.target.ort_level} (see --ort-level)", found.nodes, last.outputs[0])


def private_check(intermediates: list[gs.Tensor], inside: list[gs.Node], ctx: Context, nodes: list[gs.Node],
                  output: gs.Tensor) -> Skip | None:
    """Skip unless every tensor in ``intermediates`` is read only by nodes in ``inside`` and is no graph output,
    and every one of ``nodes`` belongs to ``ctx.graph`` (a producer found through an outer-scope tensor lives in an
    enclosing graph, and its output is read by the If/Loop/Scan node that holds this subgraph)."""
    if ctx.members:
        for n in nodes:
            if id(n) not in ctx.members:
                return skip(Reason.NOT_PRIVATE, f"{n.outputs[0].name} comes from an enclosing graph "
                            "(read inside a subgraph)", nodes, output)
    ids = {id(n) for n in inside}
    for t in intermediates:
        if edit.is_graph_output(t, ctx.graph):
            return skip(Reason.GRAPH_OUTPUT, f"{t.name} is a graph output", nodes, output)
        readers = edit.consumers(t)
        if any(id(r) not in ids for r in readers):
            return skip(Reason.NOT_PRIVATE, f"{t.name} has {len(readers)} consumers", nodes, output)
    return None


def computed_from_constants(tensor: gs.Tensor, ctx: Context, limit: int = 64) -> bool:
    """True when ``tensor`` is not itself a constant but every path back from it ends at constants: it is
    computed by at most ``limit`` default-domain nodes from initializers and ``Constant`` nodes only (no graph
    input, no overridable initializer). Such a value is one ``constant_fold`` would have folded."""
    overridable = ctx.overridable
    if constants.is_constant(tensor, overridable):
        return False
    # constants.is_constant and edit.producer inlined: a residual Add's walk visits `limit` tensors on every round
    seen, todo = set(), [tensor]
    while todo:
        t = todo.pop()
        key = id(t)
        if key in seen:
            continue
        seen.add(key)
        if isinstance(t, gs.Constant):
            if t.name not in overridable:
                continue
            return False  # an overridable initializer
        node = t.inputs[0] if t.inputs else None
        if node is None or not is_default_domain(node.domain):
            return False
        if node.op == "Constant" and constants.is_constant(t, overridable):
            continue
        if len(seen) > limit:
            return False
        todo.extend([i for i in node.inputs if i.name])
    return True


def qdq_check(conv: gs.Node, output: gs.Tensor, nodes: list[gs.Node]) -> Skip | None:
    """Skip patterns that sit inside a QuantizeLinear/DequantizeLinear pair, which onnxruntime's QDQ fusions need
    to see as a plain Conv: the conv's data input comes from a DequantizeLinear, or its output feeds a
    QuantizeLinear. A weight or bias alone computed by DequantizeLinear (a weight-only int8 model, whose compute
    stays float) is no QDQ pattern: onnxruntime's QDQ node groups are DequantizeLinear -> op -> QuantizeLinear
    on the activations (``core/optimizer/qdq_transformer/selectors_actions/qdq_selectors.h``, NodeGroup)."""
    fed = bool(conv.inputs) and is_op(edit.producer(conv.inputs[0]), "DequantizeLinear")
    feeds = any(is_op(c, "QuantizeLinear") for c in edit.consumers(output))
    if fed or feeds:
        return skip(Reason.QDQ, "the conv is part of a QuantizeLinear/DequantizeLinear pattern", nodes, output)
    return None



def replaced(nodes: list[gs.Node]) -> tuple[tuple[str, str, str], ...]:
    """``(name, op_type, first output name)`` of ``nodes``; take it before the rewrite changes them."""
    return tuple((n.name, n.op, n.outputs[0].name if n.outputs else "") for n in nodes)


def describe(p: Pass, conv: gs.Node, original: tuple[tuple[str, str, str], ...],
             activation: str | None = None) -> Fusion:
    """The :class:`Fusion` record of pass ``p`` for a rewrite whose result is ``conv`` (call after the rewrite)."""
    return Fusion(p.name, conv.name, conv.op, original, activation, conv.outputs[0].name, p.kind)


def renew_output(node: gs.Node, ctx: Context, suffix: str) -> gs.Variable:
    """Give ``node``'s first output a fresh name (``<name>_<suffix>``) and make every reader read it; returns it.

    For a rewrite that keeps ``node`` but changes what its output holds (``batchnorm_gemm`` keeps the Flatten
    between the BN and the Gemm, which then flattens the BN's input): a tensor name means one value in the input
    and the output, so tools that compare two models tensor by tensor (``onnxfuse verify --layers``,
    ``verification.layers``; Polygraphy's ``--outputs mark all``) never compare two different values under one
    name. The new tensor gets the old one's dtype and shape (``Context.dtype`` / ``Context.shape``), which the
    export writes into ``value_info`` and the report's traffic reads (``traffic.Sizes.with_model``).
    """
    old = node.outputs[0]
    new = gs.Variable(ctx.namer.fresh(f"{old.name}_{suffix}"), dtype=ctx.dtype(old), shape=ctx.shape(old))
    for reader in edit.consumers(old):
        for i, t in enumerate(reader.inputs):
            if t is old:
                reader.inputs[i] = new
    node.outputs[0] = new
    return new
