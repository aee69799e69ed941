"""Committed files name no absolute path of the machine they were made on (issue 12): commands in the docs run
from the repository root, and benchmark results record model paths relative to it."""

import re
import subprocess

import pytest

from tests.conftest import REPO

#: An absolute path under a folder that belongs to one machine (a home, a scratch or a work folder).
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:work|root|home|tmp|Users)/")
BINARY_SUFFIXES = (".onnx", ".npz", ".png", ".jpg")


def test_no_absolute_machine_paths_in_committed_files():
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the committed files cannot be listed")
    found = []
    for name in filter(None, listed.decode().split("\0")):
        path = REPO / name
        if name.endswith(BINARY_SUFFIXES) or not path.is_file():
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if MACHINE_PATH.search(line):
                found.append(f"{name}:{number}: {line.strip()[:100]}")
    assert not found, "absolute paths of this machine:\n" + "\n".join(found)


def test_banned_imports_keep_onnxruntime_and_graphsurgeon_in_their_modules():
    """ruff's banned-api rule (pyproject.toml, and the ruff.toml of onnxfuse/ort/, ir/ and passes/ that lift one
    ban each) refuses onnxruntime and onnx-graphsurgeon imports, lazy ones too, outside the modules allowed them:
    onnxruntime only in ort/ and analysis/ort_symbolic.py, onnx-graphsurgeon only in ir/ and passes/."""
    import shutil

    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (pip install -e '.[test]')")
    code = "def f():\n    import onnxruntime\n    import onnx_graphsurgeon\n    return onnxruntime, onnx_graphsurgeon\n"
    both, neither = {"onnxruntime", "onnx_graphsurgeon"}, set()
    ort_only, gs_only = {"onnxruntime"}, {"onnx_graphsurgeon"}
    for name, banned in (("onnxfuse/report/model.py", both), ("onnxfuse/cli/main.py", both),
                         ("onnxfuse/batch.py", both), ("onnxfuse/analysis/shapes.py", both),
                         ("onnxfuse/ort/sessions.py", gs_only),
                         ("onnxfuse/passes/x.py", ort_only), ("onnxfuse/ir/convert.py", ort_only),
                         ("onnxfuse/analysis/ort_symbolic.py", neither)):
        out = subprocess.run([ruff, "check", "--no-cache", "--select", "TID251", "--stdin-filename", name, "-"],
                             input=code, capture_output=True, text=True, cwd=REPO)
        assert {m for m in ("onnxruntime", "onnx_graphsurgeon") if f"`{m}` is banned" in out.stdout} == banned, (
            name, out.stdout)


def test_no_function_in_the_package_is_over_80_lines():
    """A function that does one job reads in one screen: none in onnxfuse/ is over 80 lines from its ``def`` to
    its last line (docstring included; click's option decorators above it are declarations, not counted), read
    from the source with :mod:`ast`."""
    import ast

    long = []
    for path in sorted((REPO / "onnxfuse").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > 80:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "functions over 80 lines:\n" + "\n".join(long)


def test_every_folder_of_the_package_is_a_package_that_setuptools_finds():
    """A non-editable install (``pip install .``) holds what ``[tool.setuptools.packages.find]`` finds: every
    folder of onnxfuse/ with Python files must have an ``__init__.py``, or its modules are left out of the wheel
    and the installed command fails to import them."""
    from setuptools import find_packages

    found = set(find_packages(where=str(REPO), include=["onnxfuse*"]))
    folders = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "onnxfuse").rglob("*.py")
               if "__pycache__" not in p.parts}
    assert folders <= found, sorted(folders - found)
    assert 'include = ["onnxfuse*"]' in (REPO / "pyproject.toml").read_text()


def test_the_reference_lists_every_pass():
    """docs/reference.md's pass table has a row for each registered pass, in the order they run."""
    from onnxfuse.passes import PASS_NAMES

    rows = [line.split("`")[1] for line in (REPO / "docs" / "reference.md").read_text(encoding="utf-8").splitlines()
            if line.startswith("| `") and line.split("`")[1] in PASS_NAMES]
    assert rows == list(PASS_NAMES)
