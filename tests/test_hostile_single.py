"""Hostile inputs against the single-model paths (issue 36, round 4): each test names the attack it repeats and
fails without its fix. Bounded: small synthetic models, in-process through click's CliRunner, fault injection by
monkeypatching the one function that fails."""

from __future__ import annotations

import json

import onnx
import pytest
from click.testing import CliRunner

from onnxfuse.analysis import expressions
from onnxfuse.cli.main import main
from tests.builders import GraphBuilder


def _one_line_error(result) -> None:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    assert "Traceback" not in result.output


def _small_model(tmp_path, name: str = "m.onnx"):
    b = GraphBuilder()
    x = b.input("x", ["N", 3, "H", "W"])
    y = b.op("Relu", [b.bn(b.conv(x, 3, 8, bias=False), 8)])
    path = tmp_path / name
    onnx.save(b.build(y), str(path))
    return path


def _json_report(path, out) -> dict:
    result = CliRunner().invoke(main, ["report", str(path), "-o", str(out)])
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text())


# --- baseline expressions: bounded in work, not only in length ------------------------------------------------

@pytest.mark.parametrize("text", [
    "(a+b+c+d+e+f+g+h)**16",  # 21 characters, 245,157 terms expanded: minutes of sympy.expand before the bound
    "(a+b+c+d+e+f)*(g+h+i+j+k+l)*(m+n+o+p+q+r)*(s+t+u+v+w+x)*(y+z+A+B+C+D)*(E+F+G+H+I+J)",  # 6**6 terms
    "floor((a+b+c+d+e+f+g+h)**10)",  # under a floor, which the report's leading terms drop before expanding
])
def test_expression_whose_expansion_grows_without_limit_is_refused(text):
    with pytest.raises(expressions.ExpressionError, match="work budget"):
        expressions.parse(text)
    assert expressions.expanded_terms_bound(text) > expressions.MAX_TERMS + len(text)


def test_like_terms_with_large_denominators_are_refused():
    """H/n1 + H/n2 + ...: one coefficient whose denominator has the digits of all of them (38 s for 400 numbers of
    430 digits before the bound)."""
    numbers = [str(10**429 + 7 * i + 1) for i in range(400)]
    with pytest.raises(expressions.ExpressionError, match="digits"):
        expressions.parse("+".join(f"H/{n}" for n in numbers))
    with pytest.raises(expressions.ExpressionError, match="digits"):
        expressions.parse("H/" + "/".join(numbers[:40]))


def test_expressions_inside_the_budget_still_read():
    assert expressions.parse("(a+b)**16") == expressions.parse("(a+b)**16")
    assert expressions.parse("H/" + "3" * 400 + " + 1") is not None
    # a sum of more terms than Python's parser nests (about 2,500), as a large model's report can write
    long_sum = expressions.parse(" + ".join(f"{i + 1}*x{i}" for i in range(10_000)) + " - 7")
    assert len(long_sum.args) == 10_001
    assert long_sum.xreplace({s: 1 for s in long_sum.free_symbols}) == 10_000 * 10_001 // 2 - 7
    for text, expected in [("-a + b", "-a + b"), ("1.5e-5*H - 2", "1.5e-5*H - 2"), ("H*(W - 1) - 3", "H*(W - 1) - 3"),
                           ("-(a + b) - c", "-a - b - c"), ("H**-1 - 1", "-1 + 1/H")]:
        assert str(expressions.parse(text)) == expected


def _baseline_with(tmp_path, model, expr: str):
    doc = _json_report(model, tmp_path / "old.json")
    doc["totals"]["after"]["total_bytes_expr"] = expr
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(doc))
    return path


def test_report_baseline_with_an_expression_over_budget_is_one_line_exit_2(tmp_path):
    model = _small_model(tmp_path)
    hostile = _baseline_with(tmp_path, model, "(a+b+c+d+e+f+g+h)**16")
    result = CliRunner().invoke(main, ["report", str(model), "--baseline", str(hostile)])
    _one_line_error(result)
    assert "total_bytes_expr" in result.output and "work budget" in result.output


def _stride2_chain(tmp_path, convs: int):
    b = GraphBuilder()
    x = b.input("x", ["N", 1, "H", "W"])
    for _ in range(convs):
        x = b.conv(x, 1, 1, k=3, strides=[2, 2])
    path = tmp_path / f"chain{convs}.onnx"
    onnx.save(b.build(x), str(path))
    return path


def test_own_report_of_a_long_stride_2_chain_is_accepted_as_baseline(tmp_path):
    """A chain of k stride-2 convs writes floor(H/2**k - 1/2**k): numbers of 0.3 k digits. With 133 or more the
    old 40-digit limit refused onnxfuse's own report."""
    model = _stride2_chain(tmp_path, 150)
    doc = _json_report(model, tmp_path / "own.json")
    assert any(len(t) > 40 for t in doc["totals"]["after"]["total_bytes_expr"].split("/"))
    result = CliRunner().invoke(main, ["report", str(model), "--baseline", str(tmp_path / "own.json")])
    assert result.exit_code == 0, result.output
    assert "result: no regression" in result.output


# --- OUTPUT never resolves to INPUT ----------------------------------------------------------------------------

def _optimize(*args):
    return CliRunner().invoke(main, ["optimize", *map(str, args), "--no-verify"])


def test_output_made_a_symbolic_link_to_input_during_the_run_is_refused(tmp_path, monkeypatch):
    """The attack: OUTPUT does not exist when optimize starts (the early check passes) and becomes a symbolic link
    to INPUT while the passes run; optimize exited 0 and INPUT was overwritten."""
    from onnxfuse import pipeline

    model = _small_model(tmp_path)
    before = model.read_bytes()
    out = tmp_path / "out.onnx"
    real = pipeline.optimize

    def optimize_then_link(*args, **kwargs):
        result = real(*args, **kwargs)
        out.symlink_to(model)
        return result

    monkeypatch.setattr(pipeline, "optimize", optimize_then_link)
    result = _optimize(model, out)
    _one_line_error(result)
    assert "input model" in result.output
    assert model.read_bytes() == before
    assert out.is_symlink() and not [p for p in tmp_path.iterdir() if p.name.startswith(".onnxfuse-")]


def test_output_made_a_link_to_input_at_the_commit_point_is_refused(tmp_path, monkeypatch):
    """The check on the file at the commit point: OUTPUT becomes a hard link to INPUT (the same st_dev/st_ino)
    between the writing of the new model and its rename."""
    import os

    from onnxfuse.model import io as model_io

    model = _small_model(tmp_path)
    before = model.read_bytes()
    out = tmp_path / "out.onnx"
    monkeypatch.setattr(model_io, "_commit_hook", lambda: os.link(model, out))
    result = _optimize(model, out)
    _one_line_error(result)
    assert model.read_bytes() == before and out.read_bytes() == before  # the link, untouched


def test_in_place_still_replaces_the_input(tmp_path):
    model = _small_model(tmp_path)
    before = model.read_bytes()
    result = CliRunner().invoke(main, ["optimize", str(model), str(model), "--in-place"])
    assert result.exit_code == 0, result.output
    assert model.read_bytes() != before
    onnx.checker.check_model(str(model), full_check=True)


def test_writer_refuses_a_path_that_leads_to_the_file_read(tmp_path):
    """save_model's own check (the API's Result.save passes the input's file_id too): a link made after any early
    check, when the writer starts."""
    import onnxfuse
    from onnxfuse.errors import InputError
    from onnxfuse.model import io as model_io

    model = _small_model(tmp_path)
    before = model.read_bytes()
    result = onnxfuse.optimize(str(model), verify=False)
    link = tmp_path / "link.onnx"
    link.symlink_to(model)
    with pytest.raises(InputError, match="input model"):
        model_io.save_model(result.model, link, never_replace=result.loaded.file_id)
    assert model.read_bytes() == before


# --- --in-place: the input's permissions, and the data files only it referenced ------------------------------

def _external_model(tmp_path, name: str = "m.onnx", location: str | None = None):
    """A Conv -> BN -> Relu model whose weights (over onnx's 1 KiB threshold) are in an external data file."""
    b = GraphBuilder()
    x = b.input("x", [1, 16, 8, 8])
    y = b.op("Relu", [b.bn(b.conv(x, 16, 16, bias=False), 16)])
    path = tmp_path / name
    onnx.save(b.build(y), str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location=location or f"{name}.data", size_threshold=1024)
    return path


def test_in_place_keeps_a_private_models_permissions(tmp_path):
    """--in-place made a 0600 model world-readable (0644): the new file got 0666 less the umask."""
    import os
    import stat

    model = _small_model(tmp_path)
    os.chmod(model, 0o600)
    result = CliRunner().invoke(main, ["optimize", str(model), str(model), "--in-place", "--no-verify"])
    assert result.exit_code == 0, result.output
    assert stat.S_IMODE(model.stat().st_mode) == 0o600


def test_in_place_with_external_data_keeps_permissions_and_removes_the_old_data_file(tmp_path):
    """The old data file, referenced by no model once the input is replaced, was left beside it."""
    import os
    import stat

    model = _external_model(tmp_path)
    os.chmod(model, 0o600)
    old_data = tmp_path / "m.onnx.data"
    assert old_data.is_file()
    result = CliRunner().invoke(main, ["optimize", str(model), str(model), "--in-place"])
    assert result.exit_code == 0, result.output
    new_data = [p for p in tmp_path.iterdir() if p.name.endswith(".data")]
    assert not old_data.exists() and len(new_data) == 1
    assert {stat.S_IMODE(p.stat().st_mode) for p in (model, *new_data)} == {0o600}
    onnx.checker.check_model(str(model), full_check=True)


def test_in_place_keeps_a_data_file_another_model_references(tmp_path):
    """A copy of the model in the same folder reads the same data file: it must keep working."""
    import shutil

    import onnxruntime as ort

    model = _external_model(tmp_path, location="shared.bin")
    copy = tmp_path / "copy.onnx"
    shutil.copy(model, copy)
    result = CliRunner().invoke(main, ["optimize", str(model), str(model), "--in-place"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "shared.bin").is_file()
    ort.InferenceSession(str(copy), providers=["CPUExecutionProvider"])  # still loads its weights


# --- exit codes keep their meaning when the terminal streams fail ----------------------------------------------

@pytest.mark.skipif(not __import__("os").path.exists("/dev/full"), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize("streams", ["both", "stdout"])
def test_full_stdout_and_stderr_exit_2_not_1_and_the_model_stays(tmp_path, streams):
    """With stdout and stderr on /dev/full the exit code was 1 (the verification-failed code) although the model was
    written and verified: the error line itself failed to write and escaped as an exception. Now exit 2 (an output
    that cannot be written), the committed model complete."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    model = _small_model(tmp_path)
    out = tmp_path / "out.onnx"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "onnxfuse", "optimize", str(model), str(out),
                               "--input-shape", "x=1x3x8x8"], stdout=full,
                              stderr=full if streams == "both" else subprocess.PIPE, env=env, cwd=tmp_path,
                              timeout=300)
    assert done.returncode == 2
    onnx.checker.check_model(str(out), full_check=True)
    if streams == "stdout":
        lines = done.stderr.decode().strip().splitlines()
        assert lines[-1].startswith("error: cannot write the summary to stdout") and "was written" in lines[-1]
        assert "Traceback" not in done.stderr.decode()


# --- a full disk late in writing external data -----------------------------------------------------------------

def _three_conv_model(tmp_path, scale: float, name: str = "src.onnx"):
    """Conv -> Relu three times, weights (9 KiB each, over onnx's 1 KiB threshold) in an external data file:
    three tensors go to the output's data file."""
    import numpy as np

    b = GraphBuilder()
    x = b.input("x", [1, 16, 8, 8])
    for _ in range(3):
        x = b.op("Relu", [b.conv(x, 16, 16)])
    model = b.build(x)
    for t in model.graph.initializer:
        arr = onnx.numpy_helper.to_array(t) * np.float32(scale)
        t.CopyFrom(onnx.numpy_helper.from_array(arr.astype(np.float32), t.name))
    path = tmp_path / name
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location=f"{name}.data", size_threshold=1024)
    return path


def _enospc_at_the_last_tensor(monkeypatch, tensors: int = 3):
    """The external data writer (``model_io._write_sparse``, one call per tensor written from memory) fails with
    ENOSPC in the middle of the last tensor (half its bytes written)."""
    import errno
    import os

    from onnxfuse.model import io as model_io

    real, calls = model_io._write_sparse, []

    def write_sparse(fd, data, offset):
        calls.append(offset)
        if len(calls) == tensors:
            os.pwrite(fd, bytes(data[: len(data) // 2]), offset)
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, data, offset)

    monkeypatch.setattr(model_io, "_write_sparse", write_sparse)
    return calls


def test_enospc_at_the_last_external_tensor_keeps_the_old_pair_and_exits_2(tmp_path, monkeypatch):
    import onnxruntime as ort

    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "out.onnx"
    src = _three_conv_model(tmp_path, 1.0)
    assert CliRunner().invoke(main, ["optimize", str(src), str(out)]).exit_code == 0
    before = {p.name: p.read_bytes() for p in out_dir.iterdir()}
    src = _three_conv_model(tmp_path, 2.0)  # new weights: a new data file name
    calls = _enospc_at_the_last_tensor(monkeypatch)
    result = CliRunner().invoke(main, ["optimize", str(src), str(out)])
    assert len(calls) == 3
    _one_line_error(result)
    assert "No space left on device" in result.output and "nothing was written" in result.output
    assert {p.name: p.read_bytes() for p in out_dir.iterdir()} == before  # the old pair, nothing beside it
    ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("where", ["last tensor", "commit"])
def test_a_save_that_failed_late_leaves_the_model_in_memory_whole(tmp_path, monkeypatch, where):
    """onnx clears each tensor's raw_data as it writes it: after ENOSPC at the last tensor (or at the commit, the
    data file already moved beside OUTPUT), the result's model had lost the weights already written, and a retry
    of Result.save (space freed) wrote a model without them."""
    import errno

    import onnxfuse
    from onnxfuse.errors import InputError
    from onnxfuse.model import io as model_io
    from tests.conftest import assert_same_outputs

    src = _three_conv_model(tmp_path, 1.0)
    result = onnxfuse.optimize(str(src), verify=False)
    if where == "commit":
        def full():
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(model_io, "_commit_hook", full)
    else:
        _enospc_at_the_last_tensor(monkeypatch)
    with pytest.raises(InputError, match="No space left on device"):
        result.save(tmp_path / "out.onnx")
    monkeypatch.undo()
    assert not (tmp_path / "out.onnx").exists() and not list(tmp_path.glob("out.onnx*.data"))
    result.save(tmp_path / "out.onnx")
    written = onnx.load(str(tmp_path / "out.onnx"))
    onnx.checker.check_model(written, full_check=True)
    assert_same_outputs(onnx.load(str(src)), written)


# --- the fold size limit applies to the sum over shared weights ------------------------------------------------

def test_one_weight_shared_by_many_convs_grows_the_model_by_at_most_the_budget(tmp_path):
    """One 3x3 weight of 64 channels (147 KB) read by 20 convs, each with its own BatchNormalization: each fold
    gave its conv a folded copy and the original stayed for the others (a 9.9 MB model became 1.89 GB this way).
    Now the copies in all stay within 1 MiB; the folds beyond it are declined with fold-copies-shared-weight, and
    the written model computes what the original does."""
    import onnxfuse
    from tests.conftest import ATOL, RTOL, assert_same_outputs

    c, convs = 64, 20
    b = GraphBuilder()
    x = b.input("x", [1, c, 6, 6])
    w = b.const(b.rand(c, c, 3, 3))
    model = b.build([b.bn(b.conv(x, c, c, weight=w, bias=False), c) for _ in range(convs)])
    src = tmp_path / "shared.onnx"
    onnx.save(model, str(src))
    result = onnxfuse.optimize(str(src), only=["conv_batchnorm"], verify=False)
    out = tmp_path / "out.onnx"
    result.save(out)
    copy = c * c * 9 * 4
    assert out.stat().st_size - src.stat().st_size <= (1 << 20) + 64 * 1024  # metadata and per-conv biases aside
    folded = len(result.fusions)
    assert folded == (1 << 20) // copy and folded < convs
    refused = [u for u in result.report.unfused if u["reason"] == "fold-copies-shared-weight"]
    assert len(refused) == convs - folded
    # 576 products per output (64 channels x 3 x 3): float32 reassociation of the fold stays within 10x ATOL
    assert_same_outputs(model, onnx.load(str(out)), rtol=RTOL, atol=10 * ATOL)


# --- a time bound on report --profile ------------------------------------------------------------------------

def _slow_model(tmp_path):
    """Conv -> BN (something to fold, so that --profile runs) beside a Loop of 10^12 iterations: one run of it takes
    hours, and --profile ran each model six times with no time bound."""
    from onnx import TensorProto, helper

    b = GraphBuilder()
    x = b.input("x", [1, 3, 8, 8])
    y = b.bn(b.conv(x, 3, 4), 4)
    model = b.build(y)
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["v_in", "one"], ["v_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [1])],
        [helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])])
    graph = model.graph
    graph.initializer.extend([helper.make_tensor("trips", TensorProto.INT64, [], [10**12]),
                              helper.make_tensor("go", TensorProto.BOOL, [], [True]),
                              helper.make_tensor("v0", TensorProto.FLOAT, [1], [0.0])])
    graph.node.append(helper.make_node("Loop", ["trips", "go", "v0"], ["v_final"], body=body))
    graph.output.append(helper.make_tensor_value_info("v_final", TensorProto.FLOAT, [1]))
    path = tmp_path / "slow.onnx"
    onnx.save(model, str(path))
    return path


def test_report_profile_has_a_time_bound(tmp_path):
    model = _slow_model(tmp_path)
    result = CliRunner().invoke(main, ["report", str(model), "--profile", "--profile-timeout", "1",
                                       "--format", "json", "-o", str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc.get("profile") is None
    assert any("--profile-timeout" in w for w in doc["warnings"]), doc["warnings"]


def test_bench_has_a_time_bound(tmp_path):
    """bench ran --runs rounds (4 runs each) of a model at every level whatever one run took: hours for a Loop of
    10^12 iterations. --timeout stops the run in progress: one line, exit 2."""
    model = _slow_model(tmp_path)
    result = CliRunner().invoke(main, ["bench", str(model), "--level", "disable", "--timeout", "2", "--runs", "1",
                                       "--warmup", "0"])
    _one_line_error(result)
    assert "--timeout" in result.output and "did not finish within 2 s" in result.output


def test_bench_time_bound_adds_no_timer_per_run(monkeypatch):
    """The timed rounds share one RunOptions (one timer for the whole bench), so no per-run timer thread is added
    to the times measured."""
    import threading

    import numpy as np
    import onnxruntime as ort

    from onnxfuse.ort.sessions import TimeBound

    b = GraphBuilder()
    model = b.build(b.op("Relu", [b.input("x", [1, 4])]))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    started = []
    real = threading.Timer.start
    monkeypatch.setattr(threading.Timer, "start", lambda self: (started.append(self), real(self))[1])
    with TimeBound(60) as bound:
        for _ in range(5):
            bound.run(sess, {"x": np.ones((1, 4), np.float32)})
    assert len(started) == 1
