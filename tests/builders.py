"""Tiny ONNX graph builder for tests: every model a test needs is a few lines, with deterministic weights."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

NP_TO_ONNX = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16,
              np.dtype(np.float64): TensorProto.DOUBLE, np.dtype(np.int64): TensorProto.INT64,
              np.dtype(np.bool_): TensorProto.BOOL, np.dtype(np.uint8): TensorProto.UINT8}


class GraphBuilder:
    """Build a graph node by node.

    ``constants="initializer"`` stores weights as initializers; ``"node"`` as Constant nodes (PaddleOCR style).
    ``prefix`` starts every generated name (builders of subgraphs need names of their own).
    """

    def __init__(self, seed: int = 0, dtype=np.float32, constants: str = "initializer", prefix: str = ""):
        self.rng = np.random.default_rng(seed)
        self.dtype = np.dtype(dtype)
        self.constants = constants
        self.prefix = prefix
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self._n = 0

    def name(self, base: str) -> str:
        self._n += 1
        return f"{self.prefix}{base}{self._n}"

    def input(self, name: str, shape, dtype=None) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, NP_TO_ONNX[np.dtype(dtype or self.dtype)], shape))
        return name

    def const(self, array, name: str | None = None, as_node: bool | None = None) -> str:
        array = np.asarray(array)
        name = name or self.name("c")
        if as_node if as_node is not None else self.constants == "node":
            self.nodes.append(helper.make_node("Constant", [], [name], name=f"{name}_const",
                                               value=numpy_helper.from_array(array, name)))
        else:
            self.inits.append(numpy_helper.from_array(array, name))
        return name

    def rand(self, *shape, scale: float = 0.3, dtype=None) -> np.ndarray:
        return (self.rng.standard_normal(shape) * scale).astype(dtype or self.dtype)

    def op(self, op: str, inputs: list[str], outputs: int = 1, domain: str = "", name: str | None = None,
           **attrs) -> str | list[str]:
        name = name or self.name(op.lower())
        outs = [f"{name}_out{i}" if i else f"{name}_out" for i in range(outputs)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=name, domain=domain or None, **attrs))
        return outs[0] if outputs == 1 else outs

    def dequantized(self, x: str) -> str:
        """``x`` through QuantizeLinear -> DequantizeLinear (uint8, scale 0.05, zero point 128): a QDQ input."""
        scale, zero = self.const(np.float32(0.05)), self.const(np.uint8(128))
        return self.op("DequantizeLinear", [self.op("QuantizeLinear", [x, scale, zero]), scale, zero])

    def conv(self, x: str, c_in: int, c_out: int, k: int | tuple = 3, bias: bool = True, group: int = 1,
             rank: int = 2, name: str | None = None, weight: str | None = None, **attrs) -> str:
        ks = (k,) * rank if isinstance(k, int) else tuple(k)
        w = weight or self.const(self.rand(c_out, c_in // group, *ks))
        inputs = [x, w]
        if bias:
            inputs.append(self.const(self.rand(c_out, scale=0.1)))
        attrs.setdefault("pads", [k // 2 if isinstance(k, int) else 0] * (2 * rank))
        return self.op("Conv", inputs, name=name, group=group, **attrs)

    def conv_transpose(self, x: str, c_in: int, c_out: int, k: int = 2, group: int = 1, bias: bool = True,
                       rank: int = 2, **attrs) -> str:
        w = self.const(self.rand(c_in, c_out // group, *((k,) * rank)))
        inputs = [x, w] + ([self.const(self.rand(c_out, scale=0.1))] if bias else [])
        return self.op("ConvTranspose", inputs, group=group, strides=[k] * rank, **attrs)

    def gemm(self, x: str, k: int, n: int, trans_b: bool = False, bias: bool = True, c_shape: tuple | None = None,
             weight: str | None = None, **attrs) -> str:
        """Gemm of ``x`` by a random [K, N] weight ([N, K] with ``trans_b``) and, with ``bias``, a C of
        ``c_shape`` (default [N]); ``attrs`` are Gemm attributes (alpha, beta, transA)."""
        w = weight or self.const(self.rand(*((n, k) if trans_b else (k, n))))
        inputs = [x, w]
        if bias:
            inputs.append(self.const(self.rand(*(c_shape or (n,)), scale=0.1)))
        if trans_b:
            attrs["transB"] = 1
        return self.op("Gemm", inputs, **attrs)

    def bn(self, x: str, c: int, epsilon: float | None = None, param_dtype=None, **attrs) -> str:
        dt = param_dtype or self.dtype
        params = [self.rng.uniform(0.5, 1.5, c), self.rng.standard_normal(c) * 0.1,
                  self.rng.standard_normal(c) * 0.1, self.rng.uniform(0.5, 1.5, c)]
        names = [self.const(np.asarray(p, dtype=dt)) for p in params]
        if epsilon is not None:
            attrs["epsilon"] = epsilon
        return self.op("BatchNormalization", [x, *names], **attrs)

    def model(self, outputs: list[str] | str, opset: int = 17, ir_version: int = 8,
              output_dtype=None, extra_opsets: dict | None = None) -> onnx.ModelProto:
        outputs = [outputs] if isinstance(outputs, str) else outputs
        elem = NP_TO_ONNX[np.dtype(output_dtype or self.dtype)]
        graph = helper.make_graph(self.nodes, "test", self.inputs,
                                  [helper.make_tensor_value_info(o, elem, None) for o in outputs], self.inits)
        opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in
                                                     (extra_opsets or {}).items()]
        model = helper.make_model(graph, opset_imports=opsets, producer_name="onnxfuse-tests")
        model.ir_version = ir_version
        return model

    def build(self, outputs: list[str] | str, initializers_as_inputs: bool = False, **model_args) -> onnx.ModelProto:
        """:meth:`model` whose graph outputs carry the type and shape onnx shape inference gives them (recent
        onnx.checker rejects an output without a shape). ``initializers_as_inputs`` also lists every initializer
        as a graph input, as IR 3 models must (ONNX IR.md, "Graphs")."""
        model = self.model(outputs, **model_args)
        if initializers_as_inputs:
            model.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                                     for t in model.graph.initializer)
        return with_output_shapes(model)


def with_output_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with each graph output's type replaced by the one onnx shape inference gives it (when it gives
    one with a shape)."""
    inferred = onnx.shape_inference.infer_shapes(model).graph
    known = {vi.name: vi.type for vi in list(inferred.value_info) + list(inferred.output)
             if vi.type.tensor_type.HasField("shape")}
    for out in model.graph.output:
        if not out.type.tensor_type.HasField("shape") and out.name in known:
            out.type.CopyFrom(known[out.name])
    return model


def subgraph(builder: GraphBuilder, outputs: list[str] | str, name: str = "body") -> onnx.GraphProto:
    """The nodes and initializers of ``builder`` as a subgraph (an If branch) with no inputs of its own, its
    outputs typed by shape inference (outer-scope tensors must be graph inputs of ``builder``)."""
    outputs = [outputs] if isinstance(outputs, str) else outputs
    model = builder.build(outputs)
    graph = helper.make_graph(builder.nodes, name, [], list(model.graph.output), builder.inits)
    return graph


def tensor(model: onnx.ModelProto, name: str) -> np.ndarray:
    """The value of initializer or ``Constant`` node output ``name`` in the main graph of ``model``."""
    for t in model.graph.initializer:
        if t.name == name:
            return numpy_helper.to_array(t)
    for node in model.graph.node:
        if node.op_type == "Constant" and list(node.output) == [name]:
            return numpy_helper.to_array(node.attribute[0].t)
    raise KeyError(name)


def skip_of(result, pass_name: str):
    """The one Skip that pass ``pass_name`` reported in ``result`` (a pipeline.Result); fails unless exactly one."""
    found = [s for s in result.skips if s.pass_name == pass_name]
    assert len(found) == 1, [(s.pass_name, s.reason, s.detail) for s in result.skips]
    return found[0]


def compact_weight(b: GraphBuilder, c_out: int, c_in: int, k: int = 3, form: str = "cast_mul") -> str:
    """A float32 conv weight [c_out, c_in, k, k] that the graph computes from compact constants, as weight-only
    quantized or size-optimized exports write it: ``cast_mul`` Mul(Cast(int8), per-channel scale [c_out, 1, 1,
    1]); ``dq_axis`` DequantizeLinear(int8, scale [c_out], zero point [c_out], axis 0); ``dq_tensor``
    DequantizeLinear(int8, one scale, one zero point); ``constant_of_shape``, ``expand``, ``tile``: one value
    broadcast by ConstantOfShape, Expand or Tile."""
    shape = (c_out, c_in, k, k)
    if form == "constant_of_shape":
        return b.op("ConstantOfShape", [b.const(np.array(shape, np.int64))],
                    value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.005]))
    if form == "expand":
        return b.op("Expand", [b.const(np.float32([0.005])), b.const(np.array(shape, np.int64))])
    if form == "tile":
        return b.op("Tile", [b.const(np.full((1, 1, 1, 1), 0.005, np.float32)), b.const(np.array(shape, np.int64))])
    q = b.const(b.rng.integers(-127, 128, shape).astype(np.int8))
    scale = b.rng.uniform(0.0005, 0.002, c_out).astype(np.float32)  # weights of about 0.07: outputs stay near 1
    if form == "cast_mul":
        return b.op("Mul", [b.op("Cast", [q], to=TensorProto.FLOAT), b.const(scale.reshape(c_out, 1, 1, 1))])
    if form == "dq_axis":
        return b.op("DequantizeLinear", [q, b.const(scale), b.const(np.zeros(c_out, np.int8))], axis=0)
    assert form == "dq_tensor", form
    return b.op("DequantizeLinear", [q, b.const(np.float32(0.001)), b.const(np.int8(0))])


def compact_gemm_weight(b: GraphBuilder, k: int, n: int, trans_b: bool = False, form: str = "cast_mul") -> str:
    """A float32 Gemm B ([K, N], or [N, K] with ``trans_b``) computed from compact constants: ``cast_mul``
    Mul(Cast(int8), per-output-feature scale [1, N] / [N, 1]); ``constant_of_shape`` ConstantOfShape of one
    value."""
    shape = (n, k) if trans_b else (k, n)
    if form == "constant_of_shape":
        return b.op("ConstantOfShape", [b.const(np.array(shape, np.int64))],
                    value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.005]))
    assert form == "cast_mul", form
    q = b.const(b.rng.integers(-127, 128, shape).astype(np.int8))
    scale = b.rng.uniform(0.0005, 0.002, n).astype(np.float32).reshape((n, 1) if trans_b else (1, n))
    return b.op("Mul", [b.op("Cast", [q], to=TensorProto.FLOAT), b.const(scale)])
