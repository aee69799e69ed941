"""Every section of a report in every format (issue 30): ``present.document`` decides the header, the headline and
the sections once; the text, Markdown and HTML renderers only draw that document and never read the report's data
(checked on their source)."""

from __future__ import annotations

import ast
import html
import json
import re

import numpy as np
import pytest

import onnxfuse
from onnxfuse import api
from onnxfuse.report import document as document_mod
from onnxfuse.report import present
from onnxfuse.report.model import with_warning
from tests.builders import GraphBuilder
from tests.conftest import REPO

RENDERERS = ("text", "markdown", "html")

#: Sections a report with everything has, by id.
EVERY_SECTION = ("warnings", "totals", "fusions", "unfused", "unknown", "verification", "onnxruntime", "deployment",
                 "bandwidth", "profile-ops", "profile-fusions", "tune", "symbols", "passes", "ops")


def _flat(text: str) -> str:
    return " ".join(text.split())


def _model():
    """A fusion (Conv -> BN -> Relu), a pattern left unfused (Conv -> Softsign: no FusedConv form), nodes of unknown
    size (NonZero: its output size depends on values) and a symbolic batch."""
    b = GraphBuilder()
    x = b.input("x", ["N", 3, 16, 16])
    y = b.op("Relu", [b.bn(b.conv(x, 3, 8), 8)])
    z = b.op("Softsign", [b.conv(y, 8, 8)])
    nz = b.op("NonZero", [b.op("Greater", [z, b.const(np.array(0.5, np.float32))])])
    return b.build([z, b.op("ReduceSum", [b.op("Cast", [nz], to=1)], keepdims=0)])


@pytest.fixture(scope="module")
def full_report():
    """One report with every section: verified, compared with onnxruntime, tuned, with bandwidth, profile and a
    warning (each added by a library function: the report itself is frozen)."""
    result = onnxfuse.optimize(_model(), target="cpu", bandwidth=100.0, tune=True, tune_budget=5.0)
    report = api.profile(result, runs=2, max_time=0.0)
    return with_warning(report, "a warning <b>of</b> the test")


def _views(report) -> dict[str, str]:
    """Each format as the plain text a reader sees: the terminal text, the Markdown rendered (markdown-it) and the
    HTML page without its tags and scripts."""
    from markdown_it import MarkdownIt

    def page_text(page: str) -> str:
        body = page.split('<script type="application/json"')[0]
        return html.unescape(re.sub(r"<[^>]+>", " ", body))

    return {"text": _flat(report.to_text(show_all=True)),
            "markdown": _flat(page_text(MarkdownIt("commonmark").enable("table").render(report.to_markdown()))),
            "html": _flat(page_text(report.to_html()))}


def test_every_section_is_drawn_in_every_format(full_report):
    report = full_report
    doc = present.document(report, show_all=True)
    assert [s.id for s in doc.sections] == list(EVERY_SECTION)
    back = json.loads(report.to_json())
    p = back["profile"]
    content = {
        "warnings": "a warning <b>of</b> the test",
        "totals": "saved vs the graph as exported",
        "fusions": back["fusions"][0]["node"],
        "unfused": back["unfused"][0]["reason"],
        "unknown": back["unknown_nodes"][0]["reason"],
        "verification": back["verification"]["outputs"][0]["name"],
        "onnxruntime": f"kernels, the original {back['onnxruntime']['kernels_before']}",
        "deployment": back["deployment"]["forms"][0]["form"],
        "bandwidth": f"{present.human_time(back['bandwidth']['before_ms'])} -> "
                     f"{present.human_time(back['bandwidth']['after_ms'])}",
        "profile-ops": f"{p['original']['by_op']['Conv']['ms']:.3f}",
        "profile-fusions": p["by_fusion"][0]["kernel"],
        "tune": present.tune_line(back),
        "symbols": "model's dim name",
        "passes": "conv_batchnorm",
        "ops": "com.microsoft::FusedConv",
    }
    views = _views(report)
    for fmt, text in views.items():
        for section in doc.sections:
            assert _flat(section.title) in text, (fmt, section.title)
            assert _flat(content[section.id]) in text, (fmt, section.id, content[section.id])
        for line in doc.headline:  # the headline (the runtime figure first) in every format
            assert _flat("".join(span.text for span in line)) in text, (fmt, line)
    first = "".join(s.text for s in doc.headline[0])
    assert first.startswith("vs onnxruntime ") and first == present.summary_lines(report)[0]
    for fmt, text in views.items():
        assert text.index(_flat(first)) < text.index("Totals (bytes"), fmt  # it leads every view
    assert back["profile"]["timing"]["rounds"] == 2 and back["bandwidth"]["gb_per_s"] == 100.0
    assert all("kind" in f and "folds" in f for f in back["fusions"])


def test_the_report_is_frozen(full_report):
    import dataclasses

    with pytest.raises(dataclasses.FrozenInstanceError):
        full_report.profile = None  # type: ignore[misc]
    assert not any(name.startswith("set_") for name in dir(full_report))


def _renderer_source(fmt: str) -> ast.Module:
    return ast.parse((REPO / "onnxfuse" / "report" / f"{fmt}.py").read_text(encoding="utf-8"))


@pytest.mark.parametrize("fmt", RENDERERS)
def test_renderers_draw_the_document_only(fmt):
    """A renderer never reads the report's data: it calls no ``to_dict``, subscripts nothing with a string key (the
    dict's fields), and imports of onnxfuse only the document types, the escaping and ``present.document``."""
    tree = _renderer_source(fmt)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            assert node.attr != "to_dict", (fmt, node.lineno)
        if isinstance(node, ast.Subscript):
            key = node.slice
            assert not (isinstance(key, ast.Constant) and isinstance(key.value, str)), (fmt, node.lineno)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("onnxfuse"):
            allowed = {"onnxfuse.report.document": None, "onnxfuse.report": {"escape"},
                       "onnxfuse.report.escape": None, "onnxfuse.report.present": {"document"},
                       "onnxfuse.report.schema": {"Doc", "SupportsToDict"}}
            assert node.module in allowed, (fmt, node.module)
            names = allowed[node.module]
            assert names is None or {a.name for a in node.names} <= names, (fmt, node.module)
    public = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "draw"]
    assert public == ["draw"], fmt
    draw = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "draw")
    assert draw.args.args[0].annotation is not None and ast.unparse(draw.args.args[0].annotation) == "Document"


def test_document_is_frozen_data():
    import dataclasses

    for name in ("Document", "Section", "Column", "Note", "Field", "Bytes", "Num", "Chart", "Layer", "TotalsBar"):
        cls = getattr(document_mod, name)
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, name
