"""Byte counts pinned by hand on tiny graphs (shared/docs/traffic.md's model: each node reads each distinct
input once, writes each output once; bytes = elements x itemsize; weights read by every consumer)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from onnxfuse import shapes, traffic
from tests.builders import GraphBuilder


def rows_of(model: onnx.ModelProto) -> list[traffic.NodeTraffic]:
    info, elems = shapes.infer(shapes.skeleton(model))
    return traffic.node_traffic(model, traffic.Sizes(info, elems).with_model(model))


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
    info, elems = shapes.infer(shapes.skeleton(unfused))
    sizes = traffic.Sizes(info, elems).with_model(unfused)
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
    report = fuse(model).report
    assert report.totals["before"]["total_bytes"] == (1024 + 576 + 16 + 1024) + (2048 + 1024) + (1024 + 1024)
    assert report.totals["after"]["total_bytes"] == 1024 + 576 + 16 + 1024
    assert report.fusions[0]["saved_bytes"] == 5120


def test_float16_conv_counts_two_bytes_per_element(fuse):
    b = GraphBuilder(dtype=np.float16)
    x = b.input("x", [1, 4, 8, 8])
    model = b.build(b.bn(b.conv(x, 4, 8), 8))
    conv = by_op(rows_of(model))["Conv"]
    assert conv.read_bytes == 512 + 576 + 16 and conv.written_bytes == 1024
    report = fuse(model).report
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


def test_symbolic_input_leaves_nodes_unknown_and_names_the_input(fuse):
    b = GraphBuilder()
    x = b.input("x", ["N", 4, 8, 8])
    model = b.build(b.op("Relu", [b.conv(x, 4, 4)]))
    report = fuse(model).report
    assert report.unknown_shapes == [{"input": "x", "shape": ["N", 4, 8, 8]}]
    assert report.totals["before"]["unknown_nodes"] == 2 and report.totals["before"]["total_bytes"] == 0
    given = fuse(model, input_shapes={"x": (2, 4, 8, 8)}).report
    assert given.unknown_shapes == [] and given.totals["before"]["unknown_nodes"] == 0
    assert given.totals["before"]["total_bytes"] == (2048 + 576 + 16 + 2048) + 2 * 2048
