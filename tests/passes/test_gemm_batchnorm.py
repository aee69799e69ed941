"""gemm_batchnorm: Gemm -> BatchNormalization (inference, over the N output features) => Gemm with folded B, C.

Numerics: original and optimized run in onnxruntime at ORT_DISABLE_ALL (conftest.assert_same_outputs); float32
tolerance rtol=1e-4, atol=1e-5 (conftest.RTOL/ATOL: the fold reorders float arithmetic); float16 rtol=atol=1e-2
(B' and C' are rounded to float16, about 5e-4 relative each, and each output sums K=5 products).
Shapes: A is [M=3, K=5] ([K, M] with transA), B is [K, N=4] ([N, K] with transB), Y is [3, 4].
"""

import numpy as np
import pytest
from onnx import TensorProto, helper

from onnxfuse.records import Reason
from tests.builders import GraphBuilder, compact_gemm_weight, tensor, with_output_shapes
from tests.conftest import ATOL, RTOL, analyse_unchecked, assert_same_outputs, attr, op_counts
from tests.conftest import assert_skipped as check_skipped

PASS = "gemm_batchnorm"
M, K, N = 3, 5, 4
FP16_TOL = 1e-2


def gemm_bn(trans_a=False, dtype=np.float32, **gemm_args):
    b = GraphBuilder(dtype=dtype)
    x = b.input("x", [K, M] if trans_a else [M, K])
    if trans_a:
        gemm_args["transA"] = 1
    return b, b.bn(b.gemm(x, K, N, **gemm_args), N)


def the_gemm(model):
    (node,) = [n for n in model.graph.node if n.op_type == "Gemm"]
    return node


def assert_skipped(result, model, reason):
    return check_skipped(result, model, reason, PASS)


# --------------------------------------------------------------------------------------------------------------
# Positives


@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_folds_every_transpose_combination(fuse, trans_a, trans_b, bias):
    b, y = gemm_bn(trans_a=trans_a, trans_b=trans_b, bias=bias)
    model = b.build(y)
    result = fuse(model, target="onnx")
    assert op_counts(result.model) == {"Gemm": 1}
    gemm = the_gemm(result.model)
    assert len(gemm.input) == 3  # a C appears when the Gemm had none
    assert attr(gemm, "transA") == (1 if trans_a else None) and attr(gemm, "transB") == (1 if trans_b else None)
    assert [f.pass_name for f in result.fusions] == [PASS]
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(("alpha", "beta"), [(0.5, 1.0), (1.0, 2.5), (-1.5, 0.25), (2.0, 0.0)])
def test_alpha_and_beta_are_honoured(fuse, alpha, beta):
    b, y = gemm_bn(trans_b=True, alpha=alpha, beta=beta)
    model = b.build(y)
    result = fuse(model)
    assert op_counts(result.model) == {"Gemm": 1}
    gemm = the_gemm(result.model)
    assert attr(gemm, "alpha") == pytest.approx(alpha)  # alpha stays, beta is folded into C
    assert attr(gemm, "beta") == 1.0
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("c_shape", [(N,), (1, N), (1,), (), (M, N), (M, 1)])
def test_every_c_shape(fuse, c_shape):
    b, y = gemm_bn(c_shape=c_shape)
    model = b.build(y)
    result = fuse(model)
    assert op_counts(result.model) == {"Gemm": 1}
    new_c = tensor(result.model, the_gemm(result.model).input[2])
    assert new_c.shape == ((M, N) if c_shape and c_shape[0] == M else (N,))
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_weight_shared_with_another_gemm_is_not_edited(fuse):
    b = GraphBuilder()
    x = b.input("x", [M, K])
    w = b.const(b.rand(K, N))
    model = b.build([b.bn(b.gemm(x, K, N, weight=w), N), b.gemm(x, K, N, weight=w)])
    result = fuse(model)
    assert op_counts(result.model) == {"Gemm": 2}
    assert sum(1 for n in result.model.graph.node if w in n.input) == 1
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_float16_folds_and_stays_float16(fuse):
    b, y = gemm_bn(dtype=np.float16, trans_b=True)
    model = b.build(y)
    result = fuse(model)
    assert op_counts(result.model) == {"Gemm": 1}
    gemm = the_gemm(result.model)
    assert tensor(result.model, gemm.input[1]).dtype == np.float16
    assert tensor(result.model, gemm.input[2]).dtype == np.float16
    assert_same_outputs(model, result.model, rtol=FP16_TOL, atol=FP16_TOL)


def test_float64_fold_with_the_default_epsilon_matches_onnxruntime(fuse):
    """No epsilon attribute: onnxruntime adds float32(1e-5) (the attribute's type) to float64 data too. With the
    double 1e-5 the folded Gemm missed onnxruntime by about 5e-13, hundreds of times float64's noise; with
    float32(1e-5) it matches to float64 rounding (rtol 1e-13)."""
    b, y = gemm_bn(dtype=np.float64)
    model = b.build(y)
    assert not [a for n in model.graph.node for a in n.attribute if a.name == "epsilon"]
    result = fuse(model)
    assert op_counts(result.model) == {"Gemm": 1}
    assert_same_outputs(model, result.model, rtol=1e-13, atol=1e-15)


def test_opset_9_gemm_bn(fuse):
    b, y = gemm_bn(trans_b=True)
    model = b.build(y, opset=9)
    result = fuse(model)
    assert op_counts(result.model) == {"Gemm": 1}
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


# --------------------------------------------------------------------------------------------------------------
# Skips: one test per reason in GemmBatchNorm.reasons


def test_skip_intermediate_has_other_consumers(fuse):
    b = GraphBuilder()
    g = b.gemm(b.input("x", [M, K]), K, N)
    model = b.build([b.bn(g, N), b.op("Relu", [g])])
    assert_skipped(fuse(model), model, Reason.NOT_PRIVATE)


def test_skip_intermediate_is_graph_output(fuse):
    b = GraphBuilder()
    g = b.gemm(b.input("x", [M, K]), K, N)
    model = b.build([b.bn(g, N), g])
    assert_skipped(fuse(model), model, Reason.GRAPH_OUTPUT)


def test_skip_weights_not_constant(fuse):
    b = GraphBuilder()
    model = b.build(b.bn(b.gemm(b.input("x", [M, K]), K, N, weight=b.input("w", [K, N])), N))
    s = assert_skipped(fuse(model), model, Reason.WEIGHTS_NOT_CONSTANT)
    assert "weight w is not a constant" in s.detail


def test_skip_initializer_is_graph_input(fuse):
    b, y = gemm_bn()
    model = b.build(y, initializers_as_inputs=True, ir_version=4, opset=8)
    assert_skipped(fuse(model), model, Reason.INITIALIZER_IS_INPUT)


def test_skip_parameters_not_constant(fuse):
    # the running mean is computed at run time: a BN whose statistics are not constant
    b = GraphBuilder()
    g = b.gemm(b.input("x", [M, K]), K, N)
    mean = b.op("Neg", [b.input("mean", [N])])  # not Identity: remove_redundant would drop it
    params = [b.const(np.full(N, 1.0, np.float32)), b.const(np.zeros(N, np.float32)), mean,
              b.const(np.full(N, 1.0, np.float32))]
    model = b.build(b.op("BatchNormalization", [g, *params]))
    s = assert_skipped(fuse(model), model, Reason.PARAMS_NOT_CONSTANT)
    assert "not a constant" in s.detail


def test_skip_batchnorm_training_mode(fuse):
    b = GraphBuilder()
    g = b.gemm(b.input("x", [M, K]), K, N)
    params = [b.const(np.full(N, v, np.float32)) for v in (1.0, 0.0, 0.0, 1.0)]
    y, _, _ = b.op("BatchNormalization", [g, *params], outputs=3, training_mode=1)
    model = b.build(y, opset=15)
    s = assert_skipped(fuse(model), model, Reason.TRAINING_MODE)
    assert "training mode" in s.detail


def test_skip_parameter_shape_mismatch():
    # 5 BN values for 4 features: the load refuses it (strict shape inference), the pass too.
    b = GraphBuilder()
    model = b.model(b.bn(b.gemm(b.input("x", [M, K]), K, N), N + 1))
    model.graph.output[0].type.CopyFrom(helper.make_tensor_type_proto(TensorProto.FLOAT, [M, N]))
    s = assert_skipped(analyse_unchecked(model, only=(PASS,)), model, Reason.PARAM_SHAPE)
    assert "4 values" in s.detail


def test_skip_dtype_not_foldable(fuse):
    # Gemm-13 and BatchNormalization-15 accept bfloat16; numpy has no bfloat16, so the pass does not fold it.
    b = GraphBuilder()
    b.inputs.append(helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [M, K]))
    b.inits.append(helper.make_tensor("w", TensorProto.BFLOAT16, [K, N], np.ones(K * N).tolist()))
    y = b.bn(b.op("Gemm", ["x", "w"]), N, param_dtype=np.float32)
    model = b.model(y, opset=15)
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.BFLOAT16
    model = with_output_shapes(model)
    s = assert_skipped(fuse(model), model, Reason.DTYPE_NOT_FOLDABLE)
    assert "bfloat16" in s.detail


def test_skip_fold_not_finite(fuse):
    # var + epsilon = 0: the scale is inf
    b = GraphBuilder()
    g = b.gemm(b.input("x", [M, K]), K, N)
    params = [b.const(np.full(N, v, np.float32)) for v in (1.0, 0.0, 0.0, 0.0)]
    model = b.build(b.op("BatchNormalization", [g, *params], epsilon=0.0))
    assert_skipped(fuse(model), model, Reason.FOLD_NOT_FINITE)


def test_skip_quantized_gemm(fuse):
    b = GraphBuilder()
    model = b.build(b.bn(b.gemm(b.dequantized(b.input("x", [M, K])), K, N), N))
    s = assert_skipped(fuse(model), model, Reason.QDQ_GEMM)
    assert "Gemm" in s.detail


def test_skip_batchnorm_spatial_0(fuse):
    # opset 7: BatchNormalization's spatial=0 keeps one statistic per element, not per feature
    b = GraphBuilder()
    y = b.bn(b.gemm(b.input("x", [M, K]), K, N), N, spatial=0)
    model = b.build(y, opset=7)
    s = assert_skipped(fuse(model), model, Reason.BN_SPATIAL)
    assert "spatial=0" in s.detail


@pytest.mark.parametrize("form", ["cast_mul", "constant_of_shape"])
@pytest.mark.parametrize("trans_b", [False, True])
def test_folds_into_compact_weight_which_stays_compact(fuse, form, trans_b):
    # a 64x64 B computed from int8 x scale (or ConstantOfShape): the BN goes into B's per-feature scale (or a
    # Mul(B, s) before the Gemm) and C; the int8 tensor is kept byte for byte
    b = GraphBuilder()
    x = b.input("x", [3, 64])
    y = b.gemm(x, 64, 64, trans_b=trans_b, weight=compact_gemm_weight(b, 64, 64, trans_b, form))
    model = b.build(b.bn(y, 64), opset=13)
    result = fuse(model, only=(PASS,))
    computation = {"Cast": 1, "Mul": 1} if form == "cast_mul" else {"ConstantOfShape": 1, "Mul": 1}
    assert op_counts(result.model) == {"Gemm": 1, **computation}
    ints = {t.name: t.raw_data for t in result.model.graph.initializer if t.data_type == TensorProto.INT8}
    assert ints == {t.name: t.raw_data for t in model.graph.initializer if t.data_type == TensorProto.INT8}
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_skip_fold_copies_shared_weight(fuse):
    """Gemm -> BN and a second Gemm reading the same 600x600 B (1.4 MB, over the 1 MiB a whole model may grow by
    for copies of shared weights)."""
    b = GraphBuilder()
    x = b.input("x", [M, 600])
    w = b.const(b.rand(600, 600))
    model = b.build([b.bn(b.gemm(x, 600, 600, weight=w), 600), b.gemm(x, 600, 600, weight=w)])
    assert_skipped(fuse(model), model, Reason.SHARED_WEIGHT_GROWTH)
