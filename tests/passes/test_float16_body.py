"""float16_body: a float16 graph => its body in float32 between Casts at the float16 graph inputs and outputs
(target cpu, where onnxruntime's CPU provider has no float16 Conv kernel), so that the folds and FusedConv apply.

Numerics: original and optimized run in onnxruntime at ORT_DISABLE_ALL (conftest.assert_same_outputs) with
float16-aware tolerances rtol=atol=1e-2: the original rounds every intermediate to float16 (a relative step of
2^-11, about 5e-4, per node), the float32 body does not.

The probe of onnxruntime's float16 kernels (``onnxfuse.ort.float16``) depends on the processor, so the positive
cases set its answer to "no float16 kernel" (as on x86) and one case asks the real probe.
"""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxfuse.passes import float16_body
from onnxfuse.records import Reason
from tests.builders import GraphBuilder, subgraph
from tests.conftest import assert_same_outputs, assert_skipped, op_counts, slower_at

PASS = "float16_body"
F16_RTOL = F16_ATOL = 1e-2


@pytest.fixture
def no_f16_kernel(monkeypatch):
    monkeypatch.setattr(float16_body, "has_float16_kernel", lambda op: False)


def conv_clip(x_shape=(1, 3, 8, 8), constants="initializer"):
    """float16 x -> Conv(3 -> 8) -> Clip(0, 6) -> Conv(8 -> 4) -> y: a MobileNetV2 block."""
    b = GraphBuilder(dtype=np.float16, constants=constants)
    x = b.input("x", list(x_shape))
    c = b.op("Clip", [b.conv(x, x_shape[1], 8), b.const(np.float16(0)), b.const(np.float16(6))])
    return b.build(b.conv(c, 8, 4))


def elem_types(model):
    return ([i.type.tensor_type.elem_type for i in model.graph.input],
            [o.type.tensor_type.elem_type for o in model.graph.output])


def test_body_becomes_float32_and_fuses(fuse, no_f16_kernel):
    model = conv_clip()
    result = fuse(model, only=(PASS, "conv_activation"), target="cpu")
    assert op_counts(result.model) == {"Cast": 2, "FusedConv": 1, "Conv": 1}
    assert elem_types(result.model) == elem_types(model) == ([TensorProto.FLOAT16], [TensorProto.FLOAT16])
    assert {t.data_type for t in result.model.graph.initializer} == {TensorProto.FLOAT}
    onnx.checker.check_model(result.model, full_check=True)
    assert_same_outputs(model, result.model, rtol=F16_RTOL, atol=F16_ATOL)


def test_weights_in_constant_nodes_and_a_symbolic_batch(fuse, no_f16_kernel):
    model = conv_clip(x_shape=("N", 3, 6, 6), constants="node")
    result = fuse(model, only=(PASS,), target="cpu")
    assert op_counts(result.model)["Cast"] == 2
    for n in result.model.graph.node:
        if n.op_type == "Constant":
            assert n.attribute[0].t.data_type == TensorProto.FLOAT
    onnx.checker.check_model(result.model, full_check=True)


def test_whole_pipeline_folds_and_fuses_a_batchnorm_block(fuse, no_f16_kernel):
    b = GraphBuilder(dtype=np.float16)
    x = b.input("x", [2, 4, 7, 7])
    y = b.op("Relu", [b.bn(b.conv(x, 4, 6), 6)])
    model = b.build([b.op("Add", [y, b.const(np.full((1, 6, 1, 1), 0.5, np.float16))]), y])
    result = fuse(model, skip=(), target="cpu")
    assert "BatchNormalization" not in op_counts(result.model)
    assert op_counts(result.model)["FusedConv"] == 1
    assert elem_types(result.model) == elem_types(model)
    assert_same_outputs(model, result.model, rtol=F16_RTOL, atol=F16_ATOL)


def test_a_cast_from_float16_in_the_body_is_kept_valid(fuse, no_f16_kernel):
    b = GraphBuilder(dtype=np.float16)
    x = b.input("x", [1, 3, 5, 5])
    y = b.op("Cast", [b.op("Relu", [b.conv(x, 3, 3)])], to=TensorProto.FLOAT)
    model = b.build(y, output_dtype=np.float32)
    result = fuse(model, only=(PASS, "remove_redundant"), target="cpu")
    assert elem_types(result.model) == ([TensorProto.FLOAT16], [TensorProto.FLOAT])
    onnx.checker.check_model(result.model, full_check=True)
    assert_same_outputs(model, result.model, rtol=F16_RTOL, atol=F16_ATOL)


def test_float32_model_is_no_pattern(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 3, 5, 5])
    model = b.build(b.op("Relu", [b.conv(x, 3, 3)]))
    result = fuse(model, target="cpu")
    assert not result.fusions and not result.skips


def test_the_probe_decides_on_this_machine(fuse):
    from onnxfuse.ort.float16 import has_float16_kernel

    model = conv_clip()
    result = fuse(model, target="cpu")
    if has_float16_kernel("Conv"):
        assert [s.reason for s in result.skips] == [Reason.F16_KERNEL]
    else:
        assert [f.pass_name for f in result.fusions] == [PASS]
        assert_same_outputs(model, result.model, rtol=F16_RTOL, atol=F16_ATOL)


# ----------------------------------------------------------------------------------------------------------------
# Refusals


@pytest.mark.parametrize("target", ["cpu+cuda", "cuda", "onnx"])
def test_skip_target_not_cpu(fuse, no_f16_kernel, target):
    model = conv_clip()
    assert_skipped(fuse(model, target=target), model, Reason.F16_TARGET, PASS)


def test_skip_float16_kernel_exists(fuse, monkeypatch):
    monkeypatch.setattr(float16_body, "has_float16_kernel", lambda op: op == "Conv")
    model = conv_clip()
    s = assert_skipped(fuse(model), model, Reason.F16_KERNEL, PASS)
    assert "float16 Conv kernel" in s.detail


def test_casts_to_float16_and_constant_of_shape_in_the_body(fuse, no_f16_kernel):
    # onnxconverter-common keeps some ops in float32 between Cast(to=float) and Cast(to=float16): in the float32
    # body that Cast(to=float16) casts to float32 (one float16 rounding fewer), and the pair then cancels
    b = GraphBuilder(dtype=np.float16)
    x = b.input("x", [1, 3, 5, 5])
    wide = b.op("Cast", [b.conv(x, 3, 3)], to=TensorProto.FLOAT)
    narrow = b.op("Cast", [b.op("Exp", [wide])], to=TensorProto.FLOAT16)
    ones = b.op("ConstantOfShape", [b.op("Shape", [x])],
                value=helper.make_tensor("v", TensorProto.FLOAT16, [1], [0.5]))
    model = b.build(b.op("Add", [narrow, ones]))
    result = fuse(model, only=(PASS, "remove_redundant"))
    assert "Cast" not in {n.op_type for n in result.model.graph.node[1:-1]}  # only the two at the ends
    assert elem_types(result.model) == elem_types(model)
    onnx.checker.check_model(result.model, full_check=True)
    assert_same_outputs(model, result.model, rtol=F16_RTOL, atol=F16_ATOL)


def test_skip_float16_op_not_handled(fuse, no_f16_kernel):
    b = GraphBuilder(dtype=np.float16)
    x = b.input("x", [1, 3, 5, 5])
    eye = b.op("EyeLike", [b.op("Reshape", [x, b.const(np.array([3, 25], np.int64))])], dtype=TensorProto.FLOAT16)
    model = b.build([b.conv(x, 3, 3), eye])
    s = assert_skipped(fuse(model), model, Reason.F16_OP, PASS)
    assert "EyeLike" in s.detail


def test_skip_float16_graph_has_subgraphs(fuse, no_f16_kernel):
    b = GraphBuilder(dtype=np.float16)
    x = b.input("x", [1, 3, 5, 5])
    cond = b.input("cond", [], np.bool_)
    then, other = GraphBuilder(dtype=np.float16, prefix="t"), GraphBuilder(dtype=np.float16, prefix="e")
    branch_then = subgraph(then, then.op("Relu", [x]), "then")
    branch_else = subgraph(other, other.op("Sigmoid", [x]), "else")
    y = b.op("If", [cond], then_branch=branch_then, else_branch=branch_else)
    model = b.model(b.op("Add", [b.conv(x, 3, 3), y]))
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info(model.graph.output[0].name, TensorProto.FLOAT16,
                                                                 [1, 3, 5, 5]))
    assert_skipped(fuse(model), model, Reason.F16_SUBGRAPH, PASS)


def test_skip_float16_output_not_computed(fuse, no_f16_kernel):
    b = GraphBuilder(dtype=np.float16)
    x = b.input("x", [1, 3, 5, 5])
    model = b.model([b.conv(x, 3, 3), x])  # the input itself is also an output
    for out in model.graph.output:
        out.CopyFrom(helper.make_tensor_value_info(out.name, TensorProto.FLOAT16, [1, 3, 5, 5]))
    s = assert_skipped(fuse(model), model, Reason.F16_OUTPUT, PASS)
    assert "x" in s.detail


def test_report_counts_the_body_in_float32_and_says_so(fuse, no_f16_kernel):
    result = fuse(conv_clip(), only=(PASS, "conv_activation"), target="cpu")
    report = result.report
    (row,) = report.fusions
    assert row["dtype"] == "float32" and row["bytes_after"] is not None
    # the fused Conv reads x as float32 (4 bytes an element) after the Cast: 1 x 3 x 8 x 8 x 4 bytes
    assert row["bytes_after"] >= 3 * 8 * 8 * 4
    assert any("body runs in float32" in w for w in report.warnings)


def test_skip_slower_than_unfused_at_ort_level(fuse, monkeypatch, no_f16_kernel):
    """A speed rule for the form (``providers.CPU_SLOWER_AT``; none is measured today, BENCHMARKS.md) refuses it at
    that level and no other."""
    form = slower_at(monkeypatch, PASS, "all")
    model = conv_clip()
    s = assert_skipped(fuse(model, ort_level="all"), model, Reason.SLOWER_AT_ORT_LEVEL, PASS)
    assert form in s.detail and "level all" in s.detail
    assert any(f.pass_name == PASS for f in fuse(model, ort_level="extended").fusions)


def test_report_says_why_the_figure_against_the_export_grows(fuse, no_f16_kernel):
    """With nothing fused after it, float16_body alone makes the traffic against the graph as exported grow
    (every body tensor counted at 4 bytes an element, not 2): the report's warning says what precision the body
    runs in and why, in every format."""
    from onnxfuse.report import formats

    result = fuse(conv_clip(), only=(PASS,), target="cpu")
    doc = result.report.to_dict()
    assert doc["totals"]["saved_bytes"] < 0
    (warning,) = [w for w in doc["warnings"] if w.startswith("precision:")]
    assert "body runs in float32" in warning and "graph as exported" in warning and "4 bytes" in warning
    for fmt in ("text", "markdown", "html", "json"):
        shown = " ".join(formats.render(result.report, fmt, width=10_000).split())
        assert "against the graph as exported counts every body tensor at 4 bytes" in shown, fmt
