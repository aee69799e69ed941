"""conv_hardswish: Conv -> HardSwish written out as elementwise ops => FusedConv(activation="HardSwish").

HardSwish(x) = x * Clip(x + 3, 0, 6) / 6. Numerics: original and optimized run in onnxruntime at
ORT_DISABLE_ALL (conftest.assert_same_outputs) with rtol=1e-4, atol=1e-5 (conftest.RTOL/ATOL).
"""

import numpy as np
import pytest

from onnxfuse.records import Reason
from tests.builders import GraphBuilder
from tests.conftest import ATOL, RTOL, assert_same_outputs, attr, fused_nodes, op_counts
from tests.conftest import assert_skipped as check_skipped

PASS = "conv_hardswish"
FORMS = ["hardsigmoid", "div_of_mul", "mul_by_sixth_of_mul", "mul_by_div", "mul_by_mul_sixth"]


def hardswish(form, swap=False, three=3.0, dtype=np.float32, opset=17, extra_reader=None, x=None, b=None):
    """x -> Conv(3 -> 4) -> written-out HardSwish; ``swap`` flips the operands of every Mul and of the Add. Returns
    (output name, builder, conv output name)."""
    b = b or GraphBuilder(dtype=dtype)
    x = x or b.input("x", [1, 3, 6, 6])
    conv = b.conv(x, 3, 4)

    def k(v):
        return b.const(np.asarray(v, dtype=b.dtype))

    def mul(p, q):
        return b.op("Mul", [q, p] if swap else [p, q])

    def relu6_plus3():
        shifted = b.op("Add", [k(three), conv] if swap else [conv, k(three)])
        if opset < 11:
            return b.op("Clip", [shifted], min=0.0, max=6.0)
        return b.op("Clip", [shifted, k(0.0), k(6.0)])

    if form == "hardsigmoid":  # Mul(x, HardSigmoid(x, alpha=1/6, beta=0.5))
        y = mul(conv, b.op("HardSigmoid", [conv], alpha=1 / 6, beta=0.5))
    elif form == "div_of_mul":  # Div(Mul(x, Clip(Add(x, 3), 0, 6)), 6)
        y = b.op("Div", [mul(conv, relu6_plus3()), k(6.0)])
    elif form == "mul_by_sixth_of_mul":  # Mul(Mul(x, Clip(...)), 1/6)
        y = mul(mul(conv, relu6_plus3()), k(1 / 6))
    elif form == "mul_by_div":  # Mul(x, Div(Clip(...), 6))
        y = mul(conv, b.op("Div", [relu6_plus3(), k(6.0)]))
    else:  # Mul(x, Mul(Clip(...), 1/6))
        y = mul(conv, mul(relu6_plus3(), k(1 / 6)))
    return y, b, conv


def build(form, outputs=(), opset=17, **kwargs):
    y, b, conv = hardswish(form, opset=opset, **kwargs)
    extra = [f(b, conv) for f in outputs]
    return b.build([y, *extra], opset=opset)


# --------------------------------------------------------------------------------------------------------------
# Positives


@pytest.mark.parametrize("swap", [False, True], ids=["x-first", "x-second"])
@pytest.mark.parametrize("form", FORMS)
def test_written_out_forms_fuse(fuse, form, swap):
    model = build(form, swap=swap)
    result = fuse(model)
    assert op_counts(result.model) == {"FusedConv": 1}
    (node,) = fused_nodes(result.model)
    assert attr(node, "activation") == b"HardSwish"
    assert attr(node, "activation_params") is None
    assert list(node.input) == ["x", "c1", "c2"]
    assert [f.pass_name for f in result.fusions] == [PASS]
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("opset", [10, 13])
def test_clip_bounds_from_attributes_and_inputs(fuse, opset):
    model = build("div_of_mul", opset=opset)
    result = fuse(model)
    assert op_counts(result.model) == {"FusedConv": 1}
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


def test_weights_in_constant_nodes(fuse):
    model = build("mul_by_div", b=GraphBuilder(constants="node"))
    result = fuse(model)
    assert op_counts(result.model) == {"Constant": 2, "FusedConv": 1}  # W and B; the pattern's constants go
    assert_same_outputs(model, result.model, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("form", ["div_of_mul", "hardsigmoid"])
def test_wrong_constant_is_not_matched(fuse, form):
    # Add(x, 2) is not HardSwish's x + 3; HardSigmoid's default alpha 0.2 is not 1/6.
    if form == "hardsigmoid":
        b = GraphBuilder()
        conv = b.conv(b.input("x", [1, 3, 6, 6]), 3, 4)
        model = b.build(b.op("Mul", [conv, b.op("HardSigmoid", [conv])]))
    else:
        model = build(form, three=2.0)
    result = fuse(model)
    assert op_counts(result.model) == op_counts(model)
    assert not result.fusions
    assert not [s for s in result.skips if s.pass_name == PASS]  # not a refusal: the pattern is absent


# --------------------------------------------------------------------------------------------------------------
# Skips: one per reason the pass gives


def assert_skipped(result, model, reason):
    return check_skipped(result, model, reason, PASS)


@pytest.mark.parametrize("form", FORMS)
def test_skip_intermediate_has_other_consumers(fuse, form):
    model = build(form, outputs=[lambda b, conv: b.op("Neg", [conv])])
    s = assert_skipped(fuse(model), model, Reason.NOT_PRIVATE)
    assert f"{model.graph.node[0].output[0]} has 3 consumers" in s.detail


def test_skip_intermediate_has_other_consumers_inner_tensor(fuse):
    # The Clip output is read outside the pattern too.
    y, b, _conv = hardswish("div_of_mul")
    (clip,) = [n for n in b.nodes if n.op_type == "Clip"]
    model = b.build([y, b.op("Neg", [clip.output[0]])])
    s = assert_skipped(fuse(model), model, Reason.NOT_PRIVATE)
    assert clip.output[0] in s.detail


def test_skip_intermediate_is_graph_output(fuse):
    model = build("mul_by_div", outputs=[lambda b, conv: conv])
    assert_skipped(fuse(model), model, Reason.GRAPH_OUTPUT)


def test_skip_target_allows_no_contrib_ops(fuse):
    model = build("div_of_mul")
    s = assert_skipped(fuse(model, target="onnx"), model, Reason.NO_CONTRIB_OPS)
    assert "onnx" in s.detail


@pytest.mark.parametrize("form", FORMS)
def test_skip_dtype_has_no_fusedconv_kernel(fuse, form):
    # float16 constants: 1/6 is stored as 0.16662598, still recognised as the written-out HardSwish
    model = build(form, dtype=np.float16)
    s = assert_skipped(fuse(model), model, Reason.DTYPE_NO_KERNEL)
    assert "float16" in s.detail


@pytest.mark.parametrize("target", ["cpu+cuda", "cuda"])
def test_skip_activation_not_supported_by_target(fuse, target):
    model = build("hardsigmoid")
    s = assert_skipped(fuse(model, target=target), model, Reason.ACTIVATION_UNSUPPORTED)
    assert "HardSwish" in s.detail and f"target {target}" in s.detail


def test_skip_slower_than_unfused_at_ort_level(fuse, monkeypatch):
    # The rule is data (providers.CPU_SLOWER_AT); here a made-up rule says FusedConv(HardSwish) loses at "all".
    import dataclasses

    from onnxfuse.ort import providers

    rules = {"FusedConv(HardSwish)": frozenset({"all"})}
    monkeypatch.setitem(providers.TARGETS, "cpu", dataclasses.replace(providers.TARGETS["cpu"], slower_at=rules))
    model = build("hardsigmoid")
    s = assert_skipped(fuse(model), model, Reason.SLOWER_AT_ORT_LEVEL)
    assert "FusedConv(HardSwish)" in s.detail and "level all" in s.detail
    assert op_counts(fuse(model, ort_level="extended").model) == {"FusedConv": 1}


def test_skip_quantized_conv(fuse):
    b = GraphBuilder()
    x = b.input("x", [1, 3, 6, 6])
    dq = b.dequantized(x)
    y, b, _ = hardswish("div_of_mul", b=b, x=dq)
    model = b.build(y)
    assert_skipped(fuse(model), model, Reason.QDQ)


def test_constant_of_higher_rank_is_not_the_pattern(fuse):
    # Div(Mul(x, Clip(x + 3)), 6) with 6 shaped [1, 1, 1, 1, 1]: the result is rank 5, which a FusedConv cannot
    # produce, so this is not a HardSwish of the conv output.
    b = GraphBuilder()
    x = b.input("x", [1, 3, 6, 6])
    conv = b.conv(x, 3, 4)
    k = lambda v, shape=(): b.const(np.full(shape, v, np.float32))  # noqa: E731
    clip = b.op("Clip", [b.op("Add", [conv, k(3.0)]), k(0.0), k(6.0)])
    model = b.build(b.op("Div", [b.op("Mul", [conv, clip]), k(6.0, (1, 1, 1, 1, 1))]))
    result = fuse(model)
    assert not [f for f in result.fusions if f.pass_name == "conv_hardswish"]
    assert_same_outputs(model, result.model, RTOL, ATOL)


def test_skip_form_needs_newer_onnxruntime(fuse):
    """A written-out HardSwish for an onnxruntime release that has no FusedConv(HardSwish) stays as it is."""
    model = build("div_of_mul")
    s = assert_skipped(fuse(model, ort_version="1.15.1"), model, Reason.NEEDS_NEWER_ORT)
    assert "FusedConv(HardSwish) needs onnxruntime" in s.detail and "the model is for 1.15" in s.detail


def test_skip_form_made_by_onnxruntime_itself(fuse, monkeypatch):
    """A written-out HardSwish that onnxruntime fuses itself at --ort-level (no fewer kernels with the fused form:
    counts set here, on any processor) stays written out, and the model keeps the oldest release."""
    from onnxfuse.ort import optimized_graph

    monkeypatch.setattr(optimized_graph, "kernels_at", lambda model, level: 5)
    model = build("div_of_mul")
    result = fuse(model, compare_with_onnxruntime=True)
    s = assert_skipped(result, model, Reason.MADE_BY_ORT_ITSELF)
    assert "portable form is kept" in s.detail
    assert {p.key: p.value for p in result.model.metadata_props}["onnxfuse.min_onnxruntime"] == "1.15"
    assert_same_outputs(model, result.model, RTOL, ATOL)
