"""affine_conv: Mul/Add/Sub by per-input-channel constants -> Conv with zero pads => Conv with W' = W * s[c],
B' = B + sum W * o[c] (ONNX Conv; the module docstring has the math).

Numerics: original and optimized run in onnxruntime at ORT_DISABLE_ALL (conftest.assert_same_outputs) with
rtol=1e-4, atol=1e-5 (conftest.RTOL/ATOL).
"""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxfuse.records import Reason
from tests.builders import GraphBuilder, skip_of, with_output_shapes
from tests.conftest import ATOL, RTOL, assert_same_outputs, op_counts

PASS = "affine_conv"
C = 4


def affine_conv(ops=(("Mul", (1, C, 1, 1)), ("Add", (1, C, 1, 1))), pads=(0, 0, 0, 0), group=1, bias=True,
                c_out=6, constant_first=False, **conv_attrs):
    """x [1, C, 7, 7] -> Relu -> each (op, constant shape) -> Conv(C -> c_out, 3x3)."""
    b = GraphBuilder(seed=11)
    x = b.input("x", [1, C, 7, 7])
    y = b.op("Relu", [x])
    for op, shape in ops:
        c = b.const((b.rng.uniform(0.5, 1.5, shape) if op == "Mul" else b.rand(*shape)).astype(np.float32))
        y = b.op(op, [c, y] if constant_first and op != "Sub" else [y, c])
    conv_attrs["pads"] = list(pads) if pads is not None else [0, 0, 0, 0]
    y = b.conv(y, C, c_out, 3, bias=bias, group=group, **conv_attrs)
    model = b.model(y)
    if pads is None:  # auto_pad alone: pads and auto_pad together are invalid
        conv = next(n for n in model.graph.node if n.op_type == "Conv")
        kept = [a for a in conv.attribute if a.name != "pads"]
        del conv.attribute[:]
        conv.attribute.extend(kept)
    return with_output_shapes(model)


def assert_folded(fuse, model):
    result = fuse(model)
    assert op_counts(result.model) == {"Relu": 1, "Conv": 1}
    assert [f.pass_name for f in result.fusions] == [PASS]
    onnx.checker.check_model(result.model, full_check=True)
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)
    return result


# --------------------------------------------------------------------------------------------------------------
# Positives


@pytest.mark.parametrize("ops", [
    (("Mul", (1, C, 1, 1)), ("Add", (1, C, 1, 1))),  # x * s + o (a normalization folded in)
    (("Add", (C, 1, 1)), ("Mul", (C, 1, 1))),        # (x + o) * s
    (("Mul", (1, C, 1, 1)),),
    (("Add", (1,)),),
    (("Sub", (1, C, 1, 1)),),
    (("Mul", ()),),
])
def test_scale_and_offset_fold_into_the_conv(fuse, ops):
    assert_folded(fuse, affine_conv(ops))


def test_constant_as_the_first_operand(fuse):
    assert_folded(fuse, affine_conv(constant_first=True))


@pytest.mark.parametrize("group,c_out", [(2, 6), (4, 4)])
def test_grouped_and_depthwise(fuse, group, c_out):
    assert_folded(fuse, affine_conv(group=group, c_out=c_out))


def test_conv_without_bias_gets_one(fuse):
    result = assert_folded(fuse, affine_conv(bias=False))
    (conv,) = [n for n in result.model.graph.node if n.op_type == "Conv"]
    assert len(conv.input) == 3


def test_auto_pad_valid_is_zero_pads(fuse):
    assert_folded(fuse, affine_conv(pads=None, auto_pad="VALID"))


# --------------------------------------------------------------------------------------------------------------
# Refusals


def refused(fuse, model, reason):
    result = fuse(model)
    s = skip_of(result, PASS)
    assert s.reason == reason
    assert op_counts(result.model) == op_counts(model) and not result.fusions
    return s


def test_skip_conv_pads_not_zero(fuse):
    s = refused(fuse, affine_conv(pads=(1, 1, 1, 1)), Reason.CONV_PADS_NONZERO)
    assert "padded" in s.detail


def test_skip_conv_pads_not_zero_for_auto_pad_same(fuse):
    refused(fuse, affine_conv(pads=None, auto_pad="SAME_UPPER"), Reason.CONV_PADS_NONZERO)


def test_skip_constant_not_per_channel(fuse):
    refused(fuse, affine_conv(ops=(("Mul", (1, C, 7, 1)),)), Reason.NOT_PER_CHANNEL)


def test_skip_intermediate_has_other_consumers(fuse):
    b = GraphBuilder(seed=1)
    x = b.input("x", [1, C, 7, 7])
    y = b.op("Mul", [b.op("Relu", [x]), b.const(np.full((1, C, 1, 1), 2.0, np.float32))])
    model = b.build([b.conv(y, C, 6, 3, pads=[0, 0, 0, 0]), b.op("Neg", [y])])
    refused(fuse, model, Reason.NOT_PRIVATE)


def test_skip_intermediate_is_graph_output(fuse):
    b = GraphBuilder(seed=1)
    x = b.input("x", [1, C, 7, 7])
    y = b.op("Mul", [b.op("Relu", [x]), b.const(np.full((1, C, 1, 1), 2.0, np.float32))])
    model = b.build([b.conv(y, C, 6, 3, pads=[0, 0, 0, 0]), y])
    refused(fuse, model, Reason.GRAPH_OUTPUT)


def test_skip_weights_not_constant(fuse):
    b = GraphBuilder(seed=1)
    x = b.input("x", [1, C, 7, 7])
    w = b.input("w", [6, C, 3, 3])
    y = b.op("Mul", [b.op("Relu", [x]), b.const(np.full((1, C, 1, 1), 2.0, np.float32))])
    model = b.build(b.op("Conv", [y, w], pads=[0, 0, 0, 0]))
    refused(fuse, model, Reason.WEIGHTS_NOT_CONSTANT)


def test_skip_initializer_is_graph_input(fuse):
    model = affine_conv(ops=(("Mul", (1, C, 1, 1)),))
    s_name = next(n for n in model.graph.node if n.op_type == "Mul").input[1]
    model.graph.input.append(helper.make_tensor_value_info(s_name, TensorProto.FLOAT, [1, C, 1, 1]))
    s = refused(fuse, model, Reason.INITIALIZER_IS_INPUT)
    assert "--constant-initializer-inputs" in s.detail


def test_skip_dtype_not_foldable(fuse):
    # bfloat16 Conv (opset 22): numpy holds no bfloat16 weights to fold
    b = GraphBuilder(seed=1)
    x = b.input("x", [1, C, 7, 7])
    xb = b.op("Cast", [b.op("Relu", [x])], to=TensorProto.BFLOAT16)
    s16 = b.op("Cast", [b.const(np.full((1, C, 1, 1), 2.0, np.float32))], to=TensorProto.BFLOAT16)
    w16 = b.op("Cast", [b.const(b.rand(6, C, 3, 3))], to=TensorProto.BFLOAT16)
    y = b.op("Conv", [b.op("Mul", [xb, s16]), w16], pads=[0, 0, 0, 0])
    model = b.build(b.op("Cast", [y], to=TensorProto.FLOAT), opset=22)
    result = fuse(model, only=("constant_fold", PASS))  # the Casts of constants fold into bfloat16 constants
    assert skip_of(result, PASS).reason == Reason.DTYPE_NOT_FOLDABLE


def test_skip_fold_not_finite(fuse):
    b = GraphBuilder(seed=1)
    x = b.input("x", [1, C, 7, 7])
    y = b.op("Mul", [b.op("Relu", [x]), b.const(np.full((1, C, 1, 1), 3e38, np.float32))])
    w = b.const(np.full((6, C, 3, 3), 10.0, np.float32))
    model = b.build(b.op("Conv", [y, w], pads=[0, 0, 0, 0]))
    refused(fuse, model, Reason.FOLD_NOT_FINITE)


def test_skip_constant_not_per_channel_when_it_broadcasts_the_input(fuse):
    # x has 1 channel; x * s makes C of them: the Conv reads C channels that x does not have
    b = GraphBuilder(seed=1)
    x = b.input("x", [1, 1, 7, 7])
    y = b.op("Mul", [b.op("Relu", [x]), b.const(np.full((1, C, 1, 1), 2.0, np.float32))])
    model = b.build(b.conv(y, C, 6, 3, pads=[0, 0, 0, 0]))
    s = refused(fuse, model, Reason.NOT_PER_CHANNEL)
    assert "broadcast" in s.detail
