"""Remake docs/report.png, README's screenshot of the HTML report, from a real shared model.

Run from the repository root (needs ../shared/models, Debian's chromium and the test extra's playwright):

    python docs/make_report_png.py [MODEL.onnx NAME=DIMS...]

It writes the report of rapidocr_det_ppocrv4 at 1x3x640x640 (target cpu) by default, opens it in headless Chromium,
hovers the middle fused bar and saves the top of the page, 1280 px wide.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import tempfile
from pathlib import Path

from onnxfuse import pipeline
from onnxfuse.analysis.shapes import parse_input_shape
from onnxfuse.report import formats as report_formats
from onnxfuse.report.html import TRACE_FUSED

DEFAULT = ["../shared/models/rapidocr_det_ppocrv4.onnx", "x=1x3x640x640"]


def main(argv: list[str]) -> None:
    from playwright.sync_api import sync_playwright

    model, *shapes = argv or DEFAULT
    options = pipeline.Options(target="cpu", input_shapes=dict(parse_input_shape(s) for s in shapes))
    report = pipeline.analyse(Path(model), options).report
    # no folder of this machine in the picture (a new report: the report is frozen)
    report = dataclasses.replace(report, model={**report.model, "path": Path(model).name})
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        page_path = Path(tmp) / "report.html"
        page_path.write_text(report_formats.render(report, "html"), encoding="utf-8")
        browser = p.chromium.launch(executable_path=shutil.which("chromium"),
                                    args=["--no-sandbox"] if os.geteuid() == 0 else [])
        page = browser.new_page(viewport={"width": 1280, "height": 1560})
        page.goto(page_path.as_uri())
        page.wait_for_selector("body[data-charts-ready=true]")
        box = page.evaluate("""([name, k]) => {
            const t = Array.from(document.querySelectorAll('#traffic-chart .cartesianlayer .barlayer .trace'))
                .find(t => t.__data__[0].trace.name === name);
            const r = t.querySelectorAll('.point')[k].getBoundingClientRect();
            return {x: r.x + r.width / 2, y: r.y + r.height / 2};
        }""", [TRACE_FUSED, len(report.fusions) // 2])
        page.mouse.move(box["x"], box["y"])
        page.wait_for_timeout(300)
        page.screenshot(path="docs/report.png")
        browser.close()
    print(f"wrote docs/report.png ({Path('docs/report.png').stat().st_size} bytes)")


if __name__ == "__main__":
    main(sys.argv[1:])
