"""Report contents and renderers: every JSON report validates against onnxfuse/report.schema.json, totals are
the sums of the per-node rows, and the text renderer matches a golden file."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import jsonschema
import numpy as np
import pytest
import sympy
from click.testing import CliRunner

from onnxfuse import pipeline
from onnxfuse.cli.main import main
from onnxfuse.model import io as model_io
from onnxfuse.report import markdown as report_markdown
from onnxfuse.report import model as report_model
from onnxfuse.report import present
from onnxfuse.report import text as report_text
from tests.conftest import REPO

SCHEMA = json.loads((REPO / "onnxfuse" / "report.schema.json").read_text())
GOLDEN = REPO / "tests" / "golden"


def validate(doc: dict) -> None:
    jsonschema.validate(doc, SCHEMA, cls=jsonschema.Draft202012Validator)


def sample_report(name: str, monkeypatch, target: str = "cpu") -> report_model.Report:
    monkeypatch.chdir(REPO)
    return pipeline.analyse(Path("sample_models") / name, pipeline.Options(target=target)).report


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "sample_models").glob("*.onnx")))
@pytest.mark.parametrize("target", ["cpu", "cpu+cuda", "onnx"])
def test_json_report_validates_and_totals_are_sums(name, target, monkeypatch):
    doc = json.loads(report_model.to_json(sample_report(name, monkeypatch, target)))
    validate(doc)
    assert doc["schema_version"] == 3
    for side in ("before", "after"):
        rows = doc["nodes"][side]
        for key in ("read_bytes", "written_bytes"):
            total = sympy.sympify(doc["totals"][side][f"{key}_expr"])
            parts = [sympy.sympify(r[f"{key}_expr"]) for r in rows if r[f"{key}_expr"] is not None]
            assert sympy.expand(total - sympy.Add(*parts)) == 0
            if doc["totals"][side][key] is not None:
                assert doc["totals"][side][key] == sum(r[key] or 0 for r in rows)
        assert doc["totals"][side]["nodes"] == len(rows)
    saved = sympy.sympify(doc["totals"]["saved_bytes_expr"])
    fused = sympy.Add(*(sympy.sympify(f["saved_bytes_expr"]) for f in doc["fusions"]
                        if f["saved_bytes_expr"] is not None))  # None: a fusion of unknown size, in no total
    if any(p.get("removed_nodes") for p in doc["pass_stats"]):
        # canonicalization deleted nodes too (their bytes are in pass_stats, not in a fusion row)
        point = {s: 7 for s in saved.free_symbols | fused.free_symbols}
        assert saved.subs(point) >= fused.subs(point)
    else:
        assert sympy.expand(saved - fused) == 0


def test_minimum_fields_tools_rely_on(monkeypatch):
    doc = json.loads(report_model.to_json(sample_report("resnet_block.onnx", monkeypatch)))
    assert len(doc["model"]["sha256"]) == 64 and doc["target"] == "cpu"
    assert doc["totals"]["before"]["total_bytes"] > doc["totals"]["after"]["total_bytes"]
    assert {"node", "replaced", "activation", "saved_bytes"} <= set(doc["fusions"][0])
    assert doc["verification"]["status"] == "skipped" and doc["unknown_shapes"] == []
    doc = json.loads(report_model.to_json(sample_report("refuse_two_consumers.onnx", monkeypatch)))
    assert {"nodes", "reason", "bytes"} <= set(doc["unfused"][0])
    assert doc["unfused"][0]["reason"] == "intermediate-has-other-consumers"


def test_text_report_matches_golden(monkeypatch):
    from onnxfuse.ort import optimized_graph as ort_graph

    monkeypatch.setattr(ort_graph, "installed_version", lambda: "1.32.0")  # the golden file names a release
    report = sample_report("resnet_block.onnx", monkeypatch)
    rt = report.to_dict()["onnxruntime"]
    assert rt["kernels_before"] >= 1 and rt["kernels_after"] >= 1
    # the kernels onnxruntime runs at `all` depend on the CPU (its NCHWc layout adds reorder nodes where the
    # instruction set has NCHWc kernels): the golden file is of a report with the counts of a CPU without them
    report = dataclasses.replace(report, onnxruntime={**rt, "kernels_before": 6, "kernels_after": 6,
                                                      "ops_removed": {}, "ops_added": {}})
    text = report_text.to_text(report)
    golden = GOLDEN / "resnet_block.txt"
    if os.environ.get("ONNXFUSE_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text()


def test_markdown_report(monkeypatch):
    md = report_markdown.to_markdown(sample_report("resnet_block.onnx", monkeypatch))
    assert md.startswith("### onnxfuse memory-traffic report")
    # at ORT_ENABLE_ALL (the default level) the residual block's FusedConv(Z, Relu) is left unfused for speed
    assert "| before |" in md and "\x1b[" not in md
    assert "#### Fusions applied (2: 1 FusedConv, 1 fold; 1 fold inside the fused nodes)" in md
    assert "| unknown nodes |" in md.splitlines()[md.splitlines().index(next(
        line for line in md.splitlines() if line.startswith("|  | read")))]
    assert "#### Left unfused (1)" in md
    relu = sample_report("conv_relu.onnx", monkeypatch)
    assert relu.unfused == []
    assert "Left unfused" not in report_markdown.to_markdown(relu)  # an empty section is left out
    assert "Left unfused" not in report_text.to_text(relu)


def test_human_bytes():
    assert present.human_bytes(512) == "512 B"
    assert present.human_bytes(2048) == "2.0 KiB"
    assert present.human_bytes(3 * 1024**3) == "3.0 GiB"
    assert present.human_bytes(None) == "unknown"


def test_human_time_picks_units():
    assert present.human_time(0.000123) == "123 ns"
    assert present.human_time(0.0456) == "45.6 µs"
    assert present.human_time(12.5) == "12.5 ms"
    assert present.human_time(2500.0) == "2.5 s"
    assert present.human_time(None) == "unknown"


def test_bandwidth_estimate_is_labelled(monkeypatch):
    monkeypatch.chdir(REPO)
    report = pipeline.analyse(Path("sample_models") / "resnet_block.onnx",
                              pipeline.make_options(target="cpu", bandwidth=100.0)).report
    before = report.totals["before"]["total_bytes"]
    assert report.bandwidth["before_ms"] == pytest.approx(before / 100e9 * 1e3)
    text = report_text.to_text(report)
    flat = " ".join(text.split())  # rich wraps long lines
    assert "an estimate" in flat and "0.000 ms" not in flat and "µs" in flat  # 124.8 KiB at 100 GB/s: 1.28 µs
    validate(report.to_dict())


def test_cli_report_formats_and_output_file(tmp_path):
    runner = CliRunner()
    sample = str(REPO / "sample_models" / "resnet_block.onnx")
    result = runner.invoke(main, ["report", sample, "--format", "json"])
    assert result.exit_code == 0
    validate(json.loads(result.output))
    out = tmp_path / "r.md"
    result = runner.invoke(main, ["report", sample, "--format", "markdown", "-o", str(out)])
    assert result.exit_code == 0 and out.read_text().startswith("### onnxfuse")
    result = runner.invoke(main, ["report", sample])
    assert "Totals" in result.output and "\x1b[" not in result.output


def test_optimize_writes_report_by_extension_with_verification(tmp_path):
    sample = str(REPO / "sample_models" / "resnet_block.onnx")
    rj = tmp_path / "r.json"
    result = CliRunner().invoke(main, ["optimize", sample, str(tmp_path / "o.onnx"), "--report", str(rj),
                                       "--target", "cpu"])
    assert result.exit_code == 0, result.output
    doc = json.loads(rj.read_text())
    validate(doc)
    assert doc["verification"]["status"] == "passed"
    assert doc["verification"]["outputs"][0]["max_abs_error"] <= 1e-4
    result = CliRunner().invoke(main, ["optimize", sample, str(tmp_path / "o2.onnx"), "--report",
                                       str(tmp_path / "r.weird")])
    assert result.exit_code == 2 and "--report-format" in result.output


def test_cli_report_output_format_follows_extension(tmp_path):
    sample = str(REPO / "sample_models" / "resnet_block.onnx")
    runner = CliRunner()
    for name, check in (("r.json", lambda t: validate(json.loads(t))), ("r.md", lambda t: t.startswith("### ")),
                        ("r.txt", lambda t: t.startswith("onnxfuse "))):
        out = tmp_path / name
        result = runner.invoke(main, ["report", sample, "-o", str(out)])
        assert result.exit_code == 0, result.output
        assert check(out.read_text()) is not False
    result = runner.invoke(main, ["report", sample, "-o", str(tmp_path / "r.weird")])
    assert result.exit_code == 2 and "r.weird" in result.output and not (tmp_path / "r.weird").exists()
    # an explicit --format wins over the extension
    result = runner.invoke(main, ["report", sample, "--format", "json", "-o", str(tmp_path / "r.txt")])
    assert result.exit_code == 0 and json.loads((tmp_path / "r.txt").read_text())["schema_version"] == 3


def test_symbolic_json_validates_and_expressions_evaluate_to_the_numbers(fuse):
    from tests.builders import GraphBuilder

    b = GraphBuilder()
    x = b.input("x", ["batch", 3, "height", "width"])
    model = b.build(b.op("Relu", [b.bn(b.conv(b.op("Relu", [b.conv(x, 3, 8, strides=[2, 2])]), 8, 8), 8)]))
    symbolic_doc = json.loads(report_model.to_json(fuse(model).report))
    validate(symbolic_doc)
    assert symbolic_doc["totals"]["saved_bytes"] is None and symbolic_doc["totals"]["before"]["total_bytes"] is None
    concrete = fuse(model, input_shapes={"x": (2, 3, 33, 20)}, expressions=True).report
    doc = json.loads(report_model.to_json(concrete))
    validate(doc)
    values = {sympy.Symbol(k): v for k, v in doc["symbol_values"].items()}
    assert values == {sympy.Symbol("batch"): 2, sympy.Symbol("height"): 33, sympy.Symbol("width"): 20}

    def at(text):
        return int(sympy.sympify(text).subs(values))

    assert at(symbolic_doc["totals"]["saved_bytes_expr"]) == doc["totals"]["saved_bytes"] > 0
    for side in ("before", "after"):
        for key in ("read_bytes", "written_bytes", "total_bytes"):
            assert at(doc["totals"][side][f"{key}_expr"]) == doc["totals"][side][key]
        for row in doc["nodes"][side]:
            assert at(row["read_bytes_expr"]) == row["read_bytes"]
    for row in doc["fusions"]:
        assert at(row["saved_bytes_expr"]) == row["saved_bytes"]
    md = report_markdown.to_markdown(fuse(model).report)
    assert "Saved `" in md and not re.search(r"\d\*batch", re.sub(r"`[^`]*`", "", md))  # expressions in code spans
    text = report_text.to_text(fuse(model).report)
    assert not re.search(r"(?<![\d.])0 B\b", text) and "give --input-shape" in text  # unknown is never 0 B


def test_input_data_fixes_the_report_shapes_and_must_agree_with_input_shape(tmp_path):
    import numpy as np
    import onnx

    from tests.builders import GraphBuilder

    b = GraphBuilder()
    x = b.input("x", ["N", 3, "H", "W"])
    path = tmp_path / "m.onnx"
    onnx.save(b.build(b.op("Relu", [b.conv(x, 3, 8)])), str(path))
    data = tmp_path / "in.npz"
    np.savez(data, x=np.zeros((2, 3, 10, 12), np.float32))
    runner = CliRunner()
    result = runner.invoke(main, ["report", str(path), "--input-data", str(data), "--format", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    # every dim fixed: counted at those shapes, without symbols (issue 35)
    assert doc["input_shapes"] == {"x": [2, 3, 10, 12]} and doc["symbol_values"] == {}
    assert doc["totals"]["saved_bytes"] == 2 * (2 * 8 * 10 * 12 * 4)  # Relu's read and write of [2, 8, 10, 12]
    result = runner.invoke(main, ["report", str(path), "--input-data", str(data), "--input-shape", "x=1x3x10x12"])
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert "array 'x' has shape 2x3x10x12 but --input-shape gives x=1x3x10x12" in result.output
    result = runner.invoke(main, ["optimize", str(path), str(tmp_path / "o.onnx"), "--input-data", str(data),
                                  "--input-shape", "x=1x3x10x12"])
    assert result.exit_code == 2 and not (tmp_path / "o.onnx").exists()


def test_one_symbolic_dim_given_two_sizes_is_an_error(tmp_path):
    import onnx

    from tests.builders import GraphBuilder

    b = GraphBuilder()
    x, s = b.input("x", ["batch", 4]), b.input("s", [2, "batch", 4])
    path = tmp_path / "m.onnx"
    onnx.save(b.build(b.op("Add", [x, s])), str(path))
    result = CliRunner().invoke(main, ["report", str(path), "--input-shape", "x=1x4", "--input-shape", "s=2x3x4"])
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert "gives dim 'batch' (axis 1) the size 3, but x=1x4 gives it 1" in result.output


def test_long_expressions_are_shown_by_their_leading_terms():
    doc = {"symbols": {"N_": {"input": "x", "axis": 0, "dim_param": "N"},
                       "p2o_D_1": {"input": "x", "axis": 2, "dim_param": "p2o.D.1"},
                       "p2o_D_2": {"input": "x", "axis": 3, "dim_param": "p2o.D.2"}}}
    # a stride-2 conv output: floor((H - 1)/2) + 1 ~ H/2; the weights (the constant) in KiB
    expr = "64*N_*(floor(p2o_D_1/2 - 1/2) + 1)*(floor(p2o_D_2/2 - 1/2) + 1) + 12*N_*p2o_D_1 + 2048"
    assert present.leading_terms(expr, doc) == "~16*N*x[2]*x[3] bytes + 2.0 KiB (+ smaller terms)"
    assert present.leading_terms("12*N_*p2o_D_1*p2o_D_2", doc) == "~12*N*x[2]*x[3] bytes"
    assert present.leading_terms("3072", doc) == "3.0 KiB"
    # short expressions stay exact in the headline; long ones are approximated
    assert present.expr_text("12*N_", doc, code=False) == "12*N B"  # exact, by the dim's one name
    assert present.expr_text(expr, doc, code=True).startswith("`~16*N*x[2]*x[3] bytes")


def test_nothing_fused_on_a_symbolic_model_says_saved_0_and_never_unknown_totals():
    import onnxfuse
    from tests.builders import GraphBuilder

    b = GraphBuilder()
    x = b.input("x", ["batch", 3, 8, 8])
    report = onnxfuse.analyse(b.build(b.op("Sigmoid", [b.conv(x, 3, 4)])), target="onnx")
    lines = present.summary_lines(report)
    assert not report.fusions and report.saved_bytes == 0
    assert not any("unknown" in line for line in lines), lines
    assert any(line.startswith("vs the graph as exported, at batch 1 (batch is the only symbolic dim)")
               and "saved 0 B" in line for line in lines), lines


def test_markdown_and_text_tables_show_long_expressions_by_their_leading_terms(tmp_path):
    """A deep strided net without input shapes: byte figures in the Markdown and text tables over 60 characters
    are shown by their leading terms (no nested floor), and the exact expressions stay in the JSON."""
    import onnx

    from tests.builders import GraphBuilder

    b = GraphBuilder()
    x = b.input("x", ["N", 3, "H", "W"])
    c = 3
    for _ in range(5):
        x = b.op("Relu", [b.bn(b.conv(x, c, 8, strides=[2, 2]), 8)])
        c = 8
    onnx.save(b.build(x), str(tmp_path / "m.onnx"))
    result = pipeline.analyse(tmp_path / "m.onnx", pipeline.Options(target="cpu"))
    doc = result.report.to_dict()
    assert "floor(" in doc["totals"]["saved_bytes_expr"] and len(doc["totals"]["saved_bytes_expr"]) > 60
    for text in (result.report.to_markdown(show_all=True), result.report.to_text(show_all=True)):
        assert "floor(floor(" not in text  # no nested floors: expressions over 60 characters are shortened
        assert "~" in text


def test_long_expression_that_is_no_polynomial_is_shown_exact():
    """onnxruntime's inference can give Max/Mod dims; leading terms cannot be taken there (sympy.Poly refuses), so
    the expression is shown as it is instead of failing the whole report."""
    doc = {"symbols": {"H": {"input": "x", "axis": 2, "dim_param": "H"}}}
    expr = "4*Max(H, 3)*floor(H/2 - 1/2) + 12*Mod(H, 7)*floor(floor(H/2 - 1/2)/2) + 100000"
    with pytest.raises(sympy.PolynomialError):
        present.leading_terms(expr, doc)
    assert present.cell(None, expr, doc) == f"{expr} B"
    assert present.cell(None, expr, doc, code=True) == f"`{expr}` B"


#: A name that tries everything: clear the screen and colour (ANSI CSI), return and overwrite (\r), add a line
#: (\n), end a Markdown table cell (|), close a code span (`), rich markup, HTML, a heading, emphasis, and a
#: right-to-left override that reorders the rest of a terminal line.
EVIL = "\x1b[2J\x1b[31mred\rCR\nNL | pipe `tick` [red]markup[/red] <b>b</b> # h *e* \u202e"


def evil_model(path: Path) -> Path:
    """Conv -> Relu (fused) and Conv -> HardSigmoid (left unfused for cpu+cuda), every name holding EVIL."""
    import onnx

    from tests.builders import GraphBuilder

    b = GraphBuilder()
    x = b.input(f"x{EVIL}", [1, 3, 8, 8])
    relu = b.op("Relu", [b.conv(x, 3, 4, name=f"conv{EVIL}")], name=f"relu{EVIL}")
    hard = b.op("HardSigmoid", [b.conv(x, 3, 4, name=f"conv2{EVIL}")], name=f"hs{EVIL}")
    onnx.save(b.build([relu, hard]), str(path))
    return path


def test_escape_helpers():
    from onnxfuse.report import escape

    assert escape.text("a\x1b[2J\r\n\t\x7f\x9b\u202e\u2028b [red]") == \
        "a\\x1b[2J\\r\\n\\t\\x7f\\x9b\\u202e\\u2028b [red]"
    assert escape.text("plain name/with:punct-1.0 ü 😀") == "plain name/with:punct-1.0 ü 😀"
    assert escape.markdown("a|b`c*d<e>#f\n") == "a\\|b\\`c\\*d\\<e\\>\\#f\\\\n"
    assert escape.markdown("-x") == "\\-x"
    assert escape.markdown_code("a``b") == "```a``b```" and escape.markdown_code("`x") == "`` `x ``"
    assert escape.markdown_code("") == ""
    assert escape.escaped({"k\n": ["v\x1b", ("t\r", 1)], "n": None}) == {"k\\n": ["v\\x1b", ("t\\r", 1)], "n": None}


def test_names_in_the_text_report_are_escaped_and_rich_reads_no_markup(tmp_path):
    model = evil_model(tmp_path / "m.onnx")
    result = CliRunner().invoke(main, ["report", str(model), "--target", "cpu+cuda"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert not any(c in out for c in "\x1b\r\u202e")
    assert "conv\\x1b[2J\\x1b[31mred\\rCR\\nNL | pipe `tick` [red]markup[/red]" in out  # markup kept as text
    assert not any(line.startswith(("NL", "CR")) for line in out.splitlines())  # no line was added by a name
    optimized = CliRunner().invoke(main, ["optimize", str(model), str(tmp_path / "o.onnx"), "--target", "cpu+cuda"])
    assert optimized.exit_code == 0, optimized.output
    assert "worst output relu\\x1b[2J" in optimized.stdout and "\x1b" not in optimized.output


def test_names_in_the_markdown_report_cannot_add_lines_split_cells_or_format(tmp_path):
    """Rendered by markdown-it (CommonMark with GFM tables): each name shows exactly (with the text escapes) in
    its code span, each table row has its header's number of cells, and no name became HTML, a heading or
    emphasis."""
    import html

    from markdown_it import MarkdownIt

    from onnxfuse.report import escape

    model = evil_model(tmp_path / "m.onnx")
    md = tmp_path / "r.md"
    result = CliRunner().invoke(main, ["optimize", str(model), str(tmp_path / "o.onnx"), "--target", "cpu+cuda",
                                       "--report", str(md)])
    assert result.exit_code == 0, result.output
    text = md.read_text(encoding="utf-8")
    assert not any(c in text for c in "\x1b\r\u202e")
    page = MarkdownIt("commonmark").enable("table").render(text)
    for name in (f"conv{EVIL}", f"conv2{EVIL}"):
        assert f"<code>{html.escape(escape.text(name), quote=False)}</code>" in page
    assert "<b>" not in page and "<h1>" not in page and "<em>" not in page
    assert "worst output relu\\x1b[2J\\x1b[31mred\\rCR\\nNL | pipe `tick` [red]markup[/red] &lt;b&gt;" in page
    for table in re.findall(r"<table>.*?</table>", page, re.S):
        cells = [len(re.findall(r"<t[hd]>", row)) for row in re.findall(r"<tr>.*?</tr>", table, re.S)]
        assert len(set(cells)) == 1, cells


def test_names_in_the_json_report_are_exact(tmp_path):
    model = evil_model(tmp_path / "m.onnx")
    result = CliRunner().invoke(main, ["report", str(model), "--target", "cpu+cuda", "--format", "json"])
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.stdout  # json.dumps writes \u001b
    doc = json.loads(result.stdout)
    assert doc["fusions"][0]["node"] == f"conv{EVIL}"
    assert doc["unfused"][0]["nodes"][0]["name"] == f"conv2{EVIL}"


def test_names_in_baseline_lines_are_escaped(tmp_path):
    """``report --baseline``: a new unfused pattern's detail (and the baseline's file name) printed with a name in
    it, in text and in a Markdown list."""
    from onnxfuse.report import baseline

    model = evil_model(tmp_path / "m.onnx")
    new = json.loads(report_model.to_json(pipeline.analyse(model, pipeline.Options(target="cpu+cuda")).report))
    new["unfused"][0]["detail"] = f"detail {EVIL}"
    old = {**new, "unfused": []}
    comparison = baseline.compare(old, new)
    text, md = comparison.lines(), comparison.lines("markdown")
    assert any("detail \\x1b[2J" in line for line in text) and any("detail \\\\x1b\\[2J" in line for line in md)
    for line in text + md:
        assert not any(c in line for c in "\x1b\r\n\u202e"), line
    outside_code = [re.sub(r"`[^`]*`", "", line) for line in md]  # byte expressions are in code spans
    assert not any("|" in line.replace("\\|", "") or "`" in line.replace("\\`", "") for line in outside_code)
    path = tmp_path / "old\x1b[2J\n.json"
    path.write_text(json.dumps(old))
    result = CliRunner().invoke(main, ["report", str(model), "--target", "cpu+cuda", "--baseline", str(path),
                                       "--format", "markdown"])
    assert "compared with " in result.stdout and "\x1b" not in result.output, result.output
    assert all(line.startswith("- ") for line in result.stdout.splitlines())


def test_unfused_patterns_are_grouped_by_reason_with_what_would_fuse_them(tmp_path):
    """45 identical float16 refusals were 45 rows and no hint: the summary names each reason once with its count
    and remedy (onnxfuse/report/remedies.py), the tables list identical chains once with their count."""
    from tests.builders import GraphBuilder

    b = GraphBuilder(dtype=np.float16)
    y = b.input("x", [1, 4, 8, 8])
    for _ in range(3):
        y = b.op("Relu", [b.conv(y, 4, 4)])
    # float16_body would run the body in float32 (and fuse it): skipped, so that the float16 refusals remain
    report = pipeline.analyse(None, pipeline.Options(target="cpu", compare_with_onnxruntime=False,
                                                     skip=("float16_body",)),
                              loaded=__import__("onnxfuse.model.io", fromlist=["x"]).load_proto(b.build(y))).report
    lines = present.summary_lines(report)
    assert ("left unfused: 3 dtype-has-no-fusedconv-kernel (what would fuse them: no target: onnxruntime has "
            "FusedConv kernels for float32 only)") in lines
    text = report_text.to_text(report)
    assert text.count("3 x Conv -> Relu (first") == 1  # one row for the three patterns
    md = report_markdown.to_markdown(report)
    assert md.count("| 3 x Conv -\\> Relu (first `conv3`) | `dtype-has-no-fusedconv-kernel` |") == 1
    assert len(report.to_dict()["unfused"]) == 3  # the JSON keeps every pattern


def test_the_quantized_summary_line_counts_quantized_convs_and_gemms():
    """A QDQ model with a quantized Conv and a quantized Gemm: one ``quantized-conv`` and one ``quantized-gemm``
    pattern (passes/conv_unfused.py), and the summary's ``quantized:`` line counts both."""
    from onnxfuse.model import io as model_io
    from tests.builders import GraphBuilder

    b = GraphBuilder()
    conv = b.conv(b.dequantized(b.input("x", [1, 3, 8, 8])), 3, 4)
    gemm = b.gemm(b.dequantized(b.input("v", [2, 6])), 6, 5)
    model = b.build([b.dequantized(conv), b.dequantized(gemm)])
    report = pipeline.analyse(None, pipeline.Options(target="cpu", compare_with_onnxruntime=False),
                              loaded=model_io.load_proto(model)).report
    assert sorted((u["reason"], u["nodes"][0]["op"]) for u in report.to_dict()["unfused"]) == [
        ("quantized-conv", "Conv"), ("quantized-gemm", "Gemm")]
    assert ("quantized: 2 patterns inside QuantizeLinear/DequantizeLinear pairs left as they are; onnxruntime turns "
            "them into quantized kernels (QLinearConv, QGemm, QLinearMatMul) at load, at level extended and above "
            "(core/optimizer/qdq_transformer)") in present.summary_lines(report)


def test_reports_carry_no_absolute_path_of_this_machine(tmp_path, monkeypatch):
    """A report is an artifact a CI job archives: the model is named by its path as given when relative, relative
    to the working folder when inside it, else by its file name."""
    from onnxfuse.model import io as model_io

    inside = tmp_path / "work" / "models"
    inside.mkdir(parents=True)
    model = inside / "m.onnx"
    model.write_bytes((REPO / "sample_models" / "resnet_block.onnx").read_bytes())
    loaded = model_io.load_model(model)
    monkeypatch.chdir(tmp_path / "work")
    assert report_model.report_path_text(loaded) == "models/m.onnx"
    monkeypatch.chdir(REPO)
    assert report_model.report_path_text(loaded) == "m.onnx"
    assert report_model.report_path_text(model_io.load_model(Path("sample_models/resnet_block.onnx"))) == \
        "sample_models/resnet_block.onnx"
    doc = pipeline.analyse(model, pipeline.Options(compare_with_onnxruntime=False)).report.to_dict()
    assert doc["model"]["path"] == "m.onnx"


def test_the_summary_says_what_the_model_file_became(monkeypatch):
    """The input file's bytes and the optimized model's serialized bytes (compact weights stay compact)."""
    report = sample_report("resnet_block.onnx", monkeypatch)
    m = report.to_dict()["model"]
    assert m["optimized_bytes"] == report_model_bytes(monkeypatch)
    assert f"model file: {present.human_bytes(m['file_bytes'])} -> {present.human_bytes(m['optimized_bytes'])}" in \
        present.summary_lines(report)


def report_model_bytes(monkeypatch) -> int:
    monkeypatch.chdir(REPO)
    return len(pipeline.analyse(Path("sample_models") / "resnet_block.onnx", pipeline.Options(target="cpu"))
               .model.SerializeToString())


def test_unfused_line_gives_each_pattern_its_own_remedy():
    """One refusal reason whose patterns different targets would fuse: the summary's ``left unfused:`` line gives
    each remedy with its count, not the first pattern's for all (which said "no target" above a hint that
    ``--target cpu`` fuses most of them)."""
    from tests.builders import GraphBuilder

    def row(*ops):
        return {"reason": "activation-not-supported-by-target", "nodes": [{"op": op} for op in ops]}

    # Softsign: no FusedConv of any target accepts it (providers.TARGETS); cpu's accepts Sigmoid
    doc = {"target": "cuda", "unfused": [row("Conv", "Softsign"), row("Conv", "Sigmoid"), row("Conv", "Sigmoid")]}
    [(reason, n, fix)] = present.unfused_groups(doc)
    assert (reason, n) == ("activation-not-supported-by-target", 3)
    assert fix == "--target cpu (2 of them), no target: onnxruntime's FusedConv has no such activation (1 of them)"
    # a Conv -> Add (residual) that cuda refuses is one cpu emits without an activation
    b = GraphBuilder()
    x = b.input("x", [1, 4, 8, 8])
    model = b.build([b.op("Add", [b.conv(x, 4, 4), x]), b.op("Sigmoid", [b.conv(x, 4, 4)])])
    report = pipeline.analyse(None, pipeline.Options(target="cuda", ort_level="extended"),
                              loaded=_loaded(model)).report
    refused = [u for u in report.to_dict()["unfused"] if u["reason"] == "activation-not-supported-by-target"]
    assert sorted(tuple(n["op"] for n in u["nodes"]) for u in refused) == [("Conv", "Add"), ("Conv", "Sigmoid")]
    [line] = [ln for ln in present.summary_lines(report) if ln.startswith("left unfused:")]
    assert "2 activation-not-supported-by-target (what would fuse them: --target cpu)" in line


def _loaded(model):
    return model_io.load_proto(model)


def test_each_fusion_says_its_kind_and_matmul_add_is_no_fold():
    """``fusions[].kind`` (schema 3) from the passes' RewriteKind: a BatchNormalization folded into a Conv is a
    fold, a Conv -> BN -> Relu a fusion (the fold inside it too), MatMul + Add into Gemm a fusion, not a "fold"."""
    from tests.builders import GraphBuilder

    b = GraphBuilder()
    x = b.input("x", [1, 3, 8, 8])
    relu = b.op("Relu", [b.bn(b.conv(x, 3, 4), 4)])
    folded = b.bn(b.conv(x, 3, 4), 4)
    v = b.input("v", [2, 6])
    gemm = b.op("Add", [b.op("MatMul", [v, b.const(np.ones((6, 5), np.float32))]),
                        b.const(np.ones(5, np.float32))])
    model = b.build([relu, folded, gemm])
    report = pipeline.analyse(None, pipeline.Options(target="cpu"), loaded=_loaded(model)).report
    doc = report.to_dict()
    validate(doc)
    kinds = sorted((f["op"], f["kind"]) for f in doc["fusions"])
    assert kinds == [("Conv", "fold"), ("FusedConv", "fuse"), ("Gemm", "fuse")]
    assert present.kinds(doc) == "1 FusedConv, 1 fused Gemm, 1 fold; 1 fold inside the fused nodes"
    assert sorted((f["op"], f["folds"]) for f in doc["fusions"]) == [("Conv", 1), ("FusedConv", 1), ("Gemm", 0)]
    # a schema-2 row has no kind: the op tells
    assert present.fusion_kind({"op": "FusedGemm"}) == "fuse" and present.fusion_kind({"op": "Gemm"}) == "fold"


def test_bandwidth_is_a_library_function_at_the_run_s_one_size():
    """analyse(bandwidth=...) builds the report with its estimate (report.model.bandwidth_section), the same as
    --bandwidth; a model with symbolic dims gets it at the representative sizes of every other figure."""
    import onnxfuse
    from tests.builders import GraphBuilder

    b = GraphBuilder()
    model = b.build(b.op("Relu", [b.conv(b.input("x", ["N", 3, "H", "W"]), 3, 4)]))
    report = onnxfuse.analyse(model, target="cpu", bandwidth=100.0)
    bw = report.bandwidth
    assert bw is not None and bw["at"] == "representative sizes" and bw["gb_per_s"] == 100.0
    sizes = present.figure_sizes(report.to_dict())
    before = present.at_values(report.totals["before"]["total_bytes_expr"], sizes)
    assert bw["before_ms"] == pytest.approx(before / 100e9 * 1e3) and bw["after_ms"] < bw["before_ms"]
    validate(report.to_dict())
    assert "at representative sizes" in " ".join(report.to_text().split())
    with pytest.raises(Exception, match="bandwidth"):
        onnxfuse.analyse(model, bandwidth=0)


def test_folds_that_end_inside_a_fusion_are_counted():
    """A TensorFlow-style NHWC conv (Transpose -> Conv -> Transpose -> Mul -> Add -> Relu): layout_wrapper moves the
    affine and the Relu before the Transpose, conv_affine folds both, conv_activation fuses the Relu. The one row
    is a fusion, and the two folds inside it are counted (``fusions[].folds``): the summary said "0 folds"."""
    from tests.builders import GraphBuilder

    b = GraphBuilder()
    y = b.conv(b.op("Transpose", [b.input("x", [1, 8, 8, 3])], perm=[0, 3, 1, 2]), 3, 4)
    y = b.op("Transpose", [y], perm=[0, 2, 3, 1])
    y = b.op("Add", [b.op("Mul", [y, b.const(np.arange(1, 5, dtype=np.float32))]),
                     b.const(np.arange(4, dtype=np.float32))])
    report = pipeline.analyse(None, pipeline.Options(target="cpu"), loaded=_loaded(b.build(b.op("Relu", [y]))))\
        .report
    doc = report.to_dict()
    validate(doc)
    [row] = doc["fusions"]
    assert (row["op"], row["kind"], row["folds"]) == ("FusedConv", "fuse", 2)
    assert row["passes"].count("conv_affine") == 2
    assert present.kinds(doc) == "1 FusedConv, 0 folds; 2 folds inside the fused nodes"
    assert any(line.startswith("fusions: 1 fused node (1 FusedConv, 0 folds; 2 folds inside the fused nodes)")
               for line in present.summary_lines(report))
