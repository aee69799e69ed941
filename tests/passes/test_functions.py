"""Model-local functions (ModelProto.functions): a pattern in a function body is named (inside-model-function) and
left as it is; the main graph around it is optimized as usual, and nothing in the body stands for a main-graph
tensor of the same name.

Numerics: original and optimized run in onnxruntime at ORT_DISABLE_ALL (conftest.assert_same_outputs) with
rtol=1e-4, atol=1e-5 (conftest.RTOL/ATOL): the body is not rewritten, the main graph's Conv + BN is folded.
"""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxfuse.records import Reason
from tests.conftest import ATOL, RTOL, assert_same_outputs, op_counts

RNG = np.random.default_rng(0)


def _const(name, array):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array.astype(np.float32), name))


def _conv_bn(x, out, prefix):
    """Conv(3 -> 4, 3x3, pads 1) -> BatchNormalization -> Relu from ``x`` to ``out``, weights in Constant nodes."""
    w, c = f"{prefix}w", f"{prefix}c"
    params = [f"{prefix}{p}" for p in "sbmv"]
    return [
        _const(w, RNG.standard_normal((4, 3, 3, 3))),
        helper.make_node("Conv", [x, w], [c], pads=[1, 1, 1, 1]),
        _const(params[0], RNG.uniform(0.5, 1.5, 4)), _const(params[1], RNG.standard_normal(4)),
        _const(params[2], RNG.standard_normal(4)), _const(params[3], RNG.uniform(0.5, 1.5, 4)),
        helper.make_node("BatchNormalization", [c, *params], [f"{prefix}bn"]),
        helper.make_node("Relu", [f"{prefix}bn"], [out]),
    ]


def model_with_function():
    """x -> Conv+BN+Relu (main graph) -> t -> local::Block (Conv+BN+Relu in its body, whose tensors reuse the main
    graph's names x, w, c, ...) -> y."""
    body = [helper.make_node("Conv", ["x", "k"], ["x3"], pads=[0, 0, 0, 0])]  # 4 -> 3 channels, 1x1
    body.insert(0, _const("k", RNG.standard_normal((3, 4, 1, 1))))
    body += _conv_bn("x3", "y", "")
    fn = helper.make_function("local", "Block", ["x"], ["y"], body, [helper.make_opsetid("", 17)])
    main = _conv_bn("x", "t", "")  # the same names as in the body
    main.append(helper.make_node("Block", ["t"], ["y"], domain="local"))
    graph = helper.make_graph(main, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)],
                              functions=[fn])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def test_skip_inside_model_function(fuse):
    model = model_with_function()
    result = fuse(model, target="cpu")
    onnx.checker.check_model(result.model, full_check=True)
    # the body is left exactly as it was
    assert [f.SerializeToString() for f in result.model.functions] == [f.SerializeToString() for f in model.functions]
    # the main graph's Conv + BN + Relu is one FusedConv; the call stays
    assert op_counts(result.model) == {"FusedConv": 1, "Block": 1}, op_counts(result.model)
    inside = [s for s in result.skips if s.reason == Reason.IN_FUNCTION]
    assert {s.pass_name for s in inside} == {"conv_batchnorm"}
    (s,) = inside
    assert "local::Block" in s.detail
    assert s.output == "local::Block/bn" and all(o.startswith("local::Block/") for _, _, o in s.nodes)
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_the_report_names_the_function_pattern_once(fuse):
    model = model_with_function()
    result = fuse(model, target="cpu")
    rows = [r for r in result.report.unfused if r["reason"] == Reason.IN_FUNCTION]
    assert len(rows) == 1 and rows[0]["bytes"] is None  # sizes in a body are not known: never a main-graph size
