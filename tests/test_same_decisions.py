"""Issue 33, part 5: one reason per pattern whichever command reports it. ``optimize`` without ``--report``
counts bytes at the given input shapes only (no symbolic expressions), ``report`` counts expressions too; the
passes decide on the model's own shapes either way (``passes.base.Context.own_symbolic``), so both commands make
the same fusions and give the same reasons, scalar inputs included.

Numerics: original and optimized run in onnxruntime at ORT_DISABLE_ALL (conftest.assert_same_outputs) with
rtol=1e-4, atol=1e-5 (conftest.RTOL/ATOL).
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from onnxfuse import pipeline
from onnxfuse.cli.main import main
from tests.builders import GraphBuilder
from tests.conftest import op_counts, run


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def residual_with_scalar_input(second_conv_strided: bool) -> onnx.ModelProto:
    """x [1, 4, h, w] -> Conv 3x3 (same) -> Add(x) -> Relu -> Mul(scalar input s); a second Conv whose output
    is [1, 4, ?, ?] for onnx inference is added to a tensor of another shape when ``second_conv_strided``."""
    b = GraphBuilder(seed=9)
    x = b.input("x", [1, 4, "h", "w"])
    s = b.input("s", [])
    y = b.op("Mul", [b.op("Relu", [b.op("Add", [b.conv(x, 4, 4, 3), x])]), s])
    if second_conv_strided:
        z = b.conv(y, 4, 4, 3, strides=[2, 2])
        y = b.op("Add", [z, b.op("MaxPool", [y], kernel_shape=[2, 2], strides=[2, 2])])
    return b.build(y, opset=13)


def decisions(doc: dict) -> tuple:
    return (sorted((u["pass"], u["reason"], u["output"]) for u in doc["unfused"]),
            sorted((f["op"], f["output"]) for f in doc["fusions"]))


def result_decisions(result) -> tuple:
    return (sorted((s.pass_name, str(s.reason), s.output) for s in result.skips),
            sorted((f.op, f.output) for f in result.fusions))


@pytest.mark.parametrize("strided", [False, True])
def test_counting_at_concrete_shapes_or_as_expressions_makes_the_same_decisions(tmp_path, strided):
    model = residual_with_scalar_input(strided)
    src = tmp_path / "m.onnx"
    onnx.save(model, src)
    got = []
    for expressions in (False, True):  # optimize without --report / report and optimize --report
        opts = pipeline.Options(target="cpu", ort_level="extended", input_shapes={"x": (1, 4, 8, 8)},
                                compare_with_onnxruntime=False)
        opts.expressions = expressions
        got.append(pipeline.analyse(src, opts))
    assert result_decisions(got[0]) == result_decisions(got[1])
    # the residual chain needs the symbolic shapes to prove Z's shape; with the strided pair, onnxruntime's
    # inference assumes h and w equal to other dims, which proves nothing: refused alike in both
    assert op_counts(got[0].model)["FusedConv"] == (0 if strided else 1)


@pytest.mark.parametrize("strided", [False, True])
def test_optimize_and_report_commands_agree(tmp_path, strided):
    model = residual_with_scalar_input(strided)
    src, dst = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(model, src)
    common = ("--target", "cpu", "--ort-level", "extended", "--input-shape", "x=1x4x8x8")
    opt = invoke("optimize", src, dst, *common)
    assert opt.exit_code == 0, opt.output
    rep = invoke("report", src, *common, "--format", "json")
    assert rep.exit_code == 0, rep.output
    unfused, fused = decisions(json.loads(rep.output))
    out = onnx.load(dst)
    assert op_counts(out)["FusedConv"] == len(fused) == (0 if strided else 1)  # what report reports
    for _, reason, _ in unfused:
        assert reason in opt.output
    if not unfused:
        assert "left unfused:" not in opt.output
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 4, 8, 8)).astype(np.float32),
             "s": np.array(0.7, np.float32)}
    np.testing.assert_allclose(run(out, feeds)[0], run(model, feeds)[0], rtol=1e-4, atol=1e-5)
