"""Replace an If whose condition is a constant by the nodes of the branch it always takes.

Before => after::

    If(cond = constant true, then_branch = T, else_branch = E) -> y   =>  T's nodes; Identity(T's output) -> y
    If(cond = constant false, ...)                                     =>  E's nodes; Identity(E's output) -> y

ONNX Operators.md, If: the outputs are those of ``then_branch`` when ``cond`` (a one-element bool tensor) is true,
of ``else_branch`` otherwise; a branch reads outer-scope tensors by name. With ``cond`` known the If always runs
the same branch, so its nodes can run in the enclosing graph (tensor names are distinct across scopes:
``ir.convert.rewrite_blocker`` refuses a model that shadows one), and each If output is an Identity of the branch
output, which remove_redundant then removes where the output name can move. The branch's own nodes are then seen by
every other pass as nodes of the enclosing graph (the folds a constant-condition If hid). onnxscript's constant
folder makes the same rewrite.

Skipped when:
    initializer-is-graph-input   cond is an initializer listed as a graph input (IR >= 4): the caller may set it
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from onnxfuse.passes._checks import is_op, replaced, skip
from onnxfuse.passes.base import Context, Match, Pass
from onnxfuse.records import Fusion, Reason, RewriteKind, Skip


@dataclass
class IfConstantMatch(Match):
    """The If (``nodes[0]``) and the branch it always takes."""

    branch: gs.Graph


class IfConstant(Pass[IfConstantMatch]):
    """If(constant cond) => the nodes of the branch it takes."""

    name = "if_constant"
    kind = RewriteKind.CANONICALIZE
    summary = "replace an If whose condition is a constant by the branch it takes"
    reasons = (Reason.INITIALIZER_IS_INPUT,)
    anchors = ("If",)

    def match(self, node: gs.Node, ctx: Context) -> IfConstantMatch | Skip | None:
        if not is_op(node, *self.anchors) or len(node.inputs) != 1 or not node.outputs:
            return None
        value, why = ctx.constant(node.inputs[0])
        if value is None:
            if why == Reason.INITIALIZER_IS_INPUT:
                return skip(why, f"the If's condition {node.inputs[0].name} is an initializer listed as a graph input "
                            "(overridable); pass --constant-initializer-inputs if it never changes", [node],
                            node.outputs[0])
            return None
        flat = np.asarray(value).reshape(-1)
        branch = node.attrs.get("then_branch" if flat.size == 1 and bool(flat[0]) else "else_branch")
        if flat.size != 1 or not isinstance(branch, gs.Graph) or len(branch.outputs) != len(node.outputs):
            return None
        if branch.inputs:  # an If branch has no inputs (Operators.md, If); anything else is no If we know
            return None
        return IfConstantMatch([node], branch=branch)

    def rewrite(self, match: IfConstantMatch, ctx: Context) -> Fusion:
        (node,) = match.nodes
        original = replaced(match.nodes)
        order = ctx.edit_order
        slot = order.slot(node)
        taken = {n.name for n in order.graph.nodes if n.name}
        moved = list(match.branch.nodes)
        for n in moved:
            if n.name in taken:
                n.name = ctx.namer.fresh(n.name)
            order.insert_before(n, slot)
            ctx.members.add(id(n))
        sources, outs = list(match.branch.outputs), list(node.outputs)
        node.inputs.clear()
        node.outputs.clear()
        order.delete([node])
        for key in ("then_branch", "else_branch"):  # both leave the model: the driver must find nothing left in them
            branch = node.attrs.get(key)
            if isinstance(branch, gs.Graph) and branch is not match.branch:
                for n in branch.nodes:
                    n.inputs.clear()
                    n.outputs.clear()
            if isinstance(branch, gs.Graph):
                branch.nodes, branch.outputs = [], []
        for source, out in zip(sources, outs, strict=True):
            copy = gs.Node("Identity", name=ctx.namer.fresh(f"{node.name or out.name}.{out.name}"), inputs=[source],
                           outputs=[out])
            order.insert_before(copy, slot)
            ctx.members.add(id(copy))
        return Fusion(self.name, "", "", original, None, original[0][2], self.kind)
