"""matmul_batchnorm: MatMul(X, W) -> [Reshape/Transpose ->] BatchNormalization over W's columns => MatMul(X, W') ->
Add(t) -> [Reshape/Transpose], then matmul_add's Gemm.

Numerics: original and optimized run in onnxruntime at ORT_DISABLE_ALL (conftest.assert_same_outputs) with
rtol=1e-4, atol=1e-5 (conftest.RTOL/ATOL) for float32: the fold changes the order of the multiplications
(x @ (W * s) instead of (x @ W) * s). Shapes: X is [B=2, S=6, K=5], W [K, N=4].
"""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxfuse.records import Reason
from tests.builders import GraphBuilder
from tests.conftest import ATOL, RTOL, analyse_unchecked, assert_same_outputs, op_counts
from tests.conftest import assert_skipped as check_skipped

PASS = "matmul_batchnorm"
B, S, K, N = 2, 6, 5, 4


def assert_skipped(result, model, reason):
    return check_skipped(result, model, reason, PASS)


def conformer_like(transpose=True, reshape=False, x_shape=(B, S, K), weight=None, bn_channels=N, dtype=np.float32,
                   **bn_attrs):
    """X [B, S, K] @ W [K, N] -> [Reshape ->] Transpose(0, 2, 1) -> BN over the N channels: a pointwise
    feed-forward written as MatMul, normalised as a 1-D conv would be."""
    b = GraphBuilder(seed=4, dtype=dtype)
    x = b.input("x", list(x_shape))
    y = b.op("MatMul", [x, weight or b.const(b.rand(K, N))])
    if reshape:
        y = b.op("Reshape", [y, b.const(np.array([B, S, N], np.int64))])
    if transpose:
        y = b.op("Transpose", [y], perm=[0, 2, 1])
    return b, b.bn(y, bn_channels, **bn_attrs)


def checked_same(model, result, rtol=RTOL, atol=ATOL):
    onnx.checker.check_model(result.model, full_check=True)
    assert [o.name for o in result.model.graph.output] == [o.name for o in model.graph.output]
    assert_same_outputs(model, result.model, rtol=rtol, atol=atol)


# --------------------------------------------------------------------------------------------------------------
# Positives


@pytest.mark.parametrize(("transpose", "reshape"), [(True, False), (True, True), (False, True)])
def test_bn_over_the_matmul_columns_is_folded(fuse, transpose, reshape):
    b, y = conformer_like(transpose, reshape, x_shape=(B * S, K) if reshape else (B, S, K))
    if not transpose:  # [B*S, N] -> [B, S, N]: BN's channel axis 1 is S, so reshape to [B*S, N, 1] instead
        b = GraphBuilder(seed=4)
        mm = b.op("MatMul", [b.input("x", [B * S, K]), b.const(b.rand(K, N))])
        y = b.bn(b.op("Reshape", [mm, b.const(np.array([B * S, N, 1], np.int64))]), N)
    model = b.build(b.op("Relu", [y]))
    result = fuse(model)
    counts = op_counts(result.model)
    assert "BatchNormalization" not in counts and counts["MatMul"] == 1 and counts["Add"] == 1, counts
    assert [f.pass_name for f in result.fusions] == [PASS]
    checked_same(model, result)


def test_bn_right_after_a_2d_matmul_becomes_a_gemm_with_matmul_add(fuse):
    b = GraphBuilder(seed=5)
    mm = b.op("MatMul", [b.input("x", [3, K]), b.const(b.rand(K, N))])
    model = b.build(b.bn(mm, N))
    result = fuse(model, only=(PASS, "matmul_add"))
    assert op_counts(result.model) == {"Gemm": 1}
    assert [f.pass_name for f in result.fusions] == [PASS, "matmul_add"]
    checked_same(model, result)


def test_then_matmul_add_leaves_the_n_d_chain_a_matmul_and_add(fuse):
    # the MatMul's input is 3-D: matmul_add makes a Gemm of 2-D inputs only (matmul-input-not-2d), so the fold
    # leaves MatMul(X, W') -> Add(t) -> Transpose, the BatchNormalization gone
    b, y = conformer_like()
    model = b.build(y)
    result = fuse(model, only=(PASS, "matmul_add"))
    counts = op_counts(result.model)
    assert counts == {"MatMul": 1, "Add": 1, "Transpose": 1}, counts
    assert result.model.graph.node[-1].output[0] == model.graph.output[0].name
    checked_same(model, result)


def test_float16(fuse):
    b, y = conformer_like(dtype=np.float16)
    model = b.build(y)
    result = fuse(model)
    assert "BatchNormalization" not in op_counts(result.model)
    checked_same(model, result, rtol=1e-2, atol=1e-2)


# --------------------------------------------------------------------------------------------------------------
# Skips: one test per reason in MatMulBatchNorm.reasons


def test_skip_batchnorm_axis_not_matmul_feature(fuse):
    # no Transpose: BN's channel axis 1 of [B, S, N] is S, not W's columns; S == N, so the parameter count alone
    # would not tell
    b, y = conformer_like(transpose=False, x_shape=(B, N, K))
    model = b.build(y)
    s = assert_skipped(fuse(model), model, Reason.BN_AXIS_NOT_FEATURE)
    assert "axis 1 of the MatMul output [2, 4, 4]" in s.detail


def test_skip_batchnorm_axis_not_matmul_feature_through_a_splitting_reshape(fuse):
    # [B, S, N] = [2, 6, 4] -> [2, 2, 12]: the channel axis (size 2) is no axis of the MatMul output
    b = GraphBuilder(seed=4)
    mm = b.op("MatMul", [b.input("x", [B, S, K]), b.const(b.rand(K, N))])
    r = b.op("Reshape", [mm, b.const(np.array([B, 2, S * 2], np.int64))])
    model = b.build(b.bn(r, 2))
    s = assert_skipped(fuse(model), model, Reason.BN_AXIS_NOT_FEATURE)
    assert "does not keep the channel axis" in s.detail


def test_skip_intermediate_has_other_consumers(fuse):
    b = GraphBuilder(seed=4)
    mm = b.op("MatMul", [b.input("x", [B, S, K]), b.const(b.rand(K, N))])
    t = b.op("Transpose", [mm], perm=[0, 2, 1])
    model = b.build([b.bn(t, N), b.op("Relu", [t])])
    assert_skipped(fuse(model), model, Reason.NOT_PRIVATE)


def test_skip_intermediate_is_graph_output(fuse):
    b = GraphBuilder(seed=4)
    mm = b.op("MatMul", [b.input("x", [B, S, K]), b.const(b.rand(K, N))])
    model = b.build([b.bn(b.op("Transpose", [mm], perm=[0, 2, 1]), N), mm])
    assert_skipped(fuse(model), model, Reason.GRAPH_OUTPUT)


def test_skip_weights_not_constant(fuse):
    b, y = conformer_like(weight="w")
    b.input("w", [K, N])
    model = b.build(y)
    assert_skipped(fuse(model), model, Reason.WEIGHTS_NOT_CONSTANT)


def test_skip_initializer_is_graph_input(fuse):
    b, y = conformer_like()
    model = b.build(y, initializers_as_inputs=True, ir_version=4, opset=9)
    assert_skipped(fuse(model), model, Reason.INITIALIZER_IS_INPUT)


def test_skip_parameters_not_constant(fuse):
    b = GraphBuilder(seed=4)
    mm = b.op("MatMul", [b.input("x", [B, S, K]), b.const(b.rand(K, N))])
    t = b.op("Transpose", [mm], perm=[0, 2, 1])
    params = [b.input("scale", [N]), *(b.const(b.rand(N)) for _ in range(2)), b.const(np.ones(N, np.float32))]
    model = b.build(b.op("BatchNormalization", [t, *params]))
    s = assert_skipped(fuse(model), model, Reason.PARAMS_NOT_CONSTANT)
    assert "scale" in s.detail


def test_skip_batchnorm_training_mode(fuse):
    b = GraphBuilder(seed=4)
    mm = b.op("MatMul", [b.input("x", [B, S, K]), b.const(b.rand(K, N))])
    t = b.op("Transpose", [mm], perm=[0, 2, 1])
    params = [b.const(np.full(N, v, np.float32)) for v in (1.0, 0.0, 0.0, 1.0)]
    y, _, _ = b.op("BatchNormalization", [t, *params], outputs=3, training_mode=1)
    model = b.build(y, opset=15)
    assert_skipped(fuse(model), model, Reason.TRAINING_MODE)


def test_skip_batchnorm_spatial_0(fuse):
    b, y = conformer_like(spatial=0)
    model = b.build(y, opset=8, ir_version=3, initializers_as_inputs=True)
    result = fuse(model)
    assert_skipped(result, model, Reason.BN_SPATIAL)


def test_skip_parameter_shape_mismatch(fuse):
    # W has N = 4 columns and the BN 1 value: a broadcast onnxruntime's BatchNormalization refuses to run, so
    # the model is only analysed
    b, y = conformer_like(bn_channels=1)
    model = b.model(y)
    model.graph.output[0].type.CopyFrom(helper.make_tensor_type_proto(TensorProto.FLOAT, [B, N, S]))
    s = assert_skipped(analyse_unchecked(model, only=(PASS,)), model, Reason.PARAM_SHAPE)
    assert "4 values" in s.detail


def test_skip_matmul_input_not_2d(fuse):
    b = GraphBuilder(seed=4)
    mm = b.op("MatMul", [b.input("x", [B, S, K]), b.const(b.rand(B, K, N))])
    model = b.build(b.bn(b.op("Transpose", [mm], perm=[0, 2, 1]), N))
    s = assert_skipped(fuse(model), model, Reason.MATMUL_NOT_2D)
    assert "3-D" in s.detail


def test_skip_dtype_not_foldable(fuse):
    # a double MatMul is foldable; bfloat16 is not (numpy has no bfloat16): analysed only
    b, y = conformer_like()
    model = b.model(y)
    w = next(t for t in model.graph.initializer if list(t.dims) == [K, N])
    w.data_type = TensorProto.BFLOAT16
    w.ClearField("raw_data")
    w.ClearField("float_data")
    w.int32_data.extend([0x3F80] * (K * N))
    model.graph.output[0].type.CopyFrom(helper.make_tensor_type_proto(TensorProto.FLOAT, [B, N, S]))
    s = assert_skipped(analyse_unchecked(model, only=(PASS,)), model, Reason.DTYPE_NOT_FOLDABLE)
    assert s.pass_name == PASS


def test_skip_fold_not_finite(fuse):
    b = GraphBuilder(seed=4)
    mm = b.op("MatMul", [b.input("x", [B, S, K]), b.const(b.rand(K, N))])
    t = b.op("Transpose", [mm], perm=[0, 2, 1])
    params = [b.const(np.full(N, v, np.float32)) for v in (1.0, 0.0, 0.0, 0.0)]  # var + epsilon = 0: s is inf
    model = b.build(b.op("BatchNormalization", [t, *params], epsilon=0.0))
    assert_skipped(fuse(model), model, Reason.FOLD_NOT_FINITE)


def test_skip_fold_copies_shared_weight(fuse):
    # W (700 x 400 float32, 1.1 MB) is read by another MatMul too: the folded copy would exceed the free 1 MiB
    b = GraphBuilder(seed=4)
    x = b.input("x", [1, 3, 700])
    w = b.const(b.rand(700, 400))
    t = b.op("Transpose", [b.op("MatMul", [x, w])], perm=[0, 2, 1])
    model = b.build([b.bn(t, 400), b.op("MatMul", [x, w])])
    s = assert_skipped(fuse(model), model, Reason.SHARED_WEIGHT_GROWTH)
    assert "also read by other nodes" in s.detail
