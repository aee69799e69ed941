"""The one place where onnxfuse creates onnxruntime sessions and the inputs it feeds them.

Used by verification (:mod:`onnxfuse.verify`), ``onnxfuse bench`` (:mod:`onnxfuse.bench`) and shape measurement
(:func:`onnxfuse.analysis.shapes.measure`). Every session uses the CPU execution provider and logs only fatal errors.

Generated inputs (:func:`make_inputs`): each graph input gets, in this order of preference, the array of an
``.npz`` file (``--input-data``), a constant fill value (``--input-value NAME=V``), seeded uniform values in a
range (``--input-range NAME=LO,HI``), or seeded random values: floats ~ N(0, 1), integers in [0, 4), random
bools.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from onnxfuse.analysis.shapes import REPRESENTATIVE_BATCH, REPRESENTATIVE_SIZE
from onnxfuse.errors import InputError
from onnxfuse.ort.levels import GRAPH_OPTIMIZATION_LEVELS

#: Value used for a symbolic dim that neither ``--input-shape`` nor the model fixes: 1 for the first dim
#: (the batch), 224 elsewhere: the representative sizes every figure of a report is given at
#: (``onnxfuse.analysis.shapes.REPRESENTATIVE_BATCH`` / ``REPRESENTATIVE_SIZE``), so that a run without
#: ``--input-shape`` verifies, counts and draws at one size (224 = 7 x 32: a multiple of the stride of
#: detection/segmentation backbones with FPN concatenations).
DEFAULT_BATCH_DIM = REPRESENTATIVE_BATCH
DEFAULT_OTHER_DIM = REPRESENTATIVE_SIZE

#: Sizes of verification's second default input set, for the symbolic dims nobody gave (batch, other dims):
#: a rewrite that is wrong only for batch > 1 or for another spatial size computes the same as the original at
#: (1, 224). 64 keeps every dim a multiple of 32 (the stride of detection/segmentation backbones with FPN
#: concatenations), so a model that runs at 32 runs at 64 too.
SECOND_DIMS = (2, 64)

#: Random integers are drawn from [0, RANDOM_INT_HIGH): small enough to be valid indices and counts.
RANDOM_INT_HIGH = 4

#: onnxruntime log severity for onnxfuse's sessions: fatal only. Its own log lines (coloured, multi-line) would
#: break the one-line-error and no-colour promises; failures still arrive as exceptions that onnxfuse reports.
ORT_LOG_FATAL = 4


_ORT_TYPES = {
    "tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int16)": np.int16, "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8, "tensor(uint16)": np.uint16, "tensor(uint32)": np.uint32,
    "tensor(uint64)": np.uint64, "tensor(bool)": np.bool_,
}

#: onnxruntime input types that get random integers (or bools) when nobody gives their values.
EXACT_INPUT_TYPES = frozenset(t for t, d in _ORT_TYPES.items() if not np.issubdtype(d, np.floating))


@dataclass
class InputSpec:
    """What to feed a model, per graph input name.

    Attributes:
        shapes: dims for inputs with symbolic dims (``--input-shape``).
        data: arrays to feed as they are (``--input-data``).
        values: a constant that fills the input's shape (``--input-value``); a scalar input gets the scalar.
        ranges: ``(low, high)``: floats uniform in [low, high), integers uniform in [low, high] (``--input-range``).
        index_highs: floating-point inputs that the model uses as indices (``onnxfuse.model.indices``), each
            with the exclusive bound of valid indices: their random values are whole numbers in [0, bound)
            instead of normal floats (which ``Cast`` would make 0 almost everywhere).
    """

    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    data: dict[str, np.ndarray] = field(default_factory=dict)
    values: dict[str, float] = field(default_factory=dict)
    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    index_highs: dict[str, int] = field(default_factory=dict)

    def fixed(self) -> set[str]:
        """Names of the inputs whose values the user chose (data, value or range)."""
        return set(self.data) | set(self.values) | set(self.ranges)


def preload() -> None:
    """Import onnxruntime now (about 0.15 s), so that a long-lived worker pays it once, before its first model."""
    import onnxruntime  # noqa: F401


def session(model: str | os.PathLike | bytes, level: str = "disable", threads: int | None = None,
            save_to: str | None = None, profile_prefix: str | None = None, spinning: bool = True,
            config: dict[str, str] | None = None, trim: bool = False) -> Any:
    """An onnxruntime CPU ``InferenceSession`` for a model path or serialized bytes.

    Args:
        level: graph optimization level, a key of :data:`onnxfuse.ort.levels.GRAPH_OPTIMIZATION_LEVELS`.
        threads: intra-op threads (inter-op is then 1); None keeps onnxruntime's default.
        save_to: write the graph onnxruntime optimized to this path (``optimized_model_filepath``).
        profile_prefix: turn profiling on, writing the profile under this prefix.
        spinning: False sets ``session.intra_op.allow_spinning`` and ``session.inter_op.allow_spinning`` to 0
            (onnxruntime_session_options_config_keys.h): idle pool threads sleep instead of busy-waiting for
            work. Same results, less CPU time; busy-waiting only pays where a core is free for each thread.
        config: more session configuration entries (``add_session_config_entry``; keys from
            onnxruntime_session_options_config_keys.h).
        trim: hand freed heap pages back while onnxruntime builds the session (:func:`trimming`) and once it is
            built. Same session; a lower peak of resident memory, for some page faults more.

    Raises:
        whatever onnxruntime raises when it cannot load the model (callers turn it into a reason).
    """
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, GRAPH_OPTIMIZATION_LEVELS[level])
    opts.log_severity_level = ORT_LOG_FATAL
    if threads is not None:
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
    if save_to:
        opts.optimized_model_filepath = save_to
    if profile_prefix:
        opts.enable_profiling = True
        opts.profile_file_prefix = profile_prefix
    if not spinning:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    for key, value in (config or {}).items():
        opts.add_session_config_entry(key, value)
    if isinstance(model, os.PathLike):
        model = str(model)
    if not trim:
        return ort.InferenceSession(model, sess_options=opts, providers=["CPUExecutionProvider"])
    with trimming():
        built = ort.InferenceSession(model, sess_options=opts, providers=["CPUExecutionProvider"])
    trim_heap()
    return built


@contextlib.contextmanager
def loadable(model: str | os.PathLike | bytes | onnx.ModelProto, as_file: bool = False) -> Iterator[str | bytes]:
    """What :func:`session` accepts for ``model``: a path as a string, serialized bytes as they are, or a
    ModelProto's serialized bytes; a proto over protobuf's 2 GB limit is written with external data to a
    temporary folder that lives as long as the context (its weights are read back into the proto afterwards, so
    the caller's proto is left whole).

    ``as_file``: a proto (of any size) is written to a temporary file, one part at a time
    (:func:`onnxfuse.model.io.serialized_parts`), and its path given instead of its bytes, so that no serialized
    copy of it (the proto's size, twice while protobuf encodes it) is in memory beside the session onnxruntime
    builds: onnxruntime's Python ``InferenceSession`` keeps the bytes it was made from for as long as it lives
    (``_model_bytes``, onnxruntime_inference_collection.py), on top of its own parsed copy and weights. Where no
    temporary file can be written, the bytes are given as without ``as_file``. Once that file is written the
    context holds no reference to the proto: a caller done with it may drop its own before the session is made.
    """
    from onnxfuse.model import io as model_io

    if isinstance(model, bytes):
        yield model
        return
    if not isinstance(model, onnx.ModelProto):
        yield str(model)
        return
    too_large = model_io.exceeds_protobuf_limit(model)
    written = _write_temporary(model) if as_file and not too_large else None
    if written is not None:
        del model  # the file holds it now: a caller that drops its own reference frees the proto
        with written as folder:
            yield str(Path(folder) / "model.onnx")
        return
    if not too_large:  # as bytes, also when no temporary file can be written (a full or read-only temp dir)
        yield model.SerializeToString()
        return
    with tempfile.TemporaryDirectory(prefix="onnxfuse-session-") as tmp:
        path = Path(tmp) / "model.onnx"
        model_io.save_model(model, path, external_data=True)
        try:
            yield str(path)
        finally:  # saving moved the weights out of the proto into the file: take them back
            onnx.load_external_data_for_model(model, tmp)


def _write_temporary(model: onnx.ModelProto) -> tempfile.TemporaryDirectory | None:
    """A temporary folder holding ``model.onnx``, written one part at a time, or None when it cannot be written."""
    from onnxfuse.model import io as model_io

    try:
        tmp = tempfile.TemporaryDirectory(prefix="onnxfuse-session-")
    except OSError:
        return None
    try:
        model_io.write_parts(Path(tmp.name) / "model.onnx", model_io.serialized_parts(model)[0])
    except OSError:
        tmp.cleanup()
        return None
    except BaseException:  # Ctrl-C or SIGTERM during the write: no copy of the model left in TMPDIR
        tmp.cleanup()
        raise
    return tmp


def trim_heap() -> None:
    """Hand the C heap's free pages back to the operating system (glibc ``malloc_trim(0)``; nothing elsewhere).

    A freed onnxruntime session leaves its weights and arena in glibc's free lists, which keep counting in the
    process's resident memory; the next session then grows the heap past them instead of into them when its
    blocks do not fit the holes. Called between sessions so that they do not stack up in peak RSS.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


#: Seconds between two :func:`trim_heap` calls of :func:`trimming`.
TRIM_INTERVAL_S = 0.02


@contextlib.contextmanager
def trimming(interval: float = TRIM_INTERVAL_S) -> Iterator[None]:
    """Call :func:`trim_heap` every ``interval`` seconds from a thread while the body runs (nothing where there is
    no ``malloc_trim``).

    For the building of an onnxruntime session, which releases the GIL (``InferenceSession`` initialization in
    onnxruntime's Python binding): it makes and frees copies of the weights (the model's protobuf, the tensors
    made from it, constant folding, re-laid-out and pre-packed weights), and the freed blocks stay resident in
    glibc's free lists until the end, where a session of the original at ``ORT_ENABLE_ALL`` holds about 4x the
    weights resident (3x of them free) and trimming once it is built is too late for the peak. glibc's
    ``malloc_trim`` takes each arena's lock, so it is safe beside the allocations of other threads.
    """
    if _malloc_trim() is None:
        yield
        return
    import threading

    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval):
            trim_heap()

    thread = threading.Thread(target=loop, name="onnxfuse-trim-heap", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@functools.cache
def _malloc_trim():
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        return ctypes.CDLL(None).malloc_trim  # the C library already loaded into the process
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None


def load_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file by name.

    Raises:
        InputError: the file cannot be read as ``.npz`` (pickled object arrays are refused).
    """
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError) as exc:
        raise InputError(f"--input-data {path}: cannot read it as .npz ({exc})") from None


def _number(text: str, option: str) -> float:
    low = text.strip().lower()
    if low in ("true", "false"):
        return 1 if low == "true" else 0
    try:
        return int(low)
    except ValueError:
        pass
    try:
        value = float(low)
    except ValueError:
        raise InputError(f"{option}: {text!r} is not a number") from None
    if not np.isfinite(value):
        raise InputError(f"{option}: {text!r} is not a finite number")
    return value


def parse_input_value(text: str) -> tuple[str, float]:
    """Parse ``NAME=V`` (``V`` an integer, a float, ``true`` or ``false``) into ``(name, value)``.

    Raises:
        InputError: malformed text or a value that is not a finite number.
    """
    name, sep, value = text.rpartition("=")
    if not sep or not name or not value:
        raise InputError(f"--input-value {text!r}: expected NAME=VALUE, e.g. sr=16000")
    return name, _number(value, f"--input-value {name}")


def parse_input_range(text: str) -> tuple[str, tuple[float, float]]:
    """Parse ``NAME=LO,HI`` into ``(name, (lo, hi))``.

    Raises:
        InputError: malformed text, values that are not finite numbers, or LO > HI.
    """
    name, sep, rest = text.rpartition("=")
    parts = rest.split(",")
    if not sep or not name or len(parts) != 2:
        raise InputError(f"--input-range {text!r}: expected NAME=LOW,HIGH, e.g. x=0,1")
    low, high = (_number(p, f"--input-range {name}") for p in parts)
    if low > high:
        raise InputError(f"--input-range {text!r}: LOW is greater than HIGH")
    if not math.isfinite(high - low):
        raise InputError(f"--input-range {text!r}: HIGH - LOW is not a finite number")
    return name, (low, high)


def check_names(sess, spec: InputSpec) -> None:
    """Every name in ``spec`` is a graph input of ``sess``, and no input is given two ways.

    Raises:
        InputError: an unknown name, or an input both in ``--input-data`` and ``--input-value/--input-range``.
    """
    names = [i.name for i in sess.get_inputs()]
    for option, given in (("--input-data", spec.data), ("--input-value", spec.values),
                          ("--input-range", spec.ranges)):
        unknown = sorted(set(given) - set(names))
        if unknown:
            raise InputError(f"{option}: no graph input named {', '.join(unknown)} (inputs: {', '.join(names)})")
    for a, b in (("data", "values"), ("data", "ranges"), ("values", "ranges")):
        both = sorted(set(getattr(spec, a)) & set(getattr(spec, b)))
        if both:
            raise InputError(f"input {both[0]} is given by two of --input-data, --input-value, --input-range")


def _named(dim) -> str | None:
    """``dim`` (an onnxruntime ``NodeArg.shape`` entry) when it is a dim name that one size binds everywhere;
    None for numbers, unknowns and placeholders such as ``?`` (``shapes.is_placeholder_dim``)."""
    from onnxfuse.model.proto import is_placeholder_dim

    return dim if isinstance(dim, str) and not is_placeholder_dim(dim) else None


def _shape(inp, spec: InputSpec, bound: dict[str, int], sizes: tuple[int, int]) -> tuple[int, ...]:
    if inp.name in spec.shapes:
        return tuple(spec.shapes[inp.name])
    return tuple(_dim_size(d, i, bound, sizes) for i, d in enumerate(inp.shape))


def _dim_size(dim, axis: int, bound: dict[str, int], sizes: tuple[int, int]) -> int:
    """The size of ``dim`` (an onnxruntime ``NodeArg.shape`` entry) at ``axis``: itself when a positive number,
    else the size ``bound`` gives its name, else ``sizes[0]`` for the first axis and ``sizes[1]`` for the others."""
    if isinstance(dim, int) and dim > 0:
        return dim
    default = sizes[0] if axis == 0 else sizes[1]
    name = _named(dim)
    return default if name is None else bound.get(name, default)


def make_inputs(sess, input_shapes: dict[str, tuple[int, ...]] | InputSpec, seed: int,
                given: dict[str, np.ndarray] | None = None,
                sizes: tuple[int, int] = (DEFAULT_BATCH_DIM, DEFAULT_OTHER_DIM)) -> dict[str, np.ndarray]:
    """One input set for every input of ``sess`` (see the module docstring for where values come from).

    ``input_shapes`` is an :class:`InputSpec` or just its ``shapes``; ``given`` adds arrays to its ``data``. A
    named symbolic dim gets one value across all inputs: the one a shape entry or a given array fixes, else
    ``sizes[0]`` (first dim, the batch; default DEFAULT_BATCH_DIM) or ``sizes[1]`` (default DEFAULT_OTHER_DIM);
    :data:`SECOND_DIMS` gives verification's second set.

    Raises:
        ValueError: an input dtype onnxfuse cannot generate.
        InputError: a given array whose dtype is not the input's; a value or range that does not fit an integer
            or bool input.
    """
    spec = input_shapes if isinstance(input_shapes, InputSpec) else InputSpec(shapes=dict(input_shapes))
    data = {**spec.data, **(given or {})}
    rng = np.random.default_rng(seed)
    inputs = sess.get_inputs()
    bound: dict[str, int] = {}
    for inp in inputs:
        dims = spec.shapes.get(inp.name) or (data[inp.name].shape if inp.name in data else None)
        if dims is not None and len(dims) == len(inp.shape):
            for d, v in zip(inp.shape, dims, strict=False):
                if _named(d):
                    bound.setdefault(d, int(v))
    for inp in inputs:  # a name that is some input's first dim is a batch dim everywhere
        if inp.shape and _named(inp.shape[0]):
            bound.setdefault(inp.shape[0], sizes[0])
    feeds = {}
    for inp in inputs:
        dtype = _ORT_TYPES.get(inp.type)
        if inp.name in data:
            if dtype is not None and data[inp.name].dtype != dtype:
                raise InputError(f"input data {inp.name}: dtype {data[inp.name].dtype}, the model wants "
                                 f"{np.dtype(dtype)}")
            feeds[inp.name] = data[inp.name]
            continue
        if dtype is None:
            raise ValueError(f"input {inp.name} has type {inp.type}, which onnxfuse cannot generate")
        shape = _shape(inp, spec, bound, sizes)
        exact = not np.issubdtype(dtype, np.floating)
        if inp.name in spec.values:
            value = spec.values[inp.name]
            _check_fits(inp.name, "--input-value", (value,), dtype, exact)
            feeds[inp.name] = np.full(shape, value, dtype=dtype)
        elif inp.name in spec.ranges:
            low, high = spec.ranges[inp.name]
            _check_fits(inp.name, "--input-range", (low, high), dtype, exact)
            if exact:
                feeds[inp.name] = rng.integers(int(low), int(high), shape, endpoint=True).astype(dtype)
            else:
                feeds[inp.name] = rng.uniform(low, high, shape).astype(dtype)
        elif not exact and inp.name in spec.index_highs:
            feeds[inp.name] = rng.integers(0, max(1, spec.index_highs[inp.name]), shape).astype(dtype)
        elif not exact:
            feeds[inp.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[inp.name] = rng.integers(0, 2, shape).astype(np.bool_)
        else:
            feeds[inp.name] = rng.integers(0, RANDOM_INT_HIGH, shape).astype(dtype)
    return feeds


def invented_inputs(sess, spec: InputSpec) -> list[str]:
    """Names of the inputs of ``sess`` with a dim that is not a number and that neither ``spec.shapes`` nor
    ``spec.data`` sets (directly or through a named dim they fix): :func:`make_inputs` invents their sizes."""
    bound: set[str] = set()
    for inp in sess.get_inputs():
        dims = spec.shapes.get(inp.name) or (spec.data[inp.name].shape if inp.name in spec.data else None)
        if dims is not None:
            bound.update(d for d in inp.shape if isinstance(d, str) and d)
    return [inp.name for inp in sess.get_inputs()
            if inp.name not in spec.shapes and inp.name not in spec.data
            and any(not (isinstance(d, int) and d > 0) and d not in bound for d in inp.shape)]


class RunTimeout(TimeoutError):
    """An onnxruntime run stopped because its time budget ran out (:func:`run`, :func:`run_watched`)."""


class WorkSpent(RunTimeout):
    """An onnxruntime run stopped, or a session not made, because a budget counted in work (CPU seconds, not wall
    time: ``onnxfuse.verification.run.Budget``) was spent (:func:`run_watched`)."""


def run_watched(sess, feeds: dict[str, np.ndarray], spent: Callable[[], RunTimeout | None] | None,
                interval: float) -> list[np.ndarray]:
    """``sess.run(None, feeds)``, stopped when ``spent()`` returns an exception (None: go on), which is raised.

    ``spent`` is called before the run and then every ``interval`` seconds from a watcher thread while it runs;
    the stop is onnxruntime's ``RunOptions.terminate``, checked before each node (see :func:`run`). ``spent``
    None: the run is not watched.

    Raises:
        RunTimeout (or the subclass ``spent`` returned, :class:`WorkSpent`): as said.
        whatever onnxruntime raises when it cannot run the model.
    """
    if spent is None:
        return sess.run(None, feeds)
    before = spent()
    if before is not None:
        raise before
    import threading

    import onnxruntime as ort

    options = ort.RunOptions()
    options.log_severity_level = ORT_LOG_FATAL
    done = threading.Event()
    fired: list[RunTimeout] = []

    def watch() -> None:
        while not done.wait(interval):
            exc = spent()
            if exc is not None:
                fired.append(exc)
                options.terminate = True
                return

    watcher = threading.Thread(target=watch, name="onnxfuse-run-watch", daemon=True)
    watcher.start()
    try:
        return sess.run(None, feeds, options)
    except Exception:
        if fired:
            raise fired[0] from None
        raise
    finally:
        done.set()
        watcher.join()


def run(sess, feeds: dict[str, np.ndarray], timeout: float | None = None) -> list[np.ndarray]:
    """``sess.run(None, feeds)``, stopped after ``timeout`` seconds (None: no limit).

    The stop is onnxruntime's own: a timer thread sets ``RunOptions.terminate``, which the executor checks before
    each node and which Loop, Scan and If pass into their subgraphs (onnxruntime ``sequential_executor.cc``,
    ``loop.cc``), so a Loop of 10^12 iterations stops within one iteration. One kernel is not interrupted: a
    single node that alone runs longer than the budget ends first. ``InferenceSession.run`` releases the GIL
    while it runs, so the timer fires on time.

    Raises:
        RunTimeout: the budget ran out (also when ``timeout`` is <= 0: nothing is run).
        whatever onnxruntime raises when it cannot run the model.
    """
    if timeout is None:
        return sess.run(None, feeds)
    if timeout <= 0:
        raise RunTimeout("no time left")
    import threading

    import onnxruntime as ort

    options = ort.RunOptions()
    options.log_severity_level = ORT_LOG_FATAL
    fired = threading.Event()

    def stop() -> None:
        fired.set()
        options.terminate = True

    timer = threading.Timer(timeout, stop)
    timer.daemon = True
    timer.start()
    try:
        return sess.run(None, feeds, options)
    except Exception:
        if fired.is_set():
            raise RunTimeout(f"stopped after {timeout:.3g} s") from None
        raise
    finally:
        timer.cancel()


def _check_fits(name: str, option: str, values: tuple[float, ...], dtype, exact: bool) -> None:
    if not exact:
        return
    info = (0, 1) if dtype == np.bool_ else (np.iinfo(dtype).min, np.iinfo(dtype).max)
    for v in values:
        if v != int(v) or not info[0] <= v <= info[1]:
            raise InputError(f"{option} {name}: {v:g} does not fit the input's dtype {np.dtype(dtype)}")


def random_inputs_hint(sess, spec: InputSpec) -> str:
    """The sentence that tells the user which generated inputs to set when onnxruntime cannot run a model on
    them: random integer and bool inputs first (indices, flags, sample rates), else every random input; and
    ``--input-shape`` for inputs whose symbolic dims got default values. Empty when the user set everything."""
    generated = [i for i in sess.get_inputs() if i.name not in spec.fixed()]
    ints = [i.name for i in generated if _ORT_TYPES.get(i.type) is not None
            and not np.issubdtype(_ORT_TYPES[i.type], np.floating)]
    hints = []
    names = ints or [i.name for i in generated]
    if names:
        kind = "random integer/bool" if ints else "random"
        hints.append(f"onnxfuse fed {kind} values to {', '.join(names)}: set them with --input-value NAME=V, "
                     f"--input-range NAME=LOW,HIGH or --input-data FILE.npz")
    symbolic = [i.name for i in sess.get_inputs()
                if i.name not in spec.shapes and i.name not in spec.data
                and any(not isinstance(d, int) for d in i.shape)]
    if symbolic:
        hints.append("give --input-shape for " + ", ".join(symbolic))
    return "; " + "; ".join(hints) if hints else ""


def short(exc: BaseException) -> str:
    """An exception's message on one line, at most 300 characters."""
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."


class TimeBound:
    """One time budget for many onnxruntime runs (``bench --timeout``): one ``RunOptions`` whose ``terminate`` one
    timer thread sets when ``timeout`` seconds have passed, given to every run, so that a run in progress stops
    then (onnxruntime checks it before each node, ``sequential_executor.cc``) and no run starts after it. Unlike
    :func:`run`, no timer is started per run: nothing is added to the time of the runs it bounds. A session's
    load is not interrupted.

    Use as a context manager (the timer is cancelled on exit); ``timeout`` None: no limit.
    """

    def __init__(self, timeout: float | None):
        import threading

        import onnxruntime as ort

        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.options = ort.RunOptions()
        self.options.log_severity_level = ORT_LOG_FATAL
        self.fired = threading.Event()
        self.timer = None if timeout is None else threading.Timer(timeout, self._stop)
        if self.timer is not None:
            self.timer.daemon = True
            self.timer.start()

    def _stop(self) -> None:
        self.fired.set()
        self.options.terminate = True

    def run(self, sess, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """``sess.run(None, feeds)`` within the budget.

        Raises:
            RunTimeout: the budget ran out (before or during the run).
            whatever onnxruntime raises when it cannot run the model.
        """
        if self.fired.is_set():
            raise RunTimeout(f"stopped after {self.timeout:.3g} s")
        try:
            return sess.run(None, feeds, self.options)
        except Exception:
            if self.fired.is_set():
                raise RunTimeout(f"stopped after {self.timeout:.3g} s") from None
            raise

    def __enter__(self) -> TimeBound:
        return self

    def __exit__(self, *exc) -> None:
        if self.timer is not None:
            self.timer.cancel()
