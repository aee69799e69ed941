"""Give a nearest ``Resize`` with integer scales the ``asymmetric`` / ``floor`` coordinate mapping, which computes
the same output.

Before => after::

    Resize(X, scales=[s_0, ..., s_n-1] all integers, mode=nearest,
           coordinate_transformation_mode=half_pixel | pytorch_half_pixel | half_pixel_symmetric,
           nearest_mode=round_prefer_floor | round_prefer_ceil)
        =>  Resize(X, the same scales or sizes, mode=nearest, coordinate_transformation_mode=asymmetric,
                   nearest_mode=floor)

Proof (ONNX Operators.md, Resize-11/13/18/19: "x_original = (x_resized + 0.5) / scale - 0.5" for half_pixel,
"x_original = x_resized / scale" for asymmetric, then the nearest pixel by ``nearest_mode``). Take an axis with
integer scale s >= 1, input extent n, output extent n * s, and an output coordinate written as
``x_resized = q * s + r`` with 0 <= q < n and 0 <= r < s. Then

* half_pixel: ``x_original = q + (r + 1/2) / s - 1/2``. Since ``1/(2s) <= (r + 1/2)/s <= 1 - 1/(2s)``, the offset
  from q lies in ``[-1/2 + 1/(2s), 1/2 - 1/(2s)]``: strictly inside (q - 1/2, q + 1/2), so it is never a tie and
  round_prefer_floor and round_prefer_ceil both give q (and q is inside [0, n - 1], so no clamping happens);
* asymmetric: ``x_original = q + r / s`` with ``0 <= r / s < 1``, whose floor is q.

Both read input element q. pytorch_half_pixel is half_pixel except for an output extent of 1 (then 0), and an
extent of 1 with an integer scale means n = 1, s = 1, q = 0. half_pixel_symmetric (opset 19) shifts half_pixel by
``(n/2) * (1 - n*s / (s*n))``, which is 0 when the output extent is exactly n * s. ``tf_half_pixel_for_nn``
(``(x_resized + 1/2) / s``, no ``- 1/2``) rounds to q + 1 for r >= s/2 and ``align_corners`` scales by
(n - 1)/(n*s - 1): neither is the same map, and floor/ceil nearest modes after half_pixel are not either
(floor(q - 1/4) = q - 1), so those are refused. The index maths is independent of the element type.

Float32: onnxruntime computes the coordinates in float32 (``core/providers/cpu/tensor/upsamplebase.h``). The
margin from the nearest tie (half_pixel) or from q + 1 (asymmetric) is at least 1/(2s); the float32 rounding error
of the coordinate is below 3 * 2^-24 * (n*s + 1). Both stay apart while n * s * s < 2^21, which is checked where
the input extents are known (resize-extent-too-large); an image axis of 2 million output pixels is no model's.

With ``sizes`` instead of scales (sizes = n * s for an integer s on every axis, so the scale onnxruntime derives is
that integer), the same proof holds; this needs the input extents known.

Why: onnxruntime's NCHWc transformer (``core/optimizer/nchwc_transformer.cc``, at ORT_ENABLE_ALL) keeps a nearest
Resize in its blocked layout only with the asymmetric mapping; with half_pixel it reorders the data out of the
blocked layout and back in around the Resize.

Skipped when:
    resize-mode-not-nearest         mode is linear or cubic
    resize-coordinate-mode          coordinate_transformation_mode is tf_half_pixel_for_nn, align_corners,
                                    tf_crop_and_resize, or asymmetric with a nearest_mode other than floor
    resize-nearest-mode             nearest_mode is floor or ceil after a half_pixel mapping
    parameters-not-constant         scales or sizes are computed at run time
    initializer-is-graph-input      scales or sizes are initializers that are also graph inputs
    resize-scale-not-integer        a scale is not a whole number >= 1 (a downscale, 1.5)
    resize-sizes-not-multiple       sizes are not a whole multiple of the input extents, an input extent is not
                                    known, or keep_aspect_ratio_policy is not stretch
    resize-extent-too-large         a known output extent times its scale reaches 2^21 (float32 coordinates)
    slower-than-unfused-at-ort-level  the form is measured slower at the --ort-level (``providers.CPU_SLOWER_AT``,
                                    ``REWRITE_FORMS``; none is today)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from onnxfuse.ort.providers import REWRITE_FORMS
from onnxfuse.passes._checks import is_op, replaced, skip, speed_rule
from onnxfuse.passes.base import Context, Match, Pass
from onnxfuse.records import Fusion, Reason, RewriteKind, Skip

#: Coordinate mappings equal to asymmetric/floor for integer scales (module docstring).
HALF_PIXEL_MODES = ("half_pixel", "pytorch_half_pixel", "half_pixel_symmetric")
#: Rounding modes that give q on half_pixel's tie-free coordinates.
ROUND_MODES = ("round_prefer_floor", "round_prefer_ceil")
#: Output extent times scale below which float32 coordinates are exact enough (module docstring).
EXTENT_LIMIT = 2 ** 21


@dataclass
class ResizeMatch(Match):
    """``nodes`` = [Resize]; the rewrite only sets its two attributes."""


def _text(value, default: str) -> str:
    if value is None:
        return default
    return value.decode() if isinstance(value, bytes) else str(value)


def _input(node: gs.Node, index: int) -> gs.Tensor | None:
    return node.inputs[index] if len(node.inputs) > index and node.inputs[index].name else None


class ResizeNearest(Pass[ResizeMatch]):
    """Resize(nearest, half_pixel, round_prefer_floor, integer scales) => Resize(nearest, asymmetric, floor)."""

    name = "resize_nearest"
    kind = RewriteKind.CANONICALIZE
    summary = ("give a nearest Resize with integer scales the asymmetric/floor coordinate mapping (the same output), "
               "which onnxruntime's blocked layout keeps in place")
    reasons = (Reason.RESIZE_MODE, Reason.RESIZE_COORDINATES, Reason.RESIZE_NEAREST_MODE, Reason.PARAMS_NOT_CONSTANT,
               Reason.INITIALIZER_IS_INPUT, Reason.RESIZE_SCALE, Reason.RESIZE_SIZES, Reason.RESIZE_EXTENT,
               Reason.SLOWER_AT_ORT_LEVEL)
    anchors = ("Resize",)

    def match(self, node: gs.Node, ctx: Context) -> ResizeMatch | Skip | None:
        if not is_op(node, *self.anchors) or not node.outputs or ctx.opset < 11:
            return None  # Resize-10 has no coordinate_transformation_mode: it is asymmetric already
        nodes, out = [node], node.outputs[0]
        mode = _text(node.attrs.get("mode"), "nearest")
        coords = _text(node.attrs.get("coordinate_transformation_mode"), "half_pixel")
        rounding = _text(node.attrs.get("nearest_mode"), "round_prefer_floor")
        if mode != "nearest":
            return skip(Reason.RESIZE_MODE, f"{node.name} has mode {mode}", nodes, out)
        if coords == "asymmetric" and rounding == "floor":
            return None  # the form already
        if coords not in HALF_PIXEL_MODES:
            return skip(Reason.RESIZE_COORDINATES, f"{node.name} has coordinate_transformation_mode {coords} "
                        f"(nearest_mode {rounding})", nodes, out)
        if rounding not in ROUND_MODES:
            return skip(Reason.RESIZE_NEAREST_MODE, f"{node.name} has nearest_mode {rounding} after {coords}",
                        nodes, out)
        factors = self._factors(node, ctx)
        if isinstance(factors, tuple):
            return skip(*factors, nodes, out)
        shape = ctx.shape(node.inputs[0])
        if shape is not None:
            rank, axes = len(shape), node.attrs.get("axes")
            picked = [int(a) % rank for a in axes] if axes is not None and rank else list(range(rank))
            for a, s in zip(picked, factors, strict=False):
                n = shape[a]
                if isinstance(n, int) and n * s * s >= EXTENT_LIMIT:
                    return skip(Reason.RESIZE_EXTENT, f"output extent {n * s} times scale {s} reaches 2^21, where "
                                "float32 coordinates may round to the other pixel", nodes, out)
        return speed_rule(ResizeMatch(nodes), ctx, REWRITE_FORMS[self.name])

    @staticmethod
    def _factors(node: gs.Node, ctx: Context) -> list[int] | tuple[Reason, str]:
        """The integer scale of every resized axis (in ``axes`` order when the node has ``axes``), or
        ``(reason, detail)``."""
        scales_t, sizes_t = _input(node, 2), _input(node, 3)
        if scales_t is not None:
            scales, why = ctx.constant(scales_t)
            if scales is None:
                return why or Reason.PARAMS_NOT_CONSTANT, f"scales {scales_t.name} of {node.name} is not a constant"
            flat = np.asarray(scales, dtype=np.float64).reshape(-1)
            if flat.size:
                if not np.all(np.isfinite(flat)) or np.any(flat < 1) or np.any(flat != np.round(flat)):
                    return Reason.RESIZE_SCALE, f"scales of {node.name} are {flat.tolist()}"
                return [int(s) for s in flat]
        if sizes_t is None:
            return Reason.PARAMS_NOT_CONSTANT, f"{node.name} has neither scales nor sizes"
        sizes, why = ctx.constant(sizes_t)
        if sizes is None:
            return why or Reason.PARAMS_NOT_CONSTANT, f"sizes {sizes_t.name} of {node.name} is not a constant"
        policy = _text(node.attrs.get("keep_aspect_ratio_policy"), "stretch")
        if policy != "stretch":
            return Reason.RESIZE_SIZES, f"{node.name} has keep_aspect_ratio_policy {policy}"
        wanted = [int(v) for v in np.asarray(sizes).reshape(-1)]
        shape = ctx.shape(node.inputs[0])
        if shape is None:
            return Reason.RESIZE_SIZES, f"the rank of {node.inputs[0].name} is not known"
        axes = node.attrs.get("axes")
        rank = len(shape)
        picked = [int(a) + rank if int(a) < 0 else int(a) for a in axes] if axes is not None else list(range(rank))
        if len(picked) != len(wanted) or any(not 0 <= a < rank for a in picked):
            return Reason.RESIZE_SIZES, f"sizes {wanted} do not fit the {rank}-d input"
        factors = []
        for a, size in zip(picked, wanted, strict=True):
            n = shape[a]
            if not isinstance(n, int) or n <= 0:
                return Reason.RESIZE_SIZES, f"axis {a} of {node.inputs[0].name} has no known extent"
            if size < n or size % n:
                return Reason.RESIZE_SIZES, f"size {size} of axis {a} is no whole multiple of its extent {n}"
            factors.append(size // n)
        return factors

    def rewrite(self, match: ResizeMatch, ctx: Context) -> Fusion:
        (node,) = match.nodes
        original = replaced(match.nodes)
        node.attrs["coordinate_transformation_mode"] = "asymmetric"
        node.attrs["nearest_mode"] = "floor"
        return Fusion(self.name, node.name, node.op, original, None, node.outputs[0].name, self.kind)
