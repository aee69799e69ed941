"""The report's figures against what onnxruntime already runs (onnxfuse/ort/optimized_graph.py): which fusions
onnxruntime
makes itself when it loads the original at the user's level, and the kernels and bytes saved beyond it."""

from __future__ import annotations

import os
import stat

import numpy as np
import onnx
import pytest

from onnxfuse import pipeline
from onnxfuse.ort import optimized_graph as ort_graph
from onnxfuse.report import formats as report_formats
from onnxfuse.report import markdown as report_markdown
from onnxfuse.report import present
from tests.builders import GraphBuilder


def _conv_bn_relu() -> onnx.ModelProto:
    """Conv -> BatchNormalization -> Relu: onnxruntime folds the BN (basic) and fuses the Relu (extended/all)."""
    b = GraphBuilder()
    x = b.input("x", [1, 3, 16, 16])
    return b.build(b.op("Relu", [b.bn(b.conv(x, 3, 8), 8)]))


def _written_out_hardswish() -> onnx.ModelProto:
    """Conv -> Mul([1]-shaped constant given first) -> HardSwish written out as Add/Clip/Mul/Div, as paddle2onnx
    exports it: onnxruntime folds neither the Mul nor the chain; onnxfuse (target cpu) makes one FusedConv."""
    b = GraphBuilder()
    x = b.input("x", [1, 3, 16, 16])
    y = b.op("Mul", [b.const(np.array([0.5], np.float32)), b.conv(x, 3, 8)])
    clip = b.op("Clip", [b.op("Add", [y, b.const(np.array(3.0, np.float32))]),
                         b.const(np.array(0.0, np.float32)), b.const(np.array(6.0, np.float32))])
    return b.build(b.op("Div", [b.op("Mul", [y, clip]), b.const(np.array(6.0, np.float32))]))


def _analyse(model, level="all", target="cpu") -> dict:
    return pipeline.analyse(None, pipeline.Options(target=target, ort_level=level),
                            loaded=_loaded(model)).report.to_dict()


def _loaded(model):
    from onnxfuse.model import io as model_io

    return model_io.load_proto(model)


def test_fusions_onnxruntime_makes_itself_save_nothing_beyond_it():
    doc = _analyse(_conv_bn_relu())
    rt = doc["onnxruntime"]
    assert rt["status"] == "compared" and rt["level"] == "all" and rt["installed"] == ort_graph.installed_version()
    assert [f["made_by_onnxruntime"] for f in doc["fusions"]] == [True]
    assert rt["fusions_made_by_onnxruntime"] == rt["fusions"] == 1
    assert rt["kernels_before"] == rt["kernels_after"] and rt["saved_bytes_beyond"] == 0
    assert doc["totals"]["saved_bytes"] > 0  # the graph as exported still gains: a different measure
    line = present.runtime_line(doc)
    assert "onnxruntime makes all 1 of these fusions itself" in line and "nothing is saved beyond it" in line


def test_fusions_beyond_onnxruntime_are_counted_with_their_kernels_and_bytes():
    doc = _analyse(_written_out_hardswish())
    rt = doc["onnxruntime"]
    [row] = doc["fusions"]
    assert row["op"] == "FusedConv" and row["activation"] == "HardSwish" and row["made_by_onnxruntime"] is False
    assert rt["fusions_made_by_onnxruntime"] == 0
    assert rt["kernels_after"] < rt["kernels_before"]
    assert rt["ops_removed"].get("Div") == 1 and rt["ops_removed"].get("Clip") == 1
    # nothing of this chain is made by onnxruntime: all of the fusion's saving is beyond it
    assert 0 < rt["saved_bytes_beyond"] == row["saved_bytes"]
    assert rt["saved_bytes_beyond_expr"] == str(rt["saved_bytes_beyond"])
    line = present.runtime_line(doc)
    assert line.startswith(f"vs onnxruntime {rt['installed']} (installed, CPU provider) at level all: 1 of 1 "
                           "fusions go beyond")
    assert present.summary_lines(pipeline.analyse(None, pipeline.Options(target="cpu"),
                                              loaded=_loaded(_written_out_hardswish())).report)[0] == line


def test_at_level_disable_every_fusion_is_beyond_onnxruntime():
    """With graph optimizations disabled onnxruntime fuses nothing: every fusion counts, with all its bytes."""
    doc = _analyse(_conv_bn_relu(), level="disable")
    rt = doc["onnxruntime"]
    assert rt["level"] == "disable" and rt["fusions_made_by_onnxruntime"] == 0
    assert rt["saved_bytes_beyond"] == doc["fusions"][0]["saved_bytes"] > 0
    assert rt["kernels_before"] == 3 and rt["kernels_after"] == 1


def test_a_bn_fold_inside_a_chain_onnxruntime_finishes_is_not_counted_beyond_it():
    """Conv -> BN -> written-out HardSwish: onnxruntime folds the BN itself but not the chain; the BN's
    intermediate (which onnxruntime no longer writes) is taken out of the saving beyond it."""
    b = GraphBuilder()
    x = b.input("x", [1, 3, 16, 16])
    y = b.bn(b.conv(x, 3, 8), 8)
    clip = b.op("Clip", [b.op("Add", [y, b.const(np.array(3.0, np.float32))]),
                         b.const(np.array(0.0, np.float32)), b.const(np.array(6.0, np.float32))])
    doc = _analyse(b.build(b.op("Div", [b.op("Mul", [y, clip]), b.const(np.array(6.0, np.float32))])))
    [row] = doc["fusions"]
    rt = doc["onnxruntime"]
    assert row["made_by_onnxruntime"] is False
    conv_out = 1 * 8 * 16 * 16 * 4  # the Conv's output, which onnxruntime's BN fold removes: one write, one read
    assert rt["saved_bytes_beyond"] == row["saved_bytes"] - 2 * conv_out


def test_a_model_onnxruntime_cannot_optimize_is_reported_not_compared(monkeypatch):
    def fail(source, level):
        raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : a made-up load failure")

    monkeypatch.setattr(ort_graph, "_optimized_graph", fail)
    doc = _analyse(_conv_bn_relu())
    rt = doc["onnxruntime"]
    assert rt["status"] == "unavailable" and "a made-up load failure" in rt["reason"]
    assert "made_by_onnxruntime" not in doc["fusions"][0]
    assert present.runtime_line(doc).endswith(f"not compared ({rt['reason']})")


def test_nothing_rewritten_is_0_b_beyond_onnxruntime_and_no_comparison_when_not_asked():
    """Nothing rewritten: no session is made, and the section says 0 B beyond onnxruntime (status unchanged), as the
    API's figure and a batch row do; not asked for (--no-verify): no section, the figure unknown."""
    b = GraphBuilder()
    x = b.input("x", [1, 3, 8, 8])
    unchanged = _analyse(b.build(b.op("Sigmoid", [x])))
    rt = unchanged["onnxruntime"]
    assert rt["status"] == "unchanged" and rt["saved_bytes_beyond"] == 0 and rt["kernels_before"] is None
    assert present.saved_beyond_onnxruntime(unchanged) == 0
    assert present.runtime_line(unchanged).endswith("nothing was fused, so nothing is saved beyond it (0 B)")
    doc = pipeline.analyse(None, pipeline.Options(target="cpu", compare_with_onnxruntime=False),
                           loaded=_loaded(_conv_bn_relu())).report.to_dict()
    assert "onnxruntime" not in doc and present.runtime_line(doc) is None


@pytest.mark.parametrize("fmt", ["text", "markdown", "html"])
def test_every_format_leads_with_the_runtime_figure(fmt):
    report = pipeline.analyse(None, pipeline.Options(target="cpu"), loaded=_loaded(_written_out_hardswish())).report
    text = " ".join(report_formats.render(report, fmt).split())  # the text format wraps long lines
    assert "go beyond what onnxruntime makes itself at load" in text
    assert text.index("go beyond what onnxruntime") < text.index("vs the graph as exported")


def test_fusion_tables_say_which_fusions_onnxruntime_makes_too():
    """Markdown and HTML fusion tables carry made_by_onnxruntime as a column: a user sees which fusions go beyond."""
    from onnxfuse.report import html as report_html

    beyond = pipeline.analyse(None, pipeline.Options(target="cpu"), loaded=_loaded(_written_out_hardswish())).report
    made = pipeline.analyse(None, pipeline.Options(target="cpu"), loaded=_loaded(_conv_bn_relu())).report
    assert "| onnxruntime makes it too |" in report_markdown.to_markdown(beyond)
    assert report_markdown.to_markdown(beyond).rstrip().count("| no |") == 1
    assert "| yes |" in report_markdown.to_markdown(made)
    assert "<td>no</td></tr>" in report_html.to_html(beyond.to_dict())
    assert "<td>yes</td></tr>" in report_html.to_html(made.to_dict())


def test_another_ort_version_says_the_comparison_was_measured_with_the_installed_release():
    """``--ort-version 1.20``: the runtime comparison can only be measured with the installed onnxruntime; the line
    says so instead of reading as the comparison for 1.20. Without it (or naming the installed release) no note."""
    installed = ort_graph.installed_version()
    major_minor = ".".join(installed.split(".")[:2])
    for version, note in (("1.20", True), (None, False), (major_minor, False)):
        report = pipeline.analyse(None, pipeline.Options(target="cpu", ort_version=version),
                                  loaded=_loaded(_written_out_hardswish())).report
        line = present.runtime_line(report.to_dict())
        assert line is not None and line.startswith(f"vs onnxruntime {installed} (installed, CPU provider")
        assert ("measured with it, not the 1.20 the model is for" in line) is note


def test_a_tensor_onnxruntime_recast_still_counts_as_written():
    """onnxruntime's insert-cast transformer writes a float16 tensor again as ``InsertedPrecisionFreeCast_<name>``
    (maybe with a ``_N`` suffix) or ``FusedBack_<name>``: the original tensor still makes its round trip, so a
    fusion that removed it is not one onnxruntime makes itself (it was, by name, before)."""
    from onnxfuse.ort import optimized_graph as ort_graph

    names = ort_graph.original_names(["conv_out", "InsertedPrecisionFreeCast_getitem",
                                      "InsertedPrecisionFreeCast_clip_3_1", "FusedBack_relu_out", "other"])
    assert {"getitem", "clip_3_1", "clip_3", "relu_out", "conv_out"} <= names
    graphs = ort_graph.RuntimeGraphs(level="all", onnxruntime="x", original_tensors=frozenset(names))
    assert not graphs.made_by_onnxruntime(["getitem"]) and graphs.made_by_onnxruntime(["gone"])


def test_a_tensor_onnxruntime_writes_in_its_nchwc_layout_still_counts_as_written():
    """onnxruntime's NCHWc transformer names the blocked-layout node after the tensor it writes (``<name>_nchwc``,
    ``_token_N`` appended to a name already taken) and writes it as ``reorder_token_N``: that tensor still makes
    its round trip, so a fusion that removed it is not one onnxruntime makes itself. The graph is built here as
    onnxruntime would save it (no processor's layout choice asserted)."""
    from onnx import TensorProto, helper

    nchwc = "com.microsoft.nchwc"
    nodes = [
        helper.make_node("ReorderInput", ["x"], ["reorder_token_0"], name="ReorderInput", domain=nchwc),
        helper.make_node("Conv", ["reorder_token_0", "w"], ["reorder_token_1"], name="conv_out_nchwc", domain=nchwc),
        helper.make_node("Conv", ["reorder_token_1", "w"], ["reorder_token_2"], name="conv2_out_nchwc_token_7",
                         domain=nchwc),
        helper.make_node("QuickGelu", ["reorder_token_2"], ["reorder_token_3"], name="silu", domain="com.microsoft"),
        helper.make_node("Conv", ["reorder_token_3", "w"], ["reorder_token_4"], name="relu_out_nchwc", domain=nchwc),
        helper.make_node("ReorderOutput", ["reorder_token_4"], ["y"], name="ReorderOutput_token_9", domain=nchwc),
    ]
    graph = helper.make_graph(nodes, "ort", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 4, 4])])
    written = ort_graph.written_tensors(helper.make_model(graph))
    assert {"conv_out", "conv2_out", "relu_out", "y", "reorder_token_1"} <= written
    graphs = ort_graph.RuntimeGraphs(level="all", onnxruntime="x", original_tensors=written)
    # Conv -> Relu fused by onnxfuse: onnxruntime wrote conv_out (blocked), so the fusion goes beyond it
    assert not graphs.made_by_onnxruntime(["conv_out"]) and not graphs.made_by_onnxruntime(["conv2_out"])
    assert graphs.made_by_onnxruntime(["conv3_out"])  # a tensor no node writes under any name


def test_a_graph_written_beside_a_link_to_devnull_is_the_same_and_leaves_no_weights_on_disk(tmp_path):
    """``graph_path``: the weights side file of a session that writes its graph goes to os.devnull (they are never
    read back); the graph written is the one written beside a real side file."""
    from onnxfuse.ort import sessions as runtime
    from tests.test_verify import deep_net

    model = deep_net(blocks=3).SerializeToString()
    plain = tmp_path / "plain"
    plain.mkdir()
    runtime.session(model, "all", save_to=str(plain / "g.onnx"), spinning=False, config=ort_graph.SAVE_CONFIG)
    assert (plain / "weights.bin").stat().st_size > 0  # without the link: the weights are written
    linked = tmp_path / "linked"
    linked.mkdir()
    path = ort_graph.graph_path(str(linked), "g.onnx")
    runtime.session(model, "all", save_to=path, spinning=False, config=ort_graph.SAVE_CONFIG)
    side = linked / "weights.bin"
    assert not side.exists() or side.is_symlink() or side.stat().st_size == 0  # nothing of the weights on disk
    assert (linked / "g.onnx").read_bytes() == (plain / "g.onnx").read_bytes()
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)  # the link went, os.devnull is still the device
