"""Verification (issue 5): onnxruntime at ORT_DISABLE_ALL on both sides, per-dtype tolerances, a broken rewrite
is caught (exit 1, nothing written, the differing output named), skipped is never reported as passed."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from onnxfuse import verification as verify
from onnxfuse.cli import main
from onnxfuse.passes.conv_batchnorm import ConvBatchNorm
from tests.builders import GraphBuilder
from tests.conftest import REPO

SAMPLE = REPO / "sample_models" / "resnet_block.onnx"


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def save(tmp_path, model, name="m.onnx"):
    path = tmp_path / name
    onnx.save(model, str(path))
    return path


def test_injected_wrong_rewrite_is_caught(tmp_path, monkeypatch):
    real = ConvBatchNorm.rewrite

    def broken(self, match, ctx):
        match.bias = match.bias + 0.5  # a wrong fold: the folded bias is off
        return real(self, match, ctx)

    monkeypatch.setattr(ConvBatchNorm, "rewrite", broken)
    out = tmp_path / "o.onnx"
    result = invoke("optimize", SAMPLE, out, "--target", "cpu", "--report", tmp_path / "r.json")
    assert result.exit_code == 1
    assert not out.exists()
    assert "relu2_out" in result.output and "does not match" in result.output
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
    result = verify.verify(path, wrong, verify.VerifyOptions())
    assert result.status == "failed"
    sess = verify.session(str(path))
    assert sess.get_session_options().graph_optimization_level.name == "ORT_DISABLE_ALL"


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
    assert doc["outputs"][2]["dtype"] == "bool" and doc["outputs"][2]["atol"] == 0.0


def test_float16_model_uses_float16_tolerance(tmp_path):
    b = GraphBuilder(dtype=np.float16)
    x = b.input("x", [1, 8, 16, 16])
    model = b.build(b.op("Relu", [b.bn(b.conv(x, 8, 8), 8)]))
    path = save(tmp_path, model)
    result = verify.verify(path, model, verify.VerifyOptions())
    assert result.status == "passed"
    assert result.outputs[0].dtype == "float16"
    assert (result.outputs[0].rtol, result.outputs[0].atol) == verify.DEFAULT_TOLERANCES["float16"]
    assert verify.DEFAULT_TOLERANCES["float32"][0] < verify.DEFAULT_TOLERANCES["float16"][0]


def test_several_seeds_are_used():
    assert len(verify.DEFAULT_SEEDS) >= 3


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
    assert v["status"] == "skipped" and "--input-shape" in v["reason"] and "N" not in v.get("status")
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
    result = invoke("optimize", SAMPLE, tmp_path / "o.onnx", "--input-data", npz, "--report", tmp_path / "r.json")
    assert result.exit_code == 0
    assert json.loads((tmp_path / "r.json").read_text())["verification"]["seeds"] == [0]
    np.savez(npz, nosuch=np.ones(3, np.float32))
    result = invoke("optimize", SAMPLE, tmp_path / "o2.onnx", "--input-data", npz)
    assert result.exit_code == 2 and "no graph input named nosuch" in result.output


def test_tolerance_override_and_needed_atol():
    ref = np.array([1.0, 2.0, 3.0], np.float32)
    got = ref + np.array([0.0, 0.01, 0.0], np.float32)
    d = verify._compare("y", ref, got, verify.VerifyOptions(rtol=0.0, atol=1e-3))
    assert not d.passed and d.max_abs_error == pytest.approx(0.01, rel=1e-3)
    assert d.needed_atol == pytest.approx(0.01, rel=1e-3)
    assert verify._compare("y", ref, got, verify.VerifyOptions(rtol=0.0, atol=0.02)).passed
    nan = np.array([np.nan, 1.0], np.float32)
    assert verify._compare("y", nan, nan.copy(), verify.VerifyOptions()).passed


def test_input_data_of_the_wrong_dtype_is_a_usage_error(tmp_path):
    npz = tmp_path / "in.npz"
    np.savez(npz, x=np.ones((1, 8, 16, 16), np.float64))
    result = invoke("optimize", SAMPLE, tmp_path / "o.onnx", "--input-data", npz)
    assert result.exit_code == 2 and "dtype float64" in result.output
    assert not (tmp_path / "o.onnx").exists()


def test_one_value_per_symbolic_dim_name():
    b = GraphBuilder()
    x = b.input("x", ["batch", 4])
    s = b.input("s", [2, "batch", 3])
    model = b.build([b.op("Relu", [x]), b.op("Relu", [s])])
    sess = verify.session(model.SerializeToString())
    feeds = verify.make_inputs(sess, {}, seed=0)
    assert feeds["x"].shape == (1, 4) and feeds["s"].shape == (2, 1, 3)
    feeds = verify.make_inputs(sess, {"x": (5, 4)}, seed=0)
    assert feeds["s"].shape == (2, 5, 3)


def test_models_over_the_protobuf_limit_are_verified_through_external_data(tmp_path, monkeypatch):
    from onnxfuse import model_io as g

    monkeypatch.setattr(g, "PROTOBUF_LIMIT_BYTES", 1000)  # the sample is ~5 KB: take the > 2 GB path
    out = tmp_path / "o.onnx"
    result = invoke("optimize", SAMPLE, out, "--target", "cpu", "--report", tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "r.json").read_text())["verification"]["status"] == "passed"
    assert (tmp_path / "o.onnx.data").exists()  # saved with external data, and the weights were all there
    onnx.checker.check_model(str(out))
    assert verify.session(str(out)) is not None
