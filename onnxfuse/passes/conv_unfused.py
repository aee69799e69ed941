"""List every Conv chain that no fusion pass takes and that no other pass explains (this pass never rewrites).

A Conv or ConvTranspose whose output feeds an activation or an elementwise op that stays a separate node costs a
round trip of the conv output through memory; the report must say why. The fusion passes name their own refusals
(a BatchNormalization, a supported activation, Add/Sub/Mul/Div by a constant, a residual Add); this pass names
the rest, one Skip per conv (the pipeline keeps the skip of the pass nearest to fusing per conv, see
``driver.longest_per_conv``). It also lists every Conv, ConvTranspose, Gemm and MatMul inside a
QuantizeLinear/DequantizeLinear pattern (a QDQ model), which onnxruntime turns into quantized kernels at load.

A written-out activation that reads the conv output more than once is one pattern (:func:`unary_chain`): every
node from the conv output on is elementwise with constants as its other operands, and only the last one's output
leaves the group. GELU (Erf form ``x * 0.5 * (1 + Erf(x / sqrt 2))`` and tanh approximation) and SiLU
(``x * Sigmoid(x)``) are named, with what onnxruntime makes of them at level extended
(:func:`onnxruntime_makes`).

Before => after: nothing; the chain stays as it is and the report lists it.

Skipped (listed) when:
    op-has-no-fusedconv-form   the conv feeds an op FusedConv cannot express: PRelu, Elu, Selu, Celu, Softplus,
                               Gelu, Mish..., a written-out GELU or SiLU (one pattern, whichever node is
                               refused first), an elementwise op with a run-time operand other than a residual
                               Add (Mul, Sub, Div, Max...), or any activation after a ConvTranspose (FusedConv is
                               a Conv; onnxruntime contrib_defs.cc)
    quantized-conv             a Conv or ConvTranspose reads a DequantizeLinear output or feeds a QuantizeLinear:
                               onnxruntime's QDQ transformers (core/optimizer/qdq_transformer) make QLinearConv
                               of the group at level extended (seen in the graph onnxruntime 1.32 saves);
                               onnxfuse leaves it to them
    quantized-gemm             a Gemm or MatMul reads a DequantizeLinear output or feeds a QuantizeLinear: the
                               same transformers make com.microsoft QGemm or QLinearMatMul of the group
    constant-not-folded        Add/Sub/Mul/Div by a value computed from constants only that was not folded
                               (constant_fold skipped or refused it)
    chain-broken-by-op         the conv feeds up to MAX_BETWEEN nodes no pass removes (Transpose, Cast to
                               another dtype, Reshape...) and then an activation or elementwise op
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from onnxfuse.ir import edit
from onnxfuse.model.domains import is_default_domain
from onnxfuse.passes._checks import CONV_OPS, computed_from_constants, is_op, skip
from onnxfuse.passes.base import Context, Match, Pass
from onnxfuse.passes.conv_activation import ACTIVATIONS
from onnxfuse.records import Fusion, Reason, RewriteKind, Skip

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

#: Elementwise ops a written-out activation is made of (:func:`unary_chain`).
CHAIN_OPS = ("Add", "Sub", "Mul", "Div", "Pow", "Erf", "Tanh", "Sigmoid", "Sqrt", "Exp", "Neg", "Reciprocal")
#: The most nodes :func:`unary_chain` collects (the tanh GELU is 8 nodes).
MAX_CHAIN = 12
#: Names of the written-out activations :func:`chain_kind` tells apart.
CHAIN_NAMES = {"erf": "GELU (Erf form)", "tanh": "GELU (tanh approximation)", "silu": "SiLU (x * Sigmoid(x))"}
#: The kernel onnxruntime's QDQ transformers make of DequantizeLinear -> op -> QuantizeLinear at level extended.
QDQ_KERNELS = {"Conv": "QLinearConv", "Gemm": "com.microsoft::QGemm", "MatMul": "QLinearMatMul"}
#: The ops whose Q/DQ patterns are ``quantized-gemm`` (a Conv's or ConvTranspose's are ``quantized-conv``).
GEMM_OPS = ("Gemm", "MatMul")


def unary_chain(conv: gs.Node, ctx: Context) -> list[gs.Node] | None:
    """The nodes, in execution order, of the smallest written-out unary function of ``conv``'s output y: a group
    that holds every reader of y, whose nodes are default-domain :data:`CHAIN_OPS` ops with y, constants or
    outputs of the group as inputs, and where only the last node's output is read outside the group (or is a
    graph output). None when there is no such group of at most :data:`MAX_CHAIN` nodes (y read by another op, a
    run-time operand from outside). Read-only."""
    y = conv.outputs[0]
    readers = edit.consumers(y)
    if edit.is_graph_output(y, ctx.graph) or not all(is_op(r, *CHAIN_OPS) for r in readers):
        return None
    inside: dict[int, gs.Node] = {}
    produced = {id(y)}
    pending = list(readers)
    while pending:
        node = next((n for n in pending if len(n.outputs) == 1 and is_op(n, *CHAIN_OPS) and all(
            not t.name or id(t) in produced or ctx.constant(t)[0] is not None for t in n.inputs)), None)
        if node is None or len(inside) >= MAX_CHAIN:
            return None  # what is left reads a run-time tensor from outside, or is no elementwise op
        pending = [n for n in pending if n is not node]
        inside[id(node)] = node
        produced.add(id(node.outputs[0]))
        if not pending and all(id(r) in inside for r in readers):
            nodes = list(inside.values())
            if all(all(id(r) in inside for r in edit.consumers(n.outputs[0]))
                   and not edit.is_graph_output(n.outputs[0], ctx.graph) for n in nodes[:-1]):
                return nodes
        pending.extend(r for r in edit.consumers(node.outputs[0]) if id(r) not in inside and r not in pending)
    return None


def onnxruntime_makes(kind: str, chain: list[gs.Node], y: gs.Tensor, ctx: Context) -> str:
    """What onnxruntime (1.32, CPU execution provider) makes of a :func:`chain_kind` chain at load, as a clause.

    Sources: the graph transformers of level extended (core/optimizer/graph_transformer_utils.cc) and the graph
    onnxruntime saves (tests/passes/test_conv_unfused.py checks each statement). GeluFusion
    (core/optimizer/gelu_fusion.cc) matches the Erf form only as Div(x, sqrt 2) -> Erf -> Add 1 -> Mul; a
    Mul(x, 1/sqrt 2) stays as it is. QuickGeluFusion (core/optimizer/quick_gelu_fusion.cc) matches x * Sigmoid(x)
    and x * Sigmoid(alpha * x). FastGeluFusion (core/optimizer/fast_gelu_fusion.cc) matched none of the tanh
    forms tried (with Pow, with x * x) after a Conv.
    """
    if kind == "silu":
        return ("onnxruntime makes one com.microsoft::QuickGelu kernel of it at level extended and above "
                "(core/optimizer/quick_gelu_fusion.cc), after the Conv")
    if kind == "erf":
        divided = any(n.op == "Div" and n.inputs[0] is y and _near(ctx, n.inputs[1], np.sqrt(2.0)) for n in chain)
        if divided:
            return ("onnxruntime makes one com.microsoft::Gelu kernel of it at level extended and above "
                    "(core/optimizer/gelu_fusion.cc), after the Conv")
        return ("onnxruntime's GeluFusion (core/optimizer/gelu_fusion.cc) matches only the Div(x, sqrt 2) form, so "
                "it stays as it is there too")
    return ("onnxruntime's FastGeluFusion (core/optimizer/fast_gelu_fusion.cc) matches only exact node forms and "
            "made no FastGelu of the written-out forms tried after a Conv, so expect it to stay there too")


def _with_half(chain: list[gs.Node], ctx: Context) -> list[gs.Node]:
    """A GELU chain with its trailing ``Mul(., 0.5)`` when that sits after the group (``(x * (1 + Erf(..))) *
    0.5``: :func:`unary_chain` closes the group before it) and no Mul by 0.5 is inside it already."""
    def half(n: gs.Node) -> bool:
        return n.op == "Mul" and any(_near(ctx, t, 0.5) for t in n.inputs)

    last = chain[-1].outputs[0]
    readers = edit.consumers(last)
    if any(half(n) for n in chain) or len(readers) != 1 or edit.is_graph_output(last, ctx.graph):
        return chain
    return [*chain, readers[0]] if is_op(readers[0], "Mul") and half(readers[0]) else chain


def _near(ctx: Context, t: gs.Tensor, value: float) -> bool:
    """True when ``t`` is a constant of one element within float32 rounding of ``value``."""
    v = ctx.constant(t)[0]
    return v is not None and v.size == 1 and abs(float(v.reshape(-1)[0]) - value) <= 1e-6 * abs(value)


def chain_kind(nodes: list[gs.Node]) -> str | None:
    """``erf``, ``tanh`` or ``silu`` for a :func:`unary_chain` that computes a GELU or SiLU (by its ops: an Erf;
    a Tanh with a cube; one Sigmoid times one Mul, optionally a Mul by alpha before it), else None."""
    ops = [n.op for n in nodes]
    if "Erf" in ops and "Mul" in ops:
        return "erf"
    if "Tanh" in ops and ("Pow" in ops or ops.count("Mul") >= 4):
        return "tanh"
    if sorted(ops) in (["Mul", "Sigmoid"], ["Mul", "Mul", "Sigmoid"]) and ops[-1] == "Mul":
        return "silu"
    return None


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
    kind = RewriteKind.FUSE
    summary = "list Conv chains that stay unfused and no other pass explains (never rewrites)"
    reasons = (Reason.NO_FUSEDCONV_FORM, Reason.CONSTANT_NOT_FOLDED, Reason.CHAIN_BROKEN, Reason.QDQ,
               Reason.QDQ_GEMM)
    anchors = (*CONV_OPS, *GEMM_OPS)

    def match(self, node: gs.Node, ctx: Context) -> ChainMatch | Skip | None:
        if not is_op(node, *self.anchors) or not node.outputs:
            return None
        quantized = self._quantized(node)
        if quantized is not None or node.op not in CONV_OPS:
            return quantized
        y = node.outputs[0]
        chain = unary_chain(node, ctx) if node.op == "Conv" else None
        kind = chain_kind(chain) if chain and len(chain) > 1 else None
        if chain and kind is not None:
            if kind in ("erf", "tanh"):
                chain = _with_half(chain, ctx)
            return skip(Reason.NO_FUSEDCONV_FORM, f"FusedConv has no form for {CHAIN_NAMES[kind]}, written out as "
                        f"{len(chain)} nodes; {onnxruntime_makes(kind, chain, y, ctx)}", [node, *chain],
                        chain[-1].outputs[0])
        for reader in edit.consumers(y):
            if not is_default_domain(reader.domain) or _handled_elsewhere(node, reader, ctx):
                continue
            if reader.op in ELEMENTWISE:
                return self._elementwise(node, reader, ctx, [node, reader])
            between, last = [reader], reader
            while is_op(last, *IN_BETWEEN) and last.outputs and len(between) <= MAX_BETWEEN:
                after = edit.consumers(last.outputs[0])
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
    def _quantized(node: gs.Node) -> Skip | None:
        """A Skip for ``node`` (a Conv, ConvTranspose, Gemm or MatMul) when it reads a DequantizeLinear output or
        feeds a QuantizeLinear, with the QuantizeLinear after it in the chain: ``quantized-gemm`` for a Gemm or
        MatMul, ``quantized-conv`` for a Conv or ConvTranspose."""
        fed = any(is_op(edit.producer(t), "DequantizeLinear") for t in node.inputs if t.name)
        quant = [r for r in edit.consumers(node.outputs[0]) if is_op(r, "QuantizeLinear")]
        if not fed and not quant:
            return None
        nodes = [node, *quant[:1]]
        kernel = QDQ_KERNELS.get(node.op)
        if fed and quant and kernel:
            what = (f"onnxruntime turns DequantizeLinear -> {node.op} -> QuantizeLinear into one {kernel} kernel at "
                    "load, at level extended and above (core/optimizer/qdq_transformer)")
        else:
            what = "onnxruntime's QDQ transformers (core/optimizer/qdq_transformer) read its Q/DQ nodes as they are"
        reason = Reason.QDQ_GEMM if node.op in GEMM_OPS else Reason.QDQ
        return skip(reason, f"{node.op} is part of a QuantizeLinear/DequantizeLinear pattern; {what}", nodes,
                    nodes[-1].outputs[0])

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
