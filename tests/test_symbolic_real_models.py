"""Symbolic traffic on real models (``../shared/models``; skipped without it): with no input shape the report
gives a saved-bytes expression (non-zero wherever something was fused), and that expression evaluated at the
shapes the models' applications feed (``shared/models/README.md``) equals, byte for byte, the number the report
gives with ``--input-shape``; onnx shape inference at those shapes agrees with the symbolic shapes."""

from __future__ import annotations

import json

import pytest
import sympy
from click.testing import CliRunner

from onnxfuse import pipeline
from onnxfuse.cli.main import main
from onnxfuse.report import model as report_model
from tests.conftest import shared_model
from tests.test_real_models import INPUT_SHAPES
from tests.test_report import validate

pytestmark = pytest.mark.requires_shared_models

#: shared/models/README.md, "Input shapes to use" (one table, in test_real_models).
README_SHAPES = INPUT_SHAPES


@pytest.mark.parametrize("name", sorted(README_SHAPES))
def test_saved_bytes_expression_evaluates_to_the_input_shape_number(name):
    path = shared_model(name)
    symbolic = json.loads(report_model.to_json(pipeline.analyse(path, pipeline.Options(target="cpu")).report))
    concrete = pipeline.analyse(path, pipeline.Options(target="cpu", input_shapes=README_SHAPES[name],
                                                       expressions=True)).report
    validate(symbolic)
    validate(concrete.to_dict())
    assert symbolic["symbols"], "every shared model has symbolic input dims"
    values = {sympy.Symbol(s): README_SHAPES[name][w["input"]][w["axis"]] for s, w in symbolic["symbols"].items()}
    saved = sympy.sympify(symbolic["totals"]["saved_bytes_expr"])
    if symbolic["fusions"]:
        assert saved != 0
    assert int(saved.subs(values)) == concrete.totals["saved_bytes"]
    for side in ("before", "after"):
        got = int(sympy.sympify(symbolic["totals"][side]["total_bytes_expr"]).subs(values))
        assert got == concrete.totals[side]["total_bytes"]
        assert symbolic["totals"][side]["unknown_nodes"] == concrete.totals[side]["unknown_nodes"]
    assert not [w for w in concrete.warnings if "disagree" in w], concrete.warnings


def _without_expressions(doc):
    """A report dict less what only the symbolic path has: expressions (``*_expr``, shapes of fusion rows, which
    are expressions of the input dims there), the symbols and their values, onnxruntime's merge assumptions and
    the share as the dims grow (a limit of expressions)."""
    if isinstance(doc, dict):
        return {k: _without_expressions(v) for k, v in doc.items()
                if not k.endswith("_expr") and k not in ("symbols", "symbol_values", "shape_assumptions",
                                                          "saved_percent_as_dims_grow", "shape")}
    if isinstance(doc, list):
        return [_without_expressions(v) for v in doc]
    return doc


@pytest.mark.parametrize("name", sorted(README_SHAPES))
def test_numeric_report_equals_the_symbolic_one_at_the_input_shapes(name):
    """Issue 35's numeric report: given every dim, the default (counted at the shapes, no symbolic inference)
    gives the same JSON as the symbolic report evaluated at those shapes, except the expressions: the same
    numbers in every total and row, the same fusions and unfused patterns, every ``*_expr`` its number."""
    path = shared_model(name)
    options = {"target": "cpu", "input_shapes": README_SHAPES[name]}
    symbolic = pipeline.analyse(path, pipeline.Options(**options, expressions=True)).report.to_dict()
    numeric = pipeline.analyse(path, pipeline.Options(**options)).report.to_dict()
    validate(numeric)
    assert _without_expressions(numeric) == _without_expressions(symbolic)
    if numeric["symbols"]:  # the shapes left a tensor unsized (a subgraph, say): counted symbolically anyway
        assert numeric == symbolic
        return
    assert numeric["totals"]["saved_bytes_expr"] == str(numeric["totals"]["saved_bytes"])
    assert [f["shape"] for f in numeric["fusions"]] == [
        [int(sympy.sympify(str(d)).subs({sympy.Symbol(k): v for k, v in symbolic["symbol_values"].items()}))
         for d in f["shape"]] for f in symbolic["fusions"]]


def test_cli_json_without_input_shape_has_expressions():
    path = shared_model("timm_efficientnet_b0")
    result = CliRunner().invoke(main, ["report", str(path), "--format", "json", "--target", "cpu"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["symbols"] == {"batch": {"input": "input", "axis": 0, "dim_param": "batch"}}
    saved = sympy.sympify(doc["totals"]["saved_bytes_expr"])
    assert saved.free_symbols == {sympy.Symbol("batch")} and doc["totals"]["saved_bytes"] is None
    assert doc["totals"]["at_batch_1"]["saved_bytes"] == int(saved.subs(sympy.Symbol("batch"), 1)) > 0


def test_contradicting_shapes_are_one_line_errors(tmp_path):
    path = shared_model("silero_vad_16k_op15")
    result = CliRunner().invoke(main, ["report", str(path), "--input-shape", "input=1x512",
                                       "--input-shape", "state=2x4x128"])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and "'batch'" in result.output and "input=1x512" in result.output
