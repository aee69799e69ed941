"""Graph queries and the only code that rewires onnx-graphsurgeon's edges (``Node.inputs``/``outputs``,
``Tensor.inputs``/``outputs``), so the passes stay declarative.

Assigning ``node.outputs`` re-links edges both ways, so :func:`replace_chain` detaches the old producer first.
:func:`fold_to_constants`, :func:`bypass`, :func:`replace_input` and :func:`take_over_output` are the edge
surgery of the canonicalization passes (``onnxfuse.passes.CANONICALIZE``).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx_graphsurgeon as gs


def all_graphs(graph: gs.Graph) -> Iterator[gs.Graph]:
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


class NodeOrder:
    """The node list of one graph as slots, so a rewrite moves and deletes nodes in O(1) instead of rebuilding
    the list (which made the pass loop quadratic). :meth:`compact` writes the list back to the graph, and does
    nothing when no slot changed since the last one (the driver compacts after every pass of every round, and most
    passes rewrite nothing: rebuilding the list and the positions there was a whole-graph walk per pass)."""

    def __init__(self, graph: gs.Graph):
        self.graph = graph
        self.slots: list[gs.Node | None] = list(graph.nodes)
        self.position = {id(n): i for i, n in enumerate(self.slots)}
        self.before: dict[int, list[gs.Node]] = {}
        self.changed = False  # a slot was emptied, filled or given a node before it since the last compact

    def move_and_delete(self, keep: gs.Node, last: gs.Node, removed: list[gs.Node]) -> None:
        """Put ``keep`` in ``last``'s slot and empty the slots of ``keep`` and ``removed``."""
        self.changed = True
        target = self.position[id(last)]
        for node in [keep, *removed]:
            if id(node) in self.position:
                self.slots[self.position.pop(id(node))] = None
        self.slots[target] = keep
        self.position[id(keep)] = target

    def delete(self, nodes: list[gs.Node]) -> None:
        """Empty the slots of ``nodes`` (those already deleted are ignored)."""
        self.changed = True
        for node in nodes:
            if id(node) in self.position:
                self.slots[self.position.pop(id(node))] = None

    def place(self, node: gs.Node, slot: int) -> None:
        """Put a new ``node`` into the empty ``slot`` (a slot a rewrite emptied, which :meth:`slot` returned
        before)."""
        held = self.slots[slot]
        if held is not None:
            raise ValueError(f"slot {slot} holds {held.name}")
        self.changed = True
        self.slots[slot] = node
        self.position[id(node)] = slot

    def insert_before(self, node: gs.Node, slot: int) -> None:
        """Put a new ``node`` just before whatever ``slot`` holds, when the list is next written back
        (:meth:`compact`): a rewrite that makes more nodes than it removes (a Reshape before a Gemm). Until then
        ``node`` has no slot of its own, so no rewrite may move or delete it before :meth:`compact`."""
        self.changed = True
        self.before.setdefault(slot, []).append(node)

    def slot(self, node: gs.Node) -> int:
        """The slot that ``node`` is in now."""
        return self.position[id(node)]

    def compact(self) -> None:
        """Give the graph its node list back, in slot order (nothing to do when no slot changed)."""
        if not self.changed:
            return
        nodes: list[gs.Node] = []
        for i, n in enumerate(self.slots):
            nodes.extend(self.before.get(i, ()))
            if n is not None:
                nodes.append(n)
        self.graph.nodes = nodes
        self.before = {}
        self.changed = False
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


def add_around(order: NodeOrder, first: list[gs.Node], last: list[gs.Node]) -> None:
    """Put the new nodes ``first`` before every node of ``order``'s graph and ``last`` after every one (Casts at the
    graph's inputs and outputs), writing the graph's node list back (:meth:`NodeOrder.compact`)."""
    order.compact()
    order.graph.nodes = [*first, *order.graph.nodes, *last]
    order.slots = list(order.graph.nodes)
    order.position = {id(n): i for i, n in enumerate(order.slots)}
