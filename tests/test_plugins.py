"""Plugins (``onnxfuse.passes.plugin``): passes from outside the package, loaded with ``--plugin module:Name`` /
``plugins=[...]`` or from the entry-point group ``onnxfuse.passes`` (simulated here: nothing is installed into the
environment), run by the same driver, listed, selected, reported and verified like the built-in passes; a broken
plugin is one ``error:`` line naming it, exit code 2, nothing written. The example package under
``examples/onnxfuse-minmax-clip`` is put on ``sys.path`` for these tests."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

import onnxfuse
from onnxfuse.cli.main import main
from onnxfuse.errors import InputError, VerificationError
from onnxfuse.passes import plugin
from tests.builders import GraphBuilder
from tests.conftest import REPO, assert_same_outputs

EXAMPLE = REPO / "examples" / "onnxfuse-minmax-clip"


@pytest.fixture(autouse=True)
def example_on_path(monkeypatch):
    """The example package importable (as ``pip install -e`` would make it), no installed plugin (whatever the
    environment holds), and the entry-point cache empty before and after each test."""
    monkeypatch.syspath_prepend(str(EXAMPLE / "src"))
    monkeypatch.delenv(plugin.AUTOLOAD_ENV, raising=False)
    simulate_entry_points(monkeypatch)  # none, also where the example is installed (pip install -e: its metadata)
    yield
    plugin._installed_cached.cache_clear()


def simulate_entry_points(monkeypatch, **named: str) -> None:
    """``importlib.metadata.entry_points(group="onnxfuse.passes")`` returns ``named`` (entry-point name ->
    ``module:Name``), as if a package declaring them were installed."""
    points = [importlib.metadata.EntryPoint(name, value, plugin.ENTRY_POINT_GROUP) for name, value in named.items()]
    real = importlib.metadata.entry_points

    def fake(**kwargs):
        return points if kwargs.get("group") == plugin.ENTRY_POINT_GROUP else real(**kwargs)

    monkeypatch.setattr(importlib.metadata, "entry_points", fake)
    plugin._installed_cached.cache_clear()


def relu6_model(max_first: bool = True) -> onnx.ModelProto:
    """Conv (weights 1: outputs of standard deviation about 5 on standard-normal inputs) -> Max(., 0) ->
    Min(., 6): ReLU6 written out, the example plugin's pattern."""
    g = GraphBuilder()
    x = g.input("x", [1, 3, 8, 8])
    c = g.op("Conv", [x, g.const(np.ones((4, 3, 3, 3), np.float32)), g.const(np.zeros(4, np.float32))],
             pads=[1, 1, 1, 1])
    lo, hi = g.const(np.array(0.0, np.float32)), g.const(np.array(6.0, np.float32))
    first, second = (("Max", lo), ("Min", hi)) if max_first else (("Min", hi), ("Max", lo))
    m = g.op(first[0], [c, first[1]])
    return g.build(g.op(second[0], [m, second[1]]))


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "relu6.onnx"
    onnx.save(relu6_model(), path)
    return path


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def write_plugin(tmp_path, monkeypatch, source: str, module: str = "my_plugin") -> str:
    """A plugin module ``module`` written from ``source`` (after the example's imports) and put on sys.path."""
    header = ("import numpy as np\nfrom onnxfuse_minmax_clip import MinMaxClip, MinMaxClipMatch\n"
              "from onnxfuse.passes.plugin import *\n")
    (tmp_path / "plugins").mkdir(exist_ok=True)
    (tmp_path / "plugins" / f"{module}.py").write_text(header + textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path / "plugins"))
    sys.modules.pop(module, None)
    return module


def ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


# --- loading, running, selecting -------------------------------------------------------------------------------


def test_plugin_option_fuses_verifies_and_reports(model_file, tmp_path):
    out, report = tmp_path / "o.onnx", tmp_path / "r.json"
    result = cli("optimize", model_file, out, "--target", "cpu", "--plugin", "onnxfuse_minmax_clip:MinMaxClip",
                 "--report", report)
    assert result.exit_code == 0, result.output
    written = onnx.load(out)
    onnx.checker.check_model(written, full_check=True)
    assert ops(written) == ["FusedConv"]
    assert_same_outputs(relu6_model(), written)
    doc = json.loads(report.read_text())
    assert doc["verification"]["status"] == "passed"
    stats = {row["name"]: row for row in doc["pass_stats"]}
    assert stats["minmax_clip"]["applied"] == 1
    assert any("minmax_clip" in row["passes"] for row in doc["fusions"])
    assert "minmax_clip" in {p.value for p in written.metadata_props if p.key == "onnxfuse.passes"}.pop()


def test_plugin_rewrites_and_refusals_in_every_report_format(model_file, tmp_path):
    declined = tmp_path / "declined.onnx"
    model = relu6_model()
    model.graph.output.append(onnx.helper.make_tensor_value_info(model.graph.node[1].output[0],
                                                                 onnx.TensorProto.FLOAT, [1, 4, 8, 8]))
    onnx.save(model, declined)
    for fmt in ("text", "markdown", "json", "html"):
        fused = cli("report", model_file, "--format", fmt, "--plugin", "onnxfuse_minmax_clip:MinMaxClip")
        assert fused.exit_code == 0 and "minmax_clip" in fused.output.replace("\\_", "_"), fmt
        refused = cli("report", declined, "--format", fmt, "--all", "--plugin", "onnxfuse_minmax_clip:MinMaxClip")
        assert refused.exit_code == 0 and "intermediate-is-graph-output" in refused.output, fmt
    doc = json.loads(cli("report", declined, "--format", "json", "--plugin",
                         "onnxfuse_minmax_clip:MinMaxClip").output)
    assert [(u["pass"], u["reason"]) for u in doc["unfused"] if u["pass"] == "minmax_clip"] == [
        ("minmax_clip", "intermediate-is-graph-output")]


def test_entry_point_plugin_runs_without_option_and_is_listed(model_file, tmp_path, monkeypatch):
    simulate_entry_points(monkeypatch, minmax_clip="onnxfuse_minmax_clip:MinMaxClip")
    listing = cli("passes")
    assert listing.exit_code == 0
    line = next(s for s in listing.output.splitlines() if s.startswith("minmax_clip"))
    assert "plugin onnxfuse_minmax_clip:MinMaxClip (entry point minmax_clip)" in line
    names = [s.split()[0] for s in listing.output.splitlines() if not s.startswith(" ")]
    assert names.index("minmax_clip") == names.index("conv_unfused") - 1  # after the fusions, before conv_unfused
    out = tmp_path / "o.onnx"
    assert cli("optimize", model_file, out, "--target", "cpu").exit_code == 0
    assert ops(onnx.load(out)) == ["FusedConv"]
    monkeypatch.setenv(plugin.AUTOLOAD_ENV, "1")  # autoload off: the built-in passes only
    assert "minmax_clip" not in cli("passes").output
    assert cli("optimize", model_file, out, "--target", "cpu").exit_code == 0
    assert "FusedConv" not in ops(onnx.load(out))


def test_passes_lists_a_plugin_option_with_its_origin():
    result = cli("passes", "--plugin", "onnxfuse_minmax_clip:MinMaxClip")
    assert result.exit_code == 0
    assert "[plugin onnxfuse_minmax_clip:MinMaxClip (--plugin)]" in result.output
    assert "declines: intermediate-has-other-consumers" in result.output


def test_only_and_skip_select_plugins(model_file, tmp_path):
    out = tmp_path / "o.onnx"
    spec = ("--plugin", "onnxfuse_minmax_clip:MinMaxClip")
    assert cli("optimize", model_file, out, "--target", "cpu", *spec, "--only", "minmax_clip").exit_code == 0
    assert ops(onnx.load(out)) == ["Conv", "Clip"]  # conv_activation did not run
    assert cli("optimize", model_file, out, "--target", "cpu", *spec, "--skip", "minmax_clip").exit_code == 0
    assert ops(onnx.load(out)) == ["Conv", "Max", "Min"]
    result = cli("optimize", model_file, out, "--only", "minmax_clip")  # not loaded: no such pass
    assert result.exit_code == 2 and "no pass named 'minmax_clip'" in result.output


def test_api_takes_specs_classes_and_instances():
    from onnxfuse_minmax_clip import MinMaxClip

    for given in ("onnxfuse_minmax_clip:MinMaxClip", MinMaxClip, MinMaxClip()):
        result = onnxfuse.optimize(relu6_model(max_first=False), target="cpu", plugins=[given])
        assert result.verification.status == "passed" and ops(result.model) == ["FusedConv"]
    report = onnxfuse.analyse(relu6_model(), target="onnx", plugins=[MinMaxClip])
    assert [f["passes"] for f in report.fusions] == [["minmax_clip"]]
    with pytest.raises(InputError, match="plugins takes a sequence"):
        onnxfuse.optimize(relu6_model(), plugins="onnxfuse_minmax_clip:MinMaxClip")  # type: ignore[arg-type]


# --- verification: a plugin's output is checked like any other -------------------------------------------------


def test_wrong_plugin_is_caught_by_verification(model_file, tmp_path):
    out = tmp_path / "o.onnx"
    result = cli("optimize", model_file, out, "--plugin", "onnxfuse_minmax_clip.wrong:ForgetsUpperBound")
    assert result.exit_code == 1 and "does not match the original" in result.output
    assert not out.exists()
    from onnxfuse_minmax_clip.wrong import ForgetsUpperBound

    with pytest.raises(VerificationError):
        onnxfuse.optimize(relu6_model(), target="onnx", plugins=[ForgetsUpperBound])


def test_plugin_cannot_turn_verification_off(model_file, tmp_path, monkeypatch):
    """A plugin that declares ``verify = False`` and returns a Fusion naming another pass: still verified (and
    caught), and recorded under its own name."""
    module = write_plugin(tmp_path, monkeypatch, """
        class Sneaky(MinMaxClip):
            name = "sneaky"
            verify = False
            def bounds(self, match):
                return match.lo, np.array(np.inf, dtype=match.hi.dtype)
            def rewrite(self, match, ctx):
                import dataclasses
                return dataclasses.replace(super().rewrite(match, ctx), pass_name="constant_fold")
    """)
    out = tmp_path / "o.onnx"
    assert cli("optimize", model_file, out, "--plugin", f"{module}:Sneaky").exit_code == 1
    assert not out.exists()
    result = onnxfuse.analyse(relu6_model(), target="onnx", plugins=[f"{module}:Sneaky"])
    assert [f["passes"] for f in result.fusions] == [["sneaky"]]


# --- broken plugins: one line naming the plugin, exit 2, nothing written ---------------------------------------


BROKEN = {
    "raises_in_match": ("""
        class Broken(MinMaxClip):
            name = "broken"
            def match(self, node, ctx):
                raise ValueError("boom")
    """, "match raised ValueError on node"),
    "raises_in_rewrite": ("""
        class Broken(MinMaxClip):
            name = "broken"
            def rewrite(self, match, ctx):
                raise KeyError("boom")
    """, "rewrite raised KeyError"),
    "invalid_graph": ("""
        class Broken(MinMaxClip):
            name = "broken"
            def bounds(self, match):
                return np.array(0, np.int64), np.array(6, np.int64)  # Clip's bounds must have x's type
    """, "the model after its rewrites is invalid"),
    "match_returns_junk": ("""
        class Broken(MinMaxClip):
            name = "broken"
            def match(self, node, ctx):
                return "yes"
    """, "not a Match, a Skip or None"),
    "undeclared_reason": ("""
        class Broken(MinMaxClip):
            name = "broken"
            reasons = (Reason.PLUGIN_DECLINED,)
    """, "not among its reasons"),
    "rewrite_returns_junk": ("""
        class Broken(MinMaxClip):
            name = "broken"
            def rewrite(self, match, ctx):
                super().rewrite(match, ctx)
                return None
    """, "not a Fusion"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_plugin_is_one_line_exit_2_nothing_written(case, model_file, tmp_path, monkeypatch):
    source, message = BROKEN[case]
    if case == "undeclared_reason":  # a pattern the example refuses (its intermediate is a graph output)
        model = relu6_model()
        model.graph.output.append(onnx.helper.make_tensor_value_info(model.graph.node[1].output[0],
                                                                     onnx.TensorProto.FLOAT, [1, 4, 8, 8]))
        onnx.save(model, model_file)
    module = write_plugin(tmp_path, monkeypatch, source)
    out, report = tmp_path / "o.onnx", tmp_path / "r.json"
    before = model_file.read_bytes()
    result = CliRunner().invoke(main, ["optimize", str(model_file), str(out), "--plugin", f"{module}:Broken",
                                       "--report", str(report)])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and f"plugin {module}:Broken (--plugin)" in lines[0]
    assert message in lines[0] and "Traceback" not in result.output
    assert not out.exists() and not report.exists() and model_file.read_bytes() == before
    with pytest.raises(plugin.PluginError, match=f"plugin {module}:Broken"):
        onnxfuse.optimize(relu6_model() if case != "undeclared_reason" else onnx.load(model_file),
                          plugins=[f"{module}:Broken"])


@pytest.mark.parametrize("spec, message", [
    ("no_such_module_xyz:P", "cannot import no_such_module_xyz (ModuleNotFoundError"),
    ("onnxfuse_minmax_clip:Nope", "has no attribute 'Nope'"),
    ("onnxfuse_minmax_clip", "expected module:Name"),
    ("json:loads", "not a subclass of onnxfuse.passes.plugin.Pass"),
])
def test_unloadable_plugin_is_one_line_exit_2(spec, message, model_file, tmp_path):
    out = tmp_path / "o.onnx"
    for args in (["optimize", model_file, out], ["report", model_file], ["passes"]):
        result = CliRunner().invoke(main, [*map(str, args), "--plugin", spec])
        assert result.exit_code == 2 and message in result.output, (args, result.output)
        assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
    assert not out.exists()


def test_plugin_import_error_names_it(tmp_path, monkeypatch, model_file):
    module = write_plugin(tmp_path, monkeypatch, "raise RuntimeError('needs a GPU')\n")
    result = CliRunner().invoke(main, ["optimize", str(model_file), str(tmp_path / "o.onnx"), "--plugin",
                                       f"{module}:X"])
    assert result.exit_code == 2
    assert result.output.strip() == (f"error: plugin {module}:X (--plugin): cannot import {module} "
                                     "(RuntimeError: needs a GPU)")


@pytest.mark.parametrize("source, message", [
    ("class P(MinMaxClip):\n    name = 'conv_activation'\n", "is the name of a built-in pass"),
    ("class P(MinMaxClip):\n    name = 'has space'\n", "is not a pass name"),
    ("class P(MinMaxClip):\n    reasons = ('my-reason',)\n", "reasons must be a non-empty tuple"),
    ("class P(MinMaxClip):\n    kind = 'fuse'\n", "kind must be a RewriteKind"),
    ("class P(MinMaxClip):\n    def __init__(self):\n        raise OSError('no')\n", "OSError when creating"),
])
def test_plugin_breaking_the_contract_is_refused(source, message, tmp_path, monkeypatch, model_file):
    module = write_plugin(tmp_path, monkeypatch, source)
    result = CliRunner().invoke(main, ["report", str(model_file), "--plugin", f"{module}:P"])
    assert result.exit_code == 2 and message in result.output and f"plugin {module}:P" in result.output


def test_two_plugins_of_one_name_are_refused(monkeypatch, model_file, tmp_path):
    module = write_plugin(tmp_path, monkeypatch, "class Other(MinMaxClip):\n    pass\n")
    result = CliRunner().invoke(main, ["report", str(model_file), "--plugin", "onnxfuse_minmax_clip:MinMaxClip",
                                       "--plugin", f"{module}:Other"])
    assert result.exit_code == 2 and "is also the name of plugin onnxfuse_minmax_clip:MinMaxClip" in result.output
    simulate_entry_points(monkeypatch, minmax_clip="onnxfuse_minmax_clip:MinMaxClip")
    # the installed plugin named again with --plugin is that plugin, not a second one
    assert cli("report", model_file, "--plugin", "onnxfuse_minmax_clip:MinMaxClip").exit_code == 0


def test_broken_entry_point_names_it(monkeypatch, model_file):
    simulate_entry_points(monkeypatch, gone="no_such_module_xyz:P")
    result = CliRunner().invoke(main, ["passes"])
    assert result.exit_code == 2
    assert "plugin no_such_module_xyz:P (entry point gone)" in result.output


# --- the example package -----------------------------------------------------------------------------------------


def test_example_package_declares_its_entry_point():
    import tomllib

    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())
    points = project["project"]["entry-points"][plugin.ENTRY_POINT_GROUP]
    assert points == {"minmax_clip": "onnxfuse_minmax_clip:MinMaxClip"}
    assert plugin.load(points["minmax_clip"]).name == "minmax_clip"


def test_example_package_own_tests_pass():
    # this checkout's onnxfuse first (not whichever one an editable install elsewhere points at)
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(EXAMPLE / "tests")],
                          cwd=EXAMPLE, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": path})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


# --- batch: --plugin passed to every model ------------------------------------------------------------------------


def test_batch_plugin_option(model_file, tmp_path):
    outdir = tmp_path / "out"
    spec = "onnxfuse_minmax_clip:MinMaxClip"
    result = cli("batch", model_file, "-o", outdir, "-j", "1", "--target", "cpu", "--plugin", spec)
    assert result.exit_code == 0, result.output
    summary = json.loads((outdir / "summary.json").read_text())
    row = summary["models"][0]
    assert row["status"] == "ok" and row["options"]["plugins"] == [spec]
    assert ops(onnx.load(outdir / row["output"])) == ["FusedConv"]
    wrong = cli("batch", model_file, "-o", tmp_path / "wrong", "-j", "1", "--plugin",
                "onnxfuse_minmax_clip.wrong:ForgetsUpperBound")
    assert wrong.exit_code == 1
    assert json.loads((tmp_path / "wrong" / "summary.json").read_text())["models"][0]["status"] == "mismatch"
    broken = CliRunner().invoke(main, ["batch", str(model_file), "-o", str(tmp_path / "b"), "--plugin", "nope_xyz:P"])
    assert broken.exit_code == 2 and len(broken.output.strip().splitlines()) == 1
    assert "plugin nope_xyz:P (--plugin): cannot import nope_xyz" in broken.output and not (tmp_path / "b").exists()


def test_batch_drop_culprits_writes_the_verified_remainder(tmp_path):
    """A wrong plugin rewrite in a batch: by default the row is ``mismatch`` and nothing is written (exit 1); with
    ``--drop-culprits`` the culprit search leaves that rewrite unfused, the rest (the BatchNormalization fold)
    verifies, and the row is ``remainder`` (exit 4) with the culprit named and the remainder written, which
    computes what the original does (onnxruntime, optimizations disabled)."""
    g = GraphBuilder()
    x = g.input("x", [1, 3, 8, 8])
    c = g.bn(g.conv(x, 3, 4), 4)
    m = g.op("Max", [c, g.const(np.array(0.0, np.float32))])
    model = g.build(g.op("Min", [m, g.const(np.array(0.1, np.float32))]))
    path = tmp_path / "bn_relu6.onnx"
    onnx.save(model, path)
    spec = "onnxfuse_minmax_clip.wrong:ForgetsUpperBound"
    plain = cli("batch", path, "-o", tmp_path / "plain", "-j", "1", "--target", "cpu", "--plugin", spec)
    row = json.loads((tmp_path / "plain" / "summary.json").read_text())["models"][0]
    assert plain.exit_code == 1 and row["status"] == "mismatch" and row["output"] is None
    dropped = cli("batch", path, "-o", tmp_path / "dropped", "-j", "1", "--target", "cpu", "--plugin", spec,
                  "--drop-culprits")
    summary = json.loads((tmp_path / "dropped" / "summary.json").read_text())
    row = summary["models"][0]
    assert dropped.exit_code == 4, dropped.output
    assert row["status"] == "remainder" and row["verification"] == "passed" and summary["counts"]["remainder"] == 1
    assert "broke verification" in row["reason"] and "minmax" in row["reason"].lower()
    assert row["options"]["drop_culprits"] is True
    out = onnx.load(tmp_path / "dropped" / row["output"])
    assert "BatchNormalization" not in ops(out) and "Clip" not in ops(out)  # the fold kept, the wrong rewrite not
    assert_same_outputs(model, out)
    refused = CliRunner().invoke(main, ["batch", str(path), "-o", str(tmp_path / "n"), "--no-verify",
                                        "--drop-culprits"])
    assert refused.exit_code == 2 and "--no-verify and --drop-culprits contradict each other" in refused.output
