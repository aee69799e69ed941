"""One run, several report files: optimize --report and report -o are repeatable, each file in the format of its
extension (a CI job wants JSON for the gate and Markdown for the job summary)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from onnxfuse.cli.main import main
from tests.conftest import REPO

SAMPLE = REPO / "sample_models" / "resnet_block.onnx"


def test_optimize_writes_json_and_markdown_from_one_run(tmp_path):
    out = tmp_path / "o.onnx"
    result = CliRunner().invoke(main, ["optimize", str(SAMPLE), str(out), "--target", "cpu",
                                       "--report", str(tmp_path / "r.json"), "--report", str(tmp_path / "r.md"),
                                       "--report", str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "r.json").read_text())["verification"]["status"] == "passed"
    assert (tmp_path / "r.md").read_text().startswith("### onnxfuse memory-traffic report")
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")
    assert f"wrote {out}, {tmp_path / 'r.json'}, {tmp_path / 'r.md'}, {tmp_path / 'r.html'}" in result.stderr


def test_report_writes_each_output_in_its_format(tmp_path):
    result = CliRunner().invoke(main, ["report", str(SAMPLE), "-o", str(tmp_path / "r.json"),
                                       "-o", str(tmp_path / "r.txt")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "r.json").read_text())["schema_version"] == 3
    assert (tmp_path / "r.txt").read_text().startswith("onnxfuse ")


def test_report_format_with_several_files_or_a_file_twice_is_refused(tmp_path):
    runner = CliRunner()
    result = runner.invoke(main, ["optimize", str(SAMPLE), str(tmp_path / "o.onnx"), "--report-format", "json",
                                  "--report", str(tmp_path / "a.json"), "--report", str(tmp_path / "b.json")])
    assert result.exit_code == 2 and "--report-format applies to a single --report" in result.output
    result = runner.invoke(main, ["report", str(SAMPLE), "-o", str(tmp_path / "a.json"),
                                  "-o", str(tmp_path / "a.json")])
    assert result.exit_code == 2 and "-o" in result.output and "given twice" in result.output
    result = runner.invoke(main, ["report", str(SAMPLE), "-o", str(tmp_path / "a.json"), "-o", str(tmp_path / "a.xyz")])
    assert result.exit_code == 2 and "give a" in result.output and "--format" in result.output
    assert not list(tmp_path.iterdir())


def test_write_atomically_keeps_the_old_file_when_the_rename_fails(tmp_path, monkeypatch):
    """The one writer of reports and batch summaries: a failed rename leaves the old bytes and no temporary file;
    a successful one gives a new file the permissions of the umask."""
    import os

    import pytest

    from onnxfuse.model import files

    target = tmp_path / "r.json"
    target.write_text("old")

    def fail(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError):
        files.write_atomically(target, "new")
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]
    monkeypatch.undo()
    umask = os.umask(0o027)
    try:
        files.write_atomically(tmp_path / "n.md", b"\xc3\xa9")
    finally:
        os.umask(umask)
    assert (tmp_path / "n.md").read_text(encoding="utf-8") == "é"
    assert (tmp_path / "n.md").stat().st_mode & 0o777 == 0o640


def test_a_report_path_that_is_a_symbolic_link_is_replaced_by_the_report(tmp_path):
    """As before the writer was shared: the link becomes the report file; the file it pointed to, in another
    folder, keeps its bytes and gets no neighbour."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "real.txt").write_text("old")
    link = tmp_path / "a" / "r.md"
    link.symlink_to(tmp_path / "b" / "real.txt")
    result = CliRunner().invoke(main, ["report", str(SAMPLE), "-o", str(link)])
    assert result.exit_code == 0, result.output
    assert not link.is_symlink() and link.read_text().startswith("### onnxfuse memory-traffic report")
    assert (tmp_path / "b" / "real.txt").read_text() == "old"
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["real.txt"]


def test_a_markdown_report_has_the_same_rows_from_optimize_report_and_the_api(tmp_path):
    """One rule for row caps (present.show_every_row): a report file and the API's to_markdown()/to_text() have
    every row (here 25 fusions, above the terminal's 20), the terminal the top 20 unless --all."""
    import onnx

    import onnxfuse
    from onnxfuse.report.present import DEFAULT_TOP_ROWS
    from tests.builders import GraphBuilder

    b = GraphBuilder()
    x = b.input("x", [1, 3, 8, 8])
    n = DEFAULT_TOP_ROWS + 5
    model = b.build([b.op("Relu", [b.conv(x, 3, 4)]) for _ in range(n)])
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))

    def rows(md: str) -> int:
        return sum(1 for line in md.splitlines() if line.startswith("| `") and "Conv -\\> Relu" in line)

    args = ["--target", "cpu", "--ort-level", "disable"]
    assert CliRunner().invoke(main, ["optimize", str(path), str(tmp_path / "o.onnx"), *args, "--no-verify",
                                     "--report", str(tmp_path / "a.md")]).exit_code == 0
    assert CliRunner().invoke(main, ["report", str(path), *args, "-o", str(tmp_path / "b.md")]).exit_code == 0
    terminal = CliRunner().invoke(main, ["report", str(path), *args, "--format", "markdown"])
    every = CliRunner().invoke(main, ["report", str(path), *args, "--format", "markdown", "--all"])
    api = onnxfuse.analyse(model, target="cpu", ort_level="disable")
    assert rows((tmp_path / "a.md").read_text()) == rows((tmp_path / "b.md").read_text()) == n
    assert rows(api.to_markdown()) == rows(every.stdout) == n
    assert rows(terminal.stdout) == rows(api.to_markdown(show_all=False)) == DEFAULT_TOP_ROWS
    assert api.to_text().count("Conv -> Relu") == n
