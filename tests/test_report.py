"""Report contents and renderers: every JSON report validates against onnxfuse/report.schema.json, totals are
the sums of the per-node rows, and the text renderer matches a golden file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from onnxfuse import pipeline
from onnxfuse import report as rep
from onnxfuse.cli import main
from tests.conftest import REPO

SCHEMA = json.loads((REPO / "onnxfuse" / "report.schema.json").read_text())
GOLDEN = REPO / "tests" / "golden"


def validate(doc: dict) -> None:
    jsonschema.validate(doc, SCHEMA, cls=jsonschema.Draft202012Validator)


def sample_report(name: str, monkeypatch, target: str = "cpu") -> rep.Report:
    monkeypatch.chdir(REPO)
    return pipeline.analyse(Path("sample_models") / name, pipeline.Options(target=target)).report


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "sample_models").glob("*.onnx")))
@pytest.mark.parametrize("target", ["cpu", "cpu+cuda", "onnx"])
def test_json_report_validates_and_totals_are_sums(name, target, monkeypatch):
    doc = json.loads(rep.to_json(sample_report(name, monkeypatch, target)))
    validate(doc)
    assert doc["schema_version"] == 1
    for side in ("before", "after"):
        rows = doc["nodes"][side]
        assert doc["totals"][side]["read_bytes"] == sum(r["read_bytes"] or 0 for r in rows)
        assert doc["totals"][side]["written_bytes"] == sum(r["written_bytes"] or 0 for r in rows)
        assert doc["totals"][side]["nodes"] == len(rows)
    fused = sum(f["saved_bytes"] or 0 for f in doc["fusions"])  # None: unknown size
    if any(p.get("removed_nodes") for p in doc["pass_stats"]):
        # canonicalization deleted nodes too (their bytes are in pass_stats, not in a fusion row)
        assert doc["totals"]["saved_bytes"] >= fused
    else:
        assert doc["totals"]["saved_bytes"] == fused


def test_minimum_fields_tools_rely_on(monkeypatch):
    doc = json.loads(rep.to_json(sample_report("resnet_block.onnx", monkeypatch)))
    assert len(doc["model"]["sha256"]) == 64 and doc["target"] == "cpu"
    assert doc["totals"]["before"]["total_bytes"] > doc["totals"]["after"]["total_bytes"]
    assert {"node", "replaced", "activation", "saved_bytes"} <= set(doc["fusions"][0])
    assert doc["verification"]["status"] == "skipped" and doc["unknown_shapes"] == []
    doc = json.loads(rep.to_json(sample_report("refuse_two_consumers.onnx", monkeypatch)))
    assert {"nodes", "reason", "bytes"} <= set(doc["unfused"][0])
    assert doc["unfused"][0]["reason"] == "intermediate-has-other-consumers"


def test_text_report_matches_golden(monkeypatch):
    text = rep.to_text(sample_report("resnet_block.onnx", monkeypatch))
    golden = GOLDEN / "resnet_block.txt"
    if os.environ.get("ONNXFUSE_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text()


def test_markdown_report(monkeypatch):
    md = rep.to_markdown(sample_report("resnet_block.onnx", monkeypatch))
    assert md.startswith("### onnxfuse memory-traffic report")
    assert "| before |" in md and "#### Fusions applied (2)" in md and "\x1b[" not in md


def test_human_bytes():
    assert rep.human_bytes(512) == "512 B"
    assert rep.human_bytes(2048) == "2.0 KiB"
    assert rep.human_bytes(3 * 1024**3) == "3.0 GiB"
    assert rep.human_bytes(None) == "?"


def test_bandwidth_estimate_is_labelled(monkeypatch):
    report = sample_report("resnet_block.onnx", monkeypatch)
    report.set_bandwidth(100.0)
    before = report.totals["before"]["total_bytes"]
    assert report.bandwidth["before_ms"] == pytest.approx(before / 100e9 * 1e3)
    assert "an estimate" in rep.to_text(report)
    validate(report.to_dict())


def test_cli_report_formats_and_output_file(tmp_path):
    runner = CliRunner()
    sample = str(REPO / "sample_models" / "resnet_block.onnx")
    result = runner.invoke(main, ["report", sample, "--format", "json"])
    assert result.exit_code == 0
    validate(json.loads(result.output))
    out = tmp_path / "r.md"
    result = runner.invoke(main, ["report", sample, "--format", "markdown", "-o", str(out)])
    assert result.exit_code == 0 and out.read_text().startswith("### onnxfuse")
    result = runner.invoke(main, ["report", sample])
    assert "Totals" in result.output and "\x1b[" not in result.output


def test_optimize_writes_report_by_extension_with_verification(tmp_path):
    sample = str(REPO / "sample_models" / "resnet_block.onnx")
    rj = tmp_path / "r.json"
    result = CliRunner().invoke(main, ["optimize", sample, str(tmp_path / "o.onnx"), "--report", str(rj),
                                       "--target", "cpu"])
    assert result.exit_code == 0, result.output
    doc = json.loads(rj.read_text())
    validate(doc)
    assert doc["verification"]["status"] == "passed"
    assert doc["verification"]["outputs"][0]["max_abs_error"] <= 1e-4
    result = CliRunner().invoke(main, ["optimize", sample, str(tmp_path / "o2.onnx"), "--report",
                                       str(tmp_path / "r.weird")])
    assert result.exit_code == 2 and "--report-format" in result.output
