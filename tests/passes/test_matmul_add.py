"""matmul_add: MatMul(X, W) -> Add(b) => Gemm(X, W, b) for a 2-D X, a constant 2-D W and a b that is a valid C.

Numerics: original and optimized run in onnxruntime at ORT_DISABLE_ALL (conftest.assert_same_outputs) with
rtol=1e-4, atol=1e-5 (conftest.RTOL/ATOL) for float32 (the same products and sums, in the kernel's order);
rtol=atol=1e-2 for float16. Shapes: X is [M=3, K=5], W is [K, N=4], Y is [3, 4].
"""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxfuse.records import Reason
from tests.builders import GraphBuilder
from tests.conftest import ATOL, RTOL, assert_same_outputs, op_counts, run
from tests.conftest import assert_skipped as check_skipped

PASS = "matmul_add"
M, K, N = 3, 5, 4
FP16_TOL = 1e-2


def matmul_add(b_shape=(N,), matmul_first=True, x_shape=(M, K), w_shape=(K, N), constants="initializer",
               dtype=np.float32, weight=None):
    b = GraphBuilder(constants=constants, dtype=dtype)
    x = b.input("x", list(x_shape))
    w = weight or b.const(b.rand(*w_shape))
    mm = b.op("MatMul", [x, w])
    c = b.const(b.rand(*b_shape, scale=0.1))
    return b, b.op("Add", [mm, c] if matmul_first else [c, mm])


def assert_skipped(result, model, reason):
    return check_skipped(result, model, reason, PASS)


# --------------------------------------------------------------------------------------------------------------
# Positives


@pytest.mark.parametrize("b_shape", [(N,), (1, N), (1,), (), (1, 1), (M, N), (M, 1)])
@pytest.mark.parametrize("matmul_first", [True, False])
def test_becomes_gemm(fuse, b_shape, matmul_first):
    b, y = matmul_add(b_shape, matmul_first)
    model = b.build(y)
    result = fuse(model, target="onnx")
    assert op_counts(result.model) == {"Gemm": 1}
    gemm = result.model.graph.node[0]
    assert gemm.input[2] == model.graph.node[1].input[1 if matmul_first else 0]  # b reused, not copied
    assert not gemm.attribute  # alpha = beta = 1, no transposes
    assert [f.pass_name for f in result.fusions] == [PASS]
    onnx.checker.check_model(result.model, full_check=True)
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("b_shape", [(M, N), (M, 1)])
def test_full_shape_bias_then_relu_on_cpu(fuse, b_shape):
    # the Gemm made from a [M, N] bias takes the folds and activation after it like any other
    b, y = matmul_add(b_shape)
    model = b.build(b.op("Relu", [b.op("Mul", [y, b.const(np.float32(0.5))])]))
    result = fuse(model, target="cpu")
    onnx.checker.check_model(result.model, full_check=True)
    assert PASS in [f.pass_name for f in result.fusions]
    assert "MatMul" not in op_counts(result.model)
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_symbolic_batch_dim(fuse):
    b, y = matmul_add(x_shape=("batch", K))
    model = b.build(y)
    result = fuse(model)
    assert op_counts(result.model) == {"Gemm": 1}
    for batch in (1, 7):
        feeds = {"x": np.random.default_rng(batch).standard_normal((batch, K)).astype(np.float32)}
        np.testing.assert_allclose(run(result.model, feeds)[0], run(model, feeds)[0], rtol=RTOL, atol=ATOL)


def test_bias_in_a_constant_node(fuse):
    b, y = matmul_add(constants="node")
    model = b.build(y)
    result = fuse(model)
    assert op_counts(result.model) == {"Gemm": 1, "Constant": 2}
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_float16(fuse):
    b, y = matmul_add(dtype=np.float16)
    model = b.build(y)
    result = fuse(model)
    assert op_counts(result.model) == {"Gemm": 1}
    assert_same_outputs(model, result.model, rtol=FP16_TOL, atol=FP16_TOL)


def test_residual_add_is_left_alone(fuse):
    b = GraphBuilder()
    x = b.input("x", [M, K])
    model = b.build(b.op("Add", [b.op("MatMul", [x, b.const(b.rand(K, N))]), b.input("z", [M, N])]))
    result = fuse(model)
    assert op_counts(result.model) == op_counts(model)
    assert not result.skips


# --------------------------------------------------------------------------------------------------------------
# Skips: one test per reason in MatMulAdd.reasons


def test_skip_intermediate_has_other_consumers(fuse):
    b = GraphBuilder()
    mm = b.op("MatMul", [b.input("x", [M, K]), b.const(b.rand(K, N))])
    model = b.build([b.op("Add", [mm, b.const(b.rand(N))]), b.op("Relu", [mm])])
    assert_skipped(fuse(model), model, Reason.NOT_PRIVATE)


def test_skip_intermediate_is_graph_output(fuse):
    b = GraphBuilder()
    mm = b.op("MatMul", [b.input("x", [M, K]), b.const(b.rand(K, N))])
    model = b.build([b.op("Add", [mm, b.const(b.rand(N))]), mm])
    assert_skipped(fuse(model), model, Reason.GRAPH_OUTPUT)


def test_skip_matmul_input_not_2d_for_a_batched_3d_input(fuse):
    # [B, S, K] @ [K, N] + b: a transformer's Linear; Gemm is 2-D only
    b, y = matmul_add(x_shape=(2, M, K))
    model = b.build(y)
    s = assert_skipped(fuse(model), model, Reason.MATMUL_NOT_2D)
    assert "3-D" in s.detail


def test_skip_matmul_input_not_2d_when_the_rank_is_unknown(fuse):
    # Reshape to a shape read at run time, of unknown length: shape inference cannot know the rank
    b = GraphBuilder()
    x = b.op("Reshape", [b.input("x", [M, K]), b.input("shape", ["n"], dtype=np.int64)])
    y = b.op("Add", [b.op("MatMul", [x, b.const(b.rand(K, N))]), b.const(b.rand(N))])
    model = b.model(y)
    model.graph.output[0].type.CopyFrom(helper.make_tensor_type_proto(TensorProto.FLOAT, ["a", N]))
    s = assert_skipped(fuse(model), model, Reason.MATMUL_NOT_2D)
    assert "unknown rank" in s.detail


def test_skip_matmul_input_not_2d_for_a_weight_vector(fuse):
    b = GraphBuilder()
    y = b.op("Add", [b.op("MatMul", [b.input("x", [M, K]), b.const(b.rand(K))]), b.const(b.rand(1))])
    model = b.build(y)
    s = assert_skipped(fuse(model), model, Reason.MATMUL_NOT_2D)
    assert "1-D" in s.detail


def test_skip_weights_not_constant(fuse):
    b, y = matmul_add(weight="w")
    b.input("w", [K, N])
    model = b.build(y)
    assert_skipped(fuse(model), model, Reason.WEIGHTS_NOT_CONSTANT)


def test_skip_initializer_is_graph_input(fuse):
    b, y = matmul_add()
    model = b.build(y, initializers_as_inputs=True, ir_version=4, opset=8)
    assert_skipped(fuse(model), model, Reason.INITIALIZER_IS_INPUT)


@pytest.mark.parametrize("b_shape", [(1, 1, N), (1, M, N)])
def test_skip_constant_not_per_feature(fuse, b_shape):
    # a rank-3 bias makes the Add's output rank 3: Gemm's C must broadcast to [M, N]
    b, y = matmul_add(b_shape)
    model = b.build(y)
    s = assert_skipped(fuse(model), model, Reason.NOT_PER_FEATURE)
    assert str(list(b_shape)) in s.detail


@pytest.mark.parametrize("b_shape", [(M, N), (M, 1)])
def test_skip_constant_not_per_feature_with_rows_and_a_symbolic_batch(fuse, b_shape):
    # with M symbolic, batch 1 would make the Add's output [M', N] while Gemm's C must fit [1, N]
    b, y = matmul_add(b_shape, x_shape=("batch", K))
    model = b.build(y)
    s = assert_skipped(fuse(model), model, Reason.NOT_PER_FEATURE)
    assert str(list(b_shape)) in s.detail and "batch" in s.detail


def test_skip_dtype_not_foldable(fuse):
    b = GraphBuilder(dtype=np.int64)
    mm = b.op("MatMul", [b.input("x", [M, K]), b.const(np.ones((K, N), np.int64))])
    model = b.build(b.op("Add", [mm, b.const(np.ones(N, np.int64))]))
    s = assert_skipped(fuse(model), model, Reason.DTYPE_NOT_FOLDABLE)
    assert "int64" in s.detail


def test_skip_quantized_gemm(fuse):
    b = GraphBuilder()
    mm = b.op("MatMul", [b.dequantized(b.input("x", [M, K])), b.const(b.rand(K, N))])
    model = b.build(b.op("Add", [mm, b.const(b.rand(N))]))
    s = assert_skipped(fuse(model), model, Reason.QDQ_GEMM)
    assert s.detail == "the MatMul is part of a QuantizeLinear/DequantizeLinear pattern"


def test_unfused_row_would_save_the_intermediate_tensor(fuse):
    # traffic.fused_estimate for MatMul -> Add: a Gemm reads X, W and b (its C) and writes Y, so what is saved is
    # the MatMul output written once and read once
    b, y = matmul_add(x_shape=(2, M, K))
    model = b.build(y)
    result = fuse(model)
    assert_skipped(result, model, Reason.MATMUL_NOT_2D)
    (row,) = result.report.unfused
    assert row["bytes"] == 2 * (2 * M * N * 4)


@pytest.mark.parametrize("b_shape", [(N,), (1, N), ()])
def test_skip_parameters_not_constant_for_a_bias_computed_at_run_time(fuse, b_shape):
    b = GraphBuilder()
    mm = b.op("MatMul", [b.input("x", [M, K]), b.const(b.rand(K, N))])
    bias = b.op("Mul", [b.input("s", list(b_shape)), b.const(np.float32(2.0))])
    model = b.build(b.op("Add", [mm, bias]))
    result = fuse(model)
    s = assert_skipped(result, model, Reason.PARAMS_NOT_CONSTANT)
    assert f"bias {bias} is computed at run time" in s.detail
    (row,) = result.report.unfused
    assert row["reason"] == Reason.PARAMS_NOT_CONSTANT


# --------------------------------------------------------------------------------------------------------------
# Issue 33: Transpose(A) before the MatMul is Gemm's transA


@pytest.mark.parametrize("perm", [[1, 0], None])
def test_transpose_of_a_becomes_trans_a(fuse, perm):
    b = GraphBuilder(seed=2)
    a = b.input("a", [K, M])
    t = b.op("Transpose", [a], **({"perm": perm} if perm else {}))
    y = b.op("Add", [b.op("MatMul", [t, b.const(b.rand(K, N))]), b.const(b.rand(N))])
    model = b.build(b.op("Relu", [y]))
    result = fuse(model)
    assert op_counts(result.model) == {"Gemm": 1, "Relu": 1}
    gemm = next(n for n in result.model.graph.node if n.op_type == "Gemm")
    assert gemm.input[0] == "a" and helper.get_attribute_value(gemm.attribute[0]) == 1
    assert [a.name for a in gemm.attribute] == ["transA"]
    onnx.checker.check_model(result.model, full_check=True)
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_a_shared_transpose_stays_and_the_gemm_reads_it(fuse):
    b = GraphBuilder(seed=2)
    a = b.input("a", [K, M])
    t = b.op("Transpose", [a], perm=[1, 0])
    y = b.op("Add", [b.op("MatMul", [t, b.const(b.rand(K, N))]), b.const(b.rand(N))])
    model = b.build([b.op("Relu", [y]), b.op("Neg", [t])])
    result = fuse(model)
    assert op_counts(result.model) == {"Transpose": 1, "Gemm": 1, "Relu": 1, "Neg": 1}
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)
