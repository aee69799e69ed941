"""Shared fixtures and helpers for the test suite.

Models built in memory: run onnxfuse on them and compare with the original in onnxruntime at ORT_DISABLE_ALL
(both sides), so that onnxruntime's own fusions cannot hide a broken rewrite (``fuse``, ``assert_same_outputs``).

Real models made by other people (``../shared/models`` beside the clone, or the folder in ``ONNXFUSE_MODELS_DIR``)
are not in the repository, so a fresh clone has none. A test that needs them either takes the ``shared_models``
fixture (the folder, as a Path) or carries the ``requires_shared_models`` marker (a whole module:
``pytestmark = pytest.mark.requires_shared_models``) and gets each file with ``shared_model("name")``. When the
folder is missing these tests skip before they start, all under one summary line that names the folder and
``ONNXFUSE_MODELS_DIR``; when ``ONNXFUSE_MODELS_DIR`` or ``CI`` is set (``.ci/run`` sets both in CI) they are
required, and a missing folder or file fails them instead.
"""

from __future__ import annotations

import collections
import os
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnxfuse import pipeline
from onnxfuse.model.proto import proto_graphs
from onnxfuse.ort.sessions import session

REPO = Path(__file__).resolve().parents[1]

#: Real models made by other people: ``$ONNXFUSE_MODELS_DIR``, else ``../shared/models`` beside the clone.
MODELS_DIR = Path(os.environ.get("ONNXFUSE_MODELS_DIR") or REPO.parent / "shared" / "models")


def shared_models_required() -> bool:
    """True when the real models must be present: ``ONNXFUSE_MODELS_DIR`` is set, or ``CI`` is set (to anything
    but empty, ``0`` or ``false``)."""
    ci = os.environ.get("CI", "").strip().lower()
    return bool(os.environ.get("ONNXFUSE_MODELS_DIR")) or ci not in ("", "0", "false")


def _shared_models_folder() -> Path:
    """``MODELS_DIR`` when it holds .onnx files; otherwise skip the calling test (fail it when required)."""
    if MODELS_DIR.is_dir() and any(MODELS_DIR.glob("*.onnx")):
        return MODELS_DIR
    if shared_models_required():
        pytest.fail(f"the real models folder {MODELS_DIR} is missing or has no .onnx file, and ONNXFUSE_MODELS_DIR "
                    f"or CI is set, so the tests that need it are required", pytrace=False)
    pytest.skip(f"no real models folder {MODELS_DIR}: put the shared models in ../shared/models beside the clone or "
                f"set ONNXFUSE_MODELS_DIR (with it, or CI, set these tests are required)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "requires_shared_models: the test reads real models from MODELS_DIR "
                                       "(../shared/models or ONNXFUSE_MODELS_DIR); see tests/conftest.py")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip (or fail, when required) a test that needs the real models before its fixtures run. Raised here rather
    than in the fixture so that pytest reports every such skip at one location, as one summary line."""
    if "shared_models" in getattr(item, "fixturenames", ()) or item.get_closest_marker("requires_shared_models"):
        _shared_models_folder()


@pytest.fixture(scope="session")
def shared_models() -> Path:
    """The folder of real models (``MODELS_DIR``). Skips the test when it is missing, fails it when
    ``ONNXFUSE_MODELS_DIR`` or ``CI`` is set."""
    return _shared_models_folder()


def shared_model(name: str) -> Path:
    """Path of ``MODELS_DIR/<name>.onnx`` (``name`` without the extension). Skips the test when the folder is
    missing (fails it when ``ONNXFUSE_MODELS_DIR`` or ``CI`` is set); fails it when the folder is there but this
    file is not."""
    path = _shared_models_folder() / f"{name}.onnx"
    if not path.is_file():
        pytest.fail(f"real model {path} is missing from {MODELS_DIR}", pytrace=False)
    return path


#: Tolerance for float32 comparisons in tests: folds reorder arithmetic, so outputs differ in the last bits.
RTOL, ATOL = 1e-4, 1e-5


def optimize(tmp_path: Path, model: onnx.ModelProto, target: str = "cpu", **options) -> pipeline.Result:
    """Save ``model`` under ``tmp_path`` and run the passes (no verification, no comparison with onnxruntime's own
    graph unless ``compare_with_onnxruntime=True``) with ``options``."""
    path = tmp_path / f"in_{len(list(tmp_path.iterdir()))}.onnx"
    onnx.save(model, str(path))
    options.setdefault("compare_with_onnxruntime", False)
    return pipeline.analyse(path, pipeline.Options(target=target, **options))


def slower_at(monkeypatch, pass_name: str, *levels: str) -> str:
    """Give every target a speed rule (``providers.CPU_SLOWER_AT``'s kind) that ``pass_name``'s form
    (``providers.REWRITE_FORMS``) runs slower at ``levels``, as a measurement would; returns the form."""
    from dataclasses import replace

    from onnxfuse.ort import providers

    form = providers.REWRITE_FORMS[pass_name]
    for name, target in providers.TARGETS.items():
        rules = {**target.slower_at, form: frozenset(levels)}
        monkeypatch.setitem(providers.TARGETS, name, replace(target, slower_at=rules))
    return form


def analyse_unchecked(model: onnx.ModelProto, target: str = "cpu", **options) -> pipeline.Result:
    """Run the passes on ``model`` (no verification) without the checks of ``model_io.load_model``: for a pass's
    defence against an input that onnx.checker (full_check) or onnxruntime refuses, which no file reaches the
    passes with."""
    from onnxfuse.model import io as model_io

    loaded = model_io.LoadedModel(model, None, "", 0, False)
    return pipeline.analyse(None, pipeline.Options(target=target, **options), loaded)


def op_counts(model: onnx.ModelProto) -> collections.Counter:
    """Op type counts over every graph of ``model``, subgraph bodies included."""
    return collections.Counter(n.op_type for graph, _ in proto_graphs(model.graph) for n in graph.node)


def fused_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Every FusedConv node of the main graph."""
    return [n for n in model.graph.node if n.op_type == "FusedConv"]


def attr(node: onnx.NodeProto, name: str):
    """Python value of attribute ``name`` of ``node`` (None when absent)."""
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return None


def run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    """Outputs of ``model`` in onnxruntime (CPU, ORT_DISABLE_ALL)."""
    return session(model.SerializeToString()).run(None, feeds)


def random_feeds(model: onnx.ModelProto, seed: int = 0) -> dict:
    """Seeded random inputs for every (non-initializer) graph input with static dims."""
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        shape = [d.dim_value for d in tt.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        feeds[vi.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def assert_same_outputs(original: onnx.ModelProto, optimized: onnx.ModelProto, rtol: float = RTOL,
                        atol: float = ATOL, seeds=(0, 1)) -> None:
    """Both models give the same outputs within rtol/atol on seeded random inputs (ORT_DISABLE_ALL)."""
    for seed in seeds:
        feeds = random_feeds(original, seed)
        for ref, got in zip(run(original, feeds), run(optimized, feeds), strict=False):
            np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol)


@pytest.fixture
def fuse(tmp_path):
    """``fuse(model, target="cpu", **options) -> pipeline.Result`` for a model built in the test."""
    return lambda model, target="cpu", **options: optimize(tmp_path, model, target, **options)


def assert_skipped(result: pipeline.Result, model: onnx.ModelProto, reason: str, pass_name: str):
    """Pass ``pass_name`` reported exactly one Skip, with ``reason``, and the model was left as it was in op
    counts with no fusion. Returns the Skip (to check its detail)."""
    from tests.builders import skip_of

    s = skip_of(result, pass_name)
    assert s.reason == reason
    assert op_counts(result.model) == op_counts(model)
    assert not result.fusions
    return s


def assert_if_branches_match(original: onnx.ModelProto, optimized: onnx.ModelProto, x_shape=(1, 3, 6, 6)) -> None:
    """For a model with inputs ``x`` and a bool ``cond`` that picks an If branch: both branches give the same
    outputs before and after (onnxruntime at ORT_DISABLE_ALL, rtol RTOL, atol ATOL)."""
    for flag in (True, False):
        feeds = {"x": np.random.default_rng(0).standard_normal(x_shape).astype(np.float32), "cond": np.array(flag)}
        np.testing.assert_allclose(run(optimized, feeds)[0], run(original, feeds)[0], rtol=RTOL, atol=ATOL)
