"""Input hygiene applied when a model is loaded: what exporters write that onnxruntime accepts but onnx.checker or
onnxfuse's own shape handling would refuse. Each function edits the ModelProto in place and says what it did.

* :func:`sort_topologically`: nodes listed out of execution order (onnx.checker: "Nodes in a graph must be
  topologically sorted"; onnxruntime sorts them itself at load).
* :func:`negative_dims_to_symbolic`: a dim stored as ``dim_value: -1`` (paddle2onnx writes dynamic dims this
  way). ONNX IR.md says a dim is a non-negative ``dim_value`` or a ``dim_param``; onnxruntime treats -1 as
  dynamic, and so does onnxfuse: the dim becomes unknown, and ``--input-shape`` can fix it.
* :func:`list_ir3_initializers`: an IR 3 model whose initializers are not all listed as graph inputs.
* :func:`type_untyped_outputs`: a graph output without a type or a shape.
"""

from __future__ import annotations

import heapq

import onnx


def _subgraphs(node: onnx.NodeProto):
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


def all_graphs(model: onnx.ModelProto):
    """Every graph of ``model``: the main graph, then the bodies of If/Loop/Scan nodes, nested ones included."""
    todo = [model.graph]
    while todo:
        graph = todo.pop()
        yield graph
        for node in graph.node:
            todo.extend(_subgraphs(node))


def _free_names(graph: onnx.GraphProto) -> set[str]:
    """Names a subgraph reads from enclosing scopes (used by its nodes or nested bodies, defined nowhere in it)."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    used: set[str] = set()
    for node in graph.node:
        defined.update(o for o in node.output if o)
        used.update(i for i in node.input if i)
        for sub in _subgraphs(node):
            used |= _free_names(sub)
    used.update(o.name for o in graph.output)
    return used - defined


def _sort_graph(graph: onnx.GraphProto) -> int:
    """Stable topological sort of one graph's nodes (Kahn's algorithm, lowest original index first, so a sorted
    graph keeps its order). Returns how many nodes changed position. Nodes in a cycle keep their relative order
    at the end (onnx.checker then still rejects the model)."""
    nodes = list(graph.node)
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    deps: list[set[int]] = []
    for i, n in enumerate(nodes):
        names = {x for x in n.input if x}
        for sub in _subgraphs(n):
            names |= _free_names(sub)
        deps.append({producer[x] for x in names if x in producer and producer[x] != i})
    readers: list[list[int]] = [[] for _ in nodes]
    for i, d in enumerate(deps):
        for j in d:
            readers[j].append(i)
    waiting = [len(d) for d in deps]
    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for r in readers[i]:
            waiting[r] -= 1
            if waiting[r] == 0:
                heapq.heappush(ready, r)
    placed = set(order)
    order += [i for i in range(len(nodes)) if i not in placed]
    moved = sum(1 for pos, i in enumerate(order) if pos != i)
    if moved:
        del graph.node[:]
        graph.node.extend(nodes[i] for i in order)
    return moved


def sort_topologically(model: onnx.ModelProto) -> int:
    """Sort the nodes of every graph of ``model`` (subgraph bodies included) into execution order in place;
    return how many nodes moved (0: already sorted, the proto is untouched)."""
    moved = 0
    todo = [model.graph]
    while todo:
        graph = todo.pop()
        moved += _sort_graph(graph)
        for node in graph.node:
            todo.extend(_subgraphs(node))
    return moved


def negative_dims_to_symbolic(model: onnx.ModelProto) -> int:
    """Make every dim stored as a negative ``dim_value`` in the main graph's inputs, outputs and value_info an
    unknown dim; return how many changed."""
    changed = 0
    g = model.graph
    for vi in (*g.input, *g.output, *g.value_info):
        if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
            continue
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_value") and d.dim_value < 0:
                d.ClearField("dim_value")
                changed += 1
    return changed


def list_ir3_initializers(model: onnx.ModelProto) -> list[str]:
    """Below IR version 4 every initializer must also be a graph input (ONNX IR.md, "Graphs"; onnx.checker: "X in
    initializer but not in graph input"); onnxruntime loads a model that lists only some. Add a graph input, typed
    and shaped as the initializer, for each main-graph initializer that is not listed; return their names. They
    are constants either way (below IR 4 onnxruntime never lets a caller override an initializer:
    ``Graph::CanOverrideInitializer``, ``onnxruntime/core/graph/graph.h``)."""
    if model.ir_version >= 4:
        return []
    g = model.graph
    listed = {i.name for i in g.input}
    missing = [t for t in g.initializer if t.name not in listed]
    g.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in missing)
    return [t.name for t in missing]


def _lacks_tensor_type(vi: onnx.ValueInfoProto) -> bool:
    """True when ``vi`` has no type, or a tensor type without an element type or a shape (what onnx.checker
    requires of a graph input or output: "Field 'shape' of 'type' is required but missing")."""
    if not vi.HasField("type"):
        return True
    if vi.type.WhichOneof("value") != "tensor_type":
        return False
    tt = vi.type.tensor_type
    return not tt.elem_type or not tt.HasField("shape")


def type_untyped_outputs(model: onnx.ModelProto, inferred: onnx.ModelProto | None) -> tuple[list[str], list[str]]:
    """Give each main-graph output that has no type, no element type or no shape (onnxruntime loads such a
    model: it infers them) the type and shape that ``inferred`` (onnx shape inference of ``model``, or of its
    weight-free skeleton) gives it, or, for an initializer that is a graph output (which shape inference does not
    list), the initializer's own dtype and dims; a declared element type is kept. Returns ``(outputs typed,
    outputs left as they were: inference gave no shape)``."""
    lacking = [vi for vi in model.graph.output if _lacks_tensor_type(vi)]
    if not lacking:
        return [], []
    known: dict[str, onnx.TypeProto] = {}
    if inferred is not None:
        for vi in (*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input):
            tt = vi.type.tensor_type
            if vi.type.WhichOneof("value") == "tensor_type" and tt.elem_type and tt.HasField("shape"):
                known.setdefault(vi.name, vi.type)
    for t in model.graph.initializer:  # an initializer that is a graph output: its type is its own (IR.md)
        known.setdefault(t.name, onnx.helper.make_tensor_type_proto(t.data_type, list(t.dims)))
    typed, left = [], []
    for vi in lacking:
        got = known.get(vi.name)
        if got is None:
            left.append(vi.name)
            continue
        declared = vi.type.tensor_type if vi.HasField("type") else None
        vi.type.CopyFrom(got)
        if declared is not None and declared.elem_type and declared.elem_type != got.tensor_type.elem_type:
            vi.type.tensor_type.elem_type = declared.elem_type  # keep what the model says; the checker judges
        typed.append(vi.name)
    return typed, left
