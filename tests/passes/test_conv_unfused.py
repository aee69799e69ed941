"""conv_unfused: every Conv chain that stays unfused and that no fusion pass explains is listed with a reason;
the pass never rewrites.
"""

import numpy as np
import pytest

from onnxfuse.passes import Reason
from tests.builders import GraphBuilder, skip_of
from tests.conftest import op_counts

PASS = "conv_unfused"


def conv_then(op, *extra, conv="Conv", **attrs):
    """x -> Conv/ConvTranspose(3 -> 4) -> op(conv, *extra)."""
    b = GraphBuilder()
    x = b.input("x", [1, 3, 6, 6])
    y = b.conv(x, 3, 4) if conv == "Conv" else b.conv_transpose(x, 3, 4)
    inputs = [y]
    for e in extra:
        inputs.append(b.input(e[1], e[2]) if isinstance(e, tuple) else b.const(e))
    return b.build(b.op(op, inputs, **attrs))


def assert_listed(result, model, reason):
    s = skip_of(result, PASS)
    assert s.reason == reason
    assert op_counts(result.model) == op_counts(model)
    assert any(u["pass"] == PASS and u["reason"] == reason for u in result.report.unfused)
    return s


@pytest.mark.parametrize("op, extra", [("PRelu", [np.full((4, 1, 1), 0.1, np.float32)]), ("Elu", []),
                                       ("Softplus", [])])
def test_op_has_no_fusedconv_form_activation(fuse, op, extra):
    model = conv_then(op, *extra)
    s = assert_listed(fuse(model, target="cpu"), model, Reason.NO_FUSEDCONV_FORM)
    assert op in s.detail


def test_op_has_no_fusedconv_form_mul_with_run_time_operand(fuse):
    model = conv_then("Mul", ("input", "y", [1, 4, 6, 6]))
    s = assert_listed(fuse(model, target="cpu"), model, Reason.NO_FUSEDCONV_FORM)
    assert "run-time operand" in s.detail


def test_op_has_no_fusedconv_form_conv_transpose_then_relu(fuse):
    model = conv_then("Relu", conv="ConvTranspose")
    s = assert_listed(fuse(model, target="cpu"), model, Reason.NO_FUSEDCONV_FORM)
    assert "ConvTranspose" in s.detail


def test_chain_broken_by_op_transpose(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 3, 6, 6])
    nhwc = b.op("Transpose", [b.conv(x, 3, 4)], perm=[0, 2, 3, 1])
    model = b.build(b.op("Relu", [nhwc]))
    result = fuse(model, target="cpu")
    s = assert_listed(result, model, Reason.CHAIN_BROKEN)
    assert "Transpose" in s.detail and [n[1] for n in s.nodes] == ["Conv", "Transpose", "Relu"]


def test_chain_broken_by_op_lossy_cast_round_trip(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 3, 6, 6])
    half = b.op("Cast", [b.conv(x, 3, 4)], to=10)  # float16
    model = b.build(b.op("Relu", [b.op("Cast", [half], to=1)]))
    assert_listed(fuse(model, target="cpu"), model, Reason.CHAIN_BROKEN)


def test_fused_and_explained_chains_are_not_listed_again(fuse):
    # Conv -> Relu fuses; Conv -> Sigmoid on cpu+cuda is conv_activation's own refusal: nothing from this pass.
    for op, target in (("Relu", "cpu"), ("Sigmoid", "cpu+cuda")):
        result = fuse(conv_then(op), target=target)
        assert not any(s.pass_name == PASS for s in result.skips)


def test_conv_output_into_maxpool_is_not_a_chain(fuse):
    result = fuse(conv_then("MaxPool", kernel_shape=[2, 2]), target="cpu")
    assert result.skips == []


# --------------------------------------------------------------------------------------------------------------
# A per-channel constant that was not folded


def bias_from_constants(op):
    """Conv -> op(conv, Reshape(Constant b, Constant [1, 4, 1, 1]))."""
    b = GraphBuilder(constants="node")
    x = b.input("x", [1, 3, 6, 6])
    bias = b.op("Reshape", [b.const(b.rand(4)), b.const(np.array([1, 4, 1, 1], np.int64))])
    return b.build(b.op(op, [b.conv(x, 3, 4), bias]), opset=14)


def test_mul_of_unfolded_constant_is_constant_not_folded(fuse):
    model = bias_from_constants("Mul")
    result = fuse(model, target="cpu", skip=("constant_fold",))
    assert_listed(result, model, Reason.CONSTANT_NOT_FOLDED)
