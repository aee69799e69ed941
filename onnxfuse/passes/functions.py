"""Patterns inside model-local functions (``ModelProto.functions``, ONNX IR.md "Functions"): named, not rewritten.

A function body is a graph of its own: its tensor names are local to it (they may repeat the main graph's), it has
no initializers, its inputs are bound at each call site and it may read attributes of the calling node
(``ref_attr_name``). onnxfuse's shapes, constants and rewrites are of the main graph and its If/Loop/Scan bodies,
so it leaves every function body as it is. So that such a pattern is not left without a word, the passes' matchers
are run (read-only) over each body with nothing known but the body's own ``Constant`` nodes, and each pattern one of
them would rewrite is reported as a skip with :attr:`onnxfuse.records.Reason.IN_FUNCTION`, one per Conv chain as in
the main graph (``driver.longest_per_conv``). Its nodes' outputs are named ``domain::function/tensor``, so that they
never stand for a main-graph tensor of the same name in the report.
"""

from __future__ import annotations

import dataclasses
import logging

import onnx_graphsurgeon as gs

from onnxfuse.ir import edit
from onnxfuse.passes.base import Context, Match, Pass
from onnxfuse.records import Reason, Skip

log = logging.getLogger(__name__)


def function_skips(graph: gs.Graph, selected: tuple[Pass, ...], ctx: Context) -> list[list[Skip]]:
    """For each model-local function of ``graph`` (``gs.Graph.functions``), one :attr:`Reason.IN_FUNCTION` Skip per
    pattern that a pass of ``selected`` matches in its body, in the order found (the driver keeps one per Conv
    chain). ``ctx`` is left as it was: the matchers see a copy that knows no shape, no symbolic shape and no
    overridable initializer, since none of the main graph's names applies in a body. A matcher that raises on a
    body is logged (debug) and names nothing there."""
    skips: list[list[Skip]] = []
    for fn in getattr(graph, "functions", None) or []:
        if not isinstance(fn, gs.Graph):
            continue
        where = f"{fn.domain or ''}::{fn.name}"
        local = dataclasses.replace(ctx, graph=fn, members={id(n) for n in fn.nodes}, order=edit.NodeOrder(fn),
                                    shapes={}, symbolic=None, symbolic_loader=None, overridable=frozenset(),
                                    portable=frozenset(), excluded={})
        found: list[Skip] = []
        for p in selected:
            anchors = frozenset(p.anchors)
            for node in list(fn.nodes):
                if (anchors and node.op not in anchors) or not node.outputs:
                    continue
                try:
                    match = p.match(node, local)
                except Exception as exc:  # a body that no main-graph matcher was written for: name nothing
                    log.debug("%s: %s on %s in %s: %s", p.name, type(exc).__name__, node.name, where, exc)
                    continue
                if isinstance(match, Match):
                    found.append(Skip(Reason.IN_FUNCTION, f"inside the model-local function {where}: onnxfuse "
                                      "rewrites no function body",
                                      tuple((n.name, n.op, f"{where}/{n.outputs[0].name}" if n.outputs else "")
                                            for n in match.nodes),
                                      f"{where}/{match.nodes[-1].outputs[0].name}", p.name))
        skips.append(found)
    return skips
