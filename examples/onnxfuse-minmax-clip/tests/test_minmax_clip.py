"""The example plugin's own tests: it fuses its pattern in a small model, the result is verified by onnxfuse, and
the deliberately wrong variant is caught by that verification. Run from this folder with ``python -m pytest``
(onnxfuse installed, and this package: ``pip install -e .``, or ``src`` on ``PYTHONPATH``)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxfuse_minmax_clip import MinMaxClip
from onnxfuse_minmax_clip.wrong import ForgetsUpperBound

import onnxfuse
from onnxfuse.errors import VerificationError


@pytest.fixture(autouse=True)
def only_the_plugins_named(monkeypatch):
    """Installed plugins (this package itself, once ``pip install -e .``) not loaded: each test names the plugins
    it runs, so the wrong variant is not preceded by the right one."""
    monkeypatch.setenv("ONNXFUSE_DISABLE_PLUGIN_AUTOLOAD", "1")


def relu6_model(lo: float = 0.0, hi: float = 6.0, bound_shape: tuple[int, ...] = (), opset: int = 17,
                max_first: bool = True, extra_output: bool = False) -> onnx.ModelProto:
    """x [1, 3, 8, 8] -> Conv (weights 1, bias 0: on standard-normal inputs, outputs of standard deviation about 5, so
    below 0 and above 6 in many places) -> Max(., lo) -> Min(., hi)
    (or Min first, then Max)."""
    inits = [numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w"),
             numpy_helper.from_array(np.zeros(4, np.float32), "b"),
             numpy_helper.from_array(np.full(bound_shape, lo, np.float32), "lo"),
             numpy_helper.from_array(np.full(bound_shape, hi, np.float32), "hi")]
    first, second = (("Max", "lo"), ("Min", "hi")) if max_first else (("Min", "hi"), ("Max", "lo"))
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node(first[0], ["c", first[1]], ["m"], name="inner"),
             helper.make_node(second[0], ["m", second[1]], ["y"], name="outer")]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if extra_output:
        outputs.append(helper.make_tensor_value_info("m", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "relu6", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    inferred = onnx.shape_inference.infer_shapes(model)
    del model.graph.output[:]
    model.graph.output.extend(o for o in inferred.graph.output)
    return model


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


@pytest.mark.parametrize("max_first", [True, False])
def test_fuses_into_clip_and_then_fused_conv(max_first):
    result = onnxfuse.optimize(relu6_model(max_first=max_first), target="cpu", plugins=[MinMaxClip])
    assert result.verification.status == "passed"
    assert _ops(result.model) == ["FusedConv"]
    node = result.model.graph.node[0]
    assert [a.s for a in node.attribute if a.name == "activation"] == [b"Clip"]
    assert [f.pass_name for f in result.fusions] == ["minmax_clip", "conv_activation"]


def test_onnx_target_keeps_a_plain_clip():
    result = onnxfuse.optimize(relu6_model(), target="onnx", plugins=[MinMaxClip])
    assert result.verification.status == "passed"
    assert _ops(result.model) == ["Conv", "Clip"]


def test_wrong_variant_is_caught_by_verification():
    with pytest.raises(VerificationError, match="does not match"):
        onnxfuse.optimize(relu6_model(), target="onnx", plugins=[ForgetsUpperBound])


def _declined(model: onnx.ModelProto, reason: str) -> None:
    result = onnxfuse.optimize(model, target="onnx", plugins=[MinMaxClip])
    assert "Clip" not in _ops(result.model)
    assert [s.reason for s in result.skips if s.pass_name == "minmax_clip"] == [reason]


def test_skip_intermediate_is_graph_output():
    _declined(relu6_model(extra_output=True), "intermediate-is-graph-output")


def test_skip_intermediate_has_other_consumers():
    model = relu6_model()
    model.graph.node.append(helper.make_node("Neg", ["m"], ["n"], name="neg"))
    model.graph.output.append(helper.make_tensor_value_info("n", TensorProto.FLOAT, [1, 4, 8, 8]))
    _declined(model, "intermediate-has-other-consumers")


def test_skip_clip_bounds_not_constant():
    model = relu6_model()
    model.graph.input.append(helper.make_tensor_value_info("hi_in", TensorProto.FLOAT, []))
    model.graph.node[2].input[1] = "hi_in"
    _declined(model, "clip-bounds-not-constant")


@pytest.mark.parametrize("model", [relu6_model(lo=7.0, hi=6.0), relu6_model(bound_shape=(8,)),
                                   relu6_model(bound_shape=(1, 1, 1, 1, 1)), relu6_model(opset=10)],
                         ids=["lo-above-hi", "eight-values", "more-dims", "opset-10"])
def test_skip_declined_by_plugin(model):
    _declined(model, "declined-by-plugin")
