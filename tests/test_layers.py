"""The package's architecture is its folder tree: each layer may import only from itself and the layers below it,
and no group of modules imports itself in a cycle. Every import counts, lazy ones (inside functions) and
``TYPE_CHECKING`` ones too, read from the source with :mod:`ast` (nothing is imported).

The layers, bottom first (CONTRIBUTING.md says what each holds):
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from tests.conftest import REPO

PACKAGE = REPO / "onnxfuse"

# Bottom first. A module's layer is the first name under onnxfuse/ (its sub-package or its own module name).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("_version", "errors", "records"),  # plain data: the error types, refusal reasons and rewrite records
    ("model",),  # ONNX protobuf only: load, save, hygiene, walking graphs, file rules
    ("ir",),  # onnx-graphsurgeon: conversion, in-place export, constants, edits
    ("analysis",),  # shapes, symbolic inference, memory traffic
    ("ort",),  # onnxruntime: sessions, inputs, its optimized graphs and profiles, its kernels' facts
    ("passes",),  # the pass contract, the driver and one module per pass
    ("verification",),  # the rule that compares original and output in onnxruntime
    ("report",),  # the report's data, presentation and renderers
    ("culprits",),  # the culprit search's orchestration: the passes run again, each candidate verified
    ("pipeline",),  # orchestration
    ("api", "bench", "tune"),  # the library's public functions, the bench command's library, --tune's timing
    ("batch",),  # many models, worker processes or Ray
    ("cli",),  # the command line
    ("__main__", "__init__"),  # the entry point and the package's lazy public names
)
__doc__ += "".join(f"\n{i}. {', '.join(names)}" for i, names in enumerate(LAYERS))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def _layer(module: str) -> int:
    parts = module.split(".")
    if parts[-1] == "__main__":  # an entry point (``python -m onnxfuse``, ``python -m onnxfuse.cli``) is the top
        return len(LAYERS) - 1
    top = parts[1] if len(parts) > 1 else "__init__"
    for index, names in enumerate(LAYERS):
        if top in names:
            return index
    raise AssertionError(f"{module} is in no layer: add its folder or module to tests/test_layers.py's LAYERS")


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> list[str]:
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    return [prefix] + [f"{prefix}.{a.name}" for a in node.names]


def import_graph() -> dict[str, set[str]]:
    """Module -> the onnxfuse modules it imports. ``from package import name`` is an edge to the submodule
    ``package.name`` when ``name`` is one, else to ``package`` (its ``__init__``)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                package, *submodules = _resolve(name, path.name == "__init__.py", node)
                targets = [sub if sub in modules else package for sub in submodules]
            else:
                continue
            edges.update(t for t in targets if t in modules and t != name)
        graph[name] = edges
    return graph


def test_imports_point_only_down():
    graph = import_graph()
    upward = sorted(
        f"{src} (layer {_layer(src)}) imports {dst} (layer {_layer(dst)})"
        for src, dsts in graph.items() for dst in dsts
        if _layer(dst) > _layer(src) and dst != "onnxfuse"
    )
    assert not upward, "imports that point up a layer:\n" + "\n".join(upward)


def import_cycles(graph: dict[str, set[str]]) -> list[str]:
    """Each cycle a depth-first walk of ``graph`` meets, as ``a -> b -> a``."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[str] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*stack[stack.index(nxt):], nxt]))
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    return cycles


def test_no_import_cycles():
    """No module imports itself through others (each import counts, lazy ones too: a cycle is a design that
    works only while every import in it stays inside a function)."""
    cycles = import_cycles(import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_cycle_checker_finds_cycles_and_follows_submodules(tmp_path, monkeypatch):
    """The checker itself, on a package written here: ``from pkg import name`` is an edge to the submodule
    ``pkg.name`` when there is one (so ``a`` importing ``b`` from the package is no cycle through ``pkg``), else
    to ``pkg``; a lazy import closes a cycle like any other."""
    package = tmp_path / "onnxfuse"
    (package / "report").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "report" / "__init__.py").write_text("from onnxfuse.report.a import A\n")
    (package / "report" / "a.py").write_text("from onnxfuse.report import b\nA = 1\n")
    (package / "report" / "b.py").write_text("def f():\n    from onnxfuse.report import c\n")
    (package / "report" / "c.py").write_text("from onnxfuse.report import A\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", package)
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    graph = import_graph()
    assert graph["onnxfuse.report.a"] == {"onnxfuse.report.b"}
    assert graph["onnxfuse.report.c"] == {"onnxfuse.report"}
    assert import_cycles(graph) == ["onnxfuse.report -> onnxfuse.report.a -> onnxfuse.report.b -> "
                                    "onnxfuse.report.c -> onnxfuse.report"]
    (package / "report" / "c.py").write_text("X = 1\n")
    assert import_cycles(import_graph()) == []


def test_every_module_has_a_layer():
    for module in import_graph():
        _layer(module)


def test_the_checker_sees_lazy_and_upward_imports(tmp_path):
    """The checker itself: an import inside a function body is an edge."""
    tree = ast.parse("def f():\n    from onnxfuse.cli import main\n")
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom))
    assert "onnxfuse.cli.main" in _resolve("onnxfuse.model.io", False, node)
    assert _layer("onnxfuse.cli.main") > _layer("onnxfuse.model.io")


def test_report_modules_keep_to_their_jobs():
    """Inside report/: the presentation (``present``) reads the report's dict only, so it imports neither the data
    module nor a renderer; the renderers import no data module (they read the dict through ``present``); no report
    module but the data module imports from onnxfuse.passes (the passes' records it reads)."""
    graph = import_graph()
    report = {m for m in graph if m.startswith("onnxfuse.report.")}
    renderers = {"onnxfuse.report.text", "onnxfuse.report.markdown", "onnxfuse.report.html"}
    assert renderers | {"onnxfuse.report.present", "onnxfuse.report.model", "onnxfuse.report.formats"} <= report
    assert not graph["onnxfuse.report.present"] & (renderers | {"onnxfuse.report.model", "onnxfuse.report.formats"})
    for renderer in renderers:
        assert "onnxfuse.report.model" not in graph[renderer], renderer
    importing_passes = {m for m in report if any(d.split(".")[:2] == ["onnxfuse", "passes"] for d in graph[m])}
    assert importing_passes <= {"onnxfuse.report.model"}, importing_passes
