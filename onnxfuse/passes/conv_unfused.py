"""List every Conv chain that no fusion pass takes and that no other pass explains (this pass never rewrites).

A Conv or ConvTranspose whose output feeds an activation or an elementwise op that stays a separate node costs a
round trip of the conv output through memory; the report must say why. The fusion passes name their own refusals
(a BatchNormalization, a supported activation, Add/Sub/Mul/Div by a constant, a residual Add); this pass names
the rest, one Skip per conv (the pipeline keeps the longest chain per conv, and the earlier pass on a tie).

Before => after: nothing; the chain stays as it is and the report lists it.

Skipped (listed) when:
    op-has-no-fusedconv-form   the conv feeds an op FusedConv cannot express: PRelu, Elu, Selu, Celu, Softplus,
                               Gelu, Mish..., an elementwise op with a run-time operand other than a residual
                               Add (Mul, Sub, Div, Max...), or any activation after a ConvTranspose (FusedConv is
                               a Conv; onnxruntime contrib_defs.cc)
    constant-not-folded        Add/Sub/Mul/Div by a value computed from constants only that was not folded
                               (constant_fold skipped or refused it)
    chain-broken-by-op         the conv feeds up to MAX_BETWEEN nodes no pass removes (Transpose, Cast to
                               another dtype, Reshape...) and then an activation or elementwise op
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_graphsurgeon as gs

from onnxfuse import graph as g
from onnxfuse.passes._checks import CONV_OPS, computed_from_constants, is_op, skip
from onnxfuse.passes.base import Context, Fusion, Match, Pass, Reason, Skip
from onnxfuse.passes.conv_activation import ACTIVATIONS

#: Activations FusedConv has no ``activation`` value for (onnxruntime contrib_ops/cpu/fused_activation.cc).
OTHER_ACTIVATIONS = ("PRelu", "Elu", "Selu", "Celu", "Softplus", "Softsign", "ThresholdedRelu", "Gelu", "Mish",
                     "Erf", "Exp", "Log", "Abs", "Neg", "Sqrt", "Reciprocal", "Softmax", "LogSoftmax")
ARITHMETIC = ("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean")
ELEMENTWISE = ACTIVATIONS + OTHER_ACTIVATIONS + ARITHMETIC + ("BatchNormalization",)
#: Ops that only move, retype or reshape the conv output: a chain through one of them is a broken chain.
IN_BETWEEN = ("Transpose", "Cast", "CastLike", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout",
              "Slice", "Pad", "Expand")
#: How many such ops in a row are followed before giving up.
MAX_BETWEEN = 4


def _handled_elsewhere(conv: gs.Node, reader: gs.Node, ctx: Context) -> bool:
    """True when a fusion pass matches ``conv -> reader`` and names its own refusal."""
    if is_op(reader, "BatchNormalization"):
        return True
    if conv.op == "Conv" and is_op(reader, *ACTIVATIONS):
        return True
    if is_op(reader, "Add", "Sub", "Mul", "Div") and len(reader.inputs) == 2:
        other = [t for t in reader.inputs if t is not conv.outputs[0]]
        if not other:
            return False
        value, why = ctx.constant(other[0])
        if value is not None or why == Reason.INITIALIZER_IS_INPUT:
            return True  # conv_affine
        return conv.op == "Conv" and reader.op == "Add"  # conv_residual (constant-not-folded included)
    return False


@dataclass
class ChainMatch(Match):
    """Never produced: this pass only lists chains (the contract types every pass's Match)."""


class ConvUnfused(Pass[ChainMatch]):
    """Conv -> an op no pass fuses => a Skip that names why (no rewrite)."""

    name = "conv_unfused"
    summary = "list Conv chains that stay unfused and no other pass explains (never rewrites)"
    reasons = (Reason.NO_FUSEDCONV_FORM, Reason.CONSTANT_NOT_FOLDED, Reason.CHAIN_BROKEN)
    anchors = CONV_OPS

    def match(self, node: gs.Node, ctx: Context) -> Match | Skip | None:
        if not is_op(node, *self.anchors) or not node.outputs:
            return None
        y = node.outputs[0]
        for reader in g.consumers(y):
            if reader.domain not in (None, "", "ai.onnx") or _handled_elsewhere(node, reader, ctx):
                continue
            if reader.op in ELEMENTWISE:
                return self._elementwise(node, reader, ctx, [node, reader])
            between, last = [reader], reader
            while is_op(last, *IN_BETWEEN) and last.outputs and len(between) <= MAX_BETWEEN:
                after = g.consumers(last.outputs[0])
                end = next((n for n in after if is_op(n, *ELEMENTWISE)), None)
                if end is not None:
                    ops = " -> ".join(n.op for n in between)
                    return skip(Reason.CHAIN_BROKEN, f"{ops} sits between the {node.op} and {end.op}; no pass "
                                "removes it", [node, *between, end], end.outputs[0])
                if len(after) != 1:
                    break
                last = after[0]
                between.append(last)
        return None

    @staticmethod
    def _elementwise(conv: gs.Node, reader: gs.Node, ctx: Context, nodes: list[gs.Node]) -> Skip:
        out = reader.outputs[0]
        others = [t for t in reader.inputs if t.name and t is not conv.outputs[0]]
        if reader.op in ARITHMETIC and any(computed_from_constants(t, ctx) for t in others):
            return skip(Reason.CONSTANT_NOT_FOLDED, f"the other operand of {reader.op} is computed from constants "
                        "only but was not folded (constant_fold skipped or refused it)", nodes, out)
        if conv.op == "ConvTranspose":
            return skip(Reason.NO_FUSEDCONV_FORM, f"ConvTranspose -> {reader.op}: FusedConv is a Conv only",
                        nodes, out)
        what = f"{reader.op} with a run-time operand" if reader.op in ARITHMETIC else reader.op
        return skip(Reason.NO_FUSEDCONV_FORM, f"FusedConv has no form for {what}", nodes, out)

    def rewrite(self, match: ChainMatch, ctx: Context) -> Fusion:  # pragma: no cover - match never returns a Match
        raise NotImplementedError("conv_unfused only lists chains")
