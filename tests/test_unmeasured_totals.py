"""Issue 33, part 3: a total that was not measured is unknown, never 0 B, in every figure; Pad with an ``axes``
input (ONNX Pad-18 and later) on a symbolic batch is measured, through ``optimize`` and ``report``."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import sympy
from click.testing import CliRunner

from onnxfuse.analysis import symbolic
from onnxfuse.cli.main import main
from tests.builders import GraphBuilder
from tests.conftest import op_counts, run
from tests.test_report import validate


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def pad_axes_conv(opset: int, axes=(2, 3), pads=(1, 1, 1, 1)) -> onnx.ModelProto:
    """``X[N,32,14,16] -> Pad(X, pads, value 0, axes) -> Conv 3x3 (no pads)``."""
    b = GraphBuilder()
    x = b.input("x", ["N", 32, 14, 16])
    p = b.op("Pad", [x, b.const(np.array(pads, np.int64)), b.const(np.array(0, np.float32)),
                     b.const(np.array(axes, np.int64))])
    return b.build(b.conv(p, 32, 8, 3, pads=[0, 0, 0, 0]), opset=opset)


def pad_out_elems(axes, pads, shape=(1, 32, 14, 16)) -> int:
    dims, n = list(shape), len(axes)
    for i, a in enumerate(axes):
        dims[a] += pads[i] + pads[i + n]
    return int(np.prod(dims))


@pytest.mark.parametrize("opset", [18, 19, 20, 21])
@pytest.mark.parametrize("axes,pads", [((2, 3), (1, 1, 1, 1)), ((-1, -2), (2, 0, 1, 1)), ((3,), (0, 2))])
def test_pad_with_axes_on_a_symbolic_batch_is_measured_through_optimize_and_report(tmp_path, opset, axes, pads):
    model = pad_axes_conv(opset, axes, pads)
    src, dst, doc = tmp_path / "in.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save(model, src)
    result = invoke("optimize", src, dst, "--report", doc)
    assert result.exit_code == 0, result.output
    out = onnx.load(dst)
    assert op_counts(out)["Pad"] == 0  # the zero Pad went into the Conv's pads
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 32, 14, 16)).astype(np.float32)}
    np.testing.assert_allclose(run(out, feeds)[0], run(model, feeds)[0], rtol=1e-4, atol=1e-5)
    for args in ((), ("--input-shape", "x=3,32,14,16")):
        result = invoke("report", src, "--format", "json", *args)
        assert result.exit_code == 0, result.output
        t = json.loads(result.output)["totals"]
        assert t["before"]["unknown_nodes"] == 0 and t["after"]["unknown_nodes"] == 0
        batch = 3 if args else 1
        # Pad reads X and writes its padded output, the Conv reads that: at N=batch, float32
        pad_out = 4 * batch * pad_out_elems([a % 4 for a in axes], pads)
        consts = 8 * len(pads) + 4 + 8 * len(axes)
        x_bytes = 4 * batch * 32 * 14 * 16
        before = t["before"]["total_bytes"] if args else t["at_batch_1"]["before_total_bytes"]
        after = t["after"]["total_bytes"] if args else t["at_batch_1"]["after_total_bytes"]
        conv_rest = after - x_bytes  # weights, bias and output of the Conv: the same on both sides
        assert before == x_bytes + consts + 2 * pad_out + conv_rest
        if not args:
            assert t["saved_percent_as_dims_grow"] is not None and t["saved_percent_as_dims_grow"] > 0


def test_a_side_with_no_measured_node_has_unknown_totals_not_zero(fuse):
    """Pad whose pads are a graph input: its output size, and every size after it, is unknown on both sides."""
    b = GraphBuilder()
    x = b.input("x", ["N", 4, 8, 8])
    pads = b.input("pads", [8], dtype=np.int64)
    y = b.op("Relu", [b.op("Pad", [x, pads])])
    model = b.build(y, opset=13)
    doc = fuse(model).report.to_dict()
    validate(json.loads(json.dumps(doc)))  # null sums are allowed by report.schema.json
    t = doc["totals"]
    for side in ("before", "after"):
        assert t[side]["unknown_nodes"] == t[side]["nodes"] == 2
        assert t[side]["total_bytes"] is None and t[side]["total_bytes_expr"] is None
        assert t[side]["read_bytes_expr"] is None and t[side]["written_bytes_expr"] is None
    assert t["saved_bytes"] is None and t["saved_bytes_expr"] is None and t["saved_percent"] is None
    assert t["saved_percent_as_dims_grow"] is None
    assert t["at_batch_1"] is None or t["at_batch_1"]["saved_bytes"] is None
    text = fuse(model).report.to_text()
    assert "0 B -> 0 B" not in text and "vs the graph as exported: unknown" in text


def test_growth_share_takes_a_plain_int_side():
    n = symbolic.make_symbol("N")
    assert symbolic.growth_share(sympy.Integer(0) - 4 * n, 0) is None  # a whole of 0 does not grow: no share
    assert symbolic.growth_share(2 * n, 4 * n + 3) == pytest.approx(0.5)
    assert symbolic.growth_share(5, 4 * n) == pytest.approx(0.0, abs=1e-9)
