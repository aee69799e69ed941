"""The CI gate: ``onnxfuse report MODEL --baseline OLD.json`` prints what changed and exits 1 when a fusion was
lost or the optimized traffic grew, 0 otherwise (onnxfuse/report/baseline.py)."""

from __future__ import annotations

import json
import os
import re

import onnx
import pytest
from click.testing import CliRunner

from onnxfuse.cli.main import main
from onnxfuse.report import baseline
from tests.builders import GraphBuilder


@pytest.fixture
def model_path(tmp_path):
    """Conv -> BN -> Relu and Conv -> Sigmoid on a symbolic [N, 3, H, W] input: the cpu target makes two
    FusedConv, the onnx target only folds the BN."""
    b = GraphBuilder()
    x = b.input("x", ["N", 3, "H", "W"])
    y = b.op("Relu", [b.bn(b.conv(x, 3, 8, bias=False), 8)])
    model = b.build(b.op("Sigmoid", [b.conv(y, 8, 8)]))
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    return path


def report(path, tmp_path, target: str, name: str) -> str:
    out = tmp_path / name
    result = CliRunner().invoke(main, ["report", str(path), "--target", target, "-o", str(out)])
    assert result.exit_code == 0, result.output
    return str(out)


def gate(path, old: str, target: str, *extra):
    return CliRunner().invoke(main, ["report", str(path), "--target", target, "--baseline", old, *extra])


def test_no_change_passes(model_path, tmp_path):
    old = report(model_path, tmp_path, "cpu", "old.json")
    result = gate(model_path, old, "cpu")
    assert result.exit_code == 0, result.output
    assert "result: no regression" in result.output and "(unchanged)" in result.output
    assert "fusion lost" not in result.output and "fusion gained" not in result.output


def upgraded(tmp_path) -> str:
    """The fixture's model as a new exporter might write it: the BatchNormalization's and the second Conv's outputs
    are also graph outputs, so the Relu and the Sigmoid can no longer be fused (the BN still folds)."""
    b = GraphBuilder()
    x = b.input("x", ["N", 3, "H", "W"])
    bn = b.bn(b.conv(x, 3, 8, bias=False), 8)
    conv2 = b.conv(b.op("Relu", [bn]), 8, 8)
    path = tmp_path / "upgraded.onnx"
    onnx.save(b.build([b.op("Sigmoid", [conv2]), bn, conv2]), str(path))
    return str(path)


def test_lost_fusion_fails_and_says_what_changed(model_path, tmp_path):
    old = report(model_path, tmp_path, "cpu", "old.json")
    result = gate(upgraded(tmp_path), old, "cpu")  # an exporter upgrade broke the activation fusions
    assert result.exit_code == 1, result.output
    assert "fusion lost: FusedConv(Relu) from Conv -> BatchNormalization -> Relu (x1) at " in result.output
    assert "fusion lost: FusedConv(Sigmoid) from Conv -> Sigmoid (x1) at " in result.output
    assert "fusion gained: Conv from Conv -> BatchNormalization (x1)" in result.output  # only the fold is left
    # the saved-bytes expression before and after, and where the optimized traffic grew, in human units at the
    # stated representative size (batch 1, 224 for the other dims)
    assert "saved bytes vs the graph as exported: " in result.output and "(was " in result.output
    # the figure the reports lead with comes first: here onnxruntime fuses both chains itself at load
    assert result.output.index("saved beyond onnxruntime: ") < result.output.index("saved bytes vs the graph")
    assert "optimized traffic grew by " in result.output
    assert re.search(r"optimized traffic grew at H=224, N=1, W=224: \+[0-9.]+ (KiB|MiB)", result.output)
    assert "REGRESSION" in result.output


def test_lost_fusion_names_where_the_baseline_had_it(model_path, tmp_path):
    old_doc = json.loads(open(report(model_path, tmp_path, "cpu", "old.json")).read())
    [sigmoid] = [f for f in old_doc["fusions"] if f["activation"] == "Sigmoid"]
    result = gate(upgraded(tmp_path), str(tmp_path / "old.json"), "cpu")
    assert f"FusedConv(Sigmoid) from Conv -> Sigmoid (x1) at {sigmoid['node']} ({sigmoid['output']})" in result.output


def test_gained_fusion_passes(model_path, tmp_path):
    old = report(upgraded(tmp_path), tmp_path, "cpu", "old.json")
    result = gate(model_path, old, "cpu")
    assert result.exit_code == 0, result.output
    # the BN fold is now part of a longer fusion: extended, not lost
    assert ("fusion extended: Conv from Conv -> BatchNormalization -> FusedConv(Relu) from Conv -> "
            "BatchNormalization -> Relu (x1)") in result.output
    assert "fusion gained: FusedConv(Sigmoid) from Conv -> Sigmoid (x1)" in result.output
    assert "fusion lost" not in result.output and "result: no regression" in result.output


def test_json_comparison_and_report_file(model_path, tmp_path):
    old = report(model_path, tmp_path, "cpu", "old.json")
    result = gate(upgraded(tmp_path), old, "cpu", "--format", "json")
    assert result.exit_code == 1
    doc = json.loads(result.output)
    assert doc["regressed"] is True and doc["fusions_lost"] and doc["optimized_traffic_grew_at"]
    assert doc["fusions_lost_where"] and doc["optimized_traffic_growth_expr"]
    new = tmp_path / "new.json"
    result = gate(model_path, old, "cpu", "-o", str(new))
    assert result.exit_code == 0 and json.loads(new.read_text())["schema_version"] == 3


@pytest.mark.parametrize("option, args", [("--target cpu, now onnx", ["--target", "onnx"]),
                                          ("--ort-level all, now extended", ["--ort-level", "extended"]),
                                          ("--input-shape none, now x=1x3x8x8", ["--input-shape", "x=1x3x8x8"]),
                                          ("passes: no longer pad_conv", ["--skip", "pad_conv"])])
def test_a_baseline_made_with_other_options_is_refused(model_path, tmp_path, option, args):
    """A change of options reads as a regression of the model: the gate refuses it (exit 2) and says which."""
    old = report(model_path, tmp_path, "cpu", "old.json")
    new = tmp_path / "new.json"
    result = CliRunner().invoke(main, ["report", str(model_path), "--target", "cpu", *args, "--baseline", old,
                                       "-o", str(new)])
    assert result.exit_code == 2 and "made with other options" in result.output and option in result.output
    assert not new.exists()  # exit 2 writes nothing: the options are compared before any -o file is written


def test_markdown_comparison_keeps_expressions_in_code_spans(model_path, tmp_path):
    """In a GitHub job summary a bare ``*`` turns into italics: expressions go in code spans."""
    old = report(model_path, tmp_path, "cpu", "old.json")
    result = gate(upgraded(tmp_path), old, "cpu", "--format", "markdown")
    prefix = "- saved bytes vs the graph as exported: "
    [saved] = [line for line in result.output.splitlines() if line.startswith(prefix)]
    assert re.fullmatch(r"- saved bytes vs the graph as exported: `[^`]+\*[^`]+` \(was `[^`]+`\)", saved), saved
    assert "- fusion lost: FusedConv(Sigmoid) from Conv -\\> Sigmoid (x1) at `" in result.output


def test_unreadable_or_old_baseline_is_an_input_error(model_path, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    result = gate(model_path, str(bad), "cpu")
    assert result.exit_code == 2 and "not a JSON report" in result.output
    old = json.loads(open(report(model_path, tmp_path, "cpu", "old.json")).read())
    old["schema_version"] = 1
    bad.write_text(json.dumps(old))
    result = gate(model_path, str(bad), "cpu")
    assert result.exit_code == 2 and "schema_version 1" in result.output
    result = gate(model_path, str(tmp_path / "missing.json"), "cpu")
    assert result.exit_code == 2 and "cannot read it" in result.output


def test_traffic_growth_is_judged_on_the_expression():
    def doc(after: str, fusions=()):
        return {"fusions": list(fusions), "unfused": [], "symbol_values": {},
                "totals": {"saved_bytes_expr": "0", "after": {"total_bytes_expr": after, "unknown_nodes": 0}}}

    assert not baseline.compare(doc("44*B*H*W + 896"), doc("44*B*H*W + 896")).regressed
    assert not baseline.compare(doc("44*B*H*W + 896"), doc("40*B*H*W + 896")).regressed
    grew = baseline.compare(doc("44*B*H*W + 896"), doc("44*B*H*W + 900"))
    assert grew.regressed and grew.worse_at[0].endswith("+4 B")
    # smaller at batch 1 but larger once the input grows: still a regression
    assert baseline.compare(doc("44*B*H*W + 896"), doc("45*B*H*W + 800")).regressed


def test_long_expressions_are_shown_by_their_leading_terms_and_kept_exact_in_json():
    """A deep net's saved-bytes expression nests dozens of floors; the text shows its leading terms (as the
    summary does), the comparison's JSON keeps it exact."""
    from onnxfuse.report.baseline import Comparison

    exact = "96*N_*(floor(floor(H/2 - 1/2)/2) + 1)*(floor(floor(W/2 - 1/2)/2) + 1) + 64*N_*H*W + 1472"
    c = Comparison(saved_before=exact, saved_after=exact,
                   symbols={"N_": {"input": "x", "axis": 0, "dim_param": "N"},
                            "H": {"input": "x", "axis": 2, "dim_param": "H"},
                            "W": {"input": "x", "axis": 3, "dim_param": "W"}})
    [line] = [ln for ln in c.lines() if ln.startswith("saved bytes vs the graph as exported: ")]
    assert line == "saved bytes vs the graph as exported: ~70*N*H*W bytes + 1.4 KiB (+ smaller terms) (unchanged)"
    assert c.to_dict()["saved_bytes_expr"]["new"] == exact


# A baseline is an artifact a CI job downloads from an earlier run: untrusted input (issue: hostile inputs).

def _baseline_with(model_path, tmp_path, edit) -> str:
    doc = json.loads(open(report(model_path, tmp_path, "cpu", "old.json")).read())
    edit(doc)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.parametrize("payload", [
    "__import__('os').system('touch {marker}')",
    "Symbol('x').__class__.__init__.__globals__['os'].system('touch {marker}')",
    "(lambda: __import__('os').system('touch {marker}'))()",
    "exec(\"open('{marker}', 'w')\")",
])
@pytest.mark.parametrize("field", ["totals", "fusion", "node"])
def test_baseline_expression_is_never_evaluated(model_path, tmp_path, payload, field):
    """sympy.sympify runs eval: a crafted expression string in a baseline ran a shell command. Every expression
    of the baseline is read with onnxfuse.analysis.expressions.parse; the marker file the payload would create never
    appears, and a payload in the totals (which the gate needs) is exit 2 with one line."""
    marker = tmp_path / "pwned"
    code = payload.format(marker=marker)

    def edit(doc):
        if field == "totals":
            doc["totals"]["after"]["total_bytes_expr"] = code
        elif field == "fusion":
            doc["fusions"][0]["bytes_after_expr"] = code
            doc["fusions"][0]["bytes_after"] = None
            doc["totals"]["saved_bytes_expr"] = " + ".join(["4096*N_*H*W"] + [f"{k}*H" for k in range(20)])  # long
        else:
            doc["nodes"]["after"][0]["read_bytes_expr"] = code
            doc["nodes"]["after"][0]["read_bytes"] = None

    old = _baseline_with(model_path, tmp_path, edit)
    for fmt in ("text", "markdown", "json"):
        result = gate(model_path, old, "cpu", "--format", fmt)
        assert not marker.exists()
        assert "Traceback" not in result.output
        if field == "totals":
            assert result.exit_code == 2 and "is not a byte expression" in result.output, result.output
            assert len(result.output.strip().splitlines()) == 1
        else:
            assert result.exit_code in (0, 1), result.output


@pytest.mark.parametrize("edit, where", [
    (lambda d: d.update(fusions="all of them"), "fusions"),
    (lambda d: d["fusions"][0].update(replaced=[{"op": 3}]), "fusions.0.replaced.0"),
    (lambda d: d["totals"]["after"].update(unknown_nodes="many"), "totals.after.unknown_nodes"),
    (lambda d: d["totals"]["after"].update(total_bytes_expr=["1"]), "totals.after.total_bytes_expr"),
    (lambda d: d.update(symbols={"H": "x"}), "symbols.H"),
    (lambda d: d.update(unfused=[{}]), "unfused.0"),
])
def test_malformed_baseline_field_is_one_line_exit_2(model_path, tmp_path, edit, where):
    """A baseline of the right schema_version whose fields have other types gave tracebacks; every field is
    checked against report.schema.json first."""
    result = gate(model_path, _baseline_with(model_path, tmp_path, edit), "cpu")
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and "not a valid onnxfuse JSON report" in result.output
    assert where in result.output and len(result.output.strip().splitlines()) == 1


def test_baseline_that_is_a_fifo_or_device_is_refused_without_reading(model_path, tmp_path):
    """--baseline pointing at a FIFO hung (waiting for a writer), at /dev/zero it filled memory."""
    fifo = tmp_path / "old.json"
    os.mkfifo(fifo)
    for path in (str(fifo), "/dev/zero"):
        result = gate(model_path, path, "cpu")
        assert result.exit_code == 2 and "not a regular file" in result.output, result.output


def test_baseline_over_the_size_limit_is_refused(model_path, tmp_path, monkeypatch):
    old = report(model_path, tmp_path, "cpu", "old.json")
    monkeypatch.setattr(baseline, "MAX_BASELINE_BYTES", 100)
    result = gate(model_path, old, "cpu")
    assert result.exit_code == 2 and "larger than the 100 bytes accepted" in result.output, result.output


def test_deeply_nested_or_non_utf8_baseline_is_one_line_exit_2(model_path, tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    result = gate(model_path, str(deep), "cpu")
    assert result.exit_code == 2 and "not a" in result.output and "Traceback" not in result.output
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe\x1b[2J")
    result = gate(model_path, str(binary), "cpu")
    assert result.exit_code == 2 and "\x1b" not in result.output
    huge = tmp_path / "huge.json"  # an integer past Python's digit limit for int(str)
    huge.write_text('{"totals": ' + "9" * 5000 + ', "fusions": []}')
    result = gate(model_path, str(huge), "cpu")
    assert result.exit_code == 2 and "not a JSON report" in result.output and "Traceback" not in result.output


def _doc(fusions: list[tuple[str, str]]) -> dict:
    """A minimal report dict: fusions (node, output) of one kind, Conv -> Relu into FusedConv(Relu)."""
    totals = {"saved_bytes_expr": "0", "after": {"total_bytes_expr": "100", "unknown_nodes": 0}}
    chain = [{"op": "Conv"}, {"op": "Relu"}]
    return {"fusions": [{"op": "FusedConv", "activation": "Relu", "replaced": chain, "node": node, "output": out}
                        for node, out in fusions], "unfused": [], "totals": totals, "symbols": {}}


def test_one_lost_fusion_is_listed_at_the_one_place_it_was_lost():
    """Three Conv -> Relu fusions in the baseline, two in the new report at the same tensors: the lost one is at
    the third place only, not at "the three places the baseline had that kind"."""
    old = _doc([("a", "ya"), ("b", "yb"), ("c", "yc")])
    c = baseline.compare(old, _doc([("a", "ya"), ("c", "yc")]))
    [(kind, n)] = c.lost.items()
    assert n == 1 and c.lost_where[kind] == ["b (yb)"] and not c.lost_candidates
    [line] = [ln for ln in c.lines() if ln.startswith("fusion lost:")]
    assert line.endswith("(x1) at b (yb)")
    # every tensor renamed by the exporter: which one lost it is unknown, and the line says so
    renamed = baseline.compare(old, _doc([("p", "yp"), ("q", "yq")]))
    assert renamed.lost_candidates == {kind: 3} and renamed.to_dict()["fusions_lost_candidates"] == {kind: 3}
    [line] = [ln for ln in renamed.lines() if ln.startswith("fusion lost:")]
    assert line.endswith("(x1) at one of 3 places: a (ya), b (yb), c (yc)")


def test_a_schema_2_baseline_is_still_read(model_path, tmp_path):
    """Schema 3 only added fields (fusions[].kind, profile.timing): a baseline written as schema 2 gates as before."""
    old = report(model_path, tmp_path, "cpu", "old.json")
    doc = json.loads(open(old).read())
    doc["schema_version"] = 2
    for f in doc["fusions"]:
        del f["kind"]
    with open(old, "w") as fh:
        json.dump(doc, fh)
    result = gate(model_path, old, "cpu")
    assert result.exit_code == 0, result.output
    assert "result: no regression" in result.output


def test_a_pass_added_since_the_baseline_is_named_not_both_lists():
    """An installed plugin is one more pass in every report: the refusal names it (and how to leave it out), not
    both lists of 20-odd passes."""
    from onnxfuse.report.baseline import option_differences

    old, new = {"passes": ["a", "b", "c"]}, {"passes": ["a", "b", "c", "minmax_clip"]}
    [line] = option_differences(old, new)
    assert line.startswith("passes: now also minmax_clip") and "--skip" in line and "a,b" not in line
    assert option_differences(new, old) == ["passes: no longer minmax_clip"]
