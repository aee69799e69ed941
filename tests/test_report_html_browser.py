"""The HTML report in a real browser: headless Chromium (Debian's ``chromium`` package, or the executable in
``ONNXFUSE_CHROMIUM``) driven by Playwright's Python package pointed at that executable (no browser download).

Without Chromium or Playwright this module skips with one line, unless ``CI`` is set: then every test fails, since
``.ci/run`` installs both. The tests check that the page makes no network request and logs no console error, that
the chart has one bar per layer (each fused group one bar, the other non-Constant nodes one bar each, counted here
from the JSON), that the totals shown equal the JSON, that hovering a fused bar names its nodes, that the tables
sort, that print media hides the zoom controls, and that a report without byte numbers (symbolic dims, schema 2)
shows the expressions. One screenshot per shared model goes into pytest's temporary folder (printed with ``-s``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from onnxfuse.cli.main import main
from onnxfuse.report import html as rh
from onnxfuse.report import present
from tests.conftest import shared_model
from tests.test_report_html import (
    MAX_PAGE_BYTES,
    SAMPLES,
    SHARED_SHAPES,
    analysed,
    expected_layers,
    without_numbers,
)


def _chromium() -> str | None:
    return (os.environ.get("ONNXFUSE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
            or shutil.which("google-chrome"))


def _missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if _chromium() is None:
        return "no chromium found on PATH (apt-get install chromium, or set ONNXFUSE_CHROMIUM)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is missing (pip install -e '.[test]')"
    return None


MISSING = _missing()
if MISSING and not os.environ.get("CI"):
    pytest.skip(f"browser tests skipped: {MISSING}", allow_module_level=True)


@pytest.fixture(scope="module")
def browser():
    """A headless Chromium driven by Playwright (fails when either is missing: CI is set)."""
    if MISSING:
        pytest.fail(f"browser tests are required when CI is set: {MISSING}", pytrace=False)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        # Chromium's sandbox cannot start as root (CI runs as root)
        args = ["--no-sandbox"] if os.geteuid() == 0 else []
        b = playwright.chromium.launch(executable_path=_chromium(), args=args)
        yield b
        b.close()


class Opened:
    """A report page loaded in the browser, with the console errors and requests it caused."""

    def __init__(self, browser, path: Path):
        self.page = browser.new_page(viewport={"width": 1280, "height": 900})
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.url = path.resolve().as_uri()
        self.page.goto(self.url)
        self.page.wait_for_selector("body[data-charts-ready=true]", timeout=30_000)

    def bars_per_trace(self) -> dict[str, int]:
        """``.point`` marks drawn for each trace of the traffic chart's main plot (not its range slider), by trace
        name (plotly binds each trace's data to its ``<g class="trace">`` with d3; it draws no group for an empty
        trace)."""
        return self.page.evaluate("""() => Object.fromEntries(Array.from(document.querySelectorAll(
            '#traffic-chart .cartesianlayer .barlayer .trace')).map(
                t => [t.__data__[0].trace.name, t.querySelectorAll('.point').length]))""")

    def hover_fused_bar(self, k: int) -> str:
        """Move the mouse over the ``k``-th fused bar; the hover label's text."""
        self.page.locator("#traffic-chart").scroll_into_view_if_needed()
        box = self.page.evaluate("""([name, k]) => {
            const trace = Array.from(document.querySelectorAll('#traffic-chart .cartesianlayer .barlayer .trace'))
                .find(t => t.__data__[0].trace.name === name);
            const r = trace.querySelectorAll('.point')[k].getBoundingClientRect();
            return {x: r.x, y: r.y, width: r.width, height: r.height};
        }""", [rh.TRACE_FUSED, k])
        self.page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        label = self.page.locator("#traffic-chart .hoverlayer")
        self.page.wait_for_function("() => document.querySelector('#traffic-chart .hoverlayer').textContent.length")
        return label.text_content()

    def check_page(self, doc: dict) -> None:
        """No console error, no request but the page itself, one bar per layer, totals as in ``doc``."""
        assert not self.errors, self.errors
        assert self.requests == [self.url]
        layers = expected_layers(doc)
        bars = self.bars_per_trace()
        assert bars[rh.TRACE_BEFORE] == layers, (bars, layers)
        assert sum(bars.get(name, 0) for name in (rh.TRACE_AFTER, rh.TRACE_FUSED, rh.TRACE_UNFUSED)) == layers
        assert bars.get(rh.TRACE_FUSED, 0) == len(doc["fusions"])
        t = doc["totals"]
        for key, value in (("before", t["before"]["total_bytes"]), ("after", t["after"]["total_bytes"]),
                           ("saved", t["saved_bytes"])):
            cell = self.page.locator(f"#total-{key}")
            assert int(cell.get_attribute("data-bytes")) == value
            assert cell.inner_text().startswith(present.human_bytes(value))
        assert self.page.locator("#model-sha256").inner_text() == doc["model"]["sha256"]

    def check_hover(self, doc: dict, k: int = 0) -> None:
        """Hovering fused bar ``k`` names every node of one fusion of ``doc``."""
        text = self.hover_fused_bar(k)
        assert "fused group" in text
        assert any(all(rh._short(present.label(n)) in text for n in f["replaced"]) for f in doc["fusions"]), text


def test_browser_sample_report(browser, tmp_path):
    sample = SAMPLES / "conv_hardsigmoid.onnx"
    doc = analysed(sample, target="cpu")
    path = tmp_path / "r.html"
    path.write_text(rh.to_html(doc), encoding="utf-8")
    opened = Opened(browser, path)
    opened.check_page(doc)
    opened.check_hover(doc)
    opened.page.close()


def test_browser_tables_sort_and_page_prints(browser, tmp_path):
    path = tmp_path / "r.html"
    result = CliRunner().invoke(main, ["optimize", str(SAMPLES / "resnet_block.onnx"), str(tmp_path / "o.onnx"),
                                       "--target", "cpu", "--report", str(path)])
    assert result.exit_code == 0, result.output
    opened = Opened(browser, path)
    page = opened.page
    assert page.locator("#verification-status").inner_text() == "passed"

    def saved_column() -> list[int]:
        return [int(v) for v in page.locator("#fusions tbody td:nth-child(9)").evaluate_all(
            "cells => cells.map(c => c.dataset.value)")]

    button = page.locator("#fusions thead th:nth-child(9) button")
    button.click()
    assert saved_column() == sorted(saved_column())
    assert page.locator("#fusions thead th:nth-child(9)").get_attribute("aria-sort") == "ascending"
    button.click()
    assert saved_column() == sorted(saved_column(), reverse=True)
    page.emulate_media(media="print")
    assert page.locator("#traffic-chart .rangeslider-container").evaluate("e => getComputedStyle(e).display") == "none"
    assert page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth")
    assert not opened.errors
    page.close()


def test_browser_symbolic_report_shows_expressions(browser, tmp_path):
    # "batch", not "N": onnxfuse never names a symbol N (symbolic._RESERVED: sympy reads N as a function), and the
    # nodes left unfused at the default level (Add, Relu) send their expressions through sympy.
    doc = without_numbers(analysed(SAMPLES / "resnet_block.onnx"), symbol="batch")
    path = tmp_path / "r.html"
    path.write_text(rh.to_html(doc), encoding="utf-8")
    opened = Opened(browser, path)
    assert not opened.errors and opened.requests == [opened.url]
    bars = opened.bars_per_trace()
    assert bars[rh.TRACE_BEFORE] == expected_layers(doc) and bars[rh.TRACE_FUSED] == len(doc["fusions"])
    text = opened.hover_fused_bar(0)
    assert "fused group" in text and "*batch" in text
    page = opened.page
    assert page.locator("#total-saved").inner_text() == doc["totals"]["saved_bytes_expr"] + " B"
    assert "the chart draws every layer at" in page.locator("#totals-section").inner_text()  # representative sizes
    page.close()


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("report-screenshots")
    print(f"\nscreenshots of the HTML reports: {folder}")
    return folder


@pytest.mark.requires_shared_models
@pytest.mark.parametrize("name", sorted(SHARED_SHAPES))
def test_browser_shared_model_report(name, browser, screenshots, tmp_path):
    doc = analysed(shared_model(name), target="cpu", shapes=SHARED_SHAPES[name])
    page_html = rh.to_html(doc)
    size = len(page_html.encode("utf-8"))
    assert size < MAX_PAGE_BYTES, f"{name}: the page is {size} bytes"
    path = tmp_path / f"{name}.html"
    path.write_text(page_html, encoding="utf-8")
    opened = Opened(browser, path)
    opened.check_page(doc)
    if doc["fusions"]:
        opened.check_hover(doc, k=len(doc["fusions"]) // 2)
    opened.page.screenshot(path=str(screenshots / f"{name}.png"), full_page=True)
    opened.page.close()


@pytest.mark.requires_shared_models
def test_browser_shared_model_without_input_shapes(browser, tmp_path):
    """A real model with symbolic dims and no --input-shape: every byte count is an expression (schema 2)."""
    doc = analysed(shared_model("rapidocr_det_ppocrv4"), target="cpu")
    assert doc["symbols"] and doc["totals"]["saved_bytes"] is None and doc["totals"]["saved_bytes_expr"]
    page_html = rh.to_html(doc)
    assert len(page_html.encode("utf-8")) < MAX_PAGE_BYTES
    path = tmp_path / "symbolic.html"
    path.write_text(page_html, encoding="utf-8")
    opened = Opened(browser, path)
    assert not opened.errors and opened.requests == [opened.url]
    bars = opened.bars_per_trace()
    assert bars[rh.TRACE_BEFORE] == expected_layers(doc) and bars[rh.TRACE_FUSED] == len(doc["fusions"])
    text = opened.hover_fused_bar(len(doc["fusions"]) // 2)
    assert "fused group" in text  # and the bytes as an expression in the model's dims (leading terms when long):
    # the dims by the one name every view gives them (present.display_names: x[0] for p2o_DynamicDimension_0)
    assert any(name in text for name in present.display_names(doc).values()), text
    assert not any(symbol in text for symbol in doc["symbols"]), text
    saved = opened.page.locator("#total-saved").inner_text()
    assert saved.startswith("~") and "unknown" not in saved
    opened.page.close()


@pytest.mark.requires_shared_models
@pytest.mark.parametrize("width", [800, 1400])
def test_browser_dynamic_export_without_input_shapes_is_drawn_and_fits(browser, tmp_path, width):
    """The natural command for an export with dynamic dims (``report -o r.html``, no --input-shape): the chart
    draws every layer at the stated representative sizes (bars of non-zero height), the page says which, and at
    800 px as at 1400 px nothing but the tables' own scroll boxes is wider than the window; no absolute path of
    this machine is in the page."""
    model = shared_model("rapidocr_det_ppocrv4")
    out = tmp_path / "r.html"
    result = CliRunner().invoke(main, ["report", str(model), "--target", "cpu", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "the HTML report's chart draws each layer at" in result.output
    page_html = out.read_text(encoding="utf-8")
    assert str(model.parent) not in page_html and f">{model.name}<" in page_html
    page = browser.new_page(viewport={"width": width, "height": 900})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(out.resolve().as_uri())
    page.wait_for_selector("body[data-charts-ready=true]", timeout=30_000)
    heights = page.evaluate("""() => Array.from(document.querySelectorAll(
        '#traffic-chart .cartesianlayer .barlayer .trace .point path')).map(p => p.getBoundingClientRect().height)""")
    assert heights and sum(h > 0.5 for h in heights) > len(heights) // 2, heights[:20]
    assert "representative sizes" in page.locator("#chart-sizes").inner_text()
    assert page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth")
    assert not errors
    page.close()
