"""The in-place export: :func:`export_in_place` writes a graphsurgeon graph into the input model's own
``GraphProto``, keeping the initializer messages no pass changed (graphsurgeon's export copies every one). It
reads graphsurgeon's private state (``Constant._values``, ``LazyValues``, ``OnnxExporter``'s static methods),
which is why it is alone here; :func:`onnxfuse.ir.convert.to_model` decides when it runs.
"""

from __future__ import annotations

import math

import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.ir.tensor import LazyValues

from onnxfuse.errors import InputError, one_line
from onnxfuse.ir.edit import all_graphs
from onnxfuse.model import io as model_io
from onnxfuse.model.domains import MS_DOMAIN
from onnxfuse.model.proto import proto_graphs


def export_in_place(graph: gs.Graph, model: onnx.ModelProto) -> bool:
    """Write ``graph`` into ``model.graph`` as :func:`onnxfuse.ir.convert.to_model` would export it, keeping the
    initializer messages that graphsurgeon still references lazily (unchanged weights) where they are. Returns
    False, having changed nothing, when the model has subgraphs or an initializer cannot be found by identity.

    Raises:
        InputError: graphsurgeon cannot export a node or value of the graph.
    """
    if any(True for _ in list(all_graphs(graph))[1:]) or any(True for _ in list(proto_graphs(model.graph))[1:]):
        return False
    if _attribute_elements(model.graph) > IN_PLACE_MAX_ATTRIBUTE_ELEMENTS:
        # weights in Constant nodes (PaddleOCR exports): the exported nodes copy them, and the input's own nodes
        # would stay in the model's memory beside the copies; a new model lets the input go instead
        return False
    target = model.graph
    try:
        tensor_map = graph.tensors()
        wanted = _initializer_sources(tensor_map, {id(t) for t in target.initializer})
        if wanted is None:
            return False
        nodes, inputs, outputs, value_info = _exported_parts(graph, tensor_map)
    except Exception as exc:
        raise InputError(f"onnx-graphsurgeon cannot export this model ({type(exc).__name__}: "
                         f"{one_line(exc)})") from None
    exported = onnx.helper.make_graph(nodes, graph.name, inputs, outputs, doc_string=graph.doc_string,
                                      value_info=value_info)
    rebuilt, restored = rebuilt_inputs(list(exported.input), {c.name for _, c in wanted},
                                       [_copy(vi) for vi in target.input], {t.name: t for t in target.initializer},
                                       {i for n in target.node for i in n.input}, model.ir_version)
    if any(id(t) == id(r) for t, _ in wanted for r in restored):
        return False

    # From here on the model is rewritten.
    _write_initializers(target, wanted, restored)
    for desc, _ in target.ListFields():
        if desc.name != "initializer":
            target.ClearField(desc.name)
    target.MergeFrom(exported)
    if rebuilt is not None:
        if model.ir_version < 4:
            listed = {v.name for v in rebuilt}
            rebuilt += [onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                        for t in target.initializer if t.name not in listed]
        del target.input[:]
        target.input.extend(rebuilt)
    fix_ms_import(model)
    return True


def _initializer_sources(tensor_map: dict[str, gs.Tensor], existing: set[int]
                         ) -> list[tuple[onnx.TensorProto | None, gs.Constant]] | None:
    """The initializers in graphsurgeon's export order, each as ``(the input's message that holds its values, or
    None for a new array, gs.Constant)``; None when a lazily read value is in no message of ``existing`` (ids of
    the input's initializers) or two constants share one message."""
    wanted: list[tuple[onnx.TensorProto | None, gs.Constant]] = []
    for tensor in tensor_map.values():
        if not isinstance(tensor, gs.Constant):
            continue
        values = tensor._values
        if isinstance(values, gs.ir.tensor.LazyValues):
            if id(values.tensor) not in existing:
                if not model_io.is_lazy(values.tensor):
                    return None
                wanted.append((None, tensor))  # a spilled weight (constants.spilling): a new message, no data
                continue
            wanted.append((values.tensor, tensor))
        else:
            wanted.append((None, tensor))
    if len({id(t) for t, _ in wanted if t is not None}) != sum(t is not None for t, _ in wanted):
        return None
    return wanted


def _exported_parts(graph: gs.Graph, tensor_map: dict[str, gs.Tensor]) -> tuple[
        list[onnx.NodeProto], list[onnx.ValueInfoProto], list[onnx.ValueInfoProto], list[onnx.ValueInfoProto]]:
    """``(nodes, inputs, outputs, value_info)`` of ``graph``: everything but the initializers, exactly as
    graphsurgeon exports it (``OnnxExporter.export_graph``). Takes the graph inputs and outputs out of
    ``tensor_map``."""
    from onnx_graphsurgeon.exporters.onnx_exporter import OnnxExporter

    nodes = [OnnxExporter.export_node(node) for node in graph.nodes]
    inputs = [OnnxExporter.export_value_info_proto(t, False) for t in graph.inputs]
    outputs = [OnnxExporter.export_value_info_proto(t, False) for t in graph.outputs]
    for t in graph.inputs + graph.outputs:
        tensor_map.pop(t.name, None)
    value_info = [OnnxExporter.export_value_info_proto(t, False) for t in tensor_map.values()
                  if isinstance(t, gs.Variable) and (t.dtype is not None or t.shape is not None)]
    return nodes, inputs, outputs, value_info


def _write_initializers(target: onnx.GraphProto, wanted: list[tuple[onnx.TensorProto | None, gs.Constant]],
                        restored: list[onnx.TensorProto]) -> None:
    """Make ``target.initializer`` the ``wanted`` initializers (new arrays written into new messages) followed
    by the ``restored`` ones, in that order, reordering the input's messages in place (no copy of a weight)."""
    order: list[onnx.TensorProto] = []
    for proto, constant in wanted:
        if proto is None and isinstance(constant._values, LazyValues):  # spilled: its reference, no data
            proto = target.initializer.add()
            proto.CopyFrom(constant._values.tensor)
            proto.name = constant.name
            constant._values = LazyValues(proto)
        elif proto is None:
            proto = target.initializer.add()
            _write_constant(proto, constant)
            # the written message now holds the values: let the graph read them from there, so that the folded
            # array is freed now, not when the graph is (peak memory held both, as large as the weights)
            constant._values = LazyValues(proto)
        else:
            proto.name = constant.name  # what OnnxExporter.export_tensor_proto does
        order.append(proto)
    order += restored
    rank = {id(t): i for i, t in enumerate(order)}
    target.initializer.sort(key=lambda t: rank.get(id(t), len(order)))  # upb sorts the pointers: no copy
    if [t.name for t in target.initializer[:len(order)]] != [t.name for t in order]:
        # a protobuf backend that hands out new wrapper objects would break the identity mapping: never write a
        # model with the wrong initializers
        raise RuntimeError("internal error: initializers reordered in place do not match the export order")
    del target.initializer[len(order):]


#: Largest number of elements in node attribute tensors (Constant nodes) for which :func:`to_model` rewrites the
#: input model in place; above it the graphsurgeon export makes a new model (see :func:`export_in_place`).
IN_PLACE_MAX_ATTRIBUTE_ELEMENTS = 1 << 18


def _attribute_elements(graph: onnx.GraphProto) -> int:
    """Number of tensor elements held in the node attributes of ``graph`` (not its subgraphs)."""
    total = 0
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                total += math.prod(attr.t.dims)
            elif attr.type == onnx.AttributeProto.TENSORS:
                total += sum(math.prod(t.dims) for t in attr.tensors)
    return total


def _write_constant(proto: onnx.TensorProto, constant: gs.Constant) -> None:
    """Fill ``proto`` as ``OnnxExporter.export_tensor_proto(constant)`` would (a ``make_tensor`` of the values'
    raw bytes), writing the bytes straight into ``proto`` rather than into a TensorProto that is then copied."""
    from onnx_graphsurgeon.exporters.onnx_exporter import OnnxExporter, dtype_to_onnx

    data_type = dtype_to_onnx(constant.dtype)
    if constant.data_location is not None or dtype_to_onnx(constant.export_dtype) != data_type:
        proto.CopyFrom(OnnxExporter.export_tensor_proto(constant))
        return
    proto.data_type = data_type
    proto.name = constant.name
    proto.dims.extend(constant.shape)
    raw = constant.values.tobytes()
    # the array goes before protobuf copies the bytes in: two copies of the weight at the peak, not three (the
    # caller points the constant at ``proto`` next)
    constant._values = LazyValues(onnx.TensorProto(name=constant.name, data_type=data_type, dims=constant.shape))
    proto.raw_data = raw


def _copy(message):
    copy = type(message)()
    copy.CopyFrom(message)
    return copy


def rebuilt_inputs(out_inputs: list, inits: set[str], orig_inputs: list, orig_inits: dict, used_before: set[str],
                   ir_version: int) -> tuple[list | None, list]:
    """``(graph inputs in orig's order, initializers to add back)`` for :func:`onnxfuse.ir.convert.to_model`;
    ``(None, [])`` when the inputs need no change. ``used_before``: every tensor name a node of orig reads."""
    by_name = {i.name: i for i in out_inputs}
    if [i.name for i in out_inputs] == [i.name for i in orig_inputs] and ir_version >= 4:
        return None, []
    rebuilt, restored = [], []
    for vi in orig_inputs:
        if vi.name in by_name:
            rebuilt.append(by_name.pop(vi.name))
        elif vi.name in inits:
            rebuilt.append(vi)
        elif vi.name in orig_inits and vi.name not in used_before:  # unused in the input model: keep it
            rebuilt.append(vi)
            restored.append(orig_inits[vi.name])
    rebuilt.extend(by_name.values())
    return rebuilt, restored


def fix_ms_import(model: onnx.ModelProto) -> None:
    """Make ``model`` import ``com.microsoft`` exactly when a node of any of its graphs is in that domain: its own
    import of it is kept (version 1 is added when it has none) and moves after the others, which keep their
    order."""
    keep = [imp for imp in model.opset_import if imp.domain != MS_DOMAIN]
    ms = [imp for imp in model.opset_import if imp.domain == MS_DOMAIN]
    if any(n.domain == MS_DOMAIN for graph, _ in proto_graphs(model.graph) for n in graph.node):
        ms = ms or [onnx.helper.make_opsetid(MS_DOMAIN, 1)]
    else:
        ms = []
    del model.opset_import[:]
    model.opset_import.extend(keep + ms)
