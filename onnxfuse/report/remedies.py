"""What would let an unfused pattern be fused, per refusal reason: plain data that every report format reads
(the summary, the text and Markdown tables, the HTML page), without importing any pass."""

from __future__ import annotations

from onnxfuse.ort.providers import TARGETS
from onnxfuse.records import Reason

#: reason code -> what would let a pattern refused for it be fused (``onnxfuse.records.Reason.remedy``, where each
#: reason is one row with its remedy).
REMEDIES: dict[str, str] = {r.value: r.remedy for r in Reason}

#: Ops that make a pattern a FusedGemm candidate rather than a FusedConv one.
_GEMM_OPS = frozenset({"Gemm", "MatMul"})
_CONV_OPS = frozenset({"Conv", "ConvTranspose"})


def remedy(row: dict, target: str) -> str:
    """What option or target would allow the unfused pattern ``row`` (an ``unfused`` entry of the JSON form) on
    ``target``. For ``activation-not-supported-by-target`` and ``target-allows-no-contrib-ops`` it names the
    other targets (``providers.TARGETS``) whose FusedConv, or FusedGemm for a Gemm/MatMul pattern, accepts one of
    the pattern's ops (or, for a Conv -> Add residual pattern, that emits a FusedConv without an activation);
    "see the detail" for a reason without an entry in :data:`REMEDIES`."""
    reason = row.get("reason") or ""
    ops = {n["op"] for n in row.get("nodes", [])}
    kernel = "FusedGemm" if ops & _GEMM_OPS else "FusedConv"

    def accepted(t) -> frozenset[str]:
        if kernel == "FusedGemm":
            return t.fused_gemm
        return t.activations if t.fused_conv else frozenset()

    def fuses(t) -> bool:
        if reason == "target-allows-no-contrib-ops":
            return bool(accepted(t))
        # a Conv -> Add (residual) pattern needs no activation where the target emits a FusedConv without one
        residual_only = kernel == "FusedConv" and t.fused_conv and t.plain_fused_conv and ops - _CONV_OPS == {"Add"}
        return bool(ops & accepted(t)) or residual_only

    if reason in ("activation-not-supported-by-target", "target-allows-no-contrib-ops"):
        fits = [name for name, t in TARGETS.items() if name != target and (accepted(t) or t.plain_fused_conv)
                and fuses(t)]
        if fits:
            return " or ".join(f"--target {name}" for name in fits)
        return f"no target: onnxruntime's {kernel} has no such activation"
    return REMEDIES.get(reason, "see the detail")
