"""prelu_leaky_relu: PRelu(X, constant slope of one value a) => LeakyRelu(X, alpha=a).

Numerics: original and optimized run in onnxruntime at ORT_DISABLE_ALL (conftest.assert_same_outputs) with
rtol=0, atol=0: the rewrite is exact (the same float32 product a * x on the negative side, x itself elsewhere).
"""

import numpy as np
import onnx
import pytest

from onnxfuse.records import Reason
from tests.builders import GraphBuilder
from tests.conftest import assert_same_outputs, assert_skipped, attr, op_counts, slower_at

PASS = "prelu_leaky_relu"


def conv_prelu(slope, x_shape=(1, 3, 8, 8), slope_as_input=False, dtype=np.float32, conv=True):
    """x -> Conv(3 -> 4, 3x3) -> PRelu(slope) (no Conv with ``conv=False``: PRelu reads x)."""
    b = GraphBuilder(dtype=dtype)
    x = b.input("x", list(x_shape))
    y = b.conv(x, x_shape[1], 4) if conv else x
    s = b.input("slope", list(np.shape(slope))) if slope_as_input else b.const(np.asarray(slope, dtype))
    return b.build(b.op("PRelu", [y, s]))


def the_op(model, op):
    (node,) = [n for n in model.graph.node if n.op_type == op]
    return node


@pytest.mark.parametrize("slope_shape", [(), (1,), (4, 1, 1), (1, 4, 1, 1), (1, 1, 1)])
def test_uniform_slope_becomes_leaky_relu(fuse, slope_shape):
    model = conv_prelu(np.full(slope_shape, 0.25, np.float32))
    result = fuse(model)
    assert op_counts(result.model) == {"Conv": 1, "LeakyRelu": 1}
    assert attr(the_op(result.model, "LeakyRelu"), "alpha") == pytest.approx(0.25)
    assert len(result.model.graph.initializer) == 2  # the Conv's W and B; the slope is gone
    onnx.checker.check_model(result.model, full_check=True)
    assert_same_outputs(model, result.model, rtol=0, atol=0)


def test_slope_value_kept_bit_for_bit(fuse):
    a = np.float32(0.1234567)  # not a round number: the attribute must be the same float32
    model = conv_prelu(np.full((4, 1, 1), a, np.float32))
    result = fuse(model)
    assert np.float32(attr(the_op(result.model, "LeakyRelu"), "alpha")) == a
    assert_same_outputs(model, result.model, rtol=0, atol=0)


def test_negative_and_large_slopes_are_exact(fuse):
    for value in (-0.5, 3.0, 0.0):
        model = conv_prelu(np.full((1,), value, np.float32))
        result = fuse(model)
        assert op_counts(result.model) == {"Conv": 1, "LeakyRelu": 1}
        assert_same_outputs(model, result.model, rtol=0, atol=0)


def test_then_the_conv_fuses_on_cpu(fuse):
    model = conv_prelu(np.full((4, 1, 1), 0.2, np.float32))
    result = fuse(model, only=(PASS, "conv_activation"), target="cpu")
    assert op_counts(result.model) == {"FusedConv": 1}
    fused = the_op(result.model, "FusedConv")
    assert attr(fused, "activation") == b"LeakyRelu"
    assert attr(fused, "activation_params") == [pytest.approx(0.2)]
    assert_same_outputs(model, result.model)


def test_prelu_without_a_conv_and_a_symbolic_batch(fuse):
    model = conv_prelu(np.full((3, 1, 1), 0.3, np.float32), x_shape=("N", 3, 5, 5), conv=False)
    result = fuse(model, target="onnx")
    assert op_counts(result.model) == {"LeakyRelu": 1}
    assert_same_outputs(model, result.model, rtol=0, atol=0)


def test_report_counts_no_removed_node(fuse):
    from onnxfuse.report.model import removed_outputs

    result = fuse(conv_prelu(np.full((1,), 0.25, np.float32)))
    (f,) = result.fusions
    assert (f.op, f.replaced[0][1]) == ("LeakyRelu", "PRelu")
    assert removed_outputs(f) == []


# ----------------------------------------------------------------------------------------------------------------
# Refusals


def test_skip_prelu_slope_not_uniform(fuse):
    model = conv_prelu(np.array([0.1, 0.2, 0.1, 0.1], np.float32).reshape(4, 1, 1))
    s = assert_skipped(fuse(model), model, Reason.PRELU_NOT_UNIFORM, PASS)
    assert "2 distinct values" in s.detail


def test_skip_prelu_slope_not_uniform_nan(fuse):
    model = conv_prelu(np.full((1,), np.nan, np.float32))
    assert_skipped(fuse(model), model, Reason.PRELU_NOT_UNIFORM, PASS)


def test_skip_parameters_not_constant(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 3, 8, 8])
    s = b.op("Abs", [b.input("s", [1])])
    model = b.build(b.op("PRelu", [b.conv(x, 3, 4), s]))
    assert_skipped(fuse(model), model, Reason.PARAMS_NOT_CONSTANT, PASS)


def test_skip_initializer_is_graph_input(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 3, 8, 8])
    s = b.const(np.full((1,), 0.25, np.float32), name="slope")
    model = b.build(b.op("PRelu", [b.conv(x, 3, 4), s]), initializers_as_inputs=True)
    assert_skipped(fuse(model), model, Reason.INITIALIZER_IS_INPUT, PASS)


def test_skip_prelu_slope_shape_more_axes_than_x(fuse):
    # a [1, 1, 1, 1, 1] slope would give a rank-5 output if broadcast both ways: refused, not guessed
    b = GraphBuilder()
    x = b.input("x", [1, 3, 8, 8])
    model = b.build(b.op("PRelu", [b.conv(x, 3, 4), b.const(np.full((1, 1, 1, 1, 1), 0.25, np.float32))]))
    s = assert_skipped(fuse(model), model, Reason.PRELU_SLOPE_SHAPE, PASS)
    assert "more axes" in s.detail


def test_skip_prelu_slope_shape_unknown_rank(fuse):
    # X's rank is not known (a Reshape to a shape of run-time length): a [1, 1, 1] slope could grow X, so no guess
    b = GraphBuilder()
    x = b.op("Reshape", [b.input("x", [1, 3, 8, 8]), b.input("shape", ["k"], np.int64)])
    model = b.model(b.op("PRelu", [x, b.const(np.full((1, 1, 1), 0.25, np.float32))]))
    model.graph.output[0].CopyFrom(onnx.helper.make_tensor_value_info(model.graph.output[0].name,
                                                                      onnx.TensorProto.FLOAT, ["a", "b", "c", "d"]))
    assert_skipped(fuse(model), model, Reason.PRELU_SLOPE_SHAPE, PASS)


def test_skip_prelu_dtype_not_float32(fuse):
    model = conv_prelu(np.full((1,), 0.25), dtype=np.float16, conv=False)
    s = assert_skipped(fuse(model), model, Reason.PRELU_DTYPE, PASS)
    assert "float16" in s.detail


def test_skip_slower_than_unfused_at_ort_level(fuse, monkeypatch):
    """A speed rule for the form (``providers.CPU_SLOWER_AT``; none is measured today, BENCHMARKS.md) refuses it at
    that level and no other."""
    form = slower_at(monkeypatch, PASS, "all")
    model = conv_prelu(np.full((4, 1, 1), 0.25, np.float32))
    s = assert_skipped(fuse(model, ort_level="all"), model, Reason.SLOWER_AT_ORT_LEVEL, PASS)
    assert form in s.detail and "level all" in s.detail
    assert any(f.pass_name == PASS for f in fuse(model, ort_level="extended").fusions)
