"""``onnxfuse batch``: optimize, verify and report a zoo of models, each in a worker process of its own, locally or
on a Ray cluster. Never prints; the CLI renders progress and results.

One task function, :func:`run_task` (a plain dict in, a plain dict out), is what both engines run:

* the local pool (:func:`run_local`): ``jobs`` worker processes (``multiprocessing``'s ``spawn`` context, so a
  worker starts from a clean interpreter), each importing the library once and then taking one model at a time.
  A worker that dies (a crash, ``os._exit``, the kernel's out-of-memory kill) or runs past ``timeout`` fails that
  model only (status ``crashed`` / ``timeout``) and is replaced; ``max_memory`` caps each worker's address space
  (``resource.setrlimit(RLIMIT_AS)``, POSIX ``setrlimit``), so an allocation beyond it raises ``MemoryError``
  (status ``memory``). A worker is recycled after :data:`MAX_TASKS_PER_WORKER` models or when its resident memory
  after a model exceeds ``recycle_bytes``. The standard library's ``ProcessPoolExecutor`` is not used because one
  dead worker breaks the whole pool (``BrokenProcessPool`` fails every task in flight) and a running task cannot
  be stopped at a timeout.
* Ray (:func:`run_ray`): the same function as a ``ray.remote`` task that declares one CPU and its memory need and
  is retried on another worker when its worker dies (``max_retries``); files come back to the driver as bytes.

Outputs are never half-written: a task writes its files into a staging folder (``OUTDIR/.onnxfuse-batch/staging``)
or returns their bytes, and the driver moves each complete file into place (``os.replace``, atomic on POSIX);
then it writes the model's cache record, last, with the SHA-256 of each file. A model whose cache record exists and
whose files are still exactly the recorded ones is not run again (:func:`cache_key`: the model's bytes and
external data, the options, and the onnxfuse, onnx and onnxruntime versions; :meth:`Outdir.cached`).

Untrusted input: the driver reads models and their external data only as regular files (checked on the opened
descriptor) inside the model's folder; summaries, manifests and cache records are data (one-line InputError, a
record a miss); every name reaches a page or a terminal through ``onnxfuse.report.escape``. Local workers die
with the driver and keep their temporary files inside the run's staging folder.

Test hook: the environment variable :data:`TEST_HOOK_ENV` holds a JSON object from a model file name to an action
that :func:`run_task` performs before the model is processed: ``"crash"`` (``os._exit(3)``), ``"crash-once:PATH"``
(exit only if the file ``PATH`` does not exist yet, creating it: the retry then succeeds), ``"sleep:SECONDS"``,
``"tempfile-sleep:SECONDS"`` (make a temporary folder with a file in it, then sleep: a worker mid-model) and
``"allocate:BYTES"`` (a bytes object of that size). It exists for tests of the failure handling; the driver reads
it and copies each action into the model's job.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import hashlib
import json
import math
import os
import re
import shutil
import signal
import stat
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from onnxfuse._version import __version__
from onnxfuse.errors import InputError, one_line
from onnxfuse.model.files import write_atomically

SUMMARY_SCHEMA_VERSION = 2
#: The environment variable of the test hook (see the module docstring).
TEST_HOOK_ENV = "ONNXFUSE_BATCH_TEST_HOOK"
#: Models a local worker processes before it is replaced by a fresh one.
MAX_TASKS_PER_WORKER = 50
#: Memory one worker is assumed to need when ``-j`` is chosen from the machine's memory, in bytes (onnxfuse and
#: onnxruntime imported, one mid-sized model and its two onnxruntime sessions: about 1 GiB measured on the shared
#: models, see BENCHMARKS.md).
WORKER_MEMORY_ESTIMATE = 1536 * 2**20
#: Statuses of a model's row. ``ok``: optimized and verified (passed; or unchanged: nothing rewritten, the output
#: is the original), output written; ``unverified``: not verified, output written: ``--no-verify``, or a requested
#: verification was skipped (the reason says why), or a ``partial`` verdict (an output could not be compared);
#: ``mismatch``: verification failed, no model written; ``error``: onnxfuse refused the model (InputError) or raised;
#: ``crashed``: the worker died; ``timeout``: past ``--timeout``; ``memory``: past ``--max-memory`` (also during
#: verification); ``remainder``: verification failed, and with ``--drop-culprits`` the rewrites that broke it were
#: found and left unfused and the rest verified: that remainder is written (the reason names the culprits).
STATUSES = ("ok", "unverified", "mismatch", "error", "crashed", "timeout", "memory", "remainder")
#: The reason of a row that ``--no-verify`` left unverified.
NOT_VERIFIED_REASON = "not verified: --no-verify (the model was written without being compared)"
#: The statuses of rows whose optimized model was written: the ones the totals add and the baseline gate compares.
WRITTEN_STATUSES = ("ok", "unverified", "remainder")
#: The hidden folder inside OUTDIR for the cache records and the staging folder.
STATE_DIR = ".onnxfuse-batch"
SUMMARY_FILES: tuple[str, str, str] = ("summary.json", "summary.md", "index.html")
#: The ``kind`` of a cache record (:meth:`Outdir.cached`).
CACHE_RECORD_KIND = "onnxfuse-batch-cache-record"


def _strict_json(data: bytes):
    """JSON ``data`` parsed with NaN, Infinity and -Infinity refused (Python's ``json`` accepts them; they are no
    JSON, RFC 8259 section 6).

    Raises:
        ValueError: not UTF-8, not JSON, or a non-finite number.
    """
    def refuse(name: str):
        raise ValueError(f"{name} is not a JSON number")

    return json.loads(data.decode("utf-8"), parse_constant=refuse)


def _plain_relative(rel: object) -> bool:
    """Whether ``rel`` is a relative POSIX path of plain parts (no ``..``, ``.``, empty part or backslash)."""
    return (isinstance(rel, str) and bool(rel) and not rel.startswith("/") and "\\" not in rel and "\0" not in rel
            and all(part not in ("", ".", "..") for part in rel.split("/")))


def _valid_row(row: dict) -> bool:
    """Whether ``row`` matches the summary schema's ``models[]`` row (``batch.schema.json``)."""
    import jsonschema

    try:
        return jsonschema.Draft202012Validator(schema()["properties"]["models"]["items"]).is_valid(row)
    except RecursionError:
        return False


@dataclass
class ModelOptions:
    """Per-model options (a manifest row, or the command line's defaults): the options of ``onnxfuse optimize``,
    which every worker turns into ``pipeline.Options`` and ``VerifyOptions`` with the library's one builders
    (:func:`run_options`: ``pipeline.make_options``, ``verification.options.make_verify_options``).

    Attributes:
        input_shapes / fix_input_shapes: graph input name -> dims (``--input-shape`` / ``--fix-input-shape`` of
            ``optimize``; per model, in a manifest).
        input_values / input_ranges: graph input name -> a fill value / ``[low, high]`` for verification (say
            ``{"sr": 16000}``; per model, in a manifest).
        target / ort_level / only / skip / ort_version / constant_initializer_inputs / materialize_weights (MiB) /
            bandwidth (GB/s): as ``onnxfuse optimize``.
        verify: run the onnxruntime comparison (``--no-verify``: False).
        compare_layers / input_sets / rtol / atol / verify_timeout / verify_budget: as ``optimize``'s
            ``--layers``, ``--input-sets``, ``--rtol``, ``--atol``, ``--verify-timeout``, ``--verify-budget``.
        plugins: ``--plugin`` specs (``module:Name``) every model runs with; in the cache key as specs only (a
            changed plugin's code under the same spec reuses cached results: clear OUTDIR's cache after changing it).
        drop_culprits: ``--drop-culprits``: when verification fails and the culprit search finds the rewrites
            that broke it, write the verified remainder (row status ``remainder``) instead of nothing.
    """

    target: str = "cpu+cuda"
    ort_level: str = "all"
    input_shapes: dict[str, list[int]] = field(default_factory=dict)
    input_values: dict[str, float] = field(default_factory=dict)
    verify: bool = True
    plugins: tuple[str, ...] = ()
    drop_culprits: bool = False
    only: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    ort_version: str | None = None
    constant_initializer_inputs: bool = False
    materialize_weights: float = 0.0
    bandwidth: float | None = None
    compare_layers: bool = False
    fix_input_shapes: dict[str, list[int]] = field(default_factory=dict)
    input_ranges: dict[str, list[float]] = field(default_factory=dict)
    input_sets: int = 1
    rtol: float | None = None
    atol: float | None = None
    verify_timeout: float | None = None
    verify_budget: float | None = None

    #: The fields :meth:`to_dict` always writes; every other one only when it differs from its default, so that
    #: the cache keys (and rows) of runs that do not use an option stay as they were before it existed.
    ALWAYS = ("target", "ort_level", "input_shapes", "input_values", "verify")

    def to_dict(self) -> dict:
        """JSON-ready form (part of the cache key and of each summary row): the :data:`ALWAYS` fields, and each
        other field only when it is not its default."""
        import dataclasses

        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            if f.name in self.ALWAYS or value != default:
                out[f.name] = ({k: list(v) if isinstance(v, (list, tuple)) else v for k, v in sorted(value.items())}
                               if isinstance(value, dict) else list(value) if isinstance(value, tuple) else value)
        return out


def run_options(o: dict) -> tuple[Any, Any]:
    """A job's options (:meth:`ModelOptions.to_dict`) as ``(pipeline.Options, VerifyOptions or None)``, built by
    ``pipeline.make_options`` and ``verification.options.make_verify_options``, the builders the command line and
    the API use (None: ``verify`` is False).

    Raises:
        InputError: a value those builders refuse.
    """
    from onnxfuse import pipeline
    from onnxfuse.verification.options import make_verify_options

    d = {**ModelOptions().__dict__, **o}  # a field to_dict left out is at its default
    shapes = {k: tuple(v) for k, v in d["input_shapes"].items()}
    options = pipeline.make_options(
        target=d["target"], only=tuple(d["only"]), skip=tuple(d["skip"]), input_shapes=shapes,
        constant_initializer_inputs=d["constant_initializer_inputs"], ort_level=d["ort_level"],
        ort_version=d["ort_version"], materialize_weights=d["materialize_weights"], bandwidth=d["bandwidth"],
        plugins=tuple(d["plugins"]), fix_input_shapes={k: tuple(v) for k, v in d["fix_input_shapes"].items()},
        drop_culprits=d["drop_culprits"], compare_layers=d["compare_layers"], verify=d["verify"])
    verify = make_verify_options(
        input_shapes=options.input_shapes, input_values=dict(d["input_values"]),
        input_ranges={k: tuple(v) for k, v in d["input_ranges"].items()}, input_sets=d["input_sets"],
        rtol=d["rtol"], atol=d["atol"], verify_timeout=d["verify_timeout"], verify_budget=d["verify_budget"])
    return options, verify if d["verify"] else None


@dataclass
class Entry:
    """One model of the batch: its file, its name in OUTDIR (a relative path without ``.onnx``), its options."""

    path: Path
    name: str
    options: ModelOptions


# ---------------------------------------------------------------------------------------------------- inputs

def _parse_shapes(value, where: str) -> dict[str, list[int]]:
    from onnxfuse.model.shape_text import parse_input_shape

    if isinstance(value, dict):
        out = {}
        for k, dims in value.items():
            if not isinstance(dims, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0
                                                     for d in dims):
                raise InputError(f"{where}: input_shapes[{k!r}] must be a list of positive integers")
            out[str(k)] = list(dims)
        return out
    if isinstance(value, str):  # CSV: "x=1x3x224x224;y=1x8"
        return {n: list(d) for n, d in (parse_input_shape(t.strip()) for t in value.split(";") if t.strip())}
    raise InputError(f"{where}: input_shapes must be an object or NAME=DIMS;... text")


def _parse_values(value, where: str) -> dict[str, float]:
    from onnxfuse.ort.sessions import parse_input_value

    if isinstance(value, dict):
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                   for v in value.values()):
            raise InputError(f"{where}: input_values must map names to finite numbers")
        return {str(k): v for k, v in value.items()}
    if isinstance(value, str):
        return dict(parse_input_value(t.strip()) for t in value.split(";") if t.strip())
    raise InputError(f"{where}: input_values must be an object or NAME=V;... text")


def _parse_ranges(value, where: str) -> dict[str, list[float]]:
    from onnxfuse.ort.sessions import parse_input_range

    if isinstance(value, dict):
        out = {}
        for k, pair in value.items():
            if not (isinstance(pair, list) and len(pair) == 2
                    and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in pair)
                    and pair[0] <= pair[1]):
                raise InputError(f"{where}: input_ranges[{k!r}] must be [low, high], finite numbers with low <= high")
            out[str(k)] = [pair[0], pair[1]]
        return out
    if isinstance(value, str):  # CSV: "x=0,1;y=-1,1"
        return {n: list(r) for n, r in (parse_input_range(t.strip()) for t in value.split(";") if t.strip())}
    raise InputError(f"{where}: input_ranges must be an object or NAME=LOW,HIGH;... text")


#: A manifest row's fields: the model's path and the options that differ from model to model.
MANIFEST_FIELDS = ("path", "input_shapes", "input_values", "target", "ort_level", "fix_input_shapes", "input_ranges")
#: ``optimize`` options that batch refuses by name (they cannot apply to a zoo), with why and what instead.
REFUSED_OPTIONS = {
    "input_data": "batch feeds every model generated inputs (seeded, with the manifest's input_values and "
                  "input_ranges); for real inputs run onnxfuse optimize --input-data on that model",
    **dict.fromkeys(("tune", "tune_budget", "threads"),
                    "batch runs models side by side in its workers, whose timings would disturb each other; time one "
                    "model's rewrites with onnxfuse optimize --tune (--tune-budget, --threads) on that model"),
}


def _options_from(row: dict, defaults: ModelOptions, where: str) -> ModelOptions:
    from onnxfuse.ort.levels import ORT_LEVELS
    from onnxfuse.ort.providers import TARGETS

    for name, why in REFUSED_OPTIONS.items():
        if name in row:
            raise InputError(f"{where}: {name}: {why}")
    unknown = set(row) - set(MANIFEST_FIELDS)
    if unknown:  # a CSV row with more cells than the header has them under the key None
        raise InputError(f"{where}: unknown field(s) {', '.join(sorted(_shown_name(str(k)) for k in unknown))} "
                         f"(known: {', '.join(MANIFEST_FIELDS)})")
    for key in ("target", "ort_level"):
        if key in row and not isinstance(row[key], str):
            raise InputError(f"{where}: {key} must be a string, not {type(row[key]).__name__}")
    opts = ModelOptions(**{**defaults.__dict__, "input_shapes": dict(defaults.input_shapes),
                           "input_values": dict(defaults.input_values),
                           "fix_input_shapes": dict(defaults.fix_input_shapes),
                           "input_ranges": dict(defaults.input_ranges)})
    if row.get("input_shapes"):
        opts.input_shapes = _parse_shapes(row["input_shapes"], where)
    if row.get("fix_input_shapes"):
        opts.fix_input_shapes = _parse_shapes(row["fix_input_shapes"], where)
    if row.get("input_ranges"):
        opts.input_ranges = _parse_ranges(row["input_ranges"], where)
    if row.get("input_values"):
        opts.input_values = _parse_values(row["input_values"], where)
    if row.get("target"):
        if row["target"] not in TARGETS:
            raise InputError(f"{where}: unknown target {row['target']!r} (one of {', '.join(TARGETS)})")
        opts.target = row["target"]
    if row.get("ort_level"):
        if row["ort_level"] not in ORT_LEVELS:
            raise InputError(f"{where}: unknown ort_level {row['ort_level']!r} (one of {', '.join(ORT_LEVELS)})")
        opts.ort_level = row["ort_level"]
    return opts


def read_manifest(path: Path, defaults: ModelOptions) -> list[tuple[Path, ModelOptions]]:
    """The models of a manifest: a JSON file ``{"models": [{"path": ..., "input_shapes": {"x": [1, 3, 224, 224]},
    "input_values": {"sr": 16000}, "input_ranges": {"x": [0, 1]}, "fix_input_shapes": {...}, "target": "cpu",
    "ort_level": "extended"}, ...]}`` (or just the list; :data:`MANIFEST_FIELDS`), or a CSV file with a header row
    of those field names (``input_shapes`` / ``fix_input_shapes`` as ``x=1x3x224x224;y=1x8``, ``input_values`` as
    ``sr=16000``, ``input_ranges`` as ``x=0,1;y=-1,1``). Relative paths are relative to the manifest's folder;
    omitted fields take ``defaults``.

    Raises:
        InputError: unreadable file, bad JSON/CSV, an unknown field or value, a field batch refuses
            (:data:`REFUSED_OPTIONS`, named), a missing ``path``.
    """
    from onnxfuse.model.files import read_option_file

    text = read_option_file(path, "manifest", 64 * 2**20).decode("utf-8", errors="replace")
    rows: list[dict[str, Any]]
    if path.suffix.lower() == ".csv":
        rows = list(csv.DictReader(text.splitlines()))
    else:
        try:
            doc = _strict_json(text.encode("utf-8"))
        except (ValueError, RecursionError) as exc:
            raise InputError(f"manifest {path}: not JSON ({one_line(exc, 120)})") from None
        found = doc.get("models") if isinstance(doc, dict) else doc
        if not isinstance(found, list) or not all(isinstance(r, dict) for r in found):
            raise InputError(f"manifest {path}: expected {{\"models\": [{{\"path\": ...}}, ...]}}")
        rows = found
    out = []
    for i, row in enumerate(rows, 1):
        where = f"manifest {path}, model {i}"
        if not row.get("path"):
            raise InputError(f"{where}: no path")
        if not isinstance(row["path"], str):
            raise InputError(f"{where}: path must be a string, not {type(row['path']).__name__}")
        model = Path(row["path"])
        model = model if model.is_absolute() else path.parent / model
        out.append((model, _options_from({k: v for k, v in row.items() if v not in (None, "")}, defaults, where)))
    return out


def collect(inputs: Iterable[str | os.PathLike], defaults: ModelOptions, exclude: Path | None = None) -> list[Entry]:
    """The models named by ``inputs``: ``.onnx`` files, folders (every ``*.onnx`` below, recursively, in sorted
    order) and manifests (``.json``/``.csv``, :func:`read_manifest`). Each model's name is its path relative to
    the folder given (a file's own name for a file), without ``.onnx``; a name taken twice gets a short hash of
    the path (and options) appended. One file given twice with the same options (a file and its folder, a path
    twice, through a link) is one model. Files under ``exclude`` (OUTDIR) are left out.

    Raises:
        InputError: an input that does not exist or is neither a model, a folder nor a manifest.
    """
    found: list[tuple[Path, str, ModelOptions]] = []
    excluded = exclude.resolve() if exclude is not None else None
    for given in inputs:
        p = Path(given)
        if p.is_dir():
            for f in sorted(p.rglob("*.onnx")):
                if f.is_file() and not (excluded and f.resolve().is_relative_to(excluded)):
                    found.append((f, f.relative_to(p).with_suffix("").as_posix(), defaults))
        elif p.is_file() and p.suffix.lower() in (".json", ".csv"):
            for f, opts in read_manifest(p, defaults):
                if not f.is_file():
                    raise InputError(f"manifest {p}: {f} does not exist")
                found.append((f, f.stem, opts))
        elif p.is_file():
            found.append((p, p.stem, defaults))
        else:
            raise InputError(f"{p}: no such model, folder or manifest")
    distinct: dict[tuple[str, str], tuple[Path, str, ModelOptions]] = {}
    for f, name, opts in found:  # one model given twice (a file and its folder, a path twice): one row
        distinct.setdefault((str(f.resolve()), json.dumps(opts.to_dict(), sort_keys=True)), (f, name, opts))
    names: Counter = Counter(n for _, n, _ in distinct.values())
    out = []
    for (resolved, options), (f, name, opts) in distinct.items():
        if names[name] > 1:
            name = f"{name}-{hashlib.sha256((resolved + chr(0) + options).encode()).hexdigest()[:8]}"
        out.append(Entry(f, name, opts))
    return out


def parse_shard(text: str) -> tuple[int, int]:
    """``K/N`` (1 <= K <= N) -> ``(K, N)``.

    Raises:
        InputError: malformed.
    """
    k, sep, n = text.partition("/")
    try:
        k_i, n_i = int(k), int(n)
    except ValueError:
        k_i = n_i = 0
    if not sep or not 1 <= k_i <= n_i:
        raise InputError(f"--shard {text!r}: expected K/N with 1 <= K <= N, e.g. 2/4")
    return k_i, n_i


def in_shard(name: str, shard: tuple[int, int]) -> bool:
    """Whether model ``name`` belongs to shard ``K/N``: SHA-256 of the name modulo N equals K - 1. Stable: a
    model's shard depends on its name only, not on which other models there are."""
    k, n = shard
    return int(hashlib.sha256(name.encode("utf-8")).hexdigest(), 16) % n == k - 1


# ---------------------------------------------------------------------------------------------------- jobs

def library_versions() -> dict[str, str]:
    """onnxfuse, onnx and onnxruntime versions (installed distributions' metadata; nothing imported)."""
    from importlib import metadata

    out = {"onnxfuse": __version__}
    for names in (("onnx",), ("onnxruntime", "onnxruntime-gpu")):
        for name in names:
            with contextlib.suppress(metadata.PackageNotFoundError):
                out[names[0]] = metadata.version(name)
                break
        else:
            out[names[0]] = "not installed"
    return out


def _data_locations(path: Path, data: bytes) -> list[str]:
    """The external data locations of the model file ``path`` (its bytes ``data``), each checked before any data
    file is looked at (:func:`onnxfuse.model.io.check_external_data`: relative, inside the model's folder, no
    ``..``), sorted; none when ``data`` is no readable model (the worker then says why, ``load_model``).

    Raises:
        InputError: a location points outside the model's folder.
    """
    import onnx

    from onnxfuse.model.io import check_external_data

    try:
        model = onnx.load_model_from_string(data)
    except Exception:  # not a readable model: its bytes are still hashed, the worker refuses it
        return []
    return sorted({check_external_data(t, shown(path)).location
                   for t in onnx.external_data_helper._get_all_tensors(model)
                   if t.data_location == onnx.TensorProto.EXTERNAL})


def shown(path: Path) -> str:
    """A file's name in a message or an artifact: :func:`onnxfuse.model.files.shown_path` (never an absolute path of
    this machine)."""
    from onnxfuse.model.files import shown_path

    return shown_path(path)


def _open_regular(path: Path, label: str) -> int:
    """A read-only descriptor of ``path``, opened without waiting (``O_NONBLOCK``: a FIFO does not block the open)
    and checked on the descriptor (``fstat``) to be a regular file before a byte is read (a FIFO would block the
    read, ``/dev/zero`` never ends).

    Raises:
        InputError: cannot be opened, or not a regular file.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise InputError(f"{label}: cannot read it ({exc.strerror or exc})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InputError(f"{label}: not a regular file (a folder, FIFO, socket or device)")
    return fd


def _hash_file(h, path: Path, label: str) -> int:
    """Feed the regular file ``path``'s bytes to hash ``h``; returns how many (:func:`_open_regular`'s errors)."""
    fd = _open_regular(path, label)
    n = 0
    with os.fdopen(fd, "rb") as fh:
        for chunk in iter(functools.partial(fh.read, 1 << 20), b""):
            h.update(chunk)
            n += len(chunk)
    return n


def file_digest(path: Path) -> str | None:
    """SHA-256 (hex) of the regular file ``path``; None when it is missing, unreadable or not a regular file."""
    h = hashlib.sha256()
    try:
        _hash_file(h, path, str(path))
    except InputError:
        return None
    return h.hexdigest()


def _content_hash(path: Path) -> str:
    """SHA-256 over the model file's bytes and those of the external data files it references (sorted by name),
    each file's name before and its length after its bytes. Every file is checked to be a regular file on its open
    descriptor before it is read (:func:`_open_regular`), and every data location to lie inside the model's folder
    before any data file is opened (:func:`_data_locations`).

    Raises:
        InputError: a model or data file that is not a regular file, cannot be read, or lies outside the folder.
    """
    fd = _open_regular(path, shown(path))
    with os.fdopen(fd, "rb") as fh:
        try:
            data = fh.read()
        except OSError as exc:
            raise InputError(f"{shown(path)}: cannot read it ({exc.strerror or exc})") from None
    h = hashlib.sha256(path.name.encode() + b"\0" + data + b"%d\0" % len(data))
    for name in _data_locations(path, data):
        h.update(name.encode() + b"\0")
        h.update(b"%d\0" % _hash_file(h, path.parent / name, f"{shown(path)}: external data file {name!r}"))
    return h.hexdigest()


def cache_key(entry: Entry, versions: dict[str, str]) -> str:
    """The model's cache key (hex SHA-256): its content (:func:`_content_hash`), its name in OUTDIR, its options
    and ``versions``. Any change to one of them runs the model again."""
    doc = {"content": _content_hash(entry.path), "name": entry.name, "options": entry.options.to_dict(),
           "versions": versions}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def make_job(entry: Entry, key: str, hooks: dict[str, str] | None = None) -> dict:
    """The plain-data job of one model for :func:`run_task`: ``path`` resolved for the worker, ``shown`` how the
    summary names the file (relative to the working folder when inside it, else its file name: no absolute path of
    this machine in an artifact a CI job archives)."""
    from onnxfuse.model.files import shown_path

    resolved = entry.path.resolve()
    return {"path": str(resolved), "shown": shown_path(resolved), "name": entry.name, "key": key,
            "options": entry.options.to_dict(), "test_hook": (hooks or {}).get(entry.path.name)}


def read_test_hooks() -> dict[str, str]:
    """The test hook's actions (environment variable :data:`TEST_HOOK_ENV`), an empty dict when unset.

    Raises:
        InputError: the variable is set but not a JSON object of strings.
    """
    text = os.environ.get(TEST_HOOK_ENV)
    if not text:
        return {}
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict) or not all(isinstance(v, str) for v in doc.values()):
        raise InputError(f"{TEST_HOOK_ENV}: expected a JSON object of model file name -> action")
    return doc


def _apply_test_hook(action: str | None) -> None:
    if not action:
        return
    kind, _, arg = action.partition(":")
    if kind == "crash":
        os._exit(3)
    if kind == "crash-once":
        marker = Path(arg)
        if not marker.exists():
            marker.write_text("crashed once\n")
            os._exit(3)
    elif kind == "sleep":
        time.sleep(float(arg))
    elif kind == "tempfile-sleep":  # a worker mid-model, with a temporary folder of its own (as verification has)
        folder = Path(tempfile.mkdtemp(prefix="onnxfuse-hook-"))
        (folder / "copy-of-the-model.onnx").write_bytes(b"\0" * 1024)
        time.sleep(float(arg))
    elif kind == "allocate":
        _ = b"\1" * int(arg)


def _reset_peak_rss() -> None:
    """Reset the kernel's peak resident set size of this process (``/proc/self/clear_refs`` value 5, Linux
    Documentation/filesystems/proc.rst), so that VmHWM measures the next task alone."""
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")


def _proc_status_bytes(field_name: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` (VmRSS, VmHWM) in bytes; None where there is no procfs."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _peak_rss() -> int | None:
    peak = _proc_status_bytes("VmHWM")
    if peak is None:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: kilobytes
    return peak


def _fusion_kinds(fusions: list[dict]) -> dict[str, int]:
    from onnxfuse.report.baseline import _fusion_kind

    return dict(sorted(Counter(_fusion_kind(f) for f in fusions).items()))


#: An absolute POSIX path of two or more parts in a message (not after a word character, a dot, a colon or a
#: slash: a URL's path and a relative path are left alone); :func:`without_paths` keeps its last part.
_ABSOLUTE_PATH = re.compile(r"(?<![\w.:/~-])/(?:[^\s/'\"]+/)+([^\s/'\"]*)")


def without_paths(text: str, job: dict | None = None) -> str:
    """``text`` (a row's reason) with no absolute path of this machine: the job's model path becomes its shown
    name (``job["shown"]``), its folder ``.``, the temporary folder ``TMPDIR``, and any other absolute path its
    file name (:data:`_ABSOLUTE_PATH`)."""
    if job is not None:
        folder = str(Path(job["path"]).parent)
        for full, short in ((job["path"], job.get("shown") or Path(job["path"]).name), (folder + os.sep, ""),
                            (folder, "."), (tempfile.gettempdir(), "TMPDIR")):
            if full and full != os.sep:
                text = text.replace(full, short)
    return _ABSOLUTE_PATH.sub(lambda m: m.group(1), text)


def _row(job: dict, status: str, reason: str | None, **extra) -> dict:
    row = {"name": job["name"], "model": job.get("shown", job["path"]), "key": job["key"], "options": job["options"],
           "status": status, "reason": without_paths(reason, job) if reason else reason, "verification": None,
           "fusions": None,
           "fusions_made_by_onnxruntime": None, "fusion_kinds": {}, "saved_bytes": None, "saved_bytes_beyond": None,
           "before_bytes": None, "after_bytes": None, "after_bytes_expr": None, "saved_bytes_expr": None,
           "unknown_nodes": None, "symbols": {}, "symbol_values": {}, "time_s": None, "peak_memory_bytes": None,
           "output": None, "report_json": None, "report_html": None, "cached": False, "worker_pid": None,
           "representative_sizes": None}
    row.update(extra)
    return row


def model_file(name: str) -> str:
    """Where model ``name``'s optimized model goes, relative to OUTDIR."""
    return f"models/{name}.onnx"


def report_files(name: str) -> tuple[str, str]:
    """Where model ``name``'s JSON and HTML reports go, relative to OUTDIR."""
    return f"reports/{name}.json", f"reports/{name}.html"


def run_task(job: dict) -> dict:
    """Optimize, verify and report one model: the task that the local pool and Ray both run.

    Args:
        job: :func:`make_job`'s dict, plus ``stage`` (a folder to write the files into; the driver moves them into
            OUTDIR) or ``return_files`` (True: the files' bytes come back in the result instead).

    Returns:
        The model's summary row (see ``batch.schema.json``, ``models[]``) plus ``staged`` (OUTDIR-relative path ->
        staged file) or ``files`` (OUTDIR-relative path -> bytes). A model that onnxfuse refuses or that raises is
        an ``error`` row, a ``MemoryError`` a ``memory`` row; nothing propagates but process death.
    """
    start = time.perf_counter()
    _reset_peak_rss()
    stage = Path(job["stage"]) if job.get("stage") else Path(tempfile.mkdtemp(prefix="onnxfuse-batch-"))
    try:
        _apply_test_hook(job.get("test_hook"))
        row = _optimize_into(job, stage)
    except MemoryError:
        row = _row(job, "memory", "MemoryError: an allocation exceeded the worker's memory limit (--max-memory)")
    except InputError as exc:
        row = _row(job, "error", one_line(exc))
    except Exception as exc:  # a bug in onnxfuse or a library on this model: the batch goes on
        row = _row(job, "error", one_line(f"{type(exc).__name__}: {exc}"))
    row["time_s"] = round(time.perf_counter() - start, 3)
    row["peak_memory_bytes"] = _peak_rss()
    row["worker_pid"] = os.getpid()
    staged = {str(p.relative_to(stage).as_posix()): str(p) for p in sorted(stage.rglob("*")) if p.is_file()}
    if job.get("return_files"):
        row["files"] = {rel: Path(p).read_bytes() for rel, p in staged.items()}
        shutil.rmtree(stage, ignore_errors=True)
    else:
        row["staged"], row["stage"] = staged, str(stage)
    return row


def _optimize_into(job: dict, stage: Path) -> dict:
    from onnxfuse import pipeline
    from onnxfuse.model import io as model_io
    from onnxfuse.report import model as rep
    from onnxfuse.report.html import to_html

    options, verify = run_options(job["options"])  # the builders the command line and the API use
    name = job["name"]
    loaded = model_io.load_model(job["path"])
    loaded.name = f"{name}.onnx"  # the model's name in the zoo: no absolute path of this machine in its report
    result = pipeline.optimize(job["path"], options, verify, loaded=loaded)
    doc = result.report.to_dict()
    rjson, rhtml = report_files(name)
    for rel, text in ((rjson, rep.to_json(result.report)), (rhtml, to_html(doc))):
        (stage / rel).parent.mkdir(parents=True, exist_ok=True)
        (stage / rel).write_text(text, encoding="utf-8")
    verification = doc["verification"]
    status, reason = _status_of(verification)
    output = None
    if status != "mismatch":
        output = model_file(name)
        (stage / output).parent.mkdir(parents=True, exist_ok=True)
        model_io.save_model(result.model, stage / output, external_data=result.loaded.external_data)
    t, ort = doc["totals"], doc.get("onnxruntime") or {}
    figures = _figures(doc)
    return _row(job, status, reason, verification=verification["status"], fusions=len(doc["fusions"]),
                fusions_made_by_onnxruntime=ort.get("fusions_made_by_onnxruntime"),
                fusion_kinds=_fusion_kinds(doc["fusions"]), **figures,
                after_bytes_expr=t["after"]["total_bytes_expr"],
                saved_bytes_expr=t["saved_bytes_expr"], unknown_nodes=t["after"]["unknown_nodes"],
                symbols=doc["symbols"], symbol_values=doc["symbol_values"], output=output, report_json=rjson,
                report_html=rhtml)


#: What onnxruntime or Python say when an allocation fails (a MemoryError, C++ ``std::bad_alloc``, onnxruntime's
#: arena "Failed to allocate memory"): a verification skipped for one of these ran past ``--max-memory``.
_MEMORY_REASON = re.compile(r"MemoryError|bad_alloc|[Ff]ailed to allocate|[Oo]ut of memory|Cannot allocate memory")


def _status_of(verification: dict) -> tuple[str, str | None]:
    """A row's status and reason from its report's ``verification`` section: ``failed`` -> ``mismatch``;
    ``passed`` with culprits (``--drop-culprits`` shipped the verified remainder) -> ``remainder``; ``partial``
    (an output could not be compared on any input set) -> ``unverified``; ``skipped`` by ``--no-verify`` (cause
    ``user``) -> ``unverified`` (a model that was not verified is never ``ok``); any other ``skipped`` ->
    ``memory`` when an allocation failed (:data:`_MEMORY_REASON`), else ``unverified``; ``passed`` and
    ``unchanged`` (nothing rewritten: the output is the original) -> ``ok``."""
    why = verification.get("reason") or ""
    if verification["status"] == "passed" and verification.get("culprits"):
        names = "; ".join(f"{c.get('pass')} at {', '.join(map(str, c.get('nodes') or []))}"
                          for c in verification["culprits"])
        return "remainder", one_line(f"{len(verification['culprits'])} rewrite(s) broke verification and were left "
                                     f"unfused ({names}); the verified remainder was written", 300)
    if verification["status"] == "partial":
        return "unverified", one_line(f"verification was partial: {why}", 300)
    if verification["status"] == "failed":
        return "mismatch", one_line(f"the optimized model does not match the original ({why}); no model written")
    if verification["status"] == "skipped" and verification.get("cause") == "user":
        return "unverified", NOT_VERIFIED_REASON
    if verification["status"] == "skipped":
        if _MEMORY_REASON.search(why):
            return "memory", one_line(f"verification ran out of memory (--max-memory, or the machine's): {why}", 300)
        return "unverified", one_line(f"verification was skipped: {why}", 300)
    if verification["status"] in ("passed", "unchanged"):
        return "ok", None
    return "unverified", one_line(f"verification {verification['status']}: {why}", 300)  # no other status is ok


def _figures(doc: Any) -> dict[str, Any]:
    """A row's byte figures from its report, each the number the model's own summary, HTML headline, Markdown
    report and ``Report.saved_bytes_beyond_onnxruntime`` give (``present.saved_beyond_onnxruntime``,
    ``present.saved_vs_exported``): at the input shapes used; when the model has symbolic dims that no input shape
    binds, at the single-model report's representative sizes (:func:`onnxfuse.report.present.figure_sizes`: batch
    1 on axis 0, 224 for the other dims), which ``representative_sizes`` then names. Nothing fused is 0 B beyond
    onnxruntime; a figure that stays unknown (the comparison not made: ``--no-verify``, or onnxruntime could not
    load a model; a size unknown) is None (never 0)."""
    from onnxfuse.report import present

    t = doc["totals"]
    out = {"saved_bytes": present.saved_vs_exported(doc), "saved_bytes_beyond": present.saved_beyond_onnxruntime(doc),
           "before_bytes": t["before"]["total_bytes"], "after_bytes": t["after"]["total_bytes"],
           "representative_sizes": None}
    sizes = present.figure_sizes(doc)
    if sizes is not None:
        for k, key in (("before_bytes", "before"), ("after_bytes", "after")):
            if out[k] is None:
                out[k] = present.at_values(t[key]["total_bytes_expr"], sizes)
        names = present.display_names(doc)  # each dim by the name the model's own report gives it
        out["representative_sizes"] = {names.get(k, k): v for k, v in sizes.items()}
    return out


# ---------------------------------------------------------------------------------------------------- OUTDIR

def _atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, data)


def _commit_order(rel: str) -> tuple[int, str]:
    """External data files first, then models (whose reference to the data is then valid), then reports."""
    return (0 if not rel.endswith((".onnx", ".json", ".html")) else 1 if rel.endswith(".onnx") else 2, rel)


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (``kill(pid, 0)``, POSIX)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it exists, owned by another user
        return True
    return True


class Outdir:
    """OUTDIR: the outputs, the cache records (``.onnxfuse-batch/cache/KEY.json``) and the staging folder."""

    def __init__(self, path: Path):
        self.path = path
        self.state = path / STATE_DIR
        self.cache = self.state / "cache"
        self.staging_root = self.state / "staging"
        #: This run's staging folder (``staging/run-PID-TOKEN``): runs into one OUTDIR (two shards) stage apart.
        self.staging = self.staging_root / f"run-{os.getpid()}-{os.urandom(4).hex()}"

    def prepare(self) -> None:
        """Create the folders; remove the staging folders of runs that ended without cleaning up (a killed driver;
        their files never reached OUTDIR's outputs) and leave those of runs still going (their PID is alive)."""
        self.cache.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            for old in self.staging_root.iterdir():
                pid = old.name.split("-")[1] if old.name.startswith("run-") else ""
                if not (pid.isdigit() and _alive(int(pid))):
                    shutil.rmtree(old, ignore_errors=True)
        self.staging.mkdir(parents=True, exist_ok=True)

    def worker_tmp(self) -> Path:
        """A new temporary folder for one local worker inside this run's staging folder (the worker's TMPDIR): what
        a killed worker leaves is removed with the staging folder."""
        self.staging.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix="tmp-", dir=self.staging))

    def stage_for(self, key: str) -> Path:
        """An empty staging folder for the task of cache key ``key`` (an earlier one of that key is removed)."""
        p = self.staging / key
        shutil.rmtree(p, ignore_errors=True)
        p.mkdir(parents=True)
        return p

    def cached(self, key: str) -> dict | None:
        """The row of an earlier run with cache key ``key``, or None (a miss, never an error).

        A record (``.onnxfuse-batch/cache/KEY.json``, :data:`CACHE_RECORD_KIND`) holds the key, the row and the
        SHA-256 of every file the run put into OUTDIR. It is a hit only when it is a regular file of valid JSON
        (no NaN), its key and its row's key are ``key``, its row matches the summary schema's row, every file it
        names is a plain relative path inside OUTDIR (the row's own paths the ones batch writes for its name), and
        each file now there has the recorded digest: a file replaced since (by a run of another revision of the
        model, or by hand) is a miss, and the model runs again.
        A damaged, foreign or poisoned record is a miss."""
        from onnxfuse.model.files import read_option_file

        try:
            data = read_option_file(self.cache / f"{key}.json", "cache record", 16 * 2**20)
            record = _strict_json(data)
        except (InputError, ValueError, RecursionError):
            return None
        if not (isinstance(record, dict) and record.get("kind") == CACHE_RECORD_KIND and record.get("key") == key
                and isinstance(record.get("files"), dict) and isinstance(record.get("row"), dict)):
            return None
        row, files = record["row"], record["files"]
        if row.get("key") != key or not _valid_row(row) or _relinked(row, None, None) != row:
            return None  # not this key's, not a row, or a file path that is not the one batch writes for its name
        if row["status"] == "ok" and row.get("verification") not in ("passed", "unchanged"):
            return None  # an older onnxfuse's row of a model it did not verify: its status is no longer ok
        named = {row[k] for k in ("output", "report_json", "report_html") if row.get(k)}
        if not named <= set(files) or not all(isinstance(d, str) for d in files.values()):
            return None
        for rel, digest in files.items():
            if not _plain_relative(rel) or file_digest(self.path / rel) != digest:
                return None
        return row

    def commit(self, row: dict) -> dict:
        """Move (or write) the task's files into OUTDIR, each complete (``os.replace``), then record the row and
        the files' digests in the cache; returns the row without its file payload. Crashed, timed-out and memory
        rows are not cached: a rerun tries them again."""
        staged, files = row.pop("staged", None) or {}, row.pop("files", None) or {}
        digests = {}
        for rel in sorted({*staged, *files}, key=_commit_order):
            target = self.path / rel
            if rel in staged:
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(staged[rel], target)
            else:
                _atomic_write_bytes(target, files[rel])
            digests[rel] = file_digest(target)
        stage = row.pop("stage", None)
        if stage:
            shutil.rmtree(stage, ignore_errors=True)
        if row["status"] in ("ok", "unverified", "mismatch", "error", "remainder"):
            record = {"kind": CACHE_RECORD_KIND, "key": row["key"], "files": digests, "row": row}
            _atomic_write_bytes(self.cache / f"{row['key']}.json", json.dumps(record, sort_keys=True).encode())
        return row

    def cleanup(self) -> None:
        """Remove this run's staging folder (after a run, or an interrupted one: the workers' temporary files with
        it), and the staging root when no other run uses it."""
        shutil.rmtree(self.staging, ignore_errors=True)
        with contextlib.suppress(OSError):
            self.staging_root.rmdir()


# ---------------------------------------------------------------------------------------------------- local pool

def default_jobs(max_memory: int | None = None) -> int:
    """``-j`` when none is given: the usable CPU cores (``os.sched_getaffinity``), no more than the available
    memory (``MemAvailable`` of ``/proc/meminfo``) divided by ``max_memory`` or :data:`WORKER_MEMORY_ESTIMATE`;
    at least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    available = None
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    by_memory = cores if available is None else available // (max_memory or WORKER_MEMORY_ESTIMATE)
    return max(1, min(cores, by_memory))


def _preload() -> None:
    """Import what a task uses (the library, onnxruntime, sympy, plotly for the HTML report): each worker pays the
    import time once, before its first model, and its first model's time and peak memory are comparable with the
    others'."""
    import sympy  # noqa: F401

    from onnxfuse.ort import sessions
    from onnxfuse.report.html import plotly_js_gzip_base64
    from onnxfuse.verification import verify as verification  # noqa: F401

    sessions.preload()
    plotly_js_gzip_base64()


def _die_with_parent() -> None:
    """End this worker when the driver ends, however it ends (a SIGKILL included): on Linux the kernel sends it
    SIGKILL when its parent exits (``prctl(PR_SET_PDEATHSIG)``, man 2 prctl); everywhere a daemon thread checks
    twice a second whether its parent changed (an orphan is re-parented) and exits then."""
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError, TypeError):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG = 1 (linux/prctl.h)
    if os.getppid() != parent:  # the driver was gone before prctl took effect
        os._exit(5)

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                os._exit(5)

    import threading

    threading.Thread(target=watch, name="onnxfuse-parent-watchdog", daemon=True).start()


def _worker_main(conn, max_memory: int | None, tmpdir: str | None = None) -> None:
    """A local worker: die with the driver (:func:`_die_with_parent`), ignore SIGINT (the driver stops workers),
    keep its temporary files in ``tmpdir`` (inside the run's staging folder, which the driver removes), cap the
    address space, import the library once, say ready, then run jobs until it receives None."""
    _die_with_parent()
    if tmpdir:
        os.environ["TMPDIR"] = tmpdir
        tempfile.tempdir = tmpdir
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if max_memory:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (max_memory, max_memory))
    try:
        _preload()
    except MemoryError:
        os._exit(4)
    conn.send({"ready": True})
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        row = run_task(job)
        row["worker_rss_bytes"] = _proc_status_bytes("VmRSS")
        conn.send(row)


class _Worker:
    def __init__(self, ctx, max_memory: int | None, tmpdir: Path | None = None):
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_worker_main, args=(child, max_memory, str(tmpdir) if tmpdir else None),
                                   daemon=True)
        self.process.start()
        child.close()
        self.ready = False
        self.job: dict | None = None
        self.started = 0.0
        self.tasks = 0

    def kill(self) -> None:
        with contextlib.suppress(OSError, AttributeError):
            self.process.kill()
        self.process.join(5)
        self.conn.close()

    def retire(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(None)
        self.process.join(10)
        if self.process.is_alive():
            self.kill()
        self.conn.close()


def _death_reason(exitcode: int | None) -> tuple[str, str]:
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name
        if -exitcode == signal.SIGKILL:
            return "crashed", f"the worker was killed by {name} (the kernel's out-of-memory killer, or a kill from " \
                              "outside onnxfuse)"
        return "crashed", f"the worker died of {name}"
    if exitcode == 4:
        return "memory", "the worker could not import onnxfuse within --max-memory"
    return "crashed", f"the worker exited with status {exitcode} while processing the model"


def _start_jobs(pool: list[_Worker], pending: list[dict], outdir: Outdir) -> None:
    """Send the next job of ``pending`` (taken from its end) to each worker that is ready and has none."""
    for w in pool:
        if w.ready and w.job is None and pending:
            job = pending.pop()
            w.job = {**job, "stage": str(outdir.stage_for(job["key"]))}
            w.started = time.monotonic()
            w.conn.send(w.job)


def _receive(w: _Worker, ready: list[Any]) -> tuple[dict | None, bool]:
    """What worker ``w`` sent (None: nothing) and whether it died, from the objects that
    ``multiprocessing.connection.wait`` found ``ready``."""
    if w.conn in ready:
        try:
            return w.conn.recv(), False
        except (EOFError, OSError):
            return None, True
    return None, w.process.sentinel in ready


def _dead_worker_row(w: _Worker, pool: list[_Worker], now: float) -> dict | None:
    """The row of the job of worker ``w``, which died (``now - w.started`` seconds into it); None when it had no
    job.

    Raises:
        InputError: the worker died before it was ready (it is killed and taken out of ``pool`` first).
    """
    w.process.join(5)
    if w.job is None and not w.ready:
        w.kill()
        pool.remove(w)
        _, why = _death_reason(w.process.exitcode)
        raise InputError(f"a batch worker could not start ({why})")
    if w.job is None:
        return None
    status, why = _death_reason(w.process.exitcode)
    return _row(w.job, status, why, time_s=round(now - w.started, 3))


def run_local(jobs: list[dict], outdir: Outdir, workers: int, timeout: float | None = None,
              max_memory: int | None = None, recycle_bytes: int | None = None,
              on_result: Callable[[dict], None] | None = None) -> list[dict]:
    """Run ``jobs`` (:func:`make_job`) in ``workers`` local worker processes and commit each result into
    ``outdir`` as it arrives; returns the rows (in completion order). See the module docstring for crashes,
    ``timeout`` (seconds per model), ``max_memory`` (bytes of address space per worker) and recycling
    (``recycle_bytes`` of resident memory; default: three times the worker's memory after its first model).

    A KeyboardInterrupt kills the workers, removes the staging folder and propagates: OUTDIR holds only complete
    files, and the models that were not committed have no cache record.
    """
    import multiprocessing
    from multiprocessing.connection import wait

    ctx = multiprocessing.get_context("spawn")
    pending = list(reversed(jobs))
    pool: list[_Worker] = []
    rows: list[dict] = []
    baseline_rss: int | None = None

    def finish(row: dict) -> None:
        row = outdir.commit(row)
        rows.append(row)
        if on_result:
            on_result(row)

    completed = False
    try:
        while pending or any(w.job for w in pool):
            while len(pool) < min(workers, len(pending) + sum(1 for w in pool if w.job)):
                pool.append(_Worker(ctx, max_memory, outdir.worker_tmp()))
            _start_jobs(pool, pending, outdir)
            ready = wait([w.conn for w in pool] + [w.process.sentinel for w in pool], timeout=0.2)
            now = time.monotonic()
            for w in list(pool):
                message, dead = _receive(w, ready)
                if message is not None and message.get("ready"):
                    w.ready = True
                    continue
                if message is not None:
                    w.job = None
                    w.tasks += 1
                    rss = message.pop("worker_rss_bytes", None)
                    finish(message)
                    if baseline_rss is None and rss:
                        baseline_rss = rss
                    limit = recycle_bytes or (3 * baseline_rss if baseline_rss else None)
                    if w.tasks >= MAX_TASKS_PER_WORKER or (limit and rss and rss > limit):
                        w.retire()
                        pool.remove(w)
                    continue
                if dead:
                    row = _dead_worker_row(w, pool, now)
                    if row is not None:
                        finish(row)
                    w.kill()
                    pool.remove(w)
                    continue
                if w.job is not None and timeout and now - w.started > timeout:
                    w.kill()
                    pool.remove(w)
                    finish(_row(w.job, "timeout", f"still running after --timeout {timeout:g} s; the worker was "
                                                  "killed", time_s=round(now - w.started, 3)))
        completed = True
    finally:  # after an interrupt or an error every worker is killed at once; after a complete run they exit
        for w in pool:
            if completed and w.job is None and w.process.is_alive():
                w.retire()
            else:
                w.kill()
        outdir.cleanup()
    return rows


# ---------------------------------------------------------------------------------------------------- Ray

def _ray_task(job: dict) -> dict:
    """The Ray task: :func:`run_task` with the files returned to the driver as bytes."""
    return run_task({**job, "return_files": True})


def run_ray(jobs: list[dict], outdir: Outdir, address: str | None = None, timeout: float | None = None,
            memory: int | None = None, max_retries: int = 2,
            on_result: Callable[[dict], None] | None = None) -> list[dict]:
    """Run ``jobs`` as Ray tasks (each declares one CPU and ``memory`` bytes, default
    :data:`WORKER_MEMORY_ESTIMATE`; Ray schedules by both) on the cluster at
    ``address`` (None: the cluster ``ray.init`` finds or starts; a Ray already initialized in this process is
    used as it is). A task whose worker dies is retried up to ``max_retries`` times (Ray's ``max_retries``);
    after that the model is ``crashed`` (``memory`` when Ray's memory monitor killed it). No more tasks are in
    flight than the cluster has CPUs, so a task starts about when it is submitted; one still running ``timeout``
    seconds after its submission (retries included) is cancelled (``ray.cancel(force=True)``, which kills its
    worker) and is ``timeout``. Results are committed into ``outdir`` by this driver, each file atomically.

    Raises:
        InputError: Ray is not installed (``pip install 'onnxfuse[ray]'``).
    """
    try:
        import ray
        from ray import exceptions as rex
    except ImportError:
        raise InputError("--ray needs Ray: pip install 'onnxfuse[ray]'") from None
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    task = ray.remote(num_cpus=1, memory=memory or WORKER_MEMORY_ESTIMATE, max_retries=max_retries,
                      retry_exceptions=False)(_ray_task)
    # no more tasks in flight than the cluster has CPUs: a task's clock (timeout) starts about when it does
    window = max(1, int(ray.cluster_resources().get("CPU", 1)))
    pending = list(reversed(jobs))
    refs: dict = {}
    started: dict = {}
    cancelled: dict = {}
    rows: list[dict] = []
    try:
        while refs or pending:
            while pending and len(refs) < window:
                job = pending.pop()
                ref = task.remote(job)
                refs[ref], started[ref] = job, time.monotonic()
            done, _ = ray.wait(list(refs), num_returns=1, timeout=0.5)
            now = time.monotonic()
            for ref in done:
                job = refs.pop(ref)
                try:
                    row = ray.get(ref)
                except rex.OutOfMemoryError as exc:
                    row = _row(job, "memory", one_line(f"Ray's memory monitor killed the task: {exc}", 300))
                except rex.TaskCancelledError:
                    row = _row(job, "timeout", f"still running after --timeout {timeout:g} s; the task was cancelled"
                               if timeout else "the task was cancelled")
                except (rex.WorkerCrashedError, rex.RayTaskError, rex.RayError) as exc:
                    row = _row(job, "crashed", one_line(f"{type(exc).__name__} after {max_retries} retries: {exc}",
                                                        300))
                row = outdir.commit(row)
                rows.append(row)
                if on_result:
                    on_result(row)
            if timeout:
                for ref in refs:
                    if now - started[ref] > timeout and not cancelled.get(ref):
                        ray.cancel(ref, force=True)
                        cancelled[ref] = True
    except KeyboardInterrupt:
        for ref in refs:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
        raise
    finally:
        outdir.cleanup()
    return rows


# ---------------------------------------------------------------------------------------------------- summary

def summarize(rows: list[dict], *, versions: dict[str, str], shard: tuple[int, int] | None, engine: str,
              wall_s: float, workers: int | None) -> dict:
    """The batch summary (``batch.schema.json``): rows sorted by name, counts per status, totals over the models
    whose output was written (``ok``, ``unverified`` and ``remainder``, ``totals.written`` of them; a total is None
    when no such model has the figure, and ``totals.unknown`` counts, per figure, those whose figure is unknown and
    so not in the total)."""
    models = sorted(rows, key=lambda r: r["name"])
    counts = {s: sum(1 for r in models if r["status"] == s) for s in STATUSES}

    written = [r for r in models if r["status"] in WRITTEN_STATUSES]

    def total(key):
        values = [r[key] for r in written if r[key] is not None]
        return sum(values) if values else None

    return {"schema_version": SUMMARY_SCHEMA_VERSION, "kind": "onnxfuse-batch-summary", "versions": versions,
            "engine": engine, "workers": workers, "shard": f"{shard[0]}/{shard[1]}" if shard else None,
            "wall_s": round(wall_s, 3), "counts": counts, "cached": sum(1 for r in models if r.get("cached")),
            "totals": {"models": len(models), "fusions": total("fusions"), "saved_bytes": total("saved_bytes"),
                       "saved_bytes_beyond": total("saved_bytes_beyond"), "time_s": total("time_s"),
                       "written": len(written),
                       "unknown": {k: sum(1 for r in written if r[k] is None)
                                   for k in ("saved_bytes", "saved_bytes_beyond")}},
            "models": models}


def summary_files(shard: str | None) -> tuple[str, str, str]:
    """The summary's file names in OUTDIR: ``summary.json``, ``summary.md``, ``index.html``; a shard's
    (``K/N``) carry it (``summary.shard-K-of-N.json`` ...), so that shards run into one OUTDIR keep each its own."""
    if not shard:
        return SUMMARY_FILES
    k, _, n = shard.partition("/")
    return f"summary.shard-{k}-of-{n}.json", f"summary.shard-{k}-of-{n}.md", f"index.shard-{k}-of-{n}.html"


def schema() -> dict:
    """``onnxfuse/batch.schema.json``: the JSON Schema of the summary."""
    from importlib.resources import files

    return json.loads(files("onnxfuse").joinpath("batch.schema.json").read_text(encoding="utf-8"))


def load_summary(path: str | Path, option: str) -> dict:
    """A summary written by ``onnxfuse batch``, read as untrusted input: a regular file of at most 256 MiB, JSON
    without NaN or infinities, valid against its schema, every byte expression in the grammar of
    :func:`onnxfuse.analysis.expressions.parse` (nothing in it is evaluated), one row per model name.

    Raises:
        InputError: one line: unreadable, not JSON, or not a valid summary.
    """
    import jsonschema

    from onnxfuse.analysis import expressions
    from onnxfuse.model.files import read_option_file
    from onnxfuse.report.escape import text

    data = read_option_file(path, option, 256 * 2**20)
    try:
        doc = _strict_json(data)
    except (ValueError, RecursionError) as exc:
        raise InputError(f"{option} {path}: not JSON ({one_line(text(exc), 120)})") from None
    try:
        error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema()).iter_errors(doc))
    except RecursionError:
        raise InputError(f"{option} {path}: not a valid onnxfuse batch summary (nested too deeply)") from None
    if error is not None:
        where = ".".join(str(p) for p in error.absolute_path) or "the top level"
        raise InputError(f"{option} {path}: not a valid onnxfuse batch summary (at {one_line(text(where), 80)}: "
                         f"{error.validator})")
    names: Counter = Counter(r["name"] for r in doc["models"])
    for i, r in enumerate(doc["models"]):
        if names[r["name"]] > 1:
            raise InputError(f"{option} {path}: not a valid onnxfuse batch summary (model "
                             f"{one_line(text(r['name']), 80)} has {names[r['name']]} rows)")
        for key in ("saved_bytes_expr", "after_bytes_expr"):
            if r[key] is not None:
                try:
                    expressions.parse(r[key])
                except (expressions.ExpressionError, RecursionError, MemoryError):
                    raise InputError(f"{option} {path}: not a valid onnxfuse batch summary (at models.{i}.{key}: "
                                     "not a byte expression)") from None
    return doc


def merge(summaries: list[dict], sources: list[Path] | None = None, outdir: Path | None = None) -> dict:
    """Join shard summaries into one. They must be one complete, non-overlapping set: every summary a shard
    ``K/N`` of the same N, each K from 1 to N once, each row in the shard its name hashes to (:func:`in_shard`); or
    else summaries of no shard whose model names are disjoint. ``sources``/``outdir``: each summary's file and
    the merged summary's folder; each row's file paths (``output``, ``report_json``, ``report_html``, relative to
    its summary's folder) are rewritten relative to ``outdir``, so that the merged pages link to each model's
    report wherever the shards were written. A path that is not the one batch writes for the row's name is
    dropped (None).

    Raises:
        InputError: the summaries come from different onnxfuse/onnxruntime versions, a shard is missing or given
            twice, shards of different N or of no shard are mixed, or a model is in two summaries.
    """
    label = [str(p) for p in sources] if sources else [f"summary {i + 1}" for i in range(len(summaries))]
    versions = {json.dumps(s["versions"], sort_keys=True) for s in summaries}
    if len(versions) > 1:
        raise InputError("the summaries were made with different onnxfuse/onnx/onnxruntime versions; "
                         "merge summaries of one run")
    shards = [s["shard"] for s in summaries]
    if any(shards):
        if not all(shards):
            whole = label[shards.index(None)]
            raise InputError(f"{whole} is a whole run, not a shard: merge the shards of one run, or whole runs only")
        parsed = []
        for x, where in zip(shards, label, strict=True):
            try:
                parsed.append(parse_shard(x))
            except InputError:
                raise InputError(f"{where}: shard {x!r} is not K/N with 1 <= K <= N") from None
        ns = {n for _, n in parsed}
        if len(ns) > 1:
            raise InputError(f"the summaries are shards of different splits ({', '.join(sorted(set(shards)))}); "
                             "merge the K/N shards of one N")
        n = ns.pop()
        seen: dict[int, str] = {}
        for (k, _), where in zip(parsed, label, strict=True):
            if k in seen:
                raise InputError(f"shard {k}/{n} is given twice ({seen[k]} and {where})")
            seen[k] = where
        missing = [f"{k}/{n}" for k in range(1, n + 1) if k not in seen]
        if missing:
            raise InputError(f"shard{'s' if len(missing) > 1 else ''} {', '.join(missing)} missing: a merge needs "
                             f"all {n} shards of the run (given: {', '.join(sorted(set(shards)))})")
        for s, (k, _), where in zip(summaries, parsed, label, strict=True):
            for r in s["models"]:
                if not in_shard(r["name"], (k, n)):
                    raise InputError(f"{where}: model {_shown_name(r['name'])} is not in shard {k}/{n} (its name "
                                     "belongs to another shard); merge the summaries batch wrote")
    rows: dict[str, dict] = {}
    for i, s in enumerate(summaries):
        folder = sources[i].absolute().parent if sources else None
        for r in s["models"]:
            if r["name"] in rows:
                raise InputError(f"model {_shown_name(r['name'])} is in two of the summaries ({label[i]} and "
                                 "another); merge summaries of different models")
            rows[r["name"]] = _relinked(r, folder, outdir)
    return summarize(list(rows.values()), versions=summaries[0]["versions"], shard=None,
                     engine="+".join(sorted({s["engine"] for s in summaries})),
                     wall_s=max(s["wall_s"] for s in summaries), workers=None)


def _shown_name(name: str) -> str:
    from onnxfuse.report.escape import text

    return repr(one_line(text(name), 120))


def _relinked(row: dict, folder: Path | None, outdir: Path | None) -> dict:
    """``row`` with its file paths kept only where they are the ones batch writes for its name
    (:func:`model_file`, :func:`report_files`), and made relative to ``outdir`` from ``folder``."""
    expected = {"output": model_file(row["name"]), "report_json": report_files(row["name"])[0],
                "report_html": report_files(row["name"])[1]}
    out = dict(row, reason=without_paths(row["reason"]) if row["reason"] else row["reason"])
    for key, rel in expected.items():
        if row[key] != rel or not _plain_relative(rel):
            out[key] = None
        elif folder is not None and outdir is not None:
            out[key] = Path(os.path.relpath(folder / rel, outdir.absolute())).as_posix()
    return out


def _doc_for_compare(row: dict) -> dict:
    """The parts of a report that :func:`onnxfuse.report.baseline.compare` reads, rebuilt from a summary row (fusion
    kinds are ``OP(ACTIVATION) from A -> B`` strings, ``baseline._fusion_kind``)."""
    fusions = []
    for kind, n in row["fusion_kinds"].items():
        head, _, chain = kind.partition(" from ")
        op, _, act = head.partition("(")
        fusions += [{"op": op, "activation": act[:-1] or None, "replaced": [{"op": o} for o in chain.split(" -> ")]}
                    ] * n
    return {"fusions": fusions, "unfused": [], "symbols": row.get("symbols") or {},
            "symbol_values": row.get("symbol_values") or {},
            "totals": {"saved_bytes_expr": row["saved_bytes_expr"] or "0",
                       "after": {"total_bytes_expr": row["after_bytes_expr"] or "0",
                                 "unknown_nodes": row["unknown_nodes"] or 0}}}


def compare_summaries(old: dict, new: dict) -> dict:
    """The zoo-wide gate: per model present in both whose output was written in ``old``
    (:data:`WRITTEN_STATUSES`: a ``--no-verify`` baseline's ``unverified`` rows gate too), what changed
    (``onnxfuse.report.baseline.compare`` on its fusions and optimized traffic). A model regressed when it lost a
    fusion, its optimized traffic grew, its output is no longer written, or it was ``ok`` and no longer is. Models
    added or removed are listed, never a regression.

    Returns:
        ``{"regressed": bool, "models": {name: {"regressed", "lines"}}, "added": [...], "removed": [...]}``.
    """
    from onnxfuse.report import baseline

    old_rows, new_rows = {r["name"]: r for r in old["models"]}, {r["name"]: r for r in new["models"]}
    out: dict[str, Any] = {"added": sorted(set(new_rows) - set(old_rows)),
                           "removed": sorted(set(old_rows) - set(new_rows)), "models": {}}
    for name in sorted(set(old_rows) & set(new_rows)):
        a, b = old_rows[name], new_rows[name]
        if a["status"] not in WRITTEN_STATUSES:
            continue
        if b["status"] not in WRITTEN_STATUSES or (a["status"] == "ok" and b["status"] != "ok"):
            out["models"][name] = {"regressed": True,
                                   "lines": [f"status: {b['status']} (was {a['status']}): {b['reason']}"]}
            continue
        try:
            c = baseline.compare(_doc_for_compare(a), _doc_for_compare(b))
        except (ValueError, TypeError, KeyError, RecursionError, MemoryError):  # a hand-made summary's oddities
            raise InputError(f"--baseline: the rows of model {_shown_name(name)} cannot be compared (their "
                             "fusion kinds or byte expressions are not ones onnxfuse writes)") from None
        if c.regressed:
            lines = [x for x in c.lines() if x.startswith(("fusion lost", "optimized traffic"))]
            out["models"][name] = {"regressed": True, "lines": lines}
    out["regressed"] = any(m["regressed"] for m in out["models"].values())
    return out


def _human(n: int | None) -> str:
    from onnxfuse.report.present import human_bytes

    return human_bytes(n) if n is not None else "unknown"


def to_markdown(summary: dict, gate: dict | None = None) -> str:
    """The summary as Markdown for a CI job summary: counts, then one table row per model. Every name and reason
    goes through :func:`onnxfuse.report.escape.markdown` / ``markdown_code`` (no line break, no markup from a
    file name), every link through ``escape.url_path``."""
    from onnxfuse.report.batch_html import headline, sizes_note
    from onnxfuse.report.escape import markdown, markdown_code, url_path

    def cell(s: str) -> str:
        return s.replace("|", "\\|")

    lines = ["# onnxfuse batch", "", headline(summary), ""]
    if (note := sizes_note(summary)) is not None:
        lines += [note, ""]
    lines += ["| model | status | verification | fusions | saved vs onnxruntime | saved vs graph | time | peak memory "
              "| report |", "|---|---|---|--:|--:|--:|--:|--:|---|"]
    for r in summary["models"]:
        report = (f"[html]({url_path(r['report_html'])})" if r["report_html"] else cell(markdown(r["reason"] or "")))
        if r["report_html"] and r["reason"]:
            report += " " + cell(markdown(r["reason"]))
        time_s = f"{r['time_s']:.1f} s" if r["time_s"] is not None else "-"
        verification = markdown(r["verification"]) if r["verification"] else "-"
        lines.append(f"| {cell(markdown_code(r['name']))} | {r['status']} | {verification} | "
                     f"{r['fusions'] if r['fusions'] is not None else '-'} | {_human(r['saved_bytes_beyond'])} | "
                     f"{_human(r['saved_bytes'])} | {time_s} | {_human(r['peak_memory_bytes'])} | {report} |")
    if gate is not None:
        lines += ["", "## Against the baseline", ""]
        lines += [f"- **{markdown(name)}**: " + "; ".join(markdown(x) for x in m["lines"])
                  for name, m in gate["models"].items()]
        lines += [f"- added: {markdown_code(n)}" for n in gate["added"]]
        lines += [f"- removed: {markdown_code(n)}" for n in gate["removed"]]
        lines.append("- result: " + ("REGRESSION" if gate["regressed"] else "no regression"))
    return "\n".join(lines) + "\n"


def write_summary(outdir: Path, summary: dict, gate: dict | None = None) -> list[Path]:
    """Write ``summary.json``, ``summary.md`` and ``index.html`` (:func:`summary_files`: a shard's carry its name)
    into ``outdir``, each atomically."""
    from onnxfuse.report.batch_html import to_html

    out = []
    names = summary_files(summary["shard"])
    for name, text in ((names[0], json.dumps(summary, indent=2, sort_keys=True, allow_nan=False) + "\n"),
                       (names[1], to_markdown(summary, gate)), (names[2], to_html(summary))):
        _atomic_write_bytes(outdir / name, text.encode("utf-8"))
        out.append(outdir / name)
    return out


# ---------------------------------------------------------------------------------------------------- the run

def parse_size(text: str) -> int:
    """``512M``, ``2G``, ``1.5GiB``, ``1000000`` (bytes; K/M/G/T are powers of 1024) -> bytes.

    Raises:
        InputError: malformed or not positive.
    """
    units = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1] if t and t[-1] in units else ""
    try:
        value = float(t[: len(t) - len(unit)]) * units[unit]
    except ValueError:
        value = 0
    if not value > 0:
        raise InputError(f"--max-memory {text!r}: expected a size such as 512M or 2G")
    return int(value)


@dataclass
class Plan:
    """What a batch run does: every model of the shard, which are cached, which run, and the ``error`` rows of
    those refused before any worker starts (a model or data file that is no regular file or lies outside the
    model's folder: nothing of it is read)."""

    entries: list[Entry]
    keys: dict[str, str]
    cached: list[dict]
    jobs: list[dict]
    refused: list[dict] = field(default_factory=list)


def plan(inputs: list[str], outdir: Outdir, defaults: ModelOptions, shard: tuple[int, int] | None,
         versions: dict[str, str]) -> Plan:
    """Collect the inputs, keep the shard's share, and split them into cached rows and jobs to run.

    Raises:
        InputError: as :func:`collect`; no model found.
    """
    entries = collect(inputs, defaults, exclude=outdir.path)
    if not entries:
        raise InputError("no .onnx model found in the inputs")
    if shard:
        entries = [e for e in entries if in_shard(e.name, shard)]
    hooks = read_test_hooks()
    keys, cached, jobs, refused = {}, [], [], []
    for e in entries:
        try:
            keys[e.name] = key = cache_key(e, versions)
        except InputError as exc:  # a FIFO, a device or a file outside the model's folder: refused unread
            job = make_job(e, hashlib.sha256(json.dumps([e.name, e.options.to_dict()]).encode()).hexdigest(), hooks)
            refused.append(_row(job, "error", one_line(exc)))
            continue
        row = outdir.cached(key)
        if row is not None:
            cached.append({**row, "cached": True})
        else:
            jobs.append(make_job(e, key, hooks))
    return Plan(entries, keys, cached, jobs, refused)
