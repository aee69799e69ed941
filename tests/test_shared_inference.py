"""The load's strict shape check and the analysis share one skeleton and one shape inference
(``onnxfuse.model.io.checked_shapes``, ``LoadedModel.shape_inference``): what the analysis reads from it is what
its own inference gives, and the report does not change."""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from onnxfuse import pipeline
from onnxfuse.analysis import shapes
from onnxfuse.errors import InputError
from onnxfuse.model import io as model_io
from onnxfuse.model import proto

SAMPLES = Path(__file__).resolve().parents[1] / "sample_models"
SHARED = Path(os.environ.get("ONNXFUSE_MODELS_DIR", "/nonexistent"))
MODELS = sorted(SAMPLES.glob("*.onnx")) + (sorted(SHARED.glob("*.onnx")) if SHARED.is_dir() else [])


def _own_inference(loaded: model_io.LoadedModel):
    skel = proto.skeleton(loaded.model)
    return skel, shapes.infer(skel)


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.name)
def test_shared_inference_equals_own_inference(path):
    loaded = model_io.load_model(path)
    assert loaded.shape_inference is not None
    skel, inferred = loaded.shape_inference
    own_skel, own = _own_inference(loaded)
    assert skel.SerializeToString(deterministic=True) == own_skel.SerializeToString(deterministic=True)
    assert shapes.inferred_info(inferred) == own
    # the strict check without data propagation (the check as it was) passes on every model it accepts
    onnx.shape_inference.infer_shapes(skel, check_type=True, strict_mode=True)


def _report(path, loaded: model_io.LoadedModel, options: pipeline.Options) -> dict:
    doc = pipeline.analyse(path, options, loaded).report.to_dict()
    doc.pop("timings", None)
    return doc


@pytest.mark.parametrize("name", ["resnet_block.onnx", "mlp_head.onnx", "silero_vad_16k_op15.onnx"])
def test_shared_inference_same_report(name):
    path = SAMPLES / name
    options = pipeline.Options(compare_with_onnxruntime=False)
    shared = model_io.load_model(path)
    assert shared.shape_inference is not None
    own = model_io.load_model(path)
    own.shape_inference = None  # analyse makes and infers its own skeleton, as it did before sharing
    assert _report(path, shared, options) == _report(path, own, options)


def _with_declared_contradiction() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    stale = helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, 5])  # Relu of 1x4 is 1x4
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["t"], name="r"),
                               helper.make_node("Relu", ["t"], ["y"], name="s")], "g", [x], [y], value_info=[stale])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_shared_inference_not_kept_for_declared_contradiction(tmp_path):
    path = tmp_path / "stale.onnx"
    onnx.save(_with_declared_contradiction(), path)
    loaded = model_io.load_model(path)
    assert loaded.shape_inference is None
    assert any("declares shapes that its operators contradict" in w for w in loaded.warnings)
    result = pipeline.analyse(path, pipeline.Options(compare_with_onnxruntime=False), loaded)
    assert result.report.to_dict()["model"]["path"].endswith("stale.onnx")


def test_shared_inference_not_kept_with_external_data(tmp_path):
    src = model_io.load_model(SAMPLES / "resnet_block.onnx").model
    path = tmp_path / "ext.onnx"
    onnx.save(src, path, save_as_external_data=True, all_tensors_to_one_file=True, location="ext.data",
              size_threshold=0)
    loaded = model_io.load_model(path)
    assert loaded.external_data
    assert loaded.shape_inference is None


def test_shared_inference_falls_back_when_data_propagation_fails(monkeypatch):
    """A model whose strict check fails only with data propagation is checked as before (without it) and
    accepted; the analysis then runs its own inference."""
    real = onnx.shape_inference.infer_shapes

    def failing_with_data_prop(model, check_type=False, strict_mode=False, data_prop=False):
        if strict_mode and data_prop:
            raise onnx.shape_inference.InferenceError("injected: data propagation found a contradiction")
        return real(model, check_type=check_type, strict_mode=strict_mode, data_prop=data_prop)

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", failing_with_data_prop)
    path = SAMPLES / "resnet_block.onnx"
    loaded = model_io.load_model(path)
    assert loaded.shape_inference is None and loaded.warnings == []
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", real)
    options = pipeline.Options(compare_with_onnxruntime=False)
    assert _report(path, loaded, options) == _report(path, model_io.load_model(path), options)


def test_shared_inference_rejects_as_before(tmp_path):
    """A model that strict inference rejects without data propagation is still refused with onnx's message."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * 4)
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 3, 3, 3], [0.0] * 108)
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="c", strides=[0, 1])
    model = helper.make_model(helper.make_graph([node], "g", [x], [y], [w]),
                              opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "bad.onnx"
    onnx.save(model, path)
    with pytest.raises(InputError, match="full_check"):
        model_io.load_model(path)
