"""conv_activation: Conv -> activation => com.microsoft::FusedConv(activation, activation_params).

The CPU kernel has no defaults: LeakyRelu needs [alpha], HardSigmoid [alpha, beta], Clip [min, max] written out.
Numerics: original and optimized run in onnxruntime at ORT_DISABLE_ALL (conftest.assert_same_outputs) with
rtol=1e-4, atol=1e-5 (conftest.RTOL/ATOL).
"""

import numpy as np
import onnx
import pytest

from onnxfuse.records import Reason
from tests.builders import GraphBuilder, compact_weight, skip_of, subgraph
from tests.conftest import ATOL, RTOL, assert_if_branches_match, assert_same_outputs, attr, fused_nodes, op_counts
from tests.conftest import assert_skipped as check_skipped

PASS = "conv_activation"
LOWEST, HIGHEST = float(np.finfo(np.float32).min), float(np.finfo(np.float32).max)


def conv_act(op, *bound_inputs, dtype=np.float32, bias=True, opset=17, constants="initializer", weight=None,
             **act_attrs):
    """x -> Conv(3 -> 4) -> op; ``bound_inputs`` are extra inputs of op: a float becomes a constant, a str is
    used as a tensor name ("" for a missing optional input)."""
    b = GraphBuilder(dtype=dtype, constants=constants)
    x = b.input("x", [1, 3, 6, 6])
    conv = b.conv(x, 3, 4, bias=bias, weight=weight(b) if weight else None)
    extra = [v if isinstance(v, str) else b.const(np.asarray(v, dtype=dtype)) for v in bound_inputs]
    return b.build(b.op(op, [conv, *extra], **act_attrs), opset=opset), b


def the_fused(model):
    (node,) = fused_nodes(model)
    return node


def check_fused(fuse, model, activation, params, target="cpu"):
    result = fuse(model, target=target)
    assert op_counts(result.model)["FusedConv"] == 1
    node = the_fused(result.model)
    assert node.domain == "com.microsoft"
    assert attr(node, "activation") == activation.encode()
    got = attr(node, "activation_params")
    assert (got is None) if params is None else got == pytest.approx(params, rel=1e-7)
    assert [f.pass_name for f in result.fusions] == [PASS]
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)
    return result


# --------------------------------------------------------------------------------------------------------------
# Positives: activations and their parameters


@pytest.mark.parametrize("op, attrs, params", [
    ("Relu", {}, None),
    ("Tanh", {}, None),
    ("Sigmoid", {}, None),
    ("LeakyRelu", {}, [0.01]),  # ONNX default written out
    ("LeakyRelu", {"alpha": 0.2}, [0.2]),
    ("HardSigmoid", {}, [0.2, 0.5]),  # ONNX defaults written out
    ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, [0.3, 0.4]),
], ids=["Relu", "Tanh", "Sigmoid", "LeakyRelu-default", "LeakyRelu-0.2", "HardSigmoid-default", "HardSigmoid-set"])
def test_activation_and_params(fuse, op, attrs, params):
    model, _ = conv_act(op, **attrs)
    result = check_fused(fuse, model, op, params)
    assert op_counts(result.model) == {"FusedConv": 1}
    assert list(the_fused(result.model).input) == ["x", "c1", "c2"]


def test_hardswish_op(fuse):
    model, _ = conv_act("HardSwish", opset=14)
    check_fused(fuse, model, "HardSwish", None)


@pytest.mark.parametrize("bounds, params", [
    ((-1.0, 1.0), [-1.0, 1.0]),
    (("", 6.0), [LOWEST, 6.0]),  # only max: min is float32 lowest
    ((-1.0,), [-1.0, HIGHEST]),
    ((), [LOWEST, HIGHEST]),
], ids=["min-max", "max-only", "min-only", "none"])
def test_clip_bounds_from_inputs(fuse, bounds, params):
    model, _ = conv_act("Clip", *bounds)
    check_fused(fuse, model, "Clip", params)


def test_clip_bounds_from_constant_nodes(fuse):
    model, _ = conv_act("Clip", -1.0, 1.0, constants="node")
    result = check_fused(fuse, model, "Clip", [-1.0, 1.0])
    assert op_counts(result.model) == {"Constant": 2, "FusedConv": 1}  # W and B stay; the bounds' nodes go


@pytest.mark.parametrize("opset", [7, 10])
@pytest.mark.parametrize("attrs, params", [
    ({"min": -1.0, "max": 1.0}, [-1.0, 1.0]),
    ({"max": 6.0}, [LOWEST, 6.0]),
], ids=["min-max", "max-only"])
def test_clip_bounds_from_attributes_before_opset_11(fuse, opset, attrs, params):
    model, _ = conv_act("Clip", opset=opset, **attrs)
    check_fused(fuse, model, "Clip", params)


def test_conv_without_bias(fuse):
    model, _ = conv_act("Relu", bias=False)
    result = check_fused(fuse, model, "Relu", None)
    assert list(the_fused(result.model).input) == ["x", "c1"]


def test_weight_computed_at_run_time_still_fuses(fuse):
    model, _ = conv_act("Relu", weight=lambda b: b.input("w", [4, 3, 3, 3]))
    check_fused(fuse, model, "Relu", None)


@pytest.mark.parametrize("rank", [1, 3])
def test_1d_and_3d_convs(fuse, rank):
    b = GraphBuilder()
    x = b.input("x", [1, 3] + [5] * rank)
    model = b.build(b.op("Relu", [b.conv(x, 3, 4, rank=rank)]))
    check_fused(fuse, model, "Relu", None)


def test_depthwise_conv_keeps_group(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 4, 6, 6])
    model = b.build(b.op("Relu", [b.conv(x, 4, 4, group=4)]))
    result = check_fused(fuse, model, "Relu", None)
    assert attr(the_fused(result.model), "group") == 4


@pytest.mark.parametrize("conv_attrs", [
    {"strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"dilations": [2, 2], "pads": [0, 1, 2, 1]},
    {"auto_pad": "SAME_UPPER", "strides": [2, 2]},
], ids=["strides", "dilations-asymmetric-pads", "auto_pad"])
def test_conv_attributes_are_kept(fuse, conv_attrs):
    b = GraphBuilder()
    x = b.input("x", [2, 3, 7, 7])
    model = b.build(b.op("Relu", [b.op("Conv", [x, b.const(b.rand(4, 3, 3, 3)), b.const(b.rand(4))],
                                       kernel_shape=[3, 3], **conv_attrs)]))
    result = check_fused(fuse, model, "Relu", None)
    node = the_fused(result.model)
    for name, value in conv_attrs.items():
        assert attr(node, name) == (value.encode() if isinstance(value, str) else value)
    assert attr(node, "kernel_shape") == [3, 3]


# --------------------------------------------------------------------------------------------------------------
# Targets and the com.microsoft import


@pytest.mark.parametrize("target", ["cpu+cuda", "cuda"])
def test_relu_fuses_for_cuda_targets(fuse, target):
    model, _ = conv_act("Relu")
    check_fused(fuse, model, "Relu", None, target=target)


@pytest.mark.parametrize("op", ["Tanh", "Sigmoid", "LeakyRelu", "Clip", "HardSigmoid", "HardSwish"])
def test_cpu_cuda_target_refuses_all_but_relu(fuse, op):
    model, _ = conv_act(op)
    result = fuse(model, target="cpu+cuda")
    s = skip_of(result, PASS)
    assert s.reason == Reason.ACTIVATION_UNSUPPORTED
    assert f"activation {op}" in s.detail and "cpu+cuda" in s.detail
    assert op_counts(result.model) == op_counts(model)


def test_com_microsoft_opset_1_imported_exactly_when_a_fused_conv_exists(fuse):
    model, _ = conv_act("Relu")
    assert [imp.domain for imp in model.opset_import] == [""]
    fused = fuse(model).model
    assert [(imp.domain, imp.version) for imp in fused.opset_import] == [("", 17), ("com.microsoft", 1)]
    onnx.checker.check_model(fused)
    # a fold without any FusedConv (target onnx): no com.microsoft import
    b = GraphBuilder()
    folded = b.build(b.op("Relu", [b.bn(b.conv(b.input("x", [1, 3, 6, 6]), 3, 4), 4)]))
    result = fuse(folded, target="onnx", only=("conv_batchnorm", PASS))
    assert result.fusions and [(imp.domain, imp.version) for imp in result.model.opset_import] == [("", 17)]


def test_onnx_target_emits_no_contrib_ops_but_folds(fuse):
    b = GraphBuilder()
    model = b.build(b.op("Relu", [b.op("Mul", [b.bn(b.conv(b.input("x", [1, 3, 6, 6]), 3, 4), 4),
                                                b.const(b.rand(4, 1, 1))])]))
    result = fuse(model, only=("conv_batchnorm", "conv_affine", PASS), target="onnx")
    assert op_counts(result.model) == {"Conv": 1, "Relu": 1}
    assert {n.domain for n in result.model.graph.node} == {""}
    assert skip_of(result, PASS).reason == Reason.NO_CONTRIB_OPS
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_fuses_after_a_fused_conv_already_in_the_model(fuse):
    # Regression: onnx shape inference stops at a com.microsoft::FusedConv, so a later conv's dtype was unknown
    # and a second run (here with a wider target) refused it as "an unknown dtype FusedConv has no kernel".
    b = GraphBuilder()
    y = b.op("Relu", [b.conv(b.input("x", [1, 3, 6, 6]), 3, 4)])
    model = b.build(b.op("Sigmoid", [b.conv(y, 4, 4)]))
    first = fuse(model, target="cpu+cuda").model
    assert op_counts(first) == {"FusedConv": 1, "Conv": 1, "Sigmoid": 1}
    result = fuse(first, target="cpu")
    assert op_counts(result.model) == {"FusedConv": 2}
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


# --------------------------------------------------------------------------------------------------------------
# Subgraphs


def test_conv_inside_if_branch_is_fused(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 3, 6, 6])
    cond = b.input("cond", [], dtype=np.bool_)
    branches = []
    for prefix, op in (("then_", "Relu"), ("else_", "Sigmoid")):
        sb = GraphBuilder(seed=len(prefix), prefix=prefix)
        sb.input("x", [1, 3, 6, 6])
        branches.append(subgraph(sb, sb.op(op, [sb.conv(x, 3, 4)])))
    model = b.build(b.op("If", [cond], then_branch=branches[0], else_branch=branches[1]))
    result = fuse(model)
    assert op_counts(result.model) == {"If": 1, "FusedConv": 2}
    (if_node,) = result.model.graph.node
    for branch, op in (("then_branch", b"Relu"), ("else_branch", b"Sigmoid")):
        (node,) = attr(if_node, branch).node
        assert (node.op_type, node.domain, attr(node, "activation")) == ("FusedConv", "com.microsoft", op)
    assert ("com.microsoft", 1) in [(imp.domain, imp.version) for imp in result.model.opset_import]
    assert_if_branches_match(model, result.model)


# --------------------------------------------------------------------------------------------------------------
# Skips: one per reason the pass gives


def assert_skipped(result, model, reason):
    return check_skipped(result, model, reason, PASS)


def test_skip_intermediate_has_other_consumers(fuse):
    # SiLU: x * Sigmoid(x) reads the conv output twice (with conv_unfused too, the report lists the whole SiLU
    # chain instead: tests/passes/test_conv_unfused.py)
    b = GraphBuilder()
    conv = b.conv(b.input("x", [1, 3, 6, 6]), 3, 4)
    model = b.build(b.op("Mul", [conv, b.op("Sigmoid", [conv])]))
    s = assert_skipped(fuse(model, only=("conv_activation",)), model, Reason.NOT_PRIVATE)
    assert "is SiLU, which FusedConv cannot express" in s.detail
    b = GraphBuilder()
    conv = b.conv(b.input("x", [1, 3, 6, 6]), 3, 4)
    model = b.build([b.op("Relu", [conv]), b.op("Neg", [conv])])
    s = assert_skipped(fuse(model), model, Reason.NOT_PRIVATE)
    assert f"{conv} has 2 consumers" in s.detail


def test_skip_intermediate_has_other_consumers_when_activation_is_in_a_subgraph(fuse):
    # Regression: a Conv in the main graph whose output only an If branch's Relu reads was fused across the
    # boundary: the FusedConv ended up in both graphs (onnx.checker: "not in SSA form").
    b = GraphBuilder()
    x = b.input("x", [1, 3, 6, 6])
    cond = b.input("cond", [], dtype=np.bool_)
    conv = b.conv(x, 3, 4)
    then_b = GraphBuilder(seed=1, prefix="then_")
    then_b.input(conv, [1, 4, 6, 6])
    else_b = GraphBuilder(seed=2, prefix="else_")  # does not read the conv output
    model = b.build(b.op("If", [cond], then_branch=subgraph(then_b, then_b.op("Relu", [conv])),
                         else_branch=subgraph(else_b, else_b.op("Identity", [else_b.const(else_b.rand(1, 4, 6, 6))]))))
    result = fuse(model)
    s = assert_skipped(result, model, Reason.NOT_PRIVATE)
    assert conv in s.detail
    onnx.checker.check_model(result.model)


def test_skip_intermediate_is_graph_output(fuse):
    model, b = conv_act("Relu")
    model = b.build([model.graph.output[0].name, model.graph.node[0].output[0]])
    s = assert_skipped(fuse(model), model, Reason.GRAPH_OUTPUT)
    assert "graph output" in s.detail


def test_skip_target_allows_no_contrib_ops(fuse):
    model, _ = conv_act("Relu")
    s = assert_skipped(fuse(model, target="onnx"), model, Reason.NO_CONTRIB_OPS)
    assert "target onnx" in s.detail


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_skip_dtype_has_no_fusedconv_kernel(fuse, dtype):
    model, _ = conv_act("Relu", dtype=dtype)
    s = assert_skipped(fuse(model), model, Reason.DTYPE_NO_KERNEL)
    assert np.dtype(dtype).name in s.detail and "target cpu" in s.detail


def test_skip_activation_not_supported_by_target(fuse):
    model, _ = conv_act("Sigmoid")
    s = assert_skipped(fuse(model, target="cpu+cuda"), model, Reason.ACTIVATION_UNSUPPORTED)
    assert "activation Sigmoid is not supported by target cpu+cuda" in s.detail


def test_skip_slower_than_unfused_at_ort_level(fuse, monkeypatch):
    # The rule is data (providers.CPU_SLOWER_AT); here a made-up rule says FusedConv(Tanh) loses at "basic".
    import dataclasses

    from onnxfuse.ort import providers

    rules = {"FusedConv(Tanh)": frozenset({"basic"})}
    monkeypatch.setitem(providers.TARGETS, "cpu", dataclasses.replace(providers.TARGETS["cpu"], slower_at=rules))
    model, _ = conv_act("Tanh")
    s = assert_skipped(fuse(model, ort_level="basic"), model, Reason.SLOWER_AT_ORT_LEVEL)
    assert "FusedConv(Tanh) runs slower than the unfused original in onnxruntime at level basic" in s.detail
    assert op_counts(fuse(model, ort_level="all").model) == {"FusedConv": 1}
    assert op_counts(fuse(model, ort_level=None).model) == {"FusedConv": 1}  # None: no speed rules


def test_skip_clip_bounds_not_constant(fuse):
    b = GraphBuilder()
    conv = b.conv(b.input("x", [1, 3, 6, 6]), 3, 4)
    model = b.build(b.op("Clip", [conv, "", b.input("hi", [])]))
    assert_skipped(fuse(model), model, Reason.CLIP_BOUNDS_NOT_CONSTANT)


def test_skip_quantized_conv_fed_by_dequantize(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 3, 6, 6])
    dq = b.dequantized(x)
    model = b.build(b.op("Relu", [b.conv(dq, 3, 4)]))
    assert_skipped(fuse(model), model, Reason.QDQ)


@pytest.mark.parametrize("form", ["dq_axis", "dq_tensor", "cast_mul"])
def test_weight_only_int8_conv_fuses(fuse, form):
    # A weight alone from DequantizeLinear (or int8 x scale) is no QDQ pattern: the compute stays float32.
    b = GraphBuilder()
    x = b.input("x", [1, 16, 8, 8])
    model = b.build(b.op("Relu", [b.conv(x, 16, 16, weight=compact_weight(b, 16, 16, form=form))]), opset=13)
    result = fuse(model)
    assert op_counts(result.model)["FusedConv"] == 1 and "Relu" not in op_counts(result.model)
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_skip_quantized_conv_feeding_quantize(fuse):
    b = GraphBuilder()
    scale, zero = b.const(np.float32(0.05)), b.const(np.uint8(128))
    y = b.op("Relu", [b.conv(b.input("x", [1, 3, 6, 6]), 3, 4)])
    model = b.build(b.op("QuantizeLinear", [y, scale, zero]), output_dtype=np.uint8)
    assert_skipped(fuse(model), model, Reason.QDQ)


def test_skip_form_needs_newer_onnxruntime(fuse):
    """FusedConv(HardSwish) does not load before onnxruntime 1.30 (providers.FORM_MIN_ORT, from
    benchmarks/probe_ort_releases.py): a model for an older release keeps the HardSwish op; Relu fuses on any."""
    from onnxfuse.ort.providers import FORM_MIN_ORT, release_text

    needed = release_text(FORM_MIN_ORT["FusedConv(HardSwish)"])
    model, _ = conv_act("HardSwish")
    s = assert_skipped(fuse(model, ort_version="1.20"), model, Reason.NEEDS_NEWER_ORT)
    assert f"FusedConv(HardSwish) needs onnxruntime {needed} or newer; the model is for 1.20" in s.detail
    assert op_counts(fuse(model, ort_version=needed).model) == {"FusedConv": 1}
    relu, _ = conv_act("Relu")
    assert op_counts(fuse(relu, ort_version="1.15").model) == {"FusedConv": 1}


def test_skip_form_made_by_onnxruntime_itself(fuse, monkeypatch):
    """Where onnxruntime's graph at --ort-level runs no fewer kernels with FusedConv(HardSwish) than without, the
    HardSwish op stays and the model keeps the oldest release (onnxfuse.passes.portable). The kernel counts are
    set here, so that the rule is tested on any processor (tests/test_portable.py asks onnxruntime itself)."""
    from onnxfuse.ort import optimized_graph

    monkeypatch.setattr(optimized_graph, "kernels_at", lambda model, level: 3)
    model, _ = conv_act("HardSwish")
    result = fuse(model, compare_with_onnxruntime=True)
    s = assert_skipped(result, model, Reason.MADE_BY_ORT_ITSELF)
    assert "FusedConv(HardSwish) would need onnxruntime 1.30" in s.detail and "level all" in s.detail
    assert {p.key: p.value for p in result.model.metadata_props}["onnxfuse.min_onnxruntime"] == "1.15"
