"""Placeholder dims: ``?`` (paddle2onnx writes ``[-1, 3, '?', '?']``), ``-1`` as text, ``None`` and blank names
are anonymous dims, each its own symbol, in optimize, report, verify and bench; a real name (``batch``,
tf2onnx's ``unk__N``) still gives one size wherever it appears.

Numerics: the optimized model (Conv + BatchNormalization + Relu fused) is verified by onnxfuse's own verification
at its default tolerance; the direct comparison runs onnxruntime at ORT_DISABLE_ALL with rtol=1e-4, atol=1e-5
(conftest.RTOL/ATOL).
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import sympy
from click.testing import CliRunner

from onnxfuse.analysis import shapes, symbolic
from onnxfuse.bench import invented_inputs
from onnxfuse.cli.main import main
from onnxfuse.model import proto
from onnxfuse.ort import sessions as runtime
from tests.builders import GraphBuilder
from tests.conftest import ATOL, RTOL, run


def paddle_like(batch="-1", extra: list | None = None) -> onnx.ModelProto:
    """x [batch, 3, '?', '?'] -> Conv(3 -> 4, 3x3, pad 1) -> BatchNormalization -> Relu; ``extra`` adds an input
    ``z`` of that shape whose Relu is a second output."""
    b = GraphBuilder()
    x = b.input("x", [batch, 3, "?", "?"])
    outputs = [b.op("Relu", [b.bn(b.conv(x, 3, 4), 4)])]
    if extra is not None:
        outputs.append(b.op("Relu", [b.input("z", extra)]))
    model = b.build(outputs)
    onnx.checker.check_model(model, full_check=True)
    return model


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.mark.parametrize("text, placeholder", [
    ("?", True), ("-1", True), ("0", True), (" ", True), ("", True), (None, True), ("None", True),
    ("batch", False), ("unk__12", False), ("p2o.DynamicDimension.0", False), ("N", False), ("s0", False)])
def test_which_dim_params_are_placeholders(text, placeholder):
    assert proto.is_placeholder_dim(text) is placeholder


@pytest.mark.parametrize("batch", ["-1", "?"])
def test_question_mark_dims_are_each_their_own_symbol(batch):
    model = paddle_like(batch)
    assert shapes.complete_input_shapes(model, {"x": (1, 3, 48, 192)}) == {"x": (1, 3, 48, 192)}
    table = symbolic.symbol_table(model)
    assert len(table.symbols) == 3 and len(set(table.dims.values())) == 3
    skel = proto.skeleton(model)
    assert [d.dim_param for d in skel.graph.input[0].type.tensor_type.shape.dim] == ["", "", "", ""]
    assert symbolic.symbol_table(skel).dims == table.dims


def test_named_dims_still_share_one_size():
    b = GraphBuilder()
    model = b.build(b.op("Add", [b.input("x", ["unk__3", 4]), b.input("s", [2, "unk__3", 4])]))
    with pytest.raises(Exception, match="gives dim 'unk__3'"):
        shapes.complete_input_shapes(model, {"x": (1, 4), "s": (2, 3, 4)})


def test_optimize_with_input_shape_fuses_and_verifies(tmp_path):
    # was: exit 2, "gives dim '?' (axis 3) the size 192, but ... gives it 48"
    model = paddle_like()
    src, out, rep = tmp_path / "m.onnx", tmp_path / "o.onnx", tmp_path / "r.json"
    onnx.save(model, str(src))
    result = invoke("optimize", src, out, "--input-shape", "x=1x3x48x192", "--report", rep)
    assert result.exit_code == 0, result.output
    optimized = onnx.load(str(out))
    onnx.checker.check_model(optimized, full_check=True)
    assert [n.op_type for n in optimized.graph.node] == ["FusedConv"]
    doc = json.loads(rep.read_text())
    assert doc["input_shapes"] == {"x": [1, 3, 48, 192]}
    assert doc["verification"]["status"] == "passed"
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 3, 48, 192)).astype(np.float32)}
    np.testing.assert_allclose(run(optimized, feeds)[0], run(model, feeds)[0], rtol=RTOL, atol=ATOL)


def test_report_with_input_shape_counts_the_given_sizes(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(paddle_like(), str(src))
    result = invoke("report", src, "--input-shape", "x=1x3x48x192", "--format", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["input_shapes"] == {"x": [1, 3, 48, 192]}
    # every dim given: counted at those sizes (no symbols), every node sized
    assert doc["symbols"] == {} and doc["totals"]["before"]["unknown_nodes"] == 0
    assert doc["totals"]["before"]["total_bytes"] > 0
    # the symbolic report (no sizes) has one symbol per '?' dim, and its figures at those sizes are the same
    symbolic = json.loads(invoke("report", src, "--format", "json").output)
    assert sorted(v["axis"] for v in symbolic["symbols"].values()) == [0, 2, 3]
    values = dict(zip(sorted(symbolic["symbols"], key=lambda k: symbolic["symbols"][k]["axis"]), (1, 48, 192),
                      strict=True))
    total = sympy.sympify(symbolic["totals"]["before"]["total_bytes_expr"])
    assert int(total.subs({sympy.Symbol(k): v for k, v in values.items()})) == doc["totals"]["before"]["total_bytes"]


def test_verify_with_input_shape(tmp_path):
    # z's '?' dims took x's first '?' size (48) when '?' was one symbol
    model = paddle_like(extra=["?", "?"])
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(model, str(src))
    assert invoke("optimize", src, out, "--no-verify").exit_code == 0
    result = invoke("verify", src, out, "--input-shape", "x=1x3x48x192", "--format", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["input_shapes"] == {
        "x": [1, 3, 48, 192], "z": [runtime.DEFAULT_BATCH_DIM, runtime.DEFAULT_OTHER_DIM]}


def test_generated_inputs_give_placeholders_sizes_of_their_own():
    # x's '?' dims are 48 and 192; z's '?' dims bind to neither and get the defaults
    model = paddle_like(extra=["?", "?"])
    sess = runtime.session(model.SerializeToString())
    feeds = runtime.make_inputs(sess, {"x": (1, 3, 48, 192)}, seed=0)
    assert feeds["x"].shape == (1, 3, 48, 192)
    assert feeds["z"].shape == (runtime.DEFAULT_BATCH_DIM, runtime.DEFAULT_OTHER_DIM)
    assert invented_inputs(sess, {"x": (1, 3, 48, 192)}, None) == ["z"]
    alone = runtime.make_inputs(runtime.session(paddle_like("?").SerializeToString()), {}, seed=0)
    assert alone["x"].shape == (runtime.DEFAULT_BATCH_DIM, 3, runtime.DEFAULT_OTHER_DIM, runtime.DEFAULT_OTHER_DIM)
