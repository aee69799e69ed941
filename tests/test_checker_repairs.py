"""Issue 33, part 2: a model onnxruntime loads is accepted even where onnx.checker rejects it for what the
loader can repair (``model.io.repair_for_checker``): a graph output without a type or shape, IR 3 initializers
not all listed as graph inputs. The repair is in the output, which passes onnx.checker (full_check), and the
report says what was repaired; the input file is never modified. What onnxruntime refuses is still refused.

Numerics: original and optimized run in onnxruntime at ORT_DISABLE_ALL (conftest.assert_same_outputs) with
rtol=1e-4, atol=1e-5 (conftest.RTOL/ATOL).
"""

from __future__ import annotations

import hashlib

import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import helper

import onnxfuse
from onnxfuse.cli.main import main
from tests.builders import GraphBuilder
from tests.conftest import assert_same_outputs, op_counts


def conv_bn_relu(opset: int = 11, ir_version: int = 6) -> onnx.ModelProto:
    """Conv -> BN -> Relu whose graph output has no shape (GraphBuilder.model declares none)."""
    b = GraphBuilder(seed=5)
    x = b.input("x", [1, 3, 8, 8])
    return b.model(b.op("Relu", [b.bn(b.conv(x, 3, 4), 4)]), opset=opset, ir_version=ir_version)


def no_output_shape():
    return conv_bn_relu()


def no_output_type():
    model = conv_bn_relu()
    model.graph.output[0].ClearField("type")
    return model


def ir3_unlisted():
    model = conv_bn_relu(opset=8, ir_version=3)
    return model


def ir3_partly_listed():
    model = conv_bn_relu(opset=8, ir_version=3)
    first = model.graph.initializer[0]
    model.graph.input.append(helper.make_tensor_value_info(first.name, first.data_type, list(first.dims)))
    return model


CASES = {"no_output_shape": (no_output_shape, "had no type or shape"),
         "no_output_type": (no_output_type, "had no type or shape"),
         "ir3_unlisted": (ir3_unlisted, "IR version 3 requires"),
         "ir3_partly_listed": (ir3_partly_listed, "IR version 3 requires")}


def rejected_by_checker(model: onnx.ModelProto) -> bool:
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError:
        return True
    return False


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_model_onnxruntime_loads_is_repaired_not_refused(tmp_path, case):
    make, note = CASES[case]
    model = make()
    assert rejected_by_checker(model)  # the premise: onnx.checker refuses it ...
    ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])  # ... onnxruntime loads it
    src, dst = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(model, src)
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    result = CliRunner().invoke(main, ["optimize", str(src), str(dst), "--target", "cpu"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert hashlib.sha256(src.read_bytes()).hexdigest() == digest
    assert note in result.output
    out = onnx.load(dst)
    onnx.checker.check_model(out, full_check=True)
    assert op_counts(out) == {"FusedConv": 1}
    assert_same_outputs(model, out)


@pytest.mark.parametrize("case", ["no_output_shape", "ir3_partly_listed"])
def test_the_api_repairs_a_copy_and_reports_it(case):
    make, note = CASES[case]
    model = make()
    before = model.SerializeToString(deterministic=True)
    result = onnxfuse.optimize(model, target="cpu")
    assert model.SerializeToString(deterministic=True) == before  # the caller's ModelProto is left alone
    assert any(note in w for w in result.report.warnings)
    onnx.checker.check_model(result.model, full_check=True)


def test_an_output_without_a_type_gets_the_inferred_one():
    model = no_output_type()
    result = onnxfuse.optimize(model, target="cpu")
    assert result.model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert [d.dim_value for d in result.model.graph.output[0].type.tensor_type.shape.dim] == [1, 4, 8, 8]


def test_what_onnxruntime_refuses_is_still_refused(tmp_path):
    b = GraphBuilder()
    b.input("x", [1, 3, 8, 8])
    bad = b.model(b.op("Relu", ["undefined_tensor"]))  # no output shape either: repaired, the rest is not
    with pytest.raises(Exception):  # noqa: B017 (onnxruntime's own error type is not public)
        ort.InferenceSession(bad.SerializeToString(), providers=["CPUExecutionProvider"])
    src = tmp_path / "bad.onnx"
    onnx.save(bad, src)
    result = CliRunner().invoke(main, ["optimize", str(src), str(tmp_path / "o.onnx")], catch_exceptions=False)
    assert result.exit_code == 2 and "onnx.checker rejected" in result.output
    assert not (tmp_path / "o.onnx").exists()


def test_a_graph_input_without_a_shape_is_analysed_with_unknown_sizes(tmp_path):
    # onnxruntime takes an input of any shape; the checker refuses the missing field. Accepted with a warning,
    # verified at the --input-shape given; the output keeps the input as it is
    b = GraphBuilder(seed=5)
    x = b.input("x", [1, 3, 8, 8])
    model = b.build(b.op("Relu", [b.bn(b.conv(x, 3, 4), 4)]), opset=13)
    model.graph.input[0].type.tensor_type.ClearField("shape")
    assert rejected_by_checker(model)
    ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    src, dst = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(model, src)
    result = CliRunner().invoke(main, ["optimize", str(src), str(dst), "--target", "cpu", "--input-shape",
                                       "x=1x3x8x8"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "has no shape" in result.output and "verification: passed" in result.output
    out = onnx.load(dst)
    assert not out.graph.input[0].type.tensor_type.HasField("shape")
    assert op_counts(out) == {"FusedConv": 1}


def test_an_initializer_that_is_a_graph_output_without_a_shape_is_typed_from_itself(tmp_path):
    # onnx shape inference lists no type for an initializer that is a graph output, and reads the output's own
    # shapeless declaration for it, so nothing after it got a shape either (issue 33): onnxruntime loads it
    b = GraphBuilder(seed=2)
    x = b.input("x", [1, 3])
    w = b.const(b.rand(2, 3))
    model = b.model([b.op("MatMul", [x, b.op("Transpose", [w], perm=[1, 0])]), w])
    assert rejected_by_checker(model)
    ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    src, dst = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(model, src)
    result = CliRunner().invoke(main, ["optimize", str(src), str(dst)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "had no type or shape" in result.output
    out = onnx.load(dst)
    onnx.checker.check_model(out, full_check=True)
    shapes = {o.name: [d.dim_value for d in o.type.tensor_type.shape.dim] for o in out.graph.output}
    assert shapes == {model.graph.output[0].name: [1, 2], w: [2, 3]}
    assert "Transpose" not in op_counts(out)  # folded: the initializer stays an output, its transpose a constant
    assert_same_outputs(model, out)
