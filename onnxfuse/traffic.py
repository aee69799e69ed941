"""Memory-traffic accounting: bytes each node reads from and writes to device memory (no I/O, no onnxruntime).

The model (``shared/docs/traffic.md``; also README.md, "How bytes are counted"): unfused execution, no cache
reuse. Each node reads each of its *distinct* input tensors once and writes each output once; a tensor's bytes
are its element count times the itemsize of its ONNX dtype; weights (initializers, ``Constant`` outputs) are read
by every node that consumes them; a ``Constant`` node moves nothing. Nodes of If/Loop/Scan bodies are counted as
one execution of the body (both If branches are listed). A node with a tensor of unknown size is left out of the
totals and counted as unknown: sizes are never guessed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx

from onnxfuse.graph import proto_graphs

#: itemsize in bytes of each ONNX ``TensorProto.DataType`` (ONNX IR.md, "Tensor Element Types"); sub-byte
#: types (int4/uint4/float4) are rounded up to one byte per element.
_ITEMSIZE = {
    onnx.TensorProto.FLOAT: 4, onnx.TensorProto.UINT8: 1, onnx.TensorProto.INT8: 1, onnx.TensorProto.UINT16: 2,
    onnx.TensorProto.INT16: 2, onnx.TensorProto.INT32: 4, onnx.TensorProto.INT64: 8, onnx.TensorProto.BOOL: 1,
    onnx.TensorProto.FLOAT16: 2, onnx.TensorProto.DOUBLE: 8, onnx.TensorProto.UINT32: 4,
    onnx.TensorProto.UINT64: 8, onnx.TensorProto.COMPLEX64: 8, onnx.TensorProto.COMPLEX128: 16,
    onnx.TensorProto.BFLOAT16: 2,
}
for _name in ("FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "UINT4", "INT4", "FLOAT4E2M1",
              "FLOAT8E8M0", "UINT2", "INT2"):
    if hasattr(onnx.TensorProto, _name):
        _ITEMSIZE[getattr(onnx.TensorProto, _name)] = 1


def itemsize(elem_type: int) -> int | None:
    """Bytes per element of ONNX dtype ``elem_type`` (float32 4, float16 2, int64 8, bool 1, ...), or None."""
    return _ITEMSIZE.get(elem_type)


def tensor_bytes(shape: tuple | None, elem_type: int | None) -> int | None:
    """Bytes of a tensor: product of ``shape`` times the itemsize of ``elem_type``; None when any dim or the
    dtype is unknown. A scalar (shape ``()``) has one element."""
    if shape is None or elem_type is None or itemsize(elem_type) is None:
        return None
    if any(not isinstance(d, (int, np.integer)) or d < 0 for d in shape):
        return None
    return math.prod(int(d) for d in shape) * itemsize(elem_type)


@dataclass(frozen=True)
class NodeTraffic:
    """Traffic of one node, in bytes.

    Attributes:
        key: the node's first output name (unique in a model), used to find it again after a rewrite.
        name: node name (may be empty in the model).
        op: op type.
        read_bytes / written_bytes: None when a tensor's size is unknown (see ``unknown``).
        unknown: names of the tensors whose size is unknown.
        subgraph: True for nodes inside an If/Loop/Scan body.
    """

    key: str
    name: str
    op: str
    read_bytes: int | None
    written_bytes: int | None
    unknown: tuple[str, ...]
    subgraph: bool

    @property
    def total_bytes(self) -> int | None:
        """read_bytes + written_bytes, or None if unknown."""
        if self.read_bytes is None or self.written_bytes is None:
            return None
        return self.read_bytes + self.written_bytes


class Sizes:
    """Tensor name -> bytes, from shape inference results plus the model's own initializers and Constants."""

    def __init__(self, info: dict[str, tuple], elem_types: dict[str, int]):
        self.info = info
        self.elem_types = elem_types

    def with_model(self, model: onnx.ModelProto) -> Sizes:
        """A copy that also knows every initializer and ``Constant`` value of ``model`` (new folded weights)."""
        info, elem = dict(self.info), dict(self.elem_types)
        for graph, _ in proto_graphs(model.graph):
            for t in graph.initializer:
                info[t.name] = (tuple(t.dims), None)
                elem[t.name] = t.data_type
            for node in graph.node:
                if node.op_type == "Constant" and node.output:
                    for attr in node.attribute:
                        if attr.name == "value":
                            info[node.output[0]] = (tuple(attr.t.dims), None)
                            elem[node.output[0]] = attr.t.data_type
        return Sizes(info, elem)

    def bytes(self, name: str) -> int | None:
        """Bytes of tensor ``name``, or None if its shape or dtype is unknown."""
        shape = self.info.get(name, (None, None))[0]
        return tensor_bytes(shape, self.elem_types.get(name))


def node_traffic(model: onnx.ModelProto, sizes: Sizes) -> list[NodeTraffic]:
    """Traffic of every node of ``model`` (subgraph bodies included), in graph order."""
    rows = []
    for graph, inside in proto_graphs(model.graph):
        for node in graph.node:
            key = node.output[0] if node.output else node.name
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                rows.append(NodeTraffic(key, node.name, node.op_type, 0, 0, (), inside))
                continue
            unknown, read, written = [], 0, 0
            for name in dict.fromkeys(i for i in node.input if i):
                b = sizes.bytes(name)
                if b is None:
                    unknown.append(name)
                else:
                    read += b
            for name in (o for o in node.output if o):
                b = sizes.bytes(name)
                if b is None:
                    unknown.append(name)
                else:
                    written += b
            if unknown:
                rows.append(NodeTraffic(key, node.name, node.op_type, None, None, tuple(unknown), inside))
            else:
                rows.append(NodeTraffic(key, node.name, node.op_type, read, written, (), inside))
    return rows


@dataclass(frozen=True)
class Totals:
    """Sums over the nodes whose traffic is known, in bytes, plus the count of unknown nodes."""

    read_bytes: int
    written_bytes: int
    nodes: int
    unknown_nodes: int

    @property
    def total_bytes(self) -> int:
        """read_bytes + written_bytes."""
        return self.read_bytes + self.written_bytes


def totals(rows: list[NodeTraffic]) -> Totals:
    """Add up ``rows``; nodes of unknown traffic are counted in ``unknown_nodes`` and not in the byte sums."""
    known = [r for r in rows if r.total_bytes is not None]
    return Totals(sum(r.read_bytes for r in known), sum(r.written_bytes for r in known), len(rows),
                  len(rows) - len(known))


def chain_bytes(rows_by_key: dict[str, NodeTraffic], keys: list[str]) -> int | None:
    """Total bytes of the nodes with first-output names ``keys``; None if any is unknown or missing."""
    total = 0
    for key in keys:
        row = rows_by_key.get(key)
        if row is None or row.total_bytes is None:
            return None
        total += row.total_bytes
    return total


class ModelIndex:
    """Nodes of a model by first output name, and the names of its constants (initializers, Constant outputs)."""

    def __init__(self, model: onnx.ModelProto):
        self.nodes: dict[str, onnx.NodeProto] = {}
        self.constants: set[str] = set()
        for graph, _ in proto_graphs(model.graph):
            self.constants.update(t.name for t in graph.initializer)
            for node in graph.node:
                if node.output:
                    self.nodes[node.output[0]] = node
                    if node.op_type == "Constant":
                        self.constants.add(node.output[0])


#: Ops whose node holds the weights of a fused chain: the fused node reads their first three inputs (X, W, B;
#: Gemm's A, B, C) whatever they are.
WEIGHT_OPS = ("Conv", "ConvTranspose", "FusedConv", "Gemm", "MatMul", "FusedGemm")

#: Ops that a fold leaves in place inside a chain (BatchNormalization -> Flatten -> Gemm keeps the Flatten).
KEPT_OPS = ("Flatten", "Reshape")


def fused_estimate(index: ModelIndex, keys: list[str], output: str, sizes: Sizes) -> int | None:
    """Bytes the nodes left after fusing the chain of nodes ``keys`` ending in ``output`` would move: one fused
    node that reads the weight node's (Conv, Gemm, MatMul) first three inputs that the chain does not compute
    (X, W, B) and every run-time tensor the chain reads from outside (a residual Z, the input of a BN that feeds
    the Gemm, the bias of a MatMul's Add, which becomes Gemm's C), and writes ``output`` once; plus a Flatten or
    Reshape in the chain, which stays (it reads and writes its own tensors). Constants a fold would absorb (BN
    parameters, Clip bounds) are not read. None when a
    size is unknown."""
    nodes = [index.nodes.get(k) for k in keys]
    if any(n is None for n in nodes):
        return None
    produced = {o for n in nodes for o in n.output}
    main = next((n for n in nodes if n.op_type in WEIGHT_OPS), nodes[0])
    reads = list(dict.fromkeys(i for i in main.input[:3] if i and i not in produced))
    kept = []
    for n in nodes:
        if n is main:
            continue
        if n.op_type in KEPT_OPS:
            kept.extend(dict.fromkeys([*(i for i in n.input if i), *(o for o in n.output if o)]))
            continue
        bias = main.op_type == "MatMul" and n.op_type == "Add"  # its constant becomes Gemm's C, which is read
        reads.extend(i for i in n.input
                     if i and i not in produced and (bias or i not in index.constants) and i not in reads)
    total = 0
    for name in [*reads, output, *kept]:
        b = sizes.bytes(name)
        if b is None:
            return None
        total += b
    return total
