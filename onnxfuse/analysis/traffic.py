"""Memory-traffic accounting: bytes each node reads from and writes to device memory (no I/O, no onnxruntime).

The model (``shared/docs/traffic.md``; also docs/reference.md, "How bytes are counted"): unfused execution, no cache
reuse. Each node reads each of its *distinct* input tensors once and writes each output once; a tensor's bytes
are its element count times the itemsize of its ONNX dtype; weights (initializers, ``Constant`` outputs) are read
by every node that consumes them; a ``Constant`` node moves nothing. Nodes of If/Loop/Scan bodies are counted as
one execution of the body (both If branches are listed). A node with a tensor of unknown size is left out of the
totals and counted as unknown: sizes are never guessed.

Bytes are sympy expressions in the model's symbolic input dims (:mod:`onnxfuse.analysis.symbolic`), e.g. ``32*N*H*W``
for a float32 ``[N, 8, H, W]`` tensor, and plain ``int`` where every dim is a number (a sum or product of ints
stays an int, so a model with only numeric dims never imports sympy); None means unknown.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

import numpy as np
import onnx

from onnxfuse.model.domains import is_default_domain
from onnxfuse.model.proto import proto_graphs

if TYPE_CHECKING:
    import sympy

#: itemsize in bytes of each ONNX ``TensorProto.DataType`` (ONNX IR.md, "Tensor Element Types"); sub-byte
#: types (int4/uint4/float4) are rounded up to one byte per element.
_ITEMSIZE: dict[int, int] = {
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


Bytes: TypeAlias = "sympy.Expr | int"  # bytes: an int, or an expression in the input symbols


def add(parts: Iterable[Bytes]) -> Bytes:
    """The sum of byte counts: an ``int`` when every part is one, else a sympy expression (``sympy.Add``)."""
    terms = list(parts)
    if all(type(p) is int for p in terms):
        return sum(terms)
    import sympy

    return sympy.Add(*terms)


def tensor_bytes(shape: tuple | None, elem_type: int | None) -> Bytes | None:
    """Bytes of a tensor: product of ``shape`` times the itemsize of ``elem_type``; an ``int`` when every dim is
    a number, else a sympy expression.

    ``shape`` holds ints or sympy expressions; None when the shape, a dim (None, a negative number, a dim name
    given as a string) or the dtype is unknown. A scalar (shape ``()``) has one element.
    """
    size = itemsize(elem_type) if elem_type is not None else None
    if shape is None or size is None:
        return None
    dims: list[Bytes] = []
    symbolic = False
    for d in shape:
        if isinstance(d, (int, np.integer)) and d >= 0:
            dims.append(int(d))
        elif hasattr(d, "free_symbols") and not (d.is_number and d < 0):  # a sympy expression
            dims.append(d)
            symbolic = True
        else:
            return None
    if not symbolic:
        return math.prod(dims) * size
    import sympy

    return sympy.Mul(*dims) * size


@dataclass(frozen=True)
class NodeTraffic:
    """Traffic of one node, in bytes (sympy expressions in the input symbols).

    Attributes:
        key: the node's first output name (unique in a model), used to find it again after a rewrite.
        name: node name (may be empty in the model).
        op: op type.
        read_bytes / written_bytes: None when a tensor's size is unknown (see ``unknown`` and ``reason``).
        unknown: names of the tensors whose size is unknown.
        reason: why they are unknown ('' when known), naming the node where the size stopped being known.
        subgraph: True for nodes inside an If/Loop/Scan body.
    """

    key: str
    name: str
    op: str
    read_bytes: Bytes | None
    written_bytes: Bytes | None
    unknown: tuple[str, ...]
    subgraph: bool
    reason: str = ""

    @property
    def total_bytes(self) -> Bytes | None:
        """read_bytes + written_bytes, or None if unknown."""
        if self.read_bytes is None or self.written_bytes is None:
            return None
        return self.read_bytes + self.written_bytes


class Sizes:
    """Tensor name -> bytes, from tensor shapes plus the model's own initializers and Constants.

    ``shapes`` maps a tensor name to its shape (a tuple of ints and sympy expressions, None for an unknown dim)
    or None (unknown rank), as :attr:`onnxfuse.analysis.symbolic.SymbolicShapes.shapes` does; ``reasons`` says why a
    tensor's size is unknown where that is known.
    """

    def __init__(self, shapes: dict[str, tuple | None], elem_types: dict[str, int],
                 reasons: dict[str, str] | None = None):
        self.shapes = shapes
        self.elem_types = elem_types
        self.reasons = reasons or {}
        self._cache: dict[str, Bytes | None] = {}

    @classmethod
    def from_onnx(cls, info: dict[str, tuple], elem_types: dict[str, int]) -> Sizes:
        """From :func:`onnxfuse.analysis.shapes.infer`'s ``(info, elem_types)``: named dims count as unknown."""
        return cls({k: v[0] for k, v in info.items()}, elem_types)

    def with_model(self, model: onnx.ModelProto, written_before: AbstractSet[str] | None = None,
                   dims: Mapping[str, Bytes] | None = None) -> Sizes:
        """A copy that also knows every initializer and ``Constant`` value of ``model`` (new folded weights).

        With ``written_before`` (the names of the tensors written by a node of the model these sizes were
        inferred on), ``model`` is a rewrite of it: a tensor that a node of ``model`` writes and that is not
        among them is one a pass inserted, which the original's shape inference never saw. It gets its shape
        from :func:`_derive_shape` where its inputs' shapes give it, else from ``model``'s ``value_info`` (graph
        outputs included), where the pass recorded the shape it knew (``onnx_graphsurgeon`` exports a variable's
        dtype and shape there): ``dim_value`` as the number, ``dim_param`` as ``dims[name]`` (the expression
        of that named dim in these sizes; unknown when absent), a dim with neither unknown. A tensor of the
        original keeps the original's size whatever ``model``'s ``value_info`` says (it may be stale there).
        """
        shapes, elem = dict(self.shapes), dict(self.elem_types)
        values: dict[str, onnx.TensorProto] = {}
        for graph, _ in proto_graphs(model.graph):
            for t in graph.initializer:
                shapes[t.name] = tuple(t.dims)
                elem[t.name] = t.data_type
                values[t.name] = t
            for node in graph.node:
                if node.op_type == "Constant" and node.output:
                    for attr in node.attribute:
                        if attr.name == "value":
                            shapes[node.output[0]] = tuple(attr.t.dims)
                            elem[node.output[0]] = attr.t.data_type
                            values[node.output[0]] = attr.t
        recorded = _recorded_types(model, written_before, dims or {}) if written_before is not None else {}
        for graph, _ in proto_graphs(model.graph):
            for node in graph.node:
                _derive_shape(node, shapes, elem, values)
                for name in node.output:
                    if name in recorded and (name not in shapes or name not in elem):
                        shape, elem_type = recorded[name]
                        shapes.setdefault(name, shape)
                        if elem_type:
                            elem.setdefault(name, elem_type)
        return Sizes(shapes, elem, self.reasons)

    def bytes(self, name: str) -> Bytes | None:
        """Bytes of tensor ``name``, or None if its shape or dtype is unknown."""
        if name not in self._cache:
            self._cache[name] = tensor_bytes(self.shapes.get(name), self.elem_types.get(name))
        return self._cache[name]


def _recorded_types(model: onnx.ModelProto, written_before: AbstractSet[str], dims: Mapping[str, Bytes]
                    ) -> dict[str, tuple[tuple | None, int]]:
    """Tensor name -> ``(shape, elem_type)`` from the ``value_info`` and graph outputs of every graph of
    ``model``, for the tensors not in ``written_before`` (see :meth:`Sizes.with_model`); the shape None when the
    value_info has none (unknown rank)."""
    out: dict[str, tuple[tuple | None, int]] = {}
    for graph, _ in proto_graphs(model.graph):
        for vi in (*graph.value_info, *graph.output):
            if vi.name in written_before or vi.name in out or not vi.type.HasField("tensor_type"):
                continue
            tt = vi.type.tensor_type
            shape = None
            if tt.HasField("shape"):
                shape = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value >= 0
                              else dims.get(d.dim_param) if d.HasField("dim_param") else None
                              for d in tt.shape.dim)
            out[vi.name] = (shape, tt.elem_type)
    return out


def _derive_shape(node: onnx.NodeProto, shapes: dict[str, tuple | None], elem: dict[str, int],
                  values: dict[str, onnx.TensorProto]) -> None:
    """Give the output of a Reshape, Flatten or Gemm that a pass wrote (a tensor the original's shape inference
    never saw) its shape from its inputs', in place, where every dim needed is known; anything else is left
    unknown.

    Reshape (ONNX Operators.md, Reshape): the constant shape's 0 copies the input dim (``allowzero`` 0), one -1 is
    the element count over the other dims. Flatten (Operators.md, Flatten): ``[d0 * ... * d(axis-1), d(axis) *
    ... * d(n-1)]``, a negative axis counted from the end. Gemm (Operators.md, Gemm): ``[M, N]`` with M from A
    (``transA``) and N from B (``transB``).
    """
    if not node.output or node.output[0] in shapes or not is_default_domain(node.domain):
        return
    out = node.output[0]
    attrs = {a.name: a.i for a in node.attribute if a.type == onnx.AttributeProto.INT}
    if node.op_type == "Reshape" and len(node.input) == 2 and node.input[1] in values and not attrs.get("allowzero"):
        src = shapes.get(node.input[0])
        if src is None or any(d is None for d in src):
            return
        target = [int(v) for v in onnx.numpy_helper.to_array(values[node.input[1]]).reshape(-1)]
        dims = [src[i] if v == 0 and i < len(src) else v for i, v in enumerate(target)]
        if dims.count(-1) > 1:
            return
        if -1 in dims:
            known = math.prod(d for d in dims if not (type(d) is int and d == -1))
            count = math.prod(src)
            if type(known) is int and known == 0:
                return
            rest = count // known if type(count) is int and type(known) is int else count / known
            dims = [rest if type(d) is int and d == -1 else d for d in dims]
        shapes[out] = tuple(dims)
    elif node.op_type == "Flatten" and node.input:
        src = shapes.get(node.input[0])
        if src is None or any(d is None for d in src):
            return
        axis = attrs.get("axis", 1) + (len(src) if attrs.get("axis", 1) < 0 else 0)
        if not 0 <= axis <= len(src):
            return
        shapes[out] = (math.prod(src[:axis]), math.prod(src[axis:]))
    elif node.op_type == "Gemm" and len(node.input) >= 2:
        a, b = shapes.get(node.input[0]), shapes.get(node.input[1])
        if a is None or b is None or len(a) != 2 or len(b) != 2:
            return
        shapes[out] = (a[1] if attrs.get("transA") else a[0], b[0] if attrs.get("transB") else b[1])
    else:
        return
    if node.input[0] in elem:
        elem[out] = elem[node.input[0]]


def node_traffic(model: onnx.ModelProto, sizes: Sizes) -> list[NodeTraffic]:
    """Traffic of every node of ``model`` (subgraph bodies included), in graph order."""
    rows = []
    for graph, inside in proto_graphs(model.graph):
        for node in graph.node:
            key = node.output[0] if node.output else node.name
            if node.op_type == "Constant" and is_default_domain(node.domain):
                rows.append(NodeTraffic(key, node.name, node.op_type, 0, 0, (), inside))
                continue
            unknown: list[str] = []
            read: list[Bytes] = []
            written: list[Bytes] = []
            for name in dict.fromkeys(i for i in node.input if i):
                b = sizes.bytes(name)
                if b is None:
                    unknown.append(name)
                else:
                    read.append(b)
            for name in (o for o in node.output if o):
                b = sizes.bytes(name)
                if b is None:
                    unknown.append(name)
                else:
                    written.append(b)
            if unknown:
                reason = next((sizes.reasons[t] for t in unknown if t in sizes.reasons),
                              "shape inference gives no shape for " + ", ".join(unknown))
                rows.append(NodeTraffic(key, node.name, node.op_type, None, None, tuple(unknown), inside, reason))
            else:
                rows.append(NodeTraffic(key, node.name, node.op_type, add(read), add(written), (), inside))
    return rows


@dataclass(frozen=True)
class Totals:
    """Sums over the nodes whose traffic is known, in bytes (expressions), plus the count of unknown nodes."""

    read_bytes: Bytes
    written_bytes: Bytes
    nodes: int
    unknown_nodes: int

    @property
    def total_bytes(self) -> Bytes:
        """read_bytes + written_bytes."""
        return self.read_bytes + self.written_bytes


def totals(rows: list[NodeTraffic]) -> Totals:
    """Add up ``rows``; nodes of unknown traffic are counted in ``unknown_nodes`` and not in the byte sums."""
    known = [r for r in rows if r.total_bytes is not None]
    return Totals(add(r.read_bytes for r in known), add(r.written_bytes for r in known),
                  len(rows), len(rows) - len(known))


def chain_bytes(rows_by_key: dict[str, NodeTraffic], keys: list[str]) -> Bytes | None:
    """Total bytes of the nodes with first-output names ``keys``; None if any is unknown or missing."""
    parts: list[Bytes] = []
    for key in keys:
        row = rows_by_key.get(key)
        if row is None or row.total_bytes is None:
            return None
        parts.append(row.total_bytes)
    return add(parts)


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


def fused_estimate(index: ModelIndex, keys: list[str], output: str, sizes: Sizes) -> Bytes | None:
    """Bytes the nodes left after fusing the chain of nodes ``keys`` ending in ``output`` would move: one fused
    node that reads the weight node's (Conv, Gemm, MatMul) first three inputs that the chain does not compute
    (X, W, B) and every run-time tensor the chain reads from outside (a residual Z, the input of a BN that feeds
    the Gemm, the bias of a MatMul's Add, which becomes Gemm's C), and writes ``output`` once; plus a Flatten or
    Reshape in the chain, which stays (it reads and writes its own tensors). Constants a fold would absorb (BN
    parameters, Clip bounds) are not read. None when a
    size is unknown."""
    nodes = [index.nodes[k] for k in keys if k in index.nodes]
    if len(nodes) != len(keys):
        return None
    produced = {o for n in nodes for o in n.output}
    main = next((n for n in nodes if n.op_type in WEIGHT_OPS), nodes[0])
    reads = list(dict.fromkeys(i for i in main.input[:3] if i and i not in produced))
    kept: list[str] = []
    for n in nodes:
        if n is main:
            continue
        if n.op_type in KEPT_OPS:
            kept.extend(dict.fromkeys([*(i for i in n.input if i), *(o for o in n.output if o)]))
            continue
        bias = main.op_type == "MatMul" and n.op_type == "Add"  # its constant becomes Gemm's C, which is read
        reads.extend(i for i in n.input
                     if i and i not in produced and (bias or i not in index.constants) and i not in reads)
    parts: list[Bytes] = []
    for name in [*reads, output, *kept]:
        b = sizes.bytes(name)
        if b is None:
            return None
        parts.append(b)
    return add(parts)
