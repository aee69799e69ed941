"""convert.to_model(reuse_original=True), which rewrites the input model in place and keeps its unchanged
initializers, writes exactly the bytes of graphsurgeon's export (the reference path), on the kinds of model the
export has to handle: plain initializers, IR 3 initializer inputs (folded and kept), an unused initializer input,
weights in Constant nodes, float16, and a model with subgraphs (which takes the graphsurgeon path); values of
optional and sequence type keep their types on both paths."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import TensorProto, helper

from onnxfuse import pipeline
from onnxfuse.ir import constants, convert, export
from onnxfuse.passes import select
from onnxfuse.passes.driver import run_passes
from tests.builders import GraphBuilder, subgraph


def _chain(b: GraphBuilder, x: str, n: int, c: int = 4) -> str:
    for _ in range(n):
        x = b.op("Relu", [b.bn(b.conv(x, c, c), c)])
    return b.op("Relu", [b.conv(x, c, c)])  # fuses even where the weights are overridable


def _plain():
    b = GraphBuilder(seed=1)
    return b.build(_chain(b, b.input("x", [1, 4, 6, 6]), 3))


def _ir3():
    b = GraphBuilder(seed=2)
    return b.build(_chain(b, b.input("x", [1, 4, 6, 6]), 2), initializers_as_inputs=True, ir_version=3, opset=8)


def _unused_initializer_input():
    b = GraphBuilder(seed=3)
    model = b.build(_chain(b, b.input("x", [1, 4, 6, 6]), 2), ir_version=4, opset=9)
    extra = onnx.numpy_helper.from_array(np.arange(3, dtype=np.float32), "unused_w")
    model.graph.initializer.append(extra)
    model.graph.input.append(helper.make_tensor_value_info("unused_w", TensorProto.FLOAT, [3]))
    return model


def _constant_nodes():
    b = GraphBuilder(seed=4, constants="node")
    return b.build(_chain(b, b.input("x", [1, 4, 6, 6]), 2))


def _float16():
    b = GraphBuilder(seed=5, dtype=np.float16)
    return b.build(_chain(b, b.input("x", [1, 4, 6, 6]), 2))


def _with_subgraph():
    b = GraphBuilder(seed=6)
    x = b.input("x", [1, 4, 6, 6])
    c = b.input("c", [], dtype=np.bool_)
    y = _chain(b, x, 1)
    body = GraphBuilder(seed=7, prefix="t_")
    then = subgraph(body, body.op("Relu", [y]))
    other = GraphBuilder(seed=8, prefix="e_")
    els = subgraph(other, other.op("Neg", [y]))
    return b.build([b.op("If", [c], then_branch=then, else_branch=els)], output_dtype=np.float32)


CASES = {"plain": _plain, "ir3": _ir3, "unused_initializer_input": _unused_initializer_input,
         "constant_nodes": _constant_nodes, "float16": _float16, "subgraph": _with_subgraph}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("options", [{}, {"constant_initializer_inputs": True}])
def test_in_place_export_writes_the_same_bytes_as_graphsurgeon(tmp_path, monkeypatch, case, options):
    path = tmp_path / "m.onnx"
    onnx.save(CASES[case](), str(path))
    opts = pipeline.Options(target="cpu", **options)
    taken = []
    in_place = export.export_in_place
    monkeypatch.setattr(export, "export_in_place",
                        lambda graph, model: taken.append(in_place(graph, model)) or taken[-1])
    fast = pipeline.analyse(path, opts)
    assert fast.changed and taken == [case != "subgraph"]
    real = convert.to_model
    monkeypatch.setattr(convert, "to_model", lambda graph, original, reuse_original=False: real(graph, original))
    reference = pipeline.analyse(path, opts)
    assert fast.model.SerializeToString(deterministic=True) == reference.model.SerializeToString(deterministic=True)
    onnx.checker.check_model(fast.model)


def test_in_place_export_returns_the_original_and_keeps_unchanged_weights(tmp_path):
    model = _unused_initializer_input()
    unused_before = next(t for t in model.graph.initializer if t.name == "unused_w")
    graph = convert.to_graph(model)
    out = convert.to_model(graph, model, reuse_original=True)
    assert out is model
    assert any(t is unused_before for t in out.graph.initializer)


def test_subgraphs_take_the_graphsurgeon_path():
    model = _with_subgraph()
    out = convert.to_model(convert.to_graph(model), model, reuse_original=True)
    assert out is not model


@pytest.mark.parametrize("raw", [True, False])
def test_reading_a_weight_exports_the_same_bytes_as_graphsurgeon_caching_it(raw):
    """constants.constant_value leaves a raw-bytes weight lazily referenced (exported as its original message) and
    caches any other (exported from the array): either way the bytes are those of graphsurgeon's export after
    ``Constant.values`` loaded the array."""
    b = GraphBuilder(seed=9)
    y = b.op("Relu", [b.conv(b.input("x", [1, 4, 6, 6]), 4, 4)])
    model = b.build(y)
    if not raw:
        w = model.graph.initializer[0]
        values = onnx.numpy_helper.to_array(w).reshape(-1).tolist()
        w.ClearField("raw_data")
        w.float_data.extend(values)
        w.doc_string = "stored as float_data"

    def exported(read) -> bytes:
        graph = convert.to_graph(model)
        for t in graph.tensors().values():
            if isinstance(t, gs.Constant):
                read(t)
        return gs.export_onnx(graph, do_type_check=False).SerializeToString(deterministic=True)

    ours = exported(constants.constant_value)
    assert ours == exported(lambda t: t.values)
    assert (ours == exported(lambda t: None)) is raw  # float_data is rewritten as raw bytes by the export


def test_weights_in_constant_nodes_over_the_limit_take_the_graphsurgeon_path(monkeypatch):
    model = _constant_nodes()
    assert 0 < export._attribute_elements(model.graph) <= export.IN_PLACE_MAX_ATTRIBUTE_ELEMENTS
    monkeypatch.setattr(export, "IN_PLACE_MAX_ATTRIBUTE_ELEMENTS", 0)
    out = convert.to_model(convert.to_graph(model), model, reuse_original=True)
    assert out is not model


@pytest.mark.parametrize("data_type", sorted(constants._RAW_DTYPES))
def test_constant_value_reads_raw_bytes_as_onnx_to_array_does(data_type):
    """The raw-bytes path of constants.constant_value (np.frombuffer, without onnx.numpy_helper.to_array) gives
    to_array's dtype, shape and values, for every data type it takes, and leaves the weight lazily referenced."""
    dtype = onnx.helper.tensor_dtype_to_np_dtype(data_type)
    values = (np.arange(24) % 7).astype(dtype).reshape(2, 3, 4)
    proto = helper.make_tensor("w", data_type, values.shape, values.tobytes(), raw=True)
    constant = gs.Constant("w", gs.ir.tensor.LazyValues(proto))
    got = constants.constant_value(constant)
    want = onnx.numpy_helper.to_array(proto)
    assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)
    assert not got.flags.writeable
    assert isinstance(constant._values, gs.ir.tensor.LazyValues)


def test_constant_value_of_a_tensor_with_other_fields_is_cached_as_to_array_reads_it():
    values = np.arange(6, dtype=np.float32).reshape(2, 3)
    proto = helper.make_tensor("w", TensorProto.FLOAT, values.shape, values.tobytes(), raw=True)
    proto.doc_string = "a field make_tensor(raw=True) does not write"
    constant = gs.Constant("w", gs.ir.tensor.LazyValues(proto))
    assert np.array_equal(constants.constant_value(constant), values)
    assert isinstance(constant._values, np.ndarray)  # exported from the array, as graphsurgeon would


def _non_tensor_model() -> onnx.ModelProto:
    """An optional graph input, a sequence graph output and an optional value_info, around an Identity that
    remove_redundant takes out (so the model is exported)."""
    optional = helper.make_optional_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, [2, 3]))
    sequence = helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, [None, 3]))
    nodes = [helper.make_node("Identity", ["x"], ["xi"]), helper.make_node("Optional", ["xi"], ["ox"]),
             helper.make_node("OptionalHasElement", ["o"], ["h"]), helper.make_node("OptionalGetElement", ["o"], ["e"]),
             helper.make_node("OptionalGetElement", ["ox"], ["ex"]), helper.make_node("Add", ["ex", "e"], ["y"]),
             helper.make_node("SplitToSequence", ["y", "split"], ["s"], axis=0)]
    graph = helper.make_graph(
        nodes, "non_tensor",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]), helper.make_value_info("o", optional)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("h", TensorProto.BOOL, []), helper.make_value_info("s", sequence)],
        [onnx.numpy_helper.from_array(np.array([1, 1], np.int64), "split")],
        value_info=[helper.make_value_info("ox", optional)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("reuse_original", [True, False], ids=["in-place", "graphsurgeon"])
def test_optional_and_sequence_types_survive_the_export(tmp_path, reuse_original):
    # graphsurgeon failed on the optional input (UnboundLocalError): exit 2 for a valid model
    from onnxfuse.ort.sessions import session

    model = _non_tensor_model()
    graph = convert.to_graph(model)
    ctx_result = run_passes(graph, select((), ()), _context(graph))
    assert [f.pass_name for f in ctx_result[0]] == ["remove_redundant"]
    original = onnx.ModelProto()
    original.CopyFrom(model)
    out = convert.to_model(graph, original, reuse_original=reuse_original)
    onnx.checker.check_model(out, full_check=True)
    assert [(vi.name, vi.type) for vi in out.graph.input] == [(vi.name, vi.type) for vi in model.graph.input]
    assert [(vi.name, vi.type) for vi in out.graph.output] == [(vi.name, vi.type) for vi in model.graph.output]
    assert [(vi.name, vi.type) for vi in out.graph.value_info if vi.name == "ox"] == \
        [("ox", model.graph.value_info[0].type)]
    feeds = {"x": np.arange(6, dtype=np.float32).reshape(2, 3), "o": np.full((2, 3), 0.5, np.float32)}
    want = session(model.SerializeToString()).run(None, feeds)
    got = session(out.SerializeToString()).run(None, feeds)
    for a, b in zip(got[:2], want[:2], strict=True):
        np.testing.assert_array_equal(a, b)
    assert len(got[2]) == len(want[2]) == 2
    for a, b in zip(got[2], want[2], strict=True):
        np.testing.assert_array_equal(a, b)


def _context(graph):
    from onnxfuse.ort.providers import get_target
    from onnxfuse.passes import Context

    return Context(get_target("cpu"), frozenset(), {}, namer=constants.Namer(graph))
