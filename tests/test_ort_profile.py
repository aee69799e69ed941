"""onnxruntime's profiler read back per kernel, per op and per fusion (onnxfuse/ort/profile.py)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from onnxfuse import pipeline
from onnxfuse.ort import profile as ort_profile
from tests.builders import GraphBuilder


def _event(node: str, op: str, dur_us: float, out: int, act: int, param: int) -> dict:
    return {"cat": "Node", "name": f"{node}_kernel_time", "dur": dur_us,
            "args": {"op_name": op, "provider": "CPUExecutionProvider", "output_size": str(out),
                     "activation_size": str(act), "parameter_size": str(param)}}


def test_summarize_takes_the_median_time_and_the_recorded_bytes():
    trace = [{"cat": "Session", "name": "model_run", "dur": 99}]
    for dur in (10, 30, 20):  # three runs of two kernels
        trace += [_event("conv", "FusedConv", dur, 400, 100, 36), _event("add", "Add", 5, 400, 800, 0),
                  {"cat": "Node", "name": "conv_fence_before", "dur": 1}]
    kernels = ort_profile.summarize(trace)
    assert [(k.node, k.op, k.ms, k.runs) for k in kernels] == [("conv", "FusedConv", 0.02, 3), ("add", "Add", 0.005, 3)]
    assert kernels[0].total_bytes == 536 and kernels[0].to_dict()["total_bytes"] == 536
    ops = ort_profile.by_op(kernels)
    assert list(ops) == ["FusedConv", "Add"] and ops["Add"] == {"kernels": 1, "ms": 0.005, "output_bytes": 400,
                                                                "activation_bytes": 800, "parameter_bytes": 0}


@pytest.fixture
def model_path(tmp_path):
    b = GraphBuilder()
    x = b.input("x", [1, 3, 16, 16])
    path = tmp_path / "m.onnx"
    onnx.save(b.build(b.op("Relu", [b.bn(b.conv(x, 3, 8), 8)])), str(path))
    return path


@pytest.mark.parametrize("level", ["disable", "all"])
def test_profile_finds_the_kernel_of_each_fusion(model_path, level):
    """The optimized model (one FusedConv) profiled in onnxruntime: one row per fusion, found by the tensor the
    kernel writes (at ``all`` through onnxruntime's NCHWc reorder), with its time and bytes."""
    result = pipeline.analyse(model_path, pipeline.Options(target="cpu", compare_with_onnxruntime=False))
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)}
    kernels = ort_profile.profile(result.model.SerializeToString(), feeds, level=level, runs=3, warmup=1)
    assert all(k.runs == 3 and k.ms >= 0 for k in kernels)
    assert sum(k.output_bytes for k in kernels) >= 8 * 16 * 16 * 4  # at least the output is written
    [row] = ort_profile.by_fusion(kernels, result.report.to_dict()["fusions"])
    assert row["kernel"] is not None and row["kernel_op"] in ("FusedConv", "Conv")
    assert row["replaced"] == "Conv -> BatchNormalization -> Relu" and row["total_bytes"] > 0


def test_report_profile_puts_measured_beside_counted_in_every_format(tmp_path):
    """report --profile: the profile section in JSON (valid against the schema), a line in the text and the
    'Measured in onnxruntime' panel with its bars in the HTML page."""
    import json

    import jsonschema
    from click.testing import CliRunner

    from onnxfuse.cli.main import main
    from tests.conftest import REPO

    sample = str(REPO / "sample_models" / "resnet_block.onnx")
    result = CliRunner().invoke(main, ["report", sample, "--target", "cpu", "--ort-level", "disable", "--profile",
                                       "-o", str(tmp_path / "r.json"), "-o", str(tmp_path / "r.html"),
                                       "-o", str(tmp_path / "r.txt")])
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "r.json").read_text())
    schema = json.loads((REPO / "onnxfuse" / "report.schema.json").read_text())
    jsonschema.validate(doc, schema, cls=jsonschema.Draft202012Validator)
    prof = doc["profile"]
    assert prof["level"] == "disable" and prof["original"]["kernels"] == 7 and prof["optimized"]["kernels"] == 2
    assert prof["original"]["total_bytes"] > prof["optimized"]["total_bytes"] > 0
    assert {f["kernel_op"] for f in prof["by_fusion"]} == {"FusedConv"}
    html = (tmp_path / "r.html").read_text()
    assert '<section id="profile-ops-section">' in html and html.count('class="mbar ') >= 2
    text = " ".join((tmp_path / "r.txt").read_text().split())
    assert "measured by onnxruntime's profiler at level disable" in text
    # the latency is bench's paired rounds, with its interval and verdict (the profiler's sums carry neither)
    t = prof["timing"]
    assert t["rounds"] >= 1 and t["ci_low"] <= t["ratio"] <= t["ci_high"] and t["same_kernels"] is False
    assert t["optimized_ms"] == pytest.approx(t["original_ms"] * t["ratio"], rel=1e-9)
    assert f"latency at level disable (onnxfuse bench's paired rounds, {t['rounds']} rounds)" in text
    assert f": {t['verdict']}" in text and "interval" in text and 'id="profile-timing"' in html


def test_report_profile_says_inconclusive_where_bench_would(monkeypatch, tmp_path):
    """Rounds whose interval straddles 1: the report's latency line says inconclusive with the interval, not a
    bare 7.0 -> 12.0 ms (bench's measure is replaced by one that returns such rounds)."""
    from click.testing import CliRunner

    from onnxfuse import bench
    from onnxfuse.cli.main import main
    from tests.conftest import REPO

    rounds = bench.compare([1.0, 1.0, 1.0, 1.0], [0.6, 1.7, 1.8, 1.7])  # too few rounds for an interval
    assert rounds["verdict"] == "inconclusive"
    monkeypatch.setattr(bench, "measure", lambda *a, **k: {**rounds, "stopped": "budget"})
    sample = str(REPO / "sample_models" / "resnet_block.onnx")
    result = CliRunner().invoke(main, ["report", sample, "--target", "cpu", "--ort-level", "disable", "--profile"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "ratio 1.7 (" in text and "): inconclusive (the interval is not all within or all outside 1 +-2%)" in text
