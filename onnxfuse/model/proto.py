"""ONNX protobuf helpers that need neither onnx-graphsurgeon nor onnxruntime: walking a model's graphs and
subgraphs, copying a model's fields, and the weight-free *skeleton* that shape inference runs on.

A skeleton has the same nodes and tensor types as the model, with the data of large float tensors (initializers
and ``Constant`` node values) left out, so that inferring shapes of a model with gigabytes of weights costs
kilobytes. Small tensors (int64 shapes, axes, scalars) keep their data, so data propagation through
Reshape/Resize/Slice still works.
"""

from __future__ import annotations

import math

import onnx
from google.protobuf.message import Message
from onnx import TensorProto

from onnxfuse.model.domains import MS_DOMAIN

_GRAPH, _GRAPHS = onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS


def copy_model_fields(src: onnx.ModelProto, dst: onnx.ModelProto) -> None:
    """Copy every field of ``src`` except ``graph`` into ``dst`` (IR version, opsets, producer, metadata...)."""
    for desc, value in src.ListFields():
        if desc.name == "graph":
            continue
        if isinstance(value, Message):
            getattr(dst, desc.name).CopyFrom(value)
        elif hasattr(value, "extend"):
            getattr(dst, desc.name).extend(value)
        else:
            setattr(dst, desc.name, value)


def proto_graphs(graph: onnx.GraphProto, inside: bool = False):
    """Yield ``(graph, inside)`` for ``graph`` and every subgraph (If/Loop/Scan bodies), outermost first and
    depth first; ``inside`` is True for bodies."""
    yield graph, inside
    for node in graph.node:
        for attr in node.attribute:
            kind = attr.type  # read once: building attr.graphs for every attribute would be most of the walk's time
            if kind == _GRAPH:
                yield from proto_graphs(attr.g, True)
            elif kind == _GRAPHS:
                for sub in attr.graphs:
                    yield from proto_graphs(sub, True)


#: Tensors with more elements than this lose their data in the skeleton (only dims and dtype are kept).
SKELETON_MAX_ELEMENTS = 1024


#: ``dim_param`` texts that exporters write for "unknown", not as a name: ``?`` (paddle2onnx writes
#: ``[-1, 3, '?', '?']``; it is also how onnx's printer shows an unknown dim) and ``None`` (a stringified Python
#: None). Integer texts such as ``-1`` (a -1 dim written as text) and empty or blank names are placeholders too
#: (:func:`is_placeholder_dim`). Each such dim is its own anonymous symbol, as a dim with neither value nor name
#: is (onnx.proto, TensorShapeProto: a dim is an integer or a symbolic variable; onnx's shape inference and
#: onnxruntime's symbolic shape inference take one name for one size). tf2onnx's ``unk__N`` is no placeholder:
#: tf2onnx numbers every unknown dim afresh, so a name it repeats is one size.
PLACEHOLDER_DIM_PARAMS = frozenset({"?", "None"})


def is_placeholder_dim(dim_param: str | None) -> bool:
    """True when ``dim_param`` (a ``TensorShapeProto.Dimension.dim_param``, or an onnxruntime ``NodeArg.shape``
    entry) names no size: None, empty or blank, an integer text, or one of :data:`PLACEHOLDER_DIM_PARAMS`.
    Two such dims are different unknown sizes, never one symbol."""
    if dim_param is None:
        return True
    text = dim_param.strip()
    if not text or text in PLACEHOLDER_DIM_PARAMS:
        return True
    try:
        int(text)
    except ValueError:
        return False
    return True


def anonymize_placeholder_dims(graph: onnx.GraphProto) -> None:
    """Clear, in place, every placeholder ``dim_param`` (:func:`is_placeholder_dim`) of the tensor types of the
    inputs, outputs and value_info of ``graph`` and its subgraphs, so that shape inference and the symbol table
    see unknown dims instead of one shared name."""
    for sub, _ in proto_graphs(graph):
        for vi in (*sub.input, *sub.output, *sub.value_info):
            if not vi.type.HasField("tensor_type"):
                continue
            for d in vi.type.tensor_type.shape.dim:
                if d.HasField("dim_param") and is_placeholder_dim(d.dim_param):
                    d.ClearField("dim_param")


def _strip(t: TensorProto) -> TensorProto:
    if math.prod(t.dims) <= SKELETON_MAX_ELEMENTS or t.data_location == TensorProto.EXTERNAL:
        return t
    slim = TensorProto(name=t.name, data_type=t.data_type, dims=t.dims, doc_string=t.doc_string)
    return slim


def _skeleton_graph(graph: onnx.GraphProto) -> onnx.GraphProto:
    out = onnx.GraphProto(name=graph.name)
    out.input.extend(graph.input)
    out.output.extend(graph.output)
    out.value_info.extend(graph.value_info)
    out.initializer.extend(_strip(t) for t in graph.initializer)
    for node in graph.node:
        new = out.node.add()
        new.output.extend(node.output)
        new.op_type, new.domain, new.name = node.op_type, node.domain, node.name
        fused = node.op_type == "FusedConv" and node.domain == MS_DOMAIN
        if fused:
            # onnx cannot infer through FusedConv; its output has the shape of the plain Conv (Z has it too).
            new.op_type, new.domain = "Conv", ""
        new.input.extend(node.input[:3] if fused else node.input)
        for attr in node.attribute:
            if fused and attr.name in ("activation", "activation_params"):
                continue
            a = new.attribute.add()
            if attr.type == onnx.AttributeProto.TENSOR:
                a.name, a.type = attr.name, attr.type
                a.t.CopyFrom(_strip(attr.t))
            elif attr.type == onnx.AttributeProto.GRAPH:
                a.name, a.type = attr.name, attr.type
                a.g.CopyFrom(_skeleton_graph(attr.g))
            else:
                a.CopyFrom(attr)
    return out


def skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose large float tensors carry no data (see the module docstring) and whose
    placeholder dims (``?``, ``-1`` as text: :func:`is_placeholder_dim`) are unnamed, each its own unknown."""
    out = onnx.ModelProto()
    copy_model_fields(model, out)
    out.graph.CopyFrom(_skeleton_graph(model.graph))
    anonymize_placeholder_dims(out.graph)
    return out


def strip_declared_shapes(model: onnx.ModelProto) -> None:
    """Remove, in place, every shape ``model`` only declares: ``value_info`` entries and the shapes of graph
    outputs, in every graph (If/Loop/Scan bodies too); dtypes stay. ``onnx.shape_inference`` (non-strict) keeps
    a declared shape it cannot check, so a wrong ``value_info`` would otherwise be counted as if inferred."""
    for graph, _ in proto_graphs(model.graph):
        del graph.value_info[:]
        for vi in graph.output:
            if vi.type.HasField("tensor_type"):
                vi.type.tensor_type.ClearField("shape")
