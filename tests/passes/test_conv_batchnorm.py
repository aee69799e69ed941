"""conv_batchnorm: Conv/ConvTranspose -> BatchNormalization (inference) => Conv/ConvTranspose with folded W', B'.

Numerics: original and optimized run in onnxruntime at ORT_DISABLE_ALL (conftest.assert_same_outputs); float32
tolerance rtol=1e-4, atol=1e-5 (conftest.RTOL/ATOL: the fold reorders float arithmetic); float16 models
rtol=atol=1e-2 (W' is rounded to float16, about 5e-4 relative per weight, and the output sums 27 products).
"""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxfuse.records import Reason
from tests.builders import GraphBuilder, compact_weight, skip_of, subgraph, tensor, with_output_shapes
from tests.conftest import ATOL, RTOL, analyse_unchecked, assert_if_branches_match, assert_same_outputs, attr, op_counts
from tests.conftest import assert_skipped as check_skipped

PASS = "conv_batchnorm"
FP16_TOL = 1e-2


def conv_bn(rank=2, **conv_args):
    b = GraphBuilder()
    x = b.input("x", [2, 3] + [6] * rank)
    return b, b.bn(b.conv(x, 3, 4, rank=rank, **conv_args), 4)


def node_of(model, op):
    (node,) = [n for n in model.graph.node if n.op_type == op]
    return node


# --------------------------------------------------------------------------------------------------------------
# Positives


@pytest.mark.parametrize("bias", [True, False])
def test_folds_into_conv(fuse, bias):
    b, y = conv_bn(bias=bias)
    model = b.build(y)
    result = fuse(model)
    assert op_counts(result.model) == {"Conv": 1}
    conv = node_of(result.model, "Conv")
    assert len(conv.input) == 3  # a bias appears when the conv had none
    assert conv.input[1] != model.graph.node[0].input[1]  # fresh name, not the original weight's
    assert [f.pass_name for f in result.fusions] == [PASS]
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_epsilon_1e3_is_used(fuse):
    # Regression: a fold that assumed the default epsilon 1e-5 is visibly wrong when var is near 0.
    b = GraphBuilder()
    x = b.input("x", [1, 3, 6, 6])
    params = [b.const(np.array(v, np.float32)) for v in
              ([1.0, 0.5, 2.0, 1.0], [0.0, 0.1, 0.0, -0.1], [0.0, 0.0, 0.2, 0.0], [1e-3, 2e-3, 1e-4, 0.0])]
    model = b.build(b.op("BatchNormalization", [b.conv(x, 3, 4), *params], epsilon=1e-3))
    result = fuse(model)
    assert op_counts(result.model) == {"Conv": 1}
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_bn15_float32_params_with_float16_conv(fuse):
    # BN-15: X is T (float16 here), scale/B are T1 and mean/var T2 (float32 here); the fold is stored as float16.
    b = GraphBuilder(dtype=np.float16)
    x = b.input("x", [1, 3, 6, 6])
    model = b.build(b.bn(b.conv(x, 3, 4), 4, param_dtype=np.float32), opset=15)
    onnx.checker.check_model(model, full_check=True)  # the mixed dtypes are valid ONNX
    result = fuse(model)
    assert op_counts(result.model) == {"Conv": 1}
    conv = node_of(result.model, "Conv")
    assert tensor(result.model, conv.input[1]).dtype == np.float16
    assert tensor(result.model, conv.input[2]).dtype == np.float16
    assert_same_outputs(model, result.model, rtol=FP16_TOL, atol=FP16_TOL)


def test_float16_model_folds_and_stays_float16(fuse):
    b = GraphBuilder(dtype=np.float16)
    x = b.input("x", [1, 3, 6, 6])
    model = b.build(b.op("Relu", [b.bn(b.conv(x, 3, 4), 4)]))
    result = fuse(model, only=(PASS, "conv_activation"))
    assert op_counts(result.model) == {"Conv": 1, "Relu": 1}  # folded; no float16 FusedConv kernel for Relu
    conv = node_of(result.model, "Conv")
    assert {tensor(result.model, name).dtype for name in conv.input[1:]} == {np.dtype(np.float16)}
    assert skip_of(result, "conv_activation").reason == Reason.DTYPE_NO_KERNEL
    assert_same_outputs(model, result.model, rtol=FP16_TOL, atol=FP16_TOL)


def test_depthwise_conv_with_bias(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 4, 6, 6])
    model = b.build(b.bn(b.conv(x, 4, 4, group=4, bias=True), 4))
    result = fuse(model)
    assert op_counts(result.model) == {"Conv": 1}
    assert attr(node_of(result.model, "Conv"), "group") == 4
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("group", [1, 2])
def test_conv_transpose_grouped(fuse, group):
    # ConvTranspose weights are [C_in, M/group, k...]: output channel m is column m % (M/group) of group m // (M/group).
    b = GraphBuilder()
    x = b.input("x", [1, 4, 5, 5])
    model = b.build(b.bn(b.conv_transpose(x, 4, 6, group=group), 6))
    result = fuse(model)
    assert op_counts(result.model) == {"ConvTranspose": 1}
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("rank", [1, 3])
def test_1d_and_3d_convs(fuse, rank):
    b, y = conv_bn(rank=rank)
    model = b.build(y)
    result = fuse(model)
    assert op_counts(result.model) == {"Conv": 1}
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("constants", ["initializer", "node"])
def test_shared_weight_gets_fresh_initializer_and_is_not_edited(fuse, constants):
    b = GraphBuilder(constants=constants)
    x = b.input("x", [1, 3, 6, 6])
    w_value = b.rand(4, 3, 3, 3)
    w = b.const(w_value, name="W")
    folded = b.bn(b.conv(x, 3, 4, weight=w), 4)
    plain = b.conv(x, 3, 4, weight=w)
    model = b.build([folded, plain])
    result = fuse(model)
    # Constant nodes left: W and the plain conv's bias, both still read by the plain conv
    assert op_counts(result.model) == ({"Conv": 2} if constants == "initializer" else {"Conv": 2, "Constant": 2})
    conv_folded, conv_plain = [n for n in result.model.graph.node if n.op_type == "Conv"]
    assert conv_folded.input[1] != "W" and conv_plain.input[1] == "W"
    np.testing.assert_array_equal(tensor(result.model, "W"), w_value)  # the shared original is untouched
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)  # both outputs, the plain conv's too


def test_two_folds_of_one_shared_weight_get_distinct_initializers(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 3, 6, 6])
    w = b.const(b.rand(4, 3, 3, 3), name="W")
    model = b.build([b.bn(b.conv(x, 3, 4, weight=w), 4), b.bn(b.conv(x, 3, 4, weight=w), 4)])
    result = fuse(model)
    assert op_counts(result.model) == {"Conv": 2}
    weights = [n.input[1] for n in result.model.graph.node]
    assert len(set(weights)) == 2 and "W" not in weights
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_weights_in_constant_nodes(fuse):
    b = GraphBuilder(constants="node")
    x = b.input("x", [1, 3, 6, 6])
    model = b.build(b.bn(b.conv(x, 3, 4), 4))
    assert op_counts(model) == {"Constant": 6, "Conv": 1, "BatchNormalization": 1}
    result = fuse(model)
    assert op_counts(result.model) == {"Conv": 1}  # the unused Constant nodes are dropped
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_ir3_initializer_inputs_fold_when_declared_constant(fuse):
    b, y = conv_bn()
    model = b.build(y, initializers_as_inputs=True, ir_version=4, opset=8)
    result = fuse(model, constant_initializer_inputs=True)
    assert op_counts(result.model) == {"Conv": 1}
    onnx.checker.check_model(result.model)  # IR 3: the new initializers are graph inputs too
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_onnx_target_still_folds(fuse):
    b, y = conv_bn()
    model = b.build(b.op("Relu", [y]))
    result = fuse(model, target="onnx")
    assert op_counts(result.model) == {"Conv": 1, "Relu": 1}
    assert {imp.domain for imp in result.model.opset_import} == {""}
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_conv_inside_if_branch(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 3, 6, 6])
    cond = b.input("cond", [], dtype=np.bool_)
    branches = []
    for prefix in ("then_", "else_"):
        sb = GraphBuilder(seed=len(prefix), prefix=prefix)
        sb.input("x", [1, 3, 6, 6])
        branches.append(subgraph(sb, sb.bn(sb.conv(x, 3, 4), 4)))
    model = b.build(b.op("If", [cond], then_branch=branches[0], else_branch=branches[1]))
    result = fuse(model)
    assert op_counts(result.model) == {"If": 1, "Conv": 2}
    for branch in result.model.graph.node[0].attribute:
        assert [n.op_type for n in branch.g.node] == ["Conv"]
    assert_if_branches_match(model, result.model)


# --------------------------------------------------------------------------------------------------------------
# Skips: one per reason the pass gives


def assert_skipped(result, model, reason):
    return check_skipped(result, model, reason, PASS)


def test_skip_intermediate_has_other_consumers(fuse):
    b, y = conv_bn()
    conv_out = b.nodes[-1].input[0]
    model = b.build([y, b.op("Sigmoid", [conv_out])])
    s = assert_skipped(fuse(model), model, Reason.NOT_PRIVATE)
    assert conv_out in s.detail


def test_skip_intermediate_has_other_consumers_when_bn_is_in_a_subgraph(fuse):
    # Regression: a Conv in the main graph whose output only an If branch's BN reads was folded across the
    # boundary: the rewritten Conv ended up in both graphs (onnx.checker: "not in SSA form").
    b = GraphBuilder()
    x = b.input("x", [1, 3, 6, 6])
    cond = b.input("cond", [], dtype=np.bool_)
    conv = b.conv(x, 3, 4)
    then_b = GraphBuilder(seed=1, prefix="then_")
    then_b.input(conv, [1, 4, 6, 6])
    else_b = GraphBuilder(seed=2, prefix="else_")  # does not read the conv output
    model = b.build(b.op("If", [cond], then_branch=subgraph(then_b, then_b.bn(conv, 4)),
                         else_branch=subgraph(else_b, else_b.op("Identity", [else_b.const(else_b.rand(1, 4, 6, 6))]))))
    result = fuse(model)
    s = skip_of(result, PASS)
    assert s.reason == Reason.NOT_PRIVATE
    assert op_counts(result.model) == op_counts(model)
    onnx.checker.check_model(result.model)


def test_skip_intermediate_is_graph_output(fuse):
    b, y = conv_bn()
    model = b.build([y, b.nodes[-1].input[0]])
    s = assert_skipped(fuse(model), model, Reason.GRAPH_OUTPUT)
    assert "graph output" in s.detail


def test_skip_weights_not_constant(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 3, 6, 6])
    w = b.input("w", [4, 3, 3, 3])
    model = b.build(b.bn(b.conv(x, 3, 4, weight=w), 4))
    s = assert_skipped(fuse(model), model, Reason.WEIGHTS_NOT_CONSTANT)
    assert "weight w is not a constant" in s.detail


def test_skip_parameters_not_constant(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 3, 6, 6])
    scale = b.input("scale", [4])
    bn_inputs = [b.conv(x, 3, 4), scale] + [b.const(np.full(4, v, np.float32)) for v in (0.0, 0.0, 1.0)]
    model = b.build(b.op("BatchNormalization", bn_inputs))
    s = assert_skipped(fuse(model), model, Reason.PARAMS_NOT_CONSTANT)
    assert "parameter scale is not a constant" in s.detail


def test_skip_initializer_is_graph_input(fuse):
    # IR 3: every initializer is also a graph input, which onnxruntime lets a caller override.
    b, y = conv_bn()
    model = b.build(y, initializers_as_inputs=True, ir_version=4, opset=8)
    s = assert_skipped(fuse(model), model, Reason.INITIALIZER_IS_INPUT)
    assert "--constant-initializer-inputs" in s.detail


def test_skip_initializer_is_graph_input_for_a_bn_parameter(fuse):
    b, y = conv_bn()
    model = b.build(y)
    mean = b.nodes[-1].input[3]
    model.graph.input.append(helper.make_tensor_value_info(mean, TensorProto.FLOAT, [4]))
    s = assert_skipped(fuse(model), model, Reason.INITIALIZER_IS_INPUT)
    assert mean in s.detail


def training_mode_bn():
    b = GraphBuilder()
    x = b.input("x", [1, 3, 6, 6])
    params = [b.const(np.full(4, v, np.float32)) for v in (1.0, 0.0, 0.0, 1.0)]
    y, _, _ = b.op("BatchNormalization", [b.conv(x, 3, 4), *params], outputs=3, training_mode=1)
    return b.build(y, opset=15)


def spatial_0_bn():
    b, y = conv_bn()
    b.nodes[-1].attribute.append(helper.make_attribute("spatial", 0))
    return b.build(y, opset=7)


def running_mean_used_bn():
    b = GraphBuilder()
    x = b.input("x", [1, 3, 6, 6])
    params = [b.const(np.full(4, v, np.float32)) for v in (1.0, 0.0, 0.0, 1.0)]
    y, running_mean, _, _, _ = b.op("BatchNormalization", [b.conv(x, 3, 4), *params], outputs=5)
    model = b.model([y, running_mean], opset=9)
    for out, dims in zip(model.graph.output, ([1, 4, 6, 6], [4]), strict=False):
        out.type.CopyFrom(helper.make_tensor_type_proto(TensorProto.FLOAT, dims))
    return model


@pytest.mark.parametrize("make", [training_mode_bn, spatial_0_bn, running_mean_used_bn])
def test_skip_batchnorm_training_mode(fuse, make):
    model = make()
    reason = Reason.BN_SPATIAL if make is spatial_0_bn else Reason.TRAINING_MODE
    s = assert_skipped(fuse(model), model, reason)
    expected = "spatial=0" if make is spatial_0_bn else "training mode"
    assert expected in s.detail


def test_skip_parameter_shape_mismatch():
    # 5 BN values for a 4-channel conv: the load refuses it (strict shape inference), the pass too.
    b = GraphBuilder()
    model = b.model(b.bn(b.conv(b.input("x", [2, 3, 6, 6]), 3, 4), 5))
    model.graph.output[0].type.CopyFrom(helper.make_tensor_type_proto(TensorProto.FLOAT, [2, 4, 6, 6]))
    s = assert_skipped(analyse_unchecked(model, only=(PASS,)), model, Reason.PARAM_SHAPE)
    assert "4 values" in s.detail


def test_skip_dtype_not_foldable(fuse):
    # Conv-22 accepts bfloat16; numpy has no bfloat16, so the pass does not fold it.
    b = GraphBuilder()
    b.inputs.append(helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [1, 3, 6, 6]))
    b.inits.append(helper.make_tensor("w", TensorProto.BFLOAT16, [4, 3, 3, 3], np.ones(108).tolist()))
    y = b.bn(b.op("Conv", ["x", "w"], pads=[1, 1, 1, 1]), 4, param_dtype=np.float32)
    model = b.model(y, opset=22)
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.BFLOAT16
    model = with_output_shapes(model)
    s = assert_skipped(fuse(model), model, Reason.DTYPE_NOT_FOLDABLE)
    assert "bfloat16" in s.detail


def test_skip_quantized_conv(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 3, 6, 6])
    dq = b.dequantized(x)
    model = b.build(b.bn(b.conv(dq, 3, 4), 4))
    assert_skipped(fuse(model), model, Reason.QDQ)


def test_skip_fold_not_finite(fuse):
    # var + epsilon = 0: the scale is inf, and folding it would write inf weights
    b = GraphBuilder()
    x = b.input("x", [1, 3, 6, 6])
    params = [b.const(np.full(4, v, np.float32)) for v in (1.0, 0.0, 0.0, 0.0)]
    model = b.build(b.op("BatchNormalization", [b.conv(x, 3, 4), *params], epsilon=0.0))
    s = assert_skipped(fuse(model), model, Reason.FOLD_NOT_FINITE)
    assert "float32" in s.detail


def test_skip_fold_not_finite_when_var_cancels_the_default_epsilon(fuse):
    # no epsilon attribute: onnxruntime adds float32(1e-5), so var = -float32(1e-5) makes var + epsilon exactly 0
    # (inf scale, which onnxruntime computes too); the double 1e-5 left 2.5e-13 and a huge but finite scale
    b = GraphBuilder()
    x = b.input("x", [1, 3, 6, 6])
    params = [b.const(np.full(4, v, np.float32)) for v in (1.0, 0.0, 0.0, -np.float32(1e-5))]
    model = b.build(b.op("BatchNormalization", [b.conv(x, 3, 4), *params]))
    assert_skipped(fuse(model), model, Reason.FOLD_NOT_FINITE)


def test_skip_fold_that_overflows_float16(fuse):
    b = GraphBuilder(dtype=np.float16)
    x = b.input("x", [1, 3, 6, 6])
    # scale 100 / sqrt(0 + 1e-9) ~ 3e6: finite in float64, beyond float16's 65504
    params = [b.const(np.full(4, v, np.float16)) for v in (100.0, 0.0, 0.0, 0.0)]
    model = b.build(b.op("BatchNormalization", [b.conv(x, 3, 4), *params], epsilon=1e-9))
    assert_skipped(fuse(model), model, Reason.FOLD_NOT_FINITE)


def test_skip_batchnorm_spatial_0(fuse):
    model = spatial_0_bn()
    s = assert_skipped(fuse(model), model, Reason.BN_SPATIAL)
    assert "spatial=0" in s.detail


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_scaled_weight_stores_the_float64_fold_and_refuses_what_fold_fits_refuses(dtype, recwarn):
    """_fold.scaled_weight (W' computed straight into the weight's dtype) writes the bytes of the float64 fold
    cast to the dtype, and refuses exactly the folds fold_fits refuses on the float64 values: overflow, inf, NaN,
    and a product just above the dtype's largest value that rounds down to it. It warns about nothing."""
    import onnx_graphsurgeon as gs

    from onnxfuse.passes import _fold

    rng = np.random.default_rng(7)
    top = float(np.finfo(dtype).max)
    conv = gs.Node("Conv", "conv", inputs=[], outputs=[gs.Variable("y")])
    refused = 0
    for trial in range(120):
        m = int(rng.integers(1, 6))
        w = (rng.standard_normal((m, 2, 3, 3)) * rng.choice([1e-3, 1.0, top / 4])).astype(dtype)
        s = rng.standard_normal(m) * rng.choice([1e-30, 1.0, 1e5, 1e30])
        if trial % 7 == 0:
            w.flat[0], s[0] = top, 1 + 2.0**-40  # float64 product above the dtype's max, stored as the max
        if trial % 11 == 0:
            s[-1] = np.nan if trial % 2 else np.inf
        w.flags.writeable = False
        with np.errstate(all="ignore"):  # the reference: the float64 fold, checked, then cast
            wide = _fold.scale_output_channels(conv, w, s)
            want = _fold.fold_fits(w.dtype, wide, None, [conv], conv.outputs[0])
            stored = wide.astype(dtype)
        got, bad = _fold.scaled_weight(conv, w, s, [conv], conv.outputs[0])
        assert bad == want, trial
        if bad is None:
            assert got.dtype == w.dtype and got.tobytes() == stored.tobytes(), trial
        refused += bad is not None
    assert 0 < refused < 120
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


# --------------------------------------------------------------------------------------------------------------
# Weights computed from compact constants (int8 x scale, DequantizeLinear, ConstantOfShape/Expand/Tile)

COMPACT_FORMS = ["cast_mul", "dq_axis", "dq_tensor", "constant_of_shape", "expand", "tile"]
#: What stays of each form's weight computation after the fold (cast_mul and dq_axis: the scale is replaced, no
#: node added; the others: one Mul(W, s) appended).
COMPACT_NODES = {"cast_mul": {"Cast": 1, "Mul": 1}, "dq_axis": {"DequantizeLinear": 1},
                 "dq_tensor": {"DequantizeLinear": 1, "Mul": 1}, "constant_of_shape": {"ConstantOfShape": 1, "Mul": 1},
                 "expand": {"Expand": 1, "Mul": 1}, "tile": {"Tile": 1, "Mul": 1}}


def int8_initializers(model):
    return {t.name: t.raw_data for t in model.graph.initializer if t.data_type == TensorProto.INT8 and t.dims}


@pytest.mark.parametrize("form", COMPACT_FORMS)
def test_folds_into_compact_weight_which_stays_compact(fuse, form):
    # 16x16x3x3 weights: constant_fold refuses to Cast/dequantize the int8 ones (float32 is 4x their bytes) and to
    # broadcast one value into 9 KiB, so the BN folds into the weight's computation and the Relu fuses; any int8
    # tensor is kept byte for byte.
    b = GraphBuilder()
    x = b.input("x", [1, 16, 8, 8])
    y = b.bn(b.conv(x, 16, 16, weight=compact_weight(b, 16, 16, form=form)), 16)
    model = b.build(b.op("Relu", [y]), opset=13)
    result = fuse(model, only=("constant_fold", PASS, "conv_activation"))
    assert op_counts(result.model) == {"FusedConv": 1, **COMPACT_NODES[form]}
    assert [f.pass_name for f in result.fusions] == [PASS, "conv_activation"]
    assert int8_initializers(result.model) == int8_initializers(model)
    assert result.model.ByteSize() < model.ByteSize() + 512  # names and a [16] scale; no float weight
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_compact_weight_shared_by_two_convs_gets_a_mul_each(fuse):
    # W = Mul(Cast(int8), scale) read by two convs: its scale must not change, so each conv gets a Mul(W, s).
    b = GraphBuilder()
    x = b.input("x", [1, 16, 8, 8])
    w = compact_weight(b, 16, 16)
    y = b.op("Add", [b.bn(b.conv(x, 16, 16, weight=w), 16), b.bn(b.conv(x, 16, 16, weight=w), 16)])
    model = b.build(y, opset=13)
    result = fuse(model, only=(PASS,))
    assert op_counts(result.model) == {"Conv": 2, "Cast": 1, "Mul": 3, "Add": 1}
    assert int8_initializers(result.model) == int8_initializers(model)
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_skip_weights_not_constant_compact_weight_of_grouped_conv_transpose(fuse):
    # A grouped ConvTranspose's output channels are not one axis of W: no broadcast scale can fold them.
    b = GraphBuilder()
    x = b.input("x", [1, 4, 5, 5])
    w = b.op("ConstantOfShape", [b.const(np.array([4, 2, 2, 2], np.int64))],
             value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.05]))
    y = b.op("ConvTranspose", [x, w, b.const(b.rand(4))], group=2, strides=[2, 2])
    model = b.build(b.bn(y, 4), opset=13)
    result = fuse(model, only=(PASS,))
    s = skip_of(result, PASS)
    assert s.reason == Reason.WEIGHTS_NOT_CONSTANT and "grouped ConvTranspose" in s.detail
    assert op_counts(result.model) == op_counts(model)


def test_compact_weight_of_conv_transpose_is_scaled_along_axis_1(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 16, 5, 5])
    w = compact_weight(b, 16, 16)  # [C_in 16, M 16, 3, 3] for a ConvTranspose; scale on axis 0 is per input
    y = b.op("ConvTranspose", [x, w, b.const(b.rand(16))], strides=[2, 2])
    model = b.build(b.bn(y, 16), opset=13)
    result = fuse(model)
    assert "BatchNormalization" not in op_counts(result.model)
    assert int8_initializers(result.model) == int8_initializers(model)
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def _shared_weight_model(channels: int = 192):
    """Conv -> BN and a second Conv reading the same 3x3 weight (192 channels: 1.3 MB, over the 1 MiB a whole model
    may grow by for copies of shared weights)."""
    b = GraphBuilder()
    x = b.input("x", [1, channels, 4, 4])
    w = b.const(b.rand(channels, channels, 3, 3))
    return b.build([b.bn(b.conv(x, channels, channels, weight=w), channels),
                    b.conv(x, channels, channels, weight=w)])


def test_skip_fold_copies_shared_weight(fuse):
    model = _shared_weight_model()
    s = check_skipped(fuse(model), model, Reason.SHARED_WEIGHT_GROWTH, PASS)
    assert "--materialize-weights" in s.detail


def test_shared_weight_folds_within_materialize_weights(fuse):
    model = _shared_weight_model()
    result = fuse(model, materialize_weights_bytes=2 << 20)
    assert [f.pass_name for f in result.fusions] == [PASS]
    # each output sums 1728 products (192 channels x 3 x 3): float32 reassociation by the fold moves them by up to
    # ~2e-5, so atol is 10x conftest.ATOL here
    assert_same_outputs(model, result.model, rtol=RTOL, atol=10 * ATOL)
