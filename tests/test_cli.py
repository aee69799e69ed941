"""The CLI contract (issue 2): commands, exit codes, one-line errors, never a traceback for bad input, the input
never modified, the output written atomically or not at all."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from onnxfuse import __version__
from onnxfuse.cli.main import main
from onnxfuse.errors import internal_error_line
from onnxfuse.model import io as model_io
from onnxfuse.ort import optimized_graph as ort_graph
from onnxfuse.passes import ALL_PASSES, PASS_NAMES
from onnxfuse.records import RewriteKind
from tests.builders import GraphBuilder
from tests.conftest import REPO

SAMPLE = REPO / "sample_models" / "resnet_block.onnx"


def invoke(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_version_and_help():
    result = invoke("--version")
    assert result.exit_code == 0 and __version__ in result.output
    for cmd in ([], ["optimize"], ["report"], ["passes"]):
        result = invoke(*cmd, "--help")
        assert result.exit_code == 0, cmd
        if cmd != ["passes"]:
            assert "Exit codes" in result.output and "Examples" in result.output


@pytest.mark.parametrize("module", ["onnxfuse", "onnxfuse.cli"])
def test_python_dash_m_runs_the_cli(module):
    out = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and __version__ in out.stdout


def test_commands_that_take_an_option_group_take_the_same_options():
    """The option groups of onnxfuse/cli/args/ are declared once: every command that takes one has its options in
    the same order, with the same flags, type and help."""
    def group(command: str, names: tuple[str, ...]) -> list[tuple]:
        return [(p.name, p.opts, p.type.to_info_dict(), getattr(p, "help", None), p.multiple)
                for p in main.commands[command].params if p.name in names]

    optimization = ("target", "only", "skip", "input_shape", "ort_level", "ort_version", "constant_initializer_inputs")
    assert len(group("optimize", optimization)) == len(optimization)
    assert group("optimize", optimization) == group("report", optimization) == group("bench", optimization)
    verification = ("input_data", "input_value", "input_range", "input_sets", "rtol", "atol", "verify_timeout")
    assert len(group("optimize", verification)) == len(verification)
    assert group("optimize", verification) == group("verify", verification)
    for names in (("input_shape",), ("input_value", "input_range")):
        assert group("optimize", names) == group("verify", names) == group("bench", names) != []
    assert group("optimize", ("bandwidth",)) == group("report", ("bandwidth",)) != []


def test_passes_lists_every_pass_in_order():
    result = invoke("passes")
    names = [line.split()[0] for line in result.output.splitlines() if line and not line[0].isspace()]
    assert names == list(PASS_NAMES)
    canonicalize = [p.name for p in ALL_PASSES if p.kind is RewriteKind.CANONICALIZE]
    assert names[:len(canonicalize)] == canonicalize  # canonicalization runs first
    order = [names.index(n) for n in ("conv_batchnorm", "conv_affine", "conv_residual", "conv_hardswish",
                                      "conv_activation")]
    assert order == sorted(order)  # the conv folds before the conv fusions, Z before the activation
    lines = result.output.splitlines()
    for p in ALL_PASSES:  # each pass's line is followed by the reasons it can give (its summary may name others)
        at = next(i for i, line in enumerate(lines) if line and not line[0].isspace() and line.split()[0] == p.name)
        block = lines[at + 1]
        assert block.split("declines: ")[1].split(", ") == [r.value for r in p.reasons]
    assert invoke("passes", "-q").output == invoke("-v", "passes").output == result.output  # -v/-q as elsewhere


def test_optimize_sample_writes_verified_model(tmp_path):
    before = digest(SAMPLE)
    out = tmp_path / "out.onnx"
    result = invoke("optimize", SAMPLE, out, "--target", "cpu")
    assert result.exit_code == 0, result.output
    assert "verification: passed" in result.output
    assert digest(SAMPLE) == before
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["onnxfuse.version"] == __version__ and meta["onnxfuse.target"] == "cpu"
    assert "conv_batchnorm" in meta["onnxfuse.passes"]
    assert list(tmp_path.iterdir()) == [out]  # no temporary file left behind


def test_unchanged_model_is_said_honestly(tmp_path):
    result = invoke("optimize", REPO / "sample_models" / "refuse_graph_output.onnx", tmp_path / "o.onnx")
    assert result.exit_code == 0
    assert "no pattern was fused" in result.output


def _bad_inputs(tmp_path: Path) -> dict[str, Path]:
    cases = {"missing": tmp_path / "nope.onnx", "directory": tmp_path / "adir"}
    cases["directory"].mkdir()
    (tmp_path / "empty.onnx").write_bytes(b"")
    cases["empty"] = tmp_path / "empty.onnx"
    (tmp_path / "text.onnx").write_text("this is not a protobuf model, just text\n")
    cases["not protobuf"] = tmp_path / "text.onnx"
    data = SAMPLE.read_bytes()
    (tmp_path / "trunc.onnx").write_bytes(data[: len(data) // 2])
    cases["truncated"] = tmp_path / "trunc.onnx"
    # onnx.checker rejects a node that reads an undefined tensor
    b = GraphBuilder()
    x = b.input("x", [1, 3, 8, 8])
    bad = b.build(b.op("Relu", ["undefined_tensor"]))
    onnx.save(bad, str(tmp_path / "invalid.onnx"))
    cases["checker"] = tmp_path / "invalid.onnx"
    # external data file missing
    b = GraphBuilder()
    x = b.input("x", [1, 3, 8, 8])
    ext = b.build(b.op("Relu", [b.conv(x, 3, 4)]))
    ext.graph.output[0].type.tensor_type.shape.SetInParent()
    onnx.save(ext, str(tmp_path / "ext.onnx"), save_as_external_data=True, location="ext.data", size_threshold=0)
    (tmp_path / "ext.data").unlink()
    cases["external data missing"] = tmp_path / "ext.onnx"
    # opset too old
    b = GraphBuilder()
    x = b.input("x", [1, 3, 8, 8])
    old = b.build(b.op("Relu", [x]), opset=6, ir_version=3)
    onnx.save(old, str(tmp_path / "old.onnx"))
    cases["opset too old"] = tmp_path / "old.onnx"
    return cases


@pytest.mark.parametrize("command", ["optimize", "report"])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, command):
    cases = _bad_inputs(tmp_path)
    for label, path in cases.items():
        before = sorted(p.name for p in tmp_path.iterdir())
        digests = {p: digest(p) for p in tmp_path.iterdir() if p.is_file()}
        args = [command, path] + ([tmp_path / "out.onnx"] if command == "optimize" else [])
        result = invoke(*args)
        assert result.exit_code == 2, (label, result.output)
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (label, result.output)
        assert str(path) in lines[0], label
        assert "Traceback" not in result.output
        assert sorted(p.name for p in tmp_path.iterdir()) == before, label
        assert {p: digest(p) for p in tmp_path.iterdir() if p.is_file()} == digests, label


def test_error_messages_name_the_cause(tmp_path):
    cases = _bad_inputs(tmp_path)
    expected = {"missing": "no such file", "directory": "directory", "empty": "empty",
                "not protobuf": "protobuf", "truncated": "protobuf", "checker": "onnx.checker",
                "external data missing": "external data", "opset too old": "older than"}
    for label, path in cases.items():
        assert expected[label] in invoke("report", path).output, label


def test_output_same_as_input_is_refused_without_overwrite(tmp_path):
    model = tmp_path / "m.onnx"
    model.write_bytes(SAMPLE.read_bytes())
    before = digest(model)
    result = invoke("optimize", model, model)
    assert result.exit_code == 2 and "--in-place" in result.output
    assert digest(model) == before
    link = tmp_path / "link.onnx"
    link.symlink_to(model)
    assert invoke("optimize", model, link).exit_code == 2
    result = invoke("optimize", model, model, "--overwrite", "--target", "cpu")
    assert result.exit_code == 0
    assert digest(model) != before


def test_usage_errors_exit_2(tmp_path):
    assert invoke("optimize", SAMPLE).exit_code == 2
    assert invoke("optimize", SAMPLE, tmp_path / "o.onnx", "--target", "tpu").exit_code == 2
    assert invoke("optimize", SAMPLE, tmp_path / "o.onnx", "--only", "nosuchpass").exit_code == 2
    result = invoke("optimize", SAMPLE, tmp_path / "o.onnx", "--input-shape", "x=1xAx3")
    assert result.exit_code == 2 and result.output.startswith("error: ")
    result = invoke("optimize", SAMPLE, tmp_path / "o.onnx", "--input-shape", "nosuch=1x2")
    assert result.exit_code == 2 and "no graph input" in result.output
    assert invoke("optimize", SAMPLE, tmp_path / "missing_dir" / "o.onnx").exit_code == 2
    assert invoke("optimize", SAMPLE, tmp_path).exit_code == 2
    assert not (tmp_path / "o.onnx").exists()


def test_atomic_write_leaves_nothing_when_the_write_fails(tmp_path, monkeypatch):
    out = tmp_path / "out.onnx"

    def disk_full(path, parts):
        with open(path, "wb") as fh:
            fh.write(parts[0])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(model_io, "write_parts", disk_full)  # --no-verify: verification writes with it too
    result = invoke("optimize", SAMPLE, out, "--no-verify")
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"error: {out}: cannot write the output (No space left on device); nothing was written"]
    assert list(tmp_path.iterdir()) == []


def test_atomic_write_keeps_the_old_output_when_the_write_fails(tmp_path, monkeypatch):
    out = tmp_path / "out.onnx"
    out.write_bytes(b"old model")

    def crash(path, parts):
        with open(path, "wb") as fh:
            fh.write(parts[0][:10])
        raise RuntimeError("simulated crash mid-write")

    monkeypatch.setattr(model_io, "write_parts", crash)  # --no-verify: verification writes with it too
    result = run_cli("optimize", SAMPLE, out, "--no-verify")
    assert result.exit_code == 3  # an unexpected exception: exit 3 and one line (see test_internal_error_...)
    assert result.stderr.splitlines() == [internal_error_line(RuntimeError("simulated crash mid-write"))]
    assert out.read_bytes() == b"old model"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.onnx"]


def test_output_is_deterministic_and_idempotent(tmp_path):
    a, b, c = tmp_path / "a.onnx", tmp_path / "b.onnx", tmp_path / "c.onnx"
    assert invoke("optimize", SAMPLE, a, "--target", "cpu").exit_code == 0
    assert invoke("optimize", SAMPLE, b, "--target", "cpu").exit_code == 0
    assert a.read_bytes() == b.read_bytes()
    assert invoke("optimize", a, c, "--target", "cpu").exit_code == 0
    assert c.read_bytes() == a.read_bytes()


def test_external_data_stays_external(tmp_path):
    b = GraphBuilder()
    x = b.input("x", [1, 4, 8, 8])
    model = b.build(b.op("Relu", [b.bn(b.conv(x, 4, 16), 16)]))
    model.graph.output[0].type.tensor_type.shape.SetInParent()
    src = tmp_path / "src"
    src.mkdir()
    onnx.save(model, str(src / "m.onnx"), save_as_external_data=True, location="m.weights", size_threshold=0)
    out = tmp_path / "o.onnx"
    result = invoke("optimize", src / "m.onnx", out, "--target", "cpu")
    assert result.exit_code == 0, result.output
    assert len(list(tmp_path.glob("o.onnx.*.data"))) == 1  # named by its content (model_io.data_file_name)
    loaded = onnx.load(str(out), load_external_data=False)
    assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in loaded.graph.initializer)
    onnx.checker.check_model(str(out))


def test_model_fields_preserved(tmp_path):
    model = onnx.load(str(SAMPLE))
    model.doc_string = "my doc"
    model.producer_name, model.producer_version = "exporter", "9.9"
    model.graph.doc_string = "graph doc"
    onnx.helper.set_model_props(model, {"author": "me"})
    src = tmp_path / "src.onnx"
    onnx.save(model, str(src))
    out = tmp_path / "out.onnx"
    assert invoke("optimize", src, out, "--target", "cpu").exit_code == 0
    got = onnx.load(str(out))
    assert (got.ir_version, got.doc_string, got.producer_name, got.producer_version) == (
        model.ir_version, "my doc", "exporter", "9.9")
    assert got.graph.doc_string == "graph doc"
    assert {p.key: p.value for p in got.metadata_props}["author"] == "me"
    assert [i.name for i in got.graph.input] == [i.name for i in model.graph.input]
    assert [o.name for o in got.graph.output] == [o.name for o in model.graph.output]
    assert {(o.domain, o.version) for o in got.opset_import} == {("", 17), ("com.microsoft", 1)}


def test_quiet_and_verbose_work_after_the_command(tmp_path):
    result = invoke("optimize", SAMPLE, tmp_path / "o.onnx", "-q")
    assert result.exit_code == 0
    result = invoke("report", REPO / "sample_models" / "refuse_two_consumers.onnx", "-v")
    assert result.exit_code == 0
    assert "unfused conv (Conv -> Relu): intermediate-has-other-consumers" in result.output
    assert "pass conv_activation: 0 rewrites" in result.output


def test_only_and_skip_leaving_nothing_is_a_usage_error(tmp_path):
    result = invoke("optimize", SAMPLE, tmp_path / "o.onnx", "--only", "conv_affine", "--skip", "conv_affine")
    assert result.exit_code == 2 and "--only and --skip contradict each other: both name conv_affine" in result.output


def test_bandwidth_must_be_positive_and_is_shown(tmp_path):
    assert invoke("optimize", SAMPLE, tmp_path / "o.onnx", "--bandwidth", "-5").exit_code == 2
    assert invoke("optimize", SAMPLE, tmp_path / "o.onnx", "--bandwidth", "0").exit_code == 2
    result = invoke("optimize", SAMPLE, tmp_path / "o.onnx", "--bandwidth", "100")
    assert result.exit_code == 0 and "estimated memory time at 100 GB/s" in result.output


def test_missing_report_folder_fails_before_any_work(tmp_path, monkeypatch):
    from onnxfuse import pipeline

    monkeypatch.setattr(pipeline, "optimize", lambda *a, **k: pytest.fail("should not run"))
    result = invoke("optimize", SAMPLE, tmp_path / "o.onnx", "--report", tmp_path / "nope" / "r.json")
    assert result.exit_code == 2 and "does not exist" in result.output
    result = invoke("optimize", SAMPLE, tmp_path / "nope" / "o.onnx")
    assert result.exit_code == 2


def test_report_file_gets_normal_permissions(tmp_path):
    out = tmp_path / "r.json"
    assert invoke("report", SAMPLE, "--format", "json", "-o", out).exit_code == 0
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask


def test_reoptimizing_for_another_target_warns_about_existing_fused_convs(tmp_path):
    cpu = tmp_path / "cpu.onnx"
    assert invoke("optimize", REPO / "sample_models" / "conv_sigmoid.onnx", cpu, "--target", "cpu").exit_code == 0
    result = invoke("optimize", cpu, tmp_path / "again.onnx", "--target", "cpu+cuda")
    assert result.exit_code == 0
    assert "warning: the model holds 1 FusedConv node(s) with Sigmoid that target cpu+cuda cannot run" \
        in result.output


def test_unnamed_nodes_are_labelled_by_their_output(tmp_path):
    b = GraphBuilder()
    x = b.input("x", [1, 4, 8, 8])
    y = b.conv(x, 4, 4)
    model = b.build([b.op("Relu", [y]), b.op("Sigmoid", [y])])
    for node in model.graph.node:
        node.name = ""
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    result = invoke("report", path)
    assert result.exit_code == 0
    assert f"{y}: Conv -> Relu" in result.output


def test_unknown_sizes_are_not_shown_as_zero(tmp_path):
    b = GraphBuilder()
    x = b.input("x", ["N", 4, 8, 8])
    model = b.build(b.op("Relu", [b.conv(x, 4, 4)]))
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    result = invoke("optimize", path, tmp_path / "o.onnx")
    # the batch is symbolic: bytes per batch item, and the figures at batch 1, saying so
    assert "(saved 2048*N B)" in result.output and " 0 B" not in result.output
    assert ("vs the graph as exported, at batch 1 (N is the only symbolic dim): 4.6 KiB -> 2.6 KiB (saved 2.0 KiB"
            in result.output)
    assert "N_" not in result.output  # the dim's one name, the model's, in every line (N_ is the report's symbol)


def test_output_that_is_a_device_or_fifo_is_refused(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for target in (fifo, Path("/dev/null")):
        result = invoke("optimize", SAMPLE, target)
        assert result.exit_code == 2 and "not a regular file" in result.output
        result = invoke("report", SAMPLE, "-o", target)
        assert result.exit_code == 2
    assert not fifo.is_file() and Path("/dev/null").is_char_device()


def _external_model(folder: Path, name: str, location: str) -> Path:
    b = GraphBuilder()
    x = b.input("x", [1, 16, 8, 8])
    model = b.build(b.bn(b.conv(x, 16, 32), 32))
    onnx.save(model, str(folder / name), save_as_external_data=True, location=location, size_threshold=0)
    return folder / name


def test_the_inputs_external_data_is_never_replaced(tmp_path):
    src = _external_model(tmp_path, "orig.onnx", "fused.onnx.data")
    data = (tmp_path / "fused.onnx.data").read_bytes()
    result = invoke("optimize", src, tmp_path / "fused.onnx", "--no-verify")
    assert result.exit_code == 0, result.output  # the output's data file is named by its content: another file
    assert (tmp_path / "fused.onnx.data").read_bytes() == data
    assert invoke("verify", src, tmp_path / "fused.onnx").exit_code == 0
    (tmp_path / "fused.onnx").unlink()
    result = invoke("optimize", src, tmp_path / "fused.onnx.data")
    assert result.exit_code == 2 and "external data file of INPUT" in result.output
    assert (tmp_path / "fused.onnx.data").read_bytes() == data
    assert not (tmp_path / "fused.onnx").exists()


def test_external_data_write_does_not_depend_on_the_working_directory(tmp_path, monkeypatch):
    src = _external_model(tmp_path, "model.onnx", "model.onnx.data")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fused.onnx.data").write_bytes(b"an unrelated file in the cwd")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    assert invoke("optimize", src, out_dir / "fused.onnx").exit_code == 0
    assert invoke("optimize", out_dir / "fused.onnx", out_dir / "fused.onnx", "--overwrite").exit_code == 0
    assert invoke("optimize", "model.onnx", "model.onnx", "--overwrite").exit_code == 0
    onnx.checker.check_model(str(tmp_path / "model.onnx"))


def test_symlinked_output_is_written_through_the_link(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "out.onnx").write_text("precious")
    (other / "t.onnx").write_text("old target")
    link = tmp_path / "out.onnx"
    link.symlink_to(other / "t.onnx")
    assert invoke("optimize", SAMPLE, link).exit_code == 0
    assert (other / "out.onnx").read_text() == "precious"
    assert link.is_symlink()
    onnx.checker.check_model(str(other / "t.onnx"))


def test_more_usage_errors(tmp_path):
    for args in (["--rtol", "-1"], ["--atol", "nan"], ["--bandwidth", "inf"],
                 ["--input-shape", "x=1x8x16x16", "--input-shape", "x=1x8x16x16"],
                 ["--input-shape", "x=99999999999999999999x8x16x16"]):
        result = invoke("optimize", SAMPLE, tmp_path / "o.onnx", *args)
        assert result.exit_code == 2, args
        assert result.output.startswith("error: ") or "Error:" in result.output, args
    result = invoke("optimize", SAMPLE, str(tmp_path / "newdir") + "/")
    assert result.exit_code == 2 and not (tmp_path / "newdir").exists()
    assert not (tmp_path / "o.onnx").exists()


def test_invalid_utf8_name_is_a_one_line_error(tmp_path):
    model = onnx.load(str(SAMPLE))
    model.graph.node[1].name = "BNBNBN"
    path = tmp_path / "bad.onnx"
    path.write_bytes(model.SerializeToString().replace(b"BNBNBN", b"BN\xff\xfeBN"))
    for command in (["optimize", path, tmp_path / "o.onnx"], ["report", path]):
        result = invoke(*command)
        assert result.exit_code == 2
        assert result.output.startswith("error: ") and len(result.output.strip().splitlines()) == 1


def test_models_graphsurgeon_would_corrupt_are_written_unchanged(tmp_path):
    # a subgraph initializer that shadows an outer tensor: graphsurgeon would merge the two
    from onnx import TensorProto, helper, numpy_helper

    b = GraphBuilder()
    x = b.input("x", [1, 4, 8, 8])
    cond = b.input("cond", [], dtype=np.bool_)
    k = b.const(np.full((1,), 2.0, np.float32), name="k")
    then = helper.make_graph([helper.make_node("Mul", [x, "k"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, 4, 8, 8])],
                             [numpy_helper.from_array(np.full((1,), 100.0, np.float32), "k")])
    other = helper.make_graph([helper.make_node("Mul", [x, k], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, [1, 4, 8, 8])])
    y = b.op("If", [cond], then_branch=then, else_branch=other)
    model = b.build(b.op("Relu", [b.conv(y, 4, 4)]))
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    result = invoke("optimize", path, tmp_path / "o.onnx", "--target", "cpu", "--no-verify")
    assert result.exit_code == 0, result.output
    assert "the model was not rewritten: subgraph tensor 'k' shadows" in result.output
    assert "FusedConv" not in {n.op_type for n in onnx.load(str(tmp_path / "o.onnx")).graph.node}


# --- Streams, -q, logging, Ctrl-C, python -m (issue 12, section 4) ---------------------------------------------

def run_cli(*args: str):
    """Invoke the CLI in-process with stdout and stderr captured apart (``result.stdout``, ``result.stderr``)."""
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_quiet_prints_nothing_on_success(tmp_path):
    cpu = tmp_path / "cpu.onnx"
    assert run_cli("optimize", REPO / "sample_models" / "conv_sigmoid.onnx", cpu, "--target", "cpu").exit_code == 0
    symbolic = tmp_path / "symbolic.onnx"
    b = GraphBuilder()
    model = b.build(b.op("Relu", [b.conv(b.input("x", ["N", 4, "H", 8]), 4, 4)]))
    onnx.save(model, str(symbolic))
    commands = [
        ["optimize", SAMPLE, tmp_path / "a.onnx", "-q"],
        ["-q", "optimize", SAMPLE, tmp_path / "b.onnx", "--report", tmp_path / "b.json", "--bandwidth", "100"],
        ["optimize", cpu, tmp_path / "c.onnx", "-q"],  # would warn: FusedConv(Sigmoid) that cpu+cuda cannot run
        ["optimize", REPO / "sample_models" / "refuse_graph_output.onnx", tmp_path / "d.onnx", "-q"],  # unchanged
        ["optimize", symbolic, tmp_path / "e.onnx", "-q", "-v"],  # would hint at --input-shape
        ["report", SAMPLE, "-o", tmp_path / "r.txt", "-q"],
        ["report", cpu, "--format", "json", "-o", tmp_path / "r.json", "-q"],
    ]
    for args in commands:
        result = run_cli(*args)
        assert result.exit_code == 0, (args, result.output)
        assert (result.stdout, result.stderr) == ("", ""), args
    assert (tmp_path / "b.json").stat().st_size and (tmp_path / "r.txt").stat().st_size
    # the unquietened runs did print: -q is what silenced them
    assert "warning: " in run_cli("optimize", cpu, tmp_path / "c.onnx").stderr
    assert "give --input-shape for the figures" in run_cli("optimize", symbolic, tmp_path / "e.onnx").stderr


def test_quiet_still_prints_requested_results_and_errors(tmp_path):
    result = run_cli("report", SAMPLE, "-q")
    assert result.exit_code == 0 and "memory-traffic report" in result.stdout and result.stderr == ""
    result = run_cli("report", tmp_path / "missing.onnx", "-q")
    assert result.exit_code == 2 and result.stdout == "" and result.stderr.startswith("error: ")


def test_quiet_is_silent_in_a_real_process(tmp_path):
    """Nothing from Python warnings, onnxruntime's own logging or the libraries reaches the terminal either."""
    for args in (["optimize", SAMPLE, tmp_path / "o.onnx", "--target", "cpu", "-q"],
                 ["report", SAMPLE, "-q", "-o", tmp_path / "r.md"]):
        out = subprocess.run([sys.executable, "-m", "onnxfuse", *map(str, args)], capture_output=True, text=True,
                             env=_env(), cwd=REPO)
        assert (out.returncode, out.stdout, out.stderr) == (0, "", ""), args


def _env() -> dict[str, str]:
    """The environment for a subprocess that imports this checkout's onnxfuse."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def test_results_go_to_stdout_and_diagnostics_to_stderr(tmp_path):
    out = tmp_path / "o.onnx"
    result = run_cli("optimize", SAMPLE, out, "--target", "cpu")
    assert [line.split(":")[0].split(" at level")[0] for line in result.stdout.splitlines()] == [
        f"vs onnxruntime {ort_graph.installed_version()} (installed, CPU provider)", "vs the graph as exported",
        "runs on", "model file", "fusions",
        "left unfused", "verification"]
    assert result.stderr == f"wrote {out}\n"

    verbose = run_cli("-v", "optimize", SAMPLE, out, "--overwrite", "--target", "cpu")
    assert verbose.stdout.splitlines()[1:] == result.stdout.splitlines()[1:]
    assert "pass conv_batchnorm: 2 rewrites" in verbose.stderr
    assert "verifying the optimized model" in verbose.stderr  # a library module's logger (onnxfuse.pipeline)

    result = run_cli("optimize", REPO / "sample_models" / "refuse_graph_output.onnx", tmp_path / "u.onnx")
    assert "no pattern was fused" in result.stderr and "no pattern" not in result.stdout
    result = run_cli("-v", "report", REPO / "sample_models" / "refuse_two_consumers.onnx")
    assert "unfused conv (Conv -> Relu): intermediate-has-other-consumers" in result.stderr
    assert "memory-traffic report" in result.stdout and "pass conv_activation" not in result.stdout

    cpu = tmp_path / "cpu.onnx"
    run_cli("optimize", REPO / "sample_models" / "conv_sigmoid.onnx", cpu, "--target", "cpu")
    result = run_cli("optimize", cpu, tmp_path / "again.onnx")
    assert result.stderr.startswith("warning: the model holds 1 FusedConv") and "warning" not in result.stdout

    result = run_cli("report", SAMPLE, "--format", "json")
    assert json.loads(result.stdout)["target"] == "cpu+cuda" and result.stderr == ""
    result = run_cli("report", SAMPLE, "--format", "json", "-o", tmp_path / "r.json")
    assert result.stdout == "" and result.stderr == f"wrote {tmp_path / 'r.json'}\n"

    result = run_cli("optimize", SAMPLE, tmp_path / "f.onnx", "--rtol", "0", "--atol", "0")  # fails verification
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.splitlines()[0].startswith("  output ") and result.stderr.splitlines()[-1].startswith(
        "error: ")
    result = run_cli("optimize", tmp_path / "missing.onnx", tmp_path / "g.onnx")
    assert result.exit_code == 2 and result.stdout == "" and result.stderr.startswith("error: ")

    for args in (["passes"], ["--version"]):
        result = run_cli(*args)
        assert result.exit_code == 0 and result.stdout and result.stderr == "", args


def test_bench_results_go_to_stdout():
    result = run_cli("bench", SAMPLE, "--runs", "1", "--max-time", "0", "--warmup", "0", "--level", "disable",
                     "--format", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["levels"] and "{" not in result.stderr


def test_each_command_line_configures_logging_afresh_and_removes_it_after():
    import logging

    from onnxfuse.cli.console import StderrHandler

    sample = REPO / "sample_models" / "refuse_two_consumers.onnx"
    for args in (["-v", "report", sample], ["-q", "report", sample], ["report", sample, "-v"]):
        result = run_cli(*args)
        assert result.stderr.count("pass conv_activation: 0 rewrites") == (0 if "-q" in args else 1), args
        assert not [h for h in logging.getLogger("onnxfuse").handlers if isinstance(h, StderrHandler)]
        assert logging.getLogger("onnxfuse").level == logging.NOTSET


def test_the_library_does_not_print(tmp_path, capsys, caplog):
    import logging

    import onnxfuse

    with caplog.at_level(logging.DEBUG, logger="onnxfuse"):
        result = onnxfuse.optimize(SAMPLE, target="cpu")
    assert result.report.verification.status == "passed"
    assert capsys.readouterr() == ("", "")
    assert {r.name for r in caplog.records} >= {"onnxfuse.pipeline"}


def test_ctrl_c_in_the_library_exits_130_with_one_line_and_writes_nothing(tmp_path, monkeypatch):
    from onnxfuse import pipeline

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "optimize", interrupted)
    monkeypatch.setattr(pipeline, "analyse", interrupted)
    for args in (["optimize", SAMPLE, tmp_path / "o.onnx", "--report", tmp_path / "r.json"],
                 ["report", SAMPLE, "-o", tmp_path / "r.txt"], ["report", SAMPLE]):
        result = run_cli(*args)
        assert result.exit_code == 130, args
        assert result.stdout == "" and result.stderr == "error: interrupted; no partly written file was left\n"
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_while_writing_leaves_the_old_output_and_no_temporary_file(tmp_path, monkeypatch):
    out = tmp_path / "out.onnx"
    out.write_bytes(b"old model")

    def interrupted_write(path, parts):
        with open(path, "wb") as fh:
            fh.write(parts[0][:10])
        raise KeyboardInterrupt

    monkeypatch.setattr(model_io, "write_parts", interrupted_write)  # --no-verify: verification writes with it
    result = run_cli("optimize", SAMPLE, out, "--no-verify")
    assert result.exit_code == 130 and len(result.stderr.splitlines()) == 1
    assert out.read_bytes() == b"old model"
    assert [p.name for p in tmp_path.iterdir()] == ["out.onnx"]


def test_ctrl_c_while_writing_the_report_leaves_no_temporary_file(tmp_path, monkeypatch):
    def interrupted_replace(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted_replace)
    result = run_cli("report", SAMPLE, "-o", tmp_path / "r.txt")
    assert result.exit_code == 130 and len(result.stderr.splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def _slow_model(path: Path, layers: int = 600) -> None:
    """A float32 chain of ``layers`` Conv -> BatchNormalization -> Relu on ``[N, 16, 64, 64]``: a few seconds to
    optimize and verify (the symbolic batch dim keeps onnxruntime's symbolic shape inference in the run, and the
    convs make verification take seconds, so that an interrupt half a second in always lands mid-run)."""
    b = GraphBuilder()
    x = b.input("x", ["N", 16, 64, 64])
    for _ in range(layers):
        x = b.op("Relu", [b.bn(b.conv(x, 16, 16), 16)])
    onnx.save(b.build(x), str(path))


def test_sigint_exits_130_with_one_line_and_leaves_nothing(tmp_path):
    src, out_dir = tmp_path / "big.onnx", tmp_path / "out"
    _slow_model(src)
    out_dir.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "onnxfuse", "-v", "optimize", str(src), str(out_dir / "o.onnx"),
                             "--report", str(out_dir / "r.json")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(), cwd=REPO)
    before = []
    try:
        for line in proc.stderr:  # wait until the work has started (-v says so), so that the libraries are loaded
            before.append(line)
            if line.startswith("optimizing "):
                break
        time.sleep(0.1)  # in the middle of the work: it takes seconds (the optimize of 600 layers, then verifying)
        assert proc.poll() is None, "the model was optimized before the interrupt: make it slower"
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, [*before, stderr]
    assert stdout == ""
    lines = stderr.splitlines()
    assert lines[-1] == "error: interrupted; no partly written file was left", lines
    # before it, at most the -v progress lines of the library (never a traceback or click's "Aborted!")
    assert all(line.startswith(("loaded ", "passes done", "verifying ")) for line in lines[:-1]), lines
    assert list(out_dir.iterdir()) == []


def test_python_dash_m_from_the_folder_above_a_clone_runs_the_installed_package(tmp_path):
    """``python -m`` puts the current folder first on sys.path: from the folder above a clone named ``onnxfuse``,
    that folder is a namespace package ``onnxfuse``. With an editable install's import hook (setuptools' finder,
    consulted after the path), ``onnxfuse.__main__`` came from the installed package but ``onnxfuse`` was the empty
    namespace whose ``__init__`` never ran: an ImportError, or a command that ran on a half-imported package."""
    (tmp_path / "onnxfuse").mkdir()  # the clone: no __init__.py at its top
    (tmp_path / "onnxfuse" / "README.md").write_text("a clone\n")
    package = REPO / "onnxfuse"
    code = f"""
import os, runpy, sys
from importlib.machinery import PathFinder
from importlib.util import spec_from_file_location

class EditableFinder:  # what setuptools' editable install adds to sys.meta_path, after PathFinder
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname == "onnxfuse":
            return spec_from_file_location(fullname, {str(package / "__init__.py")!r})
        if fullname.rpartition(".")[0] == "onnxfuse":
            return PathFinder.find_spec(fullname, path=[{str(package)!r}])
        return None

sys.path[0] = os.getcwd()  # what python -m does
sys.meta_path.insert(sys.meta_path.index(PathFinder) + 1, EditableFinder)
sys.argv = ["onnxfuse", "passes"]
try:
    runpy.run_module("onnxfuse", run_name="__main__", alter_sys=True)
except SystemExit as exc:
    print("exit", exc.code, sys.modules["onnxfuse"].__file__)
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert "conv_batchnorm" in out.stdout
    assert out.stdout.splitlines()[-1] == f"exit 0 {package / '__init__.py'}"


def test_readme_says_where_to_run_python_dash_m():
    readme = (REPO / "README.md").read_text()
    assert "python -m onnxfuse" in readme and "folder above a clone" in readme


def test_ort_level_option_on_optimize_and_report(tmp_path):
    # resnet_block's Conv -> BN -> Add -> Relu: FusedConv(Z, Relu) below ORT_ENABLE_ALL, left unfused at "all"
    # (the default) with the speed reason; an unknown level is a usage error.
    at_all = json.loads(invoke("report", SAMPLE, "--target", "cpu", "--format", "json").stdout)
    assert [u["reason"] for u in at_all["unfused"]] == ["slower-than-unfused-at-ort-level"]
    low = json.loads(invoke("report", SAMPLE, "--target", "cpu", "--format", "json", "--ort-level", "basic").stdout)
    assert low["unfused"] == [] and low["totals"]["saved_bytes"] > at_all["totals"]["saved_bytes"]
    out = tmp_path / "o.onnx"
    assert invoke("optimize", SAMPLE, out, "--target", "cpu", "--ort-level", "extended").exit_code == 0
    assert [n.op_type for n in onnx.load(str(out)).graph.node] == ["FusedConv", "FusedConv"]
    bad = CliRunner().invoke(main, ["report", str(SAMPLE), "--ort-level", "fast"])
    assert bad.exit_code == 2 and "fast" in bad.stderr


def test_a_folder_that_takes_no_new_file_is_an_input_error(tmp_path, monkeypatch):
    # /proc and /sys pass os.access(W_OK) but refuse new files: the temporary file fails, not the check
    import tempfile

    def refuse(*args, **kwargs):
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    for args in (["optimize", SAMPLE, tmp_path / "o.onnx"], ["report", SAMPLE, "-o", tmp_path / "r.json"],
                 ["optimize", SAMPLE, tmp_path / "o.onnx", "--no-verify", "--report", tmp_path / "r.json"]):
        result = CliRunner().invoke(main, [str(a) for a in args])
        assert result.exit_code == 2, result.output
        assert result.output.count("\n") == 1 and result.output.startswith("error: ")
    assert list(tmp_path.iterdir()) == []


def test_wrong_input_name_lists_only_run_time_inputs(tmp_path):
    """Old exporters (IR < 4) list every initializer as a graph input too: the error names the run-time inputs
    only, not the hundreds of weights."""
    b = GraphBuilder()
    x = b.input("input.1", [1, 4, 8, 8])
    model = b.build(b.op("Relu", [b.conv(b.conv(x, 4, 4), 4, 4)]))
    for t in model.graph.initializer:
        model.graph.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    model.ir_version = 3
    src = tmp_path / "old.onnx"
    onnx.save(model, str(src))
    result = invoke("optimize", src, tmp_path / "o.onnx", "--input-shape", "input=1x4x8x8")
    assert result.exit_code == 2
    assert result.output.strip() == ("error: --input-shape input: the model has no graph input named 'input' "
                                     "(inputs: input.1)")


def test_verification_line_names_the_input_sizes_it_ran(tmp_path):
    """The summary says which sizes the verdict rests on; without --input-shape they are the representative sizes
    the figures and the HTML chart are given at (one size per run: batch 1, 224 for the other dims)."""
    b = GraphBuilder()
    x = b.input("x", ["N", 3, "H", "W"])
    onnx.save(b.build(b.op("Relu", [b.bn(b.conv(x, 3, 8), 8)])), str(tmp_path / "m.onnx"))
    result = invoke("optimize", tmp_path / "m.onnx", tmp_path / "o.onnx")
    assert result.exit_code == 0
    [line] = [ln for ln in result.output.splitlines() if ln.startswith("verification: ")]
    assert line.startswith("verification: passed (") and line.endswith("; inputs x=1x3x224x224)")
    assert "at representative sizes N=1, H=224, W=224" in result.output
    html = invoke("report", tmp_path / "m.onnx", "-o", tmp_path / "r.html")
    assert "the HTML report's chart draws each layer at N=1, H=224, W=224" in html.output
    result = invoke("optimize", tmp_path / "m.onnx", tmp_path / "o2.onnx", "--input-shape", "x=2x3x20x24")
    assert "; inputs x=2x3x20x24)" in result.output


def test_report_file_never_replaces_the_input_its_weights_or_the_output(tmp_path):
    """--report / -o naming INPUT, OUTPUT or one of INPUT's external data files: exit 2, and every one of those
    files is left as it was (nothing else written)."""
    b = GraphBuilder()
    x = b.input("x", [1, 8, 16, 16])
    model = b.build(b.op("Relu", [b.bn(b.conv(x, 8, 8), 8)]))
    src = tmp_path / "m.onnx"
    onnx.save(model, str(src), save_as_external_data=True, location="m.weights", size_threshold=0)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    out = tmp_path / "o.onnx"
    for target in (src, out, tmp_path / "m.weights"):
        result = invoke("optimize", src, out, "--report", target, "--report-format", "json")
        assert result.exit_code == 2 and result.output.startswith("error: "), result.output
        assert "choose another name" in result.output
        result = invoke("report", src, "-o", target, "--format", "json")
        if target != out:
            assert result.exit_code == 2 and "choose another name" in result.output, result.output
        assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p != out} == before
        out.unlink(missing_ok=True)


def test_weight_whose_raw_data_does_not_match_its_dims_is_an_input_error(tmp_path):
    """onnx.checker (even full_check) accepts raw_data of the wrong length; onnxruntime refuses such a model.
    onnxfuse says so in one line with exit 2 (it was a traceback and exit 1, the verification-failed code)."""
    b = GraphBuilder()
    x = b.input("x", [1, 3, 8, 8])
    model = b.build(b.op("Relu", [b.bn(b.conv(x, 3, 4), 4)]))
    [weight] = [t for t in model.graph.initializer if len(t.dims) == 4]
    weight.raw_data += b"\0\0\0\0"
    onnx.checker.check_model(model, full_check=True)
    src = tmp_path / "m.onnx"
    onnx.save(model, str(src))
    for args in (("optimize", src, tmp_path / "o.onnx"), ("report", src)):
        result = invoke(*args)
        assert result.exit_code == 2, result.output
        [line] = result.output.strip().splitlines()
        assert line.startswith("error: ") and f"tensor {weight.name}: its data does not match its dims" in line
    assert not (tmp_path / "o.onnx").exists()


def test_require_verify_writes_no_model_but_the_report_with_the_reason(tmp_path):
    """Exit 1 (README, exit codes): no model is written; the --report file is, holding the verification
    result, so that a CI job can show why."""
    b = GraphBuilder()  # a Reshape that no batch size fits: onnxruntime cannot run the generated inputs, skipped
    y = b.op("Relu", [b.conv(b.input("x", ["N", 3, 8, 8]), 3, 4)])
    src = tmp_path / "m.onnx"
    onnx.save(b.build(b.op("Reshape", [y, b.const(np.array([5, -1], np.int64))])), str(src))
    out, report = tmp_path / "o.onnx", tmp_path / "r.json"
    result = invoke("optimize", src, out, "--require-verify", "--report", report)
    assert result.exit_code == 1 and "was not written" in result.output
    assert not out.exists()
    assert json.loads(report.read_text())["verification"]["status"] == "skipped"


def test_default_target_says_when_cpu_would_fuse_more(tmp_path):
    """cpu+cuda (the default) refuses activations CUDA's FusedConv lacks; the user is told that --target cpu
    fuses them for a CPU-only model. Not said with --target cpu, nor with -q."""
    b = GraphBuilder()
    x = b.input("x", [1, 3, 8, 8])
    onnx.save(b.build(b.op("Sigmoid", [b.conv(x, 3, 4)])), str(tmp_path / "m.onnx"))
    result = invoke("optimize", tmp_path / "m.onnx", tmp_path / "o.onnx", "--no-verify")
    assert result.exit_code == 0
    assert "hint: 1 pattern(s) left unfused because target cpu+cuda" in result.output
    assert "--target cpu accepts 1 of them" in result.output
    assert "left unfused: 1 activation-not-supported-by-target (what would fuse it: --target cpu)" in result.output
    for extra in (("--target", "cpu"), ("-q",)):
        result = invoke("optimize", tmp_path / "m.onnx", tmp_path / "o.onnx", "--no-verify", "--overwrite", *extra)
        assert result.exit_code == 0 and "hint:" not in result.output


def test_ctrl_c_while_the_libraries_load_exits_130_with_one_line():
    """The console script's entry point (onnxfuse.__main__.run) imports the CLI, and with it onnx, numpy and
    onnx-graphsurgeon, inside its Ctrl-C handling; `import onnxfuse` itself loads none of them. The interrupt is
    raised deterministically by an import hook on onnxfuse.cli.main."""
    code = """
import sys
class Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == "onnxfuse.cli.main":
            raise KeyboardInterrupt
sys.meta_path.insert(0, Interrupt())
import onnxfuse
assert "numpy" not in sys.modules and "onnx" not in sys.modules, sorted(sys.modules)
from onnxfuse.__main__ import run
run()
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), cwd=REPO)
    assert r.returncode == 130, r.stderr
    assert r.stderr == "error: interrupted\n" and r.stdout == ""


@functools.cache
def _library_files_in_tmpdir() -> frozenset[str]:
    """Names that importing onnxruntime alone leaves in an empty TMPDIR, in every run, signal or not (onnxruntime
    1.32 keeps a session id in ``$TMPDIR/.ses``): not onnxfuse's temporary files."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-c", "import onnxruntime"], env={**_env(), "TMPDIR": tmp}, check=True,
                       timeout=120)
        return frozenset(os.listdir(tmp))


def _leftovers(tmpdir: Path) -> list[str]:
    """What is in ``tmpdir`` besides the files onnxruntime's import leaves there."""
    return sorted(set(os.listdir(tmpdir)) - _library_files_in_tmpdir())


#: Runs ``python -m onnxfuse`` (runpy, as ``-m`` does) with model_io.write_parts wrapped: after it writes a file
#: in a temporary folder inside the folder WHERE (TMPDIR: the verification copy of the model; OUTPUT's folder: the
#: temporary folder beside OUTPUT), the process sends itself SIGNAL and notes the file in MARKER. The signal
#: arrives while that temporary file exists, every run, with no timing to hope for.
_SIGNAL_AT_WRITE = """
import os, runpy, signal, sys
from pathlib import Path
from onnxfuse.model import io as model_io

write_parts = model_io.write_parts
where, signum, marker = sys.argv[1], getattr(signal, sys.argv[2]), sys.argv[3]

def write_and_signal(path, parts):
    write_parts(path, parts)
    if Path(path).resolve().parent.parent == Path(where).resolve() and not os.path.exists(marker):
        Path(marker).write_text(str(path))
        os.kill(os.getpid(), signum)

model_io.write_parts = write_and_signal
sys.argv = ["onnxfuse", *sys.argv[4:]]
runpy.run_module("onnxfuse", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize(("signame", "code", "where"), [
    ("SIGTERM", 143, "tmp"), ("SIGTERM", 143, "out"), ("SIGHUP", 129, "tmp"), ("SIGINT", 130, "out")])
def test_a_signal_at_a_temporary_write_exits_128_plus_signum_and_leaves_no_temporary_file(tmp_path, signame,
                                                                                          code, where):
    """SIGTERM (CI runners, timeout) and SIGHUP are handled as Ctrl-C is: one line, exit 128 + the signal number,
    and neither the copy of the model that verification writes to TMPDIR nor the temporary folder beside OUTPUT
    is left; OUTPUT is not written."""
    tmpdir, out_dir, marker = tmp_path / "tmp", tmp_path / "out", tmp_path / "signalled"
    tmpdir.mkdir()
    out_dir.mkdir()
    r = subprocess.run([sys.executable, "-c", _SIGNAL_AT_WRITE, str(tmp_path / where), signame, str(marker),
                        "optimize", str(SAMPLE),
                        str(out_dir / "o.onnx"), "--target", "cpu"],
                       capture_output=True, text=True, env={**_env(), "TMPDIR": str(tmpdir)}, cwd=tmp_path,
                       timeout=120)
    assert marker.exists(), r.stderr  # the signal was sent, while this temporary file existed
    assert Path(marker.read_text()).parent.parent.resolve() == (tmp_path / where).resolve()
    assert r.returncode == code, r.stderr
    expected = "interrupted" if signame == "SIGINT" else f"stopped by {signame}"
    assert r.stderr == f"error: {expected}; no partly written file was left\n" and r.stdout == ""
    assert _leftovers(tmpdir) == [] and list(out_dir.iterdir()) == []


def test_sigterm_from_outside_during_verification_exits_143_and_leaves_nothing(tmp_path):
    """What `timeout` or a cancelled CI job does: SIGTERM from another process once verification's copy of the
    model is in TMPDIR (polled for), while onnxruntime works on it."""
    src, out_dir, tmpdir = tmp_path / "big.onnx", tmp_path / "out", tmp_path / "tmp"
    _slow_model(src)
    out_dir.mkdir()
    tmpdir.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "onnxfuse", "optimize", str(src), str(out_dir / "o.onnx"),
                             "--report", str(out_dir / "r.json")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**_env(), "TMPDIR": str(tmpdir)}, cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        while not any(tmpdir.glob("onnxfuse-session-*/model.onnx")) and proc.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert proc.poll() is None, "the model was optimized before the signal: make it slower"
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 143, stderr
    assert stderr == "error: stopped by SIGTERM; no partly written file was left\n" and stdout == ""
    assert _leftovers(tmpdir) == [] and list(out_dir.iterdir()) == []


def test_names_in_error_and_log_lines_are_escaped(tmp_path):
    """An error that names an input, and the "wrote FILE" line for a file name with an escape sequence and a
    newline: one line each, no raw control character, rich markup left as text."""
    result = run_cli("report", SAMPLE, "--input-shape", "y\x1b[2J\n[red]z=1x2")
    assert result.exit_code == 2 and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1 and "y\\x1b[2J\\n[red]z" in result.stderr, result.stderr
    out = tmp_path / "o\x1b[2J\n[bold].onnx"
    result = run_cli("optimize", SAMPLE, out, "--target", "cpu")
    assert result.exit_code == 0 and out.exists()
    assert result.stderr == f"wrote {tmp_path}/o\\x1b[2J\\n[bold].onnx\n"


def test_output_names_in_verify_text_are_escaped(tmp_path):
    b = GraphBuilder()
    name = "y\x1b]0;title\x07\r\n| [red]"
    x = b.input("x", [1, 3, 4, 4])
    model = b.build(b.op("Relu", [x], name=name))
    onnx.save(model, str(tmp_path / "a.onnx"))
    result = run_cli("verify", tmp_path / "a.onnx", tmp_path / "a.onnx")
    assert result.exit_code == 0, result.output
    assert "y\\x1b]0;title\\x07\\r\\n| [red]_out" in result.stdout
    assert not any(c in result.output for c in "\x1b\x07\r")


def test_in_place_is_the_flag_that_lets_output_be_input(tmp_path):
    """--overwrite only ever meant "OUTPUT may be INPUT": its name is --in-place now (--overwrite still works);
    any other existing OUTPUT is replaced, as a build step's output is."""
    model = tmp_path / "m.onnx"
    model.write_bytes(SAMPLE.read_bytes())
    result = invoke("optimize", model, model, "--no-verify")
    assert result.exit_code == 2 and "pass --in-place to replace the input" in result.output
    assert model.read_bytes() == SAMPLE.read_bytes()
    assert invoke("optimize", model, model, "--in-place").exit_code == 0
    assert model.read_bytes() != SAMPLE.read_bytes()
    out = tmp_path / "o.onnx"
    out.write_bytes(b"an older output")
    assert invoke("optimize", SAMPLE, out).exit_code == 0 and onnx.load(str(out)).graph.node


def test_optimize_keeps_compact_weights_unless_materialize_weights_allows_it(tmp_path):
    """A weight-only int8 model: by default the written file keeps its int8 weights (no larger than the input);
    --materialize-weights 1 (MiB) stores them as float32 (the file grows by about 3 x the int8 bytes); a
    negative budget is a usage error (exit 2)."""
    from tests.builders import compact_weight

    b = GraphBuilder()
    y = b.input("x", [1, 16, 8, 8])
    for _ in range(2):
        y = b.op("Relu", [b.bn(b.conv(y, 16, 16, weight=compact_weight(b, 16, 16)), 16)])
    src = tmp_path / "in.onnx"
    onnx.save(b.build(y, opset=13), str(src))

    def int8_bytes(path):
        return sum(len(t.raw_data) for t in onnx.load(str(path)).graph.initializer
                   if t.data_type == onnx.TensorProto.INT8)

    compact, wide = tmp_path / "compact.onnx", tmp_path / "wide.onnx"
    assert invoke("optimize", src, compact).exit_code == 0
    assert int8_bytes(compact) == int8_bytes(src) == 2 * 2304
    assert compact.stat().st_size <= src.stat().st_size
    assert invoke("optimize", src, wide, "--materialize-weights", "1").exit_code == 0
    assert int8_bytes(wide) == 0
    assert wide.stat().st_size >= src.stat().st_size + 2 * 3 * 2304 - 1024
    bad = CliRunner().invoke(main, ["optimize", str(src), str(tmp_path / "x.onnx"), "--materialize-weights", "-1"])
    assert bad.exit_code == 2 and "--materialize-weights" in bad.output


@pytest.mark.parametrize("kind", ["optional_type", "sparse_constant", "empty_ints"])
def test_attributes_graphsurgeon_drops_keep_the_model_unchanged(tmp_path, kind):
    """onnx-graphsurgeon drops TYPE_PROTO and SPARSE_TENSOR attributes (Optional's type, a Constant's
    sparse_value) and cannot export an empty list attribute: such a model is written unchanged with a warning,
    never broken (it loaded before; with --no-verify nothing would have caught it)."""
    from onnx import TensorProto, helper

    b = GraphBuilder()
    x = b.input("x", [1, 4, 8, 8])
    y = b.op("Relu", [b.conv(x, 4, 4)])
    model = b.build(y)
    if kind == "optional_type":
        model.graph.node.append(helper.make_node("Optional", [], ["opt"], type=helper.make_tensor_type_proto(
            TensorProto.FLOAT, [1])))
        model.graph.output.append(helper.make_value_info("opt", helper.make_optional_type_proto(
            helper.make_tensor_type_proto(TensorProto.FLOAT, [1]))))
    elif kind == "sparse_constant":
        sparse = helper.make_sparse_tensor(helper.make_tensor("v", TensorProto.FLOAT, [1], [2.0]),
                                           helper.make_tensor("i", TensorProto.INT64, [1], [1]), [3])
        model.graph.node.append(helper.make_node("Constant", [], ["k"], sparse_value=sparse))
        model.graph.output.append(helper.make_tensor_value_info("k", TensorProto.FLOAT, [3]))
    else:
        node = helper.make_node("ReduceMean", [y], ["m"])
        node.attribute.append(helper.make_attribute("axes", [], attr_type=onnx.AttributeProto.INTS))
        model.graph.node.append(node)
        model.graph.output.append(helper.make_tensor_value_info("m", TensorProto.FLOAT, [1, 1, 1, 1]))
    model.opset_import[0].version = 17
    path, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(model, str(path))
    result = invoke("optimize", path, out, "--target", "cpu", "--no-verify")
    assert result.exit_code == 0, result.output
    assert "the model was not rewritten" in result.output and "onnx-graphsurgeon" in result.output
    written = onnx.load(str(out))
    assert [n.op_type for n in written.graph.node] == [n.op_type for n in model.graph.node]
    from onnxfuse.ort.sessions import session

    session(str(out))  # it loads, as the input does


#: How each option of the conflict rules is given in the test below (parameter name -> arguments).
_GIVEN = {"no_verify": ["--no-verify"], "require_verify": ["--require-verify"], "drop_culprits": ["--drop-culprits"],
          "layers": ["--layers"], "input_sets": ["--input-sets", "2"], "rtol": ["--rtol", "0.1"],
          "atol": ["--atol", "0.1"], "verify_timeout": ["--verify-timeout", "10"],
          "verify_budget": ["--verify-budget", "9"], "tune": ["--tune"], "tune_budget": ["--tune-budget", "5"],
          "threads": ["--threads", "2"],
          "input_value": ["--input-value", "x=1"], "input_range": ["--input-range", "x=0,1"],
          "profile_timeout": ["--profile-timeout", "5"], "profile": ["--profile"], "merge": ["--merge"],
          "shard": ["--shard", "1/2"], "ray_address": ["--ray=localhost:1"], "jobs": ["-j", "1"],
          "timeout": ["--timeout", "5"], "max_memory": ["--max-memory", "1G"], "target": ["--target", "cpu"],
          "ort_level": ["--ort-level", "all"], "plugins": ["--plugin", "nosuchmodule:Pass"]}


def _conflict_cases():
    from onnxfuse.cli.args.conflicts import BATCH_CONFLICTS, OPTIMIZE_CONFLICTS, OPTIMIZE_NEEDS, REPORT_NEEDS

    for command, rules, needs in (("optimize", OPTIMIZE_CONFLICTS, False), ("optimize", OPTIMIZE_NEEDS, True),
                                  ("report", REPORT_NEEDS, True), ("batch", BATCH_CONFLICTS, False)):
        for a, b, _ in rules:
            yield pytest.param(command, a, b, needs, id=f"{command}-{a}-{b}")


@pytest.mark.parametrize(("command", "a", "b", "needs"), list(_conflict_cases()))
def test_contradictory_options_are_one_usage_error_naming_both(tmp_path, command, a, b, needs):
    """Two options that contradict each other, or one given without the option it needs, exit 2 with one line
    that names both, before any work: nothing is written."""
    out = tmp_path / "out"
    positional = {"optimize": [SAMPLE, out / "o.onnx"], "report": [SAMPLE], "batch": [SAMPLE, "-o", out]}[command]
    out.mkdir()
    result = invoke(command, *positional, *_GIVEN[a], *([] if needs else _GIVEN[b]))
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    said = "needs" if needs else "contradict each other"
    assert len(lines) == 1 and lines[0].startswith("error: ") and said in lines[0], lines
    params = {p.name: p for p in main.commands[command].params}
    assert all(max(params[name].opts, key=len) in lines[0] for name in (a, b)), lines[0]
    assert not any(out.iterdir())


def test_an_option_at_its_default_does_not_conflict(tmp_path):
    """Only options given count: --no-verify alone keeps the verification options at their defaults."""
    result = invoke("optimize", SAMPLE, tmp_path / "o.onnx", "--no-verify")
    assert result.exit_code == 0, result.output
