"""The committed sample models: the generated ones are exactly what sample_models/make_samples.py makes, and the
one third-party model (silero_vad_16k_op15.onnx, see sample_models/README.md) is optimized and verified on every
run of the default suite, so that it always covers a real model."""

import collections
import hashlib
import importlib.util
import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from onnxfuse.cli.main import main
from tests.conftest import REPO

SAMPLES = REPO / "sample_models"
#: Third-party files in sample_models/, not made by make_samples.py: name -> sha256 (as in sample_models/README.md).
THIRD_PARTY = {"silero_vad_16k_op15.onnx": "7ed98ddbad84ccac4cd0aeb3099049280713df825c610a8ed34543318f1b2c49"}


def _generated() -> dict[str, onnx.ModelProto]:
    spec = importlib.util.spec_from_file_location("make_samples", SAMPLES / "make_samples.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.all_models()


def test_samples_are_up_to_date():
    models = _generated()
    assert len(models) == 11
    for name, model in models.items():
        path = SAMPLES / name
        assert path.exists(), name
        assert path.read_bytes() == model.SerializeToString(deterministic=True), f"{name} is stale: rerun the script"
        assert path.stat().st_size < 100_000


def test_mlp_head_is_folded_for_onnx_and_fused_for_cpu():
    """sample_models/mlp_head.onnx: conv backbone + BN -> Flatten -> Gemm -> BN -> Relu -> Gemm head. With
    --target onnx every BatchNormalization is folded (the head's two into the first Gemm); with --target cpu the
    first Gemm and its Relu also become one FusedGemm. Both verify in onnxruntime and save bytes."""
    import onnxfuse

    path = SAMPLES / "mlp_head.onnx"
    expected = {
        "onnx": {"Conv": 2, "Relu": 3, "GlobalAveragePool": 1, "Flatten": 1, "Gemm": 2},
        "cpu": {"com.microsoft::FusedConv": 2, "GlobalAveragePool": 1, "Flatten": 1,
                "com.microsoft::FusedGemm": 1, "Gemm": 1},
    }
    for target, ops in expected.items():
        result = onnxfuse.optimize(path, target=target)
        report = result.report
        assert report.verification.status == "passed"
        assert report.op_counts["after"] == dict(sorted(ops.items()))
        (head,) = [row for row in report.fusions if row["node"] == "head.fc1"]
        assert [r["op"] for r in head["replaced"]] == ["BatchNormalization", "Gemm", "BatchNormalization"] + (
            ["Relu"] if target == "cpu" else [])
        assert head["op"] == ("FusedGemm" if target == "cpu" else "Gemm")
        assert head["saved_bytes"] > 0
        assert report.totals["saved_bytes"] == sum(row["saved_bytes"] for row in report.fusions)
        # what stays unfused on onnx is each Relu, which only a contrib op could take
        assert {row["reason"] for row in report.unfused} == ({"target-allows-no-contrib-ops"} if target == "onnx"
                                                             else set())
        assert not onnxfuse.optimize(result.model, target=target).changed  # optimizing its own output: no-op


def test_every_sample_is_generated_or_a_documented_third_party_file():
    generated = set(_generated())
    assert not generated & set(THIRD_PARTY)
    assert {p.name for p in SAMPLES.glob("*.onnx")} == generated | set(THIRD_PARTY)
    readme = (SAMPLES / "README.md").read_text()
    for name, sha256 in THIRD_PARTY.items():
        assert hashlib.sha256((SAMPLES / name).read_bytes()).hexdigest() == sha256, f"{name} was changed"
        assert name in readme and sha256 in readme
    assert "Copyright (c) 2020-present Silero Team" in readme and "PyPI" in readme


def _fused_activations(model: onnx.ModelProto) -> dict[str, int]:
    """FusedConv nodes by activation, over the main graph and every subgraph body."""
    def nodes(graph):
        for n in graph.node:
            yield n
            for a in n.attribute:
                for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                    yield from nodes(sub)

    return dict(collections.Counter(
        next((a.s.decode() for a in n.attribute if a.name == "activation"), "") for n in nodes(model.graph)
        if n.op_type == "FusedConv"))


# Silero VAD has Conv->Relu x4 and one Conv->Sigmoid (sample_models/README.md); onnxruntime 1.32's own optimizer
# makes 5 FusedConv from them at ORT_ENABLE_EXTENDED. cpu+cuda fuses only Relu and says why the Sigmoid is left.
@pytest.mark.parametrize(("target_args", "fused", "unfused"), [
    ((), {"Relu": 4}, ["activation-not-supported-by-target"]),
    (("--target", "cpu"), {"Relu": 4, "Sigmoid": 1}, []),
])
def test_silero_vad_is_optimized_and_verified(tmp_path, target_args, fused, unfused):
    src = SAMPLES / "silero_vad_16k_op15.onnx"
    before = src.read_bytes()
    data = tmp_path / "inputs.npz"
    np.savez(data, sr=np.array(16000, dtype=np.int64))  # the sample rate the model's users feed
    out, report = tmp_path / "out.onnx", tmp_path / "report.json"
    result = CliRunner().invoke(main, ["optimize", str(src), str(out), *target_args, "--input-shape", "input=1x512",
                                       "--input-data", str(data), "--require-verify", "--report", str(report)])
    assert result.exit_code == 0, result.output
    assert src.read_bytes() == before
    rep = json.loads(report.read_text())
    assert rep["verification"]["status"] == "passed"
    assert rep["unknown_shapes"] == []
    assert [u["reason"] for u in rep["unfused"]] == unfused
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)
    assert _fused_activations(model) == fused
    assert rep["totals"]["saved_bytes"] > 0
