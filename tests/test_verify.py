"""Verification (issues 5 and 11): onnxruntime at ORT_DISABLE_ALL on both sides, the noise-floor rule (a correct
deep net passes, a wrong rewrite fails), NaN/inf and integer outputs exact, `onnxfuse verify` exit codes,
--input-value/--input-range, input sets, session count, and nothing run when nothing was rewritten."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from onnxfuse.cli.main import main
from onnxfuse.errors import InputError
from onnxfuse.ort import sessions as runtime
from onnxfuse.passes.conv_batchnorm import ConvBatchNorm
from onnxfuse.verification import floors, verify
from onnxfuse.verification import run as verify_run
from onnxfuse.verification.models import weights_moved_by_one_ulp
from onnxfuse.verification.options import DEFAULT_TIMEOUT_S, VerifyOptions, timeout_seconds
from onnxfuse.verification.rule import FLOOR_MULTIPLE, MIN_FLOOR_ULPS
from onnxfuse.verification.run import run_all
from tests.builders import GraphBuilder, subgraph
from tests.conftest import REPO

SAMPLE = REPO / "sample_models" / "resnet_block.onnx"


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def save(tmp_path, model, name="m.onnx"):
    path = tmp_path / name
    onnx.save(model, str(path))
    return path


def conv_model(bias_shift: float = 0.0, channel: int = 0, seed: int = 0) -> onnx.ModelProto:
    """x [1, 4, 8, 8] -> Conv 3x3 (bias + ``bias_shift`` on ``channel``) -> y: a candidate whose deviation from
    the unshifted model is ``bias_shift`` exactly (up to float32 rounding of the bias)."""
    b = GraphBuilder(seed=seed)
    x = b.input("x", [1, 4, 8, 8])
    bias = b.rand(4, scale=0.1)
    bias[channel] += bias_shift
    y = b.op("Conv", [x, b.const(b.rand(4, 4, 3, 3)), b.const(bias)], pads=[1, 1, 1, 1])
    return b.build(y)


def deep_net(blocks: int = 60, channels: int = 16, hw: int = 16, gain: float = 100.0, seed: int = 0):
    """``blocks`` x (Conv 3x3 -> BatchNormalization -> HardSwish), He-initialised, the first conv's weights
    scaled by ``gain`` so that activations are in the hundreds (outputs up to ~1000): what a torch export of a
    deep net with random weights looks like to onnxfuse."""
    b = GraphBuilder(seed=seed)
    x = b.input("x", [1, channels, hw, hw])
    for i in range(blocks):
        w = b.rng.standard_normal((channels, channels, 3, 3)) * np.sqrt(2.0 / (channels * 9))
        y = b.conv(x, channels, channels, weight=b.const((w * (gain if i == 0 else 1.0)).astype(np.float32)))
        x = b.op("HardSwish", [b.bn(y, channels)])
    return b.build(x)


def sample_rate_model() -> onnx.ModelProto:
    """x [1, 4, 8] -> Conv1d -> Relu -> If(sr == 16000): the then-branch passes it on, the else-branch reshapes
    32 elements to [7, -1], which fails at run time (as the multi-rate silero_vad's 8 kHz branch would on 16 kHz
    input). ``sr`` is an int64 scalar."""
    b = GraphBuilder()
    x = b.input("x", [1, 4, 8])
    sr = b.input("sr", [], dtype=np.int64)
    y = b.op("Relu", [b.conv(x, 4, 4, rank=1)])
    then_b = GraphBuilder(prefix="then_")
    then_b.input(y, [1, 4, 8])
    else_b = GraphBuilder(prefix="else_")
    else_b.input(y, [1, 4, 8])
    else_b.input(sr, [], dtype=np.int64)
    seven = else_b.op("Add", [else_b.op("Mul", [sr, else_b.const(np.array(0, np.int64))]),
                              else_b.const(np.array(7, np.int64))])  # 7, known only at run time
    target = else_b.op("Concat", [else_b.op("Unsqueeze", [seven, else_b.const(np.array([0], np.int64))]),
                                  else_b.const(np.array([-1], np.int64))], axis=0)
    bad = else_b.op("Reshape", [y, target])
    cond = b.op("Equal", [sr, b.const(np.array(16000, np.int64))])
    out = b.op("If", [cond], then_branch=subgraph(then_b, then_b.op("Identity", [y])),
               else_branch=subgraph(else_b, else_b.op("Reshape", [bad, else_b.const(np.array([1, 4, 8], np.int64))])))
    model = b.model(out)
    model.graph.output[0].CopyFrom(onnx.helper.make_tensor_value_info(out, onnx.TensorProto.FLOAT, [1, 4, 8]))
    return model


# --- the rule ------------------------------------------------------------------------------------------------


def test_injected_wrong_rewrite_is_caught(tmp_path, monkeypatch):
    real = ConvBatchNorm.rewrite

    def broken(self, match, ctx):  # a wrong fold: the folded bias is off by 0.5
        fusion = real(self, match, ctx)
        conv = next(n for n in ctx.graph.nodes if n.name == fusion.node)
        conv.inputs[2].values = conv.inputs[2].values + np.float32(0.5)
        return fusion

    monkeypatch.setattr(ConvBatchNorm, "rewrite", broken)
    out = tmp_path / "o.onnx"
    result = invoke("optimize", SAMPLE, out, "--target", "cpu", "--report", tmp_path / "r.json")
    assert result.exit_code == 1
    assert not out.exists()
    assert "relu2_out" in result.output and "does not match" in result.output
    assert "noise floor" in result.output and "would pass with --atol" in result.output
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["verification"]["status"] == "failed"
    assert doc["verification"]["outputs"][0]["passed"] is False


def test_verification_runs_with_optimizations_disabled(tmp_path):
    """A BN that onnxruntime would fold at load: compared at ORT_DISABLE_ALL the two graphs really differ in
    structure, and a wrong fold shows up instead of being hidden by onnxruntime's own ConvBNFusion."""
    b = GraphBuilder()
    x = b.input("x", [1, 4, 8, 8])
    model = b.build(b.bn(b.conv(x, 4, 4), 4))
    path = save(tmp_path, model)
    wrong = onnx.ModelProto()
    wrong.CopyFrom(model)
    bn = wrong.graph.node[-1]
    bn.attribute.append(onnx.helper.make_attribute("epsilon", 0.5))  # a different model
    result = verify.verify_models(path, wrong, VerifyOptions())
    assert result.status == "failed"
    sess = runtime.session(str(path))
    assert sess.get_session_options().graph_optimization_level.name == "ORT_DISABLE_ALL"


def test_deviation_is_judged_against_the_noise_floor():
    """A bias shifted by 1e3 x min_floor fails; by 0.5 x the tolerance passes; the floor, min floor, scale and
    tolerance are reported beside the error."""
    original = conv_model()
    same = verify.verify_models(original, conv_model())
    assert same.status == "passed" and same.floor_note and "bit-identical" in same.floor_note
    o = same.outputs[0]
    assert o.max_abs_error == 0 and o.scale > 0 and o.min_floor > 0
    assert o.tolerance == pytest.approx(FLOOR_MULTIPLE * o.min_floor)
    small = verify.verify_models(original, conv_model(bias_shift=0.5 * o.tolerance))
    assert small.status == "passed", small.reason
    big = verify.verify_models(original, conv_model(bias_shift=1e3 * o.min_floor))
    assert big.status == "failed"
    assert big.outputs[0].max_abs_error == pytest.approx(1e3 * o.min_floor, rel=0.01)
    assert "noise floor" in big.reason and "tolerance" in big.reason and "would pass with --atol" in big.reason


def test_rounding_floor_passes_a_correct_deep_net_when_onnxruntime_changes_nothing(monkeypatch):
    """When onnxruntime's own optimizations change no bit (floor 0) and the fold's rounding exceeds min_floor, the
    rounding floor (weights moved by one ulp) is measured: the correct fold of 60 Conv/BN/HardSwish blocks must
    still pass, and a dropped bias must still fail."""
    from onnxfuse import pipeline

    monkeypatch.setattr(floors, "measure_floor", lambda *args: "not measured (test)")
    path = _saved(deep_net())
    result = pipeline.optimize(path, pipeline.Options(), VerifyOptions())
    v = result.report.verification
    assert v.status == "passed", v.reason
    o = v.outputs[0]
    assert o.floor is None and o.rounding_floor > o.min_floor and o.max_abs_error > 10 * o.min_floor
    assert o.scale > 100  # activations in the hundreds
    broken = onnx.ModelProto()
    broken.CopyFrom(result.model)
    conv = next(n for n in broken.graph.node if n.op_type == "Conv" and n.name.endswith("5"))
    bias = next(t for t in broken.graph.initializer if t.name == conv.input[2])
    bias.CopyFrom(onnx.numpy_helper.from_array(np.zeros(16, np.float32), bias.name))
    assert verify.verify_models(path, broken).status == "failed"


def test_weights_moved_by_one_ulp_moves_only_accumulating_weights():
    b = GraphBuilder()
    x = b.input("x", [1, 4, 8, 8])
    model = b.build(b.op("Mul", [b.conv(x, 4, 4), b.const(np.full((1, 4, 1, 1), 3.0, np.float32))]))
    moved = weights_moved_by_one_ulp(model)
    before = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    after = {t.name: onnx.numpy_helper.to_array(t) for t in moved.graph.initializer}
    w = model.graph.node[0].input[1]
    steps = np.abs(after[w].astype(np.float64) - before[w]) / np.spacing(np.abs(before[w]))
    assert np.all((steps > 0.4) & (steps <= 1.0 + 1e-6))  # one ulp (half one at a power of two, going down)
    assert all(np.array_equal(after[k], v) for k, v in before.items() if k != w)  # bias and Mul untouched


def _saved(model: onnx.ModelProto):
    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp(prefix="onnxfuse-test-")) / "m.onnx"
    onnx.save(model, str(path))
    return path


def test_deep_net_passes_with_default_settings(tmp_path):
    """A deep net with random weights and activations in the hundreds (issue 11: elementwise atol/rtol cried
    wolf on such a net): default `optimize` passes, and the output says the floor beside the error."""
    path = save(tmp_path, deep_net())
    for target in ("cpu+cuda", "cpu"):
        out = tmp_path / f"o_{target}.onnx"
        result = invoke("optimize", path, out, "--target", target, "--report", tmp_path / "r.json")
        assert result.exit_code == 0, result.output
        v = json.loads((tmp_path / "r.json").read_text())["verification"]
        assert v["status"] == "passed" and v["rule"] == "noise-floor"
        o = v["outputs"][0]
        assert o["max_abs_error"] > 0 and o["floor"] > 0 and o["scale"] > 100
        assert "noise floor" in result.output


def test_nan_and_inf_positions_must_match(tmp_path):
    b = GraphBuilder()
    x = b.input("x", [1, 4, 8, 8])
    original = b.build(b.op("Log", [b.conv(x, 4, 4)], name="log"))  # NaN where the conv is negative, -inf at 0
    b2 = GraphBuilder()
    x2 = b2.input("x", [1, 4, 8, 8])
    no_nan = b2.build(b2.op("Log", [b2.op("Abs", [b2.conv(x2, 4, 4)])], name="log"))
    assert verify.verify_models(original, original).status == "passed"
    result = verify.verify_models(original, no_nan)
    assert result.status == "failed"
    assert result.outputs[0].nonfinite_mismatches > 0 and "NaN/inf" in result.reason


def test_all_nan_outputs_are_no_evidence(tmp_path):
    """All-NaN input data makes every output NaN in both models: NaN matches NaN, but no number was compared, so
    the status is skipped (never passed), also for a candidate with a wrong bias. Where the candidate gives
    numbers where the original gives NaN, it fails as before."""
    np.savez(tmp_path / "nan.npz", x=np.full((1, 4, 8, 8), np.nan, np.float32))
    opts = VerifyOptions(input_data=str(tmp_path / "nan.npz"))
    for candidate in (conv_model(), conv_model(bias_shift=0.5)):
        result = verify.verify_models(conv_model(), candidate, opts)
        assert result.status == "skipped", result
        assert "NaN or inf" in result.reason and "no number was compared" in result.reason
    b = GraphBuilder()
    x = b.input("x", [1, 4, 8, 8])
    numbers = b.build(b.op("Where", [b.op("IsNaN", [x]), b.const(np.zeros(1, np.float32)), x]))
    nan_out = GraphBuilder()
    x2 = nan_out.input("x", [1, 4, 8, 8])
    original = nan_out.build(nan_out.op("Identity", [x2]))
    assert verify.verify_models(original, numbers, opts).status == "failed"


def test_integer_and_bool_outputs_are_exact(tmp_path):
    def model(offset: int) -> onnx.ModelProto:
        b = GraphBuilder()
        x = b.input("x", [1, 4, 8, 8])
        y = b.op("ArgMax", [b.conv(x, 4, 4)], axis=1)
        return b.build(b.op("Add", [y, b.const(np.array(offset, np.int64))], name="add"), output_dtype=np.int64)

    assert verify.verify_models(model(0), model(0)).status == "passed"
    result = verify.verify_models(model(0), model(1))
    assert result.status == "failed" and "must be equal" in result.reason
    assert result.outputs[0].dtype == "int64" and result.outputs[0].tolerance == 0.0
    # integer outputs are calibrated by onnxruntime's own level-to-level differences (issue 26): none here
    assert result.outputs[0].floor_differing == 0 and result.outputs[0].differing == 64
    assert verify.verify_models(model(0), model(0)).floor_note == "not measured: no floating-point output"


def test_int64_and_bool_inputs_and_multiple_outputs(tmp_path):
    b = GraphBuilder()
    x = b.input("x", [1, 4, 8, 8])
    idx = b.input("idx", [3], dtype=np.int64)
    flag = b.input("flag", [1], dtype=np.bool_)
    y = b.op("Relu", [b.conv(x, 4, 4)])
    g = b.op("Gather", [y, idx], axis=1)
    nf = b.op("Not", [flag])
    model = b.model([y, g, nf])
    del model.graph.output[:]
    model.graph.output.extend([onnx.helper.make_tensor_value_info(y, onnx.TensorProto.FLOAT, [1, 4, 8, 8]),
                               onnx.helper.make_tensor_value_info(g, onnx.TensorProto.FLOAT, [1, 3, 8, 8]),
                               onnx.helper.make_tensor_value_info(nf, onnx.TensorProto.BOOL, [1])])
    path = save(tmp_path, model)
    result = invoke("optimize", path, tmp_path / "o.onnx", "--target", "cpu", "--report", tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "r.json").read_text())["verification"]
    assert doc["status"] == "passed"
    assert [o["name"] for o in doc["outputs"]] == [y, g, nf]
    assert doc["outputs"][2]["dtype"] == "bool" and doc["outputs"][2]["tolerance"] == 0.0


def test_float16_min_floor_uses_float16_eps(tmp_path):
    b = GraphBuilder(dtype=np.float16)
    x = b.input("x", [1, 8, 16, 16])
    model = b.build(b.op("Relu", [b.bn(b.conv(x, 8, 8), 8)]))
    result = verify.verify_models(save(tmp_path, model), model, VerifyOptions())
    assert result.status == "passed"
    o = result.outputs[0]
    assert o.dtype == "float16"
    assert o.min_floor == pytest.approx(MIN_FLOOR_ULPS * float(np.finfo(np.float16).eps) * o.scale, rel=1e-6)


def test_tolerance_override_replaces_the_rule():
    original, shifted = conv_model(), conv_model(bias_shift=0.01)
    strict = verify.verify_models(original, shifted, VerifyOptions(rtol=0.0, atol=1e-3))
    assert strict.status == "failed" and strict.rule == "rtol-atol"
    d = strict.outputs[0]
    assert d.max_abs_error == pytest.approx(0.01, rel=1e-3) and d.needed_atol == pytest.approx(0.01, rel=1e-3)
    assert d.tolerance is None and "not measured" in strict.floor_note
    assert verify.verify_models(original, shifted, VerifyOptions(atol=0.02)).status == "passed"


# --- cost ----------------------------------------------------------------------------------------------------


def test_each_session_is_created_once_and_input_sets_are_an_option(monkeypatch):
    made = []
    real = runtime.session

    def counting(model, level="disable", *args, **kwargs):
        made.append(level)
        return real(model, level, *args, **kwargs)

    monkeypatch.setattr(runtime, "session", counting)
    original, candidate = conv_model(), conv_model(bias_shift=1e-5)
    result = verify.verify_models(original, candidate, VerifyOptions(input_sets=3))
    assert result.seeds == [0, 1, 2]
    assert made == ["disable", "disable", "all"]  # original, candidate, original's noise floor
    made.clear()
    assert verify.verify_models(original, candidate).seeds == [0]  # default: one input set
    made.clear()
    verify.verify_models(original, conv_model())  # bit-identical outputs: no floor session
    assert made == ["disable", "disable"]
    made.clear()
    # a deviation within FLOOR_MULTIPLE x the one-ulp minimum passes whatever onnxruntime's floor: not measured
    tiny = verify.verify_models(original, conv_model(bias_shift=1e-7))
    assert made == ["disable", "disable"]
    assert tiny.status == "passed" and "one-ulp minimum" in tiny.floor_note
    assert 0 < tiny.outputs[0].max_abs_error <= tiny.outputs[0].tolerance


def test_sessions_do_not_spin_and_outputs_kept_are_copies(monkeypatch):
    original = conv_model()
    sess = runtime.session(original.SerializeToString(), spinning=False)
    feeds = runtime.make_inputs(sess, {}, 0)
    # onnxruntime's own arrays wrap its buffers (and so keep the session's arena alive); verification keeps copies
    assert not sess.run(None, feeds)[0].flags.owndata
    kept = run_all(sess, [feeds])[0][0]
    assert kept.flags.owndata and np.array_equal(kept, sess.run(None, feeds)[0])
    made = []
    real = runtime.session

    def keeping(model, level="disable", *args, **kwargs):
        made.append(real(model, level, *args, **kwargs))
        return made[-1]

    monkeypatch.setattr(runtime, "session", keeping)
    assert verify.verify_models(original, conv_model(bias_shift=1e-5)).status == "passed"
    assert len(made) == 3  # original, candidate, noise floor: none busy-waits for work
    assert {s.get_session_options().get_session_config_entry("session.intra_op.allow_spinning") for s in made} == {"0"}


def test_trim_heap_reaches_glibc_malloc_trim_where_there_is_one():
    import platform
    import sys

    runtime.trim_heap()  # never raises, whatever the C library
    if sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc":
        assert runtime._malloc_trim() is not None
    elif not sys.platform.startswith("linux"):
        assert runtime._malloc_trim() is None


def test_a_candidate_proto_is_loaded_from_a_temporary_file_or_as_bytes_when_none_can_be_written(monkeypatch):
    import tempfile

    model = conv_model()
    with runtime.loadable(model, as_file=True) as src:
        assert isinstance(src, str) and onnx.load(src) == model
        written = src
    assert not Path(written).exists()  # removed with the context
    with runtime.loadable(model) as src:
        assert src == model.SerializeToString()

    def refuse(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    with runtime.loadable(model, as_file=True) as src:
        assert src == model.SerializeToString()
    assert verify.verify_models(model, conv_model(bias_shift=1e-5)).status == "passed"


def test_nothing_rewritten_means_nothing_run(tmp_path, monkeypatch):
    b = GraphBuilder()
    x = b.input("x", [1, 4, 8, 8])
    path = save(tmp_path, b.build(b.op("Sigmoid", [x])))

    def no_session(*args, **kwargs):
        raise AssertionError("onnxruntime must not run when nothing was rewritten")

    monkeypatch.setattr(runtime, "session", no_session)
    out = tmp_path / "o.onnx"
    result = invoke("optimize", path, out, "--require-verify", "--report", tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    assert "verification: unchanged" in result.output and out.exists()
    assert json.loads((tmp_path / "r.json").read_text())["verification"]["status"] == "unchanged"


# --- inputs --------------------------------------------------------------------------------------------------


def test_input_value_selects_the_branch_the_model_runs(tmp_path):
    path = save(tmp_path, sample_rate_model())
    result = invoke("optimize", path, tmp_path / "o.onnx", "--target", "cpu", "--report", tmp_path / "r.json")
    assert result.exit_code == 0
    v = json.loads((tmp_path / "r.json").read_text())["verification"]
    assert v["status"] == "skipped"
    assert "sr" in v["reason"] and "--input-value" in v["reason"]
    result = invoke("optimize", path, tmp_path / "o2.onnx", "--target", "cpu", "--input-value", "sr=16000",
                    "--require-verify", "--report", tmp_path / "r2.json")
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "r2.json").read_text())["verification"]["status"] == "passed"
    result = invoke("verify", path, tmp_path / "o2.onnx", "--input-value", "sr=16000")
    assert result.exit_code == 0 and "verification: passed" in result.output


def test_make_inputs_values_and_ranges():
    b = GraphBuilder()
    x = b.input("x", ["batch", 4])
    n = b.input("n", [3], dtype=np.int64)
    model = b.build([b.op("Relu", [x]), b.op("Cast", [n], to=onnx.TensorProto.FLOAT)])
    sess = runtime.session(model.SerializeToString())
    spec = runtime.InputSpec(shapes={"x": (2, 4)}, values={"n": 7}, ranges={"x": (5.0, 6.0)})
    feeds = runtime.make_inputs(sess, spec, seed=0)
    assert feeds["x"].shape == (2, 4) and feeds["x"].min() >= 5.0 and feeds["x"].max() < 6.0
    assert feeds["n"].dtype == np.int64 and list(feeds["n"]) == [7, 7, 7]
    ints = runtime.make_inputs(sess, runtime.InputSpec(ranges={"n": (-2, 2)}), seed=0)["n"]
    assert ints.min() >= -2 and ints.max() <= 2
    with pytest.raises(InputError, match="does not fit"):
        runtime.make_inputs(sess, runtime.InputSpec(values={"n": 1.5}), seed=0)
    with pytest.raises(InputError, match="no graph input named nosuch"):
        runtime.check_names(sess, runtime.InputSpec(values={"nosuch": 1}))
    assert runtime.parse_input_value("sr=16000") == ("sr", 16000)
    assert runtime.parse_input_range("x=-1,0.5") == ("x", (-1, 0.5))
    for bad in ("sr", "sr=", "sr=abc", "sr=nan"):
        with pytest.raises(InputError):
            runtime.parse_input_value(bad)
    for bad in ("x=1", "x=2,1", "x=a,b"):
        with pytest.raises(InputError):
            runtime.parse_input_range(bad)


def test_one_value_per_symbolic_dim_name():
    b = GraphBuilder()
    x = b.input("x", ["batch", 4])
    s = b.input("s", [2, "batch", 3])
    model = b.build([b.op("Relu", [x]), b.op("Relu", [s])])
    sess = runtime.session(model.SerializeToString())
    feeds = runtime.make_inputs(sess, {}, seed=0)
    assert feeds["x"].shape == (1, 4) and feeds["s"].shape == (2, 1, 3)
    feeds = runtime.make_inputs(sess, {"x": (5, 4)}, seed=0)
    assert feeds["s"].shape == (2, 5, 3)


def test_skipped_when_original_cannot_run_and_require_verify_fails(tmp_path):
    b = GraphBuilder()
    x = b.input("x", ["N", 4, 8, 8])
    shape = b.const(np.array([7, -1], dtype=np.int64))  # 4*8*8*N is not divisible by 7 for N=1
    model = b.build(b.op("Reshape", [b.op("Relu", [b.conv(x, 4, 4)]), shape]))
    path = save(tmp_path, model)
    result = invoke("optimize", path, tmp_path / "o.onnx", "--target", "cpu", "--report", tmp_path / "r.json")
    assert result.exit_code == 0
    assert "verification: skipped" in result.output
    v = json.loads((tmp_path / "r.json").read_text())["verification"]
    assert v["status"] == "skipped" and "--input-shape" in v["reason"]
    result = invoke("optimize", path, tmp_path / "o2.onnx", "--target", "cpu", "--require-verify")
    assert result.exit_code == 1 and not (tmp_path / "o2.onnx").exists()
    result = invoke("optimize", path, tmp_path / "o3.onnx", "--target", "cpu", "--input-shape", "x=7x4x8x8",
                    "--require-verify")
    assert result.exit_code == 0, result.output


def test_no_verify_is_reported_as_skipped(tmp_path):
    result = invoke("optimize", SAMPLE, tmp_path / "o.onnx", "--no-verify", "--report", tmp_path / "r.json")
    assert result.exit_code == 0
    v = json.loads((tmp_path / "r.json").read_text())["verification"]
    assert v["status"] == "skipped" and "--no-verify" in v["reason"]


def test_input_data_feeds_real_inputs(tmp_path):
    npz = tmp_path / "in.npz"
    np.savez(npz, x=np.ones((1, 8, 16, 16), np.float32))
    result = invoke("optimize", SAMPLE, tmp_path / "o.onnx", "--input-data", npz, "--input-sets", "3",
                    "--report", tmp_path / "r.json")
    assert result.exit_code == 0
    assert json.loads((tmp_path / "r.json").read_text())["verification"]["seeds"] == [0]  # nothing random
    np.savez(npz, nosuch=np.ones(3, np.float32))
    result = invoke("optimize", SAMPLE, tmp_path / "o2.onnx", "--input-data", npz)
    assert result.exit_code == 2 and "no graph input named nosuch" in result.output


def test_input_data_of_the_wrong_dtype_is_a_usage_error(tmp_path):
    npz = tmp_path / "in.npz"
    np.savez(npz, x=np.ones((1, 8, 16, 16), np.float64))
    result = invoke("optimize", SAMPLE, tmp_path / "o.onnx", "--input-data", npz)
    assert result.exit_code == 2 and "dtype float64" in result.output
    assert not (tmp_path / "o.onnx").exists()


def test_models_over_the_protobuf_limit_are_verified_through_external_data(tmp_path, monkeypatch):
    from onnxfuse.model import io as g

    monkeypatch.setattr(g, "PROTOBUF_LIMIT_BYTES", 1000)  # the sample is ~5 KB: take the > 2 GB path
    out = tmp_path / "o.onnx"
    result = invoke("optimize", SAMPLE, out, "--target", "cpu", "--report", tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "r.json").read_text())["verification"]["status"] == "passed"
    assert len(list(tmp_path.glob("o.onnx.*.data"))) == 1  # saved with external data, and the weights were all there
    onnx.checker.check_model(str(out))
    assert runtime.session(str(out)) is not None


# --- onnxfuse verify -----------------------------------------------------------------------------------------


def test_verify_command_passed_and_failed(tmp_path):
    original = save(tmp_path, conv_model(), "a.onnx")
    result = invoke("verify", original, save(tmp_path, conv_model(bias_shift=1e-7), "b.onnx"))
    assert result.exit_code == 0, result.output
    assert "verification: passed" in result.output and "noise floor" in result.output
    result = invoke("verify", original, save(tmp_path, conv_model(bias_shift=0.05, channel=2), "c.onnx"))
    assert result.exit_code == 1
    assert "FAILED" in result.output and "would pass with --atol" in result.output
    result = invoke("verify", original, tmp_path / "c.onnx", "--atol", "0.1", "--format", "json")
    assert result.exit_code == 0 and json.loads(result.output)["rule"] == "rtol-atol"


def test_verify_command_output_names_and_dtypes_must_match(tmp_path):
    original = conv_model()
    renamed = conv_model()
    old = renamed.graph.output[0].name
    renamed.graph.output[0].name = "other"
    renamed.graph.node[-1].output[0] = "other"
    cast = conv_model()
    cast.graph.node.append(onnx.helper.make_node("Cast", [old], ["as_double"], to=onnx.TensorProto.DOUBLE))
    cast.graph.output[0].CopyFrom(onnx.helper.make_tensor_value_info("as_double", onnx.TensorProto.DOUBLE,
                                                                     [1, 4, 8, 8]))
    a = save(tmp_path, original, "a.onnx")
    for candidate, word in ((renamed, "other"), (cast, "double")):
        result = invoke("verify", a, save(tmp_path, candidate, "b.onnx"))
        assert result.exit_code == 1, result.output
        assert "names, order and dtypes must match" in result.output and word in result.output


def test_verify_command_bad_input(tmp_path):
    a = save(tmp_path, conv_model(), "a.onnx")
    missing = invoke("verify", a, tmp_path / "nosuch.onnx")
    assert missing.exit_code == 2 and "error:" in missing.output
    garbage = tmp_path / "g.onnx"
    garbage.write_bytes(b"not a model")
    assert invoke("verify", garbage, a).exit_code == 2
    for args in (["--input-value", "x"], ["--input-value", "nosuch=1"], ["--input-range", "x=2,1"],
                 ["--input-value", "x=1", "--input-range", "x=0,1"]):
        result = invoke("verify", a, a, *args)
        assert result.exit_code == 2, (args, result.output)
        assert result.output.startswith("error:") and "Traceback" not in result.output
    sr = save(tmp_path, sample_rate_model(), "sr.onnx")
    result = invoke("verify", sr, sr)  # onnxruntime cannot run the original on random sr: exit 2, says why
    assert result.exit_code == 2 and "sr" in result.output and "--input-value" in result.output


def test_bench_takes_input_values(tmp_path):
    sr = save(tmp_path, sample_rate_model(), "sr.onnx")
    result = invoke("bench", sr, "--runs", "1", "--max-time", "0", "--warmup", "0", "--level", "disable",
                    "--input-value", "sr=16000", "--format", "json")
    assert result.exit_code == 0, result.output
    result = invoke("bench", sr, "--runs", "1", "--warmup", "0", "--level", "disable")
    assert result.exit_code == 2 and "--input-value" in result.output


def test_public_api_takes_input_values():
    import onnxfuse

    model = sample_rate_model()
    result = onnxfuse.optimize(model, target="cpu", input_values={"sr": 16000}, require_verify=True)
    assert result.verification.status == "passed"
    assert onnxfuse.verify(model, result.model, input_values={"sr": 16000}, input_sets=2).seeds == [0, 1]
    skipped = onnxfuse.verify(model, result.model)
    assert skipped.status == "skipped" and "sr" in skipped.reason and "--input-value" in skipped.reason


def loop_model(weight_scale: float = 1.0) -> onnx.ModelProto:
    """A Loop whose body runs Conv -> Relu on the outer x once per iteration; its scan output [n, 1, 4, 8, 8] is
    empty when the loop runs 0 times (trip count n = 0, or cond c0 false)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * weight_scale).astype(np.float32), "w")
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["scan"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("scan", TensorProto.FLOAT, [1, 4, 8, 8])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["n", "c0"], ["y"], body=body)], "loop",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8]),
         helper.make_tensor_value_info("n", TensorProto.INT64, []),
         helper.make_tensor_value_info("c0", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n_iter", 1, 4, 8, 8])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_empty_outputs_are_no_evidence():
    # a candidate with wrong weights inside the Loop body
    original, broken = loop_model(), loop_model(weight_scale=2.0)
    ran = verify.verify_models(original, broken, VerifyOptions(input_values={"n": 2, "c0": 1}))
    assert ran.status == "failed"
    empty = verify.verify_models(original, broken, VerifyOptions(input_values={"n": 0, "c0": 1}))
    assert empty.status == "skipped", empty  # nothing compared: never "passed"
    assert "empty" in empty.reason and "nothing was compared" in empty.reason


# --- time budget (issue 20 point 4) ----------------------------------------------------------------------------


def loop_forever_model() -> onnx.ModelProto:
    """A fusable Conv -> Relu beside a Loop of 10**12 iterations (trip count and condition are constants; the body
    adds 1 to a loop-carried value): a 1 KB model whose run never ends in practice."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["acc_in", "one"], ["acc_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [1])])
    inits = [numpy_helper.from_array(np.array(10**12, np.int64), "trip"),
             numpy_helper.from_array(np.array(True), "cond"),
             numpy_helper.from_array(np.zeros(1, np.float32), "acc0"),
             numpy_helper.from_array(np.ones(1, np.float32), "one"),
             numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")]
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trip", "cond", "acc0"], ["count"], body=body),
         helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8]),
         helper.make_tensor_value_info("count", TensorProto.FLOAT, [1])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_loop_of_10_12_iterations_is_skipped_for_time_not_a_hang(tmp_path):
    path = save(tmp_path, loop_forever_model())
    out, report = tmp_path / "o.onnx", tmp_path / "r.json"
    result = invoke("optimize", path, out, "--target", "cpu", "--verify-timeout", "0.5", "--report", report)
    assert result.exit_code == 0, result.output
    v = json.loads(report.read_text())["verification"]
    assert v["status"] == "skipped" and v["cause"] == "time" and v["reason"].startswith("time")
    assert out.exists()  # skipped is not failed: written, and said loudly
    assert result.stdout.startswith("NOT VERIFIED")
    warning = next(line for line in result.stderr.splitlines() if line.startswith("warning: NOT VERIFIED"))
    assert "--verify-timeout" in warning and "--require-verify" in warning
    strict = invoke("optimize", path, tmp_path / "s.onnx", "--target", "cpu", "--verify-timeout", "0.5",
                    "--require-verify")
    assert strict.exit_code == 1 and not (tmp_path / "s.onnx").exists()
    checked = invoke("verify", path, out, "--verify-timeout", "0.5")
    assert checked.exit_code == 2 and checked.stdout.startswith("NOT VERIFIED")


def test_verify_timeout_in_the_api_and_its_default(tmp_path):
    import onnxfuse

    model = loop_forever_model()
    result = onnxfuse.optimize(model, target="cpu", verify_timeout=0.5)
    assert result.verification.status == "skipped" and result.verification.cause == "time"
    assert onnxfuse.verify(model, result.model, verify_timeout=0.5).cause == "time"
    assert VerifyOptions().timeout == DEFAULT_TIMEOUT_S
    assert timeout_seconds(None) == DEFAULT_TIMEOUT_S and timeout_seconds(0) is None
    with pytest.raises(InputError):
        onnxfuse.verify(model, result.model, verify_timeout=-1)
    assert f"[default: {DEFAULT_TIMEOUT_S:g}]" in " ".join(invoke("optimize", "--help").output.split())


def test_the_budget_is_checked_before_each_session(monkeypatch):
    """onnxruntime cannot stop a session being made: no session is made once the budget is spent."""
    made = []
    real = runtime.session
    monkeypatch.setattr(runtime, "session", lambda *a, **k: made.append(a) or real(*a, **k))
    clock = iter([0.0, 0.0, 0.0, 1e9])  # the budget starts, the original is made and run, then time is up
    monkeypatch.setattr(verify_run, "WALL_CLOCK", lambda: next(clock, 1e9))
    result = verify.verify_models(conv_model(), conv_model(bias_shift=1e-3), VerifyOptions(timeout=10, work=None))
    assert result.status == "skipped" and result.cause == "time"
    assert len(made) == 1  # the candidate's session was not made


# --- never silent about what was not checked (issue 22 point 5) ------------------------------------------------


def onnxfuse_reason(path) -> str:
    import onnxfuse

    return onnxfuse.optimize(onnx.load(str(path)), target="cpu").verification.reason


def test_skipped_verification_warns_with_what_to_pass(tmp_path):
    path = save(tmp_path, sample_rate_model())
    result = invoke("optimize", path, tmp_path / "o.onnx", "--target", "cpu")
    assert result.exit_code == 0
    assert result.stdout.startswith("NOT VERIFIED")
    warning = next(line for line in result.stderr.splitlines() if line.startswith("warning: NOT VERIFIED"))
    assert "--require-verify" in warning
    # the reason (onnxruntime's message and what to pass) is printed once, on the result's verification line
    reason = json.loads(json.dumps(onnxfuse_reason(path)))
    assert "--input-value" in reason and result.output.count(reason) == 1
    assert "--input-value" in next(line for line in result.stdout.splitlines() if line.startswith("verification:"))
    fixed = invoke("optimize", path, tmp_path / "o.onnx", "--target", "cpu", "--input-value", "sr=16000")
    assert fixed.exit_code == 0 and "NOT VERIFIED" not in fixed.output


def test_silero_without_its_sample_rate_warns_about_verification(tmp_path):
    from tests.conftest import shared_model

    result = invoke("optimize", shared_model("silero_vad_16k_op15"), tmp_path / "o.onnx",
                    "--input-shape", "input=1x512")
    assert result.exit_code == 0, result.output
    assert any(line.startswith("warning:") and "sr" in line and "--input-value" in line
               for line in result.stderr.splitlines()), result.stderr


def symbolic_conv_model(batch: str | int = "N", h: str | int = "H", w: str | int = "W") -> GraphBuilder:
    b = GraphBuilder()
    x = b.input("x", [batch, 4, h, w])
    return b, b.op("Relu", [b.conv(x, 4, 4)])


def test_invented_input_sizes_are_printed(tmp_path):
    b, y = symbolic_conv_model()
    path = save(tmp_path, b.build(b.bn(y, 4)))
    result = invoke("optimize", path, tmp_path / "o.onnx", "--target", "cpu")
    assert result.exit_code == 0, result.output
    line = next(line for line in result.stderr.splitlines() if "invented sizes" in line)
    assert result.stderr.count("invented sizes") == 1
    assert line.startswith("warning:") and "x=1x4x224x224" in line and "x=2x4x64x64" in line
    assert "--input-shape" in line
    given = invoke("optimize", path, tmp_path / "o.onnx", "--target", "cpu", "--input-shape", "x=1x4x16x16")
    assert "invented sizes" not in given.output


# --- default inputs: a second set, not-compared outputs, per-slice floors (issue 20 point 8) ------------------


def test_a_candidate_wrong_only_at_batch_2_fails():
    b, y = symbolic_conv_model(h=8, w=8)
    original = b.build(b.op("Identity", [y], name="out"))
    b, y = symbolic_conv_model(h=8, w=8)  # the same weights
    first = b.op("Slice", [y, b.const(np.array([0], np.int64)), b.const(np.array([1], np.int64)),
                           b.const(np.array([0], np.int64))])
    wrong = b.build(b.op("Expand", [first, b.op("Shape", [y])], name="out"))  # batch element 0 copied to all
    result = verify.verify_models(original, wrong)
    assert result.status == "failed", result
    assert result.input_shapes["x"] == [1, 4, 8, 8] and result.second_input_shapes["x"] == [2, 4, 8, 8]
    assert result.invented == ["x"] and len(result.seeds) == 2
    given = verify.verify_models(original, wrong, VerifyOptions(input_shapes={"x": (1, 4, 8, 8)}))
    assert given.status == "passed" and given.second_input_shapes == {}  # the user's shape is the shape


def test_a_candidate_wrong_only_at_another_spatial_size_fails():
    b, y = symbolic_conv_model(batch=1)
    original = b.build(b.op("Identity", [y], name="out"))
    b, y = symbolic_conv_model(batch=1)
    h = b.op("Gather", [b.op("Shape", [y]), b.const(np.array(2, np.int64))])
    off = b.op("Cast", [b.op("Not", [b.op("Equal", [h, b.const(np.array(32, np.int64))])])], to=1)
    wrong = b.build(b.op("Add", [y, b.op("Mul", [off, b.const(np.float32(0.5))])], name="out"))
    result = verify.verify_models(original, wrong)
    assert result.status == "failed", result
    assert result.second_input_shapes["x"] == [1, 4, 64, 64]


def test_second_set_falls_back_quietly_when_the_original_only_runs_at_batch_1():
    b, y = symbolic_conv_model(h=8, w=8)
    flat = b.op("Reshape", [y, b.const(np.array([1, 256], np.int64))])  # batch 1 only
    model = b.build(flat)
    result = verify.verify_models(model, model)
    assert result.status == "passed" and len(result.seeds) == 1
    assert result.second_input_shapes == {} and "second input set" in result.input_note


def small_next_to_large_model(small_gain: float = 1.0) -> onnx.ModelProto:
    """x [1, 4, 8, 8] -> two convs concatenated on the channels: 4 channels near 1e5, 4 near 1e-3 (scores beside
    box sizes in pixels); ``small_gain`` scales the small conv's weights and bias."""
    b = GraphBuilder()
    x = b.input("x", [1, 4, 8, 8])
    big = b.conv(x, 4, 4, weight=b.const(b.rand(4, 4, 3, 3) * np.float32(1e5)))
    small_w, small_b = b.rand(4, 4, 3, 3) * np.float32(1e-3), b.rand(4, scale=1e-3)
    small = b.op("Conv", [x, b.const(small_w * np.float32(small_gain)), b.const(small_b * np.float32(small_gain))],
                 pads=[1, 1, 1, 1])
    return b.build(b.op("Concat", [b.bn(big, 4), small], axis=1, name="y"))


def test_a_60_percent_error_on_small_values_next_to_1e5_values_fails():
    original = small_next_to_large_model()
    wrong = verify.verify_models(original, small_next_to_large_model(small_gain=1.6))
    assert wrong.status == "failed", wrong.summary
    o = wrong.outputs[0]
    assert o.max_abs_error <= o.tolerance  # the output as a whole hides it ...
    assert o.worst_group["axis"] == 1 and o.worst_group["index"] >= 4  # ... its small channels do not
    assert "slice" in wrong.reason and "axis 1" in wrong.reason
    import onnxfuse

    fused = onnxfuse.optimize(original, target="cpu", verify=False).model  # a correct fold of the BN
    assert verify.verify_models(original, fused).status == "passed"


def test_an_empty_output_beside_a_good_one_is_not_compared(tmp_path):
    b = GraphBuilder()
    x = b.input("x", [1, 4, 8, 8])
    y = b.op("Relu", [b.conv(x, 4, 4)], name="y")
    empty = b.op("Slice", [y, b.const(np.array([0], np.int64)), b.const(np.array([0], np.int64)),
                           b.const(np.array([1], np.int64))], name="z")
    model = b.build([y, empty])
    path = save(tmp_path, model)
    result = verify.verify_models(model, model)
    assert result.status == "partial"  # issue 32: an output with nothing compared is not a pass
    good, z = result.outputs
    assert good.passed and good.compared == 256
    assert z.not_compared and not z.passed and z.compared == 0  # never counted as passed
    assert "not compared" in result.summary and "z_out" in result.summary
    assert result.failed_outputs == []
    cli = invoke("verify", path, path)
    assert cli.exit_code == 0 and "verification: partial" in cli.stdout and "not compared" in cli.stdout
    assert any(line.startswith("warning:") and "z_out" in line for line in cli.stderr.splitlines())


def nan_beside_good_model() -> onnx.ModelProto:
    """x -> Conv -> BatchNormalization -> y (a fold to verify), and z = Sqrt(-1 - |x|): NaN everywhere, on every
    input, in every model (a scalar input left random can do that to a real model's output)."""
    b = GraphBuilder()
    x = b.input("x", [1, 4, 8, 8])
    y = b.op("Relu", [b.bn(b.conv(x, 4, 4), 4)], name="y")
    neg = b.op("Sub", [b.const(np.full((1,), -1.0, np.float32)), b.op("Abs", [x])])
    return b.build([y, b.op("Sqrt", [neg], name="z")])


def test_issue_32_an_output_nan_on_every_input_set_is_never_passed(tmp_path):
    model = nan_beside_good_model()
    result = verify.verify_models(model, model, VerifyOptions(input_sets=3))
    assert result.status == "partial" and len(result.seeds) == 3
    assert [o.not_compared for o in result.outputs] == [False, True]
    assert "--input-value" in result.reason and "--input-data" in result.reason and "z_out" in result.reason
    assert "--input-value" in result.summary and "z_out" in result.summary
    assert result.to_dict()["status"] == "partial"
    path = save(tmp_path, model)
    out = tmp_path / "out.onnx"
    ok = invoke("optimize", path, out, "--target", "cpu")
    assert ok.exit_code == 0 and out.exists(), ok.stderr
    assert "verification: partial" in ok.stdout and "NOT FULLY VERIFIED" in ok.stderr
    out.unlink()
    strict = invoke("optimize", path, out, "--target", "cpu", "--require-verify")
    assert strict.exit_code == 1 and not out.exists()
    assert "verification was partial" in strict.stderr
    import onnxfuse

    assert onnxfuse.optimize(model, target="cpu").verification.status == "partial"
    with pytest.raises(onnxfuse.VerificationError, match="partial"):
        onnxfuse.optimize(model, target="cpu", require_verify=True)


# --- integer outputs (issue 26) ---------------------------------------------------------------------------------


def truncating_cast_model(shift: float = 0.0) -> onnx.ModelProto:
    """x -> Conv -> BatchNormalization (+ ``shift``) -> Mul 1e4 -> Cast int64: integer codes computed from floats
    through a truncating Cast, where float rounding flips a few codes by 1."""
    b = GraphBuilder()
    x = b.input("x", [1, 8, 16, 16])
    y = b.bn(b.conv(x, 8, 8), 8)
    if shift:
        y = b.op("Add", [y, b.const(np.float32(shift))])
    q = b.op("Mul", [y, b.const(np.float32(1e4))])
    return b.build(b.op("Cast", [q], to=onnx.TensorProto.INT64, name="codes"), output_dtype=np.int64)


def test_issue_26_integer_outputs_through_a_truncating_cast_are_calibrated_by_onnxruntime():
    import onnxfuse

    original = truncating_cast_model()
    fused = onnxfuse.optimize(original, target="onnx", verify=False)
    assert fused.changed
    result = verify.verify_models(original, fused.model)
    o = result.outputs[0]
    assert o.differing > 0 and o.floor_differing > 0  # the fold flips codes, and so does onnxruntime's own
    assert result.status == "passed", result.reason
    wrong = verify.verify_models(original, truncating_cast_model(shift=0.01))
    assert wrong.status == "failed" and "codes_out" in wrong.reason
    with_atol = verify.verify_models(original, fused.model, VerifyOptions(atol=1))
    assert with_atol.status == "passed"  # --atol applies to integer outputs too
    assert verify.verify_models(original, truncating_cast_model(shift=0.01),
                                VerifyOptions(atol=1)).status == "failed"


@pytest.mark.parametrize("op", ["dropout_training", "random_normal_like"])
def test_a_model_that_draws_random_numbers_is_not_verified(tmp_path, op):
    """A Dropout in training mode after the fused chain let a wrong candidate pass (its noise floor was the
    dropout's own randomness); an unseeded RandomNormalLike made a correct one fail. Neither comparison is evidence:
    verification is skipped with cause "random"."""
    import onnxfuse
    from tests.builders import GraphBuilder

    b = GraphBuilder()
    x = b.input("x", [1, 3, 8, 8])
    y = b.op("Relu", [b.bn(b.conv(x, 3, 4), 4)])
    if op == "dropout_training":
        out = b.op("Dropout", [y, b.const(np.array(0.5, np.float32)), b.const(np.array(True))])
    else:
        out = b.op("Add", [y, b.op("RandomNormalLike", [y])])
    result = onnxfuse.optimize(b.build(out), target="cpu")
    v = result.verification
    assert v.status == "skipped" and v.cause == "random" and "draws random numbers" in v.reason
    with pytest.raises(onnxfuse.VerificationError):
        onnxfuse.optimize(b.build(out), target="cpu", require_verify=True)


def test_status_and_cause_are_str_enums_written_as_their_values():
    """``Verification.status``/``cause`` are ``Status``/``Cause`` members that compare equal to, format as and
    serialize to the plain strings of the report (a plain string given is turned into the member)."""
    from onnxfuse.verification.result import Cause, Status, Verification

    v = Verification("skipped", "why", cause="time")
    assert v.status is Status.SKIPPED and v.cause is Cause.TIME
    assert v.status == "skipped" and f"verification: {v.status}" == "verification: skipped" and str(v.cause) == "time"
    doc = json.loads(json.dumps(v.to_dict()))
    assert doc["status"] == "skipped" and doc["cause"] == "time"
    assert type(v.to_dict()["status"]) is str and type(v.to_dict()["cause"]) is str
    assert Verification.unchanged().to_dict()["cause"] is None
    with pytest.raises(ValueError):
        Verification("maybe")


def test_issue_32_a_sequence_output_is_not_compared_so_the_verdict_is_partial():
    b = GraphBuilder()
    x = b.input("x", [1, 4, 8, 8])
    y = b.op("Relu", [b.bn(b.conv(x, 4, 4), 4)], name="y")
    s = b.op("SequenceConstruct", [y, b.op("Abs", [y])], name="s")
    model = b.build([y])
    model.graph.output.append(onnx.helper.make_tensor_sequence_value_info(s, onnx.TensorProto.FLOAT, None))
    result = verify.verify_models(model, model)
    assert result.status == "partial" and "s_out" in result.reason and "sequence or map" in result.reason
    assert result.outputs[0].passed and result.outputs[1].not_compared


@pytest.mark.parametrize(("floor", "rounding", "minimum", "named"), [
    (0.0, 4.77e-07, 1e-08, "rounding floor 4.77e-07"),  # the noise floor measured 0: the tolerance is not from it
    (2e-06, 4.77e-07, 1e-08, "onnxruntime noise floor 2e-06"),
    (None, None, 3e-08, "min floor 3e-08"),
    (0.0, None, 3e-08, "min floor 3e-08"),
])
def test_summary_names_the_floor_the_tolerance_came_from(floor, rounding, minimum, named):
    """The verification line says which floor the tolerance is FLOOR_MULTIPLE times: the largest of the three."""
    from onnxfuse.verification.result import OutputDiff, Verification

    effective = max(floor or 0.0, rounding or 0.0, minimum)
    out = OutputDiff("y", "float32", [1, 4], 1e-07, 0.01, 1.0, floor, rounding, minimum, FLOOR_MULTIPLE * effective,
                     0.0, FLOOR_MULTIPLE * effective, 1e-07, 0, True)
    summary = Verification("passed", outputs=[out], seeds=[0]).summary
    assert f"tolerance {FLOOR_MULTIPLE * effective:.3g} (from the {named});" in summary


def test_a_skipped_verification_prints_onnxruntime_s_error_once(tmp_path):
    """A model onnxruntime cannot run on the generated inputs: optimize and verify print onnxruntime's (long)
    message once, on the result's verification line; the NOT VERIFIED first line, the warning and verify's error
    point to it."""
    b = GraphBuilder()
    x = b.input("x", ["N", 3, 8, 8])
    y = b.op("Relu", [b.conv(x, 3, 4)])
    path = save(tmp_path, b.build(b.op("Reshape", [y, b.const(np.array([5, -1], np.int64))])))
    out = tmp_path / "o.onnx"
    result = invoke("optimize", path, out, "--target", "cpu")
    assert result.exit_code == 0, result.output
    message = "while running Reshape node"
    assert result.output.count(message) == 1
    assert next(ln for ln in result.stdout.splitlines() if message in ln).startswith("verification: skipped (")
    assert result.stdout.startswith("NOT VERIFIED") and "warning: NOT VERIFIED" in result.stderr
    checked = invoke("verify", path, out)
    assert checked.exit_code == 2 and checked.output.count(message) == 1 and message in checked.stdout
