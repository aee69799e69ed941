"""batchnorm_gemm: BatchNormalization -> (Flatten ->) Gemm => (Flatten ->) Gemm with the BN folded into B and C.

Numerics: original and optimized run in onnxruntime at ORT_DISABLE_ALL (conftest.assert_same_outputs); float32
tolerance rtol=1e-4, atol=1e-5 (conftest.RTOL/ATOL: the fold reorders float arithmetic); float16 rtol=atol=1e-2.
Shapes: a 2-D BN input [M=3, C=5], or a 4-D one [3, C, H, W] flattened at axis 1 into [3, K = C*H*W]; N=4 outputs.
"""

import numpy as np
import pytest
from onnx import TensorProto, helper

from onnxfuse.records import Reason
from tests.builders import GraphBuilder, tensor, with_output_shapes
from tests.conftest import ATOL, RTOL, analyse_unchecked, assert_same_outputs, attr, op_counts, run
from tests.conftest import assert_skipped as check_skipped

PASS = "batchnorm_gemm"
M, C, N = 3, 5, 4
FP16_TOL = 1e-2


def bn_gemm(x_shape=(M, C), flatten_axis=None, dtype=np.float32, **gemm_args):
    """x -> BN(C) [-> Flatten(axis)] -> Gemm(K -> N); K = product of x_shape[1:]."""
    b = GraphBuilder(dtype=dtype)
    y = b.bn(b.input("x", list(x_shape)), C)
    if flatten_axis is not None:
        y = b.op("Flatten", [y], axis=flatten_axis)
    k = int(np.prod(x_shape[1:]))
    return b, b.gemm(y, k, N, **gemm_args)


def the_gemm(model):
    (node,) = [n for n in model.graph.node if n.op_type == "Gemm"]
    return node


def assert_skipped(result, model, reason):
    return check_skipped(result, model, reason, PASS)


# --------------------------------------------------------------------------------------------------------------
# Positives


@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_2d_bn_folds(fuse, trans_b, bias):
    b, y = bn_gemm(trans_b=trans_b, bias=bias)
    model = b.build(y)
    result = fuse(model, target="onnx")
    assert op_counts(result.model) == {"Gemm": 1}
    assert the_gemm(result.model).input[0] == "x"
    assert [f.pass_name for f in result.fusions] == [PASS]
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("x_shape", [(M, C, 1, 1), (M, C, 2, 3), (M, C, 6), (M, C)])
@pytest.mark.parametrize("axis", [1, -3])
def test_flatten_at_axis_1_keeps_it(fuse, x_shape, axis):
    axis = axis if axis > 0 else 1 - len(x_shape)  # the same axis 1, written negatively
    b, y = bn_gemm(x_shape, flatten_axis=axis, trans_b=True)
    model = b.build(y)
    result = fuse(model)
    assert op_counts(result.model) == {"Flatten": 1, "Gemm": 1}
    assert result.model.graph.node[0].input[0] == "x"  # the Flatten now reads the BN's input
    assert [op for _, op, _ in result.fusions[0].replaced] == ["BatchNormalization", "Gemm"]
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(("x_shape", "target", "allowzero"), [
    ((M, C, 2, 3), [0, -1], 0),           # x.view(x.size(0), -1) as the TorchScript exporter writes it
    ((M, C, 1, 1), [-1, C], 1),           # x.flatten(1) as torch's dynamo exporter writes it
    (("batch", C, 1, 1), [-1, C], 1),     # the same with a symbolic batch dim
    ((M, C, 1, 1), [M, -1], 0),           # shape inference shows axis 0 kept
])
def test_reshape_that_keeps_axis_0_keeps_it(fuse, x_shape, target, allowzero):
    b = GraphBuilder()
    y = b.op("Reshape", [b.bn(b.input("x", list(x_shape)), C), b.const(np.array(target, np.int64))],
             allowzero=allowzero)
    k = int(np.prod(x_shape[1:]))
    model = b.build(b.gemm(y, k, N, trans_b=True), opset=14)
    result = fuse(model)
    assert op_counts(result.model) == {"Reshape": 1, "Gemm": 1}
    assert result.model.graph.node[0].input[0] == "x"
    for batch in (1, 2) if x_shape[0] == "batch" else (M,):
        feeds = {"x": np.random.default_rng(batch).standard_normal((batch, *x_shape[1:])).astype(np.float32)}
        np.testing.assert_allclose(run(result.model, feeds)[0], run(model, feeds)[0], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(("alpha", "beta"), [(0.5, 1.0), (2.0, 0.5), (-1.0, 0.0)])
def test_alpha_and_beta_are_honoured(fuse, alpha, beta):
    b, y = bn_gemm((M, C, 1, 1), flatten_axis=1, trans_b=True, alpha=alpha, beta=beta)
    model = b.build(y)
    result = fuse(model)
    assert op_counts(result.model) == {"Flatten": 1, "Gemm": 1}
    gemm = the_gemm(result.model)
    assert attr(gemm, "alpha") == pytest.approx(alpha) and attr(gemm, "beta") == 1.0
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("c_shape", [(N,), (1,), (M, N)])
def test_every_c_shape(fuse, c_shape):
    b, y = bn_gemm(c_shape=c_shape, beta=1.5)
    model = b.build(y)
    result = fuse(model)
    assert op_counts(result.model) == {"Gemm": 1}
    assert tensor(result.model, the_gemm(result.model).input[2]).shape == ((M, N) if c_shape == (M, N) else (N,))
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_float16(fuse):
    b, y = bn_gemm((M, C, 1, 1), flatten_axis=1, dtype=np.float16, trans_b=True)
    model = b.build(y)
    result = fuse(model)
    assert op_counts(result.model) == {"Flatten": 1, "Gemm": 1}
    assert tensor(result.model, the_gemm(result.model).input[1]).dtype == np.float16
    assert_same_outputs(model, result.model, rtol=FP16_TOL, atol=FP16_TOL)


def test_report_counts_the_bn_as_saved_and_the_flatten_as_kept(fuse):
    b, y = bn_gemm((M, C, 1, 1), flatten_axis=1, trans_b=True)
    model = b.build(y)
    report = fuse(model).report
    (row,) = report.fusions
    bn = next(r for r in report.nodes["before"] if r["op"] == "BatchNormalization")
    # the Gemm reads and writes tensors of the same sizes as before, so what is saved is the BN's traffic
    assert row["saved_bytes"] == bn["read_bytes"] + bn["written_bytes"]
    assert report.totals["saved_bytes"] == row["saved_bytes"]


# --------------------------------------------------------------------------------------------------------------
# Skips: one test per reason in BatchNormGemm.reasons


def test_skip_intermediate_has_other_consumers(fuse):
    b = GraphBuilder()
    y = b.bn(b.input("x", [M, C]), C)
    model = b.build([b.gemm(y, C, N), b.op("Relu", [y])])
    assert_skipped(fuse(model), model, Reason.NOT_PRIVATE)


def test_skip_intermediate_is_graph_output(fuse):
    b = GraphBuilder()
    y = b.op("Flatten", [b.bn(b.input("x", [M, C, 1, 1]), C)])
    model = b.build([b.gemm(y, C, N), y])
    assert_skipped(fuse(model), model, Reason.GRAPH_OUTPUT)


def test_skip_gemm_input_transposed(fuse):
    # transA = 1: the BN's channels (axis 1 of [K, M]) are the Gemm's rows (samples), not its input features
    b = GraphBuilder()
    y = b.bn(b.input("x", [C, M]), M)
    model = b.build(b.gemm(y, C, N, transA=1))
    assert_skipped(fuse(model), model, Reason.GEMM_TRANS_A)


@pytest.mark.parametrize(("x_shape", "axis"), [((M, C, 1, 1), 2), ((M, C, 1, 1), 0), ((M, C, 2, 2), -1)])
def test_skip_flatten_reorders_features(fuse, x_shape, axis):
    b = GraphBuilder()
    y = b.op("Flatten", [b.bn(b.input("x", list(x_shape)), C)], axis=axis)
    rows = int(np.prod(x_shape[: axis % len(x_shape)]))
    model = b.build(b.gemm(y, int(np.prod(x_shape)) // rows, N))
    s = assert_skipped(fuse(model), model, Reason.FLATTEN_REORDERS)
    assert f"axis {axis % len(x_shape)}" in s.detail


def test_skip_flatten_reorders_features_when_a_negative_axis_has_unknown_rank(fuse):
    b = GraphBuilder()
    x = b.op("Reshape", [b.input("x", [M, C]), b.input("shape", ["n"], dtype=np.int64)])
    y = b.op("Flatten", [b.bn(x, C)], axis=-1)
    model = b.model(b.gemm(y, C, N))
    model.graph.output[0].type.CopyFrom(helper.make_tensor_type_proto(TensorProto.FLOAT, ["a", N]))
    s = assert_skipped(fuse(model), model, Reason.FLATTEN_REORDERS)
    assert "unknown rank" in s.detail


def test_skip_flatten_reorders_features_for_a_reshape_that_moves_axis_0(fuse):
    # [3, 5, 2, 1] -> [-1, 5]: rows are (sample, position) pairs, features of one sample span two rows
    b = GraphBuilder()
    y = b.op("Reshape", [b.bn(b.input("x", [M, C, 2, 1]), C), b.const(np.array([-1, C], np.int64))])
    model = b.build(b.gemm(y, C, N))
    s = assert_skipped(fuse(model), model, Reason.FLATTEN_REORDERS)
    assert "[-1, 5]" in s.detail


def test_skip_weights_not_constant(fuse):
    b = GraphBuilder()
    model = b.build(b.gemm(b.bn(b.input("x", [M, C]), C), C, N, weight=b.input("w", [C, N])))
    assert_skipped(fuse(model), model, Reason.WEIGHTS_NOT_CONSTANT)


def test_skip_initializer_is_graph_input(fuse):
    b, y = bn_gemm()
    model = b.build(y, initializers_as_inputs=True, ir_version=4, opset=8)
    assert_skipped(fuse(model), model, Reason.INITIALIZER_IS_INPUT)


def test_skip_parameters_not_constant(fuse):
    # the running variance is computed at run time: a BN whose statistics are not constant
    b = GraphBuilder()
    var = b.op("Abs", [b.input("var", [C])])  # not Identity: remove_redundant would drop it
    params = [b.const(np.full(C, v, np.float32)) for v in (1.0, 0.0, 0.0)] + [var]
    model = b.build(b.gemm(b.op("BatchNormalization", [b.input("x", [M, C]), *params]), C, N))
    s = assert_skipped(fuse(model), model, Reason.PARAMS_NOT_CONSTANT)
    assert "not a constant" in s.detail


def test_skip_batchnorm_training_mode(fuse):
    b = GraphBuilder()
    params = [b.const(np.full(C, v, np.float32)) for v in (1.0, 0.0, 0.0, 1.0)]
    y, _, _ = b.op("BatchNormalization", [b.input("x", [M, C]), *params], outputs=3, training_mode=1)
    model = b.build(b.gemm(y, C, N), opset=15)
    assert_skipped(fuse(model), model, Reason.TRAINING_MODE)


def test_skip_parameter_shape_mismatch():
    # 3 channels cannot split K = 10 features evenly (the load refuses it: strict shape inference; the pass too)
    b = GraphBuilder()
    y = b.op("Flatten", [b.bn(b.input("x", [M, C, 2]), 3)])
    model = b.model(b.gemm(y, 2 * C, N))
    model.graph.output[0].type.CopyFrom(helper.make_tensor_type_proto(TensorProto.FLOAT, [M, N]))
    s = assert_skipped(analyse_unchecked(model, only=(PASS,)), model, Reason.PARAM_SHAPE)
    assert "3 BatchNormalization channels" in s.detail


def test_skip_dtype_not_foldable(fuse):
    b = GraphBuilder()
    b.inputs.append(helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [M, C]))
    b.inits.append(helper.make_tensor("w", TensorProto.BFLOAT16, [C, N], np.ones(C * N).tolist()))
    model = b.model(b.op("Gemm", [b.bn("x", C, param_dtype=np.float32), "w"]), opset=15)
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.BFLOAT16
    model = with_output_shapes(model)
    s = assert_skipped(fuse(model), model, Reason.DTYPE_NOT_FOLDABLE)
    assert "bfloat16" in s.detail


def test_skip_fold_not_finite(fuse):
    b = GraphBuilder()
    params = [b.const(np.full(C, v, np.float32)) for v in (1.0, 0.0, 0.0, 0.0)]
    y = b.op("BatchNormalization", [b.input("x", [M, C]), *params], epsilon=0.0)
    model = b.build(b.gemm(y, C, N))
    assert_skipped(fuse(model), model, Reason.FOLD_NOT_FINITE)


def test_skip_quantized_gemm(fuse):
    b = GraphBuilder()
    model = b.build(b.op("QuantizeLinear", [b.gemm(b.bn(b.input("x", [M, C]), C), C, N),
                                            b.const(np.float32(0.05)), b.const(np.uint8(128))]),
                    output_dtype=np.uint8)
    assert_skipped(fuse(model), model, Reason.QDQ_GEMM)


def test_unfused_row_would_save_the_bn_traffic(fuse):
    # traffic.fused_estimate for BN -> Flatten -> Gemm: the Flatten stays, so what a fold would save is the BN's
    # own traffic (the Flatten and the Gemm read tensors of the same sizes either way)
    b = GraphBuilder()
    y = b.op("Flatten", [b.bn(b.input("x", [M, C, 2, 3]), C)])
    model = b.build(b.gemm(y, 6 * C, N, weight=b.input("w", [6 * C, N])))
    result = fuse(model)
    assert_skipped(result, model, Reason.WEIGHTS_NOT_CONSTANT)
    (row,) = result.report.unfused
    bn = next(r for r in result.report.nodes["before"] if r["op"] == "BatchNormalization")
    assert row["bytes"] == bn["read_bytes"] + bn["written_bytes"]


def test_skip_batchnorm_spatial_0(fuse):
    # opset 7: BatchNormalization's spatial=0 keeps one statistic per element, not per feature
    b = GraphBuilder()
    y = b.bn(b.input("x", [M, C]), C, spatial=0)
    model = b.build(b.gemm(y, C, N), opset=7)
    s = assert_skipped(fuse(model), model, Reason.BN_SPATIAL)
    assert "spatial=0" in s.detail
