"""conv_unfused: every Conv chain that stays unfused and that no fusion pass explains is listed with a reason;
the pass never rewrites.
"""

import numpy as np
import pytest

from onnxfuse.passes import PASS_NAMES
from onnxfuse.records import Reason
from onnxfuse.report.present import summary_lines
from tests.builders import GraphBuilder, skip_of
from tests.conftest import ATOL, RTOL, assert_same_outputs, op_counts

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
        result = fuse(conv_then(op), target=target, only=("conv_activation", PASS))
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


# --------------------------------------------------------------------------------------------------------------
# Written-out GELU and SiLU after a Conv: one pattern each, with what onnxruntime makes of it


def _c(b, value):
    return b.const(np.array(value, np.float32))


def gelu_erf(b, y, divide=True):
    """y * 0.5 * (1 + Erf(y / sqrt 2)) as exporters write it (torch: Div; some: Mul by 1/sqrt 2)."""
    scaled = b.op("Div", [y, _c(b, np.sqrt(2.0))]) if divide else b.op("Mul", [y, _c(b, 1 / np.sqrt(2.0))])
    one_plus = b.op("Add", [b.op("Erf", [scaled]), _c(b, 1.0)])
    return b.op("Mul", [b.op("Mul", [y, one_plus]), _c(b, 0.5)])


def gelu_tanh(b, y):
    """y * 0.5 * (1 + Tanh(sqrt(2 / pi) * (y + 0.044715 * y^3)))."""
    inner = b.op("Add", [y, b.op("Mul", [b.op("Pow", [y, _c(b, 3.0)]), _c(b, 0.044715)])])
    t = b.op("Tanh", [b.op("Mul", [inner, _c(b, np.sqrt(2 / np.pi))])])
    return b.op("Mul", [b.op("Mul", [y, _c(b, 0.5)]), b.op("Add", [t, _c(b, 1.0)])])


def silu(b, y, alpha=None):
    """y * Sigmoid(y), or y * Sigmoid(alpha * y)."""
    return b.op("Mul", [y, b.op("Sigmoid", [y if alpha is None else b.op("Mul", [y, _c(b, alpha)])])])


def conv_chain(fn, **kwargs):
    b = GraphBuilder()
    x = b.input("x", [1, 3, 8, 8])
    return b.build(fn(b, b.conv(x, 3, 4), **kwargs), opset=13)


def onnxruntime_ops(model, tmp_path, level="extended"):
    """Op counts of the graph onnxruntime (CPU) saves after optimizing ``model`` at ``level``."""
    import onnx
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                                   "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED}[level]
    so.optimized_model_filepath = str(tmp_path / f"ort_{level}.onnx")
    ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return op_counts(onnx.load(so.optimized_model_filepath))


@pytest.mark.parametrize(("fn", "kwargs", "nodes", "name", "kernel"), [
    (gelu_erf, {}, 5, "GELU (Erf form)", "Gelu"),
    (gelu_erf, {"divide": False}, 5, "GELU (Erf form)", None),
    (gelu_tanh, {}, 8, "GELU (tanh approximation)", None),
    (silu, {}, 2, "SiLU", "QuickGelu"),
    (silu, {"alpha": 1.702}, 3, "SiLU", "QuickGelu"),
], ids=["gelu-erf-div", "gelu-erf-mul", "gelu-tanh", "silu", "quick-gelu"])
def test_op_has_no_fusedconv_form_written_out_gelu_and_silu(fuse, tmp_path, fn, kwargs, nodes, name, kernel):
    # one pattern, not conv_affine's / conv_activation's intermediate-has-other-consumers for its first node (every
    # pass runs, so that any other refusal of the chain would be listed)
    import onnx

    model = conv_chain(fn, **kwargs)
    result = fuse(model, target="cpu", only=PASS_NAMES)
    onnx.checker.check_model(result.model, full_check=True)
    s = assert_listed(result, model, Reason.NO_FUSEDCONV_FORM)
    assert [(x.pass_name, x.reason) for x in result.skips] == [(PASS, Reason.NO_FUSEDCONV_FORM)]
    assert len(s.nodes) == 1 + nodes and s.nodes[0][1] == "Conv"
    assert s.output == model.graph.output[0].name
    assert name in s.detail
    assert not [line for line in summary_lines(result.report) if line.startswith("quantized:")]
    # what the detail says onnxruntime makes of it is what onnxruntime makes of it
    ort_ops = onnxruntime_ops(model, tmp_path)
    if kernel is not None:
        assert f"one com.microsoft::{kernel} kernel" in s.detail
        assert ort_ops[kernel] == 1 and ort_ops["Conv"] == 1 and len(ort_ops) == 2, ort_ops
    else:
        assert "stay" in s.detail and "kernel of it" not in s.detail
        assert not {"Gelu", "FastGelu", "QuickGelu", "BiasGelu"} & set(ort_ops), ort_ops


def test_written_out_gelu_with_another_reader_is_not_one_pattern(fuse):
    # the conv output also feeds a graph output: no unary function of it, the node-by-node reasons stay
    b = GraphBuilder()
    y = b.conv(b.input("x", [1, 3, 8, 8]), 3, 4)
    model = b.build([gelu_erf(b, y), b.op("Relu", [y])], opset=13)
    result = fuse(model, target="cpu")
    assert all(len(s.nodes) < 6 for s in result.skips)


# --------------------------------------------------------------------------------------------------------------
# QDQ models (onnxruntime's static quantizer writes DequantizeLinear -> op -> QuantizeLinear)


def qdq_model(kind):
    """x -> Q -> DQ -> Conv/Gemm/MatMul(DQ(int8 weight)[, DQ(int32 bias)]) -> Q -> DQ."""
    b = GraphBuilder()
    x = b.input("x", [1, 3, 8, 8] if kind == "Conv" else [2, 6])
    s, z = b.const(np.float32(0.05)), b.const(np.uint8(128))
    xd = b.op("DequantizeLinear", [b.op("QuantizeLinear", [x, s, z]), s, z])
    w_shape = (4, 3, 3, 3) if kind == "Conv" else (6, 5)
    w = b.op("DequantizeLinear", [b.const(b.rng.integers(-50, 50, w_shape).astype(np.int8)),
                                  b.const(np.float32(0.01)), b.const(np.int8(0))])
    bias = b.op("DequantizeLinear", [b.const(b.rng.integers(-50, 50, (w_shape[0] if kind == "Conv" else 5,))
                                             .astype(np.int32)), b.const(np.float32(0.0005)), b.const(np.int32(0))])
    attrs = {"pads": [1, 1, 1, 1]} if kind == "Conv" else {}
    y = b.op(kind, [xd, w] + ([bias] if kind != "MatMul" else []), **attrs)
    out = b.op("DequantizeLinear", [b.op("QuantizeLinear", [y, s, z]), s, z])
    return b.build(out, opset=17)


def test_quantized_conv_conv_transpose_between_q_and_dq(fuse):
    """A ConvTranspose inside a Q/DQ pattern is a conv: ``quantized-conv``, never ``quantized-gemm``."""
    b = GraphBuilder()
    model = b.build(b.dequantized(b.conv_transpose(b.dequantized(b.input("x", [1, 4, 4, 4])), 4, 2)))
    s = assert_listed(fuse(model, target="cpu"), model, Reason.QDQ)
    assert [n[1] for n in s.nodes] == ["ConvTranspose", "QuantizeLinear"]
    assert s.detail.startswith("ConvTranspose is part of a QuantizeLinear/DequantizeLinear pattern")


@pytest.mark.parametrize(("op", "kernel", "reason"), [("Conv", "QLinearConv", Reason.QDQ),
                                                      ("Gemm", "com.microsoft::QGemm", Reason.QDQ_GEMM),
                                                      ("MatMul", "QLinearMatMul", Reason.QDQ_GEMM)])
def test_quantized_conv_and_quantized_gemm_qdq_patterns_are_listed(fuse, tmp_path, op, kernel, reason):
    import onnx

    model = qdq_model(op)
    result = fuse(model, target="cpu")
    onnx.checker.check_model(result.model, full_check=True)
    assert not result.fusions
    s = assert_listed(result, model, reason)
    assert [n[1] for n in s.nodes] == [op, "QuantizeLinear"]
    assert f"one {kernel} kernel at load" in s.detail
    (line,) = [line for line in summary_lines(result.report) if line.startswith("quantized:")]
    assert line.startswith("quantized: 1 pattern inside QuantizeLinear/DequantizeLinear pairs")
    assert "QLinearConv, QGemm, QLinearMatMul" in line and "at load" in line
    ort_ops = onnxruntime_ops(model, tmp_path)
    assert ort_ops[kernel.split("::")[-1]] == 1 and op not in ort_ops, ort_ops


@pytest.mark.parametrize(("fn", "nodes"), [(silu, 2), (gelu_erf, 5)], ids=["silu", "gelu-erf"])
def test_op_has_no_fusedconv_form_written_out_activation_then_next_conv(fuse, fn, nodes):
    # as in an EfficientNet block: the activation's output feeds the next Conv, which is not part of the pattern
    import onnx

    b = GraphBuilder()
    y = b.conv(b.input("x", [1, 3, 8, 8]), 3, 4)
    model = b.build(b.op("Relu", [b.conv(fn(b, y), 4, 4)]), opset=13)
    result = fuse(model, only=("conv_activation", PASS), target="cpu")
    onnx.checker.check_model(result.model, full_check=True)
    (s,) = [x for x in result.skips if x.pass_name == PASS]
    assert s.reason == Reason.NO_FUSEDCONV_FORM and len(s.nodes) == 1 + nodes
    assert "Conv" not in [n[1] for n in s.nodes[1:]]
    assert op_counts(result.model)["FusedConv"] == 1  # the second Conv takes its Relu
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)
