"""Graph inputs of a floating-point type whose values a model uses as indices: text and token models that take
character or token ids as floats and turn them into indices with ``Cast`` (a float input cannot be an index
operand itself: ONNX Gather's ``indices`` are int32/int64, Operators.md "Gather").

Verification's random inputs are normal floats in about [-3, 3]: cast to integers they are 0 for most elements
(``Cast`` truncates toward zero), so every input set would read the same row of an embedding table and a wrong
rewrite of the other rows would pass. :func:`float_index_inputs` finds such inputs and the number of valid
indices, so that their random values are integers in ``[0, that number)`` instead
(``onnxfuse.ort.sessions.InputSpec.index_highs``).
"""

from __future__ import annotations

import onnx
from onnx import TensorProto

from onnxfuse.model.domains import is_default_domain

#: Ops a float input may pass through on its way to an index operand: its values stay whole numbers (or become
#: them) and keep their meaning as indices (ONNX Operators.md: Cast, Floor, Ceil, Round, and the ops that only
#: move elements).
PASS_THROUGH = frozenset({"Cast", "Floor", "Ceil", "Round", "Identity", "Reshape", "Squeeze", "Unsqueeze",
                          "Flatten", "Transpose"})

#: Index operands: op type -> (input position of the indices, input position of the tensor indexed or None).
INDEX_OPERANDS = {"Gather": (1, 0), "GatherElements": (1, 0), "GatherND": (1, 0), "OneHot": (0, None)}

#: The bound used where the size of the indexed axis is not known from a constant: small enough to be a valid
#: index of any non-empty axis of that size or more (``onnxfuse.ort.sessions.RANDOM_INT_HIGH`` is the same).
FALLBACK_HIGH = 4

_FLOATS = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16}


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
    for a in node.attribute:
        if a.name == name:
            return int(a.i)
    return default


def float_index_inputs(model: onnx.ModelProto) -> dict[str, int]:
    """Floating-point graph inputs of the main graph (initializers excluded) that reach an index operand
    (:data:`INDEX_OPERANDS`) through :data:`PASS_THROUGH` ops only, each with the exclusive upper bound of the
    indices drawn for it: the size of the indexed axis where the indexed tensor is an initializer (Gather and
    GatherElements: ``axis``, GatherND: the first axis), OneHot's ``depth`` where it is an initializer, else
    :data:`FALLBACK_HIGH`; the smallest bound where an input reaches several operands. Reads the graph only."""
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in g.node:
        for i in node.input:
            consumers.setdefault(i, []).append(node)
    out: dict[str, int] = {}
    for vi in g.input:
        if vi.name in inits or vi.type.tensor_type.elem_type not in _FLOATS:
            continue
        todo, seen = [vi.name], set()
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            for node in consumers.get(name, []):
                if not is_default_domain(node.domain):
                    continue
                where = INDEX_OPERANDS.get(node.op_type)
                if where is not None and len(node.input) > where[0] and node.input[where[0]] == name:
                    high = _bound(node, where[1], inits)
                    out[vi.name] = min(out.get(vi.name, high), high)
                elif node.op_type in PASS_THROUGH and node.input and node.input[0] == name and node.output:
                    todo.append(node.output[0])
    return out


def _bound(node: onnx.NodeProto, indexed: int | None, inits: dict[str, TensorProto]) -> int:
    if indexed is None:  # OneHot: depth, a scalar or one-element initializer
        depth = inits.get(node.input[1]) if len(node.input) > 1 else None
        if depth is not None:
            value = onnx.numpy_helper.to_array(depth).reshape(-1)
            if value.size == 1 and int(value[0]) > 0:
                return int(value[0])
        return FALLBACK_HIGH
    data = inits.get(node.input[indexed])
    if data is None or not data.dims:
        return FALLBACK_HIGH
    axis = 0 if node.op_type == "GatherND" else _attr(node, "axis", 0)
    axis = axis + len(data.dims) if axis < 0 else axis
    return int(data.dims[axis]) if 0 <= axis < len(data.dims) and data.dims[axis] > 0 else FALLBACK_HIGH
