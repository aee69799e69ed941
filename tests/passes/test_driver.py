"""The driver (``onnxfuse.passes.driver``): the passes together, as the pipeline runs them.

Cases where several passes interact: a chain that becomes one node only through passes in order (a fold, then the
fusion that needs the fold first), the skip kept per Conv when two passes refuse the same chain, the shapes refreshed
between the canonicalization stage and the fusions, the kind each pass gives its rewrites. No ``PASS`` here: ``fuse``
runs every pass. The tests of one pass are in ``test_<name>.py``.

Numerics: original and optimized run in onnxruntime at ORT_DISABLE_ALL (conftest.assert_same_outputs) with
rtol/atol RTOL/ATOL.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from onnxfuse.passes import ALL_PASSES, driver
from onnxfuse.records import Reason, RewriteKind, Skip
from tests.builders import GraphBuilder, compact_weight
from tests.conftest import ATOL, RTOL, assert_same_outputs, assert_skipped, attr, fused_nodes, op_counts
from tests.passes.test_constant_fold import keras_flatten_mlp
from tests.passes.test_conv_affine import per_channel_input_model
from tests.passes.test_conv_batchnorm import conv_bn, int8_initializers
from tests.passes.test_conv_hardswish import build as hardswish_model
from tests.passes.test_gemm_batchnorm import gemm_bn

#: Channels of the conv in :func:`per_channel_input_model` (``test_conv_affine.M``).
M = 4
#: Rows, inputs and outputs of the MatMul in the MLP case (as ``test_matmul_add``).
MM_M, MM_K, MM_N = 3, 5, 4


# --------------------------------------------------------------------------------------------------------------
# Chains that become one node through several passes, in order


def test_chain_mul_add_relu_becomes_one_fused_conv(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 3, 6, 6])
    y = b.op("Add", [b.const(b.rand(1, M, 1, 1)), b.op("Mul", [b.conv(x, 3, M), b.const(b.rand(M, 1, 1))])])
    model = b.build(b.op("Relu", [y]))
    result = fuse(model)
    assert op_counts(result.model) == {"FusedConv": 1}
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_bn_then_relu_becomes_one_fused_conv(fuse):
    b, y = conv_bn()
    model = b.build(b.op("Relu", [y]))
    result = fuse(model, target="cpu+cuda")
    assert op_counts(result.model) == {"FusedConv": 1}
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_after_bn_and_residual_add_becomes_one_fused_conv(fuse):
    # Conv -> BN -> Add(z) -> HardSwish(written out): BN folds, the Add becomes Z, HardSwish the activation.
    # The Z-only FusedConv in between is a form onnxfuse does not emit at ORT_ENABLE_ALL (providers.CPU_SLOWER_AT),
    # so this chain is fused for sessions at a lower level.
    b = GraphBuilder()
    x, z = b.input("x", [1, 3, 6, 6]), b.input("z", [1, 4, 6, 6])
    y = b.op("Add", [b.bn(b.conv(x, 3, 4), 4), z])
    k = b.const(np.float32(3.0)), b.const(np.float32(0.0)), b.const(np.float32(6.0))
    model = b.build(b.op("Div", [b.op("Mul", [y, b.op("Clip", [b.op("Add", [y, k[0]]), k[1], k[2]])]), k[2]]))
    result = fuse(model, target="cpu", ort_level="extended")
    assert op_counts(result.model) == {"FusedConv": 1}
    (node,) = fused_nodes(result.model)
    assert attr(node, "activation") == b"HardSwish" and node.input[3] == "z"
    assert [f.pass_name for f in result.fusions] == ["conv_batchnorm", "conv_residual", "conv_hardswish"]
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_bn_then_relu_becomes_one_fused_gemm_on_cpu(fuse):
    b, y = gemm_bn(trans_b=True)
    model = b.build(b.op("Relu", [y]))
    result = fuse(model, target="cpu")
    assert op_counts(result.model) == {"FusedGemm": 1}
    assert [f.pass_name for f in result.fusions] == ["gemm_batchnorm", "gemm_activation"]
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_mlp_matmul_add_relu_matmul_add_on_cpu(fuse):
    b = GraphBuilder()
    y = b.input("x", [MM_M, MM_K])
    for k, n in ((MM_K, 8), (8, MM_N)):
        y = b.op("Add", [b.op("MatMul", [y, b.const(b.rand(k, n))]), b.const(b.rand(n))])
        if n == 8:
            y = b.op("Relu", [y])
    model = b.build(y)
    result = fuse(model, target="cpu")
    assert op_counts(result.model) == {"FusedGemm": 1, "Gemm": 1}
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_each_rewrite_carries_the_kind_of_its_pass(fuse):
    # Conv -> Add(Reshape(constants) bias) -> BN -> Relu: a canonicalization, two folds and a fusion, each Fusion
    # record of the kind its pass declares. The BN reads the Add, so conv_batchnorm matches only in the round after
    # conv_affine folded it (the fixpoint).
    b = GraphBuilder(constants="node")
    x = b.input("x", [1, 3, 6, 6])
    bias = b.op("Reshape", [b.const(b.rand(4)), b.const(np.array([1, 4, 1, 1], np.int64))])
    model = b.build(b.op("Relu", [b.bn(b.op("Add", [b.conv(x, 3, 4, bias=False), bias]), 4)]), opset=14)
    result = fuse(model, target="cpu+cuda")
    assert op_counts(result.model) == {"FusedConv": 1}
    kinds = {p.name: p.kind for p in ALL_PASSES}
    assert [(f.pass_name, f.kind) for f in result.fusions] == [
        ("constant_fold", RewriteKind.CANONICALIZE), ("conv_affine", RewriteKind.FOLD),
        ("conv_batchnorm", RewriteKind.FOLD), ("conv_activation", RewriteKind.FUSE)]
    assert all(f.kind is kinds[f.pass_name] for f in result.fusions)
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_weight_only_int8_model_keeps_int8_weights_and_its_file_size(tmp_path):
    """A weight-only int8 model (every conv weight int8 x per-channel scale, compute float32) with Conv -> BN ->
    Relu blocks: optimize (verified in onnxruntime) folds every BN and fuses every Relu, and the written file
    keeps the int8 weights, at most 3% larger than the input."""
    from onnxfuse import api

    b = GraphBuilder()
    y = b.input("x", [1, 32, 16, 16])
    for _ in range(3):
        y = b.op("Relu", [b.bn(b.conv(y, 32, 32, weight=compact_weight(b, 32, 32)), 32)])
    model = b.build(y, opset=13)
    src, dst = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(model, str(src))
    result = api.optimize(str(src), require_verify=True)
    result.save(dst)
    out = onnx.load(str(dst))
    assert op_counts(out) == {"FusedConv": 3, "Cast": 3, "Mul": 3}
    assert int8_initializers(out) == int8_initializers(model)
    # no larger than 3% over the input (it shrinks: the BN parameters leave); float32 weights would add 3 x 27 KiB
    assert dst.stat().st_size <= 1.03 * src.stat().st_size
    assert result.report.verification.status == "passed"
    assert_same_outputs(model, out, rtol=RTOL, atol=ATOL)


def test_each_stage_stops_after_max_rounds_when_a_pass_never_settles():
    # a pass whose rewrite reports a change every time: the driver still ends, after MAX_ROUNDS rounds per stage
    import onnx_graphsurgeon as gs

    from onnxfuse.ir import constants
    from onnxfuse.ort.providers import get_target
    from onnxfuse.passes import Context, Match, Pass
    from onnxfuse.records import Fusion

    class Restless(Pass[Match]):
        name, kind, anchors = "restless", RewriteKind.FUSE, ("Relu",)

        def match(self, node, ctx):
            return Match([node])

        def rewrite(self, match, ctx):
            return Fusion(self.name, "", "", (), None, "", self.kind)

    x = gs.Variable("x", np.float32, (1, 4))
    relu = gs.Node("Relu", "relu", inputs=[x], outputs=[gs.Variable("y", np.float32, (1, 4))])
    graph = gs.Graph(nodes=[relu], inputs=[x], outputs=relu.outputs, opset=17)
    fusions, skips = driver.run_passes(graph, (Restless(),), Context(get_target("cpu"), frozenset(), {},
                                                                      constants.Namer(graph)))
    assert len(fusions) == driver.MAX_ROUNDS and not skips


def test_a_rewrite_outside_the_driver_is_a_clear_error():
    # the driver sets the graph and its node order; a pass run without them says so instead of failing on None
    import onnx_graphsurgeon as gs

    from onnxfuse.ir import constants, edit
    from onnxfuse.ort.providers import get_target
    from onnxfuse.passes import Context

    graph = gs.Graph(opset=17)
    ctx = Context(get_target("cpu"), frozenset(), {}, constants.Namer(graph))
    with pytest.raises(RuntimeError, match=r"Context\.graph is not set"):
        _ = ctx.opset
    with pytest.raises(RuntimeError, match=r"Context\.order is not set"):
        _ = ctx.edit_order
    ctx.graph, ctx.order = graph, edit.NodeOrder(graph)
    assert ctx.opset == 17 and ctx.edit_order is ctx.order


def test_node_order_compacts_only_after_an_edit():
    # the driver compacts after every pass; a pass that rewrote nothing leaves the list as it is (no rebuild),
    # and every kind of edit (move, delete, place, insert before) is still written back by the next compact
    import onnx_graphsurgeon as gs

    from onnxfuse.ir import edit

    x = gs.Variable("x", np.float32, (1, 4))
    a = gs.Node("Relu", "a", inputs=[x], outputs=[gs.Variable("ya", np.float32, (1, 4))])
    b = gs.Node("Relu", "b", inputs=a.outputs, outputs=[gs.Variable("yb", np.float32, (1, 4))])
    c = gs.Node("Relu", "c", inputs=b.outputs, outputs=[gs.Variable("yc", np.float32, (1, 4))])
    graph = gs.Graph(nodes=[a, b, c], inputs=[x], outputs=c.outputs, opset=17)
    order = edit.NodeOrder(graph)
    before = graph.nodes
    order.compact()
    assert graph.nodes is before and [n.name for n in graph.nodes] == ["a", "b", "c"]
    order.delete([b])
    order.compact()
    assert [n.name for n in graph.nodes] == ["a", "c"]
    new = gs.Node("Identity", "new", inputs=[x], outputs=[gs.Variable("yn", np.float32, (1, 4))])
    order.insert_before(new, order.slot(c))
    order.compact()
    assert [n.name for n in graph.nodes] == ["a", "new", "c"]
    slot = order.slot(a)
    order.delete([a])
    order.place(gs.Node("Identity", "placed", inputs=[x], outputs=[gs.Variable("yp", np.float32, (1, 4))]), slot)
    order.compact()
    assert [n.name for n in graph.nodes] == ["placed", "new", "c"]
    order.move_and_delete(new, c, [])
    order.compact()
    assert [n.name for n in graph.nodes] == ["placed", "new"]
    kept = graph.nodes
    order.compact()
    assert graph.nodes is kept

# --------------------------------------------------------------------------------------------------------------
# Which skip a Conv chain keeps when several passes refuse it


def test_pipeline_shows_the_reason_of_the_pass_nearest_to_fusing():
    # per conv: a value that is not constant (the pass would fuse once it is) beats a longer chain refused for
    # its shape or speed; otherwise the longest chain, then the earlier pass
    conv = ("conv", "Conv", "y")
    weights = Skip(Reason.WEIGHTS_NOT_CONSTANT, "", (conv, ("a", "Add", "a_out")), "a_out", "conv_affine")
    shape = Skip(Reason.RESIDUAL_SHAPE, "", (conv, ("a", "Add", "a_out"), ("r", "Relu", "r_out")), "r_out",
                 "conv_residual")
    slower = Skip(Reason.SLOWER_AT_ORT_LEVEL, "", shape.nodes, "r_out", "conv_residual")
    short = Skip(Reason.NOT_PRIVATE, "", weights.nodes, "a_out", "conv_affine")
    assert driver.longest_per_conv([shape, weights]) == [weights]
    assert driver.longest_per_conv([slower, weights]) == [weights]
    assert driver.longest_per_conv([short, shape]) == [shape]
    assert driver.longest_per_conv([short, Skip(Reason.QDQ, "", weights.nodes, "a_out", "conv_unfused")]) == [short]


@pytest.mark.parametrize("ort_level", ["all", "extended"])
def test_skip_weights_not_constant_when_weights_and_bias_are_graph_inputs(fuse, ort_level):
    # conv_residual also refuses the Add (Z [1, M, 1, 1] is no residual of the output's shape); the pipeline shows
    # conv_affine's reason: constant weights and c are all it lacks
    model = per_channel_input_model(weight_input=True)
    result = fuse(model, ort_level=ort_level)
    assert_skipped(result, model, Reason.WEIGHTS_NOT_CONSTANT, "conv_affine")
    assert [(x.pass_name, x.reason) for x in result.skips] == [("conv_affine", Reason.WEIGHTS_NOT_CONSTANT)]


def test_one_unfused_row_per_conv(fuse):
    # On cpu+cuda the written-out HardSwish stays; conv_affine also sees Add(x, 3) with x read twice, but the
    # report keeps only the row that says what the pattern is.
    model = hardswish_model("div_of_mul")
    result = fuse(model, target="cpu+cuda")
    assert [(s.pass_name, s.reason) for s in result.skips] == [("conv_hardswish", Reason.ACTIVATION_UNSUPPORTED)]


def test_full_shape_graph_input_is_a_residual_not_a_parameter(fuse):
    model = per_channel_input_model(c_shape=(1, M, 6, 4))
    result = fuse(model, ort_level="extended")
    onnx.checker.check_model(result.model, full_check=True)
    assert op_counts(result.model) == {"FusedConv": 1}
    assert [f.pass_name for f in result.fusions] == ["conv_residual"]
    assert not result.skips
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


# --------------------------------------------------------------------------------------------------------------
# Shapes refreshed after constant_fold folded a Shape, before the fusion passes


def test_shape_of_static_keras_flatten_folds_and_dense_layers_become_gemms(fuse):
    model = keras_flatten_mlp()
    result = fuse(model, target="cpu")
    onnx.checker.check_model(result.model, full_check=True)
    counts = op_counts(result.model)
    assert counts["FusedGemm"] == 3 and counts["Gemm"] == 1, counts
    for op in ("Shape", "Gather", "Concat", "Unsqueeze", "MatMul", "Add"):
        assert op not in counts, counts
    assert sum(f.pass_name == "constant_fold" and f.replaced[0][1] == "Shape" for f in result.fusions) == 1
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_shapes_stay_as_they_were_when_the_graph_cannot_be_exported_for_inference(fuse, monkeypatch):
    # refresh_shapes exports the graph without weights; a failing export must leave ctx.shapes as it was (the
    # Dense layers behind the Flatten then stay MatMul + Add, named matmul-input-not-2d) and change nothing else
    import onnx_graphsurgeon as gs

    def fail(node):
        raise ValueError("injected export failure")

    from onnxfuse.passes import constant_fold

    model = keras_flatten_mlp()

    calls = []

    def refresh_failing(graph, ctx):
        # only during the refresh: constant_fold.evaluate exports the nodes it folds with the same exporter
        calls.append(dict(ctx.shapes))
        with monkeypatch.context() as patch:
            patch.setattr(gs.exporters.onnx_exporter.OnnxExporter, "export_node", staticmethod(fail))
            constant_fold.refresh_shapes(graph, ctx)
        assert ctx.shapes == calls[0]

    monkeypatch.setattr(driver, "refresh_shapes", refresh_failing)
    result = fuse(model)
    assert len(calls) == 1
    onnx.checker.check_model(result.model, full_check=True)
    counts = op_counts(result.model)
    assert "Shape" not in counts and counts["MatMul"] == 4, counts
    assert {s.reason for s in result.skips if s.pass_name == "matmul_add"} == {Reason.MATMUL_NOT_2D}
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)
