"""``onnxfuse bench``: the statistics run on a fake clock and fake models (no test asserts a timing); the command
runs on sample and tiny models with a small N for the JSON fields, same kernels, the shape warning, the refused
options and "nothing was fused"."""

import json
from collections import Counter

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from onnxfuse import bench as bench_mod
from onnxfuse.bench import CONFIDENCE, compare, kernels, look_confidence, measure, order_ranks
from onnxfuse.cli.main import main
from tests.builders import GraphBuilder
from tests.conftest import REPO

# --------------------------------------------------------------------------------------------------------------
# The statistics, on a fake machine: a clock that only the fake runs advance


class FakeMachine:
    """A clock in seconds and two fake models: a run of model ``side`` takes ``base[side]`` seconds times
    lognormal noise (sigma ``noise``), times 3 with probability ``spikes`` (a burst of load), times
    ``1 + drift * t`` (the machine slowing down as time goes on)."""

    def __init__(self, seed, a=1.0, b=1.0, noise=0.05, spikes=0.0, drift=0.0, uniform=None):
        self.t, self.rng = 0.0, np.random.default_rng(seed)
        self.base, self.noise, self.spikes, self.drift, self.uniform = {"a": a, "b": b}, noise, spikes, drift, uniform
        self.runs = []

    def clock(self):
        return self.t

    def runner(self, side):
        def run():
            if self.uniform is not None:
                d = self.base[side] * self.rng.uniform(1 - self.uniform, 1 + self.uniform)
            else:
                d = self.base[side] * np.exp(self.noise * self.rng.standard_normal())
            if self.rng.random() < self.spikes:
                d *= 3
            self.t += d * (1 + self.drift * self.t)
            self.runs.append(side)
        return run

    def measure(self, min_rounds, max_time, margin=0.02, **kw):
        return measure(self.runner("a"), self.runner("b"), min_rounds, max_time, margin, clock=self.clock, **kw)


@pytest.mark.parametrize(("noise", "spikes", "min_rounds", "max_time"),
                         [(0.02, 0.0, 16, 400.0), (0.1, 0.05, 16, 400.0), (0.3, 0.1, 16, 0.0), (0.3, 0.1, 1, 60.0)])
def test_identical_models_are_never_faster_or_slower(noise, spikes, min_rounds, max_time):
    verdicts = []
    for seed in range(300):
        r = FakeMachine(seed, noise=noise, spikes=spikes).measure(min_rounds, max_time)
        verdicts.append(r["verdict"])
        assert r["ci_low"] <= r["ratio"] <= r["ci_high"]
        assert r["optimized_ms"] / r["original_ms"] == pytest.approx(r["ratio"], rel=1e-12)
    assert "faster" not in verdicts and "slower" not in verdicts
    if noise == 0.02:
        assert verdicts.count("same") >= 285  # a quiet machine gets its answer (95% of the time or more)


@pytest.mark.parametrize(("b", "verdict"), [(1.10, "slower"), (0.90, "faster")])
def test_a_ten_percent_difference_is_called(b, verdict):
    for seed in range(50):
        r = FakeMachine(seed, b=b, noise=0.05, spikes=0.02).measure(16, 400.0)
        assert r["verdict"] == verdict and r["stopped"] == "decided"
        assert r["ci_low"] <= r["ratio"] <= r["ci_high"] and r["ci_low"] <= b <= r["ci_high"]
        assert r["optimized_ms"] / r["original_ms"] == pytest.approx(r["ratio"], rel=1e-12)


def test_high_noise_and_few_rounds_are_inconclusive():
    r = FakeMachine(0, b=1.10, noise=0.5).measure(16, 0.0)
    assert r["verdict"] == "inconclusive" and r["rounds"] == 16 and r["stopped"] == "budget"
    assert r["ci_low"] < 1.02 < r["ci_high"]
    # Too few rounds for an interval at that confidence: nothing is called, however clear the times look.
    confidence = r["confidence"]
    too_few = max(n for n in range(1, 40) if order_ranks(n, confidence) is None)
    few = FakeMachine(0, b=1.5, noise=0.0).measure(too_few, 0.0)
    assert few["verdict"] == "inconclusive" and few["ratio"] == pytest.approx(1.5)
    enough = FakeMachine(0, b=1.5, noise=0.0).measure(too_few + 1, 0.0)
    assert enough["verdict"] == "slower"


def test_the_budget_ends_the_rounds():
    # A ratio on the margin's edge never gets decided; each round takes 2.8 to 5.2 fake seconds.
    fake = FakeMachine(0, b=1.02, uniform=0.3)
    r = fake.measure(16, 300.0)
    assert r["verdict"] == "inconclusive" and r["stopped"] == "budget"
    assert 300.0 <= fake.t < 305.2 and r["rounds"] > 16
    assert fake.runs[:8] == ["a", "b", "b", "a"] * 2  # ABBA
    capped = FakeMachine(0, b=1.02, uniform=0.3).measure(16, 1e9, max_rounds=40)
    assert capped["stopped"] == "max_rounds" and capped["rounds"] == 40


def test_rounds_stop_at_the_minimum_when_asked():
    r = FakeMachine(0, b=1.02, uniform=0.3).measure(12, 1e9, stop_at_min=True)
    assert r["rounds"] == 12 and r["stopped"] == "min_rounds"


def test_abba_rounds_cancel_drift():
    # The machine slows 5% per fake second: in A-then-B rounds B would look ~5% slower.
    r = FakeMachine(0, noise=0.0, drift=0.05).measure(16, 0.0)
    assert r["ratio"] == pytest.approx(1.0, abs=0.005) and r["verdict"] == "same"


def test_each_look_is_stricter_so_all_looks_keep_the_family_confidence():
    one = look_confidence(16, 16)
    many = look_confidence(16, 1000)  # looks at 16, 32, ..., 512 and one at the budget's end
    assert 1 - one == pytest.approx((1 - CONFIDENCE) / 2) and 1 - many == pytest.approx((1 - CONFIDENCE) / 7)


def test_order_ranks_are_the_sign_test_interval():
    # n = 20 at 95%: P(Bin(20, 1/2) <= 5) = 0.0207 <= 0.025 < P(<= 6) = 0.0577, so [r_(6), r_(15)].
    assert order_ranks(20, 0.95) == 6
    assert order_ranks(5, 0.95) is None and order_ranks(6, 0.95) == 1  # 2 / 2^6 = 0.031 <= 0.05
    # Large n (2^n beyond a float): the normal approximation n/2 - 1.96 sqrt(n)/2 = 956.2 for n = 2000.
    assert abs(order_ranks(2000, 0.95) - 956) <= 1


def test_compare_columns_agree_with_the_ratio_and_resist_outliers():
    rng = np.random.default_rng(1)
    a = np.exp(0.2 * rng.standard_normal(41)) * 0.07
    b = a * 1.05 * np.exp(0.02 * rng.standard_normal(41))
    b[3] *= 10  # one round hit on one side only
    r = compare(a, b)
    assert r["optimized_ms"] / r["original_ms"] == pytest.approx(r["ratio"], rel=1e-12)
    assert r["original_ms"] == pytest.approx(np.median(a) * 1e3)
    assert r["optimized_median_ms"] == pytest.approx(np.median(b) * 1e3)
    assert r["ratio"] == pytest.approx(1.05, rel=0.01) and r["verdict"] == "slower"
    assert compare(a, b, margin=0.2)["verdict"] == "same"


def test_compare_refuses_bad_times():
    with pytest.raises(ValueError):
        compare([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        compare([1.0, 0.0], [1.0, 1.0])
    with pytest.raises(ValueError):
        compare([], [])


def test_kernels_ignore_names_and_weights_but_not_op_types(tmp_path):
    def model(name, op, prefix, seed=0):
        b = GraphBuilder(seed=seed, prefix=prefix)
        path = tmp_path / name
        x = b.input("x", [1, 4, 8, 8])
        onnx.save(b.build(b.op(op, [b.conv(x, 4, 4)])), str(path))
        return str(path)

    relu = kernels(model("a.onnx", "Relu", "p"))
    assert relu == Counter({("ai.onnx", "Conv", 3): 1, ("ai.onnx", "Relu", 1): 1})
    assert relu == kernels(model("b.onnx", "Relu", "q", seed=1))
    assert relu != kernels(model("c.onnx", "Sigmoid", "p"))


# --------------------------------------------------------------------------------------------------------------
# The command


def test_bench_json_fields():
    sample = str(REPO / "sample_models" / "resnet_block.onnx")
    result = CliRunner().invoke(main, ["bench", sample, "--runs", "3", "--max-time", "0", "--warmup", "1",
                                       "--format", "json", "--target", "cpu"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [lv["level"] for lv in data["levels"]] == ["disable", "basic", "extended", "all"]
    assert data["input_shapes"] == {"x": [1, 8, 16, 16]} and data["invented_shapes"] == []
    assert data["margin"] == 0.02 and data["confidence"] == CONFIDENCE and data["nothing_fused"] is False
    for lv in data["levels"]:
        for side in ("original", "optimized"):
            s = lv[side]
            assert s["ms"] > 0 and s["session_ms"] > 0 and s["nodes_after_ort"] >= 1
        assert lv["ci_low"] <= lv["ratio"] <= lv["ci_high"] and lv["rounds"] == 3 and lv["stopped"] != "decided"
        assert lv["optimized"]["ms"] / lv["original"]["ms"] == pytest.approx(lv["ratio"], rel=1e-9)
        assert lv["optimized"]["median_ms"] > 0 and CONFIDENCE < lv["ci_confidence"] < 1
        assert lv["interval_verdict"] == "inconclusive"  # 3 rounds: too few for an interval
        assert lv["verdict"] == ("same" if lv["same_kernels"] else "inconclusive")
        assert lv["optimized_for_ort_level"] == lv["level"]  # in memory: one model per level's sessions
    disabled = data["levels"][0]
    assert disabled["optimized"]["nodes_after_ort"] < disabled["original"]["nodes_after_ort"]
    assert disabled["same_kernels"] is False and disabled["kernels"] is None


def test_bench_a_model_against_itself_is_never_faster_or_slower(tmp_path):
    sample = str(REPO / "sample_models" / "conv_relu.onnx")
    result = CliRunner().invoke(main, ["bench", sample, sample, "--runs", "2", "--max-time", "0", "--warmup", "0",
                                       "--format", "json"])
    assert result.exit_code == 0, result.output
    assert "same graph as ORIGINAL" in result.stderr
    levels = {lv["level"]: lv for lv in json.loads(result.stdout)["levels"]}
    for lv in levels.values():
        assert lv["same_kernels"] is True and lv["verdict"] == "same" and lv["rounds"] == 2
        assert lv["kernels"] == lv["original"]["nodes_after_ort"] == lv["optimized"]["nodes_after_ort"] >= 1
        assert lv["optimized"]["ms"] / lv["original"]["ms"] == pytest.approx(lv["ratio"], rel=1e-9)
    text = CliRunner().invoke(main, ["bench", sample, sample, "--runs", "2", "--max-time", "0", "--level", "all"])
    assert text.exit_code == 0, text.output
    # how many kernels onnxruntime runs at `all` depends on the CPU (its NCHWc layout adds reorder nodes where the
    # instruction set has NCHWc kernels): the text says the count the JSON measured on this machine
    assert f"all: onnxruntime runs the same {levels['all']['kernels']} kernels for both files" in text.stdout
    row = next(line for line in text.stdout.splitlines() if line.strip().startswith("all "))
    assert "same kernels" in row and "faster" not in row and "slower" not in row


def test_bench_says_same_kernels_where_onnxruntime_fuses_it_too():
    # onnxruntime fuses Conv + Relu itself from "extended" on, not at "disable".
    sample = str(REPO / "sample_models" / "conv_relu.onnx")
    result = CliRunner().invoke(main, ["bench", sample, "--runs", "1", "--max-time", "0", "--warmup", "0",
                                       "--level", "disable", "--level", "extended", "--format", "json"])
    assert result.exit_code == 0, result.output
    same = {lv["level"]: lv["same_kernels"] for lv in json.loads(result.stdout)["levels"]}
    assert same == {"disable": False, "extended": True}


def test_bench_text_and_given_optimized(tmp_path):
    sample = str(REPO / "sample_models" / "conv_relu.onnx")
    out = tmp_path / "o.onnx"
    assert CliRunner().invoke(main, ["optimize", sample, str(out)]).exit_code == 0
    result = CliRunner().invoke(main, ["bench", sample, str(out), "--runs", "2", "--max-time", "0", "--level",
                                       "disable", "--margin", "5"])
    assert result.exit_code == 0, result.output
    assert "ratio" in result.stdout and "interval" in result.stdout and "inconclusive" in result.stdout
    assert "within 1 +-5%" in result.stdout
    assert "disable" in result.stdout and "extended" not in result.stdout
    bad = CliRunner().invoke(main, ["bench", str(tmp_path / "missing.onnx")])
    assert bad.exit_code == 2
    assert CliRunner().invoke(main, ["bench", sample, "--margin", "-1"]).exit_code == 2


def test_bench_that_cannot_run_is_a_one_line_error(tmp_path):
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


def test_bench_options_reach_the_rounds(monkeypatch):
    seen = {}

    def fake_bench(original, optimized, opts):
        seen.update(runs=opts.runs, max_time=opts.max_time, margin=opts.margin)
        raise RuntimeError("stop here")

    monkeypatch.setattr(bench_mod, "bench", fake_bench)
    sample = str(REPO / "sample_models" / "conv_relu.onnx")
    result = CliRunner().invoke(main, ["bench", sample, "--runs", "7", "--max-time", "1.5", "--margin", "3"])
    assert result.exit_code == 2 and "stop here" in result.stderr
    assert seen == {"runs": 7, "max_time": 1.5, "margin": pytest.approx(0.03)}


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
    args = ["bench", path, "--runs", "1", "--max-time", "0", "--warmup", "0", "--level", "disable"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "input shapes: x=1x4x224x224 (invented for x" in result.stdout  # the representative sizes
    assert "warning: no shape given for x" in result.stderr and "--input-shape" in result.stderr
    given = CliRunner().invoke(main, [*args, "--input-shape", "x=1x4x8x8"])
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
    as_json = CliRunner().invoke(main, ["bench", str(path), "--runs", "1", "--format", "json"])
    assert as_json.exit_code == 0 and "nothing was fused" in as_json.stderr
    assert json.loads(as_json.stdout) == {"original": str(path), "optimized": None, "nothing_fused": True,
                                          "levels": []}


def test_bench_in_memory_follows_ort_level(tmp_path):
    # Conv -> Add(x): FusedConv(Z) is not emitted for ORT_ENABLE_ALL sessions (providers.CPU_SLOWER_AT), so the
    # model timed at "all" is the original and at "disable" the fused one; --ort-level fixes one model for all.
    b = GraphBuilder()
    x = b.input("x", [1, 4, 8, 8])
    path = tmp_path / "res.onnx"
    onnx.save(b.build(b.op("Add", [b.conv(x, 4, 4), x])), str(path))
    args = ["bench", str(path), "--runs", "1", "--max-time", "0", "--warmup", "0", "--target", "cpu", "--format",
            "json"]
    data = json.loads(CliRunner().invoke(main, [*args, "--level", "disable", "--level", "all"]).stdout)
    nodes = {lv["level"]: (lv["original"]["nodes_after_ort"], lv["optimized"]["nodes_after_ort"])
             for lv in data["levels"]}
    assert nodes["disable"] == (2, 1)
    assert [lv["optimized_for_ort_level"] for lv in data["levels"]] == ["disable", "all"]
    only_all = CliRunner().invoke(main, [*args, "--level", "all", "--ort-level", "all"])
    assert only_all.exit_code == 0 and "nothing was fused" in only_all.stderr


def test_bench_profile_gives_per_kernel_time_and_bytes_for_both_models():
    """bench --profile (issue: measured, per kernel): both models under onnxruntime's profiler, per kernel, per op
    and per fusion, in JSON; the text names the kernel that computes each fusion."""
    sample = str(REPO / "sample_models" / "resnet_block.onnx")
    args = ["bench", sample, "--runs", "2", "--max-time", "0", "--warmup", "1", "--target", "cpu",
            "--level", "disable", "--profile"]
    result = CliRunner().invoke(main, [*args, "--format", "json"])
    assert result.exit_code == 0, result.output
    [level] = json.loads(result.stdout)["levels"]
    prof = level["profile"]
    for side in ("original", "optimized"):
        kernels = prof[side]["kernels"]
        assert kernels and all(k["ms"] >= 0 and k["total_bytes"] > 0 and k["runs"] == prof["runs"] for k in kernels)
        assert prof[side]["total_bytes"] == sum(k["total_bytes"] for k in kernels)
        assert sum(r["kernels"] for r in prof[side]["by_op"].values()) == len(kernels)
    assert set(prof["original"]["by_op"]) == {"Conv", "BatchNormalization", "Relu", "Add"}
    assert set(prof["optimized"]["by_op"]) == {"FusedConv"}
    assert len(prof["optimized"]["kernels"]) == level["optimized"]["nodes_after_ort"]
    assert {f["kernel_op"] for f in prof["by_fusion"]} == {"FusedConv"}
    text = CliRunner().invoke(main, args)
    assert text.exit_code == 0 and "per fusion at disable: the kernel that computes it" in text.output


def test_bench_with_optimized_refuses_materialize_weights_by_name(tmp_path):
    """bench with OPTIMIZED runs no optimization: each option that only shapes it is refused by name, read from
    the one declaration of those options (a new one cannot be forgotten)."""
    sample = str(REPO / "sample_models" / "conv_relu.onnx")
    result = CliRunner().invoke(main, ["bench", sample, sample, "--materialize-weights", "2"])
    assert result.exit_code == 2 and "--materialize-weights only shapes the in-memory optimization" in result.output
