"""Numerical verification: run the original and the optimized model in onnxruntime and compare every output.

Both sessions use the CPU execution provider with ``GraphOptimizationLevel.ORT_DISABLE_ALL``: with onnxruntime's
own fusions on, the original would be fused in memory the same way and a broken rewrite could compare equal.
Inputs are seeded random tensors of each input's dtype (or the arrays of ``--input-data``); an element passes
when ``|optimized - original| <= atol + rtol * |original|`` (numpy.isclose, NaN equal to NaN).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from onnxfuse import model_io
from onnxfuse.errors import InputError

#: Default (rtol, atol) per output dtype. Folding reorders float arithmetic (W * s rounded once instead of
#: conv-then-scale), so float32 outputs differ in the last few bits times the network's depth; float16 has
#: ~3 significant digits, so its tolerance is 100x looser.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-9),
    "float32": (1e-3, 1e-4),
    "float16": (1e-2, 1e-2),
    "bfloat16": (5e-2, 5e-2),
}
#: Exact comparison for integer and bool outputs.
EXACT = (0.0, 0.0)

#: Value used for a symbolic dim that neither ``--input-shape`` nor the model fixes: 1 for the first dim
#: (the batch), 32 elsewhere (large enough for a few stride-2 stages).
DEFAULT_BATCH_DIM = 1
DEFAULT_OTHER_DIM = 32

DEFAULT_SEEDS = (0, 1, 2)

#: onnxruntime log severity for onnxfuse's sessions: fatal only. Its own log lines (coloured, multi-line) would
#: break the one-line-error and no-colour promises; failures still arrive as exceptions that onnxfuse reports.
ORT_LOG_FATAL = 4

_ORT_TYPES = {
    "tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int16)": np.int16, "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8, "tensor(uint16)": np.uint16, "tensor(uint32)": np.uint32,
    "tensor(uint64)": np.uint64, "tensor(bool)": np.bool_,
}


@dataclass
class VerifyOptions:
    """How to verify.

    Attributes:
        input_shapes: graph input name -> dims for symbolic dims.
        input_data: path of an ``.npz`` whose arrays (named like the graph inputs) replace random inputs.
        seeds: one random input set per seed (ignored for inputs given in ``input_data``).
        rtol / atol: override the per-dtype defaults for every output when not None.
    """

    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    input_data: str | None = None
    seeds: tuple[int, ...] = DEFAULT_SEEDS
    rtol: float | None = None
    atol: float | None = None


@dataclass
class OutputDiff:
    """Comparison of one output over every input set.

    Attributes:
        name / dtype / shape: the output (shape of the last input set).
        max_abs_error: max |optimized - original|.
        max_rel_error: max |optimized - original| / |original| over elements where |original| > atol.
        rtol / atol: the tolerance applied.
        needed_atol: the smallest atol that would have passed with this rtol.
        passed: every element within tolerance.
    """

    name: str
    dtype: str
    shape: list[int]
    max_abs_error: float
    max_rel_error: float
    rtol: float
    atol: float
    needed_atol: float
    passed: bool


@dataclass
class Verification:
    """Result of :func:`verify`. ``status`` is ``passed``, ``failed`` or ``skipped`` (with ``reason``)."""

    status: str
    reason: str | None = None
    outputs: list[OutputDiff] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    input_shapes: dict[str, list[int]] = field(default_factory=dict)

    @classmethod
    def skipped_by_user(cls) -> Verification:
        """The result for ``--no-verify``."""
        return cls("skipped", "verification disabled with --no-verify")

    @property
    def failed_outputs(self) -> list[OutputDiff]:
        """The outputs that differ beyond tolerance."""
        return [o for o in self.outputs if not o.passed]

    def to_dict(self) -> dict[str, Any]:
        """JSON form (see report.schema.json, ``verification``)."""
        return {
            "status": self.status, "reason": self.reason, "seeds": self.seeds, "input_shapes": self.input_shapes,
            "max_abs_error": _finite(max((o.max_abs_error for o in self.outputs), default=None)),
            "max_rel_error": _finite(max((o.max_rel_error for o in self.outputs), default=None)),
            "outputs": [{k: _finite(v) if isinstance(v, float) else v for k, v in o.__dict__.items()}
                        for o in self.outputs],
        }


def _finite(x: float | None) -> float | None:
    """``x`` unless it is inf or NaN (JSON has neither), else None."""
    return x if x is None or np.isfinite(x) else None


def session(model: str | bytes, level: str = "disable", threads: int | None = None, save_to: str | None = None,
            profile_prefix: str | None = None) -> Any:
    """An onnxruntime CPU ``InferenceSession`` for a model path or serialized bytes.

    Args:
        level: graph optimization level: ``disable``, ``basic``, ``extended`` or ``all``.
        threads: intra-op threads (inter-op is then 1); None keeps onnxruntime's default.
        save_to: write the graph onnxruntime optimized to this path (``optimized_model_filepath``).
        profile_prefix: turn profiling on, writing the profile under this prefix.
    """
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[level]
    opts.log_severity_level = ORT_LOG_FATAL
    if threads is not None:
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
    if save_to:
        opts.optimized_model_filepath = save_to
    if profile_prefix:
        opts.enable_profiling = True
        opts.profile_file_prefix = profile_prefix
    return ort.InferenceSession(model, sess_options=opts, providers=["CPUExecutionProvider"])


def make_inputs(sess, input_shapes: dict[str, tuple[int, ...]], seed: int,
                given: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Seeded random inputs for every input of ``sess``: floats ~ N(0, 1), integers in [0, 4), random bools;
    arrays in ``given`` are used as they are. A named symbolic dim gets one value across all inputs: the one an
    ``input_shapes`` entry or a given array fixes, else DEFAULT_BATCH_DIM (first dim) or DEFAULT_OTHER_DIM.

    Raises:
        ValueError: an input dtype onnxfuse cannot generate.
        InputError: a given array whose dtype is not the input's.
    """
    rng = np.random.default_rng(seed)
    inputs = sess.get_inputs()
    # One value per named symbolic dim: what --input-shape or --input-data gave for it, else the default.
    bound: dict[str, int] = {}
    for inp in inputs:
        dims = input_shapes.get(inp.name) or (given[inp.name].shape if given and inp.name in given else None)
        if dims is not None and len(dims) == len(inp.shape):
            for d, v in zip(inp.shape, dims, strict=False):
                if isinstance(d, str) and d:
                    bound.setdefault(d, int(v))
    for inp in inputs:  # a name that is some input's first dim is a batch dim everywhere
        if inp.shape and isinstance(inp.shape[0], str) and inp.shape[0]:
            bound.setdefault(inp.shape[0], DEFAULT_BATCH_DIM)
    feeds = {}
    for inp in inputs:
        dtype = _ORT_TYPES.get(inp.type)
        if given and inp.name in given:
            if dtype is not None and given[inp.name].dtype != dtype:
                raise InputError(f"input data {inp.name}: dtype {given[inp.name].dtype}, the model wants "
                                 f"{np.dtype(dtype)}")
            feeds[inp.name] = given[inp.name]
            continue
        if dtype is None:
            raise ValueError(f"input {inp.name} has type {inp.type}, which onnxfuse cannot generate")
        shape = input_shapes.get(inp.name) or tuple(
            d if isinstance(d, int) and d > 0
            else bound.get(d, DEFAULT_BATCH_DIM if i == 0 else DEFAULT_OTHER_DIM)
            for i, d in enumerate(inp.shape))
        if np.issubdtype(dtype, np.floating):
            feeds[inp.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[inp.name] = rng.integers(0, 2, shape).astype(np.bool_)
        else:
            feeds[inp.name] = rng.integers(0, 4, shape).astype(dtype)
    return feeds


def _compare(name: str, ref: np.ndarray, got: np.ndarray, opts: VerifyOptions) -> OutputDiff:
    kind = str(ref.dtype)
    default = DEFAULT_TOLERANCES.get(kind, EXACT if not np.issubdtype(ref.dtype, np.floating) else (1e-3, 1e-4))
    rtol = opts.rtol if opts.rtol is not None else default[0]
    atol = opts.atol if opts.atol is not None else default[1]
    if ref.shape != got.shape:
        return OutputDiff(name, kind, list(ref.shape), float("inf"), float("inf"), rtol, atol, float("inf"),
                          False)
    if ref.size == 0:
        return OutputDiff(name, kind, list(ref.shape), 0.0, 0.0, rtol, atol, 0.0, True)
    r, g = ref.astype(np.float64), got.astype(np.float64)
    both_nan = np.isnan(r) & np.isnan(g)
    diff = np.where(both_nan, 0.0, np.abs(r - g))
    diff = np.where(np.isnan(diff), np.inf, diff)
    nz = np.abs(r) > max(atol, np.finfo(np.float32).tiny)  # relative error is meaningless near zero
    rel = float(np.max(diff[nz] / np.abs(r[nz]))) if nz.any() else 0.0
    needed = float(np.max(np.maximum(diff - rtol * np.abs(np.nan_to_num(r)), 0.0)))
    passed = bool(np.all(np.isclose(g, r, rtol=rtol, atol=atol, equal_nan=True)))
    return OutputDiff(name, kind, list(ref.shape), float(np.max(diff)), rel, rtol, atol, needed, passed)


def _merge(a: OutputDiff, b: OutputDiff) -> OutputDiff:
    return OutputDiff(a.name, a.dtype, b.shape, max(a.max_abs_error, b.max_abs_error),
                      max(a.max_rel_error, b.max_rel_error), a.rtol, a.atol, max(a.needed_atol, b.needed_atol),
                      a.passed and b.passed)


def _load_npz(path: str) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError) as exc:
        raise InputError(f"--input-data {path}: cannot read it as .npz ({exc})") from None


def verify(original: str | os.PathLike | bytes, optimized: onnx.ModelProto, opts: VerifyOptions) -> Verification:
    """Compare ``optimized`` with the model file ``original`` on every input set.

    Returns ``skipped`` (with the reason) when onnxruntime cannot load or run the *original*; ``failed`` when
    the optimized model cannot be loaded or run while the original can, or an output differs beyond tolerance.

    Raises:
        InputError: ``opts.input_data`` is unreadable or names no graph input.
    """
    given = _load_npz(opts.input_data) if opts.input_data else None
    try:
        ref_sess = session(original if isinstance(original, bytes) else str(original))
    except Exception as exc:
        return Verification("skipped", f"onnxruntime cannot load the original: {_short(exc)}")
    if given:
        names = {i.name for i in ref_sess.get_inputs()}
        unknown = sorted(set(given) - names)
        if unknown:
            raise InputError(f"--input-data {opts.input_data}: no graph input named {', '.join(unknown)} "
                             f"(inputs: {', '.join(sorted(names))})")
    with tempfile.TemporaryDirectory(prefix="onnxfuse-verify-") as tmp:
        try:
            if model_io.exceeds_protobuf_limit(optimized):
                path = Path(tmp) / "optimized.onnx"
                model_io.save_model(optimized, path, external_data=True)
                try:
                    opt_sess = session(str(path))
                finally:  # saving moved the weights out of the proto into the file: take them back
                    onnx.load_external_data_for_model(optimized, tmp)
            else:
                opt_sess = session(optimized.SerializeToString())
        except Exception as exc:
            return Verification("failed", f"onnxruntime cannot load the optimized model: {_short(exc)}")
        diffs: dict[str, OutputDiff] = {}
        seeds = [0] if given and set(given) >= {i.name for i in ref_sess.get_inputs()} else list(opts.seeds)
        used_shapes = {}
        for seed in seeds:
            try:
                feeds = make_inputs(ref_sess, opts.input_shapes, seed, given)
            except ValueError as exc:
                return Verification("skipped", str(exc))
            except MemoryError:
                raise InputError(f"random inputs of shapes {opts.input_shapes} do not fit in memory; give "
                                 "smaller --input-shape values") from None
            used_shapes = {k: list(v.shape) for k, v in feeds.items()}
            try:
                ref = ref_sess.run(None, feeds)
            except Exception as exc:
                if given:
                    raise InputError(f"--input-data {opts.input_data}: onnxruntime cannot run the original on "
                                     f"it: {_short(exc)}") from None
                hint = _shape_hint(ref_sess, opts.input_shapes)
                return Verification("skipped", f"onnxruntime cannot run the original on inputs {used_shapes}: "
                                               f"{_short(exc)}{hint}", seeds=seeds, input_shapes=used_shapes)
            try:
                got = opt_sess.run(None, feeds)
            except Exception as exc:
                return Verification("failed", f"onnxruntime cannot run the optimized model: {_short(exc)}",
                                    seeds=seeds, input_shapes=used_shapes)
            for meta, r, o in zip(ref_sess.get_outputs(), ref, got, strict=False):
                d = _compare(meta.name, np.asarray(r), np.asarray(o), opts)
                diffs[meta.name] = _merge(diffs[meta.name], d) if meta.name in diffs else d
    outputs = list(diffs.values())
    status = "passed" if all(o.passed for o in outputs) else "failed"
    reason = None
    if status == "failed":
        reason = "; ".join(f"output {o.name}: max abs error {o.max_abs_error:.3g} > atol {o.atol:g} + rtol "
                           f"{o.rtol:g} * |ref| (would pass with --atol {o.needed_atol:.3g})"
                           for o in outputs if not o.passed)
    return Verification(status, reason, outputs, seeds, used_shapes)


def _shape_hint(sess, given: dict) -> str:
    symbolic = [i.name for i in sess.get_inputs()
                if i.name not in given and any(not isinstance(d, int) for d in i.shape)]
    if not symbolic:
        return ""
    return "; give --input-shape for " + ", ".join(symbolic)


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."
