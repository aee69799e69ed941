"""The public Python API (issue 12): onnxfuse.optimize / analyse / verify on ModelProtos and paths, the same
defaults as the CLI, no mutation of the caller's model, no printing, documented exceptions."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

import onnxfuse
from onnxfuse.passes.conv_batchnorm import ConvBatchNorm
from tests.builders import GraphBuilder, with_output_shapes
from tests.conftest import REPO

SAMPLE = REPO / "sample_models" / "resnet_block.onnx"


def conv_bn_relu(symbolic: bool = False) -> onnx.ModelProto:
    """Conv 3x3 (3 -> 8) -> BatchNormalization -> Relu, float32, built in memory as an export script would."""
    b = GraphBuilder(seed=3)
    x = b.input("x", ["N", 3, "H", "W"] if symbolic else [1, 3, 16, 16])
    y = b.op("Relu", [b.bn(b.conv(x, 3, 8), 8)])
    return b.build(y)


def run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def test_optimize_a_model_proto(capsys):
    model = conv_bn_relu()
    before = model.SerializeToString()
    result = onnxfuse.optimize(model)
    assert model.SerializeToString() == before  # the caller's proto is untouched, byte for byte
    assert isinstance(result, onnxfuse.Result) and isinstance(result.model, onnx.ModelProto)
    assert result.changed
    ops = [n.op_type for n in result.model.graph.node]
    assert ops == ["FusedConv"]  # BN folded, Relu fused (the default target cpu+cuda allows float32 Relu)
    # the default verifies, as the CLI does
    assert result.verification.status == "passed" and result.report.verification is result.verification
    report = result.report
    assert isinstance(report, onnxfuse.Report)
    # Conv (1x3x16x16 in, 8x3x3x3 W, 8 B, 1x8x16x16 out) + BN + Relu -> one FusedConv; saved = BN and Relu
    # traffic (2 x (in + out) of 8192 B each, plus 4 x 32 B parameters) and nothing else
    assert report.saved_bytes == 4 * 8192 + 4 * 32
    assert report.before_bytes - report.after_bytes == report.saved_bytes
    assert [f["op"] for f in report.fusions] == ["FusedConv"] and report.fusions[0]["activation"] == "Relu"
    data = json.loads(report.to_json())
    assert data["totals"]["saved_bytes"] == report.saved_bytes and data["model"]["path"] == "<ModelProto>"
    assert "Saved" in report.to_markdown() or "saved" in report.to_markdown()
    assert "FusedConv" in report.to_text()
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    np.testing.assert_allclose(run(result.model, {"x": x})[0], run(model, {"x": x})[0], rtol=1e-4, atol=1e-5)
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""  # the library never prints


def test_optimize_a_path_and_a_target(tmp_path):
    result = onnxfuse.optimize(SAMPLE, target="onnx")
    assert all(n.domain in ("", "ai.onnx") for n in result.model.graph.node)  # folds only
    assert result.verification.status == "passed"
    path = result.report.model["path"]  # no absolute path of this machine in a report
    assert not path.startswith("/") and path.endswith("resnet_block.onnx")
    onnx.checker.check_model(result.model)


def test_optimize_without_verification_and_symbolic_shapes():
    model = conv_bn_relu(symbolic=True)
    result = onnxfuse.optimize(model, verify=False, input_shapes={"x": (2, 3, 8, 8)})
    assert result.verification.status == "skipped" and "verification disabled" in result.verification.reason
    assert result.report.input_shapes == {"x": [2, 3, 8, 8]}
    assert result.report.saved_bytes == 4 * (2 * 8 * 8 * 8 * 4) + 4 * 32


def test_ort_level_decides_whether_the_residual_is_fused():
    # Conv -> Add(x) -> Relu: FusedConv with Z loses to onnxruntime's own NCHWc path at ORT_ENABLE_ALL
    b = GraphBuilder(seed=4)
    x = b.input("x", [1, 8, 16, 16])
    model = b.build(b.op("Relu", [b.op("Add", [b.conv(x, 8, 8), x])]))
    at_all = onnxfuse.optimize(model, target="cpu")
    assert "FusedConv" not in [n.op_type for n in at_all.model.graph.node]
    assert [u["reason"] for u in at_all.report.unfused] == ["slower-than-unfused-at-ort-level"]
    at_basic = onnxfuse.optimize(model, target="cpu", ort_level="basic")
    assert [n.op_type for n in at_basic.model.graph.node] == ["FusedConv"]
    assert at_basic.verification.status == "passed"
    with pytest.raises(onnxfuse.InputError, match="choose one of"):
        onnxfuse.analyse(model, ort_level="fastest")


def test_analyse_rewrites_nothing_and_verifies_nothing():
    model = conv_bn_relu()
    before = model.SerializeToString()
    report = onnxfuse.analyse(model, target="cpu")
    assert model.SerializeToString() == before
    assert report.verification is None and report.target == "cpu"
    assert report.saved_bytes > 0 and len(report.fusions) == 1


def test_verify_passes_the_optimized_model_and_fails_a_broken_one():
    model = conv_bn_relu()
    fused = onnxfuse.optimize(model, verify=False).model
    assert onnxfuse.verify(model, fused).status == "passed"
    broken = onnx.ModelProto()
    broken.CopyFrom(fused)
    for init in broken.graph.initializer:
        if init.dims == [8]:  # the folded bias
            init.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(init) + 0.5, init.name))
    result = onnxfuse.verify(model, broken)
    assert result.status == "failed" and result.failed_outputs


def test_failed_verification_raises_with_the_result(monkeypatch):
    real = ConvBatchNorm.rewrite

    def broken(self, match, ctx):
        match.bias = match.bias + 0.5  # a wrong fold
        return real(self, match, ctx)

    monkeypatch.setattr(ConvBatchNorm, "rewrite", broken)
    with pytest.raises(onnxfuse.VerificationError) as info:
        onnxfuse.optimize(conv_bn_relu())
    err = info.value
    assert isinstance(err, onnxfuse.OnnxFuseError) and err.exit_code == 1
    assert err.result is not None and err.verification.status == "failed"
    assert err.result.report.verification is err.verification


def test_require_verify_raises_when_verification_is_skipped():
    # onnxruntime runs the original, but onnxfuse cannot generate a string input (a model onnxruntime cannot
    # load is an input error instead: tests/test_invalid_inputs.py)
    b = GraphBuilder()
    x = b.input("x", [1, 3, 8, 8])
    y = b.op("Relu", [b.conv(x, 3, 4)])
    b.inputs.append(onnx.helper.make_tensor_value_info("s", onnx.TensorProto.STRING, [1]))
    t = b.op("Identity", ["s"])
    model = b.model([y])
    model.graph.output.append(onnx.helper.make_tensor_value_info(t, onnx.TensorProto.STRING, [1]))
    model = with_output_shapes(model)
    with pytest.raises(onnxfuse.VerificationError, match="skipped"):
        onnxfuse.optimize(model, require_verify=True)
    assert onnxfuse.optimize(model).verification.status == "skipped"


@pytest.mark.parametrize(("call", "message"), [
    (lambda m: onnxfuse.optimize(b"not a model"), "expected an onnx.ModelProto or a path"),
    (lambda m: onnxfuse.optimize(m, target="tpu"), "choose one of"),
    (lambda m: onnxfuse.optimize(m, only=["no_such_pass"]), "no pass named 'no_such_pass'"),
    (lambda m: onnxfuse.optimize(m, only="conv_batchnorm"), "not a string"),
    (lambda m: onnxfuse.analyse(m, input_shapes={"x": (1, "three", 16, 16)}), "sequence of integers"),
    (lambda m: onnxfuse.analyse(m, input_shapes={"x": (0, 3, 16, 16)}), "positive"),
    (lambda m: onnxfuse.analyse(m, input_shapes={"nope": (1,)}), "no graph input named 'nope'"),
    (lambda m: onnxfuse.analyse("missing-model.onnx"), "no such file"),
    (lambda m: onnxfuse.verify(m, onnx.ModelProto()), "not an ONNX model"),
    (lambda m: onnxfuse.optimize(m, rtol=-1), r"rtol: expected a finite number >= 0"),
    (lambda m: onnxfuse.optimize(m, atol="x"), r"atol: expected a finite number >= 0"),
    (lambda m: onnxfuse.verify(m, m, atol=float("nan")), r"atol: expected a finite number >= 0"),
    (lambda m: onnxfuse.analyse(m, input_shapes=[("x", (1, 3, 16, 16))]), "expected a mapping"),
])
def test_api_errors_are_input_errors(call, message):
    with pytest.raises(onnxfuse.InputError, match=message) as info:
        call(conv_bn_relu())
    assert info.value.exit_code == 2


def test_a_model_the_checker_rejects_is_an_input_error():
    model = conv_bn_relu()
    model.graph.node[0].input[1] = "no_such_weight"
    with pytest.raises(onnxfuse.InputError, match=r"onnx\.checker rejected"):
        onnxfuse.optimize(model)


def test_package_exports_and_version():
    from importlib.metadata import version

    assert onnxfuse.__version__ == version("onnxfuse")
    for name in onnxfuse.__all__:
        assert getattr(onnxfuse, name) is not None
    assert callable(onnxfuse.verify)  # the function, not the onnxfuse.verification.verify module
    assert (REPO / "onnxfuse" / "py.typed").exists()


def test_node_metadata_props_are_kept():
    # torch's exporter writes each node's module namespace into NodeProto.metadata_props (IR 10)
    b = GraphBuilder(seed=5)
    x = b.input("x", [1, 3, 8, 8])
    y = b.op("Relu", [b.bn(b.conv(x, 3, 4), 4)])
    model = b.build(b.op("Sigmoid", [y]), ir_version=10, opset=20)
    for node in model.graph.node:
        node.metadata_props.add(key="namespace", value=f"model.{node.name}")
    result = onnxfuse.optimize(model, target="cpu", verify=False)
    meta = {n.op_type: {p.key: p.value for p in n.metadata_props} for n in result.model.graph.node}
    sigmoid = next(n for n in model.graph.node if n.op_type == "Sigmoid")
    conv = next(n for n in model.graph.node if n.op_type == "Conv")
    assert meta["Sigmoid"] == {"namespace": f"model.{sigmoid.name}"}  # an untouched node
    assert meta["FusedConv"] == {"namespace": f"model.{conv.name}"}  # the fused node keeps its Conv's


def test_name_save_and_to_html(tmp_path):
    """The API names the model as asked, saves as the CLI does (external data kept, atomic) and renders HTML."""
    b = GraphBuilder()
    x = b.input("x", [1, 3, 16, 16])
    model = b.build(b.op("Relu", [b.bn(b.conv(x, 3, 32), 32)]))
    src = tmp_path / "src.onnx"
    onnx.save(model, str(src), save_as_external_data=True, location="src.weights", size_threshold=0)
    result = onnxfuse.optimize(str(src), target="cpu", name="detector")
    assert result.report.to_dict()["model"]["path"] == "detector"
    assert "detector" in result.report.to_markdown().splitlines()[0]
    html = result.report.to_html()
    assert html.startswith("<!DOCTYPE html>") and "detector" in html
    written = result.save(tmp_path / "out.onnx")
    assert written[0] == tmp_path / "out.onnx" and len(written) == 2 and written[1].name.endswith(".data")
    onnx.checker.check_model(str(tmp_path / "out.onnx"), full_check=True)
    assert onnxfuse.verify(str(src), str(tmp_path / "out.onnx")).status == "passed"


def test_saved_bytes_is_none_on_a_dynamic_model_without_shapes():
    b = GraphBuilder()
    x = b.input("x", ["N", 3, "H", "W"])
    report = onnxfuse.analyse(b.build(b.op("Relu", [b.conv(x, 3, 8)])), target="cpu")
    assert report.saved_bytes is None and "N" in report.totals["saved_bytes_expr"]


def test_errors_name_the_api_arguments_not_the_command_options():
    b = GraphBuilder()
    x = b.input("x", ["N", 3, 8, 8])
    model = b.build(b.op("Relu", [b.conv(x, 3, 4)]))
    with pytest.raises(onnxfuse.InputError) as info:
        onnxfuse.analyse(model, input_shapes={"image": (1, 3, 8, 8)})
    assert "input_shapes image" in str(info.value) and "--input-shape" not in str(info.value)
    with pytest.raises(onnxfuse.InputError, match="ort_version"):
        onnxfuse.analyse(model, ort_version="1.14")


def test_result_save_refuses_the_input_and_its_data(tmp_path):
    b = GraphBuilder()
    x = b.input("x", [1, 3, 16, 16])
    src = tmp_path / "big.onnx"
    onnx.save(b.build(b.op("Relu", [b.conv(x, 3, 32)])), str(src), save_as_external_data=True,
              location="big.onnx.data", size_threshold=0)
    data = (tmp_path / "big.onnx.data").read_bytes()
    result = onnxfuse.optimize(str(src), target="cpu")
    for path in (tmp_path / "big.onnx.data", src):
        with pytest.raises(onnxfuse.InputError, match="save to another path"):
            result.save(path)
    with pytest.raises(onnxfuse.InputError, match="expected a path"):
        result.save(b"out.onnx")
    with pytest.raises(onnxfuse.InputError, match="cannot write the model"):
        result.save(tmp_path / ("n" * 300 + ".onnx"))
    assert (tmp_path / "big.onnx.data").read_bytes() == data


@pytest.mark.parametrize("kwargs, message", [
    ({"ort_version": 1.2}, "ort_version"),
    ({"input_sets": "2"}, "input_sets"),
    ({"input_sets": 0}, "input_sets"),
    ({"verify_timeout": "5"}, "verify timeout"),
    ({"input_ranges": {"x": (float("nan"), 1)}}, "input_ranges"),
    ({"input_ranges": {"x": (5, 1)}}, "input_ranges"),
    ({"input_values": {"x": "abc"}}, "input_values"),
    ({"input_shapes": {"x": (1, 3.7, 8, 8)}}, "input_shapes"),
])
def test_api_arguments_are_checked_as_the_command_checks_its_options(kwargs, message):
    b = GraphBuilder()
    x = b.input("x", [1, 3, 8, 8])
    with pytest.raises(onnxfuse.InputError, match=message):
        onnxfuse.optimize(b.build(b.op("Relu", [b.conv(x, 3, 4)])), target="cpu", **kwargs)


def test_one_options_record_for_the_command_line_and_the_api():
    """pipeline.make_options builds the options for both: every option the CLI's optimization_options declares
    is an API keyword (``--input-shape`` is ``input_shapes``), and the same values give equal Options."""
    import inspect

    from onnxfuse.api import _options
    from onnxfuse.cli.args.optimization import optimization_option_names, to_options
    from onnxfuse.cli.bench import OPTIMIZATION_ONLY

    names = optimization_option_names()
    assert "materialize_weights" in names and "target" in names
    api_names = {n: n for n in names} | {"input_shape": "input_shapes"}
    for fn in (onnxfuse.analyse, onnxfuse.optimize):
        assert {api_names[n] for n in names} <= set(inspect.signature(fn).parameters), fn.__name__
    assert set(OPTIMIZATION_ONLY) == set(names) - {"input_shape"}  # bench refuses every one of them by name
    cli = to_options("cpu", ["conv_batchnorm"], [], ["x=1x3x8x8"], True, "extended", "1.20", 1.5)
    api = _options("cpu", {"x": (1, 3, 8, 8)}, ["conv_batchnorm"], [], True, "extended", "1.20", 1.5)
    assert cli == api and cli.materialize_weights_bytes == int(1.5 * 2**20)


def test_materialize_weights_in_the_api():
    from onnxfuse.errors import InputError

    b = GraphBuilder()
    model = b.build(b.op("Relu", [b.conv(b.input("x", [1, 3, 8, 8]), 3, 4)]))
    with pytest.raises(InputError, match="materialize_weights"):
        onnxfuse.analyse(model, materialize_weights=-1)
    assert onnxfuse.analyse(model, target="cpu", materialize_weights=4).fusions


def test_profile_in_the_api_gives_a_new_report_with_paired_timing():
    """onnxfuse.profile: what report --profile adds, for an optimize result (a ModelProto here); the result's own
    report is left as it was."""
    from tests.builders import GraphBuilder

    b = GraphBuilder()
    model = b.build(b.op("Relu", [b.bn(b.conv(b.input("x", [1, 3, 16, 16]), 3, 8), 8)]))
    result = onnxfuse.optimize(model, target="cpu", ort_level="disable")
    report = onnxfuse.profile(result, runs=2, max_time=0.0)
    assert result.report.profile is None and report is not result.report
    t = report.profile["timing"]
    assert report.profile["level"] == "disable" and t["rounds"] == 2 and t["verdict"] in ("faster", "slower",
                                                                                             "same", "inconclusive")
    assert any(line.startswith("latency at level disable") for line in
               __import__("onnxfuse.report.present", fromlist=["x"]).summary_lines(report))
    with pytest.raises(onnxfuse.InputError, match="ort_level"):
        onnxfuse.profile(result, ort_level="fastest")


def test_the_readme_api_example_runs_as_written(tmp_path, monkeypatch, capsys):
    """README.md's "Python API" example, run as written in a folder holding a ``model.onnx`` with an input ``x`` of
    symbolic dims (Conv -> HardSwish written out, which onnxruntime does not fuse at load and ``--target cpu``
    does) and an ``other-optimizer-output.onnx``: it prints the documented figure,
    ``report.saved_bytes_beyond_onnxruntime``, first, and that figure is the summary's first one."""
    import re

    from onnxfuse.report import present

    readme = (REPO / "README.md").read_text()
    section = readme.split("## Python API", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert "saved_bytes_beyond_onnxruntime" in code  # the figure every view leads with is the one documented
    b = GraphBuilder()
    y = b.conv(b.input("x", ["N", 3, "H", "W"]), 3, 8)
    clip = b.op("Clip", [b.op("Add", [y, b.const(np.array(3.0, np.float32))]), b.const(np.array(0.0, np.float32)),
                         b.const(np.array(6.0, np.float32))])
    model = b.build(b.op("Div", [b.op("Mul", [y, clip]), b.const(np.array(6.0, np.float32))]))
    onnx.save(model, str(tmp_path / "model.onnx"))
    onnx.save(model, str(tmp_path / "other-optimizer-output.onnx"))
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)  # the repository's own documentation
    printed = capsys.readouterr().out.split()
    result = scope["result"]
    figure = result.report.saved_bytes_beyond_onnxruntime
    assert figure is not None and figure > 0 and printed[0] == str(figure)
    assert printed[-1] == "passed" and (tmp_path / "model.fused.onnx").is_file()
    assert present.human_bytes(figure) in present.summary_lines(result.report)[0]
    assert scope["check"].status == "passed" and (tmp_path / "fusion-report.html").is_file()


def test_analyse_takes_input_data_as_report_does(tmp_path):
    """``onnxfuse.analyse(input_data=...)`` is ``onnxfuse report --input-data``: the arrays' shapes are the
    report's input shapes."""
    path = tmp_path / "inputs.npz"
    np.savez(path, x=np.zeros((2, 3, 8, 8), np.float32))
    report = onnxfuse.analyse(conv_bn_relu(symbolic=True), input_data=path)
    assert report.input_shapes == {"x": [2, 3, 8, 8]} and report.saved_bytes is not None
