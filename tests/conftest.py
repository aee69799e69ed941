"""Shared fixtures and helpers: run onnxfuse on an in-memory model and compare it with the original in
onnxruntime at ORT_DISABLE_ALL (both sides), so that onnxruntime's own fusions cannot hide a broken rewrite."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnxfuse import pipeline
from onnxfuse.graph import proto_graphs
from onnxfuse.verification import session

REPO = Path(__file__).resolve().parents[1]

#: Tolerance for float32 comparisons in tests: folds reorder arithmetic, so outputs differ in the last bits.
RTOL, ATOL = 1e-4, 1e-5


def optimize(tmp_path: Path, model: onnx.ModelProto, target: str = "cpu", **options) -> pipeline.Result:
    """Save ``model`` under ``tmp_path`` and run the passes (no verification) with ``options``."""
    path = tmp_path / f"in_{len(list(tmp_path.iterdir()))}.onnx"
    onnx.save(model, str(path))
    return pipeline.analyse(path, pipeline.Options(target=target, **options))


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
