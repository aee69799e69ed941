"""Never stricter for nothing (issue 31, item 3): a form that needs a newer onnxruntime than the input model is
emitted only where onnxruntime's own graph at --ort-level runs fewer kernels with it (``onnxfuse.passes.portable``,
``pipeline._keep_portable``).

Numerics: every output is checked against the original at ORT_DISABLE_ALL with conftest.RTOL/ATOL.
"""

from __future__ import annotations

import pytest

from onnxfuse.ort import optimized_graph
from onnxfuse.records import Reason
from tests.builders import GraphBuilder
from tests.conftest import ATOL, RTOL, assert_same_outputs, fused_nodes, op_counts, optimize


def hardswish_model(then_conv: bool = True):
    """x -> Conv -> HardSwish [-> Conv]: the HardSwish op, which FusedConv(HardSwish) (onnxruntime >= 1.30) takes."""
    b = GraphBuilder()
    x = b.input("x", [1, 16, 12, 12])
    h = b.op("HardSwish", [b.conv(x, 16, 16)])
    return b.build(b.conv(h, 16, 16) if then_conv else h, opset=14)


def min_release(model) -> str:
    return {p.key: p.value for p in model.metadata_props}["onnxfuse.min_onnxruntime"]


def portable_and_fused(tmp_path, model, level):
    """The output without FusedConv(HardSwish) (for --ort-version 1.20) and with it (no comparison)."""
    portable = optimize(tmp_path, model, "cpu", ort_level=level, ort_version="1.20").model
    fused = optimize(tmp_path, model, "cpu", ort_level=level).model
    return portable, fused


@pytest.mark.parametrize("level", ["all", "extended"])
@pytest.mark.parametrize("then_conv", [True, False])
def test_the_newer_form_only_where_onnxruntime_runs_fewer_kernels(tmp_path, level, then_conv):
    # whatever this processor's onnxruntime does at the level (NCHWc on x86, not on ARM), the rule holds
    model = hardswish_model(then_conv)
    result = optimize(tmp_path, model, "cpu", ort_level=level, compare_with_onnxruntime=True)
    portable, fused = portable_and_fused(tmp_path, model, level)
    gains = optimized_graph.kernels_at(fused, level) < optimized_graph.kernels_at(portable, level)
    has_form = any(n.op_type == "FusedConv" for n in result.model.graph.node)
    assert has_form == gains
    assert min_release(result.model) == ("1.30" if gains else "1.15")
    if not gains:
        assert [s.reason for s in result.skips] == [Reason.MADE_BY_ORT_ITSELF]
    assert_same_outputs(model, result.model, RTOL, ATOL)


def test_extended_level_keeps_the_form(tmp_path):
    # onnxruntime's extended-level ConvActivationFusion has no HardSwish (shared/docs/fusedconv.md): the form gains
    model = hardswish_model()
    result = optimize(tmp_path, model, "cpu", ort_level="extended", compare_with_onnxruntime=True)
    assert op_counts(result.model) == {"FusedConv": 1, "Conv": 1}
    assert min_release(result.model) == "1.30"


def test_fewer_kernels_keeps_the_form_and_equal_counts_do_not(tmp_path, monkeypatch):
    model = hardswish_model()
    counts = iter([2, 3])  # with the form, then without
    monkeypatch.setattr(optimized_graph, "kernels_at", lambda m, level: next(counts))
    kept = optimize(tmp_path, model, "cpu", compare_with_onnxruntime=True)
    assert [n.op_type for n in fused_nodes(kept.model)] == ["FusedConv"] and min_release(kept.model) == "1.30"
    monkeypatch.setattr(optimized_graph, "kernels_at", lambda m, level: 4)
    portable = optimize(tmp_path, model, "cpu", compare_with_onnxruntime=True)
    assert op_counts(portable.model) == {"Conv": 2, "HardSwish": 1} and min_release(portable.model) == "1.15"


def test_no_comparison_no_session_and_the_form_as_before(tmp_path, monkeypatch):
    def fail(*args):
        raise AssertionError("no onnxruntime session without the comparison")

    monkeypatch.setattr(optimized_graph, "kernels_at", fail)
    result = optimize(tmp_path, hardswish_model(), "cpu", compare_with_onnxruntime=False)
    assert min_release(result.model) == "1.30"


def test_no_newer_form_no_session(tmp_path, monkeypatch):
    def fail(*args):
        raise AssertionError("no form needs a newer release: nothing to decide")

    monkeypatch.setattr(optimized_graph, "kernels_at", fail)
    b = GraphBuilder()
    x = b.input("x", [1, 3, 8, 8])
    model = b.build(b.op("Relu", [b.conv(x, 3, 4)]))
    result = optimize(tmp_path, model, "cpu", compare_with_onnxruntime=True)
    assert min_release(result.model) == "1.15"


def test_an_input_that_holds_the_form_already_decides_nothing(tmp_path, monkeypatch):
    # the input needs 1.30 already (a FusedConv(HardSwish) of its own): one more raises nothing, no session is made
    import onnx

    from onnxfuse.passes import portable

    assert portable.input_min_release(["FusedConv(HardSwish)"]) == (1, 30)
    assert portable.input_min_release([]) == (1, 15)

    def fail(*args):
        raise AssertionError("the input needs 1.30 already: nothing to decide")

    monkeypatch.setattr(optimized_graph, "kernels_at", fail)
    b = GraphBuilder()
    x = b.input("x", [1, 16, 12, 12])
    w, bias = b.const(b.rand(16, 16, 3, 3)), b.const(b.rand(16, scale=0.1))
    y = b.op("FusedConv", [x, w, bias], domain="com.microsoft", activation="HardSwish", pads=[1, 1, 1, 1])
    model = b.model(b.op("HardSwish", [b.conv(y, 16, 16)]), opset=14, extra_opsets={"com.microsoft": 1})
    model.graph.output[0].CopyFrom(onnx.helper.make_tensor_value_info(model.graph.output[0].name,
                                                                      onnx.TensorProto.FLOAT, [1, 16, 12, 12]))
    result = optimize(tmp_path, model, "cpu", compare_with_onnxruntime=True)
    assert [n.op_type for n in result.model.graph.node] == ["FusedConv", "FusedConv"]
    assert min_release(result.model) == "1.30"
    assert_same_outputs(model, result.model, RTOL, ATOL)
