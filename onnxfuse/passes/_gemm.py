"""What the Gemm passes share: Gemm attributes, the weight layout, per-feature constants and the fold rewrite.

ONNX Operators.md, Gemm: ``Y = alpha * A' @ B' + beta * C`` with ``A' = A^T`` if ``transA`` else ``A`` ([M, K])
and ``B' = B^T`` if ``transB`` else ``B`` ([K, N]); C is unidirectionally broadcastable to Y's [M, N] (optional
since opset 11). Output feature n is column n of Y, so it is column n of B' (row n of B when ``transB``), and
input feature k is row k of B' (column k of B when ``transB``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from onnxfuse.ir import constants, edit
from onnxfuse.passes import _growth
from onnxfuse.passes._checks import is_op, private_check, skip
from onnxfuse.passes._fold import FOLDABLE_DTYPES, CompactScale, CompactWeight, compact_weight
from onnxfuse.passes.base import Context, Match
from onnxfuse.records import Reason, Skip


@dataclass(frozen=True)
class GemmAttrs:
    """The four Gemm attributes with their ONNX defaults (alpha 1.0, beta 1.0, transA 0, transB 0)."""

    alpha: float
    beta: float
    trans_a: bool
    trans_b: bool

    @staticmethod
    def of(node: gs.Node) -> GemmAttrs:
        """The attributes of Gemm ``node``."""
        a = node.attrs
        return GemmAttrs(float(a.get("alpha", 1.0)), float(a.get("beta", 1.0)), bool(a.get("transA", 0)),
                         bool(a.get("transB", 0)))


@dataclass
class GemmFoldMatch(Match):
    """A fold into a Gemm: its new B and C in float64 (None: keep that input) and the dtype to store them in;
    ``scale``: for a B computed from compact constants, how its output features are scaled (``b`` is then None).
    """

    b: np.ndarray | None
    c: np.ndarray | None
    dtype: np.dtype
    scale: CompactScale | None = None


def has_c(gemm: gs.Node) -> bool:
    """True when the Gemm has a C input (it is optional since opset 11; ``""`` means absent)."""
    return len(gemm.inputs) > 2 and bool(gemm.inputs[2].name)


def out_features(b: np.ndarray | CompactWeight, trans_b: bool) -> int:
    """N, the number of output features: B is [K, N], or [N, K] with ``transB``."""
    return int(b.shape[0] if trans_b else b.shape[1])


def in_features(b: np.ndarray | CompactWeight, trans_b: bool) -> int:
    """K, the number of input features: B is [K, N], or [N, K] with ``transB``."""
    return int(b.shape[1] if trans_b else b.shape[0])


def scale_out_features(b: np.ndarray, trans_b: bool, s: np.ndarray) -> np.ndarray:
    """B (float64) with output feature n multiplied by ``s[n]``: column n of B, or row n with ``transB``."""
    b64 = b.astype(np.float64)
    return b64 * s.reshape(-1, 1) if trans_b else b64 * s.reshape(1, -1)


def scale_in_features(b: np.ndarray, trans_b: bool, s: np.ndarray) -> np.ndarray:
    """B (float64) with input feature k multiplied by ``s[k]``: row k of B, or column k with ``transB``."""
    b64 = b.astype(np.float64)
    return b64 * s.reshape(1, -1) if trans_b else b64 * s.reshape(-1, 1)


def per_feature(c: np.ndarray, n: int) -> np.ndarray | None:
    """``c`` as a length-``n`` float64 vector if it broadcasts against a [M, n] tensor along the last axis only
    (shapes ``[]``, ``[1]``, ``[n]``, ``[1, 1]``, ``[1, n]``; ONNX numpy-style broadcasting, right-aligned),
    else None (a [M, 1] constant varies per row, a rank-3 one would raise the output's rank)."""
    if c.ndim > 2:
        return None
    aligned = (1,) * (2 - c.ndim) + tuple(c.shape)
    if aligned[0] != 1 or aligned[1] not in (1, n):
        return None
    return np.broadcast_to(c.astype(np.float64).reshape(aligned[1]), (n,)).copy()


def c_matrix(c: np.ndarray | None, n: int) -> np.ndarray:
    """C as a float64 [1, n] or [M, n] array (a missing C is 0), to which per-feature terms can be added."""
    if c is None:
        return np.zeros((1, n))
    c64 = c.astype(np.float64).reshape((1,) * (2 - c.ndim) + tuple(c.shape))
    return np.broadcast_to(c64, (len(c64), n)).copy()


def gemm_parts(gemm: gs.Node, ctx: Context, nodes: list[gs.Node], output: gs.Tensor, compact: bool = False):
    """``(B, C or None, None)`` as constant arrays for a fold into ``gemm``, or ``(None, None, Skip)``.

    With ``compact``, a B computed from compact constants (int8 x scale...) is returned as a
    ``_fold.CompactWeight`` (for folds that scale output features only: ``_fold.compact_scale_axis``).

    Skips: weights-not-constant (B or C computed at run time), initializer-is-graph-input, dtype-not-foldable (B
    is not float16/float32/float64), parameter-shape-mismatch (B is not 2-D, or C cannot broadcast to [M, N]:
    invalid models that onnx.checker without shape inference lets through).
    """
    b: np.ndarray | CompactWeight | None
    b, why = ctx.constant(gemm.inputs[1])
    if b is None and compact and why != Reason.INITIALIZER_IS_INPUT:
        b = compact_weight(gemm, ctx, min_rank=2)
    if b is None:
        reason = why if why == Reason.INITIALIZER_IS_INPUT else Reason.WEIGHTS_NOT_CONSTANT
        return None, None, skip(reason, f"Gemm weight {gemm.inputs[1].name} is not a constant", nodes, output)
    if b.dtype not in FOLDABLE_DTYPES:
        return None, None, skip(Reason.DTYPE_NOT_FOLDABLE, f"{b.dtype} weights cannot be folded", nodes, output)
    if b.ndim != 2:
        return None, None, skip(Reason.PARAM_SHAPE, f"Gemm weight has shape {list(b.shape)}, not 2-D", nodes,
                                output)
    c = None
    if has_c(gemm):
        c, why = ctx.constant(gemm.inputs[2])
        if c is None:
            reason = why if why == Reason.INITIALIZER_IS_INPUT else Reason.WEIGHTS_NOT_CONSTANT
            return None, None, skip(reason, f"Gemm input C {gemm.inputs[2].name} is not a constant", nodes,
                                    output)
        n = out_features(b, GemmAttrs.of(gemm).trans_b)
        if c.ndim > 2 or (c.ndim and c.shape[-1] not in (1, n)):
            return None, None, skip(Reason.PARAM_SHAPE, f"Gemm C has shape {list(c.shape)}, which does not "
                                    f"broadcast to [M, {n}]", nodes, output)
    return b, c, None


def gemm_fold_inputs(gemm: gs.Node, anchor: gs.Node, ctx: Context, nodes: list[gs.Node], output: gs.Tensor,
                     compact: bool = False):
    """What every fold after a Gemm checks first (the Gemm counterpart of ``_fold.fold_inputs``): the Gemm's
    output is read only by ``anchor`` and is no graph output, no QDQ, constant weights. Returns
    ``(B, C or None, None)`` or ``(None, None, Skip)`` (see :func:`gemm_parts`)."""
    bad = private_check([gemm.outputs[0]], [anchor], ctx, nodes, output) or gemm_qdq_check(gemm, output, nodes)
    if bad:
        return None, None, bad
    b, c, bad = gemm_parts(gemm, ctx, nodes, output, compact)
    # a compact B folds into its scale (small); an array gets a folded copy: the model's growth is bounded
    grows = bad or _growth.check(gemm, ctx, {1: b if isinstance(b, np.ndarray) else None, 2: c}, nodes, output)
    return (None, None, grows) if grows else (b, c, None)


def gemm_qdq_check(gemm: gs.Node, output: gs.Tensor, nodes: list[gs.Node]) -> Skip | None:
    """A ``quantized-gemm`` Skip for a Gemm or MatMul fed by DequantizeLinear or feeding QuantizeLinear:
    onnxruntime's QDQ fusions need to see it as it is (they turn it into QGemm or QLinearMatMul,
    ``core/optimizer/qdq_transformer``); None otherwise."""
    fed = any(is_op(edit.producer(t), "DequantizeLinear") for t in gemm.inputs if t.name)
    feeds = any(is_op(c, "QuantizeLinear") for c in edit.consumers(output))
    if fed or feeds:
        return skip(Reason.QDQ_GEMM, f"the {gemm.op} is part of a QuantizeLinear/DequantizeLinear pattern", nodes,
                    output)
    return None


def set_gemm_weights(gemm: gs.Node, ctx: Context, b: np.ndarray | None, c: np.ndarray | None,
                     dtype: np.dtype) -> None:
    """Give ``gemm`` fresh initializers for B and C (None leaves that input as it is); a new C already holds
    ``beta * C``, so beta becomes 1. A [1, N] C is stored as [N]. Never edits a tensor in place."""
    base = gemm.name or gemm.outputs[0].name
    _growth.spend(gemm, ctx, {1: b, 2: c})
    if b is not None:
        gemm.inputs[1] = constants.new_constant(ctx.namer, f"{base}.weight_folded", b.astype(dtype))
    if c is None:
        return
    c = np.asarray(c)
    if c.ndim == 2 and c.shape[0] == 1:
        c = c.reshape(-1)
    new_c = constants.new_constant(ctx.namer, f"{base}.bias_folded", c.astype(dtype))
    if len(gemm.inputs) > 2:
        gemm.inputs[2] = new_c
    else:
        gemm.inputs.append(new_c)
    gemm.attrs["beta"] = 1.0


def matmul_weight(mm: gs.Node, ctx: Context, nodes: list[gs.Node], output: gs.Tensor
                  ) -> tuple[np.ndarray | None, Skip | None]:
    """``(W, None)`` for a MatMul whose second input is a constant matrix of a foldable dtype (what ``matmul_add``
    and ``matmul_batchnorm`` fold into), else ``(None, skip)``: ``initializer-is-graph-input`` or
    ``weights-not-constant``, ``matmul-input-not-2d`` for a W that is not 2-D, ``dtype-not-foldable``."""
    w, why = ctx.constant(mm.inputs[1])
    if w is None:
        reason = why if why == Reason.INITIALIZER_IS_INPUT else Reason.WEIGHTS_NOT_CONSTANT
        return None, skip(reason, f"MatMul weight {mm.inputs[1].name} is not a constant", nodes, output)
    if w.ndim != 2:
        return None, skip(Reason.MATMUL_NOT_2D, f"MatMul weight {mm.inputs[1].name} is {w.ndim}-D, not a matrix",
                          nodes, output)
    if w.dtype not in FOLDABLE_DTYPES:
        return None, skip(Reason.DTYPE_NOT_FOLDABLE, f"{w.dtype} MatMul weights cannot be folded", nodes, output)
    return w, None
