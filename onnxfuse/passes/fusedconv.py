"""What the three FusedConv passes share: the target check and the rewrite into ``com.microsoft::FusedConv``.

FusedConv computes ``Y = activation(conv(X, W) + B + Z)`` (onnxruntime ``core/graph/contrib_ops/contrib_defs.cc``;
Z is added before the activation). The node keeps every Conv attribute and gains ``activation`` (string) and
``activation_params`` (floats, exactly as many as the kernel demands: see ``providers.ACTIVATION_PARAM_COUNTS``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeGuard

import numpy as np
import onnx_graphsurgeon as gs

from onnxfuse.ir import edit
from onnxfuse.model import domains
from onnxfuse.ort.providers import PROBED_ORT_RELEASES, form_min_release, form_name, release_text
from onnxfuse.passes._checks import is_op, skip
from onnxfuse.passes.base import Context, Match
from onnxfuse.records import Reason, Skip

#: ``numpy.finfo(float32)`` bounds: what onnxruntime's CPU kernel uses for a missing Clip bound.
FLOAT32_LOWEST = float(np.finfo(np.float32).min)
FLOAT32_MAX = float(np.finfo(np.float32).max)


@dataclass
class FusedConvMatch(Match):
    """A Conv chain that becomes one FusedConv.

    Attributes:
        activation: the FusedConv ``activation`` value (None: no activation, Conv + Z only).
        params: its ``activation_params`` (as many as ``providers.ACTIVATION_PARAM_COUNTS`` says).
        z: the residual tensor added before the activation (exactly the conv output's shape), or None.
    """

    activation: str | None
    params: list[float] = field(default_factory=list)
    z: gs.Tensor | None = None


def fusable_conv(node: gs.Node | None) -> TypeGuard[gs.Node]:
    """True for a 2-input or 3-input default-domain Conv, or a FusedConv that has no activation yet (so, for type
    checkers, not None)."""
    if is_op(node, "Conv"):
        return True
    return (node is not None and node.op == "FusedConv" and node.domain == domains.MS_DOMAIN
            and "activation" not in node.attrs)


def target_check(ctx: Context, conv: gs.Node, activation: str | None, nodes: list[gs.Node],
                 output: gs.Tensor, residual: bool = False) -> Skip | None:
    """Skip when ``ctx.target`` cannot run a FusedConv of ``conv``'s dtype with ``activation`` (None: no
    activation, only Z), when that form (with a Z input if ``residual``) does not load in the onnxruntime release the
    model is for (``providers.FORM_MIN_ORT``), or when it runs slower than the unfused original at the onnxruntime
    level the target is chosen for (``providers.CPU_SLOWER_AT``)."""
    target = ctx.target
    if not target.fused_conv:
        return skip(Reason.NO_CONTRIB_OPS, f"target {target.name} emits standard ONNX only (no FusedConv)",
                    nodes, output)
    # X, W and Y share one type T (ONNX Conv); W's is known even when shape inference stopped upstream (a
    # com.microsoft op in the input model, which onnx cannot infer through).
    dtype = ctx.dtype(conv.outputs[0]) or ctx.dtype(conv.inputs[0]) or ctx.dtype(conv.inputs[1])
    if dtype not in target.dtypes:
        name = "an unknown dtype" if dtype is None else str(dtype)
        return skip(Reason.DTYPE_NO_KERNEL, f"{name} FusedConv has no kernel on target {target.name}", nodes,
                    output)
    if activation is None and not target.plain_fused_conv:
        return skip(Reason.ACTIVATION_UNSUPPORTED,
                    f"FusedConv without an activation is not supported by target {target.name}", nodes, output)
    if activation is not None and activation not in target.activations:
        return skip(Reason.ACTIVATION_UNSUPPORTED,
                    f"activation {activation} is not supported by target {target.name}", nodes, output)
    form = form_name(activation, residual)
    needed = target.needs_newer(form)
    if needed is not None and target.ort_version is not None:  # needs_newer is None without an ort_version
        return skip(Reason.NEEDS_NEWER_ORT, f"{form} needs onnxruntime {release_text(needed)} or newer; the model "
                    f"is for {release_text(target.ort_version)} (see --ort-version)", nodes, output)
    if output.name in ctx.portable and form_min_release(form) > PROBED_ORT_RELEASES[0]:
        return skip(Reason.MADE_BY_ORT_ITSELF, f"{form} would need onnxruntime {release_text(form_min_release(form))} "
                    f"or newer, and onnxruntime at level {target.ort_level} runs no fewer kernels with it: the "
                    "portable form is kept", nodes, output)
    if target.slower(form):
        return skip(Reason.SLOWER_AT_ORT_LEVEL, f"{form} runs slower than the unfused original in onnxruntime at "
                    f"level {target.ort_level} (see --ort-level)", nodes, output)
    return None


def has_z(conv: gs.Node) -> bool:
    """True when ``conv`` is a FusedConv that already has a Z (residual) input."""
    return conv.op == "FusedConv" and len(conv.inputs) > 3 and bool(conv.inputs[3].name)


def to_fused_conv(ctx: Context, conv: gs.Node, activation: str | None, params: list[float],
                  z: gs.Tensor | None, last: gs.Node, removed: list[gs.Node]) -> None:
    """Turn ``conv`` into a FusedConv that takes over ``last``'s output, optionally with a Z input, and delete
    ``removed``."""
    if conv.op == "Conv":
        conv.op, conv.domain = "FusedConv", domains.MS_DOMAIN
    if activation is not None:
        conv.attrs["activation"] = activation
        if params:
            conv.attrs["activation_params"] = [float(p) for p in params]
    if z is not None:
        while len(conv.inputs) < 3:
            conv.inputs.append(gs.Variable.empty())
        conv.inputs.append(z)
    edit.replace_chain(ctx.edit_order, conv, last, removed)


def scalar(ctx: Context, tensor: gs.Tensor) -> float | None:
    """The value of a constant one-element tensor of shape ``[]`` or ``[1]``, else None (a ``[1, 1, 1, 1, 1]``
    constant would broadcast the result to a higher rank, which a fused node cannot do)."""
    value, _ = ctx.constant(tensor)
    if value is None or value.size != 1 or value.ndim > 1:
        return None
    return float(value.reshape(-1)[0])


def close(a: float | None, b: float) -> bool:
    """``a`` equals ``b`` to float32 precision (exporters write 1/6 as 0.16666667), or is ``b`` rounded to
    float16 (a float16 model's 1/6 is 0.16662598)."""
    if a is None:
        return False
    return abs(a - b) <= 1e-6 * max(1.0, abs(b)) or a == float(np.float16(b))


def clip_bounds(ctx: Context, clip: gs.Node) -> tuple[float, float] | None:
    """``(min, max)`` of a Clip node: from attributes before opset 11, from constant inputs since; a missing
    bound is float32 lowest / max. None when a bound is computed at run time."""
    lo, hi = clip.attrs.get("min", FLOAT32_LOWEST), clip.attrs.get("max", FLOAT32_MAX)
    for index in (1, 2):
        if len(clip.inputs) > index and clip.inputs[index].name:
            value = scalar(ctx, clip.inputs[index])
            if value is None:
                return None
            if index == 1:
                lo = value
            else:
                hi = value
    return float(lo), float(hi)
