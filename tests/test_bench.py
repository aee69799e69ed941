"""``onnxfuse bench`` runs on a sample model with a small N and produces the JSON fields it documents."""

import json

from click.testing import CliRunner

from onnxfuse.cli import main
from tests.conftest import REPO


def test_bench_json_fields():
    sample = str(REPO / "sample_models" / "resnet_block.onnx")
    result = CliRunner().invoke(main, ["bench", sample, "--runs", "3", "--warmup", "1", "--format", "json",
                                       "--target", "cpu"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [lv["level"] for lv in data["levels"]] == ["disable", "basic", "extended", "all"]
    for lv in data["levels"]:
        for side in ("original", "optimized"):
            s = lv[side]
            assert s["median_ms"] > 0 and s["p25_ms"] <= s["median_ms"] <= s["p75_ms"]
            assert s["session_ms"] > 0 and s["nodes_after_ort"] >= 1
        assert lv["ratio"] > 0 and isinstance(lv["within_noise"], bool)
    disabled = data["levels"][0]
    assert disabled["optimized"]["nodes_after_ort"] < disabled["original"]["nodes_after_ort"]


def test_bench_text_and_given_optimized(tmp_path):
    sample = str(REPO / "sample_models" / "conv_relu.onnx")
    out = tmp_path / "o.onnx"
    assert CliRunner().invoke(main, ["optimize", sample, str(out)]).exit_code == 0
    result = CliRunner().invoke(main, ["bench", sample, str(out), "--runs", "2", "--level", "disable"])
    assert result.exit_code == 0, result.output
    assert "ratio" in result.output and "disable" in result.output and "extended" not in result.output
    bad = CliRunner().invoke(main, ["bench", str(tmp_path / "missing.onnx")])
    assert bad.exit_code == 2


def test_bench_that_cannot_run_is_a_one_line_error(tmp_path):
    import numpy as np
    import onnx

    from tests.builders import GraphBuilder

    b = GraphBuilder()
    x = b.input("x", ["N", 4, 8, 8])
    shape = b.const(np.array([7, -1], dtype=np.int64))
    path = tmp_path / "m.onnx"
    onnx.save(b.build(b.op("Reshape", [b.op("Relu", [b.conv(x, 4, 4)]), shape])), str(path))
    result = CliRunner().invoke(main, ["bench", str(path), "--runs", "1", "--level", "disable"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: onnxruntime cannot run the original model")
    assert "give --input-shape for x" in lines[0]
