"""Byte counts pinned by hand on tiny graphs (shared/docs/traffic.md's model: each node reads each distinct
input once, writes each output once; bytes = elements x itemsize; weights read by every consumer)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import sympy
from onnx import TensorProto, helper

from onnxfuse.analysis import shapes, symbolic, traffic
from onnxfuse.model import proto
from onnxfuse.report import present
from onnxfuse.report import text as report_text
from tests.builders import GraphBuilder


def sizes_of(model: onnx.ModelProto) -> traffic.Sizes:
    skel = proto.skeleton(model)
    info, elems = shapes.infer(skel)
    sym = symbolic.infer(skel, info)
    return traffic.Sizes(sym.shapes, {**elems, **sym.elem_types}, sym.reasons).with_model(model)


def rows_of(model: onnx.ModelProto) -> list[traffic.NodeTraffic]:
    return traffic.node_traffic(model, sizes_of(model))


def by_op(rows):
    return {r.op: r for r in rows}


def test_itemsizes():
    assert traffic.itemsize(TensorProto.FLOAT) == 4
    assert traffic.itemsize(TensorProto.FLOAT16) == 2
    assert traffic.itemsize(TensorProto.BFLOAT16) == 2
    assert traffic.itemsize(TensorProto.INT64) == 8
    assert traffic.itemsize(TensorProto.BOOL) == 1
    assert traffic.tensor_bytes((), TensorProto.INT64) == 8
    assert traffic.tensor_bytes((2, "N"), TensorProto.FLOAT) is None


def test_conv_bn_relu_before_and_after(fuse):
    # x [1,4,8,8] f32 = 1024 B; W [8,4,3,3] = 1152 B; output O [1,8,8,8] = 2048 B; BN params 4 x 32 B
    b = GraphBuilder()
    x = b.input("x", [1, 4, 8, 8])
    model = b.build(b.op("Relu", [b.bn(b.conv(x, 4, 8, bias=False), 8)]))
    rows = by_op(rows_of(model))
    assert (rows["Conv"].read_bytes, rows["Conv"].written_bytes) == (1024 + 1152, 2048)
    assert (rows["BatchNormalization"].read_bytes, rows["BatchNormalization"].written_bytes) == (2048 + 128, 2048)
    assert (rows["Relu"].read_bytes, rows["Relu"].written_bytes) == (2048, 2048)
    report = fuse(model).report
    assert report.totals["before"]["total_bytes"] == 4224 + 4224 + 4096
    # FusedConv reads X + W' + the new bias B' (8 x 4 B) and writes O once
    assert report.totals["after"]["total_bytes"] == 1024 + 1152 + 32 + 2048
    # saving = 4 x O (two intermediates written and read) + BN parameters - the bias the fold creates
    assert report.totals["saved_bytes"] == 4 * 2048 + 128 - 32
    [row] = report.fusions
    assert row["saved_bytes"] == report.totals["saved_bytes"]
    assert [r["op"] for r in row["replaced"]] == ["Conv", "BatchNormalization", "Relu"]


def test_classic_conv_bias_add_relu_float16_saves_4_x_output():
    """Conv2D -> bias Add -> ReLU, output H x W x C float16: the fused kernel saves 2 x 2 x H x W x C x 2 bytes."""
    H, W, C = 16, 12, 8
    b = GraphBuilder(dtype=np.float16)
    x = b.input("x", [1, 3, H, W])
    bias = b.const(b.rand(1, C, 1, 1))
    y = b.op("Relu", [b.op("Add", [b.conv(x, 3, C, bias=False), bias])])
    unfused = b.build(y)
    fused = onnx.ModelProto()
    fused.CopyFrom(unfused)
    del fused.graph.node[:]
    conv = unfused.graph.node[0]
    fused.graph.node.append(helper.make_node("FusedConv", [x, conv.input[1], bias], [y], domain="com.microsoft",
                                             activation="Relu", pads=[1, 1, 1, 1]))
    sizes = sizes_of(unfused)
    before = traffic.totals(traffic.node_traffic(unfused, sizes)).total_bytes
    after = traffic.totals(traffic.node_traffic(fused, sizes)).total_bytes
    assert before - after == 2 * 2 * H * W * C * 2 == 12288


def test_node_reading_the_same_tensor_twice_reads_it_once():
    b = GraphBuilder()
    x = b.input("x", [2, 8])
    rows = by_op(rows_of(b.build(b.op("Mul", [x, x]))))
    assert rows["Mul"].read_bytes == 64 and rows["Mul"].written_bytes == 64


def test_shared_weight_is_read_by_each_consumer():
    b = GraphBuilder()
    x = b.input("x", [1, 4, 8, 8])
    w = b.const(b.rand(4, 4, 3, 3))  # 576 B
    y1 = b.conv(x, 4, 4, bias=False, weight=w)
    y2 = b.conv(y1, 4, 4, bias=False, weight=w)
    rows = [r for r in rows_of(b.build(y2)) if r.op == "Conv"]
    assert [r.read_bytes for r in rows] == [1024 + 576, 1024 + 576]


def test_residual_block_with_z_equal_to_x(fuse):
    # Conv(x) + x -> Relu, x [1,4,8,8] = 1024 B, W 576 B, B 16 B. FusedConv(X, W, B, Z=x) reads x once.
    b = GraphBuilder()
    x = b.input("x", [1, 4, 8, 8])
    model = b.build(b.op("Relu", [b.op("Add", [b.conv(x, 4, 4), x])]))
    report = fuse(model, ort_level="extended").report  # no FusedConv with Z at "all" (providers.CPU_SLOWER_AT)
    assert report.totals["before"]["total_bytes"] == (1024 + 576 + 16 + 1024) + (2048 + 1024) + (1024 + 1024)
    assert report.totals["after"]["total_bytes"] == 1024 + 576 + 16 + 1024
    assert report.fusions[0]["saved_bytes"] == 5120


def test_float16_conv_counts_two_bytes_per_element(fuse):
    b = GraphBuilder(dtype=np.float16)
    x = b.input("x", [1, 4, 8, 8])
    model = b.build(b.bn(b.conv(x, 4, 8), 8))
    conv = by_op(rows_of(model))["Conv"]
    assert conv.read_bytes == 512 + 576 + 16 and conv.written_bytes == 1024
    report = fuse(model, skip=("float16_body",)).report  # the float16 body as it is (not run in float32)
    assert report.fusions[0]["dtype"] == "float16"
    # BN folded: BN node (1024 + 4 x 16 read, 1024 written) and one write+read of the intermediate disappear;
    # the folded bias replaces the old one at the same size.
    assert report.totals["saved_bytes"] == 1024 + 64 + 1024


def test_constant_node_moves_nothing():
    b = GraphBuilder(constants="node")
    x = b.input("x", [1, 4, 8, 8])
    rows = rows_of(b.build(b.conv(x, 4, 4)))
    consts = [r for r in rows if r.op == "Constant"]
    assert consts and all(r.total_bytes == 0 for r in consts)
    assert by_op(rows)["Conv"].read_bytes == 1024 + 576 + 16


def expr(text: str) -> sympy.Expr:
    """A report expression string as sympy reads it (plain symbols, as any consumer of the JSON gets them)."""
    return sympy.sympify(text)


N, H, W = sympy.symbols("N_ H W")  # the model names its dims N, H, W; "N" is sympy's N(), so the symbol is N_


def test_symbolic_batch_counts_bytes_per_sample_and_input_shape_evaluates_it(fuse):
    b = GraphBuilder()
    x = b.input("x", ["N", 4, 8, 8])
    model = b.build(b.op("Relu", [b.conv(x, 4, 4)]))
    report = fuse(model).report
    assert report.unknown_shapes == [{"input": "x", "shape": ["N", 4, 8, 8]}]
    assert report.symbols == {"N_": {"input": "x", "axis": 0, "dim_param": "N"}}
    before = report.totals["before"]
    # Conv reads x (1024 B per sample) + W 576 + B 16 and writes 1024 per sample; Relu reads and writes 1024 each
    assert expr(before["total_bytes_expr"]) == 4096 * N + 592
    assert before["unknown_nodes"] == 0 and before["total_bytes"] is None  # no number without a batch size
    assert report.totals["at_batch_1"]["before_total_bytes"] == 4096 + 592
    for expressions in (True, False):  # the symbolic report evaluated at the shape, and the numeric one
        given = fuse(model, input_shapes={"x": (2, 4, 8, 8)}, expressions=expressions).report
        assert given.unknown_shapes == [] and given.totals["before"]["unknown_nodes"] == 0
        assert given.totals["before"]["total_bytes"] == (2048 + 576 + 16 + 2048) + 2 * 2048
        assert given.symbol_values == ({"N_": 2} if expressions else {})


def test_hand_checked_conv3x3_bn_relu_on_symbolic_nchw(fuse):
    """Conv 3x3 pad 1 (3 -> 8 channels, no bias) -> BatchNormalization -> Relu on [N, 3, H, W] float32, written
    out by hand (shared/docs/traffic.md's model):
      Conv  reads x 3*4*N*H*W = 12NHW and W 8*3*3*3*4 = 864, writes 8*4*N*H*W = 32NHW      -> 44NHW + 864
      BN    reads 32NHW and scale, B, mean, var 4 x 8*4 = 128, writes 32NHW             -> 64NHW + 128
      Relu  reads 32NHW, writes 32NHW                                                   -> 64NHW
      before = 172NHW + 992
      FusedConv(Relu) reads x 12NHW, W' 864 and the folded bias B' 8*4 = 32, writes 32NHW -> 44NHW + 896
      saved = 128NHW + 96: two intermediates written and read once each (4 x 32NHW) plus the BN parameters
      less the bias the fold creates; its share of the traffic tends to 128/172 = 74.42% as N*H*W grows."""
    b = GraphBuilder()
    x = b.input("x", ["N", 3, "H", "W"])
    model = b.build(b.op("Relu", [b.bn(b.conv(x, 3, 8, bias=False), 8)]))
    report = fuse(model).report
    t = report.totals
    assert expr(t["before"]["total_bytes_expr"]) == 172 * N * H * W + 992
    assert expr(t["after"]["total_bytes_expr"]) == 44 * N * H * W + 896
    assert expr(t["saved_bytes_expr"]) == 128 * N * H * W + 96
    assert t["saved_percent_as_dims_grow"] == round(100 * 128 / 172, 2)
    [row] = report.fusions
    assert expr(row["saved_bytes_expr"]) == 128 * N * H * W + 96 and row["saved_bytes"] is None
    assert row["shape"] == ["N_", 8, "H", "W"]
    # the same model at a concrete size: the numbers are the expressions there
    at = fuse(model, input_shapes={"x": (2, 3, 16, 12)}).report
    assert at.totals["saved_bytes"] == 128 * 2 * 16 * 12 + 96
    assert at.totals["before"]["total_bytes"] == 172 * 2 * 16 * 12 + 992


def test_strided_conv_output_size_has_floor(fuse):
    """Conv 3x3 stride 2 pad 1 (3 -> 8, with bias) -> Relu: the output is [N, 8, H', W'] with
    H' = floor((H + 2 - 3) / 2) + 1 (ONNX Conv spec); saved = Relu's read and write plus the conv's write
    and read of the intermediate... = 2 x 2 x 32 N H' W' = 64 N H' W' (the conv output is read and written
    once less each way: conv writes, relu reads, relu writes vs fused writes)."""
    b = GraphBuilder()
    x = b.input("x", ["N", 3, "H", "W"])
    model = b.build(b.op("Relu", [b.conv(x, 3, 8, strides=[2, 2])]))
    report = fuse(model).report
    h2, w2 = sympy.floor((H - 1) / 2) + 1, sympy.floor((W - 1) / 2) + 1
    saved = expr(report.totals["saved_bytes_expr"])
    assert "floor" in report.totals["saved_bytes_expr"]
    assert saved == 64 * N * h2 * w2
    assert expr(report.totals["before"]["total_bytes_expr"]) == 12 * N * H * W + 864 + 32 + 96 * N * h2 * w2
    for n, height, width in ((1, 15, 16), (2, 16, 9), (3, 7, 7)):  # odd and even sizes: floor matters
        at = fuse(model, input_shapes={"x": (n, 3, height, width)}).report
        assert at.totals["saved_bytes"] == int(saved.subs({N: n, H: height, W: width}))
        assert at.totals["saved_bytes"] == 64 * n * ((height - 1) // 2 + 1) * ((width - 1) // 2 + 1)
        assert not at.warnings


def test_unnamed_and_minus_one_dims_become_symbols_named_by_input_and_axis(fuse):
    b = GraphBuilder()
    x = b.input("x", [None, 4, 8, -1])
    report = fuse(b.build(b.op("Relu", [b.conv(x, 4, 4, k=1)]))).report
    assert report.symbols == {"x_0": {"input": "x", "axis": 0, "dim_param": None},
                              "x_3": {"input": "x", "axis": 3, "dim_param": None}}
    x0, x3 = sympy.symbols("x_0 x_3")
    # Conv 1x1 reads x 4*8*4 = 128 B per x_0*x_3, W 64 B, B 16 B, writes 128 per x_0*x_3; Relu 2 x 128
    assert expr(report.totals["before"]["total_bytes_expr"]) == 512 * x0 * x3 + 80


def test_data_dependent_size_is_unknown_and_named_never_zero(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 4, 8, 8])
    nz = b.op("NonZero", [x], name="nz")
    model = b.build(b.op("Relu", [b.conv(x, 4, 4)]))
    model.graph.output.append(helper.make_tensor_value_info(nz, TensorProto.INT64, [4, "nonzero_count"]))
    report = fuse(model).report
    [unknown] = [u for u in report.unknown_nodes if u["op"] == "NonZero"]
    assert unknown["node"] == "nz" and "depends on the values" in unknown["reason"]
    assert report.totals["before"]["unknown_nodes"] == 1
    assert report.totals["saved_bytes"] == 2 * 1024  # the fusion itself is known: Relu reads and writes 1 KiB
    text = report_text.to_text(report)
    assert "unknown" in text and "nz" in text


def test_loop_with_run_time_trip_count_is_unknown_and_says_why(fuse):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    trips = helper.make_tensor_value_info("trips", TensorProto.INT64, [])
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Relu", ["x"], ["y"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["true"], value=helper.make_tensor("t", TensorProto.BOOL, [], [True])),
         helper.make_node("Loop", ["trips", "true"], ["ys"], name="loop", body=body)],
        "g", [x, trips], [helper.make_tensor_value_info("ys", TensorProto.FLOAT, ["iterations", 1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    report = fuse(model).report
    [loop] = [u for u in report.unknown_nodes if u["op"] == "Loop"]
    assert loop["node"] == "loop" and "trip count is known only at run time" in loop["reason"]
    relu = next(r for r in report.nodes["before"] if r["op"] == "Relu")
    assert relu["read_bytes"] == 16 and relu["subgraph"]  # the body itself is counted once


def test_static_model_shapes_equal_onnxruntime_symbolic_inference(monkeypatch):
    """A model with numbers for every dim takes the int path (symbolic.static_shapes); onnxruntime's inference
    (forced by turning that path off) finds the same shapes, and the byte counts are plain ints."""
    b = GraphBuilder()
    x = b.input("x", [2, 3, 17, 9])
    y = b.op("Relu", [b.bn(b.conv(x, 3, 8, strides=[2, 2]), 8)])
    model = b.build(b.op("Add", [y, b.conv(y, 8, 8)]))
    skel = proto.skeleton(model)
    info, _ = shapes.infer(skel)
    fast = symbolic.infer(skel, info)
    rows = rows_of(model)
    assert rows and all(type(r.read_bytes) is int and type(r.written_bytes) is int for r in rows)
    monkeypatch.setattr(symbolic, "static_shapes", lambda *args: None)
    slow = symbolic.infer(skel, info)
    assert not slow.failure
    known = {k: v for k, v in fast.shapes.items() if k in slow.shapes}
    assert known and all(type(d) is int for s in fast.shapes.values() for d in s)
    assert known == {k: tuple(int(d) for d in slow.shapes[k]) for k in known}


def test_static_model_imports_neither_sympy_nor_onnxruntime(tmp_path):
    """Speed (issue 13): ``optimize --no-verify`` of a model without symbolic dims never imports sympy (about
    0.5 s) or onnxruntime; its report still has every byte figure and expression."""
    import subprocess
    import sys

    b = GraphBuilder()
    x = b.input("x", [1, 3, 16, 16])
    onnx.save(b.build(b.op("Relu", [b.bn(b.conv(x, 3, 8), 8)])), tmp_path / "m.onnx")
    code = ("import sys, json; from onnxfuse.cli import main as cli\n"
            f"sys.argv = ['onnxfuse', 'optimize', {str(tmp_path / 'm.onnx')!r}, {str(tmp_path / 'o.onnx')!r}, "
            f"'--no-verify', '-q', '--report', {str(tmp_path / 'r.json')!r}]\n"
            "try:\n    cli.main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print(json.dumps(sorted(m for m in ('sympy', 'onnxruntime') if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"
    import json

    totals = json.loads((tmp_path / "r.json").read_text())["totals"]
    assert totals["saved_bytes"] > 0 and totals["saved_bytes_expr"] == str(totals["saved_bytes"])


def test_shape_assumptions_do_not_depend_on_the_hash_seed(tmp_path):
    """onnxruntime's inference meets dim merges in set order, which changes with PYTHONHASHSEED; the report's
    ``shape_assumptions`` (and so the whole JSON) must not."""
    import os
    import subprocess
    import sys

    b = GraphBuilder()
    x, y = b.input("x", ["N", 4, "H", "W"]), b.input("y", ["M", 4, "P", "Q"])
    onnx.save(b.build(b.op("Add", [b.op("Relu", [x]), b.op("Sigmoid", [y])])), tmp_path / "m.onnx")
    outs = set()
    for seed in ("0", "1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        r = subprocess.run([sys.executable, "-m", "onnxfuse", "report", str(tmp_path / "m.onnx"), "--format",
                            "json"], capture_output=True, text=True, env=env, check=True)
        doc = json.loads(r.stdout)
        assert len(doc["shape_assumptions"]) == 3
        outs.add(json.dumps(doc, sort_keys=True))
    assert len(outs) == 1


def _numbers(report) -> dict:
    """Every byte number of a report (totals, fusion rows, unfused rows, per-node rows), without expressions."""
    doc = report.to_dict()
    t = doc["totals"]
    keys = ("read_bytes", "written_bytes", "total_bytes", "unknown_nodes", "nodes")
    return {"before": [t["before"][k] for k in keys], "after": [t["after"][k] for k in keys],
            "saved": t["saved_bytes"],
            "fusions": [(f["output"], f["bytes_before"], f["bytes_after"], f["saved_bytes"]) for f in doc["fusions"]],
            "unfused": [(u["output"], u["bytes"]) for u in doc["unfused"]],
            "nodes": [(r["output"], r["read_bytes"], r["written_bytes"]) for side in ("before", "after")
                      for r in doc["nodes"][side]]}


def test_counting_at_the_input_shapes_only_gives_the_numbers_of_the_expressions(fuse):
    """``expressions=False`` (the default of every command) with shapes that fix every dim: no symbols (the
    dims are fixed; naming them would need sympy), every ``*_expr`` is its number, and every number equals the
    one the symbolic report (``expressions=True``) gives at those shapes (strided and padded convs, a residual,
    an unfused Sigmoid tail); the same fusions."""
    b = GraphBuilder()
    x = b.input("x", ["N", 3, "H", "W"])
    y = b.op("Relu", [b.bn(b.conv(x, 3, 8, strides=[2, 2]), 8)])
    y = b.op("Relu", [b.op("Add", [b.conv(y, 8, 8), y])])
    model = b.build(b.op("Sigmoid", [b.conv(y, 8, 4, strides=[2, 2])]))
    shapes_ = {"x": (2, 3, 37, 50)}
    full = fuse(model, input_shapes=shapes_, expressions=True).report
    quick = fuse(model, input_shapes=shapes_, expressions=False).report
    assert full.symbols and not quick.symbols and quick.symbol_values == {}
    assert "N_*" in full.totals["saved_bytes_expr"] and not quick.shape_assumptions
    assert [f["output"] for f in quick.fusions] == [f["output"] for f in full.fusions]
    assert _numbers(quick) == _numbers(full)
    assert quick.totals["saved_bytes"] > 0
    assert quick.totals["saved_bytes_expr"] == str(quick.totals["saved_bytes"])
    assert "vs the graph as exported at x=2x3x37x50:" in "\n".join(present.summary_lines(quick))


def test_counting_at_the_input_shapes_falls_back_to_expressions_where_a_size_stays_unknown(fuse):
    """A NonZero's output size is unknown at any input shape: ``expressions=False`` cannot size every tensor,
    so the report is the symbolic one (same numbers, the symbols kept)."""
    b = GraphBuilder()
    x = b.input("x", ["N", 4, 8, 8])
    nz = b.op("NonZero", [x], name="nz")
    model = b.build(b.op("Relu", [b.conv(x, 4, 4)]))
    model.graph.output.append(helper.make_tensor_value_info(nz, TensorProto.INT64, [4, "nonzero_count"]))
    full = fuse(model, input_shapes={"x": (3, 4, 8, 8)}, expressions=True).report
    quick = fuse(model, input_shapes={"x": (3, 4, 8, 8)}, expressions=False).report
    assert quick.symbols == full.symbols != {}
    assert {**quick.to_dict(), "model": None} == {**full.to_dict(), "model": None}
    assert quick.totals["before"]["unknown_nodes"] == 1


def test_optimize_without_report_counts_at_the_given_shapes_without_sympy(tmp_path):
    """The CLI: ``optimize --input-shape`` without ``--report`` on a model with symbolic dims prints the numbers
    at those shapes without importing sympy; with ``--report`` the JSON has the same numbers, counted the same
    way (every ``*_expr`` its number, no symbols: issue 35's numeric report)."""
    import subprocess
    import sys

    b = GraphBuilder()
    x = b.input("x", ["N", 3, "H", "W"])
    onnx.save(b.build(b.op("Relu", [b.bn(b.conv(x, 3, 8), 8)])), tmp_path / "m.onnx")
    code = ("import sys; from onnxfuse.cli import main as cli\n"
            f"sys.argv = ['onnxfuse', 'optimize', {str(tmp_path / 'm.onnx')!r}, {str(tmp_path / 'o.onnx')!r}, "
            "'--no-verify', '--input-shape', 'x=1x3x64x48']\n"
            "try:\n    cli.main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print('sympy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines()[-1] == "False"
    assert "vs the graph as exported at x=1x3x64x48: " in out.stdout
    r = subprocess.run([sys.executable, "-m", "onnxfuse", "optimize", str(tmp_path / "m.onnx"),
                        str(tmp_path / "o2.onnx"), "--no-verify", "--input-shape", "x=1x3x64x48", "--report",
                        str(tmp_path / "r.json")], capture_output=True, text=True, check=True)
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["symbols"] == {} and doc["input_shapes"] == {"x": [1, 3, 64, 48]}
    assert doc["totals"]["saved_bytes_expr"] == str(doc["totals"]["saved_bytes"])
    saved = present.human_bytes(doc["totals"]["saved_bytes"])
    assert f"(saved {saved}," in out.stdout and f"(saved {saved}," in r.stdout


@pytest.mark.parametrize("wrong", ["value_info", "graph_output"])
def test_declared_shapes_that_are_wrong_are_not_counted(fuse, wrong):
    """onnx's non-strict shape inference keeps a value_info or graph output shape it cannot check; the int path
    and the input-shapes path count only what the ops give (the checker accepts both models)."""
    b = GraphBuilder()
    x = b.input("x", [1, 3, 8, 8])
    c = b.conv(x, 3, 4)
    model = b.build(b.op("Relu", [b.bn(c, 4)]))
    if wrong == "value_info":
        model.graph.value_info.append(helper.make_tensor_value_info(c, TensorProto.FLOAT, [7, 4, 99, 99]))
    else:
        del model.graph.output[0].type.tensor_type.shape.dim[:]
        for d in (2, 9, 3, 3):
            model.graph.output[0].type.tensor_type.shape.dim.add().dim_value = d
    onnx.checker.check_model(model)
    # x 768 B, W 432 B + B 16 B, c/bn/y 1024 B each, BN parameters 4 x 16 B
    expected = (768 + 448 + 1024) + (1024 + 64 + 1024) + (1024 + 1024)
    assert fuse(model).report.totals["before"]["total_bytes"] == expected
    sym = model
    sym.graph.input[0].type.tensor_type.shape.dim[0].ClearField("dim_value")
    sym.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    quick = fuse(sym, input_shapes={"x": (1, 3, 8, 8)}, expressions=False).report
    assert quick.totals["before"]["total_bytes"] == expected


def strided_chain(depth: int, ceil_mode_pool: bool = False) -> onnx.ModelProto:
    """x [1, 2, H, W] -> ``depth`` x (Conv 3x3 stride 2 pad 1 -> Relu), every third conv 1x1 stride 2 pad 0;
    with ``ceil_mode_pool`` a MaxPool(3, stride 2, ceil_mode=1) after each conv."""
    b = GraphBuilder()
    y = b.input("x", [1, 2, "H", "W"])
    for i in range(depth):
        k = 1 if i % 3 == 2 else 3
        y = b.op("Relu", [b.conv(y, 2, 2, k=k, strides=[2, 2])])
        if ceil_mode_pool:
            y = b.op("MaxPool", [y], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)
    model = b.model(y, opset=13)
    model.graph.output[0].type.CopyFrom(helper.make_tensor_type_proto(TensorProto.FLOAT, [1, 2, "h", "w"]))
    return model


def expected_dim(h: int, depth: int, ceil_mode_pool: bool = False) -> int:
    """The ONNX Conv/MaxPool output size formula (Operators.md, Conv, MaxPool) applied layer by layer."""
    for i in range(depth):
        k, p = (1, 0) if i % 3 == 2 else (3, 1)
        h = (h + 2 * p - k) // 2 + 1
        if ceil_mode_pool:
            h = -((3 - h) // 2) + 1  # ceil((h - 3) / 2) + 1
    return h


@pytest.mark.parametrize("ceil_mode_pool", [False, True])
def test_strided_conv_chain_dims_stay_one_rounding_deep(ceil_mode_pool):
    # Each strided Conv (MaxPool with ceil_mode) rounds its input's size: nested, the roundings made the last
    # dim's expression, and the report's cost, grow with the chain's depth. Flattened, the expression of the
    # last dim has one rounding and the same number of operations at every depth, and the same values.
    H = sympy.Symbol("H", integer=True, positive=True)
    ops = []
    for depth in (3, 6, 12):
        model = strided_chain(depth, ceil_mode_pool)
        dim = symbolic.infer(proto.skeleton(model)).shapes[model.graph.output[0].name][2]
        roundings = dim.atoms(sympy.floor, sympy.ceiling)
        assert roundings and not any(r.args[0].has(sympy.floor, sympy.ceiling) for r in roundings), dim
        ops.append(sympy.count_ops(dim))
        for h in (1, 2, 3, 7, 64, 65, 224, 1023, 4097, 10 ** 6 + 3):
            assert int(dim.xreplace({H: h})) == expected_dim(h, depth, ceil_mode_pool), (depth, h)
    assert ops[0] == ops[1] == ops[2], ops


def test_tensors_a_pass_inserted_are_sized_from_their_inputs_or_the_recorded_shape():
    """Sizes.with_model on a rewritten model: a new Flatten output is derived from its input's (symbolic) shape, a
    new Transpose output takes the shape recorded in value_info (its named dim mapped to the counted one), and a
    tensor of the original keeps the original's size whatever the value_info says."""
    n = symbolic.make_symbol("N")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 5, 2, 2])
    nodes = [helper.make_node("Flatten", ["x"], ["flat_new"], axis=1),
             helper.make_node("Transpose", ["x"], ["t_new"], perm=[0, 2, 3, 1]),
             helper.make_node("Relu", ["x"], ["old"])]
    info = [helper.make_tensor_value_info("t_new", TensorProto.FLOAT, ["batch", 2, 2, 5]),
            helper.make_tensor_value_info("old", TensorProto.FLOAT, [7, 7])]
    graph = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("old", TensorProto.FLOAT, None)],
                              value_info=info)
    before = traffic.Sizes({"x": (n, 5, 2, 2), "old": (n, 5, 2, 2)}, {"x": TensorProto.FLOAT, "old": 1})
    after = before.with_model(helper.make_model(graph), frozenset({"x", "old"}), {"batch": n})
    assert after.shapes["flat_new"] == (n, 20) and after.bytes("flat_new") == 80 * n
    assert after.shapes["t_new"] == (n, 2, 2, 5) and after.elem_types["t_new"] == TensorProto.FLOAT
    assert after.shapes["old"] == (n, 5, 2, 2)
    unmapped = before.with_model(helper.make_model(graph), frozenset({"x", "old"}), {})
    assert unmapped.bytes("t_new") is None  # a named dim the counted shapes do not know stays unknown
