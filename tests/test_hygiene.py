"""Input hygiene at load (onnxfuse/model/hygiene.py): nodes out of execution order are sorted (stable) instead of
refused, and a dim stored as -1 is a symbolic dim that --input-shape fixes.
"""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxfuse
from onnxfuse import pipeline
from onnxfuse.errors import InputError
from onnxfuse.model import hygiene
from onnxfuse.model import io as model_io
from tests.builders import GraphBuilder, subgraph
from tests.conftest import ATOL, RTOL, assert_if_branches_match, assert_same_outputs, op_counts, run
from tests.test_cli import invoke


def conv_relu_add():
    b = GraphBuilder()
    x = b.input("x", [1, 3, 6, 6])
    y = b.op("Relu", [b.op("Add", [b.conv(x, 3, 4, bias=False), b.const(b.rand(1, 4, 1, 1))])])
    return b.build(b.op("Sigmoid", [y]))


def reversed_nodes(model):
    nodes = list(model.graph.node)[::-1]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


def test_unsorted_model_is_sorted_and_optimized(tmp_path, fuse):
    model = reversed_nodes(conv_relu_add())
    with pytest.raises(onnx.checker.ValidationError, match="topologically sorted"):
        onnx.checker.check_model(model)
    result = fuse(model, target="cpu+cuda")
    onnx.checker.check_model(result.model)
    assert op_counts(result.model) == {"FusedConv": 1, "Sigmoid": 1}
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)  # onnxruntime runs the unsorted original


def test_unsorted_model_cli_exit_0(tmp_path):
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(reversed_nodes(conv_relu_add()), str(src))
    result = invoke("optimize", src, out, "--target", "cpu")
    assert result.exit_code == 0, result.output
    onnx.checker.check_model(str(out))


def test_unsorted_model_proto_through_the_python_api():
    model = reversed_nodes(conv_relu_add())
    data = model.SerializeToString()
    result = onnxfuse.optimize(model, target="cpu+cuda")
    assert model.SerializeToString() == data  # the caller's proto is not touched
    assert op_counts(result.model) == {"FusedConv": 1, "Sigmoid": 1}
    assert result.report.verification.status == "passed"


def test_unsorted_nothing_to_fuse_is_still_written_sorted(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 4])
    model = reversed_nodes(b.build(b.op("Tanh", [b.op("Sigmoid", [x])])))
    result = fuse(model)
    assert [n.op_type for n in result.model.graph.node] == ["Sigmoid", "Tanh"]


def test_sorted_graph_keeps_its_order_byte_for_byte():
    model = conv_relu_add()
    data = model.SerializeToString()
    assert hygiene.sort_topologically(model) == 0
    assert model.SerializeToString() == data


def test_independent_nodes_keep_their_relative_order():
    b = GraphBuilder()
    x = b.input("x", [1, 4])
    outs = [b.op(op, [x]) for op in ("Tanh", "Sigmoid", "Relu", "Abs")]
    model = b.model(b.op("Sum", outs))
    nodes = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend([nodes[-1], *nodes[:-1]])  # Sum first
    assert hygiene.sort_topologically(model) == 5
    assert [n.op_type for n in model.graph.node] == ["Tanh", "Sigmoid", "Relu", "Abs", "Sum"]


def test_node_reading_outer_tensor_inside_if_body_waits_for_it():
    # The If reads `y` only inside its branches: it must still come after the node that writes y.
    b = GraphBuilder()
    x = b.input("x", [1, 4])
    cond = b.input("cond", [], dtype=np.bool_)
    y = b.op("Sigmoid", [x])
    branches = []
    for prefix, op in (("then_", "Relu"), ("else_", "Tanh")):
        sb = GraphBuilder(prefix=prefix)
        sb.input(y, [1, 4])
        branches.append(subgraph(sb, sb.op(op, [y])))
    model = b.build(b.op("If", [cond], then_branch=branches[0], else_branch=branches[1]))
    reversed_nodes(model)
    assert hygiene.sort_topologically(model) == 2
    assert [n.op_type for n in model.graph.node] == ["Sigmoid", "If"]
    onnx.checker.check_model(model)


def test_cycle_is_still_refused(tmp_path):
    a = helper.make_node("Relu", ["b"], ["a"])
    c = helper.make_node("Relu", ["a"], ["b"])
    graph = helper.make_graph([a, c], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1])])
    path = tmp_path / "cycle.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    with pytest.raises(InputError, match=r"onnx\.checker rejected"):
        model_io.load_model(path)


# --------------------------------------------------------------------------------------------------------------
# -1 dims


def minus_one_model():
    b = GraphBuilder()
    b.input("x", [1, 3, 6, 6])
    model = b.build(b.op("Relu", [b.conv("x", 3, 4)]))
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = -1  # paddle2onnx style dynamic batch
    return model


def test_minus_one_dim_is_symbolic_and_input_shape_fixes_it(tmp_path):
    model = minus_one_model()
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    result = pipeline.analyse(path, pipeline.Options(target="cpu", input_shapes={"x": (2, 3, 6, 6)}))
    assert result.report.input_shapes == {"x": [2, 3, 6, 6]}
    assert result.report.unknown_shapes == []
    assert op_counts(result.model) == {"FusedConv": 1}
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 3, 6, 6)).astype(np.float32)}
    np.testing.assert_allclose(run(result.model, feeds)[0], run(model, feeds)[0], rtol=RTOL, atol=ATOL)


def test_minus_one_dim_without_input_shape_is_reported_unknown(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(minus_one_model(), str(path))
    report = pipeline.analyse(path, pipeline.Options(target="cpu")).report
    assert [u["input"] for u in report.unknown_shapes] == ["x"]


def test_minus_one_dim_cli_input_shape(tmp_path):
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(minus_one_model(), str(src))
    result = invoke("optimize", src, out, "--target", "cpu", "--input-shape", "x=2x3x6x6")
    assert result.exit_code == 0, result.output
    assert "fixed at -1" not in result.output


def test_if_model_unsorted_branch_is_sorted(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 3, 6, 6])
    cond = b.input("cond", [], dtype=np.bool_)
    branches = []
    for prefix in ("then_", "else_"):
        sb = GraphBuilder(seed=len(prefix), prefix=prefix)
        sb.input("x", [1, 3, 6, 6])
        body = subgraph(sb, sb.op("Relu", [sb.conv(x, 3, 4)]))
        nodes = list(body.node)[::-1]
        del body.node[:]
        body.node.extend(nodes)
        branches.append(body)
    model = b.build(b.op("If", [cond], then_branch=branches[0], else_branch=branches[1]))
    result = fuse(model, target="cpu+cuda")
    assert op_counts(result.model) == {"If": 1, "FusedConv": 2}
    onnx.checker.check_model(result.model)
    reference = onnx.ModelProto()
    reference.CopyFrom(model)
    assert hygiene.sort_topologically(reference) == 4  # onnxruntime refuses unsorted bodies: compare sorted
    assert_if_branches_match(reference, result.model)
