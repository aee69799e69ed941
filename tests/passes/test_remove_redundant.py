"""remove_redundant: Identity, inference Dropout, Cast to the tensor's own dtype and cancelling Transpose pairs
between ops are removed, so the Conv chains behind them fuse.

Numerics: original and optimized run in onnxruntime at ORT_DISABLE_ALL (conftest.assert_same_outputs) with
rtol=1e-4, atol=1e-5 (conftest.RTOL/ATOL).
"""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxfuse.records import Reason
from tests.builders import GraphBuilder, skip_of, subgraph
from tests.conftest import ATOL, RTOL, assert_if_branches_match, assert_same_outputs, op_counts, run

PASS = "remove_redundant"
#: The passes a test runs to see the chain fuse once the node in between is gone: the Conv's bias Add folds, and
#: its activation fuses.
THEN_FUSED = (PASS, "conv_affine", "conv_activation")


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
    result = fuse(model, only=THEN_FUSED, target="cpu+cuda")
    assert op_counts(result.model) == {"FusedConv": 1}
    stats = {s["name"]: s for s in result.report.pass_stats}
    assert stats[PASS]["applied"] == 1 and stats[PASS]["removed_nodes"] == 1
    assert stats[PASS]["removed_bytes"] == 2 * 4 * 36 * 4  # read and wrote one 1x4x6x6 float32 tensor
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("opset, extra", [(7, []), (12, [np.float32(0.5)]), (13, [np.float32(0.5), np.bool_(False)])])
def test_inference_dropout_is_removed(fuse, opset, extra):
    model = conv_then(("Dropout", extra, {}), opset=opset)
    result = fuse(model, only=THEN_FUSED, target="cpu+cuda")
    assert op_counts(result.model) == {"FusedConv": 1}
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_cast_to_own_dtype_is_removed(fuse):
    model = conv_then(("Cast", [], {"to": TensorProto.FLOAT}))
    result = fuse(model, only=THEN_FUSED, target="cpu+cuda")
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
    result = fuse(model, only=THEN_FUSED, target="cpu+cuda")
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
    result = fuse(model, only=THEN_FUSED, target="cpu+cuda")
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


def test_transposes_that_do_not_cancel_become_one(fuse):
    model = conv_then(("Transpose", [], {"perm": [0, 2, 3, 1]}), ("Transpose", [], {"perm": [0, 2, 3, 1]}))
    result = fuse(model)
    assert op_counts(checked(result.model))["Transpose"] == 1
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def checked(model):
    """``model`` after onnx.checker's full check (shape inference included) passed on it."""
    onnx.checker.check_model(model, full_check=True)
    return model


def output_names(model) -> list[str]:
    return [o.name for o in model.graph.output]


@pytest.mark.parametrize("middle", [
    [("Identity", [], {})],
    [("Cast", [], {"to": TensorProto.FLOAT})],
    [("Dropout", [np.float32(0.5), np.bool_(False)], {})],
    [("Transpose", [], {"perm": [0, 2, 3, 1]}), ("Transpose", [], {"perm": [0, 3, 1, 2]})],
], ids=["identity", "cast", "dropout", "transpose-pair"])
def test_graph_output_is_taken_over_by_the_producer(fuse, middle):
    # exported models often end in an Identity: the Add that computes its input takes over the output's name,
    # and conv_affine then folds that Add into the Conv, which writes the graph output
    model = conv_then(*middle, opset=13, after=None)
    result = fuse(model, only=(PASS, "conv_affine"), target="cpu")
    checked(result.model)
    assert op_counts(result.model) == {"Conv": 1}
    assert output_names(result.model) == output_names(model)
    assert result.model.graph.output[0].type == model.graph.output[0].type
    assert list(result.model.graph.node[0].output) == output_names(model)
    assert not any(s.pass_name == PASS for s in result.skips)
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_skip_intermediate_is_graph_output_identity(fuse):
    # the Identity's input is a graph input: it cannot be renamed to the output's name
    b = GraphBuilder()
    model = b.build(b.op("Identity", [b.input("x", [1, 4])]))
    result = fuse(model, target="cpu")
    s = skip_of(result, PASS)
    assert s.reason == Reason.GRAPH_OUTPUT and "graph input" in s.detail
    assert op_counts(result.model)["Identity"] == 1
    assert output_names(checked(result.model)) == output_names(model)


def test_skip_intermediate_is_graph_output_when_the_input_is_a_graph_output_too(fuse):
    b = GraphBuilder()
    y = b.op("Relu", [b.input("x", [1, 4])])
    model = b.build([y, b.op("Identity", [y])])
    result = fuse(model)
    s = skip_of(result, PASS)
    assert s.reason == Reason.GRAPH_OUTPUT and "graph output too" in s.detail
    assert output_names(checked(result.model)) == output_names(model)


def test_skip_intermediate_is_graph_output_when_the_input_is_a_constant(fuse):
    b = GraphBuilder()
    b.input("x", [1, 4])
    model = b.build(b.op("Identity", [b.const(b.rand(1, 4))]))
    result = fuse(model, only=(PASS,))  # constant_fold reports the same node first
    s = skip_of(result, PASS)
    assert s.reason == Reason.GRAPH_OUTPUT and "constant" in s.detail
    assert output_names(checked(result.model)) == output_names(model)


def test_skip_intermediate_is_graph_output_when_a_subgraph_reads_the_input(fuse):
    # renaming y would rename it inside the If branch too: left as it is
    b = GraphBuilder()
    x, cond = b.input("x", [1, 4]), b.input("cond", [], dtype=np.bool_)
    y = b.op("Relu", [x])
    then_b, else_b = GraphBuilder(prefix="t_"), GraphBuilder(prefix="e_")
    then_b.input(y, [1, 4])
    else_b.input(y, [1, 4])
    branch = b.op("If", [cond], then_branch=subgraph(then_b, then_b.op("Sigmoid", [y])),
                  else_branch=subgraph(else_b, else_b.op("Neg", [y])))
    model = b.build([b.op("Identity", [y]), branch])
    result = fuse(model)
    s = skip_of(result, PASS)
    assert s.reason == Reason.GRAPH_OUTPUT and "subgraph" in s.detail
    checked(result.model)
    for flag in (True, False):
        feeds = {"x": np.linspace(-1, 1, 4, dtype=np.float32).reshape(1, 4), "cond": np.array(flag)}
        for got, ref in zip(run(result.model, feeds), run(model, feeds), strict=True):
            np.testing.assert_allclose(got, ref, rtol=RTOL, atol=ATOL)


def loop_model(identity_at_end: bool = True) -> onnx.ModelProto:
    """y = Loop(n, x): each iteration runs x -> Mul(w) -> Add(b) -> Identity -> body output (a Loop body ends in
    graph outputs, so its Identity could never be removed while a graph output blocked it)."""
    body_nodes = [helper.make_node("Mul", ["x_in", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
                  helper.make_node("Identity", ["a"], ["x_out"]), helper.make_node("Identity", ["c_in"], ["c_out"])]
    body = helper.make_graph(
        body_nodes, "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x_in", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x_out", TensorProto.FLOAT, [2, 3])],
        [onnx.numpy_helper.from_array(np.full((2, 3), 0.5, np.float32), "w"),
         onnx.numpy_helper.from_array(np.full((2, 3), 0.25, np.float32), "b")])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["n", "", "x"], ["y"], body=body)], "loop",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("n", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return checked(model)


def test_identity_at_the_end_of_a_loop_body_is_removed(fuse):
    model = loop_model()
    result = fuse(model)
    checked(result.model)
    body = result.model.graph.node[0].attribute[0].g
    assert [n.op_type for n in body.node] == ["Mul", "Add", "Identity"]  # c_out = Identity(c_in): a body input
    assert [o.name for o in body.output] == ["c_out", "x_out"]
    s = skip_of(result, PASS)
    assert s.reason == Reason.GRAPH_OUTPUT and s.output == "c_out"
    feeds = {"x": np.arange(6, dtype=np.float32).reshape(2, 3), "n": np.array(3, np.int64)}
    np.testing.assert_allclose(run(result.model, feeds)[0], run(model, feeds)[0], rtol=RTOL, atol=ATOL)


def test_transpose_pair_split_between_graph_and_if_branch_stays(fuse):
    # the first Transpose is in the main graph, the second in a branch: the pair is not removed across graphs
    # (it was: the outer Transpose lost its edges but stayed, and the written model failed onnx.checker)
    b = GraphBuilder()
    x, cond = b.input("x", [1, 3, 6, 6]), b.input("cond", [], dtype=np.bool_)
    nhwc = b.op("Transpose", [b.conv(x, 3, 4)], perm=[0, 2, 3, 1])
    then_b, else_b = GraphBuilder(prefix="t_"), GraphBuilder(prefix="e_")
    then_b.input(nhwc, [1, 6, 6, 4])
    else_b.input(nhwc, [1, 6, 6, 4])
    then = subgraph(then_b, then_b.op("Relu", [then_b.op("Transpose", [nhwc], perm=[0, 3, 1, 2])]))
    other = subgraph(else_b, else_b.op("Sigmoid", [else_b.op("Transpose", [nhwc], perm=[0, 3, 1, 2])]))
    model = b.build(b.op("If", [cond], then_branch=then, else_branch=other))
    result = fuse(model)
    checked(result.model)
    assert op_counts(result.model)["Transpose"] == 3
    assert_if_branches_match(model, result.model)


def test_transpose_with_identity_perm_is_removed(fuse):
    model = conv_then(("Transpose", [], {"perm": [0, 1, 2, 3]}))
    result = fuse(model, only=THEN_FUSED, target="cpu+cuda")
    assert op_counts(checked(result.model)) == {"FusedConv": 1}
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_transpose_chain_is_composed_into_one(fuse):
    # NCHW -> NHWC -> NWHC -> NCWH: three Transposes, one composed perm (r[i] = p[q[i]] at each step)
    model = conv_then(("Transpose", [], {"perm": [0, 2, 3, 1]}), ("Transpose", [], {"perm": [0, 2, 1, 3]}),
                      ("Transpose", [], {"perm": [0, 3, 1, 2]}))
    result = fuse(model, target="cpu")
    checked(result.model)
    [t] = [n for n in result.model.graph.node if n.op_type == "Transpose"]
    perm = [0, 2, 3, 1]
    for q in ([0, 2, 1, 3], [0, 3, 1, 2]):
        perm = [perm[i] for i in q]
    assert list(t.attribute[0].ints) == perm == [0, 1, 3, 2]
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_transpose_chain_with_shared_first_stays(fuse):
    b = GraphBuilder()
    x = b.input("x", [2, 3, 4])
    first = b.op("Transpose", [x], perm=[1, 2, 0])
    model = b.build([b.op("Transpose", [first], perm=[1, 0, 2]), b.op("Relu", [first])])
    result = fuse(model)
    assert op_counts(checked(result.model))["Transpose"] == 2
    assert not result.fusions


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


def test_graph_output_of_optional_type_is_taken_over(fuse):
    # the Optional node takes over the name and the optional type of the Identity's graph output
    optional = helper.make_optional_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, [2, 3]))
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Optional", ["r"], ["o"]),
             helper.make_node("Identity", ["o"], ["y"])]
    graph = helper.make_graph(nodes, "optional_out", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_value_info("y", optional)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)])  # Identity of optional: 16
    model.ir_version = 8
    result = fuse(checked(model))
    checked(result.model)
    assert [n.op_type for n in result.model.graph.node] == ["Relu", "Optional"]
    assert [(o.name, o.type) for o in result.model.graph.output] == [("y", optional)]
    feeds = {"x": np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)}
    np.testing.assert_array_equal(run(result.model, feeds)[0], run(model, feeds)[0])


# --------------------------------------------------------------------------------------------------------------
# Issue 33: exact no-ops a peer's suite expects removed


@pytest.mark.parametrize("dtype,wide", [(np.float16, TensorProto.FLOAT), (np.float32, TensorProto.DOUBLE)])
def test_widening_cast_round_trip_is_removed(fuse, dtype, wide):
    b = GraphBuilder(dtype=dtype)
    x = b.input("x", [1, 4, 6, 6])
    back = {np.float16: TensorProto.FLOAT16, np.float32: TensorProto.FLOAT}[dtype]
    y = b.op("Cast", [b.op("Cast", [b.op("Relu", [x])], to=wide)], to=back)
    model = b.build(b.op("Sigmoid", [y]), output_dtype=dtype)
    result = fuse(model, only=(PASS,))
    assert "Cast" not in op_counts(result.model)
    onnx.checker.check_model(result.model, full_check=True)
    assert_same_outputs(model, result.model, rtol=0, atol=0)  # exact


def test_widening_round_trip_keeps_the_first_cast_when_it_has_other_readers(fuse):
    b = GraphBuilder(dtype=np.float16)
    x = b.input("x", [1, 4])
    wide = b.op("Cast", [b.op("Relu", [x])], to=TensorProto.FLOAT)
    back = b.op("Cast", [wide], to=TensorProto.FLOAT16)
    model = b.model([b.op("Sigmoid", [back]), b.op("Neg", [wide])], opset=17)
    model.graph.output[0].type.CopyFrom(helper.make_tensor_type_proto(TensorProto.FLOAT16, [1, 4]))
    model.graph.output[1].type.CopyFrom(helper.make_tensor_type_proto(TensorProto.FLOAT, [1, 4]))
    result = fuse(model, only=(PASS,))
    assert op_counts(result.model)["Cast"] == 1
    assert_same_outputs(model, result.model, rtol=0, atol=0)


def test_narrowing_round_trip_int64_to_int32_stays(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 4], dtype=np.int64)
    y = b.op("Cast", [b.op("Cast", [b.op("Abs", [x])], to=TensorProto.INT32)], to=TensorProto.INT64)
    model = b.build(b.op("Neg", [y]), output_dtype=np.int64)
    assert op_counts(fuse(model, only=(PASS,)).model)["Cast"] == 2


def test_dropout_with_ratio_0_in_training_mode_is_removed(fuse):
    model = conv_then(("Dropout", [np.float32(0.0), np.bool_(True)], {}), opset=13)
    result = fuse(model, only=THEN_FUSED, target="cpu+cuda")
    assert op_counts(result.model) == {"FusedConv": 1}
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("opset", [9, 13, 19])
def test_all_zero_pad_is_removed(fuse, opset):
    b = GraphBuilder()
    x = b.input("x", [1, 4, 6, 6])
    r = b.op("Relu", [x])
    if opset < 11:
        p = b.op("Pad", [r], pads=[0] * 8, mode="reflect")
    else:
        p = b.op("Pad", [r, b.const(np.zeros(8, np.int64))], mode="edge")
    model = b.build(b.op("Sigmoid", [p]), opset=opset)
    result = fuse(model, only=(PASS,))
    assert "Pad" not in op_counts(result.model)
    assert_same_outputs(model, result.model, rtol=0, atol=0)


def test_a_pad_that_pads_stays(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 4, 6, 6])
    p = b.op("Pad", [b.op("Relu", [x]), b.const(np.array([0, 0, 1, 0, 0, 0, 0, 0], np.int64))])
    model = b.build(b.op("Sigmoid", [p]), opset=13)
    assert op_counts(fuse(model, only=(PASS,)).model)["Pad"] == 1


def test_skip_dropout_mask_used_says_the_mask_is_a_graph_output(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 4])
    y, mask = b.op("Dropout", [b.op("Relu", [x])], outputs=2)
    model = b.model([b.op("Sigmoid", [y]), mask], opset=13)
    for out, elem in zip(model.graph.output, (TensorProto.FLOAT, TensorProto.BOOL), strict=True):
        out.type.CopyFrom(helper.make_tensor_type_proto(elem, [1, 4]))
    s = skip_of(fuse(model), PASS)
    assert s.reason == Reason.DROPOUT_MASK and "mask" in s.detail and "graph output" in s.detail


@pytest.mark.parametrize("opset", [11, 17])
def test_squeeze_unsqueeze_pair_between_conv1d_convs_is_removed(fuse, opset):
    """Audio exports: Unsqueeze -> Conv -> Squeeze -> Unsqueeze -> Conv -> Squeeze; the middle pair cancels."""
    b = GraphBuilder()
    x = b.input("x", [1, 3, 10])

    def axes_of(n):
        return {"axes": [n]} if opset < 13 else {}

    def squeeze_op(op, t, n):
        extra = [] if opset < 13 else [b.const(np.array([n], np.int64))]
        return b.op(op, [t, *extra], **axes_of(n))

    y = squeeze_op("Squeeze", b.conv(squeeze_op("Unsqueeze", x, 2), 3, 4, k=(1, 3), pads=[0, 1, 0, 1]), 2)
    y = squeeze_op("Squeeze", b.conv(squeeze_op("Unsqueeze", y, -2), 4, 5, k=(1, 3), pads=[0, 1, 0, 1]), -2)
    model = b.build(y, opset=opset)
    result = fuse(model)
    assert [n.op_type for n in result.model.graph.node] == ["Unsqueeze", "Conv", "Conv", "Squeeze"]
    onnx.checker.check_model(result.model, full_check=True)
    assert_same_outputs(model, result.model, rtol=0, atol=0)


def test_unsqueeze_squeeze_pair_is_removed_and_other_axes_are_not(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 4, 6])
    same = b.op("Squeeze", [b.op("Unsqueeze", [x, b.const(np.array([0, 3], np.int64))]),
                            b.const(np.array([3, -5], np.int64))])  # axes 3 and 0 of the rank-5 tensor
    other = b.op("Unsqueeze", [b.op("Squeeze", [b.conv(b.op("Unsqueeze", [x, b.const(np.array([2], np.int64))]),
                                                       4, 4, k=(1, 1)), b.const(np.array([2], np.int64))]),
                               b.const(np.array([3], np.int64))])  # [1, 4, 6] -> [1, 4, 6, 1]: no pair
    model = b.build([b.op("Relu", [same]), other])
    result = fuse(model)
    assert op_counts(result.model) == {"Relu": 1, "Unsqueeze": 2, "Conv": 1, "Squeeze": 1}
    assert_same_outputs(model, result.model, rtol=0, atol=0)


# --------------------------------------------------------------------------------------------------------------
# Issue 33: a no-op between a graph input and a graph output becomes one Identity (the output keeps its name)


def _between_input_and_output(kind: str):
    b = GraphBuilder(seed=3)
    x = b.input("x", [2, 3, 4])
    if kind == "transpose":
        y = b.op("Transpose", [x], perm=[0, 1, 2])
    elif kind == "cast":
        y = b.op("Cast", [x], to=TensorProto.FLOAT)
    elif kind == "dropout":
        y = b.op("Dropout", [x])
    elif kind == "dropout_ratio_0_training":
        y = b.op("Dropout", [x, b.const(np.float32(0.0)), b.const(np.bool_(True))])
    elif kind == "pad":
        y = b.op("Pad", [x, b.const(np.zeros(6, np.int64))])
    elif kind == "transpose_pair":
        y = b.op("Transpose", [b.op("Transpose", [x], perm=[2, 0, 1])], perm=[1, 2, 0])
    elif kind == "cast_round_trip":
        y = b.op("Cast", [b.op("Cast", [x], to=TensorProto.DOUBLE)], to=TensorProto.FLOAT)
    else:  # identity chain
        y = b.op("Identity", [b.op("Identity", [x])])
    return b.build(y)


@pytest.mark.parametrize("kind", ["transpose", "cast", "dropout", "dropout_ratio_0_training", "pad",
                                  "transpose_pair", "cast_round_trip", "identity_chain"])
def test_no_op_between_graph_input_and_output_becomes_one_identity(fuse, kind):
    model = _between_input_and_output(kind)
    result = fuse(model)
    checked(result.model)
    assert op_counts(result.model) == {"Identity": 1}, op_counts(result.model)
    (node,) = result.model.graph.node
    assert list(node.input) == ["x"] and list(node.output) == output_names(model)
    assert output_names(result.model) == output_names(model)
    assert [i.name for i in result.model.graph.input] == ["x"]
    assert not any(s.pass_name == PASS and s.reason != Reason.GRAPH_OUTPUT for s in result.skips)
    assert_same_outputs(model, result.model, rtol=0, atol=0)


def test_no_op_of_a_constant_graph_output_leaves_the_constant_output(fuse):
    # Transpose(identity perm) of an initializer that is the graph output: the output keeps its name and value
    b = GraphBuilder()
    b.input("x", [1, 4])
    w = b.const(b.rand(2, 3))
    model = b.build([b.op("Relu", ["x"]), b.op("Transpose", [w], perm=[0, 1])])
    result = fuse(model)
    checked(result.model)
    assert op_counts(result.model) == {"Relu": 1, "Identity": 1}
    result = fuse(model, only=("constant_fold", PASS))
    checked(result.model)
    assert op_counts(result.model) == {"Relu": 1}
    assert output_names(result.model) == output_names(model)
    assert_same_outputs(model, result.model, rtol=0, atol=0)


def test_transpose_of_an_initializer_that_is_a_graph_output_is_folded(fuse):
    # W is a graph output itself and is read transposed: the Transpose folds to a constant, W stays an output
    b = GraphBuilder()
    x = b.input("x", [1, 3])
    w = b.const(b.rand(2, 3))
    model = b.build([b.op("MatMul", [x, b.op("Transpose", [w], perm=[1, 0])]), w])
    result = fuse(model, only=("constant_fold", PASS))
    checked(result.model)
    assert "Transpose" not in op_counts(result.model)
    assert output_names(result.model) == output_names(model)
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)
