"""Weights left on disk (issue 35, large files): ``onnxfuse optimize --no-verify`` on a model with external data
reads the large weights only where a pass reads them (``model_io.load_model(lazy=True)``, memory-mapped) and
writes the output's data file by copying the unchanged ones file to file. Here the size threshold is lowered so
that a model of a few hundred KB takes that path; memory and time are measured in benchmarks/make_large.py
(BENCHMARKS.md), not here."""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from onnxfuse.cli.main import main
from onnxfuse.errors import InputError
from onnxfuse.model import io as model_io
from tests.conftest import assert_same_outputs

D = 64  # every large weight is D x D float32: 16 KiB, above the lowered threshold
THRESHOLD = 4096


@pytest.fixture(autouse=True)
def low_threshold(monkeypatch):
    monkeypatch.setattr(model_io, "LAZY_MIN_BYTES", THRESHOLD)


def _model(zero_weight: bool = False) -> onnx.ModelProto:
    """x [1, D, 1, 1] -> Conv(1x1) -> BatchNormalization -> Relu -> Flatten -> MatMul -> Add -> Relu: the Conv
    weight is folded (conv_batchnorm), the MatMul's is carried unchanged into a Gemm (matmul_add); ``zero_weight``:
    the MatMul weight is zeros (a hole in a sparse data file)."""
    rng = np.random.default_rng(0)

    def init(name, arr):
        return numpy_helper.from_array(np.asarray(arr, dtype=np.float32), name)

    mm = np.zeros((D, D)) if zero_weight else rng.standard_normal((D, D)) / 8
    inits = [init("conv.w", rng.standard_normal((D, D, 1, 1)) / 8), init("conv.b", rng.uniform(-.1, .1, D)),
             init("bn.scale", rng.uniform(.5, 1.5, D)), init("bn.bias", rng.uniform(-.1, .1, D)),
             init("bn.mean", rng.uniform(-.1, .1, D)), init("bn.var", rng.uniform(.5, 1.5, D)),
             init("mm.w", mm), init("mm.b", rng.uniform(-.1, .1, D))]
    nodes = [helper.make_node("Conv", ["x", "conv.w", "conv.b"], ["c"], name="Conv", kernel_shape=[1, 1]),
             helper.make_node("BatchNormalization", ["c", "bn.scale", "bn.bias", "bn.mean", "bn.var"], ["bn"],
                              name="BN"),
             helper.make_node("Relu", ["bn"], ["r"], name="Relu"),
             helper.make_node("Flatten", ["r"], ["f"], name="Flatten", axis=1),
             helper.make_node("MatMul", ["f", "mm.w"], ["m"], name="MatMul"),
             helper.make_node("Add", ["m", "mm.b"], ["a"], name="Add"),
             helper.make_node("Relu", ["a"], ["y"], name="Relu2")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, D, 1, 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, D])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _save_input(folder: Path, zero_weight: bool = False) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / "in.onnx"
    onnx.save_model(_model(zero_weight), str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="in.onnx.data", size_threshold=1024)
    return path


def _digests(folder: Path) -> dict[str, tuple[str, int]]:
    return {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns) for p in folder.iterdir()}


def _optimize(src: Path, out: Path, *extra: str):
    return CliRunner().invoke(main, ["optimize", str(src), str(out), "--no-verify", "--target", "cpu", *extra],
                              catch_exceptions=False)


def test_lazy_load_leaves_large_weights_on_disk_and_reads_them_as_an_eager_load(tmp_path):
    src = _save_input(tmp_path / "in")
    lazy = model_io.load_model(src, lazy=True).model
    eager = model_io.load_model(src).model
    assert lazy is not None and eager is not None
    assert {t.name for t in lazy.graph.initializer if model_io.is_lazy(t)} == {"conv.w", "mm.w"}
    for t in lazy.graph.initializer:
        if model_io.is_lazy(t):
            got = model_io.external_array(t)
            assert not got.flags.writeable
            np.testing.assert_array_equal(got, numpy_helper.to_array(next(
                e for e in eager.graph.initializer if e.name == t.name)))
    # the report's size of the model counts the weights still on disk as an eager load holds them
    assert model_io.inline_bytes(lazy) == model_io.serialized_parts(eager)[1] == eager.ByteSize()
    model_io.materialize(lazy)
    assert not model_io.has_lazy(lazy)
    assert lazy.SerializeToString() == eager.SerializeToString()


def test_no_verify_output_with_external_data_matches_the_original_in_onnxruntime(tmp_path):
    src = _save_input(tmp_path / "in")
    out = tmp_path / "out" / "out.onnx"
    out.parent.mkdir()
    result = _optimize(src, out)
    assert result.exit_code == 0, result.output
    fused = onnx.load(str(out))  # its data file beside it
    assert {n.op_type for n in fused.graph.node} >= {"FusedConv"}
    assert any(t.data_location == TensorProto.EXTERNAL for t in onnx.load(str(out), load_external_data=False)
               .graph.initializer)
    onnx.checker.check_model(str(out), full_check=True)
    assert_same_outputs(onnx.load(str(src)), fused)


def test_no_verify_output_is_the_eager_runs_output(tmp_path, monkeypatch):
    """Leaving weights on disk changes no byte of the output: the model file and its data file are those of the
    run that reads every weight in (the threshold above every tensor)."""
    src = _save_input(tmp_path / "in")
    outs = []
    for threshold in (THRESHOLD, 1 << 40):
        monkeypatch.setattr(model_io, "LAZY_MIN_BYTES", threshold)
        out = tmp_path / f"out{len(outs)}" / "out.onnx"
        out.parent.mkdir()
        assert _optimize(src, out).exit_code == 0
        outs.append(out)
    for a, b in [(outs[0], outs[1])]:
        assert a.read_bytes() == b.read_bytes()
        [da], [db] = ([p for p in o.parent.iterdir() if p.name.endswith(".data")] for o in (a, b))
        assert da.name == db.name and da.read_bytes() == db.read_bytes()


def test_unchanged_weights_are_byte_identical_and_the_input_is_unchanged(tmp_path):
    src = _save_input(tmp_path / "in")
    before = _digests(src.parent)
    out = tmp_path / "out.onnx"
    assert _optimize(src, out).exit_code == 0
    assert _digests(src.parent) == before
    original = {t.name: t for t in onnx.load(str(src)).graph.initializer}
    written = {t.name: t for t in onnx.load(str(out)).graph.initializer}
    kept = set(original) & set(written)
    assert "mm.w" in kept  # the MatMul weight goes into the Gemm unchanged
    for name in kept:
        assert written[name].raw_data == original[name].raw_data, name


def test_zeros_stay_holes_where_the_input_has_them(tmp_path):
    src = _save_input(tmp_path / "in", zero_weight=True)
    data = src.parent / "in.onnx.data"
    # punch the zero weight out of the input's data file (onnx wrote it as zeros)
    info = next(onnx.external_data_helper.ExternalDataInfo(t) for t in onnx.load(str(src), load_external_data=False)
                .graph.initializer if t.name == "mm.w")
    blocks_before = data.stat().st_blocks
    size = data.stat().st_size
    with open(data, "r+b") as fh:
        tail = fh.read()[info.offset + info.length:]
        fh.truncate(info.offset)
        fh.truncate(size)
        fh.seek(info.offset + info.length)
        fh.write(tail)
    if data.stat().st_blocks >= blocks_before:
        pytest.skip("this file system keeps no holes")
    out = tmp_path / "out.onnx"
    result = _optimize(src, out)
    assert result.exit_code == 0, result.output
    [written] = [p for p in tmp_path.iterdir() if p.name.endswith(".data")]
    assert written.stat().st_blocks * 512 < written.stat().st_size - info.length // 2
    assert_same_outputs(onnx.load(str(src)), onnx.load(str(out)))


@pytest.mark.parametrize("where", ["copy", "commit"])
def test_a_failure_mid_write_leaves_no_output_no_stray_file_and_the_model_whole(tmp_path, monkeypatch, where):
    src = _save_input(tmp_path / "in")
    before = _digests(src.parent)
    loaded = model_io.load_model(src, lazy=True)
    model = loaded.model
    assert model is not None
    entries = {t.name: [(e.key, e.value) for e in t.external_data] for t in model.graph.initializer}

    def fail(*_args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(model_io, "_copy_bytes" if where == "copy" else "_commit_hook", fail)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with pytest.raises(InputError, match="nothing was written"):
        model_io.save_model(model, out_dir / "out.onnx", external_data=True, protected=loaded.data_files)
    assert list(out_dir.iterdir()) == []
    assert _digests(src.parent) == before
    # the model in memory reads the input's weights as before, and a retry writes it whole
    assert {t.name: [(e.key, e.value) for e in t.external_data] for t in model.graph.initializer} == entries
    monkeypatch.undo()
    monkeypatch.setattr(model_io, "LAZY_MIN_BYTES", THRESHOLD)
    model_io.save_model(model, out_dir / "out.onnx", external_data=True, protected=loaded.data_files)
    assert_same_outputs(onnx.load(str(src)), onnx.load(str(out_dir / "out.onnx")))


def test_a_saved_lazy_model_reads_its_new_file_and_saves_again(tmp_path):
    src = _save_input(tmp_path / "in")
    model = model_io.load_model(src, lazy=True).model
    assert model is not None
    first, second = tmp_path / "a" / "m.onnx", tmp_path / "b" / "m.onnx"
    first.parent.mkdir()
    second.parent.mkdir()
    model_io.save_model(model, first, external_data=True)
    assert all(str(first.parent) in {e.value for e in t.external_data}
               for t in model.graph.initializer if model_io.is_lazy(t))
    os.remove(src.parent / "in.onnx.data")  # nothing reads the input's data any more
    model_io.save_model(model, second, external_data=True)
    assert first.read_bytes() == second.read_bytes()
    assert_same_outputs(onnx.load(str(first)), onnx.load(str(second)))


def test_a_range_beyond_the_data_file_is_refused_in_one_line(tmp_path):
    src = _save_input(tmp_path / "in")
    data = src.parent / "in.onnx.data"
    with open(data, "r+b") as fh:
        fh.truncate(data.stat().st_size - 8)
    with pytest.raises(InputError) as exc:
        model_io.load_model(src, lazy=True)
    assert "\n" not in str(exc.value) and "in.onnx.data" in str(exc.value)


def test_a_data_file_truncated_after_the_load_is_an_input_error_when_read(tmp_path):
    src = _save_input(tmp_path / "in")
    model = model_io.load_model(src, lazy=True).model
    assert model is not None
    with open(src.parent / "in.onnx.data", "r+b") as fh:
        fh.truncate(0)
    [lazy] = [t for t in model.graph.initializer if model_io.is_lazy(t) and t.name == "conv.w"]
    with pytest.raises(InputError, match="changed since the model was read"):
        model_io.external_array(lazy)
    with pytest.raises(InputError, match="changed since the model was read"):
        model_io.materialize(model)


def test_folded_weights_wait_on_disk_and_their_folder_goes_with_the_result(tmp_path):
    import gc

    from onnxfuse import pipeline

    src = _save_input(tmp_path / "in")
    options = pipeline.make_options(target="cpu")
    options.compare_with_onnxruntime = False  # as --no-verify: no onnxruntime session
    result = pipeline.analyse(src, options)
    [folded] = [t for t in result.model.graph.initializer if t.name == "Conv.weight_folded"]
    assert model_io.is_lazy(folded)
    # the report sizes the model as the run that holds every weight in memory does
    eager = pipeline.analyse(src, options, model_io.load_model(src))
    assert result.report.to_dict()["model"]["optimized_bytes"] == eager.report.to_dict()["model"]["optimized_bytes"]
    folder = Path(next(e.value for e in folded.external_data if e.key == model_io.BASEPATH_KEY))
    assert folder.is_dir() and folder != src.parent
    out = tmp_path / "out.onnx"
    result.save(out)
    assert_same_outputs(onnx.load(str(src)), onnx.load(str(out)))
    del result, folded
    gc.collect()
    assert not folder.exists()


def test_in_place_copies_the_weights_before_the_input_data_goes(tmp_path):
    src = _save_input(tmp_path / "in")
    original = onnx.load(str(src))
    result = _optimize(src, src, "--in-place")
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in src.parent.iterdir())
    assert "in.onnx.data" not in names and len(names) == 2  # the model and its new data file, nothing else
    assert_same_outputs(original, onnx.load(str(src)))


def test_a_weight_that_cannot_be_mapped_is_read_instead(tmp_path, monkeypatch):
    import mmap

    src = _save_input(tmp_path / "in")
    model = model_io.load_model(src, lazy=True).model
    assert model is not None
    [lazy] = [t for t in model.graph.initializer if t.name == "conv.w"]
    mapped = model_io.external_array(lazy)

    def no_mapping(*_args, **_kwargs):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(mmap, "mmap", no_mapping)
    np.testing.assert_array_equal(model_io.external_array(lazy), mapped)
