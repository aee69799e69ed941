"""constant_fold: a node whose inputs are all constants => the constant onnxruntime computes for it.

Positives are the shapes exporters write (paddle2onnx 3: conv bias as Reshape(Constant, Constant); caffe2-era
graphs: BN parameters via Unsqueeze(Constant), weights via ConstantOfShape): after the fold, the fusion passes see
plain constants. Numerics: original and optimized run in onnxruntime at ORT_DISABLE_ALL
(conftest.assert_same_outputs) with rtol=1e-4, atol=1e-5 (conftest.RTOL/ATOL).
"""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxfuse import pipeline
from onnxfuse.passes.constant_fold import FOLD_GROWTH_LIMIT_BYTES
from onnxfuse.records import Reason
from tests.builders import GraphBuilder, compact_weight, skip_of, subgraph, tensor
from tests.conftest import ATOL, RTOL, assert_if_branches_match, assert_same_outputs, attr, op_counts, run

PASS = "constant_fold"
#: The passes a test runs to see a folded bias (BN parameters) reach the conv: the fold into the Conv, then its Relu.
BIAS_FUSED = (PASS, "conv_affine", "conv_activation")
BN_FUSED = (PASS, "conv_batchnorm", "conv_activation")


def reshape_bias(op="Relu", constants="node"):
    """x -> Conv(3 -> 4, no bias) -> Add(conv, Reshape(Constant b[4], Constant [1, 4, 1, 1])) -> op."""
    b = GraphBuilder(constants=constants)
    x = b.input("x", [1, 3, 6, 6])
    bias = b.op("Reshape", [b.const(b.rand(4, scale=0.5)), b.const(np.array([1, 4, 1, 1], np.int64))])
    y = b.op("Add", [b.conv(x, 3, 4, bias=False), bias])
    return b.build(b.op(op, [y]) if op else y, opset=14)


def compute_ops(model):
    """Op counts without Constant nodes (weights the builder stored as nodes stay nodes)."""
    counts = op_counts(model)
    counts.pop("Constant", None)
    return counts


def assert_skipped(result, model, reason):
    s = skip_of(result, PASS)
    assert s.reason == reason
    assert op_counts(result.model) == op_counts(model)
    return s


# --------------------------------------------------------------------------------------------------------------
# Positives


@pytest.mark.parametrize("constants", ["node", "initializer"])
def test_reshape_of_constants_bias_becomes_fused_conv(fuse, constants):
    model = reshape_bias(constants=constants)
    result = fuse(model, only=BIAS_FUSED, target="cpu+cuda")
    assert compute_ops(result.model) == {"FusedConv": 1}
    assert [f.pass_name for f in result.fusions][:1] == [PASS]
    stats = {s["name"]: s for s in result.report.pass_stats}
    assert stats[PASS]["applied"] == 1 and stats[PASS]["removed_nodes"] == 1
    assert stats[PASS]["removed_bytes"] > 0  # the Reshape read 16 + 32 bytes and wrote 16
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_unsqueeze_bn_parameters_opset9_fold_into_conv(fuse):
    # caffe2-era: BN parameters arrive as Unsqueeze(Constant) (axes attribute before opset 13), then Squeeze.
    b = GraphBuilder(constants="node")
    x = b.input("x", [1, 3, 6, 6])
    conv = b.conv(x, 3, 4)
    params = []
    for values in (b.rng.uniform(0.5, 1.5, 4), b.rng.standard_normal(4) * 0.1, b.rng.standard_normal(4) * 0.1,
                   b.rng.uniform(0.5, 1.5, 4)):
        params.append(b.op("Squeeze", [b.op("Unsqueeze", [b.const(values.astype(np.float32))], axes=[0])],
                           axes=[0]))
    model = b.build(b.op("Relu", [b.op("BatchNormalization", [conv, *params])]), opset=9, ir_version=4)
    result = fuse(model, only=BN_FUSED, target="cpu+cuda")
    assert op_counts(result.model) == {"FusedConv": 1}
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_constant_of_shape_weight_becomes_initializer(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 3, 6, 6])
    w = b.op("ConstantOfShape", [b.const(np.array([4, 3, 3, 3], np.int64))],
             value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.1]))
    model = b.build(b.op("Relu", [b.conv(x, 3, 4, weight=w)]), opset=11)
    result = fuse(model, only=(PASS, "conv_activation"), target="cpu+cuda")
    assert op_counts(result.model) == {"FusedConv": 1}
    (weight,) = [t for t in result.model.graph.initializer if t.name == w]  # the folded tensor keeps its name
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(weight), np.full((4, 3, 3, 3), 0.1, np.float32))
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_chain_of_constant_nodes_folds_in_one_run(fuse):
    # Shape -> Gather -> Unsqueeze -> Concat -> Reshape, all on constants: every node folds.
    b = GraphBuilder()
    x = b.input("x", [1, 4, 6, 6])
    c = b.const(b.rand(4, 1, 1))
    dim = b.op("Gather", [b.op("Shape", [c]), b.const(np.array(0, np.int64))], axis=0)
    shape = b.op("Concat", [b.const(np.array([1], np.int64)), b.op("Unsqueeze", [dim, b.const(np.array([0]))]),
                            b.const(np.array([1, 1], np.int64))], axis=0)
    model = b.model(b.op("Mul", [x, b.op("Reshape", [c, shape])]), opset=13)
    model.graph.output[0].type.CopyFrom(helper.make_tensor_type_proto(TensorProto.FLOAT, [1, 4, 6, 6]))
    result = fuse(model)
    assert op_counts(result.model) == {"Mul": 1}
    assert sum(f.pass_name == PASS for f in result.fusions) == 5
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_folds_inside_if_branches(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 3, 6, 6])
    cond = b.input("cond", [], dtype=np.bool_)
    branches = []
    for prefix in ("then_", "else_"):
        sb = GraphBuilder(seed=len(prefix), prefix=prefix, constants="node")
        sb.input("x", [1, 3, 6, 6])
        bias = sb.op("Reshape", [sb.const(sb.rand(4)), sb.const(np.array([1, 4, 1, 1], np.int64))])
        branches.append(subgraph(sb, sb.op("Relu", [sb.op("Add", [sb.conv(x, 3, 4, bias=False), bias])])))
    model = b.build(b.op("If", [cond], then_branch=branches[0], else_branch=branches[1]), opset=14)
    result = fuse(model, only=BIAS_FUSED, target="cpu+cuda")
    assert compute_ops(result.model) == {"If": 1, "FusedConv": 2}
    (if_node,) = result.model.graph.node
    for branch in ("then_branch", "else_branch"):
        assert [n.op_type for n in attr(if_node, branch).node if n.op_type != "Constant"] == ["FusedConv"]
    assert_if_branches_match(model, result.model)


def test_initializer_input_folds_when_declared_constant(fuse):
    model = reshape_bias(constants="initializer")
    model.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                             for t in model.graph.initializer if t.data_type == TensorProto.INT64)
    result = fuse(model, only=BIAS_FUSED, target="cpu+cuda", constant_initializer_inputs=True)
    assert op_counts(result.model) == {"FusedConv": 1}
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_idempotent_and_deterministic(tmp_path, fuse):
    model = reshape_bias()
    first, second = fuse(model, target="cpu"), fuse(model, target="cpu")
    data = first.model.SerializeToString(deterministic=True)
    assert data == second.model.SerializeToString(deterministic=True)
    again = fuse(first.model, target="cpu")
    assert not again.changed
    assert again.model.SerializeToString(deterministic=True) == data


def test_skip_runs_no_fold(fuse):
    model = reshape_bias()
    result = fuse(model, skip=(PASS,))
    assert "Reshape" in op_counts(result.model)
    assert not any(f.pass_name == PASS for f in result.fusions)


# --------------------------------------------------------------------------------------------------------------
# Refusals


def big_value_model(op):
    """x [1, 64, 128, 128] + a 4 MiB float32 value made from a few bytes by ``op``."""
    shape = [1, 64, 128, 128]
    b = GraphBuilder()
    x = b.input("x", shape)
    if op == "ConstantOfShape":
        big = b.op(op, [b.const(np.array(shape, np.int64))],
                   value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.5]))
    elif op == "Expand":
        big = b.op(op, [b.const(np.float32([0.5])), b.const(np.array(shape, np.int64))])
    else:
        big = b.op(op, [b.const(np.full((1, 1, 1, 1), 0.5, np.float32)), b.const(np.array(shape, np.int64))])
    return b.build(b.op("Add", [x, big]), opset=13)


@pytest.mark.parametrize("op", ["ConstantOfShape", "Expand", "Tile"])
def test_skip_fold_grows_model(fuse, op):
    model = big_value_model(op)
    s = assert_skipped(fuse(model), model, Reason.FOLD_GROWS)
    assert str(FOLD_GROWTH_LIMIT_BYTES) in s.detail
    assert 64 * 128 * 128 * 4 > FOLD_GROWTH_LIMIT_BYTES  # the case really is over the limit


def test_skip_fold_grows_model_copy_of_a_shared_constant(fuse):
    # Two Slices of one 256 KiB weight: folding either would add a copy while the weight stays for the other.
    b = GraphBuilder()
    x = b.input("x", [256, 128])
    w = b.const(b.rand(512, 128))
    outs = [b.op("Add", [x, b.op("Slice", [w, b.const(np.array([s], np.int64)), b.const(np.array([s + 256]))])])
            for s in (0, 256)]
    model = b.build(b.op("Add", outs), opset=13)
    result = fuse(model)
    skips = [s for s in result.skips if s.pass_name == PASS]
    assert [s.reason for s in skips] == [Reason.FOLD_GROWS, Reason.FOLD_GROWS]
    assert "copy" in skips[0].detail
    assert op_counts(result.model) == op_counts(model)


def test_skip_fold_grows_model_compact_weight_with_one_reader_stays_compact(fuse):
    # int8 weights Cast to float32 (4x the bytes) and scaled per channel, read by one conv: the Cast stays, and
    # the refusal says so instead of calling the float result a copy kept for other readers (there are none).
    b = GraphBuilder()
    x = b.input("x", [1, 16, 8, 8])
    model = b.build(b.op("Relu", [b.bn(b.conv(x, 16, 16, weight=compact_weight(b, 16, 16)), 16)]), opset=13)
    result = fuse(model, only=(PASS, "conv_batchnorm"))
    s = skip_of(result, PASS)
    assert s.reason == Reason.FOLD_GROWS and s.nodes[0][1] == "Cast"
    assert "larger than its compact constant inputs (2304 bytes, read by this node only" in s.detail
    assert "copy" not in s.detail and "other readers" not in s.detail
    assert "Cast" in op_counts(result.model) and "BatchNormalization" not in op_counts(result.model)


def two_compact_convs():
    """x -> (Conv(int8 x scale weight [16, 16, 3, 3]) -> BN -> Relu) x 2: each Cast would add 6912 bytes."""
    b = GraphBuilder()
    y = b.input("x", [1, 16, 8, 8])
    for _ in range(2):
        y = b.op("Relu", [b.bn(b.conv(y, 16, 16, weight=compact_weight(b, 16, 16)), 16)])
    return b.build(y, opset=13)


def int8_bytes(model):
    return sum(len(t.raw_data) for t in model.graph.initializer if t.data_type == TensorProto.INT8)


@pytest.mark.parametrize("budget, materialized", [(0, 0), (6912, 1), (13824, 2)])
def test_materialize_weights_within_the_budget(fuse, budget, materialized):
    # Options.materialize_weights_bytes (--materialize-weights): a Cast of an int8 weight grows the model by 3 x
    # 2304 bytes; the budget lets that many weights become float32 constants, the others stay int8 and compact.
    model = two_compact_convs()
    result = fuse(model, only=BN_FUSED, materialize_weights_bytes=budget)
    counts = op_counts(result.model)
    assert counts["FusedConv"] == 2 and "BatchNormalization" not in counts
    assert counts["Cast"] == 2 - materialized
    assert int8_bytes(result.model) == 2304 * (2 - materialized)
    grown = result.model.ByteSize() - model.ByteSize()
    assert 6912 * materialized - 1024 <= grown <= 6912 * materialized + 1024  # the float weights, give or take names
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_materialize_weights_never_grows_a_value_that_is_no_weight(fuse):
    # ConstantOfShape of 4 MiB added to the data: no weight, so no budget lets it into the file.
    model = big_value_model("ConstantOfShape")
    s = assert_skipped(fuse(model, materialize_weights_bytes=1 << 30), model, Reason.FOLD_GROWS)
    assert str(FOLD_GROWTH_LIMIT_BYTES) in s.detail


def test_skip_initializer_is_graph_input(fuse):
    model = reshape_bias(op=None, constants="initializer")
    model.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                             for t in model.graph.initializer if t.data_type == TensorProto.INT64)
    s = assert_skipped(fuse(model), model, Reason.INITIALIZER_IS_INPUT)
    assert "--constant-initializer-inputs" in s.detail


def test_skip_random_op(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 4])
    noise = b.op("RandomUniform", [], shape=[1, 4], dtype=TensorProto.FLOAT)
    model = b.build(b.op("Add", [x, noise]), opset=13)
    assert_skipped(fuse(model), model, Reason.RANDOM_OP)


def test_skip_quantize_dequantize_node(fuse):
    # A QDQ weight: DequantizeLinear(int8 constant) stays a node for onnxruntime's QDQ Conv fusion.
    b = GraphBuilder()
    x = b.input("x", [1, 3, 6, 6])
    w = b.op("DequantizeLinear", [b.const(np.ones((4, 3, 3, 3), np.int8)), b.const(np.float32(0.02)),
                                  b.const(np.int8(0))])
    model = b.build(b.conv(x, 3, 4, weight=w), opset=13)
    result = fuse(model)
    assert skip_of(result, PASS).reason == Reason.QDQ_NODE
    assert op_counts(result.model) == op_counts(model)


def test_a_constant_computation_that_is_a_main_graph_output_folds(fuse):
    # onnxruntime runs a model whose graph output is an initializer: the folded value keeps the output's name
    b = GraphBuilder(constants="node")
    x = b.input("x", [1, 4])
    shaped = b.op("Reshape", [b.const(b.rand(4)), b.const(np.array([1, 4], np.int64))])
    t = b.op("Transpose", [b.const(b.rand(3, 2))])  # Transpose of a constant that is a graph output
    model = b.build([b.op("Add", [x, shaped]), shaped, t], opset=14)
    result = fuse(model)
    assert op_counts(result.model) == {"Add": 1}
    assert [o.name for o in result.model.graph.output] == [o.name for o in model.graph.output]
    assert {shaped, t} <= {i.name for i in result.model.graph.initializer}
    onnx.checker.check_model(result.model, full_check=True)
    assert_same_outputs(model, result.model, rtol=0, atol=0)


def test_skip_intermediate_is_graph_output(fuse):
    # an If branch's output stays computed: the branch keeps its own outputs
    b = GraphBuilder()
    x = b.input("x", [1, 4])
    cond = b.input("c", [], dtype=np.bool_)
    then = GraphBuilder(prefix="t_", constants="node")
    then_out = then.op("Reshape", [then.const(then.rand(4)), then.const(np.array([1, 4], np.int64))])
    other = GraphBuilder(prefix="e_")
    els = other.op("Neg", [x])
    branch = b.op("If", [cond], then_branch=subgraph(then, then_out), else_branch=subgraph(other, els))
    model = b.build(b.op("Add", [x, branch]), opset=14)
    result = fuse(model)
    assert skip_of(result, PASS).reason == Reason.GRAPH_OUTPUT
    assert op_counts(result.model) == op_counts(model)


def test_skip_dtype_not_foldable(fuse):
    b = GraphBuilder()
    x = b.input("x", [1])
    text = b.const(np.array(["1.5"], dtype=object))
    model = b.build(b.op("Add", [x, b.op("Cast", [text], to=TensorProto.FLOAT)]), opset=13)
    assert_skipped(fuse(model), model, Reason.DTYPE_NOT_FOLDABLE)


def test_skip_evaluation_failed(fuse):
    # 5 values into shape [1, 4]: onnx.checker accepts the model, onnxruntime refuses the Reshape.
    b = GraphBuilder()
    x = b.input("x", [1, 4])
    bad = b.op("Reshape", [b.const(b.rand(5)), b.const(np.array([1, 4], np.int64))])
    model = b.model(b.op("Add", [x, bad]), opset=14)
    model.graph.output[0].type.CopyFrom(helper.make_tensor_type_proto(TensorProto.FLOAT, [1, 4]))
    s = assert_skipped(fuse(model), model, Reason.EVALUATION_FAILED)
    assert "onnxruntime" in s.detail


def test_graph_inputs_and_outputs_unchanged(fuse):
    model = reshape_bias()
    result = fuse(model)
    assert [i.name for i in result.model.graph.input] == ["x"]
    assert [o.name for o in result.model.graph.output] == [o.name for o in model.graph.output]


def test_report_counts_refusals_per_pass_not_as_unfused_patterns(tmp_path):
    model = big_value_model("Tile")
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    report = pipeline.analyse(path, pipeline.Options(target="cpu", only=(PASS,))).report
    stats = {s["name"]: s for s in report.pass_stats}
    assert stats[PASS]["skipped"] == {Reason.FOLD_GROWS: 1}
    assert stats[PASS]["removed_nodes"] == 0
    assert report.unfused == []


def test_caffe2_era_ir3_graph_folds_and_stays_idempotent(fuse):
    # opset 9, IR 3 (every initializer is a graph input): weights from ConstantOfShape, BN parameters from
    # Unsqueeze(Constant). The folded values are new initializers, listed as inputs as IR 3 requires.
    b = GraphBuilder(constants="node")
    x = b.input("x", [1, 3, 6, 6])
    w = b.op("ConstantOfShape", [b.const(np.array([4, 3, 3, 3], np.int64))],
             value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.05]))
    params = [b.op("Squeeze", [b.op("Unsqueeze", [b.const(np.full(4, v, np.float32))], axes=[0])], axes=[0])
              for v in (1.5, 0.1, 0.2, 0.9)]
    y = b.op("Relu", [b.op("BatchNormalization", [b.conv(x, 3, 4, weight=w, bias=False), *params])])
    model = b.build(y, opset=9, ir_version=3)
    result = fuse(model, only=BN_FUSED, target="cpu+cuda")
    assert compute_ops(result.model) == {"FusedConv": 1}
    assert result.model.graph.input[0].name == "x"
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)
    again = fuse(result.model, only=BN_FUSED, target="cpu+cuda")
    assert not again.changed


def optional_of_constant(opset: int) -> onnx.ModelProto:
    """y = Relu(x + OptionalGetElement(Optional(c))), h = OptionalHasElement(Optional(c)); the optional value has
    a value_info of optional type, as exporters write it."""
    b = GraphBuilder()
    x = b.input("x", [2, 3])
    opt = b.op("Optional", [b.const(b.rand(2, 3))])
    y = b.op("Relu", [b.op("Add", [x, b.op("OptionalGetElement", [opt])])])
    has = b.op("OptionalHasElement", [opt])
    model = b.build([y, b.op("Identity", [has])], opset=opset)
    model.graph.output[1].type.CopyFrom(helper.make_tensor_type_proto(TensorProto.BOOL, []))
    optional = helper.make_optional_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, [2, 3]))
    model.graph.value_info.append(helper.make_value_info(opt, optional))
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("opset", [15, 17, 18])
def test_optional_of_a_constant_is_not_folded(fuse, opset):
    # folded, Optional(c) became a plain tensor: OptionalHasElement rejects one before opset 18
    model = optional_of_constant(opset)
    result = fuse(model)
    onnx.checker.check_model(result.model, full_check=True)
    assert op_counts(result.model)["Optional"] == 1
    assert not [f for f in result.fusions if f.pass_name == PASS]
    assert not [s for s in result.skips if s.pass_name == PASS]
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_sequence_of_constants_is_not_folded(fuse):
    b = GraphBuilder()
    x = b.input("x", [2, 3])
    seq = b.op("SequenceConstruct", [b.const(b.rand(1, 3)), b.const(b.rand(1, 3))])
    model = b.build(b.op("Add", [x, b.op("ConcatFromSequence", [seq], axis=0)]), opset=17)
    result = fuse(model)
    onnx.checker.check_model(result.model, full_check=True)
    assert op_counts(result.model)["SequenceConstruct"] == 1
    assert not [s for s in result.skips if s.pass_name == PASS]
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


# --------------------------------------------------------------------------------------------------------------
# Shape and Size of statically shaped run-time tensors


def keras_flatten_mlp(x_shape=(2, 4, 6, 6), opset=13):
    """tf2onnx's Keras ``Flatten`` then four Dense layers: x -> Conv(4 -> 3) -> Relu -> Reshape(y, Concat(
    Unsqueeze(Gather(Shape(y), 0)), [-1])) -> 4 x (MatMul -> Add(b) [-> Relu, the last without])."""
    b = GraphBuilder()
    x = b.input("x", list(x_shape))
    y = b.op("Relu", [b.conv(x, 4, 3)])
    batch = b.op("Gather", [b.op("Shape", [y]), b.const(np.array(0, np.int64))], axis=0)
    shape = b.op("Concat", [b.op("Unsqueeze", [batch, b.const(np.array([0], np.int64))]),
                            b.const(np.array([-1], np.int64))], axis=0)
    h, k = b.op("Reshape", [y, shape]), 3 * x_shape[2] * x_shape[3]
    for i, n in enumerate((16, 12, 8, 5)):
        h = b.op("Add", [b.op("MatMul", [h, b.const(b.rand(k, n))]), b.const(b.rand(n, scale=0.1))])
        h, k = (b.op("Relu", [h]) if i < 3 else h), n
    model = b.model(h, opset=opset)
    model.graph.output[0].type.CopyFrom(helper.make_tensor_type_proto(TensorProto.FLOAT, [x_shape[0], 5]))
    return model


def test_size_of_static_tensor_folds(fuse):
    b = GraphBuilder()
    x = b.input("x", [2, 3, 4])
    size = b.op("Cast", [b.op("Size", [x])], to=TensorProto.FLOAT)
    model = b.build(b.op("Div", [x, size]), opset=13)
    result = fuse(model)
    onnx.checker.check_model(result.model, full_check=True)
    assert compute_ops(result.model) == {"Div": 1}
    (div,) = result.model.graph.node
    np.testing.assert_array_equal(tensor(result.model, div.input[1]), np.float32(24))
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(("start", "end", "expected"), [(1, None, [3, 4, 5]), (-2, None, [4, 5]), (1, -1, [3, 4]),
                                                        (-9, 2, [3]), (2, 9, [4, 5])])
def test_shape_with_start_and_end_reads_only_its_dims(fuse, start, end, expected):
    # Shape-15 start/end: the batch dim N is symbolic, and only the static dims the slice reads are folded;
    # start -9 clamps to 0, which includes N: no fold.
    b = GraphBuilder()
    x = b.input("x", ["N", 3, 4, 5])
    attrs = {"start": start} | ({"end": end} if end is not None else {})
    shape = b.op("Cast", [b.op("Shape", [x], **attrs)], to=TensorProto.FLOAT)
    model = b.build(b.op("Add", [b.op("ReduceSum", [x], keepdims=0), shape]), opset=15)
    result = fuse(model)
    onnx.checker.check_model(result.model, full_check=True)
    counts = compute_ops(result.model)
    if start == -9:
        assert counts["Shape"] == 1  # the symbolic N is read: never frozen
    else:
        assert "Shape" not in counts and "Cast" not in counts, counts
        (add,) = [n for n in result.model.graph.node if n.op_type == "Add"]
        np.testing.assert_array_equal(tensor(result.model, add.input[1]), np.array(expected, np.float32))
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)}
    np.testing.assert_allclose(run(result.model, feeds)[0], run(model, feeds)[0], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("dim", ["N", None, 0, -1])
def test_shape_of_symbolic_or_unknown_dims_is_never_folded(fuse, dim):
    # a named symbolic dim, an unnamed one, and the 0 / -1 some exporters write for "dynamic"
    model = keras_flatten_mlp()
    x = model.graph.input[0].type.tensor_type.shape.dim[0]
    x.Clear()
    if isinstance(dim, str):
        x.dim_param = dim
    elif dim is not None:
        x.dim_value = dim
    result = fuse(model)
    onnx.checker.check_model(result.model, full_check=True)
    counts = op_counts(result.model)
    assert counts["Shape"] == 1 and counts["Gather"] == 1, counts
    assert not [s for s in result.skips if s.pass_name == PASS]


def test_static_concat_of_sliced_shape_bias_folds_into_the_conv(fuse):
    # a bias reshaped with Concat(Slice(Shape(x)), [C, 1, 1]) of a static x: it folds, its Add goes into the conv
    b = GraphBuilder()
    x = b.input("x", [1, 3, 6, 6])
    first = b.op("Slice", [b.op("Shape", [x]), b.const(np.array([0], np.int64)), b.const(np.array([1], np.int64))])
    shape = b.op("Concat", [first, b.const(np.array([4, 1, 1], np.int64))], axis=0)
    bias = b.op("Reshape", [b.const(b.rand(4)), shape])
    model = b.model(b.op("Relu", [b.op("Add", [b.conv(x, 3, 4, bias=False), bias])]), opset=13)
    model.graph.output[0].type.CopyFrom(helper.make_tensor_type_proto(TensorProto.FLOAT, [1, 4, 6, 6]))
    result = fuse(model, only=BIAS_FUSED, target="cpu+cuda")
    onnx.checker.check_model(result.model, full_check=True)
    assert op_counts(result.model) == {"FusedConv": 1}
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


# Memory: a fold is sized before it runs


def bomb_model(op, scale=10 ** 6):
    """x [1] + a value of about ``scale``**2 float32 elements (4 TB at the default) that ``op`` makes from a few
    bytes of constants (``RangeOverflow``: 1e60, onnx infers 0 for it) + Reshape(a constant), which folds."""
    b = GraphBuilder()
    x = b.input("x", [1])
    small, n = b.const(np.zeros((1, 1), np.float32)), scale
    if op == "Range":
        big = b.op(op, [b.const(np.float32(0)), b.const(np.float32(n * n)), b.const(np.float32(1))])
    elif op == "RangeOverflow":
        big = b.op("Range", [b.const(np.float32(0)), b.const(np.float32(1e30)), b.const(np.float32(1e-30))])
    elif op == "Pad":
        big = b.op(op, [small, b.const(np.array([0, 0, n, n], np.int64))])
    elif op == "Resize":
        big = b.op(op, [b.const(np.zeros((1, 1, 2, 2), np.float32)), b.const(np.array([], np.float32)),
                        b.const(np.array([1, 1, n / 2, n / 2], np.float32))])
    elif op == "Expand":
        big = b.op(op, [b.const(np.float32([0.5])), b.const(np.array([n, n], np.int64))])
    elif op == "ConstantOfShape":
        big = b.op(op, [b.const(np.array([n, n], np.int64))])
    else:
        big = b.op(op, [small, b.const(np.array([n, n], np.int64))])
    y = b.op("Add", [x, b.op("Reshape", [big, b.const(np.array([-1], np.int64))])])
    one = b.op("Reshape", [b.const(np.float32([[0.25]])), b.const(np.array([1], np.int64))])  # a fold to make
    model = b.model(b.op("Add", [y, one]), opset=13)
    model.graph.output[0].type.CopyFrom(helper.make_tensor_type_proto(TensorProto.FLOAT, ["n"]))
    return model


def spy_evaluations(monkeypatch):
    """The op types constant_fold hands to onnxruntime from now on."""
    from onnxfuse.passes import constant_fold

    seen, real = [], constant_fold.evaluate
    monkeypatch.setattr(constant_fold, "evaluate", lambda node, *a: seen.append(node.op) or real(node, *a))
    return seen


@pytest.mark.parametrize("op", ["Range", "RangeOverflow", "Pad", "Resize", "Expand", "ConstantOfShape", "Tile"])
def test_skip_fold_grows_model_bomb_refused_before_it_runs(tmp_path, monkeypatch, op):
    # A few hundred bytes that describe terabytes: refused from its predicted size, never computed; the model is
    # still optimized and written (--no-verify: onnxruntime could not run the original either).
    from click.testing import CliRunner

    from onnxfuse.cli.main import main

    model = bomb_model(op)
    src, dst = tmp_path / "bomb.onnx", tmp_path / "out.onnx"
    onnx.save(model, str(src))
    assert src.stat().st_size < 1000
    seen = spy_evaluations(monkeypatch)
    result = pipeline.analyse(src, pipeline.Options(target="cpu", only=(PASS,)))
    (s,) = [s for s in result.skips if s.pass_name == PASS]
    assert s.reason == Reason.FOLD_GROWS and s.nodes[0][1] == op.replace("Overflow", "")
    assert op.replace("Overflow", "") not in seen and "Reshape" in seen  # the small Reshape still folds
    cli = CliRunner().invoke(main, ["optimize", str(src), str(dst), "--no-verify"])
    assert cli.exit_code == 0, cli.output
    counts = op_counts(onnx.load(str(dst)))
    assert counts[op.replace("Overflow", "")] == 1 and counts["Reshape"] == 1


def test_skip_fold_grows_model_range_refused_and_optimize_verifies(monkeypatch):
    # 16 MiB from Range(0, 4M, 1): small enough for verification to run both models, over the growth limit.
    from onnxfuse import api

    model = bomb_model("Range", scale=2048)
    seen = spy_evaluations(monkeypatch)
    result = api.optimize(model, verify=True, only=(PASS,))
    assert skip_of(result, PASS).reason == Reason.FOLD_GROWS and "Range" not in seen
    assert result.report.verification.status == "passed"
    assert op_counts(result.model) == {"Range": 1, "Reshape": 1, "Add": 2}  # the other Reshape folded


def test_skip_fold_size_unknown(fuse, monkeypatch):
    # NonMaxSuppression on constants: onnx shape inference cannot size its output, so it is not computed.
    b = GraphBuilder()
    x = b.input("x", [1, 3], dtype=np.int64)
    boxes = b.const(np.array([[[0, 0, 1, 1], [0, 0, 1, 1.1]]], np.float32))
    nms = b.op("NonMaxSuppression", [boxes, b.const(np.float32([[[0.9, 0.8]]])), b.const(np.array([2]))])
    model = b.model(b.op("Add", [x, nms]), opset=13, output_dtype=np.int64)
    model.graph.output[0].type.CopyFrom(helper.make_tensor_type_proto(TensorProto.INT64, ["n", 3]))
    seen = spy_evaluations(monkeypatch)
    s = assert_skipped(fuse(model), model, Reason.FOLD_SIZE_UNKNOWN)
    assert "NonMaxSuppression" in s.detail and seen == []


def test_nonzero_of_constants_folds_within_its_bound(fuse):
    # NonZero's output size depends on the values: its input bounds it (rank x elements x 8 bytes), so it folds.
    b = GraphBuilder()
    x = b.input("x", [2, 3], dtype=np.int64)
    nz = b.op("NonZero", [b.const(np.array([[0, 1, 0], [2, 0, 3]], np.float32))])
    model = b.model(b.op("Add", [x, nz]), opset=13, output_dtype=np.int64)
    model.graph.output[0].type.CopyFrom(helper.make_tensor_type_proto(TensorProto.INT64, [2, 3]))
    result = fuse(model)
    assert op_counts(result.model) == {"Add": 1}
    assert_same_outputs(model, result.model, rtol=0, atol=0)


# --------------------------------------------------------------------------------------------------------------
# Values a fold must not freeze or misread


def test_training_mode_dropout_is_never_folded(fuse, monkeypatch):
    # Dropout(constant, ratio, training_mode=True) draws a new mask per run: folding would freeze one draw.
    b = GraphBuilder()
    x = b.input("x", [1, 8])
    drop = b.op("Dropout", [b.const(b.rand(1, 8)), b.const(np.float32(0.5)), b.const(np.bool_(True))])
    model = b.build(b.op("Add", [x, drop]), opset=13)
    seen = spy_evaluations(monkeypatch)
    result = fuse(model)
    assert skip_of(result, PASS).reason == Reason.RANDOM_OP and "training" in skip_of(result, PASS).detail
    assert op_counts(result.model)["Dropout"] == 1 and "Dropout" not in seen


def test_inference_dropout_of_constants_folds(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 8])
    drop = b.op("Dropout", [b.const(b.rand(1, 8)), b.const(np.float32(0.5)), b.const(np.bool_(False))])
    model = b.build(b.op("Add", [x, drop]), opset=13)
    result = fuse(model)
    assert op_counts(result.model) == {"Add": 1}
    assert_same_outputs(model, result.model, rtol=0, atol=0)


@pytest.mark.parametrize("to", [TensorProto.BFLOAT16, TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E5M2])
def test_fold_to_bfloat16_or_float8_keeps_its_dtype(to):
    # onnxruntime hands back float8e4m3fn as its uint8 bits and raises for bfloat16/float8e5m2: the folded Cast
    # must be stored with its own dtype (1.25 stays 1.25, not the integer 58), and the optimized model verifies.
    from onnxfuse import api

    values = np.float32([1.25, 3, -0.5, 6])
    b = GraphBuilder()
    x = b.input("x", [4])
    narrow = b.op("Cast", [b.const(values)], to=to)
    model = b.build(b.op("Add", [x, b.op("Cast", [narrow], to=TensorProto.FLOAT)]), opset=21, ir_version=10)
    result = api.optimize(model, verify=True, only=(PASS,))
    assert result.report.verification.status == "passed"
    (folded,) = [t for t in result.model.graph.initializer if t.name == narrow]
    assert folded.data_type == to
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(folded).astype(np.float32), values)
    assert_same_outputs(model, result.model, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_castlike_of_a_constant_folds_with_a_run_time_target(fuse, dtype):
    # CastLike reads only target_type's element type (ONNX CastLike-15): the constant folds, x stays an input
    b = GraphBuilder(dtype=dtype)
    x = b.input("x", [1, 4])
    c = b.op("CastLike", [b.const(np.array([[1, -2, 3, 70000]], np.int64)), x])
    model = b.build(b.op("Add", [x, c]), opset=15, output_dtype=dtype)
    result = fuse(model, only=(PASS,))
    assert op_counts(result.model) == {"Add": 1}
    assert_same_outputs(model, result.model, rtol=0, atol=0)


@pytest.mark.parametrize("start,end", [(2, None), (-2, None), (1, 3)])
def test_shape_with_start_of_static_trailing_dims_folds(fuse, start, end):
    b = GraphBuilder()
    x = b.input("x", ["N", 3, 8, 8])
    attrs = {"start": start} if end is None else {"start": start, "end": end}
    s = b.op("Cast", [b.op("Shape", [b.conv(x, 3, 4)], **attrs)], to=TensorProto.FLOAT)
    model = b.build(b.op("Mul", [s, b.const(np.float32(2))]), opset=15)
    result = fuse(model, only=(PASS,))
    assert "Shape" not in op_counts(result.model)
    feeds = {"x": np.zeros((2, 3, 8, 8), np.float32)}
    np.testing.assert_array_equal(run(result.model, feeds)[0], run(model, feeds)[0])
