"""optimize's onnxruntime sessions: verification's noise-floor session (the original at ORT_ENABLE_ALL) also writes
the graph that the report's comparison with onnxruntime at level ``all`` needs, so that comparison makes no second
session of the original; the verdict and the report are those of separate sessions."""

from __future__ import annotations

import onnx
import pytest

from onnxfuse import pipeline
from onnxfuse.ort import optimized_graph as ort_graph
from onnxfuse.ort import sessions as runtime
from onnxfuse.verification.models import ACCUMULATING_OPS, weights_moved_by_one_ulp
from onnxfuse.verification.options import VerifyOptions
from tests.test_verify import deep_net


@pytest.fixture
def made(monkeypatch):
    """(level, writes its optimized graph) of every onnxruntime session made, in order."""
    sessions = []
    real = runtime.session

    def counting(model, level="disable", *args, **kwargs):
        sessions.append((level, bool(kwargs.get("save_to"))))
        return real(model, level, *args, **kwargs)

    monkeypatch.setattr(runtime, "session", counting)
    return sessions


@pytest.fixture(scope="module")
def deep(tmp_path_factory):
    """A deep Conv -> BN -> HardSwish net whose fold verification passes only with onnxruntime's noise floor."""
    path = tmp_path_factory.mktemp("deep") / "deep.onnx"
    onnx.save(deep_net(blocks=20), path)
    return path


def _separately(path, options: pipeline.Options) -> dict:
    """The report of optimize as made before: verification, then a comparison with its own sessions."""
    analysed = pipeline.analyse(path, options)  # runtime_graphs makes both sessions itself
    return analysed.report.to_dict()


def test_floor_session_writes_the_original_graph_at_level_all(made, deep):
    result = pipeline.optimize(deep, pipeline.Options(), VerifyOptions())
    v = result.report.verification
    assert v.status == "passed" and v.floor_note is None and v.outputs[0].floor > 0  # the floor was measured
    # original, candidate, original at all (the floor, writing its graph), candidate at all (its graph)
    assert made == [("disable", False), ("disable", False), ("all", True), ("all", True)]
    made.clear()
    doc, alone = result.report.to_dict(), _separately(deep, pipeline.Options())
    assert ("all", True) in made and len(made) == 2  # the comparison alone: both sessions of its own
    assert doc["onnxruntime"]["status"] == "compared"
    assert doc["onnxruntime"] == alone["onnxruntime"]
    assert doc["fusions"] == alone["fusions"]


def test_floor_graph_is_not_used_at_another_level(made, deep):
    result = pipeline.optimize(deep, pipeline.Options(ort_level="extended"), VerifyOptions())
    assert result.report.verification.status == "passed"
    assert made == [("disable", False), ("disable", False), ("all", False), ("extended", True), ("extended", True)]
    assert result.report.to_dict()["onnxruntime"] == _separately(deep, pipeline.Options(ort_level="extended"))[
        "onnxruntime"]


def test_no_floor_session_leaves_the_comparison_its_own(made, tmp_path):
    path = tmp_path / "block.onnx"
    onnx.save(deep_net(blocks=1, gain=1.0), path)
    result = pipeline.optimize(path, pipeline.Options(), VerifyOptions())
    assert result.report.verification.status == "passed"
    assert result.report.verification.floor_note.startswith("not measured")
    assert made == [("disable", False), ("disable", False), ("all", True), ("all", True)]
    assert result.report.to_dict()["onnxruntime"] == _separately(path, pipeline.Options())["onnxruntime"]


def test_an_unreadable_floor_graph_falls_back_to_a_session_of_its_own(made, deep, monkeypatch):
    monkeypatch.setattr(ort_graph, "read_graph", lambda path: None)  # as if the floor session wrote nothing usable
    result = pipeline.optimize(deep, pipeline.Options(), VerifyOptions())
    assert made == [("disable", False), ("disable", False), ("all", True), ("all", True), ("all", True)]
    assert result.report.to_dict()["onnxruntime"] == _separately(deep, pipeline.Options())["onnxruntime"]


def test_read_graph_of_a_missing_or_truncated_file(tmp_path):
    assert ort_graph.read_graph(str(tmp_path / "none.onnx")) is None
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x0a\xff\xff\xff")
    assert ort_graph.read_graph(str(bad)) is None


def test_no_verify_and_comparison_off_make_no_floor_graph(made, deep):
    pipeline.optimize(deep, pipeline.Options(compare_with_onnxruntime=False), VerifyOptions())
    assert made == [("disable", False), ("disable", False), ("all", False)]
    made.clear()
    pipeline.optimize(deep, pipeline.Options(compare_with_onnxruntime=False), None)
    assert made == []


def _moved_reference(model: onnx.ModelProto, seed: int = 0) -> dict[str, bytes]:
    """The rounding floor's weights as first written: both neighbours of every element, then a seeded choice."""
    import numpy as np
    from onnx import numpy_helper

    rng = np.random.default_rng(seed)
    weights = {n.input[1] for n in model.graph.node if n.op_type in ACCUMULATING_OPS and len(n.input) > 1}
    out = {}
    for t in model.graph.initializer:
        if t.name not in weights:
            continue
        a = numpy_helper.to_array(t)
        up = rng.integers(0, 2, a.shape).astype(bool)
        with np.errstate(over="ignore"):  # the largest finite value's neighbour towards +inf is inf
            b = np.where(up, np.nextafter(a, np.array(np.inf, a.dtype)), np.nextafter(a, np.array(-np.inf, a.dtype)))
        out[t.name] = b.astype(a.dtype).tobytes()
    return out


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_weights_moved_by_one_ulp_same_values_as_both_neighbours_then_a_choice(dtype):
    """One nextafter per element towards the chosen side gives the bytes of computing both neighbours and choosing,
    on zeros of both signs, subnormals, the largest finite values, infinities and NaN; in place or on a copy."""
    import numpy as np
    from onnx import helper, numpy_helper

    dt = np.dtype(dtype)
    info = np.finfo(dt)
    special = np.array([0.0, -0.0, info.smallest_subnormal, -info.smallest_subnormal, info.max, -info.max,
                        np.inf, -np.inf, np.nan, 1.0, -1.0, info.tiny, -info.tiny], dtype=dt)
    rng = np.random.default_rng(3)
    w1 = np.concatenate([special, rng.standard_normal(64 * 3 * 3 - special.size).astype(dt)]).reshape(64, 1, 3, 3)
    w2 = rng.standard_normal((8, 64)).astype(dt)
    elem = helper.np_dtype_to_tensor_dtype(dt)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w1"], ["y"], name="c", group=1),
         helper.make_node("Flatten", ["y"], ["f"], name="f"),
         helper.make_node("Gemm", ["f", "w2"], ["z"], name="g", transB=1)], "g",
        [helper.make_tensor_value_info("x", elem, [1, 1, 3, 3])], [helper.make_tensor_value_info("z", elem, None)],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    expected = _moved_reference(model)
    assert set(expected) == {"w1", "w2"}
    copy = weights_moved_by_one_ulp(model)
    original = model.SerializeToString()
    moved = {t.name: t.raw_data for t in copy.graph.initializer}
    assert moved == expected
    assert model.SerializeToString() == original  # not in place: the input is left as it was
    same = weights_moved_by_one_ulp(model, in_place=True)
    assert same is model and {t.name: t.raw_data for t in model.graph.initializer} == expected


def test_one_temporary_file_of_the_output_for_verification_and_comparison(made, deep, monkeypatch):
    written = []
    real = runtime._write_temporary
    monkeypatch.setattr(runtime, "_write_temporary", lambda model: written.append(model) or real(model))
    result = pipeline.optimize(deep, pipeline.Options(ort_level="extended"), VerifyOptions())
    assert result.report.verification.status == "passed"
    assert sum(1 for m in written if m is result.model) == 1  # was 2: one for each session of the output
    assert ("disable", False) in made and made[-1] == ("extended", True)
    assert result.report.to_dict()["onnxruntime"] == _separately(deep, pipeline.Options(ort_level="extended"))[
        "onnxruntime"]


def test_without_a_temporary_folder_the_output_is_given_as_bytes(made, deep, monkeypatch):
    """Where no temporary file can be written, each session gets the serialized output, as before."""
    monkeypatch.setattr(runtime, "_write_temporary", lambda model: None)
    result = pipeline.optimize(deep, pipeline.Options(), VerifyOptions())
    assert result.report.verification.status == "passed"
    assert result.report.to_dict()["onnxruntime"]["status"] == "compared"


def test_trimming_hands_the_heap_back_from_a_thread_while_the_body_runs(monkeypatch):
    import threading
    import time

    calls = []
    monkeypatch.setattr(runtime, "trim_heap", lambda: calls.append(threading.get_ident()))
    with runtime.trimming(0.001):
        time.sleep(0.05)
    done = len(calls)
    time.sleep(0.01)
    assert done >= 1 and len(calls) == done  # stopped with the body
    assert threading.get_ident() not in calls


def test_a_session_built_trimming_computes_the_same_outputs(deep, monkeypatch):
    calls = []
    real = runtime.trim_heap
    monkeypatch.setattr(runtime, "trim_heap", lambda: calls.append(1) or real())
    feeds = None
    outputs = []
    for trim in (False, True):
        sess = runtime.session(str(deep), "all", spinning=False, trim=trim)
        feeds = feeds or runtime.make_inputs(sess, runtime.InputSpec(), 0)
        outputs.append(sess.run(None, feeds))
        assert bool(calls) == trim  # at least the trim once it is built
    assert all(a.tobytes() == b.tobytes() for a, b in zip(*outputs, strict=True))


def test_every_session_of_a_verified_optimize_is_built_trimming(deep, monkeypatch):
    trims = []
    real = runtime.session

    def recording(model, level="disable", *args, **kwargs):
        trims.append(kwargs.get("trim", False))
        return real(model, level, *args, **kwargs)

    monkeypatch.setattr(runtime, "session", recording)
    result = pipeline.optimize(deep, pipeline.Options(), VerifyOptions())
    assert result.report.verification.status == "passed"
    assert len(trims) >= 3 and all(trims)


def test_loadable_as_file_holds_no_reference_to_the_proto_once_written(deep):
    import sys

    model = onnx.load(str(deep))
    before = sys.getrefcount(model)
    with runtime.loadable(model, as_file=True) as src:
        assert isinstance(src, str)
        assert sys.getrefcount(model) == before  # the caller may free it while the session of src lives
    assert onnx.load(str(deep)) == model  # left whole
