"""The committed sample models are exactly what sample_models/make_samples.py makes."""

import importlib.util

from tests.conftest import REPO


def test_samples_are_up_to_date():
    spec = importlib.util.spec_from_file_location("make_samples", REPO / "sample_models" / "make_samples.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    models = module.all_models()
    assert len(models) == 11
    for name, model in models.items():
        path = REPO / "sample_models" / name
        assert path.exists(), name
        assert path.read_bytes() == model.SerializeToString(deterministic=True), f"{name} is stale: rerun the script"
        assert path.stat().st_size < 100_000


def test_mlp_head_is_folded_for_onnx_and_fused_for_cpu():
    """sample_models/mlp_head.onnx: conv backbone + BN -> Flatten -> Gemm -> BN -> Relu -> Gemm head. With
    --target onnx every BatchNormalization is folded (the head's two into the first Gemm); with --target cpu the
    first Gemm and its Relu also become one FusedGemm. Both verify in onnxruntime and save bytes."""
    import onnxfuse

    path = REPO / "sample_models" / "mlp_head.onnx"
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
