"""if_constant: If(cond = constant) => the nodes of the branch it takes, each If output an Identity of the branch
output (remove_redundant then removes it where the name can move).

Numerics: original and optimized run in onnxruntime at ORT_DISABLE_ALL (conftest.assert_same_outputs) with
rtol=1e-4, atol=1e-5 (conftest.RTOL/ATOL): the branch's Conv + BN is folded once it is in the main graph.
"""

import numpy as np
import onnx
import pytest

from onnxfuse.records import Reason
from tests.builders import GraphBuilder, subgraph
from tests.conftest import ATOL, RTOL, assert_same_outputs, op_counts
from tests.conftest import assert_skipped as check_skipped

PASS = "if_constant"


def if_model(cond_value=True, cond_as_input=False, **build):
    """x -> If(cond): then Conv+BN, else Neg(x) -> y (a graph output)."""
    b = GraphBuilder(seed=1)
    x = b.input("x", [1, 3, 6, 6])
    cond = b.const(np.array(cond_value))
    t = GraphBuilder(seed=2, prefix="then_")
    t.input(x, [1, 3, 6, 6])
    e = GraphBuilder(seed=3, prefix="else_")
    e.input(x, [1, 3, 6, 6])
    then_out = t.bn(t.conv(x, 3, 3), 3)
    y = b.op("If", [cond], then_branch=subgraph(t, then_out), else_branch=subgraph(e, e.op("Neg", [x])))
    return b.build(y, **build)


@pytest.mark.parametrize("cond", [True, False])
def test_if_with_a_constant_condition_becomes_its_branch(fuse, cond):
    model = if_model(cond)
    result = fuse(model, only=(PASS, "remove_redundant"))
    onnx.checker.check_model(result.model, full_check=True)
    assert op_counts(result.model) == ({"Conv": 1, "BatchNormalization": 1} if cond else {"Neg": 1})
    assert [o.name for o in result.model.graph.output] == [o.name for o in model.graph.output]
    assert result.fusions[0].pass_name == PASS
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_the_branch_then_takes_the_main_graph_folds(fuse):
    model = if_model(True)
    result = fuse(model, target="cpu", skip=())  # every pass
    assert op_counts(result.model) == {"Conv": 1}, op_counts(result.model)
    passes = [f.pass_name for f in result.fusions]
    assert PASS in passes and "conv_batchnorm" in passes
    onnx.checker.check_model(result.model, full_check=True)
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_skip_initializer_is_graph_input(fuse):
    model = if_model(True, ir_version=4, opset=11, initializers_as_inputs=True)
    s = check_skipped(fuse(model), model, Reason.INITIALIZER_IS_INPUT, PASS)
    assert "condition" in s.detail
