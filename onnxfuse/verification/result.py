"""The result of a verification: ``Verification`` (its ``Status`` and ``Cause``) and one ``OutputDiff`` per output."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np

from onnxfuse.verification.rule import FLOOR_MULTIPLE, exact


class _WrittenAsValue(str, Enum):
    """A ``str`` enum that ``str()`` and f-strings write as its value (``enum.StrEnum`` needs Python 3.11)."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return self.value.__format__(spec)


class Status(_WrittenAsValue):
    """``Verification.status``; a ``str`` (``Status.PASSED == "passed"``), written as its value in text and JSON."""

    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"
    UNCHANGED = "unchanged"
    #: every output compared passed, but at least one could not be compared on any input set (NaN/inf or empty
    #: on both sides): no evidence about it, so not ``passed`` (``--require-verify`` refuses it)
    PARTIAL = "partial"


class Cause(_WrittenAsValue):
    """``Verification.cause``, why a verification was skipped; a ``str``, written as its value in text and JSON."""

    TIME = "time"
    WORK = "work"
    INPUTS = "inputs"
    LOAD = "load"
    USER = "user"
    RANDOM = "random"


#: How the summary and ``partial``'s reason say that outputs were not compared, and what to pass about it.
NOT_COMPARED_TEXT = "not compared (NaN/inf or empty on both sides on every input set, or a sequence or map)"
PARTIAL_HINT = ("give the inputs values the model expects: --input-value NAME=V (e.g. --input-value sr=16000), "
                "--input-range NAME=LOW,HIGH or --input-data FILE.npz")


def partial_reason(outputs: list[OutputDiff]) -> str:
    """The ``reason`` of a ``partial`` verification: which outputs had nothing to compare, and what to pass."""
    return f"output(s) {', '.join(o.name for o in outputs)} {NOT_COMPARED_TEXT}, so nothing is known of them; " \
           f"{PARTIAL_HINT}"


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
        if exact(np.dtype(self.dtype)):
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

    def source_floor(self) -> str:
        """The floor the tolerance is a multiple of (:attr:`effective_floor`, the largest of the three), named with
        its value: ``onnxruntime noise floor F``, ``rounding floor R`` or ``min floor M``; on a tie the measured one
        (noise floor first)."""
        floors = [("onnxruntime noise floor", self.floor), ("rounding floor", self.rounding_floor),
                  ("min floor", self.min_floor)]
        name, value = max(((n, v) for n, v in floors if v is not None), key=lambda nv: nv[1])
        return f"{name} {value:.3g}"

    def floors_text(self) -> str:
        """``onnxruntime noise floor F, rounding floor R, min M`` (the rounding floor only when measured)."""
        floor = "not measured" if self.floor is None else f"{self.floor:.3g}"
        rounding = "" if self.rounding_floor is None else f", rounding floor {self.rounding_floor:.3g}"
        return f"onnxruntime noise floor {floor}{rounding}, min {self.min_floor:.3g}"


def _num(x: float | None) -> str:
    return "not measured" if x is None else f"{x:.3g}"


@dataclass
class Verification:
    """Result of :func:`onnxfuse.verification.verify.verify_models`.

    ``status``: ``passed``; ``failed`` (``reason`` names every differing output); ``partial`` (every output
    compared passed, but ``reason`` names outputs that no input set gave a value to compare: NaN/inf or empty on
    both sides; not a pass); ``skipped`` (``reason``: why nothing could be compared); ``unchanged`` (nothing was
    rewritten, so nothing was run).

    ``cause`` (skipped only): ``work`` (the work budget, ``VerifyOptions.work`` in CPU seconds, was spent: the
    same on a loaded machine as on an idle one), ``time`` (the wall-clock safety stop, ``timeout``, ran out),
    ``inputs`` (onnxruntime cannot run the
    original on the generated inputs, or they leave nothing to compare), ``load`` (onnxruntime cannot load the
    original), ``user`` (``--no-verify``), ``random`` (the model draws random numbers). ``invented``: the inputs
    whose symbolic dims got onnxfuse's default sizes (listed in ``input_shapes``, and ``second_input_shapes`` for
    the second set at batch 2 and other sizes, empty when it was not run); ``input_note`` says why that second set
    was not run.
    ``random_integers``: integer and bool inputs fed random values (in [0, 4)) because nobody gave theirs: a sample
    rate, an index or a flag then takes values the model never sees in use, and may select other branches.
    ``culprits`` / ``culprit_search`` / ``remainder`` (``onnxfuse optimize`` after a failure, :mod:`onnxfuse.culprits`):
    each rewrite site that broke verification (``pass``, ``nodes``, ``ops``, ``output``, ``moved``: the outputs
    and errors it moved), what the search cost, and the verdict of the model with the culprits left unfused.
    ``layers`` (``optimize --layers`` after a failure): the layer-by-layer comparison of the failing model
    (:meth:`onnxfuse.verification.layers.Layers.to_dict`).
    """

    status: Status
    reason: str | None = None
    outputs: list[OutputDiff] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    input_shapes: dict[str, list[int]] = field(default_factory=dict)
    rule: str = "noise-floor"
    floor_multiple: float = FLOOR_MULTIPLE
    floor_note: str | None = None
    cause: Cause | None = None
    invented: list[str] = field(default_factory=list)
    second_input_shapes: dict[str, list[int]] = field(default_factory=dict)
    input_note: str | None = None
    random_integers: list[str] = field(default_factory=list)
    culprits: list[dict[str, Any]] = field(default_factory=list)
    culprit_search: dict[str, Any] | None = None
    remainder: dict[str, Any] | None = None
    layers: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.status = Status(self.status)  # a plain "passed" given by a caller becomes Status.PASSED
        self.cause = None if self.cause is None else Cause(self.cause)

    @classmethod
    def skipped_by_user(cls) -> Verification:
        """The result for ``--no-verify``."""
        return cls(Status.SKIPPED, "verification disabled with --no-verify", cause=Cause.USER)

    @property
    def not_compared_outputs(self) -> list[OutputDiff]:
        """Outputs of which no element was compared (empty on these inputs): neither passed nor failed."""
        return [o for o in self.outputs if o.not_compared]

    @property
    def hint(self) -> str:
        """What to pass to get the model verified next time (skipped results; empty otherwise)."""
        if self.status != Status.SKIPPED:
            return ""
        if self.cause == Cause.TIME:
            return "give it more time with --verify-timeout SECONDS"
        if self.cause == Cause.WORK:
            return "give it more work with --verify-budget CPU-SECONDS"
        if self.cause == Cause.USER:
            return "drop --no-verify to verify it"
        if self.cause == Cause.INPUTS and "--input-" not in (self.reason or ""):  # the reason may name them already
            return ("give the inputs the model expects: --input-value NAME=V (e.g. --input-value sr=16000), "
                    "--input-range NAME=LOW,HIGH, --input-shape NAME=DIMS or --input-data FILE.npz")
        return ""

    @classmethod
    def unchanged(cls) -> Verification:
        """The result when no pass rewrote the graph: the output computes what the input does."""
        return cls(Status.UNCHANGED, "nothing was rewritten, so there was nothing to verify; onnxruntime was not run")

    def unchecked(self, require_option: bool = True, reason_shown: bool = False) -> list[str]:
        """One line per thing this verification did not check, each naming what to pass: skipped (not by
        ``--no-verify``; with ``require_option``, that ``--require-verify`` makes it an error), outputs not
        compared, invented input sizes, integer inputs fed random values. Empty when everything was checked.
        ``reason_shown``: the reason of a skip is printed elsewhere (the command's result on stdout), so the line
        points there instead of repeating it (onnxruntime's messages run to hundreds of characters)."""
        lines = []
        if self.status == Status.SKIPPED and self.cause != Cause.USER:
            why = "verification was skipped (why: the verification line of the result)" if reason_shown \
                else self.reason
            lines.append(f"NOT VERIFIED: {why}" + (f"; {self.hint}" if self.hint else "")
                         + ("; --require-verify makes this an error (exit 1)" if require_option else ""))
        if self.status == Status.PARTIAL:
            lines.append(f"NOT FULLY VERIFIED: {self.reason}"
                         + ("; --require-verify makes this an error (exit 1)" if require_option else ""))
        elif self.not_compared_outputs:
            lines.append(f"output(s) {', '.join(o.name for o in self.not_compared_outputs)} not compared: empty on "
                         "the inputs used (give other inputs: --input-value, --input-shape, --input-data)")
        if self.invented and self.input_shapes and self.status in (Status.PASSED, Status.FAILED, Status.PARTIAL):
            def sizes(shapes: dict[str, list[int]]) -> str:
                return ", ".join(f"{k}={'x'.join(map(str, shapes[k])) or 'scalar'}" for k in self.invented
                                 if k in shapes)

            used = sizes(self.input_shapes) + (f"; then {sizes(self.second_input_shapes)}"
                                               if self.second_input_shapes else "")
            lines.append(f"no shape given for {', '.join(self.invented)}; verification ran at invented sizes "
                         f"({used}), not the model's real ones: pass --input-shape")
        if self.random_integers and self.status in (Status.PASSED, Status.FAILED, Status.PARTIAL):
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
        """One line: the worst output's error beside onnxruntime's noise floor and the tolerance; after a culprit
        search whose remainder this is (``--drop-culprits``), how many rewrites were left unfused."""
        text = self._summary()
        if self.culprits and self.status != Status.FAILED:
            text += f"; {len(self.culprits)} rewrite(s) that broke verification left unfused " \
                    "(rewrite-broke-verification)"
        return text

    def _summary(self) -> str:
        if (self.reason and self.status != Status.PARTIAL) or not self.outputs:
            return self.reason or ""
        compared = [o for o in self.outputs if not o.not_compared]
        worst = max(compared or self.outputs,
                    key=lambda o: o.max_abs_error / (o.effective_floor or o.tolerance or o.atol or 1))
        sets = f"{len(self.seeds)} input set" + ("" if len(self.seeds) == 1 else "s")
        missing = self.not_compared_outputs
        if missing:
            sets += f"; {NOT_COMPARED_TEXT}: {', '.join(o.name for o in missing)} ({PARTIAL_HINT})"
        if worst.tolerance is None or exact(np.dtype(worst.dtype)):
            return f"max abs error {worst.max_abs_error:.3g} on {worst.name}, atol {worst.atol:g} rtol " \
                   f"{worst.rtol:g}; {sets}"
        return f"worst output {worst.name}: max abs error {worst.max_abs_error:.3g}, tolerance " \
               f"{worst.tolerance:.3g} (from the {worst.source_floor()}); {sets}"

    def to_dict(self) -> dict[str, Any]:
        """JSON form (see report.schema.json, ``verification``)."""
        return {
            "status": self.status.value, "reason": self.reason, "summary": self.summary, "rule": self.rule,
            "floor_multiple": self.floor_multiple, "floor_note": self.floor_note, "seeds": self.seeds,
            "input_shapes": self.input_shapes, "cause": None if self.cause is None else self.cause.value,
            "invented": self.invented,
            "second_input_shapes": self.second_input_shapes, "input_note": self.input_note,
            "random_integers": self.random_integers,
            "culprits": self.culprits, "culprit_search": self.culprit_search, "remainder": self.remainder,
            "layers": self.layers,
            "max_abs_error": _finite(max((o.max_abs_error for o in self.outputs), default=None)),
            "max_rel_error": _finite(max((o.max_rel_error for o in self.outputs), default=None)),
            "outputs": [{k: _finite(v) if isinstance(v, float) else v for k, v in o.__dict__.items()}
                        for o in self.outputs],  # worst_group's values are finite (or None) by construction
        }


def _finite(x: float | None) -> float | None:
    """``x`` unless it is inf or NaN (JSON has neither), else None."""
    return x if x is None or np.isfinite(x) else None
