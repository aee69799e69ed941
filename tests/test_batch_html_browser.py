"""The batch index page (``OUTDIR/index.html``) in a real browser, as the per-model page is tested
(``tests/test_report_html_browser.py``: Debian's Chromium driven by Playwright, skipped without them unless ``CI``
is set): no console error, no request but the page itself, one row per model equal to ``summary.json``, links
to reports that exist, columns that sort.
"""

from __future__ import annotations

import json

from click.testing import CliRunner

from onnxfuse import batch as b
from onnxfuse.cli.main import main
from tests.conftest import REPO
from tests.test_report_html_browser import browser  # noqa: F401 - the module's browser fixture, shared

SAMPLES = REPO / "sample_models"


def test_batch_index_page_rows_equal_the_summary_and_sort(browser, tmp_path):  # noqa: F811 - the fixture
    zoo = tmp_path / "zoo"
    zoo.mkdir()
    for name in ("conv_relu", "mlp_head", "resnet_block", "conv_tanh"):
        (zoo / f"{name}.onnx").write_bytes((SAMPLES / f"{name}.onnx").read_bytes())
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["batch", str(zoo), "-o", str(out), "-j", "2"],
                                env={b.TEST_HOOK_ENV: json.dumps({"conv_tanh.onnx": "crash"})})
    assert result.exit_code == 2, result.output
    summary = json.loads((out / "summary.json").read_text())

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors, requests = [], []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: requests.append(r.url))
    url = (out / "index.html").resolve().as_uri()
    page.goto(url)
    embedded = json.loads(page.locator("#onnxfuse-batch-summary").text_content())
    assert embedded == summary

    def rows() -> list[dict]:
        return page.evaluate("""() => Array.from(document.querySelectorAll('#models tbody tr')).map(tr => ({
            name: tr.dataset.name, status: tr.cells[1].textContent,
            nums: Array.from(tr.querySelectorAll('td.num')).map(td => td.dataset.v),
            link: tr.querySelector('a') ? tr.querySelector('a').getAttribute('href') : null,
            verification: tr.cells[2].textContent, text: tr.cells[8].textContent}))""")

    shown = rows()
    assert [r["name"] for r in shown] == [m["name"] for m in summary["models"]]
    for row, model in zip(shown, summary["models"], strict=True):
        assert row["status"] == model["status"]
        assert row["verification"] == (model["verification"] or "-")
        keys = ("fusions", "saved_bytes_beyond", "saved_bytes", "time_s", "peak_memory_bytes")
        assert [float(v) if v else None for v in row["nums"]] == [model[k] for k in keys]
        assert row["link"] == (f"./{model['report_html']}" if model["report_html"] else None)
        if model["status"] == "ok":
            assert (out / row["link"]).is_file()
        else:
            assert row["text"] == model["reason"] and "exited with status 3" in row["text"]

    heading = page.locator("#models thead th:nth-child(6)")  # saved vs graph
    heading.click()
    values = [float(r["nums"][2]) if r["nums"][2] else float("-inf") for r in rows()]
    assert values == sorted(values) and heading.get_attribute("aria-sort") == "ascending"
    heading.click()
    values = [float(r["nums"][2]) if r["nums"][2] else float("-inf") for r in rows()]
    assert values == sorted(values, reverse=True) and heading.get_attribute("aria-sort") == "descending"
    page.locator("#models thead th:nth-child(1)").click()
    assert [r["name"] for r in rows()] == sorted(m["name"] for m in summary["models"])
    assert not errors, errors
    assert requests == [url]
    page.close()
