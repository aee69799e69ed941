"""remove_redundant: Identity, inference Dropout, Cast to the tensor's own dtype and cancelling Transpose pairs
between ops are removed, so the Conv chains behind them fuse.

Numerics: original and optimized run in onnxruntime at ORT_DISABLE_ALL (conftest.assert_same_outputs) with
rtol=1e-4, atol=1e-5 (conftest.RTOL/ATOL).
"""

import numpy as np
import pytest
from onnx import TensorProto, helper

from onnxfuse.passes import Reason
from tests.builders import GraphBuilder, skip_of
from tests.conftest import ATOL, RTOL, assert_same_outputs, op_counts

PASS = "remove_redundant"


def conv_then(*middle, opset=17, after="Relu"):
    """x -> Conv(3 -> 4) -> Add(bias) -> middle nodes -> after. ``middle`` items: (op, extra inputs, attrs)."""
    b = GraphBuilder()
    x = b.input("x", [1, 3, 6, 6])
    y = b.op("Add", [b.conv(x, 3, 4, bias=False), b.const(b.rand(1, 4, 1, 1))])
    for op, extra, attrs in middle:
        y = b.op(op, [y, *[b.const(e) if not isinstance(e, str) else e for e in extra]], **attrs)
    return b.build(b.op(after, [y]) if after else y, opset=opset)


# --------------------------------------------------------------------------------------------------------------
# Positives


def test_identity_in_the_chain_is_removed_and_conv_fuses(fuse):
    # paddle2onnx PP-LCNet: Conv -> Add -> Identity -> Relu
    model = conv_then(("Identity", [], {}))
    result = fuse(model, target="cpu+cuda")
    assert op_counts(result.model) == {"FusedConv": 1}
    stats = {s["name"]: s for s in result.report.pass_stats}
    assert stats[PASS]["applied"] == 1 and stats[PASS]["removed_nodes"] == 1
    assert stats[PASS]["removed_bytes"] == 2 * 4 * 36 * 4  # read and wrote one 1x4x6x6 float32 tensor
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("opset, extra", [(7, []), (12, [np.float32(0.5)]), (13, [np.float32(0.5), np.bool_(False)])])
def test_inference_dropout_is_removed(fuse, opset, extra):
    model = conv_then(("Dropout", extra, {}), opset=opset)
    result = fuse(model, target="cpu+cuda")
    assert op_counts(result.model) == {"FusedConv": 1}
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_cast_to_own_dtype_is_removed(fuse):
    model = conv_then(("Cast", [], {"to": TensorProto.FLOAT}))
    result = fuse(model, target="cpu+cuda")
    assert op_counts(result.model) == {"FusedConv": 1}
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_cancelling_transposes_around_channels_last_conv(fuse):
    # Channels-last exporters: NHWC -> NCHW before the conv, NCHW -> NHWC after it, and back again.
    b = GraphBuilder()
    x = b.input("x", [1, 6, 6, 3])
    nchw = b.op("Transpose", [x], perm=[0, 3, 1, 2])
    conv = b.conv(nchw, 3, 4)
    nhwc = b.op("Transpose", [conv], perm=[0, 2, 3, 1])
    back = b.op("Transpose", [nhwc], perm=[0, 3, 1, 2])
    model = b.build(b.op("Relu", [back]))
    result = fuse(model, target="cpu+cuda")
    assert op_counts(result.model) == {"Transpose": 1, "FusedConv": 1}
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_transpose_pair_keeps_first_when_it_has_other_readers(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 3, 6, 6])
    conv = b.conv(x, 3, 4)
    nhwc = b.op("Transpose", [conv], perm=[0, 2, 3, 1])
    back = b.op("Transpose", [nhwc], perm=[0, 3, 1, 2])
    model = b.build([b.op("Sigmoid", [back]), b.op("Relu", [nhwc])])
    result = fuse(model, target="cpu")
    assert op_counts(result.model)["Transpose"] == 1
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_default_perm_pair_cancels(fuse):
    model = conv_then(("Transpose", [], {}), ("Transpose", [], {}))
    result = fuse(model, target="cpu+cuda")
    assert op_counts(result.model) == {"FusedConv": 1}
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_idempotent(fuse):
    model = conv_then(("Identity", [], {}), ("Cast", [], {"to": TensorProto.FLOAT}))
    first = fuse(model)
    again = fuse(first.model)
    assert not again.changed
    assert again.model.SerializeToString(deterministic=True) == first.model.SerializeToString(deterministic=True)


# --------------------------------------------------------------------------------------------------------------
# What stays


def test_lossy_cast_round_trip_stays(fuse):
    model = conv_then(("Cast", [], {"to": TensorProto.FLOAT16}), ("Cast", [], {"to": TensorProto.FLOAT}))
    result = fuse(model, target="cpu")
    assert op_counts(result.model)["Cast"] == 2
    assert not any(s.pass_name == PASS for s in result.skips)
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_transposes_that_do_not_cancel_stay(fuse):
    model = conv_then(("Transpose", [], {"perm": [0, 2, 3, 1]}), ("Transpose", [], {"perm": [0, 2, 3, 1]}))
    result = fuse(model)
    assert op_counts(result.model)["Transpose"] == 2


def test_skip_intermediate_is_graph_output_identity(fuse):
    model = conv_then(("Identity", [], {}), after=None)
    result = fuse(model, target="cpu")
    s = skip_of(result, PASS)
    assert s.reason == Reason.GRAPH_OUTPUT
    assert op_counts(result.model)["Identity"] == 1
    assert [o.name for o in result.model.graph.output] == [o.name for o in model.graph.output]


def test_skip_dropout_training_mode(fuse):
    model = conv_then(("Dropout", [np.float32(0.5), np.bool_(True)], {}), opset=13)
    result = fuse(model, target="cpu")
    assert skip_of(result, PASS).reason == Reason.DROPOUT_TRAINING
    assert op_counts(result.model)["Dropout"] == 1


def test_skip_dropout_training_mode_not_constant(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 4])
    training = b.input("training", [], dtype=np.bool_)
    model = b.build(b.op("Relu", [b.op("Dropout", [x, b.const(np.float32(0.5)), training])]), opset=13)
    result = fuse(model)
    s = skip_of(result, PASS)
    assert s.reason == Reason.DROPOUT_TRAINING and "not a constant" in s.detail


def test_skip_dropout_mask_used(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 4])
    y, mask = b.op("Dropout", [x], outputs=2)
    model = b.model([b.op("Relu", [y]), mask], opset=13)
    for out, elem in zip(model.graph.output, (TensorProto.FLOAT, TensorProto.BOOL), strict=True):
        out.type.CopyFrom(helper.make_tensor_type_proto(elem, [1, 4]))
    result = fuse(model)
    assert skip_of(result, PASS).reason == Reason.DROPOUT_MASK
    assert op_counts(result.model)["Dropout"] == 1
