"""resize_nearest: Resize(nearest, half_pixel-type mapping, round_prefer_floor/ceil, integer scales)
=> Resize(nearest, asymmetric, floor).

Numerics: original and optimized run in onnxruntime at ORT_DISABLE_ALL (conftest.assert_same_outputs) with
rtol=0, atol=0: both read the same input element for every output element (proof in the pass's docstring).
"""

import numpy as np
import onnx
import pytest

from onnxfuse.records import Reason
from tests.builders import GraphBuilder
from tests.conftest import assert_same_outputs, assert_skipped, attr, slower_at

PASS = "resize_nearest"


def resize(x_shape=(1, 2, 5, 7), scales=(1, 1, 2, 2), sizes=None, opset=13, dtype=np.float32, axes=None,
           scales_as_input=False, **attrs):
    """x -> Resize(scales or sizes) in the input form of ``opset`` (11: roi and scales always given)."""
    b = GraphBuilder(dtype=dtype)
    x = b.input("x", list(x_shape))
    empty = b.const(np.zeros(0, np.float32))
    if scales_as_input:
        s = b.input("scales", [len(scales)], np.float32)
    elif scales is not None:
        s = b.const(np.asarray(scales, np.float32))
    else:
        s = empty if opset < 13 else ""
    inputs = [x, empty if opset < 13 else "", s]
    if sizes is not None:
        inputs.append(b.const(np.asarray(sizes, np.int64)))
    if axes is not None:
        attrs["axes"] = list(axes)
    return b.build(b.op("Resize", inputs, mode=attrs.pop("mode", "nearest"), **attrs), opset=opset)


def the_resize(model):
    (node,) = [n for n in model.graph.node if n.op_type == "Resize"]
    return node


def assert_rewritten(fuse, model):
    result = fuse(model)
    node = the_resize(result.model)
    assert attr(node, "coordinate_transformation_mode") == b"asymmetric"
    assert attr(node, "nearest_mode") == b"floor"
    onnx.checker.check_model(result.model, full_check=True)
    assert_same_outputs(model, result.model, rtol=0, atol=0)
    return result


@pytest.mark.parametrize("x_shape, scales", [
    ((1, 2, 5, 7), (1, 1, 2, 2)),
    ((2, 3, 4, 4), (1, 1, 3, 3)),
    ((1, 1, 3, 6), (1, 1, 4, 1)),
    ((1, 2, 1, 1), (1, 1, 8, 5)),
    ((1, 2, 9, 3), (1, 1, 1, 1)),
    ((1, 2, 3, 5), (1, 2, 2, 2)),  # the channel axis too: the proof holds on every axis
    ((1, 4, 6), (1, 1, 2)),  # 1-D (audio)
    ((1, 2, 3, 4, 5), (1, 1, 2, 3, 2)),  # 3-D
])
@pytest.mark.parametrize("modes", [{}, {"coordinate_transformation_mode": "pytorch_half_pixel"},
                                   {"nearest_mode": "round_prefer_ceil"},
                                   {"coordinate_transformation_mode": "half_pixel",
                                    "nearest_mode": "round_prefer_floor"}])
def test_integer_scales_become_asymmetric_floor(fuse, x_shape, scales, modes):
    assert_rewritten(fuse, resize(x_shape, scales, **modes))


@pytest.mark.parametrize("opset", [11, 13, 18, 19])
def test_every_resize_form_from_opset_11(fuse, opset):
    assert_rewritten(fuse, resize((1, 3, 4, 6), (1, 1, 2, 2), opset=opset))


def test_sizes_that_divide_evenly(fuse):
    assert_rewritten(fuse, resize((1, 3, 4, 6), scales=None, sizes=(1, 3, 8, 18)))
    assert_rewritten(fuse, resize((1, 3, 4, 6), scales=None, sizes=(1, 3, 8, 18), opset=11))


def test_axes_opset18_and_half_pixel_symmetric(fuse):
    assert_rewritten(fuse, resize((1, 3, 4, 6), scales=(2, 3), axes=(2, 3), opset=18))
    assert_rewritten(fuse, resize((1, 3, 4, 6), scales=None, sizes=(12, 12), axes=(-2, -1), opset=18))
    assert_rewritten(fuse, resize((1, 3, 4, 6), (1, 1, 2, 2), opset=19,
                                  coordinate_transformation_mode="half_pixel_symmetric"))


@pytest.mark.parametrize("dtype", [np.uint8, np.float16])
def test_other_element_types(fuse, dtype):
    # the element type does not enter the index maths
    model = resize((1, 2, 3, 4), (1, 1, 2, 3), dtype=dtype)
    assert_rewritten(fuse, model)


def test_symbolic_batch_with_scales(fuse):
    assert_rewritten(fuse, resize(("N", 3, "H", "W"), (1, 1, 2, 2)))


def test_already_asymmetric_floor_is_left_alone(fuse):
    model = resize(coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    result = fuse(model)
    assert not result.fusions and not result.skips


def test_opset_10_is_no_pattern(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 2, 3, 3])
    model = b.build(b.op("Resize", [x, b.const(np.array([1, 1, 2, 2], np.float32))], mode="nearest"), opset=10)
    result = fuse(model)
    assert not result.fusions and not result.skips


# ----------------------------------------------------------------------------------------------------------------
# Refusals: each is a mapping (or input) for which asymmetric/floor would read other pixels


def refused(fuse, model, reason):
    result = fuse(model)
    s = assert_skipped(result, model, reason, PASS)
    assert the_resize(result.model).attribute == the_resize(model).attribute  # the mapping is left as it was
    return s


def test_skip_resize_mode_not_nearest(fuse):
    refused(fuse, resize(mode="linear"), Reason.RESIZE_MODE)


@pytest.mark.parametrize("coords, rounding", [("tf_half_pixel_for_nn", "round_prefer_floor"),
                                              ("align_corners", "round_prefer_floor"),
                                              ("asymmetric", "round_prefer_floor")])
def test_skip_resize_coordinate_mode(fuse, coords, rounding):
    model = resize(coordinate_transformation_mode=coords, nearest_mode=rounding)
    s = refused(fuse, model, Reason.RESIZE_COORDINATES)
    assert coords in s.detail


def test_tf_half_pixel_for_nn_really_differs():
    # the refusal is needed: written as asymmetric/floor, tf_half_pixel_for_nn's model gives other values
    from tests.conftest import random_feeds, run

    model = resize((1, 1, 4, 4), (1, 1, 2, 2), coordinate_transformation_mode="tf_half_pixel_for_nn")
    other = onnx.ModelProto()
    other.CopyFrom(model)
    for a in other.graph.node[0].attribute:
        if a.name == "coordinate_transformation_mode":
            a.s = b"asymmetric"
    other.graph.node[0].attribute.append(onnx.helper.make_attribute("nearest_mode", "floor"))
    feeds = random_feeds(model, 0)
    assert not np.array_equal(run(model, feeds)[0], run(other, feeds)[0])


@pytest.mark.parametrize("rounding", ["floor", "ceil"])
def test_skip_resize_nearest_mode(fuse, rounding):
    refused(fuse, resize(nearest_mode=rounding), Reason.RESIZE_NEAREST_MODE)


def test_skip_parameters_not_constant(fuse):
    refused(fuse, resize(scales_as_input=True), Reason.PARAMS_NOT_CONSTANT)


def test_skip_initializer_is_graph_input(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 2, 3, 3])
    s = b.const(np.array([1, 1, 2, 2], np.float32), name="scales")
    model = b.build(b.op("Resize", [x, "", s], mode="nearest"), opset=13, initializers_as_inputs=True)
    refused(fuse, model, Reason.INITIALIZER_IS_INPUT)


@pytest.mark.parametrize("scales", [(1, 1, 1.5, 2), (1, 1, 0.5, 0.5), (1, 1, 2, np.inf)])
def test_skip_resize_scale_not_integer(fuse, scales):
    x_shape = (1, 2, 4, 4)
    if not np.all(np.isfinite(scales)):
        b = GraphBuilder()
        x = b.input("x", list(x_shape))
        model = b.model(b.op("Resize", [x, "", b.const(np.asarray(scales, np.float32))], mode="nearest"), opset=13)
        model.graph.output[0].CopyFrom(onnx.helper.make_tensor_value_info(
            model.graph.output[0].name, onnx.TensorProto.FLOAT, ["a", "b", "c", "d"]))
    else:
        model = resize(x_shape, scales)
    refused(fuse, model, Reason.RESIZE_SCALE)


def test_skip_resize_sizes_not_multiple(fuse):
    refused(fuse, resize((1, 3, 4, 6), scales=None, sizes=(1, 3, 8, 9)), Reason.RESIZE_SIZES)


def test_skip_resize_sizes_not_multiple_unknown_extent(fuse):
    s = refused(fuse, resize((1, 3, "H", 6), scales=None, sizes=(1, 3, 8, 12)), Reason.RESIZE_SIZES)
    assert "no known extent" in s.detail


def test_skip_resize_sizes_not_multiple_aspect_policy(fuse):
    model = resize((1, 3, 4, 6), scales=None, sizes=(8, 12), axes=(2, 3), opset=18,
                   keep_aspect_ratio_policy="not_larger")
    refused(fuse, model, Reason.RESIZE_SIZES)


def test_skip_resize_extent_too_large(fuse):
    model = resize((1, 1, 1, 2 ** 17), (1, 1, 1, 4))  # 2^19 output pixels times scale 4 = 2^21
    s = refused(fuse, model, Reason.RESIZE_EXTENT)
    assert "2^21" in s.detail


def test_skip_slower_than_unfused_at_ort_level(fuse, monkeypatch):
    """A speed rule for the form (``providers.CPU_SLOWER_AT``; none is measured today, BENCHMARKS.md) refuses it at
    that level and no other."""
    form = slower_at(monkeypatch, PASS, "all")
    model = resize()
    s = assert_skipped(fuse(model, ort_level="all"), model, Reason.SLOWER_AT_ORT_LEVEL, PASS)
    assert form in s.detail and "level all" in s.detail
    assert any(f.pass_name == PASS for f in fuse(model, ort_level="extended").fusions)
