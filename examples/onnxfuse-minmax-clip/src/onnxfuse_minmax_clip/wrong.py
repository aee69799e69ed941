"""A deliberately wrong variant of :class:`onnxfuse_minmax_clip.MinMaxClip`, to show that onnxfuse's verification
catches a wrong plugin: it forgets the upper bound (``Clip(x, lo, +inf)``). ``onnxfuse optimize --plugin
onnxfuse_minmax_clip.wrong:ForgetsUpperBound`` exits 1 and writes nothing whenever a value exceeds ``hi``.
Not registered as an entry point: never install it into a real environment's plugins."""

from __future__ import annotations

import numpy as np

from onnxfuse_minmax_clip import MinMaxClip, MinMaxClipMatch


class ForgetsUpperBound(MinMaxClip):
    """MinMaxClip whose Clip has no upper bound: wrong wherever x > hi."""

    name = "minmax_clip_wrong"
    summary = "WRONG on purpose: Min(Max(x, lo), hi) => Clip(x, lo, +inf)"

    def bounds(self, match: MinMaxClipMatch) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = super().bounds(match)
        return lo, np.array(np.inf, dtype=hi.dtype)
