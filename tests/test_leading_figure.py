"""The figure every view leads with (issue 30): the bytes onnxfuse saves beyond what onnxruntime makes itself at
load. The summary's first line, the HTML headline and totals row, the Markdown report and the API's
``Report.saved_bytes_beyond_onnxruntime`` give the same number, at the input shapes or, for symbolic dims without
values, at the stated representative sizes (``Report.figure_sizes``), which verification's first set runs at."""

from __future__ import annotations

import html as html_mod
import re

import numpy as np
import pytest

from onnxfuse import pipeline
from onnxfuse.analysis.shapes import REPRESENTATIVE_BATCH, REPRESENTATIVE_SIZE
from onnxfuse.model import io as model_io
from onnxfuse.ort import sessions
from onnxfuse.report import html as report_html
from onnxfuse.report import present
from tests.builders import GraphBuilder
from tests.conftest import REPO


def _hardswish(dims) -> object:
    """Conv -> HardSwish written out (Add/Clip/Mul/Div): onnxruntime does not fuse it, onnxfuse (cpu) does."""
    b = GraphBuilder()
    y = b.conv(b.input("x", dims), 3, 8)
    clip = b.op("Clip", [b.op("Add", [y, b.const(np.array(3.0, np.float32))]),
                         b.const(np.array(0.0, np.float32)), b.const(np.array(6.0, np.float32))])
    return b.build(b.op("Div", [b.op("Mul", [y, clip]), b.const(np.array(6.0, np.float32))]))


def _reports():
    for path in sorted((REPO / "sample_models").glob("*.onnx")):
        yield path.name, pipeline.analyse(path, pipeline.Options(target="cpu")).report
    for dims in ([1, 3, 16, 16], ["N", 3, "H", "W"]):
        loaded = model_io.load_proto(_hardswish(dims))
        yield f"hardswish{dims}", pipeline.analyse(None, pipeline.Options(target="cpu"), loaded=loaded).report


@pytest.mark.parametrize(("name", "report"), list(_reports()), ids=lambda x: x if isinstance(x, str) else "")
def test_every_view_leads_with_the_same_figure(name, report):
    doc = report.to_dict()
    figure = report.saved_bytes_beyond_onnxruntime
    if not doc["fusions"]:
        assert figure == 0
        return
    assert figure is not None and figure >= 0
    first = present.summary_lines(report)[0]
    assert first.startswith("vs onnxruntime ")
    # the summary's first line: the figure, or "nothing is saved beyond it" when it is 0
    assert (present.human_bytes(figure) in first) or (figure == 0 and "nothing is saved beyond it" in first)
    page = report_html.to_html(doc)
    [headline] = re.findall(r'<ul class="headline"><li>(.*?)</li>', page)
    assert html_mod.unescape(headline) == first
    [cell] = re.findall(r'id="total-saved-beyond" data-bytes="(\d+)"', page)
    assert int(cell) == figure
    md = report.to_markdown()
    assert md.split("\n\n")[2].startswith("vs onnxruntime ") and md.split("\n\n")[2] == first
    assert (present.human_bytes(figure) in md.split("\n\n")[2]) or figure == 0


def test_symbolic_dims_give_the_figure_at_the_sizes_verification_runs_at():
    report = pipeline.analyse(None, pipeline.Options(target="cpu"),
                              loaded=model_io.load_proto(_hardswish(["N", 3, "H", "W"]))).report
    assert report.figure_sizes == {"N": REPRESENTATIVE_BATCH, "H": REPRESENTATIVE_SIZE, "W": REPRESENTATIVE_SIZE}
    assert (sessions.DEFAULT_BATCH_DIM, sessions.DEFAULT_OTHER_DIM) == (REPRESENTATIVE_BATCH, REPRESENTATIVE_SIZE)
    fixed = pipeline.analyse(None, pipeline.Options(target="cpu", input_shapes={"x": (1, 3, 224, 224)}),
                             loaded=model_io.load_proto(_hardswish(["N", 3, "H", "W"]))).report
    assert fixed.figure_sizes is None
    assert report.saved_bytes_beyond_onnxruntime == fixed.saved_bytes_beyond_onnxruntime > 0
    first = present.summary_lines(report)[0]
    assert first.endswith("at representative sizes N=1, H=224, W=224")
