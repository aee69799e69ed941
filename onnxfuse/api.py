"""The Python API for export scripts: :func:`optimize`, :func:`analyse` and :func:`verify`.

Same defaults as the ``onnxfuse`` command (verification included). The functions never print, never modify the
caller's ``ModelProto`` or file, and raise :class:`~onnxfuse.errors.InputError` (the CLI's exit code 2) or
:class:`~onnxfuse.errors.VerificationError` (exit code 1)::

    import onnx, onnxfuse

    model = onnx.load("model.onnx")
    result = onnxfuse.optimize(model, target="cpu", input_shapes={"x": (1, 3, 640, 640)}, name="detector")
    result.save("model.fused.onnx")  # atomic, external data kept (onnx.save would inline weights over 2 GB)
    print(result.report.saved_bytes_beyond_onnxruntime, result.report.to_markdown())
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from onnxfuse.errors import InputError, VerificationError
from onnxfuse.ort.levels import DEFAULT_ORT_LEVEL
from onnxfuse.ort.providers import DEFAULT_TARGET

if TYPE_CHECKING:
    import onnx

    from onnxfuse.model.io import LoadedModel
    from onnxfuse.pipeline import Options, Result
    from onnxfuse.report.model import Report
    from onnxfuse.verification.result import Verification

def _load(model, name: str | None = None) -> LoadedModel:
    from onnxfuse.model import io as model_io

    loaded = model_io.load_model(model) if isinstance(model, (str, os.PathLike)) else model_io.load_proto(model)
    loaded.name = name
    return loaded


def _shapes(input_shapes: Mapping[str, Iterable[int]] | None, label: str = "input_shapes"
            ) -> dict[str, tuple[int, ...]]:
    if input_shapes is not None and not isinstance(input_shapes, Mapping):
        raise InputError(f"{label}: expected a mapping of input name to dims, got {type(input_shapes).__name__}")
    out: dict[str, tuple[int, ...]] = {}
    for name, dims in (input_shapes or {}).items():
        try:
            if any(isinstance(d, float) and not float(d).is_integer() for d in dims):
                raise ValueError("not an integer")
            shape = tuple(int(d) for d in dims)
        except (TypeError, ValueError):
            raise InputError(f"{label}[{name!r}]: expected a sequence of integers, got {dims!r}") from None
        if any(d <= 0 for d in shape):
            raise InputError(f"{label}[{name!r}]: dims must be positive, got {list(shape)}")
        out[str(name)] = shape
    return out


def _options(target: str, input_shapes, only, skip, constant_initializer_inputs: bool, ort_level: str,
             ort_version: str | None = None, materialize_weights: float = 0.0, bandwidth: float | None = None,
             **more) -> Options:
    """The API's keyword arguments as ``pipeline.Options``, built by ``pipeline.make_options`` as the command line
    and batch build them (``input_shapes`` and ``more["fix_input_shapes"]`` checked here: the API takes integers,
    the CLI text). ``more``: the other ``make_options`` keywords (``plugins``, ``input_data``, ``drop_culprits``,
    ``compare_layers``, ``verify``)."""
    from onnxfuse.pipeline import make_options

    if "fix_input_shapes" in more:
        more["fix_input_shapes"] = _shapes(more["fix_input_shapes"], "fix_input_shapes")
    return make_options(target=target, only=only, skip=skip, input_shapes=_shapes(input_shapes),
                        constant_initializer_inputs=constant_initializer_inputs, ort_level=ort_level,
                        ort_version=ort_version, materialize_weights=materialize_weights, bandwidth=bandwidth,
                        **more)


def _verify_options(input_shapes, input_data, input_values, input_ranges, input_sets, rtol, atol, verify_timeout,
                    verify_budget=None):
    """The API's verification arguments as ``VerifyOptions``, built by
    ``verification.options.make_verify_options`` as the command line and batch build them.

    Raises:
        InputError: as ``make_verify_options``.
    """
    from onnxfuse.verification.options import make_verify_options

    return make_verify_options(input_shapes=input_shapes, input_data=None if input_data is None else str(input_data),
                               input_values=input_values, input_ranges=input_ranges, input_sets=input_sets,
                               rtol=rtol, atol=atol, verify_timeout=verify_timeout, verify_budget=verify_budget)


#: The command's option names -> this API's keyword arguments, for messages raised by code the two share.
_KEYWORDS = {"--input-shape": "input_shapes", "--input-value": "input_values", "--input-range": "input_ranges",
             "--input-data": "input_data", "--input-sets": "input_sets", "--target": "target",
             "--ort-level": "ort_level", "--ort-version": "ort_version", "--only": "only", "--skip": "skip",
             "--rtol": "rtol", "--atol": "atol", "--require-verify": "require_verify",
             "--verify-timeout": "verify_timeout", "--verify-budget": "verify_budget",
             "--constant-initializer-inputs": "constant_initializer_inputs",
             "--no-verify": "verify=False", "--plugin": "plugins",
             "--fix-input-shape": "fix_input_shapes", "--drop-culprits": "drop_culprits",
             "--materialize-weights": "materialize_weights", "--bandwidth": "bandwidth",
             "--layers": "compare_layers", "--tune": "tune", "--tune-budget": "tune_budget", "--threads": "threads"}
_OPTION = re.compile("|".join(re.escape(k) for k in sorted(_KEYWORDS, key=len, reverse=True)) + r"(?![\w-])")


def _in_api_terms(fn):
    """Re-raise the library's errors with the command's option names replaced by this API's keyword arguments
    (``--input-shape`` -> ``input_shapes``): the same exception object, its message rewritten."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (InputError, VerificationError) as exc:
            if exc.args and isinstance(exc.args[0], str):
                exc.args = (_OPTION.sub(lambda m: _KEYWORDS[m.group(0)], exc.args[0]), *exc.args[1:])
            raise

    return wrapper


@_in_api_terms
def analyse(model: onnx.ModelProto | str | os.PathLike[str], *, target: str = DEFAULT_TARGET,
            input_shapes: Mapping[str, Iterable[int]] | None = None, only: Iterable[str] = (),
            skip: Iterable[str] = (), constant_initializer_inputs: bool = False,
            ort_level: str = DEFAULT_ORT_LEVEL, ort_version: str | None = None, name: str | None = None,
            plugins: Iterable = (), fix_input_shapes: Mapping[str, Iterable[int]] | None = None,
            materialize_weights: float = 0.0, bandwidth: float | None = None,
            input_data: str | os.PathLike[str] | None = None) -> Report:
    """The memory-traffic report of what :func:`optimize` would do to ``model``; no rewrite is kept, nothing
    is verified. What ``onnxfuse report`` prints.

    Args:
        model: an ``onnx.ModelProto`` (external data loaded) or the path of a ``.onnx`` file.
        target: ``cpu+cuda`` (default), ``cpu``, ``cuda`` or ``onnx`` (see ``onnxfuse.ort.providers.TARGETS``).
        input_shapes: graph input name -> concrete dims for symbolic dims, e.g. ``{"x": (1, 3, 640, 640)}``.
        only / skip: pass names to run exclusively / leave out (``onnxfuse passes`` lists them).
        constant_initializer_inputs: treat initializers that are also graph inputs as constants.
        ort_level: the onnxruntime graph optimization level your sessions run at (``disable``, ``basic``,
            ``extended``, ``all``; onnxruntime's default is ``all``): forms measured slower than the unfused
            graph at that level are not emitted (``onnxfuse.ort.providers``, BENCHMARKS.md).
        ort_version: the onnxruntime release the model will run on, ``"1.20"`` (default: the installed one):
            forms that release cannot load are not emitted (``providers.FORM_MIN_ORT``); the report's
            ``deployment`` section and the model's ``onnxfuse.min_onnxruntime`` metadata name the oldest release
            that loads the result.
        name: what the report calls the model (its title, ``model.path`` in JSON); default: the path, or
            ``<ModelProto>`` for a ModelProto.
        plugins: passes from outside onnxfuse, run besides the installed ones (entry point group
            ``onnxfuse.passes``): each a ``"module:Name"`` string, a subclass of ``onnxfuse.passes.plugin.Pass`` or
            an instance (``onnxfuse.passes.plugin``; ``only``/``skip`` name them too).
        fix_input_shapes: graph input name -> dims to write into the output model's inputs (``--fix-input-shape``:
            a static model; what becomes constant is folded, and analysis and verification use these sizes).
        materialize_weights: MiB (2**20 bytes) the model may grow by where conv/Gemm weights computed from
            compact constants (int8 x scale, ConstantOfShape) are stored as plain floats (``--materialize-weights``;
            default 0: they stay compact).
        bandwidth: GB/s (10^9 bytes per second): the report's ``bandwidth`` then has the estimated memory time
            (bytes / bandwidth, ``report.model.bandwidth_section``) of both models (``--bandwidth``).
        input_data: an ``.npz`` with one array per graph input name (``report --input-data``): its arrays' shapes
            are the report's input shapes.

    Raises:
        InputError: an unreadable or invalid model, an unknown target or pass, bad ``input_shapes``, a negative
            or infinite ``materialize_weights``; a plugin that cannot be loaded or breaks the pass contract
            (``onnxfuse.passes.plugin.PluginError``, one line naming it).
    """
    from onnxfuse import pipeline

    options = _options(target, input_shapes, only, skip, constant_initializer_inputs, ort_level, ort_version,
                       materialize_weights, bandwidth, plugins=plugins, fix_input_shapes=fix_input_shapes,
                       input_data=input_data)
    loaded = _load(model, name)
    return pipeline.analyse(loaded.path, options, loaded).report


@_in_api_terms
def optimize(model: onnx.ModelProto | str | os.PathLike[str], *, target: str = DEFAULT_TARGET,
             input_shapes: Mapping[str, Iterable[int]] | None = None, verify: bool = True,
             require_verify: bool = False, input_data: str | os.PathLike[str] | None = None,
             input_values: Mapping[str, float] | None = None,
             input_ranges: Mapping[str, tuple[float, float]] | None = None, input_sets: int = 1,
             rtol: float | None = None, atol: float | None = None, only: Iterable[str] = (),
             skip: Iterable[str] = (), constant_initializer_inputs: bool = False,
             ort_level: str = DEFAULT_ORT_LEVEL, verify_timeout: float | None = None,
             ort_version: str | None = None, name: str | None = None, plugins: Iterable = (),
             fix_input_shapes: Mapping[str, Iterable[int]] | None = None, drop_culprits: bool = False,
             materialize_weights: float = 0.0, bandwidth: float | None = None,
             compare_layers: bool = False, tune: bool = False, tune_budget: float | None = None,
             threads: int = 1, verify_budget: float | None = None) -> Result:
    """Fold and fuse ``model`` for ``target`` and verify the result against the original in onnxruntime.

    What ``onnxfuse optimize`` does, without writing a file (``result.save(path)`` writes it as the command does).

    Args:
        model: an ``onnx.ModelProto`` (external data loaded; it is not modified) or the path of a ``.onnx`` file.
        target, input_shapes, only, skip, constant_initializer_inputs, ort_level, ort_version, name, plugins,
            fix_input_shapes, materialize_weights, bandwidth: as :func:`analyse` (a plugin's rewrites are
            verified as every other rewrite is).
        verify: run the original and the optimized model in onnxruntime (graph optimizations disabled on both)
            and compare the outputs; False records verification as skipped and, as ``--no-verify``, makes no
            onnxruntime session at all: no comparison with onnxruntime's own graphs either, so
            ``report.saved_bytes_beyond_onnxruntime`` is None (unknown) where something was fused.
        require_verify: raise :class:`VerificationError` when verification was skipped (say, onnxruntime
            cannot run the original on generated inputs) or ``partial`` (an output had nothing to compare on any
            input set: NaN/inf or empty on both sides).
        input_data: an ``.npz`` with one array per graph input name, used instead of random inputs.
        input_values / input_ranges / input_sets: a fill value or a ``(low, high)`` range per input name (say
            ``{"sr": 16000}``), and how many seeded input sets to compare on (see docs/reference.md, "Verification").
        rtol / atol: elementwise tolerances that replace the noise-floor rule (see docs/reference.md, "Verification").
        verify_budget: CPU seconds of this process for the verification and the comparison with onnxruntime's
            graphs together (None: ``onnxfuse.verification.options.DEFAULT_WORK_S``, 600; 0: no limit); counted
            in CPU time, so the verdict is the same on a loaded machine; when spent verification is ``skipped``
            with ``cause`` ``"work"`` (a :class:`VerificationError` with ``require_verify``).
        verify_timeout: wall-clock seconds, a safety stop beside ``verify_budget`` (None:
            ``onnxfuse.verification.options.DEFAULT_TIMEOUT_S``, 1800; 0: no limit); when reached verification is
            ``skipped`` with ``cause`` ``"time"``.
        drop_culprits: when verification fails, onnxfuse searches its rewrite sites for those that broke it
            (within ``verify_timeout``; ``verification.culprits`` names them either way) and verifies the model
            with them left unfused; True returns that model with its ``passed`` verification (culprits named)
            instead of raising. False (default): :class:`VerificationError`, its ``.result`` holding the verified
            remainder (docs/reference.md, "When verification fails").
        compare_layers: when verification fails, also compare the failing model with the original tensor by
            tensor (``--layers``) into ``verification.layers``.
        tune: time each group of rewrites (one pass, one emitted form) in the installed onnxruntime at
            ``ort_level`` with ``threads`` intra-op threads (CPU provider) on ``input_shapes`` (else the
            representative sizes), against the model with the group left unfused, and leave it unfused when the
            model is faster without it beyond the interval (``--tune``, :mod:`onnxfuse.tune`; the report's
            ``tune`` section, reason ``slower-when-measured``). Default False: the rule-based choice.
        tune_budget: seconds for all groups together (passes rerun, sessions, rounds; None:
            ``pipeline.DEFAULT_TUNE_BUDGET_S``, 60); threads: onnxruntime intra-op threads of the timed sessions.

    Returns:
        A :class:`onnxfuse.pipeline.Result`: ``model`` (the optimized ``ModelProto``), ``report`` (the
        :class:`onnxfuse.report.model.Report`, its ``verification`` filled in), ``changed``, ``fusions``, ``skips``.

    Raises:
        InputError: as :func:`analyse`, or unreadable ``input_data``.
        VerificationError: an output differs beyond tolerance, or onnxruntime cannot run the optimized model
            (``.result`` holds the failing result and its report), or ``require_verify`` and it was skipped.
    """
    from onnxfuse import tune as tuning
    from onnxfuse.pipeline import DEFAULT_TUNE_BUDGET_S

    # input_data: real inputs fix the report's shapes too; verify=False: no onnxruntime session (as --no-verify)
    options = _options(target, input_shapes, only, skip, constant_initializer_inputs, ort_level, ort_version,
                       materialize_weights, bandwidth, plugins=plugins, fix_input_shapes=fix_input_shapes,
                       input_data=input_data, drop_culprits=drop_culprits, compare_layers=compare_layers,
                       verify=bool(verify), tune=tune,
                       tune_budget=DEFAULT_TUNE_BUDGET_S if tune_budget is None else tune_budget, threads=threads)
    checked = _verify_options(options.input_shapes, input_data, input_values, input_ranges, input_sets, rtol, atol,
                              verify_timeout, verify_budget)
    loaded = _load(model, name)
    verify_options = checked if verify else None
    result = tuning.optimize(loaded.path, options, verify_options, loaded=loaded)
    _check_verified(result, loaded.label, require_verify)
    return result


def _check_verified(result: Result, label: str, require_verify: bool) -> None:
    """Raise :class:`VerificationError` (``.result`` holding ``result``) when the verification of :func:`optimize`
    failed, or was skipped or partial (an output not compared) and ``require_verify`` was set."""
    verification = result.report.verification
    if verification.status == "failed":
        raise VerificationError(f"{label}: the optimized model does not match the original "
                                f"({verification.reason})", result)
    if verification.status in ("skipped", "partial") and require_verify:
        raise VerificationError(f"{label}: verification was {verification.status} ({verification.reason}) "
                                "and require_verify was set", result)


@_in_api_terms
def verify(original: onnx.ModelProto | str | os.PathLike[str], candidate: onnx.ModelProto | str | os.PathLike[str],
           *, input_shapes: Mapping[str, Iterable[int]] | None = None,
           input_data: str | os.PathLike[str] | None = None, input_values: Mapping[str, float] | None = None,
           input_ranges: Mapping[str, tuple[float, float]] | None = None, input_sets: int = 1,
           rtol: float | None = None, atol: float | None = None, verify_timeout: float | None = None,
           verify_budget: float | None = None) -> Verification:
    """Compare ``candidate`` with ``original`` in onnxruntime (graph optimizations disabled on both), on the
    same generated (or ``input_data``) inputs; any pair of models, e.g. another optimizer's output.

    Arguments after ``candidate`` are as :func:`optimize`'s (``verify_budget`` and ``verify_timeout`` too: when
    they run out the result is ``skipped`` with ``cause`` ``"work"`` or ``"time"``); the rule is
    docs/reference.md's "Verification" (:func:`onnxfuse.verification.verify.verify_models`).

    Returns:
        An ``onnxfuse.verification.result.Verification``: ``status`` is ``passed``, ``failed``, ``partial`` (every
        output compared passed, but ``reason`` names one with nothing to compare on any input set) or ``skipped``
        (with ``reason``); ``outputs`` has the error of each output, onnxruntime's noise floor and the tolerance
        applied. It does not raise on ``failed``: check ``status``.

    Raises:
        InputError: an unreadable or invalid model, unreadable ``input_data``, a negative ``verify_timeout``
            or ``verify_budget``.
    """
    from onnxfuse.verification.verify import verify_models

    opts = _verify_options(_shapes(input_shapes), input_data, input_values, input_ranges, input_sets, rtol, atol,
                           verify_timeout, verify_budget)
    ref = _load(original)
    cand = _load(candidate).model
    assert cand is not None  # a model just loaded; only pipeline.analyse sets it to None
    return verify_models(ref.ort_source(), cand, opts)


@_in_api_terms
def profile(result: Result, *, ort_level: str | None = None, runs: int = 16, max_time: float = 10.0,
            timeout: float | None = None) -> Report:
    """``onnxfuse report --profile`` for a :func:`optimize` result: the original and ``result.model`` under
    onnxruntime's profiler at ``ort_level`` (per op and per fusion: ms and the bytes the profiler records) and
    timed in ``onnxfuse bench``'s paired ABBA rounds (at least ``runs``, at most ``max_time`` seconds of them;
    ``profile["timing"]``: the ratio optimized / original with its distribution-free interval and bench's verdict,
    ``inconclusive`` where the rounds do not decide). Source: ``onnxfuse.bench.report_profile``.

    Returns:
        A copy of ``result.report`` with its ``profile`` section (``result`` is not changed). ``ort_level``
        None: the level of the report's comparison with onnxruntime, else ``all``. Symbolic dims run at the
        report's input shapes, else at the representative sizes (``Report.figure_sizes``). ``timeout``: seconds
        for the profiler's runs of both models (``--profile-timeout``; None: no limit); the paired rounds stop
        at ``max_time``.

    Raises:
        InputError: an unknown ``ort_level``.
        RuntimeError: onnxruntime cannot load or run one of the models (the message says which).
        onnxfuse.ort.profile.ProfileTimeout: the profiler's runs did not end within ``timeout``.
    """
    from onnxfuse.bench import report_profile
    from onnxfuse.ort.levels import ORT_LEVELS
    from onnxfuse.report.model import with_profile

    report = result.report
    level = ort_level or (report.onnxruntime or {}).get("level") or DEFAULT_ORT_LEVEL
    if level not in ORT_LEVELS:
        raise InputError(f"--ort-level: {level!r} is not one of {', '.join(ORT_LEVELS)}")
    section = report_profile(result.loaded.ort_source(), result.model, report.to_dict()["fusions"], level,
                             {k: tuple(v) for k, v in report.input_shapes.items()}, runs=runs, max_time=max_time,
                             timeout=timeout)
    return with_profile(report, section)

