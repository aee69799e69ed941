"""--ort-version: the onnxruntime release a model is for. onnxfuse emits only forms that release loads
(providers.FORM_MIN_ORT, from benchmarks/probe_ort_releases.py), and every written model names the oldest release
that loads it (metadata_props onnxfuse.min_onnxruntime, the report's deployment section, the summary)."""

from __future__ import annotations

import json

import onnx
import pytest
from click.testing import CliRunner

from onnxfuse import pipeline
from onnxfuse.cli.main import main
from onnxfuse.ort import providers
from onnxfuse.report import present
from tests.builders import GraphBuilder


def _model(activation: str) -> onnx.ModelProto:
    b = GraphBuilder()
    x = b.input("x", [1, 3, 8, 8])
    return b.build(b.op(activation, [b.conv(x, 3, 4)]))


@pytest.fixture
def paths(tmp_path):
    out = {}
    for act in ("HardSwish", "Relu"):
        out[act] = tmp_path / f"{act}.onnx"
        onnx.save(_model(act), str(out[act]))
    return out


def _metadata(path) -> dict:
    return {p.key: p.value for p in onnx.load(str(path)).metadata_props}


def test_release_data_matches_the_committed_probe_results():
    """providers.FORM_MIN_ORT is the probe's result: for each form the oldest probed release from which every
    newer probed release loads it and matches the unfused graph."""
    from pathlib import Path

    results = json.loads((Path(__file__).parent.parent / "benchmarks" / "results" / "ort_releases.json").read_text())
    releases = sorted((providers.parse_release(r["onnxruntime"]), r) for r in results)
    assert [r for r, _ in releases] == list(providers.PROBED_ORT_RELEASES)
    forms = {name.rsplit(" ", 1)[0] for _, r in releases for name in r["forms"]}
    for form in forms:
        ok = [release for release, r in releases
              if all(v["status"] == "ok" for k, v in r["forms"].items() if k.rsplit(" ", 1)[0] == form)]
        oldest = min(rel for rel in ok if all(o in ok for o in providers.PROBED_ORT_RELEASES if o >= rel))
        assert providers.form_min_release(form) == oldest, form


def test_every_written_model_names_its_minimum_release(paths, tmp_path):
    hardswish_min = providers.release_text(providers.FORM_MIN_ORT["FusedConv(HardSwish)"])
    oldest = providers.release_text(providers.PROBED_ORT_RELEASES[0])
    runner = CliRunner()
    for act, expected in (("HardSwish", hardswish_min), ("Relu", oldest)):
        out = tmp_path / f"{act}.fused.onnx"
        result = runner.invoke(main, ["optimize", str(paths[act]), str(out), "--target", "cpu"])
        assert result.exit_code == 0, result.output
        assert _metadata(out)["onnxfuse.min_onnxruntime"] == expected
        assert f"runs on: onnxruntime >= {expected}" in result.output


def test_an_older_ort_version_leaves_the_newer_form_unfused(paths, tmp_path):
    out = tmp_path / "o.onnx"
    result = CliRunner().invoke(main, ["optimize", str(paths["HardSwish"]), str(out), "--target", "cpu",
                                       "--ort-version", "1.20", "--report", str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.output
    ops = [n.op_type for n in onnx.load(str(out)).graph.node]
    assert ops == ["Conv", "HardSwish"]
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["deployment"]["ort_version"] == "1.20" and doc["deployment"]["forms"] == []
    assert [u["reason"] for u in doc["unfused"]] == ["form-needs-newer-onnxruntime"]
    assert "runs on: any onnxruntime that runs the original" in result.output


def test_the_report_lists_each_form_with_the_release_it_needs(paths):
    report = pipeline.analyse(paths["HardSwish"], pipeline.Options(target="cpu", compare_with_onnxruntime=False)
                              ).report
    d = report.to_dict()["deployment"]
    needed = providers.release_text(providers.FORM_MIN_ORT["FusedConv(HardSwish)"])
    assert d["forms"] == [{"form": "FusedConv(HardSwish)", "count": 1, "min_onnxruntime": needed}]
    assert d["min_onnxruntime"] == needed
    assert d["ort_version"] == providers.release_text(providers.parse_release(
        __import__("onnxfuse.ort.optimized_graph", fromlist=["x"]).installed_version()))
    line = present.deployment_line(report.to_dict())
    assert line == (f"runs on: onnxruntime >= {needed} (FusedConv(HardSwish) x1 needs {needed}; an older "
                    "--ort-version leaves it unfused)")


@pytest.mark.parametrize("value, message", [
    ("1.14", "onnxfuse knows which forms onnxruntime loads from 1.15"),
    ("latest", "is not a release number like 1.20"),
    ("1", "is not a release number like 1.20"),
])
def test_bad_ort_version_is_one_line_exit_2(paths, tmp_path, value, message):
    result = CliRunner().invoke(main, ["optimize", str(paths["Relu"]), str(tmp_path / "o.onnx"),
                                       "--ort-version", value])
    assert result.exit_code == 2 and message in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "o.onnx").exists()


def test_api_takes_ort_version(paths):
    import onnxfuse

    result = onnxfuse.optimize(str(paths["HardSwish"]), target="cpu", ort_version="1.20")
    assert [n.op_type for n in result.model.graph.node] == ["Conv", "HardSwish"]


def test_a_release_newer_than_the_probe_is_accepted_with_a_warning(paths):
    report = pipeline.analyse(paths["Relu"], pipeline.Options(target="cpu", ort_version="1.99",
                                                              compare_with_onnxruntime=False)).report
    assert report.to_dict()["deployment"]["ort_version"] == "1.99"
    assert any("newer than the newest release probed" in w for w in report.warnings)


def test_an_old_release_is_fine_for_target_onnx(paths, tmp_path):
    result = CliRunner().invoke(main, ["optimize", str(paths["Relu"]), str(tmp_path / "o.onnx"), "--target", "onnx",
                                       "--ort-version", "1.14"])
    assert result.exit_code == 0, result.output


def test_forms_already_in_the_input_above_ort_version_are_warned_about(paths, tmp_path):
    """A model that already holds FusedConv(HardSwish) stays so (onnxfuse does not unfuse): for --ort-version 1.20
    the warning says it needs a newer release, and the metadata says which."""
    fused = tmp_path / "fused.onnx"
    assert CliRunner().invoke(main, ["optimize", str(paths["HardSwish"]), str(fused), "--target", "cpu"]).exit_code == 0
    out = tmp_path / "again.onnx"
    result = CliRunner().invoke(main, ["optimize", str(fused), str(out), "--target", "cpu", "--ort-version", "1.20"])
    assert result.exit_code == 0, result.output
    needed = providers.release_text(providers.FORM_MIN_ORT["FusedConv(HardSwish)"])
    assert f"the model needs onnxruntime {needed} or newer for forms it already held" in result.output
    assert _metadata(out)["onnxfuse.min_onnxruntime"] == needed


def test_bench_refuses_ort_version_with_an_optimized_file(paths, tmp_path):
    result = CliRunner().invoke(main, ["bench", str(paths["Relu"]), str(paths["Relu"]), "--ort-version", "1.20"])
    assert result.exit_code == 2 and "--ort-version" in result.output
