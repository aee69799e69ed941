"""``onnxfuse bench`` runs on a sample model with a small N and produces the JSON fields it documents; the
verdict logic, the shape warning, the refused options and "nothing was fused" are checked on tiny models
(behaviour only: no test asserts a timing)."""

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from onnxfuse.bench import compare
from onnxfuse.cli import main
from tests.builders import GraphBuilder
from tests.conftest import REPO


def test_bench_json_fields():
    sample = str(REPO / "sample_models" / "resnet_block.onnx")
    result = CliRunner().invoke(main, ["bench", sample, "--runs", "3", "--warmup", "1", "--format", "json",
                                       "--target", "cpu"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [lv["level"] for lv in data["levels"]] == ["disable", "basic", "extended", "all"]
    assert data["input_shapes"] == {"x": [1, 8, 16, 16]} and data["invented_shapes"] == []
    for lv in data["levels"]:
        for side in ("original", "control", "optimized"):
            s = lv[side]
            assert s["median_ms"] > 0 and s["p25_ms"] <= s["median_ms"] <= s["p75_ms"]
            assert s["session_ms"] > 0 and s["nodes_after_ort"] >= 1
        assert lv["control"]["nodes_after_ort"] == lv["original"]["nodes_after_ort"]
        assert lv["ratio"] > 0 and lv["control_ratio"] > 0 and lv["noise"] >= abs(lv["control_ratio"] - 1)
        assert lv["verdict"] in ("faster", "same", "slower") and lv["within_noise"] == (lv["verdict"] == "same")
        assert lv["optimized_for_ort_level"] == lv["level"]  # in memory: one model per level's sessions
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


# --------------------------------------------------------------------------------------------------------------
# The verdict: a difference is called only beyond the same-run control


def test_verdict_uses_the_control():
    rng = np.random.default_rng(0)
    base = 1.0 + 0.01 * rng.standard_normal(30)
    steady = base * (1.0 + 0.001 * rng.standard_normal(30))
    assert compare(base, steady, base * 0.80)["verdict"] == "faster"
    assert compare(base, steady, base * 1.20)["verdict"] == "slower"
    same = compare(base, steady, base * 1.002 * (1.0 + 0.02 * rng.standard_normal(30)))
    assert same["verdict"] == "same" and same["noise"] >= abs(same["control"] - 1)
    # The same 5% loss is not called when the original timed against itself is 10% off.
    noisy = compare(base, base * 1.10, base * 1.05)
    assert noisy["control"] == pytest.approx(1.10) and noisy["verdict"] == "same"


def test_verdict_pairs_runs_of_one_round():
    # Load that slows whole rounds 3x (all three sessions alike) does not hide a steady 10% loss.
    load = np.where(np.arange(30) % 2 == 0, 1.0, 3.0)
    assert compare(load, load, load * 1.10)["verdict"] == "slower"


# --------------------------------------------------------------------------------------------------------------
# Issue 12's rough edges


def _symbolic_model(tmp_path, name="m.onnx"):
    b = GraphBuilder()
    x = b.input("x", ["N", 4, "H", "W"])
    path = tmp_path / name
    onnx.save(b.build(b.op("Relu", [b.conv(x, 4, 4)])), str(path))
    return path


def test_bench_prints_shapes_and_warns_when_it_invents_them(tmp_path):
    path = str(_symbolic_model(tmp_path))
    result = CliRunner().invoke(main, ["bench", path, "--runs", "1", "--warmup", "0", "--level", "disable"])
    assert result.exit_code == 0, result.output
    assert "input shapes: x=1x4x32x32 (invented for x" in result.stdout
    assert "warning: no shape given for x" in result.stderr and "--input-shape" in result.stderr
    given = CliRunner().invoke(main, ["bench", path, "--runs", "1", "--warmup", "0", "--level", "disable",
                                      "--input-shape", "x=1x4x8x8"])
    assert given.exit_code == 0, given.output
    assert "input shapes: x=1x4x8x8\n" in given.stdout and "warning" not in given.stderr


@pytest.mark.parametrize("option", [["--target", "cpu"], ["--only", "conv_activation"], ["--ort-level", "basic"],
                                    ["--skip", "conv_residual"], ["--constant-initializer-inputs"]])
def test_bench_refuses_optimization_options_when_optimized_is_given(tmp_path, option):
    sample = str(REPO / "sample_models" / "conv_relu.onnx")
    result = CliRunner().invoke(main, ["bench", sample, sample, "--runs", "1", *option])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {option[0]} only shapes the in-memory optimization")
    assert result.stdout == ""


def test_bench_says_nothing_was_fused(tmp_path):
    b = GraphBuilder()
    path = tmp_path / "relu.onnx"
    onnx.save(b.build(b.op("Relu", [b.input("x", [1, 4, 8, 8])])), str(path))
    result = CliRunner().invoke(main, ["bench", str(path), "--runs", "1"])
    assert result.exit_code == 0, result.output
    assert "nothing was fused" in result.stderr and result.stdout == ""
    same = CliRunner().invoke(main, ["bench", str(path), str(path), "--runs", "1"])
    assert same.exit_code == 0 and "nothing was fused" in same.stderr


def test_bench_in_memory_follows_ort_level(tmp_path):
    # Conv -> Add(x): FusedConv(Z) is not emitted for ORT_ENABLE_ALL sessions (providers.CPU_SLOWER_AT), so the
    # model timed at "all" is the original and at "disable" the fused one; --ort-level fixes one model for all.
    b = GraphBuilder()
    x = b.input("x", [1, 4, 8, 8])
    path = tmp_path / "res.onnx"
    onnx.save(b.build(b.op("Add", [b.conv(x, 4, 4), x])), str(path))
    args = ["bench", str(path), "--runs", "1", "--warmup", "0", "--target", "cpu", "--format", "json"]
    data = json.loads(CliRunner().invoke(main, [*args, "--level", "disable", "--level", "all"]).stdout)
    nodes = {lv["level"]: (lv["original"]["nodes_after_ort"], lv["optimized"]["nodes_after_ort"])
             for lv in data["levels"]}
    assert nodes["disable"] == (2, 1)
    assert [lv["optimized_for_ort_level"] for lv in data["levels"]] == ["disable", "all"]
    only_all = CliRunner().invoke(main, [*args, "--level", "all", "--ort-level", "all"])
    assert only_all.exit_code == 0 and "nothing was fused" in only_all.stderr
