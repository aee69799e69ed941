"""Fuse Conv + residual Add (+ activation) into ``com.microsoft::FusedConv`` with a Z input.

Before => after::

    Conv(X, W[, B]) -> Add(conv, Z) -> act   =>  FusedConv(X, W, B, Z, activation=act)
    Conv(X, W[, B]) -> Add(conv, Z)          =>  FusedConv(X, W, B, Z)        (targets that allow no activation)

Z is a run-time tensor, or a constant of exactly the conv output's static shape (every dim a number; a
per-channel constant is conv_affine's fold, a broadcast constant is no Z).

FusedConv adds Z *before* the activation (``Y = act(conv + B + Z)``, onnxruntime contrib_defs.cc), which is
exactly Add-then-activation; Conv -> Relu -> Add is therefore never matched here. The kernel needs Z to have
exactly Y's shape (a broadcastable Z loads, then fails at run time), so the other Add input must have the conv
output's static shape, dim for dim (equal numbers or the same named symbolic dim), or a shape that the model's
symbolic shapes prove equal for every input size (:func:`proven_same_shape`: ``[1, C, height, width]`` for a
stride-1 "same" conv of an input ``[1, C_in, height, width]``). When the activation after the
Add is one the target cannot run, the Add alone is fused where the target allows a FusedConv without activation.

Skipped when:
    intermediate-has-other-consumers   the conv output is read by another node too
    intermediate-is-graph-output       the conv output is a graph output
    residual-shape-mismatch            Z's static shape is unknown or differs from the conv output's, and
                                       the symbolic shapes do not prove them equal (merge assumptions prove
                                       nothing)
    constant-not-folded                Z is computed from constants only (a per-channel bias left unfolded)
    target-allows-no-contrib-ops       target onnx
    dtype-has-no-fusedconv-kernel      the conv is not float32
    activation-not-supported-by-target the target has no such activation and no FusedConv without one
    quantized-conv                     the conv is part of a QDQ pattern
    slower-than-unfused-at-ort-level   the form (FusedConv with Z, with or without the activation) runs slower
                                       than the unfused original at the chosen onnxruntime level
                                       (``providers.CPU_SLOWER_AT``; FusedConv(Z) at ``all``). Not for a
                                       conv whose weight is computed at run time or is a graph input: the
                                       rule's cause, onnxruntime's NCHWc Conv, needs constant weights
                                       (``core/optimizer/nchwc_transformer.cc``), and onnxruntime then makes
                                       the same FusedConv with Z itself at ``all`` (seen in the graph it saves)
    form-needs-newer-onnxruntime       the form does not load in the onnxruntime release given by --ort-version
                                       (``providers.FORM_MIN_ORT``: FusedConv(HardSwish) needs 1.30)
"""

from __future__ import annotations

import re

import onnx_graphsurgeon as gs

from onnxfuse.ir import edit
from onnxfuse.passes._checks import computed_from_constants, describe, is_op, private_check, qdq_check, replaced, skip
from onnxfuse.passes.base import Context, Pass
from onnxfuse.passes.conv_activation import ACTIVATIONS, activation_params
from onnxfuse.passes.fusedconv import FusedConvMatch, target_check, to_fused_conv
from onnxfuse.records import Fusion, Reason, RewriteKind, Skip


def same_static_shape(a: tuple | None, b: tuple | None) -> bool:
    """True when both shapes are known and equal dim for dim (ints equal, or the same named symbolic dim)."""
    if a is None or b is None or len(a) != len(b):
        return False
    return all(x is not None and x != "" and x == y for x, y in zip(a, b, strict=False))


def _assumed_symbols(assumptions: list[str]) -> set[str]:
    """Names of the symbols in onnxruntime's merge assumptions (``"a == b"`` strings)."""
    return {name for text in assumptions for name in re.findall(r"[A-Za-z_]\w*", text)}


def proven_same_shape(y: gs.Tensor, z: gs.Tensor, ctx: Context) -> bool:
    """True when ``y`` and ``z`` have the same shape for every input size: the same rank, and each dim either
    equal in onnx shape inference (``ctx.shape``: equal numbers or the same named dim) or the same expression with
    input symbols in the model's symbolic shapes (``ctx.symbolic``: sympy expressions in the input dims).

    onnxruntime's symbolic inference *assumes* the two operands of an elementwise op equal where it cannot tell
    (``suggested_merge``: a stride-2 conv output ``floor((H - 1)/2) + 1`` added to a ``[.., H, ..]`` tensor is
    then written as ``H``, and a symbol merged with a number becomes that number); such a dim proves nothing. A
    symbolic dim counts only when it holds an input symbol and none of its symbols is named in an assumption
    (``SymbolicShapes.assumptions``); a number counts only where onnx inference knows it as well.
    """
    static_a, static_b = ctx.shape(y), ctx.shape(z)
    if static_a is None or static_b is None or len(static_a) != len(static_b):
        return False
    sym = ctx.own_symbolic()  # computed on this first need where the counts were made at the input shapes
    if sym is None:
        return False
    a, b = sym.shapes.get(y.name), sym.shapes.get(z.name)
    if a is None or b is None or len(a) != len(b) or len(a) != len(static_a):
        return False
    shaky = _assumed_symbols(sym.assumptions)
    for sa, sb, da, db in zip(static_a, static_b, a, b, strict=True):
        if sa is not None and sa != "" and sa == sb:
            continue
        if da is None or db is None or da != db:
            return False
        names = {str(s) for s in getattr(da, "free_symbols", ())}
        if not names or names & shaky:
            return False
    return True


def _full_static_shape(y: tuple | None, z: tuple | None) -> bool:
    """True when ``y`` and ``z`` are the same shape of numbers only (a constant Z cannot follow a symbolic dim)."""
    return y is not None and z is not None and all(type(d) is int for d in y) and tuple(y) == tuple(z)


def _dims(shape: tuple | None) -> str:
    return "unknown" if shape is None else "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def _target_check(ctx: Context, conv: gs.Node, activation: str | None, nodes: list[gs.Node], output: gs.Tensor
                  ) -> Skip | None:
    """``fusedconv.target_check`` for a form with Z, except its speed rule for a conv whose weight is not a
    constant (see the module docstring: no NCHWc Conv to lose against)."""
    bad = target_check(ctx, conv, activation, nodes, output, True)
    if bad is not None and bad.reason == Reason.SLOWER_AT_ORT_LEVEL and ctx.constant(conv.inputs[1])[0] is None:
        return None
    return bad


class ConvResidual(Pass[FusedConvMatch]):
    """Conv -> Add(run-time tensor) [-> activation] => FusedConv with Z."""

    name = "conv_residual"
    kind = RewriteKind.FUSE
    summary = "fuse Conv + residual Add (+ activation) into FusedConv with the Z input"
    reasons = (Reason.NOT_PRIVATE, Reason.GRAPH_OUTPUT, Reason.RESIDUAL_SHAPE, Reason.NO_CONTRIB_OPS,
               Reason.DTYPE_NO_KERNEL, Reason.ACTIVATION_UNSUPPORTED, Reason.QDQ, Reason.CONSTANT_NOT_FOLDED,
               Reason.SLOWER_AT_ORT_LEVEL, Reason.NEEDS_NEWER_ORT)
    anchors = ("Add",)

    def match(self, node: gs.Node, ctx: Context) -> FusedConvMatch | Skip | None:
        if not is_op(node, *self.anchors) or len(node.inputs) != 2:
            return None
        first_skip = None
        for side in (0, 1):
            conv, z = edit.producer(node.inputs[side]), node.inputs[1 - side]
            if not is_op(conv, "Conv") or z is conv.outputs[0]:
                continue
            if ctx.constant(z)[0] is not None or isinstance(z, gs.Constant):
                if not _full_static_shape(ctx.shape(conv.outputs[0]), ctx.shape(z)):
                    return None  # a per-channel (broadcast) constant: conv_affine's pattern
                # a constant of exactly the conv output's static shape: Z of FusedConv (conv_affine folds only
                # constants that vary along the channel axis)
            elif computed_from_constants(z, ctx):
                nodes = [conv, node]
                return skip(Reason.CONSTANT_NOT_FOLDED, f"{z.name} is computed from constants only but was not "
                            "folded (constant_fold skipped or refused it), so it is no constant conv_affine can "
                            "fold", nodes, node.outputs[0])
            result = self._match_side(conv, node, z, ctx)
            if isinstance(result, FusedConvMatch):
                return result
            first_skip = first_skip or result
        return first_skip

    def _match_side(self, conv: gs.Node, add: gs.Node, z: gs.Tensor, ctx: Context) -> FusedConvMatch | Skip:
        act = self._activation_after(add, ctx)
        nodes = [conv, add] + ([act] if act is not None else [])
        out = nodes[-1].outputs[0]
        bad = private_check([conv.outputs[0]], [add], ctx, nodes, out) or qdq_check(conv, out, nodes)
        if bad:
            return bad
        y_shape, z_shape = ctx.shape(conv.outputs[0]), ctx.shape(z)
        if not same_static_shape(y_shape, z_shape) and not proven_same_shape(conv.outputs[0], z, ctx):
            symbolic = any(isinstance(d, str) or d is None for d in (*(y_shape or ()), *(z_shape or ())))
            why = (" (symbolic dims that the model does not prove equal; the output must stay valid for every "
                   "input size, so --input-shape does not change this)" if symbolic else "")
            return skip(Reason.RESIDUAL_SHAPE, f"Z {z.name} shape {_dims(z_shape)} is not exactly the conv "
                        f"output shape {_dims(y_shape)}{why}", nodes, out)
        params = activation_params(ctx, act) if act is not None else []
        if act is not None and (params is None or _target_check(ctx, conv, act.op, nodes, out)):
            # The activation cannot be fused: fuse Conv + Add alone if the target allows a plain FusedConv.
            plain = _target_check(ctx, conv, None, nodes[:2], add.outputs[0])
            if plain:
                return _target_check(ctx, conv, act.op, nodes, out) or plain
            return FusedConvMatch(nodes[:2], None, [], z)
        bad = _target_check(ctx, conv, act.op if act is not None else None, nodes, out)
        if bad:
            return bad
        assert params is not None  # None only with an activation, which returned above
        return FusedConvMatch(nodes, act.op if act is not None else None, params, z)

    @staticmethod
    def _activation_after(add: gs.Node, ctx: Context) -> gs.Node | None:
        readers = edit.consumers(add.outputs[0])
        if len(readers) == 1 and is_op(readers[0], *ACTIVATIONS) and not edit.is_graph_output(add.outputs[0],
                                                                                           ctx.graph):
            return readers[0]
        return None

    def rewrite(self, match: FusedConvMatch, ctx: Context) -> Fusion:
        conv, last = match.nodes[0], match.nodes[-1]
        original = replaced(match.nodes)
        to_fused_conv(ctx, conv, match.activation, match.params, match.z, last, match.nodes[1:])
        return describe(self, conv, original, match.activation)
