"""The fixpoint driver: runs the selected passes over a graph and its subgraphs, the canonicalization stage first
(passes of kind ``RewriteKind.CANONICALIZE``), then the folds and fusions, each stage repeated until a round changes
nothing, and keeps one skip per Conv chain.
"""

from __future__ import annotations

import dataclasses

import onnx_graphsurgeon as gs

from onnxfuse.ir import edit
from onnxfuse.passes._checks import replaced
from onnxfuse.passes.base import Context, Match, Pass
from onnxfuse.passes.constant_fold import SHAPE_OPS, refresh_shapes
from onnxfuse.passes.functions import function_skips
from onnxfuse.records import Fusion, Reason, RewriteKind, Skip

#: Upper bound on rounds of the pass list per graph. Each round that changes nothing ends the loop; a chain
#: needs one round per fold that has to happen before the next can match (Conv -> Add -> BN -> Relu: 3), so
#: 10 leaves ample room while guaranteeing termination.
MAX_ROUNDS = 10

#: Reasons that only a value stands behind: the pattern fits and the pass would fuse it if that input were a
#: constant (or folded). A pass that stops there came nearer to fusing than one that refused the pattern's
#: structure, shape, target or speed.
VALUE_REASONS = frozenset({Reason.WEIGHTS_NOT_CONSTANT, Reason.PARAMS_NOT_CONSTANT, Reason.INITIALIZER_IS_INPUT,
                           Reason.CONSTANT_NOT_FOLDED})


def run_passes(graph: gs.Graph, selected: tuple[Pass, ...], ctx: Context) -> tuple[list[Fusion], list[Skip]]:
    """Run ``selected`` over ``graph`` and every subgraph: first the canonicalization passes among them
    (``passes.CANONICALIZE``, kind ``RewriteKind.CANONICALIZE``) until nothing changes, then the other passes until
    nothing changes (at most :data:`MAX_ROUNDS` rounds per stage and graph). ``graph`` is edited in place; ``ctx``'s
    ``graph``, ``members`` and ``order`` are set to each (sub)graph in turn.

    When constant_fold folded a ``Shape``/``Size`` in the main graph, ``ctx.shapes`` is refreshed by onnx shape
    inference before the fusion passes (``constant_fold.refresh_shapes``).

    A match whose site (:func:`site_key`) is in ``ctx.excluded`` is not rewritten: a skip is recorded for it instead,
    ``rewrite-broke-verification`` (the culprit search, :mod:`onnxfuse.verification.search`) or the reason the
    exclusion names (:func:`left_out_reason`; ``--tune``'s ``slower-when-measured``).

    Returns the rewrites in the order applied (each with its ``site``) and the skips seen in each stage's last
    (unchanged) round. Each rewrite's ``replaced`` names a node by the output it is known by in the report's
    lineage (:func:`_report_keys`): the input's name for a node that only canonicalization moved.
    """
    stages = [tuple(p for p in selected if p.kind is RewriteKind.CANONICALIZE),
              tuple(p for p in selected if p.kind is not RewriteKind.CANONICALIZE)]
    fusions: list[Fusion] = []
    skips: list[Skip] = []
    ctx.main_graph = graph
    for sub in list(edit.all_graphs(graph)):
        order = edit.NodeOrder(sub)
        ctx.graph, ctx.members, ctx.order = sub, {id(n) for n in sub.nodes}, order
        keys = {id(n): n.outputs[0].name for n in sub.nodes if n.outputs}
        for stage in stages:
            done = len(fusions)
            _run_stage(sub, stage, ctx, order, fusions, skips, keys)
            if sub is graph and any(f.pass_name == "constant_fold" and f.replaced[0][1] in SHAPE_OPS
                                    for f in fusions[done:]):
                refresh_shapes(sub, ctx)  # a Reshape of a folded static Shape now has a shape the passes can see
        edit.remove_unused_constant_nodes(sub)
    for found in function_skips(graph, selected, ctx):  # named, never rewritten (passes/functions.py)
        skips.extend(longest_per_conv(found))
    return fusions, skips


def _report_keys(f: Fusion, nodes: list[gs.Node], before: list[str], keys: dict[int, str],
                 canonicalize: bool) -> Fusion:
    """``f`` (the rewrite of the matched ``nodes``, whose first outputs were ``before`` when matched) with each
    ``replaced`` entry keyed as the report's lineage knows that node (``keys``: node id -> key; updated here).

    The report sums a fused node's original nodes by these keys (``report.model._lineage``) and asks onnxruntime's
    graph of the input about them (``made_by_onnxruntime``). A fold or fusion's result is known by the output it
    writes (``Fusion.output``, which later rewrites of it name), so after one the matched nodes are keyed by
    their outputs then. A canonicalization is no row of its own: a node it moves to a new output
    (``layout_wrapper`` writes a fresh tensor) keeps the key it had, its output in the input, so that a fold of it
    afterwards counts its original traffic, not that of whichever node wrote the same name there or nothing.
    """
    rename = {cur: keys[id(n)] for n, cur in zip(nodes, before) if id(n) in keys and keys[id(n)] != cur}
    if rename:
        f = dataclasses.replace(f, replaced=tuple((name, op, rename.get(k, k)) for name, op, k in f.replaced))
    if not canonicalize:
        for n in nodes:
            if n.outputs:
                keys[id(n)] = n.outputs[0].name
    return f


def _run_stage(sub: gs.Graph, stage: tuple[Pass, ...], ctx: Context, order: edit.NodeOrder, fusions: list[Fusion],
               skips: list[Skip], keys: dict[int, str]) -> None:
    for _ in range(MAX_ROUNDS if stage else 0):
        changed, round_skips, left_out = False, [], []
        for p in stage:
            anchors = frozenset(p.anchors)
            for node in list(sub.nodes):
                if anchors and node.op not in anchors:
                    continue  # not a node this pass's patterns end on (its match would return None)
                if not node.outputs:
                    continue  # removed by an earlier rewrite of this round
                found = p.match(node, ctx)
                if isinstance(found, Match):
                    site = site_key(sub, p.name, found.nodes)
                    if site in ctx.excluded:  # the culprit search (or --tune) leaves this rewrite out
                        reason, detail = left_out_reason(ctx.excluded[site])
                        left_out.append(Skip(reason, detail, replaced(found.nodes), _output(found.nodes), p.name))
                        continue
                    before = [n.outputs[0].name if n.outputs else "" for n in found.nodes]
                    done = p.rewrite(found, ctx)
                    done = _report_keys(done, found.nodes, before, keys, p.kind is RewriteKind.CANONICALIZE)
                    fusions.append(dataclasses.replace(done, site=site))
                    changed = True
                elif isinstance(found, Skip):
                    round_skips.append(_with_pass(found, p.name))
            order.compact()
        if not changed:
            skips.extend(longest_per_conv(round_skips))
            skips.extend(left_out)
            break


def left_out_reason(value: str | tuple[Reason, str]) -> tuple[Reason, str]:
    """The reason and detail of the skip recorded for an excluded site (``Context.excluded``): a sentence alone is
    the culprit search's (``rewrite-broke-verification``); ``(reason, sentence)`` names its own reason (``--tune``'s
    ``slower-when-measured``, :mod:`onnxfuse.tune`)."""
    return (Reason.BROKE_VERIFICATION, value) if isinstance(value, str) else value


def site_key(graph: gs.Graph, pass_name: str, nodes: list[gs.Node]) -> tuple[str, ...]:
    """The key of a rewrite (``records.Fusion.site``): ``graph``'s name, the pass and the names of the matched
    ``nodes`` in order. Node names are unique in a graph (``onnxfuse.model.io.check_node_names``), and a fused
    node keeps its first node's name, so a site keeps its key when other sites are left out. An unnamed node
    (names are optional in ONNX; old exports leave them empty) is keyed by its first output instead, which is
    unique too (each tensor has one producer)."""
    return (graph.name or "", pass_name,
            *(n.name or f"output:{n.outputs[0].name if n.outputs else ''}" for n in nodes))


def _output(nodes: list[gs.Node]) -> str:
    last = nodes[-1]
    return last.outputs[0].name if last.outputs else ""


def longest_per_conv(skips: list[Skip]) -> list[Skip]:
    """One skip per Conv: the one of the pass that came nearest to fusing. A skip for a value that is not
    constant (:data:`VALUE_REASONS`: with conv weights fed as graph inputs, conv_affine's ``weights-not-constant``
    for a bias Add that conv_residual sees as a residual of the wrong shape) comes first; among the rest, the one
    covering the longest chain, and the earlier pass on a tie. An unfused written-out HardSwish is refused by
    conv_hardswish (Conv -> Add -> Clip -> Mul -> Div: "HardSwish not supported by target") and, as a side
    effect, by conv_affine for its Add(x, 3) ("2 consumers"); only the first says what the pattern is.

    ``skips`` in the order found (a Conv is keyed by the first output name of its first node); returns a sublist in
    that order."""
    best: dict[str, Skip] = {}

    def rank(s: Skip) -> tuple[bool, int]:
        return s.reason in VALUE_REASONS, len(s.nodes)

    for s in skips:
        key = s.nodes[0][2]
        if key not in best or rank(s) > rank(best[key]):
            best[key] = s
    return [s for s in skips if best[s.nodes[0][2]] is s]


def _with_pass(s: Skip, name: str) -> Skip:
    return Skip(s.reason, s.detail, s.nodes, s.output, name)
