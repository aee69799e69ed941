"""layout_wrapper: a per-channel Add/Sub/Mul/Div or an activation after a Transpose/Squeeze/Unsqueeze/Reshape of a
Conv's output moves before it, where conv_affine folds it and conv_activation fuses it.

Numerics: original and optimized run in onnxruntime at ORT_DISABLE_ALL (conftest.assert_same_outputs). The move
alone is exact (rtol=0, atol=0: the same float operation on the same elements); with the folds after it the
tolerances are conftest's RTOL/ATOL (the fold changes the order of the float32 products).
"""

import numpy as np
import onnx
import pytest
import sympy

from onnxfuse.records import Reason
from tests.builders import GraphBuilder
from tests.conftest import ATOL, RTOL, assert_same_outputs, assert_skipped, op_counts, run, slower_at

PASS = "layout_wrapper"
FOLDS = ("constant_fold", "remove_redundant", PASS, "conv_affine", "conv_activation")


def nhwc_block(b, x, c_in, c_out, act="Relu", scale=True, bias=True, bias_shape=None):
    """TensorFlow's NHWC conv: Transpose(NHWC->NCHW) -> Conv -> Transpose(NCHW->NHWC) -> Mul(s[C]) -> Add(o[C])
    -> act, the constants on the last axis."""
    t = b.op("Transpose", [x], perm=[0, 3, 1, 2])
    y = b.op("Transpose", [b.conv(t, c_in, c_out)], perm=[0, 2, 3, 1])
    if scale:
        y = b.op("Mul", [y, b.const(b.rng.uniform(0.5, 1.5, c_out).astype(np.float32))])
    if bias:
        y = b.op("Add", [b.const(b.rand(*(bias_shape or (c_out,)))), y])
    return b.op(act, [y]) if act else y


def nhwc_model(blocks=1, **kw):
    b = GraphBuilder()
    y = b.input("x", [1, 8, 8, 3])
    c = 3
    for _ in range(blocks):
        y = nhwc_block(b, y, c, 4, **kw)
        c = 4
    return b.build(y)


def conv1d_model(act="Relu", shape=("N", 3, "T"), squeeze_axes=(2,), opset=17):
    """An audio toolkit's Conv1d as Conv2d: Unsqueeze(axis 2) -> Conv(1x3) -> Squeeze(axis 2) -> Mul(s[C, 1]) ->
    Add(o[C, 1]) -> act."""
    b = GraphBuilder()
    x = b.input("x", list(shape))
    axes = b.const(np.array([2], np.int64))
    u = b.op("Unsqueeze", [x, axes])
    conv = b.conv(u, 3, 5, k=(1, 3), pads=[0, 1, 0, 1])
    y = b.op("Squeeze", [conv, b.const(np.array(list(squeeze_axes), np.int64))])
    y = b.op("Mul", [y, b.const(b.rng.uniform(0.5, 1.5, (5, 1)).astype(np.float32))])
    y = b.op("Add", [y, b.const(b.rand(5, 1))])
    return b.build(b.op(act, [y]) if act else y, opset=opset)


def test_move_alone_is_exact(fuse):
    model = nhwc_model()
    result = fuse(model)
    assert [f.pass_name for f in result.fusions].count(PASS) == 3  # Mul, Add, Relu each cross the Transpose
    ops = [n.op_type for n in result.model.graph.node]
    assert ops == ["Transpose", "Conv", "Mul", "Add", "Relu", "Transpose"]
    onnx.checker.check_model(result.model, full_check=True)
    assert_same_outputs(model, result.model, rtol=0, atol=0)


def test_nhwc_folds_and_fuses_on_cpu(fuse):
    model = nhwc_model(blocks=3)
    result = fuse(model, only=FOLDS)
    # the Mul/Add fold into each Conv, the Relu fuses, and the NCHW->NHWC->NCHW pairs between convs cancel
    assert op_counts(result.model) == {"Transpose": 2, "FusedConv": 3}
    onnx.checker.check_model(result.model, full_check=True)
    assert_same_outputs(model, result.model)


def test_nhwc_folds_on_target_onnx(fuse):
    model = nhwc_model(blocks=2)
    result = fuse(model, target="onnx", only=FOLDS)
    assert op_counts(result.model) == {"Transpose": 2, "Conv": 2, "Relu": 2}
    assert_same_outputs(model, result.model)


@pytest.mark.parametrize("shape", [("N", 3, "T"), (2, 3, 16)])
def test_conv1d_as_conv2d_folds(fuse, shape):
    model = conv1d_model(shape=shape)
    result = fuse(model, only=FOLDS)
    assert op_counts(result.model) == {"Unsqueeze": 1, "FusedConv": 1, "Squeeze": 1}
    onnx.checker.check_model(result.model, full_check=True)
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 3, 16)).astype(np.float32)}  # N=2, T=16
    for ref, got in zip(run(model, feeds), run(result.model, feeds), strict=True):
        np.testing.assert_allclose(got, ref, rtol=RTOL, atol=ATOL)


def test_conv1d_squeeze_attribute_form(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 3, 12])
    u = b.op("Unsqueeze", [x], axes=[2])
    y = b.op("Squeeze", [b.conv(u, 3, 4, k=(1, 3), pads=[0, 1, 0, 1])], axes=[2])
    y = b.op("Mul", [y, b.const(np.arange(1, 5, dtype=np.float32).reshape(4, 1))])
    model = b.build(b.op("Sigmoid", [y]), opset=11)
    result = fuse(model, only=FOLDS)
    assert op_counts(result.model) == {"Unsqueeze": 1, "FusedConv": 1, "Squeeze": 1}
    assert_same_outputs(model, result.model)


def test_reshape_to_channels_last_rank3(fuse):
    """Conv [1, 4, 1, 6] -> Reshape [1, 4, 6] -> Transpose [1, 6, 4] -> Add(o[4]): two wrappers, crossed in two
    rounds."""
    b = GraphBuilder()
    x = b.input("x", [1, 3, 1, 6])
    y = b.op("Reshape", [b.conv(x, 3, 4, k=(1, 3), pads=[0, 1, 0, 1]), b.const(np.array([1, 4, 6], np.int64))])
    y = b.op("Transpose", [y], perm=[0, 2, 1])
    model = b.build(b.op("Sub", [y, b.const(b.rand(4))]))
    result = fuse(model, only=FOLDS)
    assert op_counts(result.model) == {"Conv": 1, "Reshape": 1, "Transpose": 1}
    assert_same_outputs(model, result.model)


def test_uniform_constant_and_clip(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 8, 8, 3])
    y = b.op("Transpose", [b.conv(b.op("Transpose", [x], perm=[0, 3, 1, 2]), 3, 4)], perm=[0, 2, 3, 1])
    y = b.op("Div", [y, b.const(np.full((1, 1, 1, 1), 4.0, np.float32))])
    y = b.op("Clip", [y, b.const(np.float32(0)), b.const(np.float32(6))])
    model = b.build(y)
    result = fuse(model, only=FOLDS)
    assert op_counts(result.model) == {"Transpose": 2, "FusedConv": 1}
    assert_same_outputs(model, result.model)


def test_skip_intermediate_has_other_consumers(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 8, 8, 3])
    t = b.op("Transpose", [b.conv(b.op("Transpose", [x], perm=[0, 3, 1, 2]), 3, 4)], perm=[0, 2, 3, 1])
    y = b.op("Add", [t, b.const(b.rand(4))])
    model = b.build([y, b.op("Neg", [t])])
    assert_skipped(fuse(model), model, Reason.NOT_PRIVATE, PASS)


def test_skip_intermediate_is_graph_output(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 8, 8, 3])
    t = b.op("Transpose", [b.conv(b.op("Transpose", [x], perm=[0, 3, 1, 2]), 3, 4)], perm=[0, 2, 3, 1])
    model = b.build([b.op("Add", [t, b.const(b.rand(4))]), t])
    assert_skipped(fuse(model), model, Reason.GRAPH_OUTPUT, PASS)


def test_skip_initializer_is_graph_input(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 8, 8, 3])
    t = b.op("Transpose", [b.conv(b.op("Transpose", [x], perm=[0, 3, 1, 2]), 3, 4)], perm=[0, 2, 3, 1])
    model = b.build(b.op("Add", [t, b.const(b.rand(4))]), initializers_as_inputs=True, ir_version=4)
    s = assert_skipped(fuse(model), model, Reason.INITIALIZER_IS_INPUT, PASS)
    assert "overridable" in s.detail


@pytest.mark.parametrize("bias_shape", [(8, 1), (1, 8, 1, 1)])
def test_skip_constant_not_per_channel(fuse, bias_shape):
    """A constant along W (axis 2 of NHWC), or along the conv-side channel axis position but not the NHWC one."""
    model = nhwc_model(scale=False, act=None, bias_shape=bias_shape)
    assert_skipped(fuse(model), model, Reason.NOT_PER_CHANNEL, PASS)


def test_skip_constant_not_per_channel_broadcast_grows(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 3, 12])
    y = b.op("Squeeze", [b.conv(b.op("Unsqueeze", [x], axes=[2]), 3, 4, k=(1, 3), pads=[0, 1, 0, 1])], axes=[2])
    model = b.build(b.op("Add", [y, b.const(b.rand(2, 4, 1))]), opset=11)  # [1, 4, 12] + [2, 4, 1] -> [2, 4, 12]
    assert_skipped(fuse(model), model, Reason.NOT_PER_CHANNEL, PASS)


def test_skip_conv_output_is_divisor(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 8, 8, 3])
    t = b.op("Transpose", [b.conv(b.op("Transpose", [x], perm=[0, 3, 1, 2]), 3, 4)], perm=[0, 2, 3, 1])
    model = b.build(b.op("Div", [b.const(b.rng.uniform(1, 2, 4).astype(np.float32)), t]))
    assert_skipped(fuse(model), model, Reason.CONV_IS_DIVISOR, PASS)


def test_skip_layout_wrapper_shape_unknown(fuse):
    """A Reshape whose target shape is computed at run time, of a conv output of unknown extents."""
    b = GraphBuilder()
    x = b.input("x", [1, 3, 6, 6])
    target = b.input("target", [3], dtype=np.int64)
    y = b.op("Reshape", [b.conv(x, 3, 4), target])
    model = b.build(b.op("Add", [y, b.const(b.rand(4))]))
    assert_skipped(fuse(model), model, Reason.LAYOUT_SHAPE, PASS)


@pytest.mark.parametrize("target", [[1, 144], [1, 2, 72]])
def test_skip_layout_wrapper_splits_channels(fuse, target):
    b = GraphBuilder()
    x = b.input("x", [1, 3, 6, 6])
    y = b.op("Reshape", [b.conv(x, 3, 4), b.const(np.array(target, np.int64))])
    model = b.build(b.op("Add", [y, b.const(b.rand(target[-1]))]))
    assert_skipped(fuse(model), model, Reason.LAYOUT_SPLIT, PASS)


def test_no_conv_behind_the_wrapper_is_no_pattern(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 3, 6, 6])
    y = b.op("Transpose", [b.op("Neg", [x])], perm=[0, 2, 3, 1])
    model = b.build(b.op("Add", [y, b.const(b.rand(3))]))
    result = fuse(model)
    assert not result.fusions and not result.skips


def test_residual_after_the_wrapper_is_no_pattern(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 8, 8, 3])
    t = b.op("Transpose", [b.conv(b.op("Transpose", [x], perm=[0, 3, 1, 2]), 3, 4)], perm=[0, 2, 3, 1])
    model = b.build(b.op("Add", [t, b.input("r", [1, 8, 8, 4])]))
    result = fuse(model)
    assert not result.fusions and not result.skips


def nhwc_input_affine(pads=0, scale_shape=(3,), shift=True, extra_reader=False):
    """TensorFlow's preprocessing before an NHWC conv: x * s[C] + o[C] -> Transpose(NHWC->NCHW) -> Conv."""
    b = GraphBuilder()
    x = b.input("x", [1, 8, 8, 3])
    y = b.op("Mul", [x, b.const(b.rng.uniform(0.5, 2.0, scale_shape).astype(np.float32))])
    z = b.op("Add", [y, b.const(b.rand(3))]) if shift else y
    conv = b.conv(b.op("Transpose", [z], perm=[0, 3, 1, 2]), 3, 4, pads=[pads] * 4)
    return b.build([conv, b.op("Neg", [z])] if extra_reader else conv)


def test_affine_before_the_wrapper_moves_after_it_exactly(fuse):
    model = nhwc_input_affine()
    result = fuse(model)
    assert [n.op_type for n in result.model.graph.node] == ["Transpose", "Mul", "Add", "Conv"]
    onnx.checker.check_model(result.model, full_check=True)
    assert_same_outputs(model, result.model, rtol=0, atol=0)


def test_affine_before_the_wrapper_folds_into_the_conv(fuse):
    model = nhwc_input_affine()
    result = fuse(model, only=(PASS, "affine_conv"))
    assert op_counts(result.model) == {"Transpose": 1, "Conv": 1}
    assert_same_outputs(model, result.model)


def test_conv1d_input_scale_folds(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 3, 12])
    y = b.op("Mul", [x, b.const(b.rng.uniform(0.5, 2.0, (3, 1)).astype(np.float32))])
    axes = b.const(np.array([2], np.int64), as_node=True)  # a Constant node: re-stored where the Unsqueeze moves
    conv = b.conv(b.op("Unsqueeze", [y, axes]), 3, 4, k=(1, 3), pads=[0, 0, 0, 0])
    model = b.build(conv)
    result = fuse(model, only=(PASS, "affine_conv"))
    assert op_counts(result.model) == {"Unsqueeze": 1, "Conv": 1}
    onnx.checker.check_model(result.model, full_check=True)
    assert_same_outputs(model, result.model)


def test_between_two_convs_the_op_moves_towards_the_first_only(fuse):
    """Conv -> Transpose -> Add(c) -> Transpose -> Conv: the Add moves before the first Transpose (and folds into
    the first Conv), never back and forth."""
    b = GraphBuilder()
    x = b.input("x", [1, 3, 8, 8])
    y = b.op("Transpose", [b.conv(x, 3, 4)], perm=[0, 2, 3, 1])
    y = b.op("Add", [y, b.const(b.rand(4))])
    model = b.build(b.conv(b.op("Transpose", [y], perm=[0, 3, 1, 2]), 4, 5))
    result = fuse(model, only=FOLDS)
    assert [f.pass_name for f in result.fusions].count(PASS) == 1
    assert op_counts(result.model) == {"Conv": 2}
    assert_same_outputs(model, result.model)


def test_skip_intermediate_has_other_consumers_before_the_wrapper(fuse):
    model = nhwc_input_affine(shift=False, extra_reader=True)
    assert_skipped(fuse(model), model, Reason.NOT_PRIVATE, PASS)


def test_skip_constant_not_per_channel_before_the_wrapper(fuse):
    model = nhwc_input_affine(shift=False, scale_shape=(8, 1, 1))  # varies along H of the NHWC input
    assert_skipped(fuse(model), model, Reason.NOT_PER_CHANNEL, PASS)


def test_whole_pipeline_on_nhwc_and_conv1d_chains(fuse):
    """Every pass (the default order and fixpoint): TensorFlow's NHWC chain keeps one Transpose at each end, an
    audio Conv1d chain one Unsqueeze and one Squeeze (remove_redundant cancels the pairs between convs)."""
    nhwc = nhwc_model(blocks=3)
    result = fuse(nhwc, skip=())
    assert op_counts(result.model) == {"Transpose": 2, "FusedConv": 3}
    assert_same_outputs(nhwc, result.model)
    b = GraphBuilder()
    y, axes = b.input("x", [1, 4, 16]), b.const(np.array([2], np.int64))
    for _ in range(3):
        y = b.op("Squeeze", [b.conv(b.op("Unsqueeze", [y, axes]), 4, 4, k=(1, 3), pads=[0, 1, 0, 1]), axes])
        y = b.op("Relu", [b.op("Mul", [y, b.const(b.rng.uniform(0.5, 1.5, (4, 1)).astype(np.float32))])])
    audio = b.build(y)
    result = fuse(audio, skip=())
    assert [n.op_type for n in result.model.graph.node] == ["Unsqueeze", "FusedConv", "FusedConv", "FusedConv",
                                                            "Squeeze"]
    assert_same_outputs(audio, result.model)


def test_skip_layout_wrapper_shape_unknown_before_the_wrapper(fuse):
    """x * s[C] -> Reshape(target computed at run time) -> Conv: the Reshape's axis mapping is not known."""
    b = GraphBuilder()
    x = b.input("x", [1, 3, 36])
    target = b.input("target", [4], dtype=np.int64)
    y = b.op("Mul", [x, b.const(b.rng.uniform(0.5, 2.0, (3, 1)).astype(np.float32))])
    model = b.build(b.conv(b.op("Reshape", [y, target]), 3, 4, pads=[0, 0, 0, 0]))
    assert_skipped(fuse(model), model, Reason.LAYOUT_SHAPE, PASS)


def _random_wrapped_conv(seed):
    """Conv [1, 4, 6, 5] -> 1-3 random wrappers (Transpose of a random perm, Reshape merging two neighbouring axes,
    Unsqueeze at a random axis, Squeeze of an axis of extent 1) -> op(c) -> Relu. Numpy applies the same wrappers
    to an array of channel indices, which says independently of the pass which axis (if any) holds the channels
    alone: c varies along it (else along the last axis, which must be refused or left, never moved wrongly).
    Returns (model, whether a per-channel axis exists)."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder(seed=seed)
    x = b.input("x", [1, 3, 6, 5])
    y = b.conv(x, 3, 4)
    labels = np.broadcast_to(np.arange(4).reshape(1, 4, 1, 1), (1, 4, 6, 5)).copy()
    for _ in range(rng.integers(1, 4)):
        kind = rng.choice(["Transpose", "Reshape", "Unsqueeze", "Squeeze"])
        if kind == "Transpose":
            perm = [int(p) for p in rng.permutation(labels.ndim)]
            y, labels = b.op("Transpose", [y], perm=perm), labels.transpose(perm)
        elif kind == "Reshape" and labels.ndim >= 2:
            a = int(rng.integers(0, labels.ndim - 1))
            shape = [*labels.shape[:a], labels.shape[a] * labels.shape[a + 1], *labels.shape[a + 2:]]
            y, labels = b.op("Reshape", [y, b.const(np.array(shape, np.int64))]), labels.reshape(shape)
        elif kind == "Unsqueeze":
            a = int(rng.integers(0, labels.ndim + 1))
            y, labels = b.op("Unsqueeze", [y, b.const(np.array([a], np.int64))]), np.expand_dims(labels, a)
        else:
            ones = [i for i, d in enumerate(labels.shape) if d == 1]
            if ones:
                a = ones[int(rng.integers(0, len(ones)))]
                y, labels = b.op("Squeeze", [y, b.const(np.array([a], np.int64))]), np.squeeze(labels, a)
    axes = [j for j in range(labels.ndim) if labels.shape[j] == 4
            and np.array_equal(labels, np.broadcast_to(np.moveaxis(np.arange(4).reshape(4, *([1] * (labels.ndim - 1))),
                                                                   0, j), labels.shape))]
    j = axes[0] if axes else labels.ndim - 1
    shape = [1] * labels.ndim
    shape[j] = labels.shape[j]
    c = b.const(rng.uniform(0.5, 1.5, shape).astype(np.float32))
    op = str(rng.choice(["Add", "Sub", "Mul", "Div"]))
    inputs = [y, c] if op == "Div" or rng.integers(0, 2) else [c, y]
    return b.build(b.op("Relu", [b.op(op, inputs)])), bool(axes)


@pytest.mark.parametrize("seed", range(16))
def test_random_wrapper_chains_are_exact(fuse, seed):
    model, per_channel = _random_wrapped_conv(seed)
    result = fuse(model, skip=())
    onnx.checker.check_model(result.model, full_check=True)
    assert_same_outputs(model, result.model)
    counts = op_counts(result.model)
    if per_channel:  # the constant and the Relu are in the conv now
        assert counts.get("FusedConv") == 1 and not any(counts.get(op) for op in ("Add", "Sub", "Mul", "Div"))


def test_skip_slower_than_unfused_at_ort_level(fuse, monkeypatch):
    """A speed rule for the form (``providers.CPU_SLOWER_AT``; none is measured today, BENCHMARKS.md) refuses it at
    that level and no other."""
    form = slower_at(monkeypatch, PASS, "all")
    model = nhwc_model(scale=False, bias=False)
    s = assert_skipped(fuse(model, ort_level="all"), model, Reason.SLOWER_AT_ORT_LEVEL, PASS)
    assert form in s.detail and "level all" in s.detail
    assert any(f.pass_name == PASS for f in fuse(model, ort_level="extended").fusions)


def _normalized_nhwc_input(batch):
    """TensorFlow's input normalization on a flat NHWC input: x [batch, 64, 3] -> Mul(s[3]) -> Add(o[3]) ->
    Reshape([0, 8, 8, 3]) -> Transpose(NHWC->NCHW) -> Conv(1x1, 3 -> 4) -> Relu."""
    b = GraphBuilder()
    y = b.op("Mul", [b.input("x", [batch, 64, 3]), b.const(b.rng.uniform(0.5, 1.5, 3).astype(np.float32))])
    y = b.op("Add", [y, b.const(b.rand(3))])
    y = b.op("Transpose", [b.op("Reshape", [y, b.const(np.array([0, 8, 8, 3], np.int64))])], perm=[0, 3, 1, 2])
    return b.build(b.op("Relu", [b.conv(y, 3, 4, k=1, pads=[0, 0, 0, 0])]))


@pytest.mark.parametrize(("batch", "input_shapes"), [(1, {}), ("N", {}), ("N", {"x": (2, 64, 3)})])
def test_moved_ops_and_the_tensors_they_write_have_sizes(fuse, batch, input_shapes):
    """The Mul and Add cross the Reshape and the Transpose (each move writes a tensor the original never had)
    and fold into the Conv: every node of the output has a size (the shapes the pass recorded, numbers or the
    input's named dims), and the fused row counts the original Mul and Add by their outputs in the input."""
    model = _normalized_nhwc_input(batch)
    result = fuse(model, only=(*FOLDS, "affine_conv"), input_shapes=input_shapes)
    assert [n.op_type for n in result.model.graph.node] == ["Reshape", "Transpose", "FusedConv"]
    doc = result.report.to_dict()
    assert doc["unknown_nodes"] == [] and doc["totals"]["after"]["unknown_nodes"] == 0
    (row,) = doc["fusions"]
    originals = {n.name: n.output[0] for n in model.graph.node}
    assert {(o["name"], o["output"]) for o in row["replaced"]} == {(n, originals[n]) for n in
                                                                   ("mul2", "add4", "conv10", "relu11")}
    def moved(r):
        return sympy.sympify(r["read_bytes_expr"]) + sympy.sympify(r["written_bytes_expr"])

    before = {r["output"]: r for r in doc["nodes"]["before"]}
    after = {r["output"]: r for r in doc["nodes"]["after"]}
    assert sympy.sympify(row["bytes_before_expr"]) == sum(moved(before[o["output"]]) for o in row["replaced"])
    assert sympy.sympify(row["bytes_after_expr"]) == moved(after[row["output"]])
    totals = doc["totals"]
    assert sympy.sympify(totals["after"]["total_bytes_expr"]) == sum(moved(r) for r in after.values())
    assert_same_outputs(model, result.model)


def test_the_passes_table_counts_moved_nodes_as_moved_not_removed(fuse):
    """layout_wrapper moves each op across its wrapper and deletes nothing: its passes-table row says 0 nodes
    removed, 0 B (the wrapper and the op are both in the output, by name and op)."""
    model = nhwc_model()
    result = fuse(model)
    assert result.fusions and all(f.pass_name == PASS for f in result.fusions)
    names = {(n.name, n.op_type) for n in result.model.graph.node}
    assert all((name, op) in names for f in result.fusions for name, op, _ in f.replaced)
    (row,) = [r for r in result.report.to_dict()["pass_stats"] if r["name"] == PASS]
    assert row["applied"] == len(result.fusions) and row["removed_nodes"] == 0 and row["removed_bytes"] == 0
