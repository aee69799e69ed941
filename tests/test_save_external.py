"""model_io.save_model with external data: replacing an OUTPUT is committed by the one rename of the model file
(issue: hostile inputs and faults). Failures and kills are injected at the commit point, between the data file's
move and the model's."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxfuse.errors import InputError
from onnxfuse.model import io as model_io
from onnxfuse.ort.sessions import session

X = np.arange(64, dtype=np.float32).reshape(1, 64) / 7


def _model(scale: float) -> onnx.ModelProto:
    """y = x @ W with W = scale * a fixed 64x64 matrix (16 KiB: above onnx's 1 KiB external-data threshold)."""
    w = (np.arange(64 * 64, dtype=np.float32).reshape(64, 64) % 13 - 6) * scale
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
                              [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _expected(scale: float) -> np.ndarray:
    w = numpy_helper.to_array(_model(scale).graph.initializer[0])
    return X @ w


def _run(path) -> np.ndarray:
    return session(str(path)).run(None, {"x": X})[0]


def _data_files(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".data"))


def test_replacing_an_external_data_output_removes_the_old_weights(tmp_path):
    out = tmp_path / "out.onnx"
    model_io.save_model(_model(1.0), out, external_data=True)
    [old_data] = _data_files(tmp_path)
    written = model_io.save_model(_model(2.0), out, external_data=True)
    [new_data] = _data_files(tmp_path)
    assert new_data != old_data and written == [out, tmp_path / new_data]
    np.testing.assert_allclose(_run(out), _expected(2.0), rtol=1e-5)  # scales 1 and 2 differ 2x
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["out.onnx", new_data])  # no temporary folder


def test_failure_at_the_commit_leaves_the_old_pair_and_says_nothing_was_written(tmp_path, monkeypatch):
    """An EIO between the data file's move and the model's rename used to leave the old model beside the new
    weights (it loaded, ran and was wrong) while the message said "nothing was written"."""
    out = tmp_path / "out.onnx"
    model_io.save_model(_model(1.0), out, external_data=True)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def fail():
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(model_io, "_commit_hook", fail)
    with pytest.raises(InputError, match="nothing was written"):
        model_io.save_model(_model(2.0), out, external_data=True)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # the new data file went too
    np.testing.assert_allclose(_run(out), _expected(1.0), rtol=1e-5)  # scales 1 and 2 differ 2x


def test_a_kill_at_the_commit_leaves_the_old_pair_working(tmp_path):
    """The process dies (os._exit: no cleanup, as SIGKILL) between the data file's move and the model's rename:
    the old model still loads with its own weights and computes its old outputs."""
    out = tmp_path / "out.onnx"
    model_io.save_model(_model(1.0), out, external_data=True)
    code = (
        "import sys, os\n"
        "from onnxfuse.model import io as model_io\n"
        "from tests.test_save_external import _model\n"
        "model_io._commit_hook = lambda: os._exit(9)\n"
        "model_io.save_model(_model(2.0), sys.argv[1], external_data=True)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code, str(out)], cwd=root, env=env, capture_output=True)
    assert proc.returncode == 9, proc.stderr.decode()
    np.testing.assert_allclose(_run(out), _expected(1.0), rtol=1e-5)  # scales 1 and 2 differ 2x
    assert len(_data_files(tmp_path)) == 2  # the old weights and the orphaned new ones, which nothing references


def test_same_weights_give_the_same_name_and_bytes(tmp_path):
    """Named by content: a rerun writes the same model bytes and keeps the data file it finds."""
    out = tmp_path / "out.onnx"
    model_io.save_model(_model(1.0), out, external_data=True)
    first = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    model_io.save_model(_model(1.0), out, external_data=True)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == first
    np.testing.assert_allclose(_run(out), _expected(1.0), rtol=1e-5)  # scales 1 and 2 differ 2x


def test_output_that_loses_its_external_data_removes_the_stale_file(tmp_path):
    """An OUTPUT written with external data, then replaced by a model with its weights inline: the old data file
    is onnxfuse's and nothing references it any more."""
    out = tmp_path / "out.onnx"
    model_io.save_model(_model(1.0), out, external_data=True)
    model_io.save_model(_model(2.0), out)
    assert _data_files(tmp_path) == []
    np.testing.assert_allclose(_run(out), _expected(2.0), rtol=1e-5)  # scales 1 and 2 differ 2x


def test_data_files_not_named_by_onnxfuse_are_left_alone(tmp_path):
    """The old OUTPUT's weights in a file of another name (an exporter's, possibly shared) are not removed."""
    out = tmp_path / "out.onnx"
    onnx.save(_model(1.0), str(out), save_as_external_data=True, location="shared.bin", size_threshold=0)
    model_io.save_model(_model(2.0), out, external_data=True)
    assert (tmp_path / "shared.bin").exists()
    np.testing.assert_allclose(_run(out), _expected(2.0), rtol=1e-5)  # scales 1 and 2 differ 2x


@pytest.mark.parametrize("length", [240, 250, 255])
def test_long_output_names_are_written(tmp_path, length):
    """Names up to NAME_MAX (255 bytes here) are legal: the temporary names are short, and the data file's name
    shortens the model name to fit."""
    out = tmp_path / ("m" * (length - 5) + ".onnx")
    written = model_io.save_model(_model(1.0), out, external_data=True)
    assert written[0].name == out.name and all(len(p.name) <= 255 for p in written)
    np.testing.assert_allclose(_run(out), _expected(1.0), rtol=1e-5)  # scales 1 and 2 differ 2x


def test_data_file_name_fits_name_max():
    digest = "0123456789abcdef" * 4
    assert model_io.data_file_name("m.onnx", digest) == "m.onnx.0123456789abcdef.data"
    assert len(model_io.data_file_name("é" * 200, digest).encode()) <= 255


def test_a_symlink_into_another_folder_is_refused_for_external_data(tmp_path):
    """The data file would go beside the link's target, where onnx and onnxruntime opening the link do not look."""
    (tmp_path / "real").mkdir()
    (tmp_path / "links").mkdir()
    (tmp_path / "real" / "target.onnx").write_bytes(b"")
    link = tmp_path / "links" / "out.onnx"
    link.symlink_to("../real/target.onnx")
    with pytest.raises(InputError, match="symbolic link into another folder"):
        model_io.save_model(_model(1.0), link, external_data=True)
    assert (tmp_path / "real" / "target.onnx").read_bytes() == b""
    model_io.save_model(_model(1.0), link)  # inline: the link is written through
    np.testing.assert_allclose(_run(link), _expected(1.0), rtol=1e-5)


def test_replacing_a_long_named_output_removes_its_old_weights(tmp_path):
    """The data file's name shortens the model name to fit NAME_MAX; the clean-up still knows it as its own."""
    out = tmp_path / ("a" * 250 + ".onnx")
    model_io.save_model(_model(1.0), out, external_data=True)
    model_io.save_model(_model(2.0), out, external_data=True)
    assert len(_data_files(tmp_path)) == 1
    np.testing.assert_allclose(_run(out), _expected(2.0), rtol=1e-5)
