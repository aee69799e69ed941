"""Whether the CPU execution provider of the installed onnxruntime has a float16 kernel for an op.

onnxruntime runs a float16 node that its provider has no float16 kernel for in float32, between Casts that it
inserts when the session is made (``core/optimizer/insert_cast_transformer.cc``, which runs at every graph
optimization level, ORT_DISABLE_ALL included). A one-node float16 model of the op, saved as onnxruntime optimized
it at ORT_DISABLE_ALL, therefore holds Cast nodes exactly when there is no such kernel. The answer depends on the
onnxruntime build and the processor (MLAS has float16 Conv kernels on ARM64 with fp16 arithmetic, none on x86), so
it is asked, once per process and op, never assumed.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: One-node float16 probe models: op -> (inputs' shapes, the node's attributes). Weights are initializers.
_PROBES: dict[str, tuple[tuple[tuple[int, ...], ...], dict]] = {
    "Conv": (((1, 4, 6, 6), (4, 4, 3, 3), (4,)), {"pads": [1, 1, 1, 1]}),
    "ConvTranspose": (((1, 4, 6, 6), (4, 4, 2, 2), (4,)), {"strides": [2, 2]}),
    "Gemm": (((2, 4), (4, 3), (3,)), {}),
    "MatMul": (((2, 4), (4, 3)), {}),
}

#: The ops :func:`has_float16_kernel` can probe.
PROBED_OPS = tuple(_PROBES)


def _probe_model(op: str) -> onnx.ModelProto:
    shapes, attrs = _PROBES[op]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, list(shapes[0]))
    inits = [numpy_helper.from_array(np.full(s, 0.5, np.float16), f"w{i}") for i, s in enumerate(shapes[1:])]
    node = helper.make_node(op, ["x", *(t.name for t in inits)], ["y"], **attrs)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)
    graph = helper.make_graph([node], "probe", [x], [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@functools.cache
def has_float16_kernel(op: str) -> bool:
    """True when the installed onnxruntime's CPU execution provider runs a float16 ``op`` (one of
    :data:`PROBED_OPS`) with a float16 kernel, False when it wraps the node in Casts to float32 (see the module
    docstring). True, the cautious answer, when onnxruntime cannot load the probe.

    Raises:
        KeyError: ``op`` is not one of :data:`PROBED_OPS`.
    """
    from onnxfuse.ort.optimized_graph import _optimized_graph

    model = _probe_model(op)
    try:
        graph = _optimized_graph(model.SerializeToString(), "disable")
    except Exception:  # onnxruntime raises its own exception types
        return True
    return not any(n.op_type == "Cast" for n in graph.graph.node)
