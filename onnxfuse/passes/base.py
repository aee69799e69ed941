"""The pass contract: a read-only ``match`` that returns a :class:`Match`, a :class:`Skip` or None, and a
``rewrite`` that only does numpy math and edge surgery.

Every reason a pass declines a pattern it found is one of the :class:`Reason` codes below; reports and tests
name them. A pass anchors on the *last* node of its chain (its producer chain is unique, its consumers are not).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_graphsurgeon as gs

from onnxfuse import graph as g
from onnxfuse.providers import Target


class Reason:
    """Named reasons for declining a fusion (the ``reason`` of a :class:`Skip`)."""

    NOT_PRIVATE = "intermediate-has-other-consumers"
    GRAPH_OUTPUT = "intermediate-is-graph-output"
    WEIGHTS_NOT_CONSTANT = "weights-not-constant"
    PARAMS_NOT_CONSTANT = "parameters-not-constant"
    INITIALIZER_IS_INPUT = "initializer-is-graph-input"
    TRAINING_MODE = "batchnorm-training-mode"
    PARAM_SHAPE = "parameter-shape-mismatch"
    NOT_PER_CHANNEL = "constant-not-per-channel"
    CONV_IS_DIVISOR = "conv-output-is-divisor"
    ZERO_DIVISOR = "zero-in-divisor"
    ACTIVATION_UNSUPPORTED = "activation-not-supported-by-target"
    NO_CONTRIB_OPS = "target-allows-no-contrib-ops"
    DTYPE_NO_KERNEL = "dtype-has-no-fusedconv-kernel"
    DTYPE_NOT_FOLDABLE = "dtype-not-foldable"
    CLIP_BOUNDS_NOT_CONSTANT = "clip-bounds-not-constant"
    RESIDUAL_SHAPE = "residual-shape-mismatch"
    QDQ = "quantized-conv"
    FOLD_NOT_FINITE = "fold-not-finite"

    ALL = (
        NOT_PRIVATE, GRAPH_OUTPUT, WEIGHTS_NOT_CONSTANT, PARAMS_NOT_CONSTANT, INITIALIZER_IS_INPUT, TRAINING_MODE,
        PARAM_SHAPE, NOT_PER_CHANNEL, CONV_IS_DIVISOR, ZERO_DIVISOR, ACTIVATION_UNSUPPORTED, NO_CONTRIB_OPS,
        DTYPE_NO_KERNEL, DTYPE_NOT_FOLDABLE, CLIP_BOUNDS_NOT_CONSTANT, RESIDUAL_SHAPE, QDQ, FOLD_NOT_FINITE,
    )


@dataclass
class Match:
    """A pattern that a pass will rewrite.

    Attributes:
        nodes: the matched nodes in execution order; the first is the Conv, the last is the anchor.
        data: what ``match`` computed for ``rewrite`` (constant arrays, activation name and parameters).
    """

    nodes: list[gs.Node]
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Skip:
    """A pattern that was found but is not rewritten.

    Attributes:
        reason: one of the :class:`Reason` codes.
        detail: one human sentence, naming the target or dtype where that is the cause.
        nodes: ``(name, op_type, first output name)`` of the matched nodes, Conv first.
        output: name of the tensor a fused node would have written.
        pass_name: the pass that found the pattern (filled in by the pipeline).
    """

    reason: str
    detail: str
    nodes: tuple[tuple[str, str, str], ...]
    output: str
    pass_name: str = ""


@dataclass(frozen=True)
class Fusion:
    """One applied rewrite, as the report shows it.

    Attributes:
        pass_name: the pass that made it.
        node: name of the node that now computes the chain.
        op: that node's op type after the rewrite (``Conv``, ``ConvTranspose`` or ``FusedConv``).
        replaced: ``(name, op_type, first output name)`` of every original node, Conv first.
        activation: FusedConv ``activation`` (None for folds and plain FusedConv).
        output: name of the tensor the fused node writes.
    """

    pass_name: str
    node: str
    op: str
    replaced: tuple[tuple[str, str, str], ...]
    activation: str | None
    output: str


@dataclass
class Context:
    """What a pass may read while matching: the target, the constants policy and static tensor info.

    Attributes:
        target: the execution-provider target.
        overridable: initializer names that are graph inputs and therefore not constants.
        shapes: tensor name -> (shape tuple of int | str | None, numpy dtype | None), from onnx shape inference
            on the unfused model with its own (possibly symbolic) input shapes.
        graph: the (sub)graph being optimized.
        namer: fresh names for new initializers.
        members: ``id()`` of the nodes of ``graph`` (rewrites only remove nodes, so it stays valid).
        order: the node slots of ``graph`` that rewrites edit (see ``graph.NodeOrder``).
    """

    target: Target
    overridable: frozenset[str]
    shapes: dict[str, tuple[tuple | None, np.dtype | None]]
    graph: gs.Graph | None = None
    namer: g.Namer | None = None
    members: set[int] = field(default_factory=set)
    order: g.NodeOrder | None = None

    def constant(self, tensor: gs.Tensor) -> tuple[np.ndarray | None, str | None]:
        """``(value, None)`` for a constant tensor, else ``(None, reason)``.

        The reason is :attr:`Reason.INITIALIZER_IS_INPUT` for an initializer that is also a graph input,
        :attr:`Reason.PARAMS_NOT_CONSTANT` otherwise.
        """
        value = g.constant_value(tensor, self.overridable)
        if value is not None:
            return value, None
        if isinstance(tensor, gs.Constant) and tensor.name in self.overridable:
            return None, Reason.INITIALIZER_IS_INPUT
        return None, Reason.PARAMS_NOT_CONSTANT

    def dtype(self, tensor: gs.Tensor) -> np.dtype | None:
        """numpy dtype of ``tensor``, or None when no one knows it (bfloat16 and float8 are None too)."""
        if isinstance(tensor, gs.Constant):
            return g.tensor_dtype(tensor)
        info = self.shapes.get(tensor.name)
        if info is not None and info[1] is not None:
            return info[1]
        return g.tensor_dtype(tensor)

    def shape(self, tensor: gs.Tensor) -> tuple | None:
        """Static shape of ``tensor``: ints for known dims, strings for named symbolic dims, None for unknown ones.
        None when even the rank is unknown."""
        if isinstance(tensor, gs.Constant):
            return tuple(tensor.shape)
        info = self.shapes.get(tensor.name)
        if info is not None and info[0] is not None:
            return info[0]
        return tuple(tensor.shape) if tensor.shape is not None else None


class Pass:
    """Base class of a fusion pass. Subclasses set ``name`` and ``summary`` and implement both methods."""

    name: str = ""
    summary: str = ""

    def match(self, node: gs.Node, ctx: Context) -> Match | Skip | None:  # pragma: no cover - interface
        """Read-only: None when ``node`` does not end this pass's pattern, a Skip when it does but the rewrite
        would be unsafe or unsupported by the target, a Match otherwise."""
        raise NotImplementedError

    def rewrite(self, match: Match, ctx: Context) -> Fusion:  # pragma: no cover - interface
        """Apply ``match`` to ``ctx.graph`` (numpy math and edge surgery, no decisions) and describe it."""
        raise NotImplementedError


# ---------------------------------------------------------------------------------------------------------------
# Checks shared by the passes


CONV_OPS = ("Conv", "ConvTranspose")
ONNX_DOMAINS = ("", "ai.onnx", None)  # graphsurgeon reports the default domain as None


def is_op(node: gs.Node | None, *ops: str) -> bool:
    """True when ``node`` is one of the default-domain ``ops``."""
    return node is not None and node.op in ops and node.domain in ONNX_DOMAINS


def skip(reason: str, detail: str, nodes: list[gs.Node], output: gs.Tensor) -> Skip:
    """Build a :class:`Skip` for ``nodes`` (Conv first) whose fused node would write ``output``."""
    return Skip(reason, detail, replaced(nodes), output.name)


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
        if g.is_graph_output(t, ctx.graph):
            return skip(Reason.GRAPH_OUTPUT, f"{t.name} is a graph output", nodes, output)
        readers = g.consumers(t)
        if any(id(r) not in ids for r in readers):
            return skip(Reason.NOT_PRIVATE, f"{t.name} has {len(readers)} consumers", nodes, output)
    return None


def qdq_check(conv: gs.Node, output: gs.Tensor, nodes: list[gs.Node]) -> Skip | None:
    """Skip patterns that sit inside a QuantizeLinear/DequantizeLinear pair, which onnxruntime's QDQ fusions need
    to see as a plain Conv."""
    fed = any(is_op(g.producer(t), "DequantizeLinear") for t in conv.inputs if t.name)
    feeds = any(is_op(c, "QuantizeLinear") for c in g.consumers(output))
    if fed or feeds:
        return skip(Reason.QDQ, "the conv is part of a QuantizeLinear/DequantizeLinear pattern", nodes, output)
    return None


def out_channels(conv: gs.Node, weight_shape: tuple) -> int:
    """Number of output channels M of a Conv (W is [M, C/group, k...]) or ConvTranspose
    (W is [C, M/group, k...]; ONNX Operators.md, ConvTranspose)."""
    if conv.op == "ConvTranspose":
        return int(weight_shape[1]) * int(conv.attrs.get("group", 1))
    return int(weight_shape[0])


def scale_output_channels(conv: gs.Node, weight: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``weight`` with output channel m multiplied by ``scale[m]``, in float64.

    Conv: W[m, ...] *= s[m]. ConvTranspose: W is [C, M/group, k...] and output channel m = gi * (M/group) + j
    is W[gi * C/group : (gi + 1) * C/group, j, ...], so W is viewed as [group, C/group, M/group, k...].
    """
    w = weight.astype(np.float64)
    s = np.asarray(scale, dtype=np.float64)
    spatial = (1,) * (w.ndim - 2)
    if conv.op == "ConvTranspose":
        group = int(conv.attrs.get("group", 1))
        c_in, m_per_group = w.shape[0], w.shape[1]
        view = w.reshape((group, c_in // group, m_per_group, *w.shape[2:]))
        view = view * s.reshape((group, 1, m_per_group, *spatial))
        return view.reshape(w.shape)
    return w * s.reshape((-1, 1, *spatial))


def fold_inputs(conv: gs.Node, anchor: gs.Node, ctx: Context, nodes: list[gs.Node], output: gs.Tensor):
    """What every fold checks first: the conv output is read only by ``anchor`` and is no graph output, no QDQ,
    constant weights. Returns ``(W, B or None, None)`` or ``(None, None, Skip)`` (see :func:`conv_parts`)."""
    bad = private_check([conv.outputs[0]], [anchor], ctx, nodes, output) or qdq_check(conv, output, nodes)
    if bad:
        return None, None, bad
    return conv_parts(conv, ctx, nodes, output)


def conv_parts(conv: gs.Node, ctx: Context, nodes: list[gs.Node], output: gs.Tensor):
    """``(W, B or None, None)`` as constant arrays for a fold, or ``(None, None, Skip)``.

    B is None when the conv has no bias. Folds need float16/float32/float64 weights.
    """
    w, why = ctx.constant(conv.inputs[1])
    if w is None:
        detail = (f"weight {conv.inputs[1].name} is an initializer listed as a graph input (overridable); pass "
                  "--constant-initializer-inputs if it never changes" if why == Reason.INITIALIZER_IS_INPUT
                  else f"weight {conv.inputs[1].name} is not a constant")
        return None, None, skip(why if why == Reason.INITIALIZER_IS_INPUT else Reason.WEIGHTS_NOT_CONSTANT,
                                detail, nodes, output)
    if w.dtype not in FOLDABLE_DTYPES:
        return None, None, skip(Reason.DTYPE_NOT_FOLDABLE, f"{w.dtype} weights cannot be folded", nodes, output)
    b = None
    if len(conv.inputs) > 2 and conv.inputs[2].name:
        b, why = ctx.constant(conv.inputs[2])
        if b is None:
            return None, None, skip(why if why == Reason.INITIALIZER_IS_INPUT else Reason.WEIGHTS_NOT_CONSTANT,
                                    f"bias {conv.inputs[2].name} is not a constant", nodes, output)
    return w, b, None


def fold_fits(dtype: np.dtype, weight: np.ndarray | None, bias: np.ndarray | None, nodes: list[gs.Node],
              output: gs.Tensor) -> Skip | None:
    """Skip a fold whose float64 results hold inf/NaN or exceed the largest finite value of ``dtype`` (they
    would round to inf when stored: a BN with var + epsilon = 0, a Mul by inf, a Div by 1e-39)."""
    limit = float(np.finfo(dtype).max)
    for name, values in (("weights", weight), ("bias", bias)):
        if values is not None and values.size and not (np.isfinite(values).all()
                                                       and float(np.abs(values).max()) <= limit):
            return skip(Reason.FOLD_NOT_FINITE, f"the folded {name} would not be finite in {dtype}", nodes, output)
    return None


FOLDABLE_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def set_weights(conv: gs.Node, ctx: Context, weight: np.ndarray | None, bias: np.ndarray | None,
                dtype: np.dtype) -> None:
    """Give ``conv`` new, freshly named weight and bias initializers of ``dtype``; None leaves that input as is.

    Never edits a tensor in place, so a weight shared with another node stays as it was.
    """
    base = conv.name or conv.outputs[0].name
    if weight is not None:
        conv.inputs[1] = g.new_constant(ctx.namer, f"{base}.weight_folded", weight.astype(dtype))
    if bias is None:
        return
    b = g.new_constant(ctx.namer, f"{base}.bias_folded", np.asarray(bias).astype(dtype).reshape(-1))
    if len(conv.inputs) > 2:
        conv.inputs[2] = b
    else:
        conv.inputs.append(b)


def replaced(nodes: list[gs.Node]) -> tuple[tuple[str, str, str], ...]:
    """``(name, op_type, first output name)`` of ``nodes``; take it before the rewrite changes them."""
    return tuple((n.name, n.op, n.outputs[0].name if n.outputs else "") for n in nodes)


def describe(pass_name: str, conv: gs.Node, original: tuple[tuple[str, str, str], ...],
             activation: str | None = None) -> Fusion:
    """The :class:`Fusion` record for a rewrite whose result is ``conv`` (call after the rewrite)."""
    return Fusion(pass_name, conv.name, conv.op, original, activation, conv.outputs[0].name)
