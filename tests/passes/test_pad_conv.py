"""pad_conv: Pad(constant mode, value 0, spatial axes only) -> Conv => Conv with the pads added to its own.

Numerics: original and optimized run in onnxruntime at ORT_DISABLE_ALL (conftest.assert_same_outputs) with
rtol=1e-4, atol=1e-5 (conftest.RTOL/ATOL).
"""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxfuse import pipeline
from onnxfuse.records import Reason
from tests.builders import GraphBuilder, skip_of, with_output_shapes
from tests.conftest import ATOL, RTOL, analyse_unchecked, assert_same_outputs, attr, op_counts

PASS = "pad_conv"
SPATIAL = [0, 0, 1, 2, 0, 0, 2, 1]  # N, C, H, W begins then ends


def pad_conv(pads=SPATIAL, opset=13, mode=None, value=None, conv_pads=(1, 1, 1, 1), pads_input=None,
             axes=None, **conv_attrs):
    """x [1, 3, 6, 6] -> Pad -> Conv(3 -> 4, 3x3) -> Relu; the Pad in the form of ``opset``."""
    b = GraphBuilder()
    x = b.input("x", [1, 3, 6, 6])
    attrs = {"mode": mode} if mode else {}
    if opset < 11:
        attrs["pads"] = pads
        if value is not None:
            attrs["value"] = value
        padded = b.op("Pad", [x], **attrs)
    else:
        inputs = [x, pads_input or b.const(np.array(pads, np.int64))]
        if value is not None or axes is not None:
            inputs.append(b.const(np.float32(value or 0.0)))
        if axes is not None:
            inputs.append(b.const(np.array(axes, np.int64)))
        padded = b.op("Pad", inputs, **attrs)
    if conv_pads is not None:
        conv_attrs["pads"] = list(conv_pads)
    conv = b.conv(padded, 3, 4, **conv_attrs)
    return b.build(b.op("Relu", [conv]), opset=opset), b


def the_conv(model):
    (node,) = [n for n in model.graph.node if n.op_type in ("Conv", "FusedConv")]
    return node


# --------------------------------------------------------------------------------------------------------------
# Positives


@pytest.mark.parametrize("opset", [9, 13, 19])
def test_zero_pad_folds_into_conv_pads(fuse, opset):
    model, _ = pad_conv(opset=opset)
    result = fuse(model, only=(PASS, "conv_activation"), target="cpu+cuda")
    assert op_counts(result.model) == {"FusedConv": 1}
    assert attr(the_conv(result.model), "pads") == [1 + 1, 1 + 2, 1 + 2, 1 + 1]
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_conv_without_pads_gets_the_pad(fuse):
    model, _ = pad_conv(conv_pads=None)
    model.graph.node[1].ClearField("attribute")  # the builder sets pads by default: none at all
    model.graph.output[0].type.tensor_type.ClearField("shape")  # declared for the padded Conv: infer it again
    model = with_output_shapes(model)
    result = fuse(model, target="onnx")
    assert op_counts(result.model) == {"Conv": 1, "Relu": 1}
    assert attr(the_conv(result.model), "pads") == [1, 2, 2, 1]
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_explicit_zero_value_and_axes_opset18(fuse):
    model, _ = pad_conv(pads=[1, 2, 2, 1], opset=18, value=0.0, axes=[2, 3])
    result = fuse(model, only=(PASS, "conv_activation"), target="cpu")
    assert op_counts(result.model) == {"FusedConv": 1}
    assert attr(the_conv(result.model), "pads") == [2, 3, 3, 2]
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


# --------------------------------------------------------------------------------------------------------------
# Refusals


def assert_refused(fuse, model, reason):
    result = fuse(model, target="onnx")
    s = skip_of(result, PASS)
    assert s.reason == reason
    assert op_counts(result.model)["Pad"] == 1
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)
    return s


@pytest.mark.parametrize("mode", ["reflect", "edge"])
def test_skip_pad_mode_not_constant(fuse, mode):
    model, _ = pad_conv(mode=mode)
    assert mode in assert_refused(fuse, model, Reason.PAD_MODE).detail


@pytest.mark.parametrize("opset", [9, 13])
def test_skip_pad_value_not_zero(fuse, opset):
    model, _ = pad_conv(opset=opset, value=1.5)
    assert_refused(fuse, model, Reason.PAD_VALUE)


def test_skip_pad_on_batch_or_channel(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 2, 6, 6])
    padded = b.op("Pad", [x, b.const(np.array([0, 1, 0, 0, 0, 0, 0, 0], np.int64))])
    model = b.build(b.op("Relu", [b.conv(padded, 3, 4)]), opset=13)
    assert_refused(fuse, model, Reason.PAD_AXES)


def test_skip_negative_pads(fuse):
    model, _ = pad_conv(pads=[0, 0, -1, 0, 0, 0, 0, 0])
    assert_refused(fuse, model, Reason.PAD_NEGATIVE)


def test_skip_intermediate_has_other_consumers(fuse):
    model, _ = pad_conv()
    model.graph.node.append(helper.make_node("Sigmoid", [model.graph.node[0].output[0]], ["side"]))
    model.graph.output.append(helper.make_tensor_value_info("side", TensorProto.FLOAT, [1, 3, 9, 9]))
    assert_refused(fuse, model, Reason.NOT_PRIVATE)


def test_skip_conv_auto_pad_set(fuse):
    model, _ = pad_conv(conv_pads=None, auto_pad="SAME_UPPER")
    conv = next(n for n in model.graph.node if n.op_type == "Conv")
    kept = [a for a in conv.attribute if a.name != "pads"]  # auto_pad and pads together are invalid
    del conv.attribute[:]
    conv.attribute.extend(kept)
    assert_refused(fuse, model, Reason.AUTO_PAD)


def test_skip_parameters_not_constant(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 3, 6, 6])
    pads = b.input("pads", [8], dtype=np.int64)
    model = b.build(b.op("Relu", [b.conv(b.op("Pad", [x, pads]), 3, 4)]), opset=13)
    result = fuse(model, target="onnx")
    s = skip_of(result, PASS)
    assert s.reason == Reason.PARAMS_NOT_CONSTANT
    assert op_counts(result.model)["Pad"] == 1


@pytest.mark.parametrize("ir_version", [4, 8])
def test_skip_initializer_is_graph_input(fuse, ir_version):
    # pads an initializer a caller may feed (listed as a graph input, IR >= 4): refused with the option named
    model, _ = pad_conv()
    pads = model.graph.node[0].input[1]
    model.graph.input.append(helper.make_tensor_value_info(pads, TensorProto.INT64, [8]))
    model.ir_version = ir_version
    result = fuse(model, only=(PASS,))
    s = skip_of(result, PASS)
    assert s.reason == Reason.INITIALIZER_IS_INPUT and "--constant-initializer-inputs" in s.detail
    assert op_counts(result.model)["Pad"] == 1
    fused = fuse(model, only=(PASS,), constant_initializer_inputs=True)
    assert op_counts(fused.model)["Pad"] == 0
    assert_same_outputs(model, fused.model)


def test_pads_computed_from_an_overridable_initializer_names_the_option(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 3, 6, 6])
    pads = b.op("Identity", [b.const(np.array(SPATIAL, np.int64), name="pads32")])
    model = b.build(b.op("Relu", [b.conv(b.op("Pad", [x, pads]), 3, 4)]), opset=13)
    model.graph.input.append(helper.make_tensor_value_info("pads32", TensorProto.INT64, [8]))
    s = skip_of(fuse(model, only=(PASS,)), PASS)
    assert s.reason == Reason.INITIALIZER_IS_INPUT and "--constant-initializer-inputs" in s.detail


def test_skip_intermediate_is_graph_output(fuse):
    model, _ = pad_conv()
    model.graph.output.append(helper.make_tensor_value_info(model.graph.node[0].output[0], TensorProto.FLOAT,
                                                            [1, 3, 9, 9]))
    assert_refused(fuse, model, Reason.GRAPH_OUTPUT)


# onnx.checker (full_check) and onnxruntime refuse a Pad whose axes repeat or fall outside the input, so no
# file reaches the pass with one (the last test); the pass refuses them too (analyse_unchecked skips the load).


@pytest.mark.parametrize("axes", [[2, 2], [-1, 3]], ids=["same", "negative-alias"])
def test_skip_pad_axes_invalid_when_an_axis_repeats(axes):
    model, _ = pad_conv(pads=[1, 1, 1, 1], opset=18, value=0.0, axes=axes)
    s = skip_of(analyse_unchecked(model, target="onnx", only=(PASS,)), PASS)
    assert s.reason == Reason.PAD_AXES_INVALID and "twice" in s.detail


def test_skip_pad_axes_invalid_when_an_axis_is_out_of_range():
    model, _ = pad_conv(pads=[1, 1], opset=18, value=0.0, axes=[4])
    s = skip_of(analyse_unchecked(model, target="onnx", only=(PASS,)), PASS)
    assert s.reason == Reason.PAD_AXES_INVALID and "does not have" in s.detail


def test_skip_pad_axes_invalid_when_pads_are_not_two_per_axis():
    model, _ = pad_conv(pads=[1, 1, 1], opset=18, value=0.0, axes=[2, 3])
    s = skip_of(analyse_unchecked(model, target="onnx", only=(PASS,)), PASS)
    assert s.reason == Reason.PAD_AXES_INVALID and "two per axis" in s.detail


def test_a_file_with_repeated_pad_axes_is_an_input_error(tmp_path):
    import onnx

    from onnxfuse.errors import InputError

    model, _ = pad_conv(pads=[1, 1, 1, 1], opset=18, value=0.0, axes=[2, 2])
    model.graph.output[0].type.CopyFrom(helper.make_tensor_type_proto(TensorProto.FLOAT, [1, 4, 8, 6]))
    onnx.save(model, str(tmp_path / "m.onnx"))
    with pytest.raises(InputError, match="referred to more than once"):
        pipeline.analyse(tmp_path / "m.onnx", pipeline.Options(target="onnx"))


def with_auto_pad(auto_pad, opset=13):
    """pad_conv() whose Conv has ``auto_pad`` and no pads attribute (the two together are invalid)."""
    model, _ = pad_conv(opset=opset, conv_pads=None, auto_pad=auto_pad)
    conv = next(n for n in model.graph.node if n.op_type == "Conv")
    kept = [a for a in conv.attribute if a.name != "pads"]
    del conv.attribute[:]
    conv.attribute.extend(kept)
    model.graph.output[0].type.tensor_type.ClearField("shape")  # typed from the Conv with pads: typed again
    return with_output_shapes(model)


@pytest.mark.parametrize("opset", [9, 13, 19])
def test_pad_folds_into_a_conv_with_auto_pad_valid(fuse, opset):
    # VALID is no padding: the Conv takes the Pad's pads as its own and auto_pad goes (NOTSET, the default)
    model = with_auto_pad("VALID", opset)
    result = fuse(model, only=(PASS,))
    assert "Pad" not in op_counts(result.model)
    conv = the_conv(result.model)
    assert attr(conv, "pads") == [1, 2, 2, 1] and attr(conv, "auto_pad") is None
    onnx.checker.check_model(result.model, full_check=True)
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER"])
def test_skip_conv_auto_pad_set_same(fuse, auto_pad):
    assert_refused(fuse, with_auto_pad(auto_pad), Reason.AUTO_PAD)
