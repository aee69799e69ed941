"""What a verification is asked to do: its inputs, its tolerance rule and its budget (``VerifyOptions``): work in
CPU seconds, with a wall-clock safety stop."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from onnxfuse.errors import InputError
from onnxfuse.verification.rule import FLOOR_MULTIPLE

#: Default number of input sets, as Polygraphy's default. More sets exercise more values (channels that ReLU
#: kills on one input, other branches), at one more onnxruntime run per model per set.
DEFAULT_INPUT_SETS = 1

#: Default work budget of one verification, in CPU seconds of this process (``--verify-budget``): every
#: onnxruntime session built and run of it together, with the comparison with onnxruntime's own graphs that
#: ``optimize`` makes in the same budget. CPU time, not wall time: the same model uses about the same CPU time
#: however loaded the machine is, so the verdict does not depend on the load. Verifying the shared models takes
#: 0.3-6 CPU s and a 1,600-block synthetic ResNet (239 MB) about 15 (BENCHMARKS.md); a model that needs more is very
#: large (raise it) or never ends (a Loop of 10^12 iterations), and either way verification stops with status
#: ``skipped``, cause ``work``, instead of running on.
DEFAULT_WORK_S = 600.0

#: Default wall-clock safety stop of one verification, in seconds (``--verify-timeout``): for what the work
#: budget cannot see (a run that waits without using CPU) or a machine so loaded that the work budget would take
#: hours of wall time. Far above what the default work budget takes on a loaded machine, so that it is reached
#: only then; when it is, verification stops with status ``skipped``, cause ``time``.
DEFAULT_TIMEOUT_S = 1800.0


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
        work: CPU seconds of this process for every onnxruntime session and run of the verification together
            (DEFAULT_WORK_S; ``onnxfuse.verification.run.Budget``); None: no limit. When spent the result is
            ``skipped`` with ``cause`` ``work``, the same way on a loaded machine as on an idle one.
        timeout: wall-clock seconds, a safety stop beside ``work`` (DEFAULT_TIMEOUT_S); None: no limit. When it
            runs out the result is ``skipped`` with ``cause`` ``time``.
        index_inputs: floating-point inputs used as indices, with their bound
            (:class:`onnxfuse.ort.sessions.InputSpec` ``index_highs``; ``pipeline.optimize`` finds them with
            :func:`onnxfuse.model.indices.float_index_inputs`).
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
    index_inputs: dict[str, int] = field(default_factory=dict)
    work: float | None = DEFAULT_WORK_S

    @property
    def explicit_tolerance(self) -> bool:
        """True when ``rtol``/``atol`` replace the noise-floor rule."""
        return self.rtol is not None or self.atol is not None


def timeout_seconds(value: float | None) -> float | None:
    """``VerifyOptions.timeout`` from ``--verify-timeout`` / the API's ``verify_timeout``: None gives
    DEFAULT_TIMEOUT_S, 0 no limit (None).

    Raises:
        InputError: a negative or non-finite value.
    """
    return _limit(value, DEFAULT_TIMEOUT_S, "verify timeout", "seconds")


def work_seconds(value: float | None) -> float | None:
    """``VerifyOptions.work`` from ``--verify-budget`` / the API's ``verify_budget``: None gives DEFAULT_WORK_S,
    0 no limit (None).

    Raises:
        InputError: a negative or non-finite value.
    """
    return _limit(value, DEFAULT_WORK_S, "verify budget", "CPU seconds")


def _limit(value: float | None, default: float, what: str, unit: str) -> float | None:
    """A limit in ``unit`` as given: None -> ``default``, 0 -> None (no limit), else the number as a float.

    Raises:
        InputError: a negative or non-finite value, or one that is not a number (naming ``what``).
    """
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InputError(f"{what}: expected a number of {unit} >= 0 (0: no limit), got {value!r}")
    return float(value) or None


#: ``VerifyOptions`` fields that no command or API argument sets: ``floor_multiple`` (the noise-floor rule's
#: multiple, for tests of the rule) and ``index_inputs`` (found in the model by ``pipeline.optimize``).
#: ``tests/test_options_record.py`` checks that every other field is reachable from ``optimize`` on the command
#: line, in the API and in ``batch``, or refused there by name.
LIBRARY_ONLY_VERIFY_OPTIONS = ("floor_multiple", "index_inputs")


def make_verify_options(*, input_shapes: dict[str, tuple[int, ...]] | None = None, input_data: str | None = None,
                        input_values: dict[str, float] | None = None,
                        input_ranges: dict[str, tuple[float, float]] | None = None,
                        input_sets: int = DEFAULT_INPUT_SETS, rtol: float | None = None, atol: float | None = None,
                        verify_timeout: float | None = None, verify_budget: float | None = None) -> VerifyOptions:
    """The one way :class:`VerifyOptions` are built from what a user gave (``--input-data``, ``--input-value``,
    ``--input-range``, ``--input-sets``, ``--rtol``, ``--atol``, ``--verify-timeout``, ``--verify-budget``; the
    CLI, the API's ``optimize`` / ``verify`` and ``batch``'s workers), each checked the same way. Values are already
    parsed
    (the CLI parses its text first); ``verify_timeout`` None: :data:`DEFAULT_TIMEOUT_S`, 0: no limit;
    ``verify_budget`` (CPU seconds) None: :data:`DEFAULT_WORK_S`, 0: no limit (:func:`work_seconds`).

    Raises:
        InputError: ``input_sets`` not an int >= 1; a value not a finite number; a range not two finite numbers,
            low <= high, with a finite span; ``rtol`` or ``atol`` neither None nor a finite number >= 0; a
            negative or non-finite ``verify_timeout`` or ``verify_budget``.
    """
    def number(x) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

    for label, tolerance in (("--rtol", rtol), ("--atol", atol)):
        if tolerance is not None and not (number(tolerance) and tolerance >= 0):
            raise InputError(f"{label}: expected a finite number >= 0 or None, got {tolerance!r}")
    if isinstance(input_sets, bool) or not isinstance(input_sets, int) or input_sets < 1:
        raise InputError(f"--input-sets: expected an integer >= 1, got {input_sets!r}")
    for name, value in (input_values or {}).items():
        if not number(value):
            raise InputError(f"--input-value {name}: expected a finite number, got {value!r}")
    for name, pair in (input_ranges or {}).items():
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and all(number(v) for v in pair)
                and pair[0] <= pair[1] and math.isfinite(pair[1] - pair[0])):
            raise InputError(f"--input-range {name}: expected (low, high), finite numbers with low <= high, "
                             f"got {pair!r}")
    return VerifyOptions({k: tuple(v) for k, v in (input_shapes or {}).items()},
                         None if input_data is None else str(input_data), dict(input_values or {}),
                         {k: (v[0], v[1]) for k, v in (input_ranges or {}).items()}, input_sets, rtol=rtol, atol=atol,
                         timeout=timeout_seconds(verify_timeout), work=work_seconds(verify_budget))
