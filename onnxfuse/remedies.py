"""What would let an unfused pattern be fused, per refusal reason: plain data that every report format reads
(the summary, the text and Markdown tables, the HTML page), without importing any pass."""

from __future__ import annotations

from onnxfuse.providers import TARGETS

#: What would let a pattern refused for each reason (``passes.Reason`` values) be fused. A reason missing here
#: is shown as "see the detail"; tests/test_report_html.py checks that every Reason has an entry.
REMEDIES: dict[str, str] = {
    "intermediate-has-other-consumers": "none: another node reads the intermediate tensor, so fusing would "
                                        "compute it twice",
    "intermediate-is-graph-output": "none while the intermediate tensor is a graph output (remove that output "
                                    "from the model to allow it)",
    "weights-not-constant": "export the weights as initializers or Constant nodes (e.g. with constant folding "
                            "on)",
    "parameters-not-constant": "export the parameters as initializers or Constant nodes (e.g. with constant "
                               "folding on)",
    "initializer-is-graph-input": "--constant-initializer-inputs (only if nobody feeds those inputs at run time)",
    "batchnorm-training-mode": "export the model in inference mode (BatchNormalization training_mode=0)",
    "parameter-shape-mismatch": "none: the parameter does not have one value per output channel",
    "constant-not-per-channel": "none: the constant varies along more than the channel axis",
    "conv-output-is-divisor": "none: the conv output is the divisor, which no fold can express",
    "zero-in-divisor": "none: the divisor holds a zero",
    "activation-not-supported-by-target": "a target whose FusedConv or FusedGemm accepts the activation",
    "target-allows-no-contrib-ops": "a target with FusedConv or FusedGemm (onnx emits standard ONNX ops only)",
    "dtype-has-no-fusedconv-kernel": "no target: onnxruntime has FusedConv kernels for float32 only",
    "dtype-not-foldable": "none: onnxfuse folds floating-point weights only",
    "clip-bounds-not-constant": "export Clip's min and max as constants",
    "residual-shape-mismatch": "none: FusedConv's Z input must have exactly the conv output's shape",
    "quantized-conv": "none: quantized convs are left to onnxruntime's QDQ fusions",
    "fold-not-finite": "none: the folded weights would overflow the dtype",
    "form-needs-newer-onnxruntime": "deploy on the onnxruntime release the detail names (or newer) and give it "
                                    "as --ort-version",
    "slower-than-unfused-at-ort-level": "--ort-level extended (or basic, disable) if your onnxruntime sessions run "
                                        "below ORT_ENABLE_ALL; at all, onnxruntime's NCHWc layout runs the "
                                        "unfused chain faster",
    "matmul-input-not-2d": "none: Gemm takes 2-D inputs only",
    "constant-not-per-feature": "none: the constant varies along more than the feature axis",
    "gemm-output-is-divisor": "none: the Gemm output is the divisor, which no fold can express",
    "gemm-input-transposed": "none: with transA=1 the BatchNormalization channels are Gemm's rows",
    "flatten-reorders-features": "none: the Flatten or Reshape before the Gemm does not keep one sample's "
                                 "features per row",
    "dtype-has-no-fusedgemm-kernel": "no target: onnxruntime has FusedGemm kernels for float32 only",
    "batchnorm-spatial-0": "none: BatchNormalization with spatial=0 has statistics per element, not per channel",
    "constant-not-folded": "let constant_fold fold the constant (do not --skip it); its own row says why it did "
                           "not",
    "op-has-no-fusedconv-form": "none: onnxruntime's FusedConv has no form for this op",
    "chain-broken-by-op": "none: no pass removes the op in between",
    "fold-grows-model": "none: the folded constant would grow the model past onnxfuse's limit",
    "fold-size-unknown": "none: the size of the folded constant cannot be known without computing it",
    "random-op": "none: the op draws new values on every run",
    "quantize-dequantize-node": "none: left for onnxruntime's QDQ fusions",
    "evaluation-failed": "none: onnxruntime could not evaluate the node",
    "dropout-training-mode": "export the model in inference mode (Dropout training_mode false)",
    "dropout-mask-used": "none while another node reads the Dropout mask",
    "pad-mode-not-constant": "none: only a constant-mode Pad folds into the Conv's pads",
    "pad-value-not-zero": "none: Conv pads with zeros",
    "pad-on-batch-or-channel": "none: Conv pads the spatial axes only",
    "negative-pads": "none: negative pads crop, which Conv's pads cannot",
    "pad-axes-invalid": "fix the model: the Pad's axes or pads do not fit its input (onnxruntime refuses it)",
    "conv-auto-pad-set": "export the Conv with explicit pads (auto_pad NOTSET)",
}

#: Ops that make a pattern a FusedGemm candidate rather than a FusedConv one.
_GEMM_OPS = frozenset({"Gemm", "MatMul"})


def remedy(row: dict, target: str) -> str:
    """What option or target would allow the unfused pattern ``row`` (an ``unfused`` entry of the JSON form) on
    ``target``. For ``activation-not-supported-by-target`` and ``target-allows-no-contrib-ops`` it names the
    other targets (``providers.TARGETS``) whose FusedConv, or FusedGemm for a Gemm/MatMul pattern, accepts one of
    the pattern's ops; "see the detail" for a reason without an entry in :data:`REMEDIES`."""
    reason = row.get("reason") or ""
    ops = {n["op"] for n in row.get("nodes", [])}
    kernel = "FusedGemm" if ops & _GEMM_OPS else "FusedConv"

    def accepted(t) -> frozenset[str]:
        if kernel == "FusedGemm":
            return t.fused_gemm
        return t.activations if t.fused_conv else frozenset()

    if reason in ("activation-not-supported-by-target", "target-allows-no-contrib-ops"):
        fits = [name for name, t in TARGETS.items() if name != target and accepted(t)
                and (reason == "target-allows-no-contrib-ops" or ops & accepted(t))]
        if fits:
            return " or ".join(f"--target {name}" for name in fits)
        return f"no target: onnxruntime's {kernel} has no such activation"
    return REMEDIES.get(reason, "see the detail")
