"""gemm_activation: Gemm -> activation => com.microsoft::FusedGemm (target cpu only).

Numerics: original and optimized run in onnxruntime at ORT_DISABLE_ALL (conftest.assert_same_outputs) with
rtol=1e-4, atol=1e-5 (conftest.RTOL/ATOL). Each activation of providers.FUSED_GEMM_ACTIVATIONS is run with
non-default parameters and with ONNX defaults, so a wrong attribute name or a missing default (the kernel has
none) fails here. The input is scaled by 3 so that every activation's bends (thresholds, saturation) are hit.
Shapes: A is [M=3, K=5], B is [K, N=4], Y is [3, 4].
"""

import numpy as np
import onnx
import pytest

from onnxfuse.ort.providers import FUSED_GEMM_ACTIVATIONS, TARGETS
from onnxfuse.records import Reason
from tests.builders import GraphBuilder
from tests.conftest import ATOL, RTOL, attr, op_counts, run
from tests.conftest import assert_skipped as check_skipped

PASS = "gemm_activation"
M, K, N = 3, 5, 4

#: activation -> non-default ONNX attributes
NON_DEFAULT = {
    "LeakyRelu": {"alpha": 0.2},
    "HardSigmoid": {"alpha": 0.3, "beta": 0.4},
    "Elu": {"alpha": 0.7},
    "Celu": {"alpha": 0.8},
    "ThresholdedRelu": {"alpha": 0.5},
    "Selu": {"alpha": 1.5, "gamma": 1.2},
}


def gemm_act(op, attrs=None, dtype=np.float32, opset=17, **gemm_args):
    b = GraphBuilder(dtype=dtype)
    g = b.gemm(b.input("x", [M, K]), K, N, **gemm_args)
    return b.build(b.op(op, [g], **(attrs or {})), opset=opset)


def assert_same(original, optimized):
    for seed in (0, 1):
        x = (np.random.default_rng(seed).standard_normal((M, K)) * 3).astype(np.float32)
        np.testing.assert_allclose(run(optimized, {"x": x})[0], run(original, {"x": x})[0], rtol=RTOL, atol=ATOL)


def assert_skipped(result, model, reason):
    return check_skipped(result, model, reason, PASS)


# --------------------------------------------------------------------------------------------------------------
# Positives


@pytest.mark.parametrize("defaults", [True, False])
@pytest.mark.parametrize("op", sorted(FUSED_GEMM_ACTIVATIONS))
def test_every_activation_matches_gemm_then_activation(fuse, op, defaults):
    attrs = {} if defaults else NON_DEFAULT.get(op, {})
    model = gemm_act(op, attrs, trans_b=True, alpha=0.5, beta=2.0)
    result = fuse(model, target="cpu")
    assert op_counts(result.model) == {"FusedGemm": 1}
    (node,) = result.model.graph.node
    assert node.domain == "com.microsoft" and attr(node, "activation") == op.encode()
    for onnx_name, fused_name, default in FUSED_GEMM_ACTIVATIONS[op]:
        assert attr(node, fused_name) == pytest.approx(attrs.get(onnx_name, default))
    assert attr(node, "alpha") == 0.5 and attr(node, "beta") == 2.0 and attr(node, "transB") == 1
    assert_same(model, result.model)


def test_gemm_without_c(fuse):
    model = gemm_act("Relu", bias=False)
    result = fuse(model)
    assert op_counts(result.model) == {"FusedGemm": 1}
    assert len(result.model.graph.node[0].input) == 2
    assert_same(model, result.model)


def test_weights_computed_at_run_time_still_fuse(fuse):
    b = GraphBuilder()
    g = b.gemm(b.input("x", [M, K]), K, N, weight=b.op("Identity", [b.const(b.rand(K, N))]))
    model = b.build(b.op("Tanh", [g]))
    result = fuse(model, skip=("constant_fold", "remove_redundant"))  # they would make the weight a constant
    assert op_counts(result.model) == {"FusedGemm": 1, "Identity": 1}
    assert_same(model, result.model)


def test_com_microsoft_opset_1_is_imported_and_the_model_checks(fuse):
    result = fuse(gemm_act("Relu"))
    assert {(o.domain, o.version) for o in result.model.opset_import} == {("", 17), ("com.microsoft", 1)}
    onnx.checker.check_model(result.model)


def test_only_target_cpu_has_fused_gemm():
    assert [name for name, t in TARGETS.items() if t.fused_gemm] == ["cpu"]


# --------------------------------------------------------------------------------------------------------------
# Skips: one test per reason in GemmActivation.reasons


def test_skip_intermediate_has_other_consumers(fuse):
    b = GraphBuilder()
    g = b.gemm(b.input("x", [M, K]), K, N)
    model = b.build([b.op("Relu", [g]), b.op("Sigmoid", [g])])
    result = fuse(model)
    assert op_counts(result.model) == op_counts(model)
    assert {s.reason for s in result.skips} == {Reason.NOT_PRIVATE}


def test_skip_intermediate_is_graph_output(fuse):
    b = GraphBuilder()
    g = b.gemm(b.input("x", [M, K]), K, N)
    model = b.build([b.op("Relu", [g]), g])
    assert_skipped(fuse(model), model, Reason.GRAPH_OUTPUT)


def test_skip_target_allows_no_contrib_ops(fuse):
    model = gemm_act("Relu")
    s = assert_skipped(fuse(model, target="onnx"), model, Reason.NO_CONTRIB_OPS)
    assert "onnx" in s.detail


@pytest.mark.parametrize("target", ["cpu+cuda", "cuda"])
def test_skip_activation_not_supported_by_target_on_cuda_targets(fuse, target):
    model = gemm_act("Relu")
    s = assert_skipped(fuse(model, target=target), model, Reason.ACTIVATION_UNSUPPORTED)
    assert target in s.detail


@pytest.mark.parametrize("op", ["Clip", "HardSwish"])
def test_skip_activation_not_supported_by_target(fuse, op):
    # the CPU kernel's functor list has neither ("unknown kernel type")
    model = gemm_act(op)
    s = assert_skipped(fuse(model, target="cpu"), model, Reason.ACTIVATION_UNSUPPORTED)
    assert op in s.detail


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_skip_dtype_has_no_fusedgemm_kernel(fuse, dtype):
    model = gemm_act("Relu", dtype=dtype)
    s = assert_skipped(fuse(model, target="cpu"), model, Reason.DTYPE_NO_FUSED_GEMM)
    assert np.dtype(dtype).name in s.detail


def test_skip_quantized_gemm(fuse):
    b = GraphBuilder()
    model = b.build(b.op("Relu", [b.gemm(b.dequantized(b.input("x", [M, K])), K, N)]))
    assert_skipped(fuse(model), model, Reason.QDQ_GEMM)


def test_reoptimizing_a_fused_gemm_for_another_target_warns(fuse):
    fused = fuse(gemm_act("Relu"), target="cpu").model
    assert fuse(fused, target="cpu").report.warnings == []
    (warning,) = fuse(fused, target="cpu+cuda").report.warnings
    assert warning.startswith("the model holds 1 FusedGemm node(s) with Relu that target cpu+cuda cannot run")


def test_skip_form_needs_newer_onnxruntime(fuse, monkeypatch):
    """Every probed release loads every FusedGemm form; a made-up rule (FusedGemm(Tanh) from 1.40) shows the
    check: a model for 1.32 keeps Gemm -> Tanh, one for 1.40 gets the FusedGemm."""
    from types import MappingProxyType

    from onnxfuse.ort import providers

    monkeypatch.setattr(providers, "FORM_MIN_ORT", MappingProxyType({"FusedGemm(Tanh)": (1, 40)}))
    model = gemm_act("Tanh")
    s = assert_skipped(fuse(model, ort_version="1.32"), model, Reason.NEEDS_NEWER_ORT)
    assert "FusedGemm(Tanh) needs onnxruntime 1.40 or newer; the model is for 1.32" in s.detail
    assert op_counts(fuse(model, ort_version="1.40").model) == {"FusedGemm": 1}
