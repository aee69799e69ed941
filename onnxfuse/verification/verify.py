"""Numerical verification: does a candidate model compute what the original does, in onnxruntime?

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
own (:data:`SLICE_SCALE_GAP`), so that small values beside large ones are judged by their own noise (issue 20).

Integer and bool outputs must be equal, unless onnxruntime's own optimizations (or the weights moved by one ulp)
change some of their elements too (integers from floats through a truncating Cast, issue 26): then at most
FLOOR_MULTIPLE x as many elements may differ, each by at most what those runs change. ``rtol``/``atol``
(``--rtol``/``--atol``) replace the rule for every output by numpy.isclose's ``|candidate - original| <= atol +
rtol * |original|`` (a missing one is 0). An output with nothing compared (empty, NaN everywhere) is "not
compared", never passed. Every onnxruntime run shares one time budget (``VerifyOptions.timeout``); when it runs
out the result is ``skipped`` with ``cause`` ``time``.

Why max-abs against a measured floor: float32 noise of a correct fold is about 4e-7 of an output's scale on a
50-conv ResNet, while wrong rewrites (a dropped bias, one channel scaled by 1.05) move it by 5e-5 to 5e-3 of its
scale (issue 11); elementwise relative error judges outputs near zero by noise and cries wolf. An error that a
fusion bug causes is local (one channel, one position), so the maximum, not an average, is what shows it.
"""

from __future__ import annotations

import contextvars
import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from onnxfuse.errors import InputError
from onnxfuse.ort import sessions as runtime

#: An output passes when its deviation is at most this many noise floors. Correct folds measured 0-1.0x
#: onnxruntime's own floor on the shared models, 1.7-2.2x on synthetic ResNets, 0.8-1.4x on 60 Conv/BN/HardSwish
#: blocks (docs/reference.md: "Verification"); tests/test_mutations.py requires every wrong rewrite beyond 20x to fail.
FLOOR_MULTIPLE = 10.0

#: Minimum floor in units of eps(dtype) x max |output|. Kept at or below most noise floors measured (onnxruntime's
#: own floor was 0.2-13 eps x scale on the shared models and synthetic ResNets, about 2000 on rapidocr's saturated
#: output, 130-480 on 60 Conv/BN/HardSwish blocks with outputs near 1000): a larger minimum would only loosen the
#: check, and where onnxruntime's floor is 0 or too small the rounding floor is measured instead.
MIN_FLOOR_ULPS = 1.0

#: Nodes that sum many products: their weights are what a fold rounds (see ``rounding_floor``).
ACCUMULATING_OPS = frozenset({"Conv", "ConvTranspose", "FusedConv", "Gemm", "MatMul", "FusedMatMul", "Einsum",
                              "LSTM", "GRU", "RNN", "Attention", "MultiHeadAttention"})

#: A model as verification takes it: a path, serialized bytes, or a ModelProto.
Model = str | os.PathLike | bytes | onnx.ModelProto

#: How the reason of a ``skipped`` verification starts when onnxruntime cannot load the original (an invalid
#: input: ``pipeline.optimize`` refuses it).
ORIGINAL_UNLOADABLE = "onnxruntime cannot load the original"

#: Default number of input sets, as Polygraphy's default. More sets exercise more values (channels that ReLU
#: kills on one input, other branches), at one more onnxruntime run per model per set.
DEFAULT_INPUT_SETS = 1

#: Default time budget of one verification, in seconds (``--verify-timeout``): every onnxruntime run of it
#: together. Verifying the shared models takes 0.3-6 s (BENCHMARKS.md, "What verification costs"); a model that
#: needs more is either very large (raise it) or never ends (a Loop of 10^12 iterations), and either way
#: verification stops with status ``skipped``, reason ``time``, instead of hanging.
DEFAULT_TIMEOUT_S = 300.0

#: Per-slice floors: besides the whole output, each slice along one non-batch axis (a channel of NCHW, a column
#: of [N, boxes, 85]) whose scale (max |original| in it) is at most 1/SLICE_SCALE_GAP of the output's is checked
#: against floors of its own, where the axis has at least 2 slices of at least MIN_GROUP_ELEMENTS elements. A
#: slice of small scores beside one of values near 1e5 is then judged by its own scale and noise, not by the 1e5
#: values' (issue 20). A slice's floors: onnxruntime's noise floor, the rounding floor and the min floor measured
#: on that slice alone, and the output's effective floor scaled by slice scale / output scale (onnxruntime's noise
#: relative to the output's scale, applied to the slice's). Slices of a scale near the output's are left to the
#: whole-output check (their maximum over fewer elements only estimates the same noise less well); there the
#: whole-output check misses relative errors below FLOOR_MULTIPLE x SLICE_SCALE_GAP floors of the output's scale.
#: So are slices where onnxruntime's floor and the rounding floor were both measured as 0: a correct fold moved
#: rapidocr's saturated Sigmoid rows (0 in the original) by 3e-8 where neither calibration run moved them at all.
MIN_GROUP_ELEMENTS = 32
SLICE_SCALE_GAP = 16.0


@dataclass
class VerifyOptions:
    """How to verify.

    Attributes:
        input_shapes: graph input name -> dims for symbolic dims.
        input_data: path of an ``.npz`` whose arrays (named like the graph inputs) are fed as they are.
        input_values / input_ranges: fill values and ``(low, high)`` ranges per input (see
            :class:`onnxfuse.ort.sessions.InputSpec`).
        input_sets: how many seeded input sets to run (1 when ``input_data`` gives every input).
        rtol / atol: when either is set, the elementwise rule replaces the noise-floor rule (for integer and
            bool outputs too).
        floor_multiple: FLOOR_MULTIPLE unless overridden.
        timeout: seconds for every onnxruntime run of the verification together (DEFAULT_TIMEOUT_S); None: no
            limit. When it runs out the result is ``skipped`` with ``cause`` ``time``.
    """

    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    input_data: str | None = None
    input_values: dict[str, float] = field(default_factory=dict)
    input_ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    input_sets: int = DEFAULT_INPUT_SETS
    rtol: float | None = None
    atol: float | None = None
    floor_multiple: float = FLOOR_MULTIPLE
    timeout: float | None = DEFAULT_TIMEOUT_S

    @property
    def explicit_tolerance(self) -> bool:
        """True when ``rtol``/``atol`` replace the noise-floor rule."""
        return self.rtol is not None or self.atol is not None


@dataclass
class OutputDiff:
    """Comparison of one output over every input set.

    Attributes:
        name / dtype / shape: the output (shape of the last input set).
        max_abs_error: the deviation, max |candidate - original| over finite elements (inf: shapes differ).
        max_rel_error: ``max_abs_error / scale`` (error relative to the output's scale).
        scale: max |original| over finite elements.
        floor: measured noise floor (max |ORT_ENABLE_ALL - ORT_DISABLE_ALL| of the original); None when not
            measured (explicit rtol/atol, integer output, identical outputs, or onnxruntime failed at that level).
        rounding_floor: the deviation of the original with its weights moved by one ulp (see the module
            docstring); None when not measured (only measured when the other floors would fail the output).
        min_floor: the floor's lower bound (see the module docstring); 0 for exact outputs.
        tolerance: the allowed deviation under the noise-floor rule (None under explicit rtol/atol).
        rtol / atol: the elementwise tolerance applied (under the noise-floor rule: 0 and ``tolerance``).
        needed_atol: the smallest atol that would have passed with this rtol.
        nonfinite_mismatches: elements where NaN/inf positions (or inf signs) differ.
        passed: within tolerance, NaN/inf at the same places, same shape; False when not compared.
        compared: elements compared over every input set (for a float output, those finite in the original);
            0 means "not compared" (an empty output, or NaN everywhere on both sides), which is neither passed
            nor failed.
        differing / floor_differing: integer and bool outputs: elements that differ from the original's, and
            the most that onnxruntime's own optimizations (or weights moved by one ulp) change; None otherwise.
        worst_group: float outputs under the noise-floor rule: the slice along one axis (see
            MIN_GROUP_ELEMENTS) whose error is the largest share of its own tolerance, as a dict with ``axis``,
            ``index``, ``max_abs_error``, ``scale``, ``floor``, ``rounding_floor``, ``min_floor``,
            ``tolerance``; None when the output has no such axis.
    """

    name: str
    dtype: str
    shape: list[int]
    max_abs_error: float
    max_rel_error: float
    scale: float
    floor: float | None
    rounding_floor: float | None
    min_floor: float
    tolerance: float | None
    rtol: float
    atol: float
    needed_atol: float
    nonfinite_mismatches: int
    passed: bool
    compared: int = 1
    differing: int | None = None
    floor_differing: int | None = None
    worst_group: dict[str, Any] | None = None

    @property
    def not_compared(self) -> bool:
        """No element was compared (neither passed nor failed)."""
        return self.compared == 0 and self.max_abs_error != math.inf

    @property
    def effective_floor(self) -> float:
        """max(floor, rounding_floor, min_floor): the floor the tolerance is a multiple of."""
        return max(self.floor or 0.0, self.rounding_floor or 0.0, self.min_floor)

    def describe(self, floor_multiple: float = FLOOR_MULTIPLE) -> str:
        """One line: the error, the floor beside it and the tolerance that would have passed."""
        if self.max_abs_error == math.inf and self.nonfinite_mismatches == 0:
            return f"output {self.name}: shape differs from the original's {self.shape}"
        if self.not_compared:
            return f"output {self.name}: not compared (empty, or NaN/inf in both, on these inputs)"
        if _exact(np.dtype(self.dtype)):
            text = f"output {self.name}: {self.dtype} values differ in {self.differing or 0} element(s) (max abs " \
                   f"difference {self.max_abs_error:g})"
            if self.tolerance is None:
                return text + f"; tolerance atol {self.atol:g} + rtol {self.rtol:g} * |original| (would pass " \
                              f"with --atol {self.needed_atol:.3g})"
            if not self.floor_differing:
                return text + "; onnxruntime's own optimizations change none of them, so they must be equal"
            return text + f"; onnxruntime's own optimizations change {self.floor_differing} by up to " \
                          f"{self.tolerance:g}: tolerance {floor_multiple:g}x as many elements, by at most that"
        text = f"output {self.name}: max abs error {self.max_abs_error:.3g} ({self.max_rel_error:.2g} of scale " \
               f"{self.scale:.3g})"
        if self.nonfinite_mismatches:
            text += f", {self.nonfinite_mismatches} NaN/inf element(s) not at the same place"
        if self.tolerance is None:
            return text + f"; tolerance atol {self.atol:g} + rtol {self.rtol:g} * |original| (would pass with " \
                          f"--atol {self.needed_atol:.3g})"
        ratio = self.max_abs_error / self.effective_floor if self.effective_floor else math.inf
        g = self.worst_group
        if g is not None and self.max_abs_error <= self.tolerance:  # the whole output passes, one slice does not
            return text + f"; slice {g['index']} along axis {g['axis']}: max abs error {g['max_abs_error']:.3g} " \
                          f"(scale {g['scale']:.3g}), its own floors: onnxruntime noise floor " \
                          f"{_num(g['floor'])}, rounding floor {_num(g['rounding_floor'])}, min " \
                          f"{g['min_floor']:.3g}; tolerance {floor_multiple:g}x = {g['tolerance']:.3g}"
        return text + f"; {self.floors_text()}, error = {ratio:.3g}x the effective floor, tolerance " \
                      f"{floor_multiple:g}x = {self.tolerance:.3g} (would pass with --atol {self.needed_atol:.3g})"

    def floors_text(self) -> str:
        """``onnxruntime noise floor F, rounding floor R, min M`` (the rounding floor only when measured)."""
        floor = "not measured" if self.floor is None else f"{self.floor:.3g}"
        rounding = "" if self.rounding_floor is None else f", rounding floor {self.rounding_floor:.3g}"
        return f"onnxruntime noise floor {floor}{rounding}, min {self.min_floor:.3g}"


def _num(x: float | None) -> str:
    return "not measured" if x is None else f"{x:.3g}"


@dataclass
class Verification:
    """Result of :func:`verify_models`.

    ``status``: ``passed``; ``failed`` (``reason`` names every differing output); ``skipped`` (``reason``:
    why nothing could be compared); ``unchanged`` (nothing was rewritten, so nothing was run).

    ``cause`` (skipped only): ``time`` (the ``timeout`` ran out), ``inputs`` (onnxruntime cannot run the
    original on the generated inputs, or they leave nothing to compare), ``load`` (onnxruntime cannot load the
    original), ``user`` (``--no-verify``). ``invented``: the inputs whose symbolic dims got onnxfuse's default
    sizes (listed in ``input_shapes``, and ``second_input_shapes`` for the second set at batch 2 and other
    sizes, empty when it was not run); ``input_note`` says why that second set was not run.
    ``random_integers``: integer and bool inputs fed random values (in [0, 4)) because nobody gave theirs: a sample
    rate, an index or a flag then takes values the model never sees in use, and may select other branches.
    """

    status: str
    reason: str | None = None
    outputs: list[OutputDiff] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    input_shapes: dict[str, list[int]] = field(default_factory=dict)
    rule: str = "noise-floor"
    floor_multiple: float = FLOOR_MULTIPLE
    floor_note: str | None = None
    cause: str | None = None
    invented: list[str] = field(default_factory=list)
    second_input_shapes: dict[str, list[int]] = field(default_factory=dict)
    input_note: str | None = None
    random_integers: list[str] = field(default_factory=list)

    @classmethod
    def skipped_by_user(cls) -> Verification:
        """The result for ``--no-verify``."""
        return cls("skipped", "verification disabled with --no-verify", cause="user")

    @property
    def not_compared_outputs(self) -> list[OutputDiff]:
        """Outputs of which no element was compared (empty on these inputs): neither passed nor failed."""
        return [o for o in self.outputs if o.not_compared]

    @property
    def hint(self) -> str:
        """What to pass to get the model verified next time (skipped results; empty otherwise)."""
        if self.status != "skipped":
            return ""
        if self.cause == "time":
            return "give it more time with --verify-timeout SECONDS"
        if self.cause == "user":
            return "drop --no-verify to verify it"
        if self.cause == "inputs" and "--input-" not in (self.reason or ""):  # the reason may name them already
            return ("give the inputs the model expects: --input-value NAME=V (e.g. --input-value sr=16000), "
                    "--input-range NAME=LOW,HIGH, --input-shape NAME=DIMS or --input-data FILE.npz")
        return ""

    @classmethod
    def unchanged(cls) -> Verification:
        """The result when no pass rewrote the graph: the output computes what the input does."""
        return cls("unchanged", "nothing was rewritten, so there was nothing to verify; onnxruntime was not run")

    def unchecked(self, require_option: bool = True) -> list[str]:
        """One line per thing this verification did not check, each naming what to pass: skipped (not by
        ``--no-verify``; with ``require_option``, that ``--require-verify`` makes it an error), outputs not
        compared, invented input sizes, integer inputs fed random values. Empty when everything was checked."""
        lines = []
        if self.status == "skipped" and self.cause != "user":
            lines.append(f"NOT VERIFIED: {self.reason}" + (f"; {self.hint}" if self.hint else "")
                         + ("; --require-verify makes this an error (exit 1)" if require_option else ""))
        if self.not_compared_outputs:
            lines.append(f"output(s) {', '.join(o.name for o in self.not_compared_outputs)} not compared: empty on "
                         "the inputs used (give other inputs: --input-value, --input-shape, --input-data)")
        if self.invented and self.input_shapes and self.status in ("passed", "failed"):
            def sizes(shapes: dict[str, list[int]]) -> str:
                return ", ".join(f"{k}={'x'.join(map(str, shapes[k])) or 'scalar'}" for k in self.invented
                                 if k in shapes)

            used = sizes(self.input_shapes) + (f"; then {sizes(self.second_input_shapes)}"
                                               if self.second_input_shapes else "")
            lines.append(f"no shape given for {', '.join(self.invented)}; verification ran at invented sizes "
                         f"({used}), not the model's real ones: pass --input-shape")
        if self.random_integers and self.status in ("passed", "failed"):
            lines.append(f"verification fed random integers in [0, 4) to {', '.join(self.random_integers)}, which "
                         "may take another branch than real values do: set them with --input-value NAME=V (e.g. "
                         "sr=16000), --input-range or --input-data")
        return lines

    @property
    def failed_outputs(self) -> list[OutputDiff]:
        """The outputs that differ beyond tolerance (not those that were not compared)."""
        return [o for o in self.outputs if not o.passed and not o.not_compared]

    @property
    def summary(self) -> str:
        """One line: the worst output's error beside onnxruntime's noise floor and the tolerance."""
        if self.reason or not self.outputs:
            return self.reason or ""
        compared = [o for o in self.outputs if not o.not_compared]
        worst = max(compared or self.outputs,
                    key=lambda o: o.max_abs_error / (o.effective_floor or o.tolerance or o.atol or 1))
        sets = f"{len(self.seeds)} input set" + ("" if len(self.seeds) == 1 else "s")
        missing = self.not_compared_outputs
        if missing:
            sets += f"; not compared (empty on these inputs): {', '.join(o.name for o in missing)}"
        if worst.tolerance is None or _exact(np.dtype(worst.dtype)):
            return f"max abs error {worst.max_abs_error:.3g} on {worst.name}, atol {worst.atol:g} rtol " \
                   f"{worst.rtol:g}; {sets}"
        floors = (f"onnxruntime noise floor {worst.floor:.3g}" if worst.floor is not None else
                  f"rounding floor {worst.rounding_floor:.3g}" if worst.rounding_floor is not None else
                  f"min floor {worst.min_floor:.3g}")
        return f"worst output {worst.name}: max abs error {worst.max_abs_error:.3g}, tolerance " \
               f"{worst.tolerance:.3g} (from the {floors}); {sets}"

    def to_dict(self) -> dict[str, Any]:
        """JSON form (see report.schema.json, ``verification``)."""
        return {
            "status": self.status, "reason": self.reason, "summary": self.summary, "rule": self.rule,
            "floor_multiple": self.floor_multiple, "floor_note": self.floor_note, "seeds": self.seeds,
            "input_shapes": self.input_shapes, "cause": self.cause, "invented": self.invented,
            "second_input_shapes": self.second_input_shapes, "input_note": self.input_note,
            "random_integers": self.random_integers,
            "max_abs_error": _finite(max((o.max_abs_error for o in self.outputs), default=None)),
            "max_rel_error": _finite(max((o.max_rel_error for o in self.outputs), default=None)),
            "outputs": [{k: _finite(v) if isinstance(v, float) else v for k, v in o.__dict__.items()}
                        for o in self.outputs],  # worst_group's values are finite (or None) by construction
        }


def timeout_seconds(value: float | None) -> float | None:
    """``VerifyOptions.timeout`` from ``--verify-timeout`` / the API's ``verify_timeout``: None gives
    DEFAULT_TIMEOUT_S, 0 no limit (None).

    Raises:
        InputError: a negative or non-finite value.
    """
    if value is None:
        return DEFAULT_TIMEOUT_S
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InputError(f"verify timeout: expected a number of seconds >= 0 (0: no limit), got {value!r}")
    return float(value) or None


def _finite(x: float | None) -> float | None:
    """``x`` unless it is inf or NaN (JSON has neither), else None."""
    return x if x is None or np.isfinite(x) else None


@dataclass
class _Acc:
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


def _exact(dtype: np.dtype) -> bool:
    return not np.issubdtype(dtype, np.floating)


def _deviation(ref: np.ndarray, got: np.ndarray) -> tuple[float, int, np.ndarray]:
    """(max |got - ref| over elements finite in both, count of NaN/inf mismatches, finite mask of ref)."""
    r, g = ref.astype(np.float64, copy=False), got.astype(np.float64, copy=False)
    fr, fg = np.isfinite(r), np.isfinite(g)
    both = fr & fg
    # a non-finite element must be matched by the same kind: NaN with NaN, +inf with +inf, -inf with -inf
    same_nonfinite = ~fr & ~fg & ((np.isnan(r) & np.isnan(g)) | (r == g))
    mismatches = int(np.count_nonzero(~both & ~same_nonfinite))
    dev = float(np.max(np.abs(r[both] - g[both]))) if both.any() else 0.0
    return dev, mismatches, fr


def _scale(ref: np.ndarray) -> float:
    r = ref.astype(np.float64, copy=False)
    finite = r[np.isfinite(r)]
    return float(np.max(np.abs(finite))) if finite.size else 0.0


def _group_axes(shape: tuple[int, ...]) -> list[int]:
    """The non-batch axes with at least 2 slices of at least MIN_GROUP_ELEMENTS elements."""
    size = math.prod(shape)
    return [a for a in range(1, len(shape)) if shape[a] >= 2 and size // shape[a] >= MIN_GROUP_ELEMENTS]


def _abs_diff(ref: np.ndarray, other: np.ndarray) -> np.ndarray:
    """|other - ref| in float64 where both are finite, 0 elsewhere."""
    r, o = ref.astype(np.float64, copy=False), other.astype(np.float64, copy=False)
    both = np.isfinite(r) & np.isfinite(o)
    return np.where(both, np.abs(np.where(both, o, 0.0) - np.where(both, r, 0.0)), 0.0)


def _update_groups(acc: _Acc, key: str, values: np.ndarray) -> None:
    """Raise ``acc.groups[axis][key]`` to the per-slice maximum of ``values`` (float64, >= 0) along each axis."""
    if acc.groups is None:
        acc.groups = {a: {"dev": None, "scale": None, "floor": None, "rounding": None}
                      for a in _group_axes(values.shape)}
    for axis in list(acc.groups):
        group = acc.groups[axis]
        known = next((v for v in group.values() if v is not None), None)
        if values.ndim <= axis or (known is not None and len(known) != values.shape[axis]):
            del acc.groups[axis]  # a symbolic axis whose size changed between input sets
            continue
        per_slice = np.max(np.moveaxis(values, axis, 0).reshape(values.shape[axis], -1), axis=1)
        group[key] = per_slice if group[key] is None else np.maximum(group[key], per_slice)


def _accumulate(acc: _Acc, ref: np.ndarray, got: np.ndarray, opts: VerifyOptions) -> None:
    acc.shape = list(ref.shape)
    if ref.shape != got.shape:
        acc.shape_ok = False
        return
    if ref.size == 0:
        return
    acc.compared += ref.size
    if _exact(ref.dtype):
        acc.finite += ref.size
        acc.scale = max(acc.scale, _scale(ref))
        diff = int(np.count_nonzero(ref != got))
        if diff:
            r, g = ref.astype(np.float64), got.astype(np.float64)
            acc.max_abs = max(acc.max_abs, float(np.max(np.abs(r - g))))
            acc.differing += diff
            if opts.explicit_tolerance:  # --atol/--rtol apply to integers too (issue 26)
                rtol, atol = opts.rtol or 0.0, opts.atol or 0.0
                acc.elementwise_ok = acc.elementwise_ok and bool(np.all(np.isclose(g, r, rtol=rtol, atol=atol)))
                acc.needed_atol = max(acc.needed_atol, float(np.max(np.abs(r - g) - rtol * np.abs(r))))
            else:
                acc.elementwise_ok = False
        return
    dev, mismatches, finite = _deviation(ref, got)
    acc.finite += int(np.count_nonzero(finite))
    acc.max_abs, acc.nonfinite = max(acc.max_abs, dev), acc.nonfinite + mismatches
    acc.scale = max(acc.scale, _scale(ref))
    if not opts.explicit_tolerance:
        _update_groups(acc, "dev", _abs_diff(ref, got))
        _update_groups(acc, "scale", _abs_diff(np.zeros_like(ref), ref))
    if opts.explicit_tolerance:
        rtol, atol = opts.rtol or 0.0, opts.atol or 0.0
        r, g = ref.astype(np.float64), got.astype(np.float64)
        ok = np.isclose(g, r, rtol=rtol, atol=atol, equal_nan=True)
        acc.elementwise_ok = acc.elementwise_ok and bool(np.all(ok))
        both = np.isfinite(r) & np.isfinite(g)
        if both.any():
            acc.needed_atol = max(acc.needed_atol, float(np.max(np.abs(r - g)[both] - rtol * np.abs(r[both]))))


def _min_floor(acc: _Acc) -> float:
    return MIN_FLOOR_ULPS * float(np.finfo(acc.dtype).eps) * acc.scale


def _group_tolerances(acc: _Acc, opts: VerifyOptions, rounding: bool = True) -> dict[int, np.ndarray]:
    """axis -> the tolerance of each slice: floor_multiple x max(its floor, its rounding floor (when
    ``rounding``), MIN_FLOOR_ULPS x eps x its scale, the whole output's effective floor x its scale / the
    output's); inf for slices whose scale is above 1/SLICE_SCALE_GAP of the output's (see SLICE_SCALE_GAP)."""
    eps = float(np.finfo(acc.dtype).eps)
    whole = max(acc.floor or 0.0, (acc.rounding_floor or 0.0) if rounding else 0.0, _min_floor(acc))
    out = {}
    for axis, g in (acc.groups or {}).items():
        if g["dev"] is None or g["scale"] is None or not acc.scale:
            continue
        eff = np.maximum(MIN_FLOOR_ULPS * eps * g["scale"], whole * g["scale"] / acc.scale)
        for key in ("floor", "rounding") if rounding else ("floor",):
            if g[key] is not None:
                eff = np.maximum(eff, g[key])
        # slices of a scale near the output's: the whole-output check judges them (inf: no slice check); so are
        # slices where both floors were measured and are 0: every run of the original computed the same bits
        # there (a saturated Sigmoid, a clamp), so they have no calibration of their own
        checked = g["scale"] * SLICE_SCALE_GAP <= acc.scale
        if rounding and g["floor"] is not None and g["rounding"] is not None:
            checked &= (g["floor"] > 0) | (g["rounding"] > 0)
        out[axis] = np.where(checked, opts.floor_multiple * eff, np.inf)
    return out


def _groups_over(acc: _Acc, opts: VerifyOptions, rounding: bool = True) -> bool:
    return any(bool(np.any(acc.groups[a]["dev"] > tol)) for a, tol in _group_tolerances(acc, opts, rounding).items())


def _over(acc: _Acc, opts: VerifyOptions) -> bool:
    """An output whose deviation the measured floor and min_floor alone would fail (and nothing else): a float
    output over them as a whole or in one slice (:data:`MIN_GROUP_ELEMENTS`), an integer output that differs."""
    if not acc.shape_ok:
        return False
    if _exact(acc.dtype):
        return acc.differing > 0
    return acc.nonfinite == 0 and (acc.max_abs > opts.floor_multiple * max(acc.floor or 0.0, _min_floor(acc))
                                   or _groups_over(acc, opts, rounding=False))


def _worst_group(acc: _Acc, opts: VerifyOptions) -> dict[str, Any] | None:
    """The checked slice whose deviation is the largest share of its tolerance (see OutputDiff.worst_group);
    None when no slice is checked."""
    best = None
    for axis, tol in _group_tolerances(acc, opts).items():
        g = acc.groups[axis]
        checked = np.isfinite(tol)
        if not checked.any():
            continue
        share = np.where(tol > 0, g["dev"] / np.where(tol > 0, tol, 1.0), np.where(g["dev"] > 0, np.inf, 0.0))
        share = np.where(checked, share, -1.0)
        i = int(np.argmax(share))
        if best is None or share[i] > best[0]:
            best = (float(share[i]), axis, i, tol[i])
    if best is None:
        return None
    _, axis, i, tol = best
    g = acc.groups[axis]
    eps = float(np.finfo(acc.dtype).eps)
    floor, rounding = (None if g[key] is None else float(g[key][i]) for key in ("floor", "rounding"))
    return {"axis": axis, "index": i, "max_abs_error": float(g["dev"][i]), "scale": float(g["scale"][i]),
            "floor": floor, "rounding_floor": rounding,
            "min_floor": MIN_FLOOR_ULPS * eps * float(g["scale"][i]), "tolerance": float(tol)}


def _finish(acc: _Acc, opts: VerifyOptions) -> OutputDiff:
    kind = str(acc.dtype)
    if not acc.shape_ok:
        return OutputDiff(acc.name, kind, acc.shape, math.inf, math.inf, acc.scale, acc.floor, acc.rounding_floor,
                          0.0, None, opts.rtol or 0.0, opts.atol or 0.0, math.inf, 0, False, acc.compared)
    # nothing compared (empty, or NaN/inf at the same places everywhere): no evidence, never "passed"
    compared = acc.compared if acc.finite or acc.nonfinite else 0
    rel = acc.max_abs / acc.scale if acc.scale else (0.0 if acc.max_abs == 0 else math.inf)
    if _exact(acc.dtype):
        # calibrated like floats (issue 26): as many elements as onnxruntime's own optimizations change, times
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


def _proto(model: Model) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, bytes):
        return onnx.load_model_from_string(model)
    return onnx.load(str(model))


def _signature(values) -> list[tuple[str, str]]:
    return [(v.name, v.type) for v in values]


class _Budget:
    """What is left of ``VerifyOptions.timeout`` (None: no limit), from :func:`time.monotonic`."""

    def __init__(self, timeout: float | None):
        import time

        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout

    def left(self) -> float | None:
        """Seconds left (None: no limit).

        Raises:
            runtime.RunTimeout: none left (checked before each session is made: onnxruntime cannot stop a
                session being created, only a run).
        """
        import time

        if self.deadline is None:
            return None
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise runtime.RunTimeout("no time left")
        return left


#: The budget of the verification in progress in this thread (verify_models sets it; None: no limit).
_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("onnxfuse_verify_budget", default=None)


def _run_all(sess, feeds_list: list[dict[str, np.ndarray]]) -> list[list[np.ndarray]]:
    # Copies: the arrays onnxruntime returns wrap its own output buffers (their base is a PyCapsule), which keep
    # the session's memory arena, activations and all, alive after the session is freed.
    # Each run stops when the verification's time budget runs out (runtime.RunTimeout).
    budget = _BUDGET.get()
    return [[np.array(a) for a in runtime.run(sess, feeds, budget.left() if budget else None)]
            for feeds in feeds_list]


def _session(src, level: str = "disable"):
    """runtime.session without spinning threads, once the budget allows (runtime.RunTimeout when it does not)."""
    budget = _BUDGET.get()
    if budget is not None:
        budget.left()
    return runtime.session(src, level, spinning=False) if level != "disable" else runtime.session(src, spinning=False)


#: Ops whose outputs differ from run to run (ONNX Operators.md: the Random* ops draw anew on every run without a
#: seed; Multinomial, Bernoulli; Dropout in training mode masks at random).
RANDOM_OPS = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial",
                        "Bernoulli"})


def _graph_only(model: Model) -> onnx.ModelProto:
    """``model`` as a ModelProto to look at its graph: itself, parsed bytes, or a file read without its external
    data (an unreadable one: an empty model, the runs report it)."""
    if isinstance(model, onnx.ModelProto):
        return model
    try:
        if isinstance(model, bytes):
            return onnx.load_model_from_string(model)
        return onnx.load_model(str(model), load_external_data=False)
    except Exception:  # the sessions below say why the model cannot be read
        return onnx.ModelProto()


def random_ops(model: onnx.ModelProto) -> list[str]:
    """The ops of ``model`` (every graph) that draw random numbers on each run: :data:`RANDOM_OPS` without a
    ``seed`` attribute, and Dropout whose ``training_mode`` input is present and not a constant false. Sorted,
    each once."""
    from onnxfuse.model.proto import proto_graphs

    found = set()
    for graph, _ in proto_graphs(model.graph):
        constants = {t.name: t for t in graph.initializer}
        constants.update({n.output[0]: a.t for n in graph.node if n.op_type == "Constant" for a in n.attribute
                          if a.name == "value"})
        for node in graph.node:
            if node.op_type in RANDOM_OPS and not any(a.name == "seed" for a in node.attribute):
                found.add(node.op_type)
            elif node.op_type == "Dropout" and len(node.input) > 2 and node.input[2]:
                mode = constants.get(node.input[2])
                if mode is None or bool(onnx.numpy_helper.to_array(mode).any()):
                    found.add("Dropout in training mode")
    return sorted(found)


def verify_models(original: Model, candidate: Model, options: VerifyOptions | None = None) -> Verification:
    """:func:`_verify_models` within ``options.timeout`` seconds (DEFAULT_TIMEOUT_S): when they run out (an
    onnxruntime run is stopped, or no time is left to make the next session) the result is ``skipped`` with
    ``cause`` ``time``, whatever was compared so far. See :func:`onnxfuse.ort.sessions.run` for how a run is stopped
    (onnxruntime's ``RunOptions.terminate``, in this process). Raises as :func:`_verify_models`."""
    opts = options or VerifyOptions()
    random = random_ops(_graph_only(candidate))
    if random:
        return Verification("skipped", f"the model draws random numbers ({', '.join(random)}): its outputs differ "
                            "from run to run, so no comparison is evidence of a correct rewrite", cause="random")
    token = _BUDGET.set(_Budget(opts.timeout))
    try:
        return _verify_models(original, candidate, opts)
    except runtime.RunTimeout:
        runtime.trim_heap()
        return Verification("skipped", f"time: verification did not finish within {opts.timeout:g} s "
                            "(--verify-timeout); nothing was concluded", cause="time")
    finally:
        _BUDGET.reset(token)


def _verify_models(original: Model, candidate: Model, options: VerifyOptions | None = None) -> Verification:
    """Compare ``candidate`` with ``original`` (each a model path, serialized model bytes or a ModelProto, left
    unmodified) in onnxruntime by the rule of the module docstring.

    Cost: one onnxruntime session per model at ``ORT_DISABLE_ALL``, plus one of the original at
    ``ORT_ENABLE_ALL`` for the noise floor (not created when every output is bit-identical, within
    FLOOR_MULTIPLE x its one-ulp minimum floor, or rtol/atol are given), and, only when an output would otherwise
    fail, one of the original with its weights moved by one ulp (the rounding floor). They are created one after
    the other and each is freed (its heap pages handed back, :func:`onnxfuse.ort.sessions.trim_heap`) before the
    next, so at most one session is held at a time; the outputs kept are copies, which do not hold a session's
    memory arena. Each runs ``options.input_sets`` input sets, without busy-waiting threads (``spinning=False``
    of :func:`onnxfuse.ort.sessions.session`). A candidate given as a ModelProto is loaded from a temporary file
    (``as_file`` of :func:`onnxfuse.ort.sessions.loadable`), not from a second, serialized copy in memory.

    Returns ``skipped`` (with the reason) when onnxruntime cannot load or run the *original*; ``failed`` when
    the candidate's output names, order or dtypes or its inputs differ, onnxruntime cannot load or run it while it
    can the original, or an output differs beyond tolerance.

    Raises:
        InputError: unreadable ``input_data``; an input name that the model does not have; a value that does not
            fit its input's dtype; ``input_data`` that onnxruntime cannot run the original on; inputs too large
            for memory.
    """
    opts = options or VerifyOptions()
    spec = runtime.InputSpec(shapes=dict(opts.input_shapes), values=dict(opts.input_values),
                             ranges=dict(opts.input_ranges),
                             data=runtime.load_npz(opts.input_data) if opts.input_data else {})
    with runtime.loadable(original) as src:
        try:
            ref_sess = _session(src)
        except runtime.RunTimeout:
            raise
        except Exception as exc:
            return Verification("skipped", f"{ORIGINAL_UNLOADABLE}: {runtime.short(exc)}", cause="load")
        runtime.check_names(ref_sess, spec)
        all_given = set(spec.data) >= {i.name for i in ref_sess.get_inputs()}
        seeds = [0] if all_given else list(range(max(1, opts.input_sets)))
        invented = runtime.invented_inputs(ref_sess, spec)
        random_integers = [i.name for i in ref_sess.get_inputs() if i.name not in spec.fixed()
                           and i.type in runtime.EXACT_INPUT_TYPES]
        try:
            feeds_list = [runtime.make_inputs(ref_sess, spec, seed) for seed in seeds]
        except ValueError as exc:
            return Verification("skipped", str(exc), cause="inputs")
        except MemoryError:
            raise InputError(f"random inputs of shapes {opts.input_shapes} do not fit in memory; give smaller "
                             "--input-shape values") from None
        used_shapes = {k: list(v.shape) for k, v in feeds_list[-1].items()}
        ref_inputs, ref_outputs = _signature(ref_sess.get_inputs()), _signature(ref_sess.get_outputs())
        empty_hint = runtime.random_inputs_hint(ref_sess, spec)
        try:
            refs = _run_all(ref_sess, feeds_list)
        except runtime.RunTimeout:
            raise
        except Exception as exc:
            if spec.data:
                raise InputError(f"--input-data {opts.input_data}: onnxruntime cannot run the original on it: "
                                 f"{runtime.short(exc)}") from None
            return Verification("skipped", f"onnxruntime cannot run the original on inputs {used_shapes}: "
                                f"{runtime.short(exc)}{empty_hint}", seeds=seeds, input_shapes=used_shapes,
                                cause="inputs", invented=invented)
        second, input_note = _second_set(ref_sess, spec, invented, len(seeds))
        second_ran = second is not None
        if second is not None:
            feeds_list.append(second[0])
            refs.append(second[1])
            seeds.append(len(seeds))
        del ref_sess, second
    runtime.trim_heap()
    gots = _run_candidate(candidate, feeds_list, ref_inputs, ref_outputs)
    runtime.trim_heap()
    second_shapes = {k: list(v.shape) for k, v in feeds_list[-1].items()} if second_ran else {}
    extra = {"invented": invented, "second_input_shapes": second_shapes, "input_note": input_note,
             "random_integers": random_integers}
    if isinstance(gots, str):
        return Verification("failed", gots, seeds=seeds, input_shapes=used_shapes, **extra)

    accs = [_Acc(name, refs[0][i].dtype, list(refs[0][i].shape)) for i, (name, _) in enumerate(ref_outputs)]
    for ref, got in zip(refs, gots, strict=True):
        for acc, r, g in zip(accs, ref, got, strict=True):
            _accumulate(acc, r, g, opts)
    if all(a.shape_ok and a.compared == 0 for a in accs):
        # Nothing to compare is no evidence: a Loop that ran 0 times, a branch that returned an empty tensor.
        return Verification("skipped", "every output of the original is empty on the generated inputs "
                            f"{used_shapes}, so nothing was compared{empty_hint}", seeds=seeds,
                            input_shapes=used_shapes, cause="inputs", **extra)
    if all(a.shape_ok and a.finite == 0 and a.nonfinite == 0 for a in accs):
        # NaN against NaN everywhere (all-NaN --input-data, say) matches, but proves nothing about the rewrite
        return Verification("skipped", "every output value of the original is NaN or inf on the inputs "
                            f"{used_shapes} (and the optimized model's too), so no number was compared; give "
                            "finite inputs (--input-data, --input-range)", seeds=seeds, input_shapes=used_shapes,
                            cause="inputs", **extra)
    floor_note = None
    ints_differ = any(_exact(a.dtype) and a.shape_ok and a.differing for a in accs)
    if opts.explicit_tolerance:
        floor_note = "not measured: --rtol/--atol replace the noise-floor rule"
    elif all(_exact(a.dtype) for a in accs) and not ints_differ:
        floor_note = "not measured: no floating-point output"
    elif all((a.max_abs == 0 and a.nonfinite == 0 and a.shape_ok) or _exact(a.dtype) for a in accs) \
            and not ints_differ:
        floor_note = "not measured: every floating-point output is bit-identical to the original's"
    elif not any(_over(a, opts) for a in accs):
        # Within FLOOR_MULTIPLE x min_floor already: the verdict cannot depend on onnxruntime's floor, so its
        # ORT_ENABLE_ALL session (the costliest of the three: weights pre-packed) is not made.
        floor_note = (f"not measured: every floating-point output is within {opts.floor_multiple:g}x its "
                      "one-ulp minimum floor")
    else:
        floor_note = _measure_floor(original, feeds_list, refs, accs)
        if any(_over(a, opts) for a in accs):
            note = _measure_rounding_floor(original, feeds_list, refs, accs)
            floor_note = "; ".join(n for n in (floor_note, note) if n) or None
    outputs = [_finish(a, opts) for a in accs]
    failed = [o for o in outputs if not o.passed and not o.not_compared]
    status = "failed" if failed else "passed"
    reason = "; ".join(o.describe(opts.floor_multiple) for o in failed) or None
    return Verification(status, reason, outputs, seeds, used_shapes,
                        rule="rtol-atol" if opts.explicit_tolerance else "noise-floor",
                        floor_multiple=opts.floor_multiple, floor_note=floor_note, **extra)


def _second_set(sess, spec: runtime.InputSpec, invented: list[str], seed: int
                ) -> tuple[tuple[dict[str, np.ndarray], list[np.ndarray]] | None, str | None]:
    """The second default input set (seed ``seed``, sizes :data:`onnxfuse.ort.sessions.SECOND_DIMS` for the
    symbolic dims that nobody gave) and the original's outputs on it, when some input has ``invented`` sizes;
    else (None, None). When onnxruntime cannot run the original on it (a model that only runs at batch 1, or at
    one size), (None, a note that says so): verification goes on with the first set alone.

    Raises:
        runtime.RunTimeout: the budget ran out.
    """
    if not invented:
        return None, None
    try:
        feeds = runtime.make_inputs(sess, spec, seed, sizes=runtime.SECOND_DIMS)
        return (feeds, _run_all(sess, [feeds])[0]), None
    except runtime.RunTimeout:
        raise
    except Exception as exc:  # MemoryError too: a second set too large is no reason to stop
        batch, other = runtime.SECOND_DIMS
        return None, (f"the second input set (batch {batch}, other symbolic dims {other}) was not run: onnxruntime "
                      f"cannot run the original on it ({runtime.short(exc)}); compared on the first only")


def _run_candidate(candidate: Model, feeds_list, ref_inputs, ref_outputs) -> list[list[np.ndarray]] | str:
    """The candidate's outputs on every input set, or why it fails: onnxruntime cannot load or run it, or its
    outputs (names, order, dtypes) or inputs are not the original's."""
    with runtime.loadable(candidate, as_file=True) as src:
        try:
            cand_sess = _session(src)
        except runtime.RunTimeout:
            raise
        except Exception as exc:
            return f"onnxruntime cannot load the candidate model: {runtime.short(exc)}"
        cand_outputs = _signature(cand_sess.get_outputs())
        if cand_outputs != ref_outputs:
            return (f"the candidate's outputs {_sig_text(cand_outputs)} are not the original's "
                    f"{_sig_text(ref_outputs)} (names, order and dtypes must match)")
        extra = sorted(set(_signature(cand_sess.get_inputs())) - set(ref_inputs))
        if extra:
            return (f"the candidate has input(s) {_sig_text(extra)} that the original has not "
                    f"(original: {_sig_text(ref_inputs)})")
        names = {i.name for i in cand_sess.get_inputs()}
        try:
            return _run_all(cand_sess, [{k: v for k, v in f.items() if k in names} for f in feeds_list])
        except runtime.RunTimeout:
            raise
        except Exception as exc:
            return f"onnxruntime cannot run the candidate model: {runtime.short(exc)}"


def _measure_floor(original, feeds_list, refs, accs: list[_Acc]) -> str | None:
    """Set each output's ``floor`` (and its slices', and an integer output's ``floor_differing``) from one
    ORT_ENABLE_ALL session of the original; a note when that session cannot be made or run (the floor then
    stays None and min_floor alone applies)."""
    with runtime.loadable(original) as src:
        try:
            alls = _run_all(_session(src, "all"), feeds_list)
        except runtime.RunTimeout:
            raise
        except Exception as exc:
            return f"not measured: onnxruntime cannot run the original at ORT_ENABLE_ALL: {runtime.short(exc)}"
    runtime.trim_heap()
    for ref, alt in zip(refs, alls, strict=True):
        for acc, r, a in zip(accs, ref, alt, strict=True):
            _add_floor(acc, r, a, "floor")
    return None


def _add_floor(acc: _Acc, ref: np.ndarray, alt: np.ndarray, key: str) -> None:
    """Raise ``acc``'s floor ``key`` (``floor`` or ``rounding``) by how far ``alt`` (a floor run of the original)
    is from ``ref``: for the whole output, each slice, and for integer/bool outputs the elements changed (an
    integer output keeps both floors in ``floor``)."""
    if ref.shape != alt.shape or ref.size == 0:
        return
    if _exact(acc.dtype):
        changed = int(np.count_nonzero(ref != alt))
        acc.floor_differing = max(acc.floor_differing or 0, changed)
        dev = float(np.max(np.abs(ref.astype(np.float64) - alt.astype(np.float64)))) if changed else 0.0
        acc.floor = max(acc.floor or 0.0, dev)
        return
    dev, _, _ = _deviation(ref, alt)
    if key == "floor":
        acc.floor = max(acc.floor or 0.0, dev)
    else:
        acc.rounding_floor = max(acc.rounding_floor or 0.0, dev)
    if acc.groups:
        _update_groups(acc, key, _abs_diff(ref, alt))


def _measure_rounding_floor(original, feeds_list, refs, accs: list[_Acc]) -> str | None:
    """Set each output's ``rounding_floor`` (and its slices', and an integer output's floors, see
    :func:`_add_floor`) from one ORT_DISABLE_ALL session of the original with :func:`weights_moved_by_one_ulp`;
    a note when that cannot be done."""
    try:
        model = _proto(original)
        moved = weights_moved_by_one_ulp(model)
        del model
        with runtime.loadable(moved, as_file=True) as src:
            outs = _run_all(_session(src), feeds_list)
    except runtime.RunTimeout:
        raise
    except Exception as exc:
        return f"rounding floor not measured: {runtime.short(exc)}"
    runtime.trim_heap()
    for ref, alt in zip(refs, outs, strict=True):
        for acc, r, a in zip(accs, ref, alt, strict=True):
            _add_floor(acc, r, a, "rounding")
    return None


def weights_moved_by_one_ulp(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """A copy of ``model`` in which every floating-point constant weight (initializer or ``Constant`` node) read as
    input 1 of an :data:`ACCUMULATING_OPS` node has each element moved to its float neighbour (numpy.nextafter)
    up or down at random (seeded): the rounding a fold makes when it computes ``W * s`` in the weights' dtype."""
    from onnx import numpy_helper

    from onnxfuse.model.proto import proto_graphs

    out = onnx.ModelProto()
    out.CopyFrom(model)
    rng = np.random.default_rng(seed)
    weights = {n.input[1] for graph, _ in proto_graphs(out.graph) for n in graph.node
               if n.op_type in ACCUMULATING_OPS and len(n.input) > 1}

    def moved(t: onnx.TensorProto) -> onnx.TensorProto | None:
        a = numpy_helper.to_array(t)
        if not np.issubdtype(a.dtype, np.floating):
            return None
        up = rng.integers(0, 2, a.shape).astype(bool)
        b = np.where(up, np.nextafter(a, np.array(np.inf, a.dtype)), np.nextafter(a, np.array(-np.inf, a.dtype)))
        return numpy_helper.from_array(b.astype(a.dtype), t.name)

    for graph, _ in proto_graphs(out.graph):
        for t in graph.initializer:
            if t.name in weights and (new := moved(t)) is not None:
                t.CopyFrom(new)
        for node in graph.node:
            if node.op_type == "Constant" and node.output and node.output[0] in weights:
                attr = next((a for a in node.attribute if a.name == "value"), None)
                if attr is not None and (new := moved(attr.t)) is not None:
                    attr.t.CopyFrom(new)
    return out


def _sig_text(sig: list[tuple[str, str]]) -> str:
    return "[" + ", ".join(f"{n}: {t}" for n, t in sig) + "]"
