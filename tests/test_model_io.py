"""model_io: the streamed serialization writes exactly the bytes of ``SerializeToString(deterministic=True)``; the
checks at load refuse invalid models and external data references."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxfuse.errors import InputError
from onnxfuse.model import io as model_io


def _model(with_unknown: bool = False) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    b = helper.make_tensor("b", TensorProto.FLOAT, [8], [0.5] * 8)  # float_data, not raw_data
    then = helper.make_graph([helper.make_node("Identity", ["w"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, [8, 3, 3, 3])])
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["y"], ["z"], doc_string="relu"),
             helper.make_node("If", ["c"], ["u"], then_branch=then, else_branch=then)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8]),
                     helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 8, 8, 8]),
         helper.make_tensor_value_info("u", TensorProto.FLOAT, [8, 3, 3, 3])],
        [w, b], doc_string="graph doc",
        value_info=[helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="test")
    helper.set_model_props(model, {"k": "v"})
    if with_unknown:
        model.ParseFromString(model.SerializeToString() + b"\xf8\x07\x01")  # field 127, varint 1
    return model


def _joined(model: onnx.ModelProto) -> tuple[bytes, int]:
    parts, total = model_io.serialized_parts(model)
    data = b"".join(p if isinstance(p, bytes) else p.SerializeToString(deterministic=True) for p in parts)
    return data, total


def test_parts_concatenate_to_the_whole_serialization():
    model = _model()
    data, total = _joined(model)
    assert data == model.SerializeToString(deterministic=True)
    assert total == len(data) == model.ByteSize()
    assert not model_io.exceeds_protobuf_limit(model)


def test_a_model_with_unknown_fields_is_written_whole():
    model = _model(with_unknown=True)
    data, total = _joined(model)
    assert data == model.SerializeToString(deterministic=True) and total == len(data)


def test_save_model_writes_the_serialized_bytes(tmp_path):
    model = _model()
    out = tmp_path / "m.onnx"
    assert model_io.save_model(model, out) == [out]
    assert out.read_bytes() == model.SerializeToString(deterministic=True)
    assert list(tmp_path.iterdir()) == [out]


def test_varint_encoding():
    assert [model_io._varint(v) for v in (0, 1, 127, 128, 300, 2**31)] == [
        b"\x00", b"\x01", b"\x7f", b"\x80\x01", b"\xac\x02", b"\x80\x80\x80\x80\x08"]


def test_load_model_reads_once_and_hashes_the_file(tmp_path):
    import hashlib

    path = tmp_path / "m.onnx"
    onnx.save(_model(), str(path))
    loaded = model_io.load_model(path)
    assert loaded.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert loaded.model.SerializeToString() == onnx.load(str(path)).SerializeToString()
    assert loaded.file_bytes == path.stat().st_size and not loaded.external_data


def test_external_data_file_gets_the_model_files_permissions(tmp_path):
    """onnx writes the external data file with mode 0600; a CI artifact whose .onnx others may read but whose
    .data they may not cannot be loaded. Both files get 0666 less the umask."""
    import os
    import stat

    w = numpy_helper.from_array(np.ones((64, 64), np.float32), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])
    model = helper.make_model(helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [x], [y], [w]))
    old = os.umask(0o022)
    try:
        model_io.save_model(model, tmp_path / "m.onnx", external_data=True)
    finally:
        os.umask(old)
    modes = {p.name.split(".")[-1]: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    assert modes == {"onnx": 0o644, "data": 0o644} and len(list(tmp_path.iterdir())) == 2


# --- validation at load (issue 20) ------------------------------------------------------------------------------

def _with_external(entries: dict[str, str]) -> onnx.TensorProto:
    t = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4], data_location=TensorProto.EXTERNAL)
    for key, value in entries.items():
        t.external_data.add(key=key, value=value)
    return t


@pytest.mark.parametrize("entries, fragment", [
    ({"location": "/etc/passwd"}, "not a file inside"),
    ({"location": "../w.bin"}, "not a file inside"),
    ({"location": "sub/../../w.bin"}, "not a file inside"),
    ({"location": ""}, "not a file inside"),
    ({"location": "w.bin", "offset": "-16"}, "offset '-16'"),
    ({"location": "w.bin", "offset": "ten"}, "offset 'ten'"),
    ({"location": "w.bin", "length": "-1"}, "length '-1'"),
])
def test_check_external_data_refuses_a_bad_reference(entries, fragment):
    with pytest.raises(InputError, match=re.escape(fragment)):
        model_io.check_external_data(_with_external(entries), "m.onnx")


def test_check_external_data_accepts_a_file_in_a_subfolder():
    info = model_io.check_external_data(_with_external({"location": "sub/w.bin", "offset": "16", "length": "16"}),
                                        "m.onnx")
    assert (info.location, info.offset, info.length) == ("sub/w.bin", 16, 16)


def test_duplicate_node_names_in_a_subgraph_are_refused_and_unnamed_nodes_are_not():
    model = _model()
    then = model.graph.node[2].attribute[0].g
    then.node.append(helper.make_node("Identity", ["w"], ["t2"], name=""))
    then.node[0].name = ""
    model_io.check_node_names(model, "m")  # two unnamed nodes: fine
    then.node[0].name = then.node[1].name = "twin"
    with pytest.raises(InputError, match="two nodes of graph 'then' are named 'twin'"):
        model_io.check_node_names(model, "m")


def _conv(op="Conv", **attrs) -> onnx.NodeProto:
    return helper.make_node(op, ["x", "w", "b"], ["y"], name="c", **attrs)


@pytest.mark.parametrize("op, shapes, attrs, fragment", [
    ("Conv", {"x": (1, 4, 8, 8), "w": (6, 2, 3, 3), "b": (6,)}, {"group": 0}, "group is 0"),
    ("Conv", {"x": (1, 4, 8, 8), "w": (6, 2, 3, 3), "b": (6,)}, {"group": 2, "strides": [1, 0]}, "strides [1, 0]"),
    ("Conv", {"x": (1, 4, 8, 8), "w": (6, 2, 3, 3), "b": (6,)}, {"group": 2, "pads": [1, 1]}, "pads [1, 1] has 2"),
    ("Conv", {"x": (1, 4, 8), "w": (6, 2, 3, 3), "b": (6,)}, {"group": 2}, "rank 3 and the weight rank 4"),
    ("Conv", {"x": (1, 4, 8, 8), "w": (6, 2, 3, 3), "b": (6,)}, {"group": 2, "kernel_shape": [3, 1]},
     "kernel_shape [3, 1] differs"),
    ("Conv", {"x": (1, 6, 8, 8), "w": (6, 2, 3, 3), "b": (6,)}, {"group": 2}, "the input has 6 channels"),
    ("Conv", {"x": (1, 4, 8, 8), "w": (5, 1, 3, 3), "b": (5,)}, {"group": 4}, "group 4 does not divide the 5"),
    ("Conv", {"x": (1, 4, 8, 8), "w": (6, 2, 3, 3), "b": (4,)}, {"group": 2}, "the bias has shape [4]"),
    ("Conv", {"x": (1, 4, 8, 8), "w": (6, 2, 3, 3), "b": (6, 1)}, {"group": 2}, "the bias has shape [6, 1]"),
    ("ConvTranspose", {"x": (1, 4, 8, 8), "w": (3, 2, 3, 3), "b": (4,)}, {}, "the input has 4 channels"),
    ("ConvTranspose", {"x": (1, 3, 8, 8), "w": (3, 2, 3, 3), "b": (2,)}, {"group": 3},
     "the bias has shape [2]"),
])
def test_check_convs_refuses_contradictions(op, shapes, attrs, fragment):
    model = helper.make_model(helper.make_graph([_conv(op, **attrs)], "g", [], []))
    info = {k: (v, np.dtype(np.float32)) for k, v in shapes.items()}
    with pytest.raises(InputError, match=re.escape(fragment)):
        model_io.check_convs(model, info, "m")


def test_check_convs_accepts_valid_and_symbolic_shapes():
    model = helper.make_model(helper.make_graph([_conv(group=2, kernel_shape=[3, 3], strides=[2, 2])], "g", [], []))
    for x in ((1, 4, 8, 8), ("N", 4, "H", "W"), ("N", "C", None, None), None):
        info = {"x": (x, None), "w": ((6, 2, 3, 3), None), "b": ((6,), None)}
        model_io.check_convs(model, info, "m")
    t = helper.make_model(helper.make_graph([_conv("ConvTranspose", group=2)], "g", [], []))
    model_io.check_convs(t, {"x": ((1, 4, 8, 8), None), "w": ((4, 3, 3, 3), None), "b": ((6,), None)}, "m")


def test_load_proto_runs_the_same_checks_as_load_model():
    model = _model()
    model.graph.node[0].attribute.append(helper.make_attribute("strides", [0, 0]))
    with pytest.raises(InputError, match=r"<ModelProto>: onnx.checker \(full_check\) rejected the model: .*strides"):
        model_io.load_proto(model)
    model = _model()
    model.graph.node[1].name = "conv"
    with pytest.raises(InputError, match="two nodes of graph 'g' are named 'conv'"):
        model_io.load_proto(model)


def test_ort_source_is_the_path_or_the_callers_proto_and_refuses_neither():
    model = helper.make_model(helper.make_graph([], "g", [], []))
    assert model_io.LoadedModel(None, None, "", 0, False, proto=model).ort_source() == model.SerializeToString()
    assert model_io.LoadedModel(None, Path("m.onnx"), "", 0, False).ort_source() == "m.onnx"
    with pytest.raises(TypeError, match="neither the file nor"):
        model_io.LoadedModel(model, None, "", 0, False).ort_source()
