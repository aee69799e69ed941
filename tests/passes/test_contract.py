"""The pass contract: every pass declares the reasons it can give, and each reason has a test of its own."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from onnxfuse.passes import ALL_PASSES, CANONICALIZE, DEFAULT_PASSES
from onnxfuse.passes.base import Match, Pass
from onnxfuse.records import CANONICALIZE_NAMES, Reason, RewriteKind

HERE = Path(__file__).parent


def _test_names(pass_name: str) -> list[str]:
    tree = ast.parse((HERE / f"test_{pass_name}.py").read_text())
    return [n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]


@pytest.mark.parametrize("p", ALL_PASSES, ids=lambda p: p.name)
def test_every_declared_reason_has_a_named_test(p: Pass):
    assert p.reasons, f"{p.name} declares no reasons"
    assert all(isinstance(r, Reason) for r in p.reasons)
    names = _test_names(p.name)
    missing = [r.value for r in p.reasons if not any(r.value.replace("-", "_") in n for n in names)]
    assert not missing, f"tests/passes/test_{p.name}.py has no test named after {missing}"


@pytest.mark.parametrize("p", ALL_PASSES, ids=lambda p: p.name)
def test_pass_has_name_summary_and_a_docstring_with_skips(p: Pass):
    import inspect

    assert p.name and p.summary
    doc = inspect.getmodule(type(p)).__doc__
    assert "Before => after" in doc or "before => after" in doc.lower()
    for r in p.reasons:
        assert r.value in doc, f"{p.name}'s module docstring does not list {r.value} under 'Skipped when'"


def test_each_pass_declares_its_kind_and_the_canonicalize_stage_is_the_canonicalize_kind():
    # the driver stages passes by kind and the report tells canonicalizations apart by records.CANONICALIZE_NAMES
    # (it imports no pass): all three must name the same passes
    assert all(isinstance(p.kind, RewriteKind) for p in ALL_PASSES)
    assert [p for p in ALL_PASSES if p.kind is RewriteKind.CANONICALIZE] == list(CANONICALIZE)
    assert {p.name for p in CANONICALIZE} == CANONICALIZE_NAMES
    assert RewriteKind.CANONICALIZE not in {p.kind for p in DEFAULT_PASSES}


def test_reason_is_its_code_in_text_and_json():
    import json

    r = Reason.NOT_PRIVATE
    assert r == "intermediate-has-other-consumers"
    assert f"{r}" == str(r) == "intermediate-has-other-consumers"
    assert json.dumps({"reason": r}) == '{"reason": "intermediate-has-other-consumers"}'


def test_match_is_typed_per_pass():
    import typing

    for p in ALL_PASSES:
        (base,) = [b for b in type(p).__orig_bases__ if typing.get_origin(b) is Pass]
        (match_type,) = typing.get_args(base)
        assert issubclass(match_type, Match) and match_type is not Match, p.name


@pytest.mark.parametrize("p", [p for p in ALL_PASSES if p.anchors], ids=lambda p: p.name)
def test_match_returns_none_on_every_node_that_is_no_anchor(p: Pass):
    """The pipeline calls ``match`` only on nodes whose op is in ``anchors``; that is exact only when ``match``
    returns None on every other node, even one whose producers would complete a pattern."""
    import numpy as np
    import onnx_graphsurgeon as gs

    from onnxfuse.ir import constants
    from onnxfuse.ort.providers import get_target
    from onnxfuse.passes import Context

    ops = sorted({op for q in ALL_PASSES for op in q.anchors} | {"Relu", "Conv", "Gemm", "MatMul", "Reshape",
                                                                  "Flatten", "Pad", "Clip", "Sigmoid"})
    for op in ops:
        if op in p.anchors:
            continue
        x = gs.Variable("x", np.float32, (1, 4, 8, 8))
        w = gs.Constant("w", np.ones((4, 4, 1, 1), np.float32))
        y = gs.Variable("y", np.float32, (1, 4, 8, 8))
        conv = gs.Node("Conv", "conv", inputs=[x, w], outputs=[y])
        k = gs.Constant("k", np.ones((1, 4, 1, 1), np.float32))
        node = gs.Node(op, "n", inputs=[y, k], outputs=[gs.Variable("z", np.float32, (1, 4, 8, 8))])
        graph = gs.Graph(nodes=[conv, node], inputs=[x], outputs=node.outputs)
        ctx = Context(get_target("cpu"), frozenset(), {}, constants.Namer(graph), graph=graph)
        assert p.match(node, ctx) is None, (p.name, op)
