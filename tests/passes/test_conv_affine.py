"""conv_affine: Conv/ConvTranspose -> Add/Sub/Mul/Div by a per-output-channel constant => Conv with folded W, B.

Numerics: original and optimized run in onnxruntime at ORT_DISABLE_ALL (conftest.assert_same_outputs) with
rtol=1e-4, atol=1e-5 (conftest.RTOL/ATOL) for float32; rtol=atol=1e-2 for float16 (W' rounded to float16).
The conv output is [1, M=4, 6, 4]: its last axis has M elements too, so an [M] constant broadcasts (along W).
"""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxfuse.records import Reason
from tests.builders import GraphBuilder, compact_weight, tensor, with_output_shapes
from tests.conftest import ATOL, RTOL, assert_same_outputs, op_counts
from tests.conftest import assert_skipped as check_skipped

PASS = "conv_affine"
M = 4
FP16_TOL = 1e-2


def conv_op(op, c_shape=(1, M, 1, 1), conv_first=True, bias=True, value=None, constants="initializer",
            dtype=np.float32, **build_args):
    """x -> Conv(3 -> M) -> op(conv, c) (or op(c, conv)); c is ``value`` or random in [0.5, 1.5)."""
    b = GraphBuilder(constants=constants, dtype=dtype)
    x = b.input("x", [1, 3, 6, 4])
    conv = b.conv(x, 3, M, bias=bias)
    c = b.const(np.asarray(value if value is not None else b.rng.uniform(0.5, 1.5, c_shape), dtype=dtype))
    y = b.op(op, [conv, c] if conv_first else [c, conv])
    return b.build(y, **build_args), b


def the_conv(model):
    (conv,) = [n for n in model.graph.node if n.op_type in ("Conv", "ConvTranspose")]
    return conv


# --------------------------------------------------------------------------------------------------------------
# Positives


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("bias", [True, False])
def test_folds_conv_first(fuse, op, bias):
    model, _ = conv_op(op, bias=bias)
    result = fuse(model)
    assert op_counts(result.model) == {"Conv": 1}
    assert [f.pass_name for f in result.fusions] == [PASS]
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul"])
@pytest.mark.parametrize("bias", [True, False])
def test_folds_constant_first(fuse, op, bias):
    model, _ = conv_op(op, conv_first=False, bias=bias)
    result = fuse(model)
    assert op_counts(result.model) == {"Conv": 1}
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_sub_constant_minus_conv_negates_weight(fuse):
    model, _ = conv_op("Sub", conv_first=False)
    result = fuse(model)
    old_w = tensor(model, model.graph.node[0].input[1])
    np.testing.assert_array_equal(tensor(result.model, the_conv(result.model).input[1]), -old_w)
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("c_shape", [(1, M, 1, 1), (M, 1, 1), (1,), (), (1, 1, 1, 1)],
                         ids=["1M11", "M11", "1", "scalar", "1111"])
@pytest.mark.parametrize("op", ["Add", "Mul"])
def test_per_channel_shapes_fold(fuse, c_shape, op):
    model, _ = conv_op(op, c_shape=c_shape)
    result = fuse(model)
    assert op_counts(result.model) == {"Conv": 1}
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_weights_in_constant_nodes(fuse):
    model, _ = conv_op("Mul", constants="node")
    assert op_counts(model) == {"Constant": 3, "Conv": 1, "Mul": 1}
    result = fuse(model)
    assert op_counts(result.model) == {"Conv": 1}  # W and B replaced, their Constant nodes dropped
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_add_keeps_weight_constant_node(fuse):
    model, _ = conv_op("Add", constants="node")
    result = fuse(model)
    assert op_counts(result.model) == {"Constant": 1, "Conv": 1}  # Add changes only B; W stays where it was
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_float16_folds_and_stays_float16(fuse):
    model, _ = conv_op("Mul", dtype=np.float16)
    result = fuse(model)
    assert op_counts(result.model) == {"Conv": 1}
    conv = the_conv(result.model)
    assert {tensor(result.model, name).dtype for name in conv.input[1:]} == {np.dtype(np.float16)}
    assert_same_outputs(model, result.model, rtol=FP16_TOL, atol=FP16_TOL)


def test_1d_conv_with_m1_constant(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 3, 7])
    model = b.build(b.op("Mul", [b.conv(x, 3, M, rank=1), b.const(b.rand(M, 1))]))
    result = fuse(model)
    assert op_counts(result.model) == {"Conv": 1}
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("op", ["Mul", "Sub"])
def test_grouped_conv_transpose(fuse, op):
    b = GraphBuilder()
    x = b.input("x", [1, 4, 5, 5])
    model = b.build(b.op(op, [b.const(b.rng.uniform(0.5, 1.5, (1, 6, 1, 1)).astype(np.float32)),
                              b.conv_transpose(x, 4, 6, group=2)]))
    result = fuse(model)
    assert op_counts(result.model) == {"ConvTranspose": 1}
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_onnx_target_folds(fuse):
    model, _ = conv_op("Div")
    result = fuse(model, target="onnx")
    assert op_counts(result.model) == {"Conv": 1}
    assert {imp.domain for imp in result.model.opset_import} == {""}
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_ir3_initializer_inputs_fold_when_declared_constant(fuse):
    model, _ = conv_op("Mul", initializers_as_inputs=True, ir_version=4, opset=8)
    result = fuse(model, constant_initializer_inputs=True)
    assert op_counts(result.model) == {"Conv": 1}
    onnx.checker.check_model(result.model)
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


# --------------------------------------------------------------------------------------------------------------
# Skips: one per reason the pass gives


def assert_skipped(result, model, reason):
    return check_skipped(result, model, reason, PASS)


@pytest.mark.parametrize("c_shape", [(M,), (1, M, 6, 4), (1, 1, M, 1, 1), (1, 1, 1, 1, 1), (1, 1, 1, 4)],
                         ids=["M", "1MHW", "rank5-channel", "rank5-ones", "111W"])
def test_skip_constant_not_per_channel(fuse, c_shape):
    model, _ = conv_op("Mul", c_shape=c_shape)
    s = assert_skipped(fuse(model), model, Reason.NOT_PER_CHANNEL)
    assert str(list(c_shape)) in s.detail


def test_skip_conv_output_is_divisor(fuse):
    model, _ = conv_op("Div", conv_first=False)
    assert_skipped(fuse(model), model, Reason.CONV_IS_DIVISOR)


def test_skip_zero_in_divisor(fuse):
    model, _ = conv_op("Div", value=np.array([1.0, 0.0, 2.0, 3.0]).reshape(1, M, 1, 1))
    s = assert_skipped(fuse(model), model, Reason.ZERO_DIVISOR)
    assert "zero" in s.detail


def test_skip_intermediate_has_other_consumers(fuse):
    model, b = conv_op("Mul")
    conv_out = model.graph.node[0].output[0]
    model = b.build([model.graph.output[0].name, b.op("Neg", [conv_out])])
    s = assert_skipped(fuse(model), model, Reason.NOT_PRIVATE)
    assert conv_out in s.detail


def test_skip_intermediate_is_graph_output(fuse):
    model, b = conv_op("Mul")
    model = b.build([model.graph.output[0].name, model.graph.node[0].output[0]])
    assert_skipped(fuse(model), model, Reason.GRAPH_OUTPUT)


def test_skip_weights_not_constant(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 3, 6, 4])
    w = b.input("w", [M, 3, 3, 3])
    model = b.build(b.op("Mul", [b.conv(x, 3, M, weight=w), b.const(b.rand(M, 1, 1))]))
    s = assert_skipped(fuse(model), model, Reason.WEIGHTS_NOT_CONSTANT)
    assert "weight w is not a constant" in s.detail


def test_skip_initializer_is_graph_input(fuse):
    model, _ = conv_op("Mul", initializers_as_inputs=True, ir_version=4, opset=8)
    assert_skipped(fuse(model), model, Reason.INITIALIZER_IS_INPUT)


def test_skip_initializer_is_graph_input_for_the_constant_only(fuse):
    model, _ = conv_op("Add")
    c = model.graph.node[-1].input[1]
    model.graph.input.append(helper.make_tensor_value_info(c, TensorProto.FLOAT, [1, M, 1, 1]))
    s = assert_skipped(fuse(model), model, Reason.INITIALIZER_IS_INPUT)
    assert c in s.detail


def test_skip_dtype_not_foldable(fuse):
    b = GraphBuilder()
    b.inputs.append(helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [1, 3, 6, 6]))
    b.inits.append(helper.make_tensor("w", TensorProto.BFLOAT16, [M, 3, 3, 3], np.ones(M * 27).tolist()))
    b.inits.append(helper.make_tensor("k", TensorProto.BFLOAT16, [1, M, 1, 1], [1.0, 2.0, 3.0, 4.0]))
    model = b.model(b.op("Mul", [b.op("Conv", ["x", "w"], pads=[1, 1, 1, 1]), "k"]), opset=22)
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.BFLOAT16
    model = with_output_shapes(model)
    s = assert_skipped(fuse(model), model, Reason.DTYPE_NOT_FOLDABLE)
    assert "bfloat16" in s.detail


def test_skip_quantized_conv(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 3, 6, 6])
    dq = b.dequantized(x)
    model = b.build(b.op("Mul", [b.conv(dq, 3, M), b.const(b.rand(1, M, 1, 1))]))
    assert_skipped(fuse(model), model, Reason.QDQ)


@pytest.mark.parametrize("op, value", [("Mul", np.inf), ("Div", 1e-39), ("Add", np.nan)])
def test_skip_fold_not_finite(fuse, op, value):
    model, _ = conv_op(op, c_shape=(1,), value=np.full((1,), value))
    assert_skipped(fuse(model), model, Reason.FOLD_NOT_FINITE)


def per_channel_input_model(weight_input=False, c_shape=(1, M, 1, 1)):
    """x -> Conv(3 -> M) -> Add(conv, c) -> Relu, where c (and W with ``weight_input``) are graph inputs, as in an
    export that feeds its weights at run time."""
    b = GraphBuilder()
    x = b.input("x", [1, 3, 6, 4])
    w = b.input("w", [M, 3, 3, 3]) if weight_input else None
    c = b.input("c", list(c_shape))
    return b.build(b.op("Relu", [b.op("Add", [b.conv(x, 3, M, weight=w), c])]))


# --------------------------------------------------------------------------------------------------------------
# Weights computed from compact constants (int8 x scale, DequantizeLinear, ConstantOfShape)


@pytest.mark.parametrize("form", ["cast_mul", "dq_axis", "dq_tensor", "constant_of_shape"])
@pytest.mark.parametrize("op, conv_first", [("Add", True), ("Add", False), ("Sub", True), ("Sub", False),
                                            ("Mul", True), ("Mul", False), ("Div", True)])
def test_folds_into_compact_weight_which_stays_compact(fuse, form, op, conv_first):
    # Add and Sub(conv, c) change only the bias; Sub(c, conv), Mul and Div scale W through its computation. The
    # int8 tensor is kept byte for byte, and the Relu after the fold fuses.
    b = GraphBuilder()
    x = b.input("x", [1, 16, 8, 8])
    conv = b.conv(x, 16, 16, weight=compact_weight(b, 16, 16, form=form))
    c = b.const(b.rng.uniform(0.5, 1.5, (1, 16, 1, 1)).astype(np.float32))
    model = b.build(b.op("Relu", [b.op(op, [conv, c] if conv_first else [c, conv])]), opset=13)
    result = fuse(model, only=("constant_fold", PASS, "conv_activation"))
    computation = {"cast_mul": {"Cast": 1, "Mul": 1}, "dq_axis": {"DequantizeLinear": 1},
                   "dq_tensor": {"DequantizeLinear": 1}, "constant_of_shape": {"ConstantOfShape": 1}}[form]
    if form in ("dq_tensor", "constant_of_shape") and not (op == "Add" or (op == "Sub" and conv_first)):
        computation = {**computation, "Mul": 1}  # W's factor in an appended Mul(W, factor)
    assert op_counts(result.model) == {"FusedConv": 1, **computation}
    assert [f.pass_name for f in result.fusions] == [PASS, "conv_activation"]
    ints = {t.name: t.raw_data for t in result.model.graph.initializer if t.data_type == TensorProto.INT8 and t.dims}
    assert ints == {t.name: t.raw_data for t in model.graph.initializer if t.data_type == TensorProto.INT8 and t.dims}
    assert result.model.ByteSize() < model.ByteSize() + 512  # names and a [16] scale; no float weight
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_skip_fold_copies_shared_weight(fuse):
    """Conv -> Mul by a per-channel constant and a second Conv reading the same 1.3 MB weight: the folded copy is
    over the 1 MiB a whole model may grow by for copies of shared weights."""
    b = GraphBuilder()
    c = 192
    x = b.input("x", [1, c, 4, 4])
    w = b.const(b.rand(c, c, 3, 3))
    scaled = b.op("Mul", [b.conv(x, c, c, weight=w), b.const(b.rand(1, c, 1, 1))])
    model = b.build([scaled, b.conv(x, c, c, weight=w)])
    check_skipped(fuse(model), model, Reason.SHARED_WEIGHT_GROWTH, PASS)
