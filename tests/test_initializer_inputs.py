"""Issue 33, part 1: initializers listed as graph inputs follow onnxruntime's rule
(``onnxruntime/core/graph/graph.h``, ``Graph::CanOverrideInitializer``: ``ir_version_ >= 4``). Before IR version 4
the ONNX format listed every initializer as a graph input and onnxruntime treats them as constants: onnxfuse folds
and fuses them without options. From IR version 4 a caller may feed them; the refusal names the option that fuses
them (``--constant-initializer-inputs``).

Numerics: original and optimized run in onnxruntime at ORT_DISABLE_ALL (conftest.assert_same_outputs) with
rtol=1e-4, atol=1e-5 (conftest.RTOL/ATOL).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from onnxfuse.cli.main import main
from onnxfuse.model import io as model_io
from onnxfuse.records import Reason
from tests.builders import GraphBuilder
from tests.conftest import assert_same_outputs, op_counts


def old_format(ir_version: int, opset: int) -> onnx.ModelProto:
    """A caffe2/CNTK-era graph: Conv -> BN -> Relu -> Conv -> Mul(per-channel) -> Relu, every initializer also
    listed as a graph input."""
    b = GraphBuilder(seed=3)
    x = b.input("x", [1, 3, 8, 8])
    y = b.op("Relu", [b.bn(b.conv(x, 3, 4), 4)])
    z = b.op("Mul", [b.conv(y, 4, 4), b.const(np.full((4, 1, 1), 0.5, np.float32))])
    out = b.op("Relu", [z])
    return b.build(out, initializers_as_inputs=True, ir_version=ir_version, opset=opset)


@pytest.mark.parametrize("opset", [7, 8, 9])
def test_ir3_initializers_listed_as_inputs_are_constants(fuse, opset):
    model = old_format(3, opset)
    assert model_io.overridable_initializers(model) == frozenset()
    result = fuse(model, target="cpu")
    assert not [s for s in result.skips if s.reason == Reason.INITIALIZER_IS_INPUT]
    ops = op_counts(result.model)
    assert "BatchNormalization" not in ops and "Mul" not in ops and ops["FusedConv"] == 2
    onnx.checker.check_model(result.model, full_check=True)  # IR 3: every new initializer listed as an input
    assert_same_outputs(model, result.model)


def ort_fused_convs(model: onnx.ModelProto, tmp_path) -> int:
    """FusedConv nodes in the graph onnxruntime builds of ``model`` at ORT_ENABLE_EXTENDED (CPU provider)."""
    import onnxruntime as ort

    out = tmp_path / "ort_extended.onnx"
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    opts.optimized_model_filepath = str(out)
    ort.InferenceSession(model.SerializeToString(), sess_options=opts, providers=["CPUExecutionProvider"])
    return op_counts(onnx.load(str(out)))["FusedConv"]


@pytest.mark.parametrize("ir_version", [3, 4])
def test_fuses_at_least_what_onnxruntime_fuses_at_load(fuse, tmp_path, ir_version):
    # IR 3: onnxruntime folds the listed initializers as constants, and so does onnxfuse; IR 4: onnxruntime
    # keeps them overridable too (it fuses the Conv -> Relu of overridable weights, which needs no fold)
    model = old_format(ir_version, 9)
    theirs = ort_fused_convs(model, tmp_path)
    ours = op_counts(fuse(model, target="cpu").model)["FusedConv"]
    assert ours >= theirs
    if ir_version == 3:
        assert theirs == 2  # onnxruntime's own rule: the weights are constants


@pytest.mark.parametrize("ir_version", [4, 7])
def test_overridable_from_ir4_and_the_refusal_names_the_option(fuse, ir_version):
    model = old_format(ir_version, 9)
    names = {t.name for t in model.graph.initializer}
    assert model_io.overridable_initializers(model) == names
    result = fuse(model, target="cpu")
    refused = [s for s in result.skips if s.reason == Reason.INITIALIZER_IS_INPUT]
    assert refused and all("--constant-initializer-inputs" in (s.detail + Reason.INITIALIZER_IS_INPUT.remedy)
                           for s in refused)
    assert "BatchNormalization" in op_counts(result.model)
    fused = fuse(model, target="cpu", constant_initializer_inputs=True)
    assert "BatchNormalization" not in op_counts(fused.model)
    assert_same_outputs(model, fused.model)


def test_cli_on_an_ir3_file_folds_without_options(tmp_path):
    src, dst = tmp_path / "old.onnx", tmp_path / "out.onnx"
    onnx.save(old_format(3, 8), src)
    result = CliRunner().invoke(main, ["optimize", str(src), str(dst), "--target", "cpu"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "initializer-is-graph-input" not in result.output
    assert "BatchNormalization" not in op_counts(onnx.load(dst))
