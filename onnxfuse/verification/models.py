"""What verification reads from or changes in a model's graph: the model as given (path, bytes or ModelProto), the
ops that draw random numbers, and the copy whose accumulating weights are moved by one unit in the last place."""

from __future__ import annotations

import os

import numpy as np
import onnx

#: Nodes that sum many products: their weights are what a fold rounds (see ``rounding_floor``).
ACCUMULATING_OPS = frozenset({"Conv", "ConvTranspose", "FusedConv", "Gemm", "MatMul", "FusedMatMul", "Einsum",
                              "LSTM", "GRU", "RNN", "Attention", "MultiHeadAttention"})

#: A model as verification takes it: a path, serialized bytes, or a ModelProto.
Model = str | os.PathLike | bytes | onnx.ModelProto

#: Ops whose outputs differ from run to run (ONNX Operators.md: the Random* ops draw anew on every run without a
#: seed; Multinomial, Bernoulli; Dropout in training mode masks at random).
RANDOM_OPS = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial",
                        "Bernoulli"})


def graph_only(model: Model) -> onnx.ModelProto:
    """``model`` as a ModelProto to look at its graph: itself, parsed bytes, or a file read without its external
    data (an unreadable one: an empty model, the runs report it)."""
    if isinstance(model, onnx.ModelProto):
        return model
    try:
        if isinstance(model, bytes):
            return onnx.load_model_from_string(model)
        return onnx.load_model(str(model), load_external_data=False)
    except Exception:  # the onnxruntime sessions say why the model cannot be read
        return onnx.ModelProto()


def random_ops(model: onnx.ModelProto) -> list[str]:
    """The ops of ``model`` (every graph) that draw random numbers on each run: :data:`RANDOM_OPS` without a
    ``seed`` attribute, and Dropout whose ``training_mode`` input is present and not a constant false. Sorted,
    each once."""
    from onnxfuse.model.proto import proto_graphs

    found = set()
    for graph, _ in proto_graphs(model.graph):
        constants = {t.name: t for t in graph.initializer}
        constants.update({n.output[0]: a.t for n in graph.node if n.op_type == "Constant" for a in n.attribute
                          if a.name == "value"})
        for node in graph.node:
            if node.op_type in RANDOM_OPS and not any(a.name == "seed" for a in node.attribute):
                found.add(node.op_type)
            elif node.op_type == "Dropout" and len(node.input) > 2 and node.input[2]:
                mode = constants.get(node.input[2])
                if mode is None or bool(onnx.numpy_helper.to_array(mode).any()):
                    found.add("Dropout in training mode")
    return sorted(found)


def proto(model: Model) -> onnx.ModelProto:
    """``model`` as a ModelProto with its weights: itself, parsed bytes, or the file loaded with its external data."""
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, bytes):
        return onnx.load_model_from_string(model)
    return onnx.load(str(model))


def weights_moved_by_one_ulp(model: onnx.ModelProto, seed: int = 0, in_place: bool = False) -> onnx.ModelProto:
    """A copy of ``model`` in which every floating-point constant weight (initializer or ``Constant`` node) read as
    input 1 of an :data:`ACCUMULATING_OPS` node has each element moved to its float neighbour (numpy.nextafter)
    up or down at random (seeded): the rounding a fold makes when it computes ``W * s`` in the weights' dtype.
    ``in_place``: move them in ``model`` itself and return it (no copy of the whole model)."""
    from onnx import numpy_helper

    from onnxfuse.model.proto import proto_graphs

    out = model if in_place else onnx.ModelProto()
    if not in_place:
        out.CopyFrom(model)
    rng = np.random.default_rng(seed)
    weights = {n.input[1] for graph, _ in proto_graphs(out.graph) for n in graph.node
               if n.op_type in ACCUMULATING_OPS and len(n.input) > 1}

    def moved(t: onnx.TensorProto) -> onnx.TensorProto | None:
        a = numpy_helper.to_array(t)
        if not np.issubdtype(a.dtype, np.floating):
            return None
        up = rng.integers(0, 2, a.shape).astype(bool)
        # one nextafter towards +inf or -inf per element: the same values as both directions then a choice
        towards = np.where(up, np.array(np.inf, a.dtype), np.array(-np.inf, a.dtype))
        with np.errstate(over="ignore"):  # the largest finite value moved up is inf, as the rule intends
            b = np.nextafter(a, towards, out=towards)
        return numpy_helper.from_array(b.astype(a.dtype, copy=False), t.name)

    for graph, _ in proto_graphs(out.graph):
        for t in graph.initializer:
            if t.name in weights and (new := moved(t)) is not None:
                t.CopyFrom(new)
        for node in graph.node:
            if node.op_type == "Constant" and node.output and node.output[0] in weights:
                attr = next((a for a in node.attribute if a.name == "value"), None)
                if attr is not None and (new := moved(attr.t)) is not None:
                    attr.t.CopyFrom(new)
    return out

