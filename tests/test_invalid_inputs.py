"""Hostile and invalid inputs (issue 20, points 5, 6 and 10): each is an input error (exit 2) with one line on
stderr that names the problem, no traceback, the input unchanged and no file written; an unexpected exception
is exit 3 with one line, never exit 1 (the code for "the optimized model does not match")."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

from onnxfuse import pipeline
from onnxfuse.cli.main import main
from onnxfuse.errors import DEBUG_ENV, EXIT_INTERNAL, internal_error_line
from tests.builders import GraphBuilder, with_output_shapes
from tests.conftest import REPO

SAMPLE = REPO / "sample_models" / "resnet_block.onnx"


def run_cli(*args) -> object:
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def _files(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def assert_refused(folder: Path, args: list, *fragments: str) -> str:
    """Running ``args`` exits 2 with exactly one ``error:`` line on stderr holding every fragment, and leaves
    ``folder`` as it was (input unchanged, no output, no report, no temporary file). Returns the line."""
    before = _files(folder)
    result = run_cli(*args)
    lines = result.stderr.splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert _files(folder) == before
    return lines[0]


def _fixed_output(model: onnx.ModelProto, dims: list[int]) -> onnx.ModelProto:
    """``model`` with its first output declared as float ``dims`` (an exporter's fixed output shape)."""
    model.graph.output[0].type.CopyFrom(helper.make_tensor_type_proto(TensorProto.FLOAT, dims))
    return model


def _conv_relu(**conv_attrs) -> onnx.ModelProto:
    b = GraphBuilder()
    x = b.input("x", [1, 3, 8, 8])
    return _fixed_output(b.model(b.op("Relu", [b.conv(x, 3, 4, **conv_attrs)])), [1, 4, 8, 8])


def _bias_length_before_bn() -> onnx.ModelProto:
    b = GraphBuilder()
    x = b.input("x", [1, 3, 8, 8])
    conv = b.op("Conv", [x, b.const(b.rand(4, 3, 3, 3)), b.const(b.rand(3))], pads=[1, 1, 1, 1])
    return b.build(b.bn(conv, 4))


def _group_not_dividing_c() -> onnx.ModelProto:
    b = GraphBuilder()
    x = b.input("x", [1, 3, 8, 8])
    conv = b.op("Conv", [x, b.const(b.rand(4, 1, 3, 3))], pads=[1, 1, 1, 1], group=2)
    return _fixed_output(b.model(b.op("Relu", [conv])), [1, 4, 8, 8])


def _kernel_shape_not_w() -> onnx.ModelProto:
    b = GraphBuilder()
    x = b.input("x", [1, 3, 8, 8])
    return b.build(b.op("Relu", [b.conv(x, 3, 4, kernel_shape=[5, 5])]))  # W is 3x3; no declared output shape


def _duplicate_node_names() -> onnx.ModelProto:
    b = GraphBuilder()
    x = b.input("x", [1, 3, 8, 8])
    conv = b.conv(x, 3, 4)
    relu = b.op("Relu", [conv])
    b.nodes[-1].name = b.nodes[-2].name
    return b.build(relu)


def _pad_axes_repeated() -> onnx.ModelProto:
    b = GraphBuilder()
    x = b.input("x", [1, 3, 6, 6])
    pads, value, axes = (b.const(np.array([1, 1, 1, 1], np.int64)), b.const(np.float32(0)),
                         b.const(np.array([2, 2], np.int64)))
    padded = b.op("Pad", [x, pads, value, axes])
    return _fixed_output(b.model(b.op("Relu", [b.conv(padded, 3, 4)]), opset=18), [1, 4, 8, 6])


def _batchnorm_parameter_length() -> onnx.ModelProto:
    b = GraphBuilder()
    return _fixed_output(b.model(b.bn(b.conv(b.input("x", [2, 3, 6, 6]), 3, 4), 5)), [2, 4, 6, 6])


INVALID_MODELS = {
    "conv-stride-0": (lambda: _conv_relu(strides=[0, 0]), "strides must only contain positive values"),
    "conv-stride-negative": (lambda: _conv_relu(strides=[-1, 1]), "strides must only contain positive values"),
    "conv-dilation-0": (lambda: _conv_relu(dilations=[0, 1]), "dilations must only contain positive values"),
    "conv-pad-negative": (lambda: _conv_relu(pads=[-1, -1, -1, -1]), "pads must not contain negative values"),
    "conv-bias-length": (_bias_length_before_bn, "the bias has shape [3]"),
    "conv-group-not-dividing-c": (_group_not_dividing_c, "the input has 3 channels"),
    "conv-kernel-shape-not-w": (_kernel_shape_not_w, "kernel_shape [5, 5] differs from the weight's"),
    "duplicate-node-names": (_duplicate_node_names, "two nodes of graph"),
    "pad-axes-repeated": (_pad_axes_repeated, "Axis 2 is referred to more than once"),
    "batchnorm-parameter-length": (_batchnorm_parameter_length, "BatchNormalization"),
}


@pytest.mark.parametrize("verify", ["verify", "--no-verify"])
@pytest.mark.parametrize("case", list(INVALID_MODELS))
def test_an_invalid_model_is_an_input_error_also_without_verification(tmp_path, case, verify):
    build, fragment = INVALID_MODELS[case]
    path = tmp_path / "m.onnx"
    onnx.save(build(), str(path))
    args = ["optimize", path, tmp_path / "out.onnx"] + (["--no-verify"] if verify == "--no-verify" else [])
    assert_refused(tmp_path, args, str(path), fragment)
    assert_refused(tmp_path, ["report", path], str(path), fragment)


def test_declared_shapes_that_contradict_the_operators_are_let_through_with_a_warning(tmp_path):
    """Documented (model_io.check_shapes): onnxruntime runs such a model and onnxfuse counts inferred shapes only,
    so a stale declared output shape is a warning, not an input error."""
    b = GraphBuilder()
    x = b.input("x", [1, 3, 8, 8])
    path = tmp_path / "m.onnx"
    onnx.save(_fixed_output(b.model(b.op("Relu", [b.bn(b.conv(x, 3, 4), 4)])), [2, 4, 8, 8]), str(path))
    result = run_cli("optimize", path, tmp_path / "o.onnx")
    assert result.exit_code == 0, result.output
    assert "verification: passed" in result.stdout
    (warning,) = [line for line in result.stderr.splitlines() if "declares shapes" in line]
    assert warning.startswith("warning: the model declares shapes that its operators contradict")
    assert "full_check rejects it" in warning


def _custom_op_model() -> onnx.ModelProto:
    """Conv -> Relu (fusable) beside a node of a domain onnxruntime has no kernel for (onnx.checker accepts it)."""
    b = GraphBuilder()
    x = b.input("x", [1, 3, 8, 8])
    y = b.op("Relu", [b.conv(x, 3, 4)])
    z = b.op("Mystery", [x], domain="example.custom")
    model = b.model([y, z], extra_opsets={"example.custom": 1})
    model = with_output_shapes(model)
    model.graph.output[1].type.CopyFrom(helper.make_tensor_type_proto(TensorProto.FLOAT, [1, 3, 8, 8]))
    return model


def test_a_model_onnxruntime_cannot_load_is_not_rewritten(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(_custom_op_model(), str(path))
    line = assert_refused(tmp_path, ["optimize", path, tmp_path / "out.onnx"], str(path),
                          "onnxruntime cannot load the original", "Mystery")
    assert "does not rewrite a model onnxruntime cannot load" in line


def test_without_verification_onnxruntime_is_not_loaded_and_the_output_says_skipped(tmp_path):
    """Documented (pipeline.optimize, README): --no-verify makes no onnxruntime session, so a model that only
    onnxruntime refuses (here: an operator it has no kernel for) is written, with verification: skipped."""
    path = tmp_path / "m.onnx"
    onnx.save(_custom_op_model(), str(path))
    result = run_cli("optimize", path, tmp_path / "out.onnx", "--no-verify")
    assert result.exit_code == 0, result.output
    assert "verification: skipped" in result.stdout


@pytest.mark.parametrize("offset", ["-16", "ten", "1e3"])
def test_an_external_data_offset_that_is_not_a_byte_count_is_an_input_error(tmp_path, offset):
    b = GraphBuilder()
    x = b.input("x", [1, 3, 8, 8])
    path = tmp_path / "m.onnx"
    onnx.save(b.build(b.op("Relu", [b.conv(x, 3, 4)])), str(path), save_as_external_data=True, location="m.data",
              size_threshold=0)
    model = onnx.load(str(path), load_external_data=False)
    for t in model.graph.initializer:
        entries = {e.key: e for e in t.external_data}
        if "offset" in entries:
            entries["offset"].value = offset
        else:
            t.external_data.add(key="offset", value=offset)
    onnx.save(model, str(path))
    assert_refused(tmp_path, ["optimize", path, tmp_path / "out.onnx"], f"external data offset {offset!r}")


def test_an_external_data_location_outside_the_folder_gives_one_answer_whether_or_not_it_exists(tmp_path):
    """No existence oracle: a location outside the model's folder is refused before any file is looked at."""
    (tmp_path / "outside.bin").write_bytes(b"\0" * 4096)
    folder = tmp_path / "models"
    folder.mkdir()
    b = GraphBuilder()
    x = b.input("x", [1, 3, 8, 8])
    onnx.save(b.build(b.op("Relu", [b.conv(x, 3, 4)])), str(folder / "m.onnx"), save_as_external_data=True,
              location="m.data", size_threshold=0)
    lines = {}
    for name in ("outside.bin", "no_such_file.bin"):
        model = onnx.load(str(folder / "m.onnx"), load_external_data=False)
        for t in model.graph.initializer:
            for e in t.external_data:
                if e.key == "location":
                    e.value = f"../{name}"
        onnx.save(model, str(folder / f"{name}.onnx"))
        lines[name] = assert_refused(tmp_path, ["report", folder / f"{name}.onnx"], "not a file inside the model's")
    same = {line.replace(name, "X") for name, line in lines.items()}
    assert len(same) == 1, lines


@pytest.mark.parametrize("which", ["OUTPUT", "--report"])
def test_a_symlink_loop_is_an_input_error(tmp_path, which):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    if which == "OUTPUT":
        args = ["optimize", SAMPLE, tmp_path / "a"]
    else:
        args = ["optimize", SAMPLE, tmp_path / "o.onnx", "--report", tmp_path / "a", "--report-format", "json"]
    assert_refused(tmp_path, args, f"{which} {tmp_path / 'a'}: cannot follow the symbolic link")
    assert not (tmp_path / "o.onnx").exists()


@pytest.mark.parametrize("command", ["optimize", "report", "verify", "bench"])
def test_input_data_that_is_not_a_regular_file_is_an_input_error(tmp_path, command):
    args = {"optimize": [SAMPLE, tmp_path / "o.onnx"], "report": [SAMPLE], "verify": [SAMPLE, SAMPLE],
            "bench": [SAMPLE]}[command]
    assert_refused(tmp_path, [command, *args, "--input-data", "/dev/zero"], "--input-data /dev/zero: is not a "
                   "regular file")


def test_input_shapes_too_large_to_size_are_refused_like_merely_large_ones(tmp_path):
    b = GraphBuilder()
    x = b.input("x", ["N", 3, "H", "W"])
    path = tmp_path / "m.onnx"
    onnx.save(b.build(b.op("Relu", [b.conv(x, 3, 4)])), str(path))
    for dims in ("1x3x100000x100000", "1x3x2147483647x2147483647"):  # MemoryError; numpy's "array is too big"
        assert_refused(tmp_path, ["optimize", path, tmp_path / "o.onnx", "--input-shape", f"x={dims}"],
                       "do not fit in memory; give smaller --input-shape values")


@pytest.mark.parametrize("name", ["o.onnx.data", "o.onnx.0123456789abcdef.data", "o.on.0123456789abcdef.data"])
def test_a_report_named_like_the_outputs_data_file_is_refused(tmp_path, name):
    out = tmp_path / "o.onnx"
    assert_refused(tmp_path, ["optimize", SAMPLE, out, "--report", tmp_path / name, "--report-format", "json"],
                   "has the name of an external data file of OUTPUT")


def test_a_report_named_like_the_data_file_just_written_is_refused_and_leaves_the_weights(tmp_path):
    b = GraphBuilder()
    x = b.input("x", [1, 16, 8, 8])
    src = tmp_path / "in.onnx"
    onnx.save(b.build(b.op("Relu", [b.conv(x, 16, 32)])), str(src), save_as_external_data=True,
              location="in.data", size_threshold=0)
    out = tmp_path / "o.onnx"
    assert run_cli("optimize", src, out).exit_code == 0
    (data,) = [p for p in tmp_path.iterdir() if p.name.startswith("o.onnx.") and p.name.endswith(".data")]
    assert_refused(tmp_path, ["optimize", src, out, "--report", data, "--report-format", "json"],
                   "has the name of an external data file of OUTPUT")
    assert run_cli("verify", src, out).exit_code == 0


def test_a_model_that_cannot_be_written_leaves_no_report(tmp_path, monkeypatch):
    from onnxfuse.model import io as model_io

    def disk_full(path, parts):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(model_io, "write_parts", disk_full)
    line = assert_refused(tmp_path, ["optimize", SAMPLE, tmp_path / "o.onnx", "--no-verify", "--report",
                                     tmp_path / "r.json"], str(tmp_path / "o.onnx"))
    assert "report" not in line


def test_a_report_that_cannot_be_written_after_the_model_says_the_model_was(tmp_path, monkeypatch):
    from onnxfuse.cli import files
    from onnxfuse.errors import InputError

    def fail(path, text):
        raise InputError(f"{path}: cannot write the report (No space left on device)")

    monkeypatch.setattr(files, "write_text", fail)
    out = tmp_path / "o.onnx"
    result = run_cli("optimize", SAMPLE, out, "--no-verify", "--report", tmp_path / "r.json")
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1] == (f"error: {tmp_path / 'r.json'}: cannot write the report (No space left "
                                              f"on device); {out} was written")
    assert out.is_file()


def test_a_report_name_of_255_characters_is_written(tmp_path):
    report = tmp_path / ("r" * 250 + ".json")
    result = run_cli("optimize", SAMPLE, tmp_path / "o.onnx", "--report", report)
    assert result.exit_code == 0, result.output
    assert report.is_file() and sorted(p.name for p in tmp_path.iterdir()) == sorted(["o.onnx", report.name])


# --- exit 3: an unexpected exception ----------------------------------------------------------------------------

def _crash(*args, **kwargs):
    raise ZeroDivisionError("simulated bug")


def test_an_internal_error_exits_3_with_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    monkeypatch.setattr(pipeline, "optimize", _crash)
    result = run_cli("optimize", SAMPLE, tmp_path / "o.onnx")
    assert result.exit_code == EXIT_INTERNAL == 3
    assert result.stderr.splitlines() == [
        "error: internal error in onnxfuse (ZeroDivisionError: simulated bug); rerun with ONNXFUSE_DEBUG=1 for the "
        "traceback, and please report it"]
    assert list(tmp_path.iterdir()) == []
    assert internal_error_line(ZeroDivisionError("simulated bug")) == result.stderr.strip()


def test_onnxfuse_debug_keeps_the_traceback(tmp_path, monkeypatch):
    monkeypatch.setenv(DEBUG_ENV, "1")
    monkeypatch.setattr(pipeline, "analyse", _crash)
    with pytest.raises(ZeroDivisionError, match="simulated bug"):
        run_cli("report", SAMPLE)


def test_an_internal_error_in_a_real_process_exits_3_and_debug_shows_the_traceback(tmp_path):
    """The console script's entry point (``onnxfuse.__main__.run``), with a bug injected into the library."""
    script = ("import sys, onnxfuse.pipeline as p\n"
              "def crash(*a, **k): raise ZeroDivisionError('simulated bug')\n"
              "p.analyse = crash\n"
              "from onnxfuse.__main__ import run\n"
              f"sys.argv = ['onnxfuse', 'report', {str(SAMPLE)!r}]\n"
              "run()\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop(DEBUG_ENV, None)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert out.returncode == 3
    assert out.stderr.splitlines() == [internal_error_line(ZeroDivisionError("simulated bug"))]
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env={**env, DEBUG_ENV: "1"})
    assert out.returncode == 1 and "Traceback" in out.stderr and "ZeroDivisionError: simulated bug" in out.stderr


def test_help_documents_exit_code_3():
    for cmd in (["optimize"], ["report"], ["verify"], ["bench"]):
        text = run_cli(*cmd, "--help").output
        assert "3" in text and "internal error" in text and "ONNXFUSE_DEBUG=1" in text, cmd
    readme = (REPO / "README.md").read_text()
    section = readme.split("### Exit codes", 1)[1].split("\n## ", 1)[0]
    assert "| 3 |" in section and "ONNXFUSE_DEBUG=1" in section


@pytest.mark.parametrize("suffix, text", [(".json", '{"totals": 1, "fusions": []}'), (".textproto", "onnxfuse {"),
                                          (".onnxtxt", "garbage {")])
@pytest.mark.parametrize("command", ["optimize", "report", "verify"])
def test_a_file_in_onnx_text_or_json_format_that_is_no_model_is_an_input_error(tmp_path, suffix, text, command):
    """onnx reads .json, .textproto and .onnxtxt files in those formats: bytes that are no model in them (a JSON
    report given as the model, say) are a one-line exit 2, as for the binary format."""
    bad = tmp_path / f"m{suffix}"
    bad.write_text(text)
    sample = REPO / "sample_models" / "conv_relu.onnx"
    args = {"optimize": [bad, tmp_path / "o.onnx"], "report": [bad], "verify": [sample, bad]}[command]
    result = run_cli(command, *args)
    assert result.exit_code == 2, result.output
    assert "not a readable ONNX model" in result.output and "internal error" not in result.output
    assert "Warning" not in result.output
