"""conv_residual: Conv -> Add(conv, Z) [-> activation] => com.microsoft::FusedConv(X, W, B, Z, activation).

FusedConv adds Z before the activation and needs Z of exactly the conv output's shape. Numerics: original and
optimized run in onnxruntime at ORT_DISABLE_ALL (conftest.assert_same_outputs) with rtol=1e-4, atol=1e-5
(conftest.RTOL/ATOL).
"""

import numpy as np
import onnx
import pytest

from onnxfuse.records import Reason
from tests.builders import GraphBuilder, skip_of
from tests.conftest import ATOL, RTOL, assert_same_outputs, attr, fused_nodes, op_counts, optimize, run
from tests.conftest import assert_skipped as check_skipped

PASS = "conv_residual"


@pytest.fixture
def fuse(fuse):
    """``tests/passes/conftest.py``'s ``fuse`` (this pass alone unless a test names its passes) for sessions at
    ORT_DISABLE_ALL unless ``ort_level`` says otherwise: at ORT_ENABLE_ALL (the default level) no FusedConv with Z is
    emitted at all (providers.CPU_SLOWER_AT), see the speed tests."""
    return lambda model, target="cpu", ort_level="disable", **options: fuse(model, target, ort_level=ort_level,
                                                                             **options)
SHAPE = [1, 4, 6, 6]  # the conv output


def residual(activation=None, bias=True, z_shape=SHAPE, z_first=False, dtype=np.float32, x_shape=(1, 3, 6, 6),
             **act_attrs):
    """x -> Conv(3 -> 4) -> Add(conv, z) [-> activation]; returns (model, builder)."""
    b = GraphBuilder(dtype=dtype)
    x = b.input("x", list(x_shape))
    z = b.input("z", list(z_shape))
    conv = b.conv(x, 3, 4, bias=bias)
    y = b.op("Add", [z, conv] if z_first else [conv, z])
    if activation:
        y = b.op(activation, [y], **act_attrs)
    return b.build(y), b


def the_fused(model):
    (node,) = fused_nodes(model)
    return node


# --------------------------------------------------------------------------------------------------------------
# Positives


@pytest.mark.parametrize("z_first", [False, True])
def test_add_relu_becomes_one_fused_conv_with_z(fuse, z_first):
    model, _ = residual("Relu", z_first=z_first)
    result = fuse(model, target="cpu+cuda")
    assert op_counts(result.model) == {"FusedConv": 1}
    node = the_fused(result.model)
    assert list(node.input) == ["x", "c1", "c2", "z"]  # Z last
    assert node.domain == "com.microsoft"
    assert attr(node, "activation") == b"Relu"
    assert attr(node, "activation_params") is None
    assert [f.pass_name for f in result.fusions] == [PASS]
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_conv_without_bias_gets_empty_b(fuse):
    model, _ = residual("Relu", bias=False)
    result = fuse(model)
    assert op_counts(result.model) == {"FusedConv": 1}
    assert list(the_fused(result.model).input) == ["x", "c1", "", "z"]
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("level", ["disable", "basic", "extended"])
def test_add_alone_becomes_plain_fused_conv_on_cpu(fuse, level):
    model, _ = residual()
    result = fuse(model, target="cpu", ort_level=level)
    assert op_counts(result.model) == {"FusedConv": 1}
    node = the_fused(result.model)
    assert len(node.input) == 4 and attr(node, "activation") is None
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_add_leaky_relu_default_alpha(fuse):
    model, _ = residual("LeakyRelu")
    result = fuse(model, target="cpu")
    node = the_fused(result.model)
    assert attr(node, "activation") == b"LeakyRelu"
    assert attr(node, "activation_params") == pytest.approx([0.01])
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_relu_then_add_is_not_fused_with_z(fuse):
    # Conv -> Relu -> Add computes relu(conv) + z, FusedConv with Z computes relu(conv + z): only the Relu fuses.
    b = GraphBuilder()
    x, z = b.input("x", [1, 3, 6, 6]), b.input("z", SHAPE)
    model = b.build(b.op("Add", [b.op("Relu", [b.conv(x, 3, 4)]), z]))
    result = fuse(model, only=(PASS, "conv_activation"))
    assert op_counts(result.model) == {"FusedConv": 1, "Add": 1}
    assert len(the_fused(result.model).input) == 3
    assert not [f for f in result.fusions if f.pass_name == PASS]
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_z_from_another_conv(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 3, 6, 6])
    model = b.build(b.op("Relu", [b.op("Add", [b.conv(x, 3, 4), b.conv(x, 3, 4)])]))
    result = fuse(model)
    assert op_counts(result.model) == {"Conv": 1, "FusedConv": 1}
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_same_symbolic_dims_match(fuse):
    model, _ = residual("Relu", x_shape=("N", 3, 6, 6), z_shape=("N", 4, 6, 6))
    result = fuse(model)
    assert op_counts(result.model) == {"FusedConv": 1}
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((2, 3, 6, 6)).astype(np.float32),
             "z": rng.standard_normal((2, 4, 6, 6)).astype(np.float32)}
    np.testing.assert_allclose(run(result.model, feeds)[0], run(model, feeds)[0], rtol=RTOL, atol=ATOL)


def test_clip_with_run_time_bound_leaves_clip_after_plain_fused_conv(fuse):
    b = GraphBuilder()
    x, z, hi = b.input("x", [1, 3, 6, 6]), b.input("z", SHAPE), b.input("hi", [])
    model = b.build(b.op("Clip", [b.op("Add", [b.conv(x, 3, 4), z]), "", hi]))
    result = fuse(model, target="cpu", ort_level="disable", only=(PASS, "conv_activation"))
    assert op_counts(result.model) == {"FusedConv": 1, "Clip": 1}
    assert attr(the_fused(result.model), "activation") is None
    assert skip_of(result, "conv_activation").reason == Reason.CLIP_BOUNDS_NOT_CONSTANT
    feeds = {"x": np.ones((1, 3, 6, 6), np.float32), "z": np.linspace(-2, 2, 144, dtype=np.float32).reshape(SHAPE),
             "hi": np.array(0.5, np.float32)}
    np.testing.assert_allclose(run(result.model, feeds)[0], run(model, feeds)[0], rtol=RTOL, atol=ATOL)


def test_com_microsoft_opset_1_imported(fuse):
    model, _ = residual("Relu")
    assert "com.microsoft" not in {imp.domain for imp in model.opset_import}
    result = fuse(model)
    assert [(imp.domain, imp.version) for imp in result.model.opset_import] == [("", 17), ("com.microsoft", 1)]


def test_fuses_after_a_fused_conv_already_in_the_model(fuse):
    b = GraphBuilder()
    x, z = b.input("x", [1, 3, 6, 6]), b.input("z", SHAPE)
    y = b.op("Relu", [b.conv(x, 3, 4)])
    model = b.build(b.op("Relu", [b.op("Add", [b.conv(y, 4, 4), z])]))
    first = fuse(model, only=("conv_activation",)).model  # a model that already holds a FusedConv
    assert op_counts(first) == {"FusedConv": 1, "Conv": 1, "Add": 1, "Relu": 1}
    result = fuse(first)
    assert op_counts(result.model) == {"FusedConv": 2}
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


# --------------------------------------------------------------------------------------------------------------
# Skips: one per reason the pass gives


def test_skip_slower_than_unfused_at_ort_level_add_alone_at_all(fuse, tmp_path):
    # FusedConv(Z) loses to onnxruntime's own NCHWc Conv + Add at ORT_ENABLE_ALL (providers.CPU_SLOWER_AT), and
    # ORT_ENABLE_ALL is the default level; the skip still reports the bytes the fusion would save.
    model, _ = residual()
    result = optimize(tmp_path, model, "cpu", only=(PASS,))  # the default level
    s = assert_skipped(result, model, Reason.SLOWER_AT_ORT_LEVEL)
    assert "FusedConv(Z)" in s.detail and "level all" in s.detail
    (row,) = result.report.unfused
    assert row["reason"] == Reason.SLOWER_AT_ORT_LEVEL and row["bytes"] > 0
    assert_skipped(fuse(model, target="cpu", ort_level="all"), model, Reason.SLOWER_AT_ORT_LEVEL)


def test_skip_slower_than_unfused_at_ort_level_every_z_form_at_all(fuse):
    # At ORT_ENABLE_ALL onnxruntime's NCHWc transformer leaves a FusedConv with Z in NCHW, so no Z form is emitted;
    # below that level they are.
    model, _ = residual("Relu")
    s = assert_skipped(fuse(model, target="cpu+cuda", ort_level="all"), model, Reason.SLOWER_AT_ORT_LEVEL)
    assert "FusedConv(Z, Relu)" in s.detail
    for level in ("disable", "basic", "extended"):
        assert op_counts(fuse(model, target="cpu+cuda", ort_level=level).model) == {"FusedConv": 1}
    assert op_counts(fuse(model, target="cpu+cuda", ort_level=None).model) == {"FusedConv": 1}


def assert_skipped(result, model, reason):
    return check_skipped(result, model, reason, PASS)


@pytest.mark.parametrize("z_shape", [[1, 4, 1, 1], [4, 6, 6], [1, 1, 6, 6]])
def test_skip_residual_shape_mismatch(fuse, z_shape):
    # Broadcastable, so the Add is valid ONNX, but FusedConv fails at run time unless Z has Y's exact shape.
    model, _ = residual("Relu", z_shape=z_shape)
    s = assert_skipped(fuse(model), model, Reason.RESIDUAL_SHAPE)
    assert str(list(z_shape)) in s.detail


def test_skip_intermediate_has_other_consumers(fuse):
    model, b = residual("Relu")
    conv_out = model.graph.node[0].output[0]
    model = b.build([model.graph.output[0].name, b.op("Neg", [conv_out])])
    s = assert_skipped(fuse(model), model, Reason.NOT_PRIVATE)
    assert conv_out in s.detail


def test_skip_intermediate_is_graph_output(fuse):
    model, b = residual("Relu")
    model = b.build([model.graph.output[0].name, model.graph.node[0].output[0]])
    assert_skipped(fuse(model), model, Reason.GRAPH_OUTPUT)


def test_skip_target_allows_no_contrib_ops(fuse):
    model, _ = residual("Relu")
    s = assert_skipped(fuse(model, target="onnx"), model, Reason.NO_CONTRIB_OPS)
    assert "onnx" in s.detail


def test_skip_dtype_has_no_fusedconv_kernel(fuse):
    model, _ = residual("Relu", dtype=np.float16)
    s = assert_skipped(fuse(model), model, Reason.DTYPE_NO_KERNEL)
    assert "float16" in s.detail


@pytest.mark.parametrize("target", ["cpu+cuda", "cuda"])
def test_skip_activation_not_supported_by_target(fuse, target):
    model, _ = residual("Sigmoid")
    s = assert_skipped(fuse(model, target=target), model, Reason.ACTIVATION_UNSUPPORTED)
    assert "Sigmoid" in s.detail and f"target {target}" in s.detail


def test_skip_activation_not_supported_by_target_without_activation(fuse):
    # CUDA's FusedConv requires an activation, so a bare Conv + Add cannot be fused for cpu+cuda.
    model, _ = residual()
    s = assert_skipped(fuse(model, target="cpu+cuda"), model, Reason.ACTIVATION_UNSUPPORTED)
    assert "without an activation" in s.detail and "cpu+cuda" in s.detail


def test_skip_quantized_conv(fuse):
    b = GraphBuilder()
    x, z = b.input("x", [1, 3, 6, 6]), b.input("z", SHAPE)
    dq = b.dequantized(x)
    model = b.build(b.op("Relu", [b.op("Add", [b.conv(dq, 3, 4), z])]))
    assert_skipped(fuse(model), model, Reason.QDQ)


def test_skip_constant_not_folded(fuse):
    # Z = Reshape(Constant, Constant) with constant_fold skipped: named for what it is, not residual-shape-mismatch.
    b = GraphBuilder(constants="node")
    x = b.input("x", [1, 3, 6, 6])
    bias = b.op("Reshape", [b.const(b.rand(4)), b.const(np.array([1, 4, 1, 1], np.int64))])
    model = b.build(b.op("Add", [b.conv(x, 3, 4), bias]), opset=14)
    s = assert_skipped(fuse(model, target="cpu", skip=("constant_fold",)), model, Reason.CONSTANT_NOT_FOLDED)
    assert "constant_fold" in s.detail


# --------------------------------------------------------------------------------------------------------------
# Shapes equal only symbolically


def symbolic_residual(strides=1, z_dims=("height", "width")):
    """x [1, 3, height, width] -> Conv(3 -> 4, 3x3, pads 1, ``strides``) -> Add(z [1, 4, *z_dims]) -> Relu."""
    b = GraphBuilder()
    x = b.input("x", [1, 3, "height", "width"])
    z = b.input("z", [1, 4, *z_dims])
    return b.build(b.op("Relu", [b.op("Add", [b.conv(x, 3, 4, strides=[strides] * 2), z])]))


@pytest.mark.parametrize("ort_level", ["disable", "extended"])
def test_symbolically_equal_residual_becomes_fused_conv(fuse, ort_level):
    # onnx shape inference leaves the conv output [1, 4, ?, ?]; the symbolic shapes prove it [1, 4, height, width]
    model = symbolic_residual()
    result = fuse(model, ort_level=ort_level)
    onnx.checker.check_model(result.model, full_check=True)
    assert op_counts(result.model) == {"FusedConv": 1}
    rng = np.random.default_rng(0)
    for h, w in ((5, 7), (8, 8), (1, 3)):
        feeds = {"x": rng.standard_normal((1, 3, h, w)).astype(np.float32),
                 "z": rng.standard_normal((1, 4, h, w)).astype(np.float32)}
        np.testing.assert_allclose(run(result.model, feeds)[0], run(model, feeds)[0], rtol=RTOL, atol=ATOL)


def test_symbolic_proof_does_not_depend_on_input_shapes_given(fuse):
    """With input shapes that fix every dim, the report counts at those shapes without symbolic inference
    (``expressions=False``), yet the written model must stay valid for every size: the pass still proves the
    residual's shape in the model's own symbolic dims (``Context.symbolic``, computed on that first need) and
    fuses exactly as without input shapes."""
    model = symbolic_residual()
    given = fuse(model, input_shapes={"x": (1, 3, 6, 5), "z": (1, 4, 6, 5)}, expressions=False)
    assert op_counts(given.model) == {"FusedConv": 1}
    assert given.report.symbols == {} and given.report.totals["saved_bytes"] > 0  # counted at the given shapes
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((1, 3, 9, 4)).astype(np.float32),  # another size than the one given
             "z": rng.standard_normal((1, 4, 9, 4)).astype(np.float32)}
    np.testing.assert_allclose(run(given.model, feeds)[0], run(model, feeds)[0], rtol=RTOL, atol=ATOL)
    # equal at the sizes given, not for every size (h2 may differ from height): refused as without them
    other = symbolic_residual(1, ("h2", "w2"))
    refused = fuse(other, input_shapes={"x": (1, 3, 6, 6), "z": (1, 4, 6, 6)}, expressions=False)
    assert_skipped(refused, other, Reason.RESIDUAL_SHAPE)


@pytest.mark.parametrize(("strides", "z_dims"), [(2, ("height", "width")), (1, ("h2", "w2")), (1, ("height", 6))])
def test_skip_residual_shape_mismatch_when_symbols_are_only_assumed_equal(fuse, strides, z_dims):
    # stride 2: floor((height - 1)/2) + 1 differs from height; h2 may differ from height: onnxruntime's inference
    # assumes them equal at the Add (a merge), which proves nothing
    model = symbolic_residual(strides, z_dims)
    result = fuse(model, ort_level="extended")
    s = assert_skipped(result, model, Reason.RESIDUAL_SHAPE)
    assert "symbolic" in s.detail


def test_run_time_weights_fuse_with_z_at_all(fuse):
    # FusedConv(Z, ...) is slower at `all` only against onnxruntime's NCHWc Conv, which needs constant weights;
    # with W a graph input onnxruntime makes this same FusedConv itself at `all`
    b = GraphBuilder()
    x, w, z = b.input("x", [1, 3, 6, 6]), b.input("w", [4, 3, 3, 3]), b.input("z", SHAPE)
    model = b.build(b.op("Relu", [b.op("Add", [b.conv(x, 3, 4, weight=w), z])]))
    result = fuse(model, ort_level="all")
    onnx.checker.check_model(result.model, full_check=True)
    assert op_counts(result.model) == {"FusedConv": 1}
    assert attr(the_fused(result.model), "activation") == b"Relu"
    assert not result.skips
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_skip_slower_than_unfused_at_ort_level_still_applies_to_constant_weights(fuse):
    model, _ = residual("Relu")
    assert_skipped(fuse(model, ort_level="all"), model, Reason.SLOWER_AT_ORT_LEVEL)


def test_skip_form_needs_newer_onnxruntime(fuse):
    """Conv -> Add(Z) -> HardSwish for a release without FusedConv(Z, HardSwish), at level all (where the plain
    FusedConv(Z) is slower): the HardSwish form's reason is the one given."""
    model, _ = residual("HardSwish")
    s = assert_skipped(fuse(model, ort_level="all", ort_version="1.20"), model, Reason.NEEDS_NEWER_ORT)
    assert "FusedConv(Z, HardSwish) needs onnxruntime" in s.detail


# --------------------------------------------------------------------------------------------------------------
# Issue 33: a constant Z of the conv output's full shape (onnxruntime 1.32 runs FusedConv with a constant Z)


def constant_z(z_shape=SHAPE, activation="Relu", z_first=False, x_shape=(1, 3, 6, 6)):
    b = GraphBuilder(seed=6)
    x = b.input("x", list(x_shape))
    conv = b.conv(x, 3, 4)
    z = b.const(b.rand(*z_shape))
    y = b.op("Add", [z, conv] if z_first else [conv, z])
    return b.build(b.op(activation, [y]) if activation else y)


@pytest.mark.parametrize("z_first", [False, True])
@pytest.mark.parametrize("activation", ["Relu", None])
def test_constant_z_of_the_full_output_shape_is_fused(fuse, z_first, activation):
    model = constant_z(activation=activation, z_first=z_first)
    result = fuse(model, only=("conv_affine", PASS), target="cpu")
    assert op_counts(result.model) == {"FusedConv": 1}
    node = the_fused(result.model)
    assert len(node.input) == 4 and node.input[3] in {t.name for t in result.model.graph.initializer}
    onnx.checker.check_model(result.model, full_check=True)
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_a_broadcast_constant_is_no_z(fuse):
    # [1, 4, 1, 6] varies along W too: neither a per-channel fold nor a full-shape Z
    model = constant_z(z_shape=[1, 4, 1, 6])
    result = fuse(model, only=("conv_affine", PASS), target="cpu")
    assert "FusedConv" not in op_counts(result.model)
    assert {s.reason for s in result.skips} == {Reason.NOT_PER_CHANNEL}


def test_a_constant_z_with_a_symbolic_batch_is_no_z(fuse):
    model = constant_z(x_shape=("N", 3, 6, 6))
    result = fuse(model, only=("conv_affine", PASS), target="cpu")
    assert "FusedConv" not in op_counts(result.model)


def test_skip_slower_than_unfused_at_ort_level_constant_z_at_all(fuse):
    model = constant_z()
    result = fuse(model, only=("conv_affine", PASS), target="cpu", ort_level="all")
    assert "FusedConv" not in op_counts(result.model)
    # one reason for the chain: the pass that came nearest (conv_residual's) wins over conv_affine's
    assert [(s.pass_name, s.reason) for s in result.skips] == [(PASS, Reason.SLOWER_AT_ORT_LEVEL)]
