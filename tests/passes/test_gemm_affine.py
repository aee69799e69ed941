"""gemm_affine: Gemm -> Add/Sub/Mul/Div by a per-output-feature constant => Gemm with folded B and C.

Numerics: original and optimized run in onnxruntime at ORT_DISABLE_ALL (conftest.assert_same_outputs) with
rtol=1e-4, atol=1e-5 (conftest.RTOL/ATOL) for float32; rtol=atol=1e-2 for float16 (B' rounded to float16).
Shapes: A is [M=3, K=5] ([K, M] with transA), B is [K, N=4] ([N, K] with transB), Y is [3, 4].
"""

import numpy as np
import pytest
from onnx import TensorProto, helper

from onnxfuse.records import Reason
from tests.builders import GraphBuilder, compact_gemm_weight, tensor, with_output_shapes
from tests.conftest import ATOL, RTOL, assert_same_outputs, attr, op_counts
from tests.conftest import assert_skipped as check_skipped

PASS = "gemm_affine"
M, K, N = 3, 5, 4
FP16_TOL = 1e-2


def gemm_op(op, c_shape=(N,), gemm_first=True, value=None, constants="initializer", dtype=np.float32,
            trans_a=False, **gemm_args):
    """x -> Gemm -> op(gemm, c) (or op(c, gemm)); c is ``value`` or random in [0.5, 1.5)."""
    b = GraphBuilder(constants=constants, dtype=dtype)
    x = b.input("x", [K, M] if trans_a else [M, K])
    if trans_a:
        gemm_args["transA"] = 1
    g = b.gemm(x, K, N, **gemm_args)
    c = b.const(np.asarray(value if value is not None else b.rng.uniform(0.5, 1.5, c_shape), dtype=dtype))
    return b.build(b.op(op, [g, c] if gemm_first else [c, g]))


def the_gemm(model):
    (node,) = [n for n in model.graph.node if n.op_type == "Gemm"]
    return node


def assert_skipped(result, model, reason):
    return check_skipped(result, model, reason, PASS)


# --------------------------------------------------------------------------------------------------------------
# Positives


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("trans_b", [False, True])
def test_folds_gemm_first(fuse, op, bias, trans_b):
    model = gemm_op(op, bias=bias, trans_b=trans_b)
    result = fuse(model, target="onnx")
    assert op_counts(result.model) == {"Gemm": 1}
    assert [f.pass_name for f in result.fusions] == [PASS]
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul"])
@pytest.mark.parametrize("bias", [True, False])
def test_folds_constant_first(fuse, op, bias):
    model = gemm_op(op, gemm_first=False, bias=bias, trans_b=True)
    result = fuse(model)
    assert op_counts(result.model) == {"Gemm": 1}
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize(("alpha", "beta", "trans_a"), [(0.5, 1.0, False), (1.0, 3.0, True), (-2.0, 0.5, True)])
def test_alpha_beta_and_trans_a_are_honoured(fuse, op, alpha, beta, trans_a):
    model = gemm_op(op, alpha=alpha, beta=beta, trans_a=trans_a)
    result = fuse(model)
    assert op_counts(result.model) == {"Gemm": 1}
    gemm = the_gemm(result.model)
    assert attr(gemm, "alpha") == pytest.approx(alpha)
    assert attr(gemm, "transA") == (1 if trans_a else None)
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("c_shape", [(N,), (1, N), (1,), (), (1, 1)])
@pytest.mark.parametrize("op", ["Add", "Mul"])
def test_per_feature_shapes(fuse, c_shape, op):
    model = gemm_op(op, c_shape=c_shape)
    result = fuse(model)
    assert op_counts(result.model) == {"Gemm": 1}
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_gemm_c_of_full_shape_is_kept_full(fuse):
    b = GraphBuilder()
    g = b.gemm(b.input("x", [M, K]), K, N, c_shape=(M, N), beta=2.0)
    model = b.build(b.op("Mul", [g, b.const(b.rng.uniform(0.5, 1.5, N).astype(np.float32))]))
    result = fuse(model)
    assert op_counts(result.model) == {"Gemm": 1}
    assert tensor(result.model, the_gemm(result.model).input[2]).shape == (M, N)
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_constants_in_constant_nodes(fuse):
    model = gemm_op("Mul", constants="node")
    result = fuse(model)
    assert op_counts(result.model) == {"Gemm": 1}
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_chain_of_affine_ops_folds_completely(fuse):
    b = GraphBuilder()
    y = b.gemm(b.input("x", [M, K]), K, N, trans_b=True)
    for op in ("Mul", "Add", "Sub", "Div"):
        y = b.op(op, [y, b.const(b.rng.uniform(0.5, 1.5, N).astype(np.float32))])
    model = b.build(y)
    result = fuse(model)
    assert op_counts(result.model) == {"Gemm": 1}
    assert len(result.report.fusions) == 1  # one row listing all five original nodes
    assert len(result.report.fusions[0]["replaced"]) == 5
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_float16(fuse):
    model = gemm_op("Mul", dtype=np.float16, trans_b=True)
    result = fuse(model)
    assert op_counts(result.model) == {"Gemm": 1}
    assert_same_outputs(model, result.model, rtol=FP16_TOL, atol=FP16_TOL)


def test_residual_add_is_not_an_affine_constant(fuse):
    b = GraphBuilder()
    x = b.input("x", [M, K])
    model = b.build(b.op("Add", [b.gemm(x, K, N), b.input("z", [M, N])]))
    result = fuse(model)
    assert op_counts(result.model) == op_counts(model)
    assert not [s for s in result.skips if s.pass_name == PASS]


# --------------------------------------------------------------------------------------------------------------
# Skips: one test per reason in GemmAffine.reasons


def test_skip_intermediate_has_other_consumers(fuse):
    b = GraphBuilder()
    g = b.gemm(b.input("x", [M, K]), K, N)
    model = b.build([b.op("Mul", [g, b.const(np.ones(N, np.float32))]), b.op("Relu", [g])])
    assert_skipped(fuse(model), model, Reason.NOT_PRIVATE)


def test_skip_intermediate_is_graph_output(fuse):
    b = GraphBuilder()
    g = b.gemm(b.input("x", [M, K]), K, N)
    model = b.build([b.op("Mul", [g, b.const(np.ones(N, np.float32))]), g])
    assert_skipped(fuse(model), model, Reason.GRAPH_OUTPUT)


def test_skip_weights_not_constant(fuse):
    b = GraphBuilder()
    g = b.gemm(b.input("x", [M, K]), K, N, weight=b.input("w", [K, N]))
    model = b.build(b.op("Mul", [g, b.const(np.ones(N, np.float32))]))
    assert_skipped(fuse(model), model, Reason.WEIGHTS_NOT_CONSTANT)


def test_skip_initializer_is_graph_input(fuse):
    model = gemm_op("Mul")
    model.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                             for t in model.graph.initializer if list(t.dims) == [N])
    assert_skipped(fuse(model), model, Reason.INITIALIZER_IS_INPUT)


@pytest.mark.parametrize("c_shape", [(M, 1), (M, N), (1, 1, N)])
def test_skip_constant_not_per_feature(fuse, c_shape):
    model = gemm_op("Mul", c_shape=c_shape)
    s = assert_skipped(fuse(model), model, Reason.NOT_PER_FEATURE)
    assert str(list(c_shape)) in s.detail


def test_skip_gemm_output_is_divisor(fuse):
    model = gemm_op("Div", gemm_first=False)
    assert_skipped(fuse(model), model, Reason.GEMM_IS_DIVISOR)


def test_skip_zero_in_divisor(fuse):
    model = gemm_op("Div", value=np.array([1.0, 0.0, 2.0, 3.0], np.float32))
    assert_skipped(fuse(model), model, Reason.ZERO_DIVISOR)


@pytest.mark.parametrize("c_shape", [(1, 1, N), (N + 1,)])
def test_skip_parameter_shape_mismatch(fuse, c_shape):
    # a C that is not unidirectionally broadcastable to [M, N]; onnx.checker (no shape inference) accepts it
    b = GraphBuilder()
    g = b.gemm(b.input("x", [M, K]), K, N, c_shape=c_shape)
    model = b.model(b.op("Mul", [g, b.const(np.ones(N, np.float32))]))
    model.graph.output[0].type.CopyFrom(helper.make_tensor_type_proto(TensorProto.FLOAT, [M, N]))
    assert_skipped(fuse(model), model, Reason.PARAM_SHAPE)


def test_skip_dtype_not_foldable(fuse):
    b = GraphBuilder()
    b.inputs.append(helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [M, K]))
    b.inits.append(helper.make_tensor("w", TensorProto.BFLOAT16, [K, N], np.ones(K * N).tolist()))
    b.inits.append(helper.make_tensor("c", TensorProto.BFLOAT16, [N], np.ones(N).tolist()))
    model = b.model(b.op("Mul", [b.op("Gemm", ["x", "w"]), "c"]), opset=15)
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.BFLOAT16
    model = with_output_shapes(model)
    s = assert_skipped(fuse(model), model, Reason.DTYPE_NOT_FOLDABLE)
    assert "bfloat16" in s.detail


def test_skip_fold_not_finite(fuse):
    model = gemm_op("Div", value=np.full(N, 1e-39, np.float32))
    assert_skipped(fuse(model), model, Reason.FOLD_NOT_FINITE)


def test_skip_quantized_gemm(fuse):
    b = GraphBuilder()
    g = b.gemm(b.dequantized(b.input("x", [M, K])), K, N)
    model = b.build(b.op("Mul", [g, b.const(np.ones(N, np.float32))]))
    assert_skipped(fuse(model), model, Reason.QDQ_GEMM)


# --------------------------------------------------------------------------------------------------------------
# B computed from compact constants (int8 x scale, ConstantOfShape)


@pytest.mark.parametrize("form", ["cast_mul", "constant_of_shape"])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("op, gemm_first", [("Add", True), ("Sub", True), ("Sub", False), ("Mul", True),
                                            ("Div", True)])
def test_folds_into_compact_weight_which_stays_compact(fuse, form, trans_b, op, gemm_first):
    # B is 64x64: constant_fold refuses to Cast the int8 values (float32 is 4x their bytes) or to broadcast one
    # value into 16 KiB, so the fold goes into B's computation; the int8 tensor is kept byte for byte.
    b = GraphBuilder()
    x = b.input("x", [3, 64])
    y = b.gemm(x, 64, 64, trans_b=trans_b, weight=compact_gemm_weight(b, 64, 64, trans_b, form))
    c = b.const(b.rng.uniform(0.5, 1.5, (64,)).astype(np.float32))
    model = b.build(b.op(op, [y, c] if gemm_first else [c, y]), opset=13)
    result = fuse(model, only=(PASS,))
    computation = {"Cast": 1, "Mul": 1} if form == "cast_mul" else {"ConstantOfShape": 1}
    if form == "constant_of_shape" and not (op == "Add" or (op == "Sub" and gemm_first)):
        computation["Mul"] = 1  # B's factor in an appended Mul(B, factor)
    assert op_counts(result.model) == {"Gemm": 1, **computation}
    assert [f.pass_name for f in result.fusions] == [PASS]
    ints = {t.name: t.raw_data for t in result.model.graph.initializer if t.data_type == TensorProto.INT8}
    assert ints == {t.name: t.raw_data for t in model.graph.initializer if t.data_type == TensorProto.INT8}
    assert result.model.ByteSize() < model.ByteSize() + 1024  # names, a [64] scale and C; no float B
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_skip_fold_copies_shared_weight(fuse):
    """Gemm -> Mul by a per-feature constant and a second Gemm reading the same 600x600 B (1.4 MB, over the 1 MiB
    a whole model may grow by for copies of shared weights)."""
    b = GraphBuilder()
    x = b.input("x", [M, 600])
    w = b.const(b.rand(600, 600))
    model = b.build([b.op("Mul", [b.gemm(x, 600, 600, weight=w), b.const(b.rand(600))]),
                     b.gemm(x, 600, 600, weight=w)])
    assert_skipped(fuse(model), model, Reason.SHARED_WEIGHT_GROWTH)
