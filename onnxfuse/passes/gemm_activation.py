"""Fuse a Gemm and the activation after it into ``com.microsoft::FusedGemm`` (target ``cpu`` only).

Before => after::

    Gemm(A, B[, C], alpha, beta, transA, transB) -> act
        =>  FusedGemm(A, B[, C], alpha, beta, transA, transB, activation=act, activation_alpha=..., ...)

FusedGemm computes ``act(alpha * A' @ B' + beta * C)`` (onnxruntime ``contrib_ops/cpu/fused_gemm.cc``: the Gemm
kernel with an element-wise activation functor; schema in ``core/graph/contrib_ops/contrib_defs.cc``, domain
``com.microsoft`` version 1). The kernel reads the activation's parameters from the attributes named
``activation_`` + the ONNX attribute name and has no defaults, so the ONNX defaults are written explicitly
(``providers.FUSED_GEMM_ACTIVATIONS``): LeakyRelu alpha 0.01; HardSigmoid alpha 0.2, beta 0.5; Elu, Celu and
ThresholdedRelu alpha 1.0; Selu alpha 1.6732632, gamma 1.0507010; Relu, Tanh, Sigmoid, Softsign, Softplus none.
The kernel is registered for float32 only. B and C need not be constant.

Skipped when:
    intermediate-has-other-consumers   the Gemm output is read by another node too
    intermediate-is-graph-output       the Gemm output is a graph output
    target-allows-no-contrib-ops       target onnx
    activation-not-supported-by-target targets cpu+cuda and cuda (no CUDA FusedGemm kernel was checked), and
                                       Clip / HardSwish, which the CPU kernel does not have
    dtype-has-no-fusedgemm-kernel      the Gemm is not float32 (float16, float64)
    quantized-gemm                     the Gemm is part of a QuantizeLinear/DequantizeLinear pattern
    form-needs-newer-onnxruntime       the FusedGemm form does not load in the onnxruntime release given by
                                       --ort-version (``providers.FORM_MIN_ORT``; every probed release loads them all)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx_graphsurgeon as gs

from onnxfuse.ir import edit
from onnxfuse.model import domains
from onnxfuse.ort.providers import FUSED_GEMM_ACTIVATIONS, gemm_form_name, release_text
from onnxfuse.passes._checks import describe, is_op, private_check, replaced, skip
from onnxfuse.passes._gemm import gemm_qdq_check
from onnxfuse.passes.base import Context, Match, Pass
from onnxfuse.records import Fusion, Reason, RewriteKind, Skip

#: Activations matched: those some target can fuse, plus those worth naming when refused.
MATCHED = (*FUSED_GEMM_ACTIVATIONS, "Clip", "HardSwish")


@dataclass
class GemmActivationMatch(Match):
    """A Gemm -> activation pair: the FusedGemm ``activation`` and its ``activation_*`` attributes."""

    activation: str
    params: dict[str, float] = field(default_factory=dict)


class GemmActivation(Pass[GemmActivationMatch]):
    """Gemm -> activation => FusedGemm(activation)."""

    name = "gemm_activation"
    kind = RewriteKind.FUSE
    summary = "fuse Gemm + Relu/Tanh/Sigmoid/LeakyRelu/HardSigmoid/Elu/Selu/... into FusedGemm (target cpu)"
    reasons = (Reason.NOT_PRIVATE, Reason.GRAPH_OUTPUT, Reason.NO_CONTRIB_OPS, Reason.ACTIVATION_UNSUPPORTED,
               Reason.DTYPE_NO_FUSED_GEMM, Reason.QDQ_GEMM, Reason.NEEDS_NEWER_ORT)
    anchors = MATCHED

    def match(self, node: gs.Node, ctx: Context) -> GemmActivationMatch | Skip | None:
        if not is_op(node, *self.anchors):
            return None
        gemm = edit.producer(node.inputs[0])
        if not is_op(gemm, "Gemm"):
            return None
        nodes, out = [gemm, node], node.outputs[0]
        bad = (private_check([gemm.outputs[0]], [node], ctx, nodes, out) or gemm_qdq_check(gemm, out, nodes)
               or self._target_check(ctx, gemm, node.op, nodes, out))
        if bad:
            return bad
        params = {fused: float(node.attrs.get(onnx_name, default))
                  for onnx_name, fused, default in FUSED_GEMM_ACTIVATIONS[node.op]}
        return GemmActivationMatch(nodes, activation=node.op, params=params)

    @staticmethod
    def _target_check(ctx: Context, gemm: gs.Node, activation: str, nodes: list[gs.Node],
                      out: gs.Tensor) -> Skip | None:
        target = ctx.target
        if not target.fused_conv and not target.fused_gemm:
            return skip(Reason.NO_CONTRIB_OPS, f"target {target.name} emits standard ONNX only (no FusedGemm)",
                        nodes, out)
        if not target.fused_gemm:
            return skip(Reason.ACTIVATION_UNSUPPORTED, f"target {target.name} emits no FusedGemm (only the CPU "
                        "provider's kernel was checked; use --target cpu)", nodes, out)
        dtype = ctx.dtype(gemm.outputs[0]) or ctx.dtype(gemm.inputs[0]) or ctx.dtype(gemm.inputs[1])
        if dtype not in target.fused_gemm_dtypes:
            name = "an unknown dtype" if dtype is None else str(dtype)
            return skip(Reason.DTYPE_NO_FUSED_GEMM, f"{name} FusedGemm has no kernel on target {target.name}",
                        nodes, out)
        if activation not in target.fused_gemm:
            return skip(Reason.ACTIVATION_UNSUPPORTED, f"activation {activation} is not supported by FusedGemm on "
                        f"target {target.name}", nodes, out)
        needed = target.needs_newer(gemm_form_name(activation))
        if needed is not None and target.ort_version is not None:  # needs_newer is None without an ort_version
            return skip(Reason.NEEDS_NEWER_ORT, f"{gemm_form_name(activation)} needs onnxruntime "
                        f"{release_text(needed)} or newer; the model is for {release_text(target.ort_version)} "
                        "(see --ort-version)", nodes, out)
        return None

    def rewrite(self, match: GemmActivationMatch, ctx: Context) -> Fusion:
        gemm, act = match.nodes
        original = replaced(match.nodes)
        gemm.op, gemm.domain = "FusedGemm", domains.MS_DOMAIN
        gemm.attrs["activation"] = match.activation
        gemm.attrs.update(match.params)
        edit.replace_chain(ctx.edit_order, gemm, act, [act])
        return describe(self, gemm, original, match.activation)
