"""Start-up (issue 25): ``--help``, ``--version`` and usage errors answer before the library's heavy dependencies
(onnx and the ml_dtypes it imports, numpy, onnxruntime, onnx-graphsurgeon, sympy) are imported; the choices that
the CLI spells out for that match the library's own lists; ``--version`` names the versions that decide the output.

Which modules a command imported is read from ``python -X importtime`` (one stderr line per module imported),
running the real entry point (``python -m onnxfuse``) in a fresh process.
"""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import pytest

from tests.conftest import REPO

#: Top-level modules that a usage error must not import.
HEAVY = ("onnx", "ml_dtypes", "numpy", "onnxruntime", "onnx_graphsurgeon", "sympy")


def run_with_importtime(*args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    """Run ``python -X importtime -m onnxfuse ARGS`` from the repository root; return the finished process and
    the names of every module it imported (``-X importtime`` lines removed from its stderr)."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "onnxfuse", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    modules, other = set(), []
    for line in proc.stderr.splitlines():
        if line.startswith("import time:"):
            modules.add(line.rsplit("|", 1)[1].strip())
        else:
            other.append(line)
    proc.stderr = "\n".join(other)
    return proc, modules


def heavy_imported(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in HEAVY)


def test_importtime_detects_the_heavy_imports_of_a_command_that_needs_them():
    """The check below cannot pass by reading nothing: `passes` imports the passes, which use graphsurgeon."""
    proc, modules = run_with_importtime("passes")
    assert proc.returncode == 0, proc.stderr
    assert {"onnx", "numpy", "onnx_graphsurgeon"} <= set(heavy_imported(modules))


@pytest.mark.parametrize("args, code", [
    (["--version"], 0),
    (["--help"], 0),
    (["optimize", "--help"], 0),
    (["report", "--help"], 0),
    (["bench", "--help"], 0),
    (["verify", "--help"], 0),
    (["passes", "--help"], 0),
    (["optimize", "--bogus"], 2),  # unknown option
    (["optimize"], 2),  # missing arguments
    (["optimize", "in.onnx"], 2),  # missing OUTPUT
    (["optimize", "in.onnx", "out.onnx", "--input-sets"], 2),  # an option without its value
    (["optimize", "in.onnx", "out.onnx", "--target", "gpu"], 2),  # not one of the choices
    (["optimize", "in.onnx", "out.onnx", "--ort-level", "max"], 2),
    (["report", "in.onnx", "--format", "pdf"], 2),
    (["bench", "in.onnx", "--runs", "0"], 2),  # out of range
    (["no-such-command"], 2),
    (["optimize", "in.onnx", "out.onnx", "--input-shape", "x=1xHx8"], 2),  # a malformed --input-shape
    (["report", "in.onnx", "--input-shape", "1x3x8x8"], 2),
    (["verify", "a.onnx", "b.onnx", "--input-shape", "x:[1,,3]"], 2),
])
def test_help_version_and_usage_errors_import_no_heavy_library(args, code):
    proc, modules = run_with_importtime(*args)
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    if code == 2:
        assert "Error:" in proc.stderr or proc.stderr.startswith("error: --input-shape")  # click's, or ours
    assert heavy_imported(modules) == [], args


def test_pass_names_are_still_checked_when_given():
    """--only/--skip look the pass names up only when given; a wrong one is still a usage error naming them."""
    from onnxfuse.passes import PASS_NAMES

    proc, _ = run_with_importtime("optimize", "in.onnx", "out.onnx", "--only", "no_such_pass")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "no_such_pass" in proc.stderr and all(name in proc.stderr for name in PASS_NAMES)


def test_spelled_out_choices_match_the_library():
    from onnxfuse.cli.args import optimization, report_output, verification
    from onnxfuse.ort import providers
    from onnxfuse.passes import PASS_NAMES
    from onnxfuse.report import formats as report_formats

    assert optimization.TARGET_NAMES == tuple(providers.TARGETS)
    assert optimization.DEFAULT_TARGET == providers.DEFAULT_TARGET
    assert report_output.REPORT_FORMATS == tuple(report_formats.FORMATS)
    assert optimization.PassChoice().choices == tuple(PASS_NAMES)
    from onnxfuse.verification.options import DEFAULT_TIMEOUT_S

    assert verification.DEFAULT_TIMEOUT_S == DEFAULT_TIMEOUT_S


def test_version_names_the_libraries_that_decide_the_output():
    """Compared with the versions the imported modules report (the command itself reads package metadata)."""
    import onnx
    import onnx_graphsurgeon
    import onnxruntime

    from onnxfuse import __version__

    proc, _ = run_with_importtime("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        f"onnxfuse {__version__}",
        f"onnxruntime {onnxruntime.__version__}",
        f"onnx {onnx.__version__}",
        f"onnx-graphsurgeon {onnx_graphsurgeon.__version__}",
    ]


def test_version_shows_the_gpu_build_and_a_missing_library(monkeypatch):
    """onnxruntime-gpu is named when it is the build installed; a library that is missing says so."""
    from onnxfuse.cli.version import version_lines

    installed = {"onnxruntime-gpu": "9.8.7", "onnx": "1.2.3"}

    def fake_version(name: str) -> str:
        if name not in installed:
            raise metadata.PackageNotFoundError(name)
        return installed[name]

    monkeypatch.setattr(metadata, "version", fake_version)
    assert version_lines()[1:] == ["onnxruntime-gpu 9.8.7", "onnx 1.2.3", "onnx-graphsurgeon not installed"]


def test_no_verify_imports_no_verification_machinery(tmp_path):
    """``optimize --no-verify`` fuses and writes the model without importing what only verification runs (the
    comparison of outputs, onnxruntime); the same command with verification does import it (the check can fail)."""
    out = tmp_path / "out.onnx"
    proc, modules = run_with_importtime("optimize", "sample_models/resnet_block.onnx", str(out), "--no-verify", "-q")
    assert proc.returncode == 0, proc.stderr
    assert out.is_file()
    assert "onnxfuse.verification.verify" not in modules
    assert "onnxruntime" not in modules
    proc, modules = run_with_importtime("optimize", "sample_models/resnet_block.onnx", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    assert {"onnxfuse.verification.verify", "onnxruntime"} <= modules


def test_the_command_collects_garbage_less_often_and_cycles_still():
    """The ``onnxfuse`` process raises the youngest generation's threshold (``__main__.GC_THRESHOLD0``), keeps the
    older ones, and still collects a reference cycle on its own."""
    code = ("import gc, weakref, onnxfuse.__main__ as m\n"
            "before = gc.get_threshold()\n"
            "m._collect_less_often()\n"
            "after = gc.get_threshold()\n"
            "assert after == (m.GC_THRESHOLD0, *before[1:]), (before, after)\n"
            "class C: pass\n"
            "c = C(); c.self = c; ref = weakref.ref(c); del c\n"
            "for _ in range(3 * m.GC_THRESHOLD0): [[]]\n"
            "junk = [[] for _ in range(3 * m.GC_THRESHOLD0)]\n"
            "assert ref() is None\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_the_command_freezes_its_objects_before_exit_and_clean_ups_still_run(tmp_path):
    """``__main__.run`` calls ``gc.freeze()`` when the command is done (the interpreter's final collection skips
    what it made); a temporary folder left in a reference cycle is still removed at exit (``weakref.finalize``)."""
    code = ("import gc, sys, tempfile\n"
            "gc.disable()\n"  # the cycle is still there when the command freezes it
            f"holder = {{'tmp': tempfile.TemporaryDirectory(dir={str(tmp_path)!r})}}\n"
            "holder['self'] = holder\n"
            "print(holder['tmp'].name)\n"
            "del holder\n"
            "assert gc.get_freeze_count() == 0\n"
            "from onnxfuse.__main__ import run\n"
            "sys.argv = ['onnxfuse', 'passes']\n"
            "try:\n"
            "    run()\n"
            "except SystemExit as exc:\n"
            "    assert exc.code in (0, None), exc.code\n"
            "assert gc.get_freeze_count() > 0\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "conv_batchnorm" in proc.stdout
    folder = proc.stdout.splitlines()[0]
    assert folder.startswith(str(tmp_path))
    assert list(tmp_path.iterdir()) == []


#: Runs ``python -m onnxfuse ARGS`` (``sys.argv[2:]``) and, at exit, writes the names in ``sys.modules`` to the file
#: ``sys.argv[1]``: what the run had imported by its end, lazy imports included.
_MODULES_AT_EXIT = ("import atexit, runpy, sys\n"
                    "out = sys.argv[1]\n"
                    "atexit.register(lambda: open(out, 'w').write('\\n'.join(sorted(sys.modules))))\n"
                    "sys.argv = ['onnxfuse', *sys.argv[2:]]\n"
                    "runpy.run_module('onnxfuse', run_name='__main__', alter_sys=True)\n")

#: What only verification (or an unsized dim) needs: a ``--no-verify`` run of a static model imports none of it.
#: ``onnxfuse.verification.result`` (and the ``rule`` constants it reads) stay: the report holds a ``Verification``
#: (``skipped``, cause ``user``), its data type.
_VERIFICATION_ONLY = ("sympy", "onnxruntime", "onnxruntime.tools.symbolic_shape_infer",
                      "onnxfuse.verification.verify", "onnxfuse.verification.run", "onnxfuse.verification.compare",
                      "onnxfuse.verification.floors", "onnxfuse.verification.models",
                      "onnxfuse.verification.options", "onnxfuse.verification.search",
                      "onnxfuse.verification.layers", "onnxfuse.culprits")


def modules_at_exit(tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    """Run the command in a fresh process from the repository root; the process and every module in its
    ``sys.modules`` when it exits."""
    listing = tmp_path / "modules.txt"
    proc = subprocess.run([sys.executable, "-c", _MODULES_AT_EXIT, str(listing), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=180)
    return proc, set(listing.read_text().split()) if listing.is_file() else set()


def test_no_verify_of_a_static_model_imports_no_sympy_symbolic_inference_or_verification(tmp_path):
    """``sys.modules`` at the end of the run (not only the import lines): a static sample model, ``--no-verify``.
    The same command verified imports them (the check can fail)."""
    out = tmp_path / "out.onnx"
    proc, modules = modules_at_exit(tmp_path, "optimize", "sample_models/resnet_block.onnx", str(out),
                                    "--no-verify", "-q")
    assert proc.returncode == 0, proc.stderr
    assert out.is_file() and "onnxfuse.pipeline" in modules
    assert sorted(m for m in _VERIFICATION_ONLY if m in modules) == []
    assert not any(m.split(".")[0] == "sympy" for m in modules)
    proc, modules = modules_at_exit(tmp_path, "optimize", "sample_models/resnet_block.onnx", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    assert {"onnxruntime", "onnxfuse.verification.verify", "onnxfuse.verification.run"} <= modules
