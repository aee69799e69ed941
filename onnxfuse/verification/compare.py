"""The comparison of one output over every input set: an ``Accumulator`` gathers deviations, scales and floors
(whole output and per slice, :mod:`onnxfuse.verification.rule`), and :func:`finish` turns it into an ``OutputDiff``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from onnxfuse.verification.options import VerifyOptions
from onnxfuse.verification.result import OutputDiff
from onnxfuse.verification.rule import MIN_FLOOR_ULPS, SLICE_SCALE_GAP, abs_diff, deviation, exact, group_axes, scale_of


@dataclass
class Accumulator:
    """Running comparison of one output over the input sets."""

    name: str
    dtype: np.dtype
    shape: list[int]
    max_abs: float = 0.0
    scale: float = 0.0
    floor: float | None = None
    rounding_floor: float | None = None
    nonfinite: int = 0
    shape_ok: bool = True
    needed_atol: float = 0.0
    elementwise_ok: bool = True
    compared: int = 0
    finite: int = 0  # elements of the original's output that are finite numbers (all, for integer/bool outputs)
    differing: int = 0  # integer/bool outputs: elements that differ
    floor_differing: int | None = None  # integer/bool outputs: most elements a floor run changed
    # per-group floors: axis -> {"dev", "scale", "floor", "rounding"}: arrays of one value per slice (None: not
    # measured); None until the first non-empty set; an axis whose length changes between sets is dropped
    groups: dict[int, dict[str, np.ndarray | None]] | None = None


class SliceTolerances(NamedTuple):
    """The slices along one axis (see :data:`onnxfuse.verification.rule.MIN_GROUP_ELEMENTS`), one float64 value
    per slice: its deviation, its scale (max |original|) and its tolerance (inf: not checked on its own)."""

    dev: np.ndarray
    scale: np.ndarray
    tolerance: np.ndarray


def update_groups(acc: Accumulator, key: str, values: np.ndarray) -> None:
    """Raise ``acc.groups[axis][key]`` to the per-slice maximum of ``values`` (float64, >= 0) along each axis."""
    if acc.groups is None:
        acc.groups = {a: {"dev": None, "scale": None, "floor": None, "rounding": None}
                      for a in group_axes(values.shape)}
    for axis in list(acc.groups):
        group = acc.groups[axis]
        known = next((v for v in group.values() if v is not None), None)
        if values.ndim <= axis or (known is not None and len(known) != values.shape[axis]):
            del acc.groups[axis]  # a symbolic axis whose size changed between input sets
            continue
        per_slice = np.max(np.moveaxis(values, axis, 0).reshape(values.shape[axis], -1), axis=1)
        previous = group[key]
        group[key] = per_slice if previous is None else np.maximum(previous, per_slice)


def accumulate(acc: Accumulator, ref: np.ndarray, got: np.ndarray, opts: VerifyOptions) -> None:
    """Add one input set's output of the original (``ref``) and of the candidate (``got``) to ``acc``."""
    acc.shape = list(ref.shape)
    if ref.shape != got.shape:
        acc.shape_ok = False
        return
    if ref.size == 0:
        return
    acc.compared += ref.size
    if exact(ref.dtype):
        acc.finite += ref.size
        acc.scale = max(acc.scale, scale_of(ref))
        diff = int(np.count_nonzero(ref != got))
        if diff:
            r, g = ref.astype(np.float64), got.astype(np.float64)
            acc.max_abs = max(acc.max_abs, float(np.max(np.abs(r - g))))
            acc.differing += diff
            if opts.explicit_tolerance:  # --atol/--rtol apply to integers too
                rtol, atol = opts.rtol or 0.0, opts.atol or 0.0
                acc.elementwise_ok = acc.elementwise_ok and bool(np.all(np.isclose(g, r, rtol=rtol, atol=atol)))
                acc.needed_atol = max(acc.needed_atol, float(np.max(np.abs(r - g) - rtol * np.abs(r))))
            else:
                acc.elementwise_ok = False
        return
    dev, mismatches, finite = deviation(ref, got)
    acc.finite += int(np.count_nonzero(finite))
    acc.max_abs, acc.nonfinite = max(acc.max_abs, dev), acc.nonfinite + mismatches
    acc.scale = max(acc.scale, scale_of(ref))
    if not opts.explicit_tolerance:
        update_groups(acc, "dev", abs_diff(ref, got))
        update_groups(acc, "scale", abs_diff(np.zeros_like(ref), ref))
    if opts.explicit_tolerance:
        rtol, atol = opts.rtol or 0.0, opts.atol or 0.0
        r, g = ref.astype(np.float64), got.astype(np.float64)
        ok = np.isclose(g, r, rtol=rtol, atol=atol, equal_nan=True)
        acc.elementwise_ok = acc.elementwise_ok and bool(np.all(ok))
        both = np.isfinite(r) & np.isfinite(g)
        if both.any():
            acc.needed_atol = max(acc.needed_atol, float(np.max(np.abs(r - g)[both] - rtol * np.abs(r[both]))))


def _min_floor(acc: Accumulator) -> float:
    """MIN_FLOOR_ULPS x eps(dtype) x the output's scale (see the rule in :mod:`onnxfuse.verification.rule`)."""
    return MIN_FLOOR_ULPS * float(np.finfo(acc.dtype).eps) * acc.scale


def group_tolerances(acc: Accumulator, opts: VerifyOptions, rounding: bool = True) -> dict[int, SliceTolerances]:
    """axis -> the deviation, scale and tolerance of each slice; the tolerance: floor_multiple x max(its floor,
    its rounding floor (when ``rounding``), MIN_FLOOR_ULPS x eps x its scale, the whole output's effective floor x
    its scale / the output's); inf for slices whose scale is above 1/SLICE_SCALE_GAP of the output's (see
    SLICE_SCALE_GAP)."""
    eps = float(np.finfo(acc.dtype).eps)
    whole = max(acc.floor or 0.0, (acc.rounding_floor or 0.0) if rounding else 0.0, _min_floor(acc))
    out: dict[int, SliceTolerances] = {}
    for axis, g in (acc.groups or {}).items():
        dev, scale = g["dev"], g["scale"]
        if dev is None or scale is None or not acc.scale:
            continue
        eff = np.maximum(MIN_FLOOR_ULPS * eps * scale, whole * scale / acc.scale)
        for key in ("floor", "rounding") if rounding else ("floor",):
            if (measured := g[key]) is not None:
                eff = np.maximum(eff, measured)
        # slices of a scale near the output's: the whole-output check judges them (inf: no slice check); so are
        # slices where both floors were measured and are 0: every run of the original computed the same bits
        # there (a saturated Sigmoid, a clamp), so they have no calibration of their own
        checked = scale * SLICE_SCALE_GAP <= acc.scale
        floor, rounding_floor = g["floor"], g["rounding"]
        if rounding and floor is not None and rounding_floor is not None:
            checked &= (floor > 0) | (rounding_floor > 0)
        out[axis] = SliceTolerances(dev, scale, np.where(checked, opts.floor_multiple * eff, np.inf))
    return out


def _groups_over(acc: Accumulator, opts: VerifyOptions, rounding: bool = True) -> bool:
    return any(bool(np.any(s.dev > s.tolerance)) for s in group_tolerances(acc, opts, rounding).values())


def over(acc: Accumulator, opts: VerifyOptions) -> bool:
    """An output whose deviation the measured floor and min_floor alone would fail (and nothing else): a float
    output over them as a whole or in one slice (:data:`MIN_GROUP_ELEMENTS`), an integer output that differs."""
    if not acc.shape_ok:
        return False
    if exact(acc.dtype):
        return acc.differing > 0
    return acc.nonfinite == 0 and (acc.max_abs > opts.floor_multiple * max(acc.floor or 0.0, _min_floor(acc))
                                   or _groups_over(acc, opts, rounding=False))


def _worst_group(acc: Accumulator, opts: VerifyOptions) -> dict[str, Any] | None:
    """The checked slice whose deviation is the largest share of its tolerance (see OutputDiff.worst_group);
    None when no slice is checked."""
    best: tuple[float, int, int, SliceTolerances] | None = None
    for axis, s in group_tolerances(acc, opts).items():
        tol = s.tolerance
        checked = np.isfinite(tol)
        if not checked.any():
            continue
        share = np.where(tol > 0, s.dev / np.where(tol > 0, tol, 1.0), np.where(s.dev > 0, np.inf, 0.0))
        share = np.where(checked, share, -1.0)
        i = int(np.argmax(share))
        if best is None or share[i] > best[0]:
            best = (float(share[i]), axis, i, s)
    if best is None:
        return None
    _, axis, i, s = best
    g = (acc.groups or {})[axis]
    eps = float(np.finfo(acc.dtype).eps)
    floor, rounding = (None if (v := g[key]) is None else float(v[i]) for key in ("floor", "rounding"))
    return {"axis": axis, "index": i, "max_abs_error": float(s.dev[i]), "scale": float(s.scale[i]),
            "floor": floor, "rounding_floor": rounding,
            "min_floor": MIN_FLOOR_ULPS * eps * float(s.scale[i]), "tolerance": float(s.tolerance[i])}


def finish(acc: Accumulator, opts: VerifyOptions) -> OutputDiff:
    """The ``OutputDiff`` of ``acc`` once every input set and floor run is in: its tolerance and verdict."""
    kind = str(acc.dtype)
    if not acc.shape_ok:
        return OutputDiff(acc.name, kind, acc.shape, math.inf, math.inf, acc.scale, acc.floor, acc.rounding_floor,
                          0.0, None, opts.rtol or 0.0, opts.atol or 0.0, math.inf, 0, False, acc.compared)
    # nothing compared (empty, or NaN/inf at the same places everywhere): no evidence, never "passed"
    compared = acc.compared if acc.finite or acc.nonfinite else 0
    rel = acc.max_abs / acc.scale if acc.scale else (0.0 if acc.max_abs == 0 else math.inf)
    if exact(acc.dtype):
        # calibrated like floats: as many elements as onnxruntime's own optimizations change, times
        # floor_multiple, each by at most what they change it by; equal when they change nothing
        if opts.explicit_tolerance:
            tolerance, passed = None, acc.elementwise_ok
        else:
            tolerance = acc.floor or 0.0
            passed = acc.differing == 0 or (acc.max_abs <= tolerance and acc.differing
                                            <= opts.floor_multiple * (acc.floor_differing or 0))
        return OutputDiff(acc.name, kind, acc.shape, acc.max_abs, rel, acc.scale, acc.floor, None, 0.0, tolerance,
                          opts.rtol or 0.0, opts.atol or 0.0, max(acc.needed_atol, 0.0) if opts.explicit_tolerance
                          else acc.max_abs, 0, passed and compared > 0, compared, acc.differing, acc.floor_differing)
    min_floor = _min_floor(acc)
    if opts.explicit_tolerance:
        passed = acc.elementwise_ok and acc.nonfinite == 0
        return OutputDiff(acc.name, kind, acc.shape, acc.max_abs, rel, acc.scale, acc.floor, acc.rounding_floor,
                          min_floor, None, opts.rtol or 0.0, opts.atol or 0.0, max(acc.needed_atol, 0.0),
                          acc.nonfinite, passed and compared > 0, compared)
    tolerance = opts.floor_multiple * max(acc.floor or 0.0, acc.rounding_floor or 0.0, min_floor)
    worst = _worst_group(acc, opts)
    passed = (acc.max_abs <= tolerance and acc.nonfinite == 0
              and (worst is None or worst["max_abs_error"] <= worst["tolerance"]))
    return OutputDiff(acc.name, kind, acc.shape, acc.max_abs, rel, acc.scale, acc.floor, acc.rounding_floor,
                      min_floor, tolerance, 0.0, tolerance, acc.max_abs, acc.nonfinite, passed and compared > 0,
                      compared, worst_group=worst)


def add_floor(acc: Accumulator, ref: np.ndarray, alt: np.ndarray, key: str) -> None:
    """Raise ``acc``'s floor ``key`` (``floor`` or ``rounding``) by how far ``alt`` (a floor run of the original)
    is from ``ref``: for the whole output, each slice, and for integer/bool outputs the elements changed (an
    integer output keeps both floors in ``floor``)."""
    if ref.shape != alt.shape or ref.size == 0:
        return
    if exact(acc.dtype):
        changed = int(np.count_nonzero(ref != alt))
        acc.floor_differing = max(acc.floor_differing or 0, changed)
        dev = float(np.max(np.abs(ref.astype(np.float64) - alt.astype(np.float64)))) if changed else 0.0
        acc.floor = max(acc.floor or 0.0, dev)
        return
    dev, _, _ = deviation(ref, alt)
    if key == "floor":
        acc.floor = max(acc.floor or 0.0, dev)
    else:
        acc.rounding_floor = max(acc.rounding_floor or 0.0, dev)
    if acc.groups:
        update_groups(acc, key, abs_diff(ref, alt))
