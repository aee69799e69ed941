"""Run a float16 model's body in float32 on target ``cpu``, keeping its float16 graph inputs and outputs.

Before => after::

    x (float16) -> [float16 nodes, float16 weights] -> y (float16)
        =>  x (float16) -> Cast(to=float) -> [the same nodes in float32, weights as float32] -> Cast(to=float16) -> y

Why: onnxruntime's CPU execution provider has no float16 kernel for Conv, ConvTranspose, Gemm or MatMul on most
processors (asked, not assumed: :func:`onnxfuse.ort.float16.has_float16_kernel`); it then wraps every such node in
a Cast pair to float32 at session load (``core/optimizer/insert_cast_transformer.cc``). Those Casts sit between
each Conv and its activation, so neither onnxfuse's FusedConv passes (float32 kernels only) nor onnxruntime's own
fusions and NCHWc layout see the chains. With the body in float32 the folds and fusions apply as to any float32
model.

Precision: every value is computed in float32 instead of being rounded to float16 after each node, so the output
differs from the original by float16 rounding (it is closer to the exact result); weights are converted exactly
(every float16 is a float32). Verification compares with tolerances measured on the original itself (its noise
floor across onnxruntime levels, ``onnxfuse.verification``). The report says the body runs in float32.

Skipped when:
    target-not-cpu                    the target is not ``cpu`` (CUDA has float16 Conv kernels; ``onnx`` emits for
                                      runtimes whose float16 kernels onnxfuse does not know)
    float16-kernel-exists             onnxruntime's CPU provider here has a float16 kernel for a Conv, ConvTranspose,
                                      Gemm or MatMul of the model: its float16 path is kept
    float16-op-not-handled            an op whose float16 meaning onnxfuse cannot carry into float32 (an op with a
                                      dtype attribute such as EyeLike or a random op, a contrib op, ...)
    float16-graph-has-subgraphs       an If/Loop/Scan body (the bodies' tensors would need the same conversion)
    float16-output-not-computed       a float16 graph output is a graph input or a constant (no node computes it)
    slower-than-unfused-at-ort-level  the form is measured slower at the --ort-level (``providers.CPU_SLOWER_AT``,
                                      ``REWRITE_FORMS``; none is today)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from onnxfuse.ir import edit
from onnxfuse.model.domains import is_default_domain
from onnxfuse.ort.float16 import PROBED_OPS, has_float16_kernel
from onnxfuse.ort.providers import REWRITE_FORMS
from onnxfuse.passes._checks import replaced, skip, speed_rule
from onnxfuse.passes.base import Context, Match, Pass
from onnxfuse.records import Fusion, Reason, RewriteKind, Skip

F16, F32 = np.dtype(np.float16), np.dtype(np.float32)

#: Default-domain ops whose float16 node computes the float32 node's function rounded to float16: no attribute
#: or input names a float16 type (ONNX Operators.md); Constant and ConstantOfShape get their float16 value as float32,
#: and a Cast to float16 inside the graph becomes a Cast to float32 (the float16 rounding it did is dropped, as the
#: rounding after every other node of the body is; exporters such as onnxconverter-common's float16 conversion write
#: such Casts around the ops they keep in float32).
FLOAT_OPS = frozenset({
    "Abs", "Add", "And", "ArgMax", "ArgMin", "AveragePool", "BatchNormalization", "Ceil", "Celu", "Clip", "Concat",
    "Conv", "ConvTranspose", "Cos", "DepthToSpace", "Div", "Dropout", "Einsum", "Elu", "Equal", "Erf", "Exp",
    "Expand", "Flatten", "Floor", "Gather", "GatherElements", "GatherND", "Gelu", "Gemm", "GlobalAveragePool",
    "GlobalMaxPool", "Greater", "GreaterOrEqual", "GroupNormalization", "HardSigmoid", "HardSwish", "Identity",
    "InstanceNormalization", "LayerNormalization", "LeakyRelu", "Less", "LessOrEqual", "Log", "LogSoftmax", "LRN",
    "MatMul", "Max", "MaxPool", "Mean", "Min", "Mish", "Mod", "Mul", "Neg", "Not", "Or", "Pad", "Pow", "PRelu",
    "Reciprocal", "ReduceL1", "ReduceL2", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin", "ReduceProd",
    "ReduceSum", "ReduceSumSquare", "Relu", "Reshape", "Resize", "Round", "Selu", "Shape", "Sigmoid", "Sign", "Sin",
    "Size", "Slice", "Softmax", "Softplus", "Softsign", "SpaceToDepth", "Split", "Sqrt", "Squeeze", "Sub", "Sum",
    "Tanh", "ThresholdedRelu", "Tile", "TopK", "Transpose", "Trilu", "Unsqueeze", "Upsample", "Where", "Xor",
    "Constant", "ConstantOfShape", "Cast",
})


@dataclass
class Float16Match(Match):
    """``nodes`` = every node of the graph (the rewrite touches the whole body)."""


def _swap(tensors: list, old: gs.Tensor, new: gs.Tensor) -> None:
    """Replace ``old`` by ``new`` in a node's input or output list, one index at a time (graphsurgeon's
    synchronized lists keep the tensors' readers and producers in step that way)."""
    for i, t in enumerate(list(tensors)):
        if t is old:
            tensors[i] = new


def _is_f16(t: gs.Tensor, ctx: Context) -> bool:
    return ctx.dtype(t) == F16


class Float16Body(Pass[Float16Match]):
    """float16 graph => float32 body between Casts at the float16 graph inputs and outputs (target cpu)."""

    name = "float16_body"
    kind = RewriteKind.CANONICALIZE
    summary = "run a float16 model's body in float32 between Casts at its inputs and outputs (target cpu), so it fuses"
    reasons = (Reason.F16_TARGET, Reason.F16_KERNEL, Reason.F16_OP, Reason.F16_SUBGRAPH, Reason.F16_OUTPUT,
               Reason.SLOWER_AT_ORT_LEVEL)
    anchors = ()  # a whole-graph rewrite: matched once, on the graph's first node

    def match(self, node: gs.Node, ctx: Context) -> Float16Match | Skip | None:
        graph = ctx.graph
        if graph is None:
            return None
        if id(graph) != id(ctx.main_graph) or not graph.nodes or node is not graph.nodes[0]:
            return None  # the main graph only: a subgraph's float16 tensors follow its graph's (refused below)
        ends = {id(t) for t in (*graph.inputs, *graph.outputs)}
        tensors = graph.tensors().values()
        if not any(_is_f16(t, ctx) for t in tensors if id(t) not in ends):
            return None  # no float16 body (or converted already)
        nodes, out = list(graph.nodes), graph.outputs[0] if graph.outputs else node.outputs[0]
        first = [node]
        if ctx.target.name != "cpu":
            return skip(Reason.F16_TARGET, f"target {ctx.target.name}: the float16 body is kept", first, out)
        for n in nodes:
            if any(isinstance(v, gs.Graph) for v in n.attrs.values()) or any(
                    isinstance(v, list) and any(isinstance(g, gs.Graph) for g in v) for v in n.attrs.values()):
                return skip(Reason.F16_SUBGRAPH, f"{n.name} ({n.op}) holds a subgraph", first, out)
            if not is_default_domain(n.domain) or n.op not in FLOAT_OPS:
                return skip(Reason.F16_OP, f"{n.name} is a {n.domain + '::' if n.domain else ''}{n.op}", first, out)
        for op in sorted({n.op for n in nodes if n.op in PROBED_OPS}):
            if any(_is_f16(n.inputs[0], ctx) for n in nodes if n.op == op) and has_float16_kernel(op):
                return skip(Reason.F16_KERNEL, f"onnxruntime's CPU provider here has a float16 {op} kernel", first,
                            out)
        inputs = {id(t) for t in graph.inputs}
        for t in graph.outputs:
            if _is_f16(t, ctx) and (id(t) in inputs or isinstance(t, gs.Constant) or not t.inputs):
                return skip(Reason.F16_OUTPUT, f"graph output {t.name} is no node's output", first, out)
        return speed_rule(Float16Match(nodes), ctx, REWRITE_FORMS[self.name])

    def rewrite(self, match: Float16Match, ctx: Context) -> Fusion:
        graph = ctx.graph
        assert graph is not None  # set by the driver
        original = replaced(match.nodes[:1])
        ends = {id(t) for t in (*graph.inputs, *graph.outputs)}
        for t in graph.tensors().values():
            if id(t) in ends or not _is_f16(t, ctx):
                continue
            if isinstance(t, gs.Constant):
                t.values = np.asarray(t.values, dtype=np.float32)
            else:
                t.dtype = np.float32
            self._retype(ctx, t.name)
        for n in match.nodes:
            for value in n.attrs.values():  # Constant's and ConstantOfShape's value
                if isinstance(value, gs.Constant) and np.dtype(value.dtype) == F16:
                    value.values = np.asarray(value.values, dtype=np.float32)
            if n.op == "Cast" and int(n.attrs.get("to", 0)) == onnx.TensorProto.FLOAT16:
                n.attrs["to"] = onnx.TensorProto.FLOAT  # one float16 rounding fewer, like every node of the body
        first: list[gs.Node] = []
        for x in [t for t in graph.inputs if _is_f16(t, ctx)]:
            body = gs.Variable(ctx.namer.fresh(f"{x.name}_float"), dtype=np.float32, shape=x.shape)
            for reader in edit.consumers(x):
                _swap(reader.inputs, x, body)
            first.append(gs.Node("Cast", ctx.namer.fresh(f"{x.name}_to_float"), {"to": onnx.TensorProto.FLOAT},
                                 inputs=[x], outputs=[body]))
            self._retype(ctx, body.name, x.name)
        last: list[gs.Node] = []
        for y in [t for t in graph.outputs if _is_f16(t, ctx)]:
            body = gs.Variable(ctx.namer.fresh(f"{y.name}_float"), dtype=np.float32, shape=y.shape)
            producer = y.inputs[0]
            _swap(producer.outputs, y, body)
            for reader in edit.consumers(y):
                _swap(reader.inputs, y, body)
            last.append(gs.Node("Cast", ctx.namer.fresh(f"{y.name}_to_float16"), {"to": onnx.TensorProto.FLOAT16},
                                inputs=[body], outputs=[y]))
            self._retype(ctx, body.name, y.name)
        # a Cast from float16 to float32 in the body now reads float32: remove_redundant drops it
        edit.add_around(ctx.edit_order, first, last)
        head = match.nodes[0]  # stays, so the report counts no removed node
        return Fusion(self.name, head.name, head.op, original, None, head.outputs[0].name, self.kind)

    @staticmethod
    def _retype(ctx: Context, name: str, like: str | None = None) -> None:
        """``ctx.shapes[name]`` says float32 (with the shape of ``like`` for a new tensor)."""
        shape = ctx.shapes.get(like or name, (None, None))[0]
        ctx.shapes[name] = (shape, F32)
