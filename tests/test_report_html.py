"""The HTML report (``onnxfuse/report/html.py``) checked in Python: what the page holds and embeds, the chart's
layers, what would allow each unfused pattern, unknown and symbolic byte counts. tests/test_report_html_browser.py
opens the pages in a real browser."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import onnx
from click.testing import CliRunner

from onnxfuse import pipeline
from onnxfuse.cli.main import main
from onnxfuse.records import Reason
from onnxfuse.report import formats as report_formats
from onnxfuse.report import html as rh
from onnxfuse.report import model as report_model
from onnxfuse.report import present, remedies
from tests.builders import GraphBuilder
from tests.conftest import REPO
from tests.test_real_models import INPUT_SHAPES

SAMPLES = REPO / "sample_models"

#: Shared models and the shapes their applications feed (shared/models/README.md).
SHARED_SHAPES = INPUT_SHAPES

#: The issue's limit on the page size for the largest shared model.
MAX_PAGE_BYTES = 5 * 1000 * 1000


def reason_values() -> list[str]:
    """Every refusal code, whether ``Reason`` is an Enum or a class of string constants with ``ALL``."""
    if hasattr(Reason, "__members__"):
        return [r.value for r in Reason]
    return list(Reason.ALL)


def analysed(path: Path, target: str = "cpu", shapes: dict | None = None) -> dict:
    """The JSON form of ``onnxfuse report`` for ``path``."""
    report = pipeline.analyse(path, pipeline.Options(target=target, input_shapes=shapes or {})).report
    return json.loads(report_model.to_json(report))


def expected_layers(doc: dict) -> int:
    """Bars the chart must have, counted from the JSON: one per fusion, one per other non-Constant node of the
    original model, one per node only the optimized model has."""
    fused = {n["output"] for f in doc["fusions"] for n in f["replaced"]}
    before = {r["output"] for r in doc["nodes"]["before"]}
    outputs = {f["output"] for f in doc["fusions"]}
    plain = sum(1 for r in doc["nodes"]["before"] if r["output"] not in fused and r["op"] != "Constant")
    new = sum(1 for r in doc["nodes"]["after"]
              if r["output"] not in before and r["output"] not in outputs and r["op"] != "Constant")
    return len(doc["fusions"]) + plain + new


def without_numbers(doc: dict, symbol: str = "N") -> dict:
    """``doc`` as schema_version 2 gives it for a model whose batch ``symbol`` has no value: every byte number
    null, with an ``*_expr`` beside it (here the number times the symbol), and ``symbols``."""
    def strip(obj: dict, keys: tuple[str, ...]) -> None:
        for k in keys:
            obj[f"{k}_expr"] = None if obj.get(k) is None else f"{obj[k]}*{symbol}"
            obj[k] = None

    for side in ("before", "after"):
        for row in doc["nodes"][side]:
            strip(row, ("read_bytes", "written_bytes"))
        strip(doc["totals"][side], ("read_bytes", "written_bytes", "total_bytes"))
    for f in doc["fusions"]:
        strip(f, ("bytes_before", "bytes_after", "saved_bytes"))
    for u in doc["unfused"]:
        strip(u, ("bytes",))
    strip(doc["totals"], ("saved_bytes",))
    doc["totals"]["saved_percent"] = None
    doc["symbols"] = {symbol: {"input": "x", "axis": 0, "dim_param": "batch"}}
    return doc


def embedded(page_html: str, element_id: str) -> dict:
    match = re.search(rf'<script type="application/json" id="{element_id}">(.*?)</script>', page_html, re.S)
    assert match, element_id
    return json.loads(match.group(1))


# ---------------------------------------------------------------------------------------------------------------
# Without a browser


def test_every_reason_says_what_would_allow_it():
    """Each reason's row in onnxfuse/records.py carries its remedy: a sentence (an option, a target, an export
    change, or "none: " and why), and the HTML page's last column shows it."""
    from onnxfuse.records import Reason

    for r in Reason:
        assert len(r.remedy) > 20 and not r.remedy[0].isupper() and not r.remedy.endswith("."), r
        assert r.remedy.startswith(("none", "no target", "--", "a target", "export", "let ", "fix ", "deploy")), r
    assert set(remedies.REMEDIES) == set(reason_values())


def test_remedy_for_an_activation_names_the_targets_that_accept_it():
    row = {"reason": "activation-not-supported-by-target",
           "nodes": [{"name": "c", "op": "Conv", "output": "y"}, {"name": "h", "op": "HardSigmoid", "output": "z"}]}
    assert remedies.remedy(row, "cpu+cuda") == "--target cpu"
    row["nodes"][1]["op"] = "Relu"
    assert remedies.remedy(row, "onnx") == "--target cpu+cuda or --target cpu or --target cuda"
    row["nodes"][1]["op"] = "Gelu"
    assert remedies.remedy(row, "cpu").startswith("no target: onnxruntime's FusedConv")
    gemm = {"reason": "activation-not-supported-by-target",
            "nodes": [{"name": "g", "op": "Gemm", "output": "y"}, {"name": "r", "op": "Relu", "output": "z"}]}
    assert remedies.remedy(gemm, "cpu+cuda") == "--target cpu"  # only the CPU provider has FusedGemm
    assert remedies.remedy({**gemm, "reason": "target-allows-no-contrib-ops"}, "onnx") == "--target cpu"
    conv = {**row, "reason": "target-allows-no-contrib-ops"}
    assert remedies.remedy(conv, "onnx") == "--target cpu+cuda or --target cpu or --target cuda"
    assert remedies.remedy({"reason": "initializer-is-graph-input", "nodes": []}, "cpu").startswith(
        "--constant-initializer-inputs")
    assert remedies.remedy({"reason": "a-reason-from-the-future", "nodes": []}, "cpu") == "see the detail"


def test_layers_one_bar_per_fused_group_and_per_other_node():
    doc = analysed(SAMPLES / "resnet_block.onnx")
    units = present.layer_units(doc)
    assert len(units) == expected_layers(doc) == len(doc["nodes"]["after"])
    fused = [u for u in units if u["kind"] == "fused"]
    assert len(fused) == len(doc["fusions"]) == 2
    by_node = {f["node"]: f for f in doc["fusions"]}
    for u in fused:
        f = by_node[u["into"]["name"]]
        assert (u["before"], u["after"]) == (f["bytes_before"], f["bytes_after"])
        assert [n["output"] for n in u["nodes"]] == [n["output"] for n in f["replaced"]]
    assert sum(u["before"] for u in units) == doc["totals"]["before"]["total_bytes"]
    assert sum(u["after"] for u in units) == doc["totals"]["after"]["total_bytes"]


def test_chart_kinds_differ_without_colour():
    """Each kind of bar has its own fill pattern and width, so the chart reads in greyscale and in print."""
    doc = analysed(SAMPLES / "conv_hardsigmoid.onnx", target="cpu+cuda")
    traces = rh.traffic_figure(present.chart_layers(doc))["data"]
    looks = {(t["width"], t["marker"].get("pattern", {}).get("shape", "")) for t in traces}
    assert len(looks) == len(traces) == 4
    assert all("(" in t["name"] for t in traces if "pattern" in t["marker"])  # the legend names the pattern


def test_page_is_self_contained_and_embeds_the_json(tmp_path):
    doc = analysed(SAMPLES / "conv_hardsigmoid.onnx", target="cpu+cuda")
    page = rh.to_html(doc)
    assert embedded(page, "onnxfuse-report") == doc
    assert "default-src 'none'" in page  # the Content-Security-Policy forbids every request
    assert not re.search(r"<(link|img|iframe)\b|\b(src|href)\s*=", page, re.I)
    assert "--target cpu" in page  # what would allow the unfused HardSigmoid
    assert doc["unfused"] and doc["unfused"][0]["reason"] in page


def test_unknown_and_symbolic_bytes_render_as_unknown_or_expression():
    """schema_version 2 style: null numbers with ``*_expr`` strings beside them, and ``symbols``."""
    doc = analysed(SAMPLES / "resnet_block.onnx")
    doc["totals"]["before"].update(total_bytes=None, total_bytes_expr="412*N*H*W + 1990656")
    doc["totals"]["saved_bytes"] = None
    doc["totals"]["saved_percent"] = None
    doc["fusions"][0].update(saved_bytes=None, saved_bytes_expr="96*N*H*W")
    doc["fusions"][1].update(bytes_after=None, bytes_after_expr=None)
    doc["symbols"] = {"N": {"input": "x", "axis": 0, "dim_param": "batch"}}
    page = rh.to_html(doc)
    # one name per dim: the symbol N reads as the model's dim name, batch, in the cells and the legend
    assert "412*H*W*batch + 1990656 B" in page and "96*H*W*batch B" in page
    assert "*N*" not in page.split("<script")[0]  # the embedded JSON keeps the report's symbols
    assert "unknown" in page and "<td><code>batch</code></td><td>x</td>" in page  # the symbols table
    figures = embedded(page, "onnxfuse-figures")
    assert figures["totals"] is None  # no bar for totals that are not numbers
    fused = figures["traffic"]["data"][2]  # the fused bars: one has unknown after bytes, drawn at 0
    assert [(y, c[1]) for y, c in zip(fused["y"], fused["customdata"]) if y == 0] == [(0, "unknown")]


def test_label_text_is_escaped():
    doc = analysed(SAMPLES / "resnet_block.onnx")
    doc["fusions"][0]["node"] = "</script><b>x"
    doc["fusions"][0]["replaced"][0]["name"] = "<img src=x>"
    page = rh.to_html(doc)
    assert "</script><b>x" not in page and "<img src=x>" not in page
    assert embedded(page, "onnxfuse-report") == doc


def test_cli_writes_html_from_report_and_optimize(tmp_path):
    sample = str(SAMPLES / "resnet_block.onnx")
    out = tmp_path / "r.html"
    result = CliRunner().invoke(main, ["report", sample, "--format", "html", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    report = tmp_path / "o.HTML"
    result = CliRunner().invoke(main, ["optimize", sample, str(tmp_path / "o.onnx"), "--report", str(report),
                                       "--target", "cpu"])
    assert result.exit_code == 0, result.output
    doc = embedded(report.read_text(encoding="utf-8"), "onnxfuse-report")
    assert doc["verification"]["status"] == "passed"
    assert report_formats.format_for_path("a.htm") == "html"


def test_symbolic_output_shape_is_evaluated_at_the_symbol_values():
    doc = analysed(SAMPLES / "resnet_block.onnx")
    doc["symbols"] = {"N": {"input": "x", "axis": 0, "dim_param": "N"}, "H": {"input": "x", "axis": 2,
                                                                             "dim_param": None}}
    doc["fusions"][0]["shape"] = ["N", 8, "floor(H/2)", 16]
    doc["symbol_values"] = {"N": 1, "H": 32}
    assert "1x8x16x16 float32" in rh.to_html(doc)
    doc["symbol_values"] = {}
    assert "[N, 8, floor(x[2]/2), 16] float32" in rh.to_html(doc)  # H has no name of its own: x[2]


def test_bandwidth_without_a_number_says_unknown_as_the_text_does(tmp_path):
    """Two symbolic dims and no --input-shape (issue #21: a TypeError in the cell): the time is given at the
    representative sizes of every other figure (issue 30: one size per run), the same in HTML and text."""
    b = GraphBuilder()
    x = b.input("x", ["N", 3, "H", 16])
    path = tmp_path / "m.onnx"
    onnx.save(b.build(b.op("Relu", [b.conv(x, 3, 4)])), str(path))
    out = tmp_path / "r.html"
    result = CliRunner().invoke(main, ["report", str(path), "--bandwidth", "100", "-o", str(out)])
    assert result.exit_code == 0, result.output
    doc = embedded(out.read_text(encoding="utf-8"), "onnxfuse-report")
    bw = doc["bandwidth"]
    assert bw["at"] == "representative sizes" and bw["before_ms"] > bw["after_ms"] > 0
    page = out.read_text(encoding="utf-8")
    times = f"{present.human_time(bw['before_ms'])} -> {present.human_time(bw['after_ms'])}"
    [sentence] = re.findall(r'<p id="bandwidth">(.*?)</p>', page)
    assert "unknown" not in sentence and html.escape(times) in sentence
    text = CliRunner().invoke(main, ["report", str(path), "--bandwidth", "100"])
    assert times in " ".join(text.output.split()) and "at representative sizes" in " ".join(text.output.split())
