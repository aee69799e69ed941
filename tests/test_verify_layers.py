"""``onnxfuse verify A B --layers`` (issue 32): every tensor both models write under the same name, compared by
the calibrated rule; the first that diverge, in the original's topological order, with the node that writes them."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner

from onnxfuse import pipeline
from onnxfuse.cli.main import main
from onnxfuse.verification.layers import compare_layers
from tests.builders import GraphBuilder
from tests.conftest import optimize
from tests.test_culprits import Mutant, chain_model, inject, pick_site


def _mutant(monkeypatch, tmp_path, kind: str = "drop_bias"):
    """The chain model, and onnxfuse's output of it with one site rewritten wrongly: (paths, the culprit Fusion)."""
    model = chain_model()
    options = pipeline.Options(target="cpu", ort_level="disable")
    correct = pipeline.optimize(None, options, None, loaded=_loaded(model))
    pass_name, site = pick_site(correct.fusions, kind, correct.model)
    with monkeypatch.context() as m:
        inject(m, Mutant(kind, pass_name, site=site))
        wrong = pipeline.optimize(None, options, None, loaded=_loaded(model))
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    onnx.save(model, str(a))
    onnx.save(wrong.model, str(b))
    return a, b, next(f for f in correct.fusions if f.site == site)


def _loaded(model):
    from onnxfuse.api import _load

    return _load(model, None)


def test_layers_print_the_first_diverging_tensor_at_the_wrong_site(monkeypatch, tmp_path):
    a, b, culprit = _mutant(monkeypatch, tmp_path)
    layers = compare_layers(str(a), str(b))
    assert layers.first and layers.first[0].diff.name == culprit.output  # the tensor the wrong rewrite writes
    assert layers.first[0].candidate_node[0] == culprit.node and layers.first[0].diff.max_abs_error > 0
    # every tensor before it, in topological order, matches
    before = layers.compared[:layers.compared.index(culprit.output)]
    assert before and all(o.passed for o in layers.verification.outputs if o.name in before)
    result = CliRunner().invoke(main, ["verify", str(a), str(b), "--layers"])
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    first = lines.index(next(line for line in lines if "diverge; the first" in line)) + 1
    assert lines[first].strip().startswith(f"{culprit.output}:") and culprit.node in lines[first]
    doc = json.loads(CliRunner().invoke(main, ["verify", str(a), str(b), "--layers", "--format", "json"]).stdout)
    assert doc["layers"]["first"][0]["tensor"] == culprit.output and doc["layers"]["diverging"] >= 1


def test_layers_of_another_optimizers_output_match(tmp_path):
    """onnxruntime's own optimized graph (ORT_ENABLE_BASIC, saved): a pair onnxfuse did not make."""
    a, b = tmp_path / "a.onnx", tmp_path / "ort.onnx"
    onnx.save(chain_model(), str(a))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.optimized_model_filepath = str(b)
    ort.InferenceSession(str(a), so, providers=["CPUExecutionProvider"])
    layers = compare_layers(str(a), str(b))
    assert layers.diverging == 0 and layers.verification.status == "passed"
    assert len(layers.compared) > 1  # intermediate tensors kept their names


def test_layers_say_so_when_no_name_is_shared(tmp_path):
    model = chain_model(2)
    renamed = onnx.ModelProto()
    renamed.CopyFrom(model)
    outputs = {o.name for o in renamed.graph.output}
    mapping = {t: f"renamed_{i}" for i, n in enumerate(renamed.graph.node) for t in n.output if t not in outputs}
    for n in renamed.graph.node:
        n.input[:] = [mapping.get(t, t) for t in n.input]
        n.output[:] = [mapping.get(t, t) for t in n.output]
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    onnx.save(model, str(a))
    onnx.save(renamed, str(b))
    result = CliRunner().invoke(main, ["verify", str(a), str(b), "--layers"])
    assert result.exit_code == 0
    assert "no intermediate tensor exists under the same name in both models" in result.stdout


def test_a_failed_optimize_with_layers_prints_the_first_diverging_tensor(monkeypatch, tmp_path):
    model = chain_model()
    path, out, report = tmp_path / "m.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save(model, str(path))
    correct = pipeline.optimize(None, pipeline.Options(target="cpu"), None, loaded=_loaded(model))
    pass_name, site = pick_site(correct.fusions, "drop_bias", correct.model)
    culprit = next(f for f in correct.fusions if f.site == site)
    inject(monkeypatch, Mutant("drop_bias", pass_name, site=site))
    result = CliRunner().invoke(main, ["optimize", str(path), str(out), "--target", "cpu", "--layers",
                                       "--report", str(report)])
    assert result.exit_code == 1 and not out.exists()
    lines = result.stderr.splitlines()
    first = next(i for i, line in enumerate(lines) if "diverge; the first" in line) + 1
    assert lines[first].strip().startswith(f"{culprit.output}:") and culprit.node in lines[first]
    layers = json.loads(report.read_text())["verification"]["layers"]
    assert layers["first"][0]["tensor"] == culprit.output and layers["first"][0]["candidate_node"][0] == culprit.node


def _bn_flatten_gemm(batch=3):
    """x [batch, 5, 2, 2] -> BatchNormalization -> Flatten -> Gemm: batchnorm_gemm keeps the Flatten, which then
    flattens x itself."""
    from tests.passes.test_batchnorm_gemm import bn_gemm

    b, y = bn_gemm((batch, 5, 2, 2), flatten_axis=1, trans_b=True)
    return b.build(y)


def _bn_flatten_gemm_symbolic_batch():
    return _bn_flatten_gemm("N")


def _bn_reshape_gemm():
    """The same through Reshape([0, -1]) (TorchScript's ``x.view(x.size(0), -1)``), the batch symbolic."""
    b = GraphBuilder()
    y = b.op("Reshape", [b.bn(b.input("x", ["N", 5, 2, 2]), 5), b.const(np.array([0, -1], np.int64))])
    return b.build(b.gemm(y, 20, 4, trans_b=True))


def _matmul_reshape_transpose_bn():
    """MatMul -> Reshape -> Transpose -> BatchNormalization: matmul_batchnorm keeps the Reshape, which then
    reshapes the normalized MatMul output."""
    from tests.passes.test_matmul_batchnorm import conformer_like

    b, y = conformer_like(transpose=True, reshape=True)
    return b.build(y)


@pytest.mark.parametrize("make", [_bn_flatten_gemm, _bn_flatten_gemm_symbolic_batch, _bn_reshape_gemm,
                                  _matmul_reshape_transpose_bn])
def test_a_fold_that_keeps_a_node_gives_its_changed_output_a_new_name(tmp_path, make):
    """A fold that leaves a Flatten/Reshape in place changes the value that node writes: its output gets a new
    name, so the tensors both models have under one name hold the same values (no false divergence), and the
    report still sizes every node (the new tensor's shape is recorded where the old one's was known)."""
    model = make()
    result = optimize(tmp_path, model)
    assert result.fusions and "BatchNormalization" not in {n.op_type for n in result.model.graph.node}
    layers = compare_layers(model, result.model)
    assert layers.verification.status == "passed" and layers.diverging == 0, layers.lines()
    kept = {n.output[0] for n in model.graph.node} & {n.output[0] for n in result.model.graph.node}
    graph_outputs = {o.name for o in model.graph.output}
    for name in kept - graph_outputs:  # a name in both is written by a node that computes the same value
        assert name in layers.compared
    doc = result.report.to_dict()
    assert doc["unknown_nodes"] == [] and doc["totals"]["after"]["unknown_nodes"] == 0
    assert all(f["bytes_after_expr"] is not None for f in doc["fusions"])
