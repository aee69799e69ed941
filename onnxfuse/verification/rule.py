"""The rule of numerical verification: does a candidate model compute what the original does, in onnxruntime?

What is compared: the original and the candidate run in onnxruntime (CPU execution provider) with graph
optimizations disabled (``ORT_DISABLE_ALL``) on the same inputs (seeded random, or given: see
:mod:`onnxfuse.ort.sessions`), output by output. With onnxruntime's own fusions on, the original would be fused in
memory the same way as the candidate and a broken rewrite could compare equal.

The rule (default, "noise-floor"): for each floating-point output,

* ``deviation`` = max |candidate - original| over the finite elements;
* ``floor`` = max |original at ORT_ENABLE_ALL - original at ORT_DISABLE_ALL| on the same inputs: the float
  rounding noise that onnxruntime's own fusions (the same kind of reassociation as a fold) produce on this model;
* ``min_floor`` = MIN_FLOOR_ULPS x eps(dtype) x scale, where ``scale`` is max |original|: one unit in the last
  place of the output's largest value, so that a floor of 0 does not fail every correct reassociation before the
  rounding floor is measured;
* ``rounding_floor``, measured only when the deviation exceeds FLOOR_MULTIPLE x max(floor, min_floor) (where
  onnxruntime's optimizations changed fewer bits than onnxfuse's folds did; otherwise it costs nothing): max
  |original with the weights of every accumulating node moved by one unit in the last place, in a random
  direction - original|, both at ORT_DISABLE_ALL. A fold rounds each folded weight once (``W * s``), so this is
  the model's own sensitivity to exactly the rounding a correct fold makes;
* the output passes when ``deviation <= FLOOR_MULTIPLE x max(floor, rounding_floor, min_floor)`` (the
  *effective floor*) and its NaN/inf elements are at the same positions (same sign of inf) in both.

The same rule runs on each slice along a non-batch axis whose scale is far below the output's, with floors of its
own (:data:`SLICE_SCALE_GAP`), so that small values beside large ones are judged by their own noise.

Integer and bool outputs must be equal, unless onnxruntime's own optimizations (or the weights moved by one ulp)
change some of their elements too (integers from floats through a truncating Cast): then at most
FLOOR_MULTIPLE x as many elements may differ, each by at most what those runs change. ``rtol``/``atol``
(``--rtol``/``--atol``) replace the rule for every output by numpy.isclose's ``|candidate - original| <= atol +
rtol * |original|`` (a missing one is 0). An output with nothing compared (empty, NaN everywhere) is "not
compared", never passed. Every onnxruntime session and run shares one budget (``VerifyOptions.work`` CPU seconds;
when spent the result is ``skipped`` with ``cause`` ``work``) with a wall-clock safety stop
(``VerifyOptions.timeout``; ``cause`` ``time``).

Why max-abs against a measured floor: float32 noise of a correct fold is about 4e-7 of an output's scale on a
50-conv ResNet, while wrong rewrites (a dropped bias, one channel scaled by 1.05) move it by 5e-5 to 5e-3 of its
scale; elementwise relative error judges outputs near zero by noise and cries wolf. An error that a
fusion bug causes is local (one channel, one position), so the maximum, not an average, is what shows it.
"""

from __future__ import annotations

import math

import numpy as np

#: An output passes when its deviation is at most this many noise floors. Correct folds measured 0-1.0x
#: onnxruntime's own floor on the shared models, 1.7-2.2x on synthetic ResNets, 0.8-1.4x on 60 Conv/BN/HardSwish
#: blocks (docs/reference.md: "Verification"); tests/test_mutations.py requires every wrong rewrite beyond 20x to fail.
FLOOR_MULTIPLE = 10.0

#: Minimum floor in units of eps(dtype) x max |output|. Kept at or below most noise floors measured (onnxruntime's
#: own floor was 0.2-13 eps x scale on the shared models and synthetic ResNets, about 2000 on rapidocr's saturated
#: output, 130-480 on 60 Conv/BN/HardSwish blocks with outputs near 1000): a larger minimum would only loosen the
#: check, and where onnxruntime's floor is 0 or too small the rounding floor is measured instead.
MIN_FLOOR_ULPS = 1.0

#: Per-slice floors: besides the whole output, each slice along one non-batch axis (a channel of NCHW, a column
#: of [N, boxes, 85]) whose scale (max |original| in it) is at most 1/SLICE_SCALE_GAP of the output's is checked
#: against floors of its own, where the axis has at least 2 slices of at least MIN_GROUP_ELEMENTS elements. A
#: slice of small scores beside one of values near 1e5 is then judged by its own scale and noise, not by the 1e5
#: values'. A slice's floors: onnxruntime's noise floor, the rounding floor and the min floor measured
#: on that slice alone, and the output's effective floor scaled by slice scale / output scale (onnxruntime's noise
#: relative to the output's scale, applied to the slice's). Slices of a scale near the output's are left to the
#: whole-output check (their maximum over fewer elements only estimates the same noise less well); there the
#: whole-output check misses relative errors below FLOOR_MULTIPLE x SLICE_SCALE_GAP floors of the output's scale.
#: So are slices where onnxruntime's floor and the rounding floor were both measured as 0: a correct fold moved
#: rapidocr's saturated Sigmoid rows (0 in the original) by 3e-8 where neither calibration run moved them at all.
MIN_GROUP_ELEMENTS = 32
SLICE_SCALE_GAP = 16.0


def exact(dtype: np.dtype) -> bool:
    """True for integer and bool dtypes: outputs compared element by element, not against a float floor."""
    return not np.issubdtype(dtype, np.floating)


def deviation(ref: np.ndarray, got: np.ndarray) -> tuple[float, int, np.ndarray]:
    """(max |got - ref| over elements finite in both, count of NaN/inf mismatches, finite mask of ref)."""
    r, g = ref.astype(np.float64, copy=False), got.astype(np.float64, copy=False)
    fr, fg = np.isfinite(r), np.isfinite(g)
    both = fr & fg
    # a non-finite element must be matched by the same kind: NaN with NaN, +inf with +inf, -inf with -inf
    same_nonfinite = ~fr & ~fg & ((np.isnan(r) & np.isnan(g)) | (r == g))
    mismatches = int(np.count_nonzero(~both & ~same_nonfinite))
    dev = float(np.max(np.abs(r[both] - g[both]))) if both.any() else 0.0
    return dev, mismatches, fr


def scale_of(ref: np.ndarray) -> float:
    """max |ref| over its finite elements (0 when none is finite)."""
    r = ref.astype(np.float64, copy=False)
    finite = r[np.isfinite(r)]
    return float(np.max(np.abs(finite))) if finite.size else 0.0


def group_axes(shape: tuple[int, ...]) -> list[int]:
    """The non-batch axes with at least 2 slices of at least MIN_GROUP_ELEMENTS elements."""
    size = math.prod(shape)
    return [a for a in range(1, len(shape)) if shape[a] >= 2 and size // shape[a] >= MIN_GROUP_ELEMENTS]


def abs_diff(ref: np.ndarray, other: np.ndarray) -> np.ndarray:
    """|other - ref| in float64 where both are finite, 0 elsewhere."""
    r, o = ref.astype(np.float64, copy=False), other.astype(np.float64, copy=False)
    both = np.isfinite(r) & np.isfinite(o)
    return np.where(both, np.abs(np.where(both, o, 0.0) - np.where(both, r, 0.0)), 0.0)
