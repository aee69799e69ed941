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
    concrete = pipeline.analyse(path, pipeline.Options(target="cpu", input_shapes=README_SHAPES[name])).report
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
