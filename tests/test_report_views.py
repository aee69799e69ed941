"""Every section of a report in every format (issue 30): the summary lines that present.headline decides once are
drawn by the text, Markdown and HTML renderers, and the JSON holds what they say."""

from __future__ import annotations

import html
import json

from onnxfuse import pipeline
from onnxfuse.bench import report_profile
from onnxfuse.report import present
from tests.conftest import REPO


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_every_headline_section_is_drawn_in_every_format(monkeypatch):
    monkeypatch.chdir(REPO)
    options = pipeline.make_options(target="cpu", ort_level="disable", bandwidth=100.0)
    result = pipeline.analyse("sample_models/resnet_block.onnx", options)
    report = result.report
    report.profile = report_profile(result.loaded.ort_source(), result.model, report.to_dict()["fusions"],
                                    "disable", {}, runs=2, max_time=0.0)
    doc = report.to_dict()
    lines = present.headline(doc)
    # the sections present here: vs onnxruntime, vs the graph as exported, runs on, model file, profile
    starts = ("vs onnxruntime ", "vs the graph as exported", "runs on: ", "model file: ", "latency at level ")
    assert [next(ln for ln in lines if ln.startswith(s)) for s in starts]
    text, md, page = _flat(report.to_text()), _flat(report.to_markdown()), report.to_html()
    for line in lines:
        assert _flat(line) in text, line
        assert _flat(line) in md, line
        assert html.escape(line, quote=False) in page or html.escape(line) in page, line
    bandwidth = present.bandwidth_line(doc["bandwidth"])
    assert _flat(bandwidth) in text and _flat(bandwidth) in md and html.escape(bandwidth[1:]) in page
    back = json.loads(report.to_json())
    assert back["profile"]["timing"]["rounds"] == 2 and back["bandwidth"]["gb_per_s"] == 100.0
    assert all("kind" in f for f in back["fusions"])
