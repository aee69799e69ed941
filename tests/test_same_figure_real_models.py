"""The figure every view leads with is one number (issue 30, "Done when" 2 and 3), on every shared model
(``../shared/models`` or ``ONNXFUSE_MODELS_DIR``; skipped without them, like the other real-model tests): the
bytes saved beyond what onnxruntime makes itself at load, as the first figure of ``onnxfuse optimize``'s summary,
the HTML report's headline and totals row, the Markdown report, the JSON report, the API's documented
``Report.saved_bytes_beyond_onnxruntime`` and the model's ``onnxfuse batch`` row (summary.json, summary.md).

The models run without ``--input-shape``, so their symbolic dims are at the stated representative sizes, as a
user trying them first would run them; at ``--target cpu`` (fusions beyond onnxruntime on some) and the default
``cpu+cuda`` (where nothing is fused on some: a true 0 B, never "unknown"). One command run per model and target,
one batch run per target (module-scoped fixtures); the API's figure is read from the ``Report`` of the command's
own run (the one ``onnxfuse.optimize`` returns for the same options, tests/test_options_record.py; one real API
call checks that on the first model). Verified runs, since the comparison with onnxruntime is what
``--no-verify`` leaves out (a ``--no-verify`` batch is checked for its totals and statuses instead).
"""

from __future__ import annotations

import html as html_mod
import json
import re
import shutil

import pytest
from click.testing import CliRunner

import onnxfuse
from onnxfuse.cli.main import main
from onnxfuse.report import present
from tests.conftest import MODELS_DIR
from tests.test_real_models import INPUT_SHAPES

pytestmark = pytest.mark.requires_shared_models

MODELS = sorted(INPUT_SHAPES)
TARGETS = ("cpu", "cpu+cuda")
#: A byte figure as the reports print it (``present.human_bytes``).
FIGURE = re.compile(r"-?\d+(?:\.\d+)? (?:B|KiB|MiB|GiB|TiB)\b")


def _first_figure(line: str) -> str:
    """The first byte figure of a summary's first line; "0 B" where it says that nothing is saved beyond
    onnxruntime in words (onnxruntime makes every fusion itself)."""
    assert line.startswith("vs onnxruntime "), line
    if line.endswith("nothing is saved beyond it"):
        return present.human_bytes(0)
    found = FIGURE.search(line)
    assert found, line
    return found.group(0)


@pytest.fixture(scope="module")
def command_runs(tmp_path_factory):
    """(model, target) -> the command's stdout, its JSON, Markdown and HTML reports and the ``Report`` object the
    run made (what ``onnxfuse.optimize`` returns for the same options: both build them with
    ``pipeline.make_options`` and call ``pipeline.optimize``, tests/test_options_record.py): one run each."""
    from onnxfuse import pipeline

    out = {}
    folder = tmp_path_factory.mktemp("runs")
    made: list = []
    real = pipeline.optimize

    def keep(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pipeline, "optimize", keep)
        for target in TARGETS:
            for name in MODELS:
                stem = folder / f"{name}.{target}"
                paths = {fmt: stem.with_suffix(f".{fmt}") for fmt in ("json", "md", "html")}
                result = CliRunner().invoke(main, ["optimize", str(MODELS_DIR / f"{name}.onnx"),
                                                   str(stem) + ".onnx", "--target", target,
                                                   *(a for p in paths.values() for a in ("--report", str(p)))])
                assert result.exit_code == 0, result.output
                out[name, target] = {"stdout": result.stdout, "report": made.pop().report,
                                     **{fmt: p.read_text() for fmt, p in paths.items()}}
    return out


@pytest.fixture(scope="module")
def batch_rows(tmp_path_factory):
    """target -> model name -> its row of one ``onnxfuse batch -j 1`` run over a copy of the shared models."""
    zoo = tmp_path_factory.mktemp("zoo")
    for name in MODELS:
        shutil.copy(MODELS_DIR / f"{name}.onnx", zoo)
    rows = {}
    for target in TARGETS:
        out = tmp_path_factory.mktemp(f"batch-{target}")
        result = CliRunner().invoke(main, ["batch", str(zoo), "-o", str(out), "-j", "1", "--target", target])
        summary = json.loads((out / "summary.json").read_text())
        assert result.exit_code == 0, result.output
        rows[target] = ({r["name"]: r for r in summary["models"]}, (out / "summary.md").read_text())
    return rows


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", MODELS)
def test_every_view_of_a_shared_model_leads_with_the_same_figure(name, target, command_runs, batch_rows):
    run = command_runs[name, target]
    report = run["report"]
    figure = report.saved_bytes_beyond_onnxruntime  # the API's documented attribute
    assert figure is not None, "a verified run compares with onnxruntime: the figure is known"
    shown = present.human_bytes(figure)

    first = next(line for line in run["stdout"].splitlines() if line.startswith("vs "))
    assert run["stdout"].splitlines()[0] == first  # the summary's first line is this one
    assert _first_figure(first) == shown, first

    doc = json.loads(run["json"])
    assert present.saved_beyond_onnxruntime(doc) == figure
    assert doc["onnxruntime"]["status"] in ("compared", "unchanged")
    if not doc["fusions"]:  # nothing rewritten: 0 B beyond onnxruntime, stated as such, in the JSON too
        assert figure == 0 and doc["onnxruntime"]["saved_bytes_beyond"] == 0

    page = run["html"]
    [headline] = re.findall(r'<ul class="headline"><li>(.*?)</li>', page)
    assert html_mod.unescape(headline) == first
    [cell] = re.findall(r'id="total-saved-beyond" data-bytes="(-?\d+)"', page)
    assert int(cell) == figure

    md_first = next(p for p in run["md"].split("\n\n") if p.startswith("vs "))
    assert _first_figure(md_first) == shown and md_first.replace("\\", "") == first  # Markdown escapes x\[0\]

    rows, md = batch_rows[target]
    row = rows[name]
    assert row["status"] == "ok" and row["verification"] in ("passed", "unchanged"), row
    assert row["saved_bytes_beyond"] == figure, row
    assert row["saved_bytes"] == present.saved_vs_exported(doc)
    assert row["representative_sizes"] == report.figure_sizes  # said at the same sizes, by the same names
    [md_row] = [line for line in md.splitlines() if line.startswith(f"| `{name}` |")]
    assert f"| {shown} |" in md_row and "unknown" not in md_row


def test_the_api_gives_the_commands_figure(command_runs):
    """``onnxfuse.optimize`` itself, once: the figure of the command's run of the same model and options."""
    name = MODELS[0]
    report = onnxfuse.optimize(str(MODELS_DIR / f"{name}.onnx"), target="cpu").report
    assert report.saved_bytes_beyond_onnxruntime == command_runs[name, "cpu"]["report"].saved_bytes_beyond_onnxruntime
    assert report.to_dict()["fusions"] == command_runs[name, "cpu"]["report"].to_dict()["fusions"]


def test_a_no_verify_batch_of_the_shared_models_totals_at_stated_sizes_and_is_never_ok(tmp_path):
    """``batch --no-verify`` over a copy of the shared models: every row is unverified (as asked: exit 0, as
    ``optimize --no-verify``), the figure against
    the graph is non-zero at the representative sizes the summary states once, the one beyond onnxruntime is unknown
    where something was fused (no session was made), never 0 B, and a true 0 B where nothing was."""
    zoo = tmp_path / "zoo"
    zoo.mkdir()
    for name in MODELS:
        shutil.copy(MODELS_DIR / f"{name}.onnx", zoo)
    result = CliRunner().invoke(main, ["batch", str(zoo), "-o", str(tmp_path / "out"), "-j", "1", "--no-verify",
                                       "--target", "cpu"])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert {r["status"] for r in summary["models"]} == {"unverified"}
    assert summary["counts"]["ok"] == 0
    t = summary["totals"]
    assert t["saved_bytes"] and t["saved_bytes"] > 0 and t["unknown"]["saved_bytes"] == 0
    fused = [r for r in summary["models"] if r["fusions"]]
    assert fused and all(r["saved_bytes_beyond"] is None for r in fused)
    assert all(r["saved_bytes_beyond"] == 0 for r in summary["models"] if not r["fusions"])
    assert t["unknown"]["saved_bytes_beyond"] == len(fused)
    assert all(r["representative_sizes"] for r in summary["models"])  # every shared model has symbolic dims
    out = result.stdout
    assert out.count("representative sizes: batch 1, 224 for the other dims") == 1
    assert f"  {len(MODELS)} models unverified: not verified: --no-verify" in out  # said once, not per model
    beyond = re.search(r"saved beyond onnxruntime at the chosen level: ([^;]*);", out).group(1)
    assert beyond == "unknown" or f"{len(fused)} of {len(MODELS)} models unknown, not counted" in beyond
    md = (tmp_path / "out" / "summary.md").read_text()
    for r in fused:
        [row] = [line for line in md.splitlines() if line.startswith(f"| `{r['name']}` |")]
        assert "| unknown |" in row and "| 0 B |" not in row.split("|")[5]
