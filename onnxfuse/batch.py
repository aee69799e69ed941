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
then it writes the model's cache record, last. A model whose cache record exists, with its files, is not run again
(:func:`cache_key`: the model's bytes and external data, the options, and the onnxfuse, onnx and onnxruntime
versions).

Test hook: the environment variable :data:`TEST_HOOK_ENV` holds a JSON object from a model file name to an action
that :func:`run_task` performs before the model is processed: ``"crash"`` (``os._exit(3)``), ``"crash-once:PATH"``
(exit only if the file ``PATH`` does not exist yet, creating it: the retry then succeeds), ``"sleep:SECONDS"`` and
``"allocate:BYTES"`` (a bytes object of that size). It exists for tests of the failure handling; the driver reads
it and copies each action into the model's job.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import hashlib
import json
import os
import shutil
import signal
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

SUMMARY_SCHEMA_VERSION = 1
#: The environment variable of the test hook (see the module docstring).
TEST_HOOK_ENV = "ONNXFUSE_BATCH_TEST_HOOK"
#: Models a local worker processes before it is replaced by a fresh one.
MAX_TASKS_PER_WORKER = 50
#: Memory one worker is assumed to need when ``-j`` is chosen from the machine's memory, in bytes (onnxfuse and
#: onnxruntime imported, one mid-sized model and its two onnxruntime sessions: about 1 GiB measured on the shared
#: models, see BENCHMARKS.md).
WORKER_MEMORY_ESTIMATE = 1536 * 2**20
#: Statuses of a model's row. ``ok``: optimized and verified (or verification skipped/unchanged), output written;
#: ``mismatch``: verification failed, no model written; ``error``: onnxfuse refused the model (InputError) or raised;
#: ``crashed``: the worker died; ``timeout``: past ``--timeout``; ``memory``: past ``--max-memory``.
STATUSES = ("ok", "mismatch", "error", "crashed", "timeout", "memory")
#: The hidden folder inside OUTDIR for the cache records and the staging folder.
STATE_DIR = ".onnxfuse-batch"
SUMMARY_FILES = ("summary.json", "summary.md", "index.html")


@dataclass
class ModelOptions:
    """Per-model options (a manifest row, or the command line's defaults).

    Attributes:
        input_shapes: graph input name -> dims, for symbolic dims.
        input_values: graph input name -> a fill value for verification (say ``{"sr": 16000}``).
        target / ort_level: as ``onnxfuse optimize``.
        verify: run the onnxruntime comparison.
        plugins: ``--plugin`` specs (``module:Name``) every model runs with; in the cache key as specs only (a
            changed plugin's code under the same spec reuses cached results: clear OUTDIR's cache after changing it).
    """

    target: str = "cpu+cuda"
    ort_level: str = "all"
    input_shapes: dict[str, list[int]] = field(default_factory=dict)
    input_values: dict[str, float] = field(default_factory=dict)
    verify: bool = True
    plugins: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        """JSON-ready form (part of the cache key and of each summary row; ``plugins`` only when there are)."""
        return {"target": self.target, "ort_level": self.ort_level,
                "input_shapes": {k: list(v) for k, v in sorted(self.input_shapes.items())},
                "input_values": dict(sorted(self.input_values.items())), "verify": self.verify,
                **({"plugins": list(self.plugins)} if self.plugins else {})}


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
            if not isinstance(dims, list) or not all(isinstance(d, int) and d > 0 for d in dims):
                raise InputError(f"{where}: input_shapes[{k!r}] must be a list of positive integers")
            out[str(k)] = list(dims)
        return out
    if isinstance(value, str):  # CSV: "x=1x3x224x224;y=1x8"
        return {n: list(d) for n, d in (parse_input_shape(t.strip()) for t in value.split(";") if t.strip())}
    raise InputError(f"{where}: input_shapes must be an object or NAME=DIMS;... text")


def _parse_values(value, where: str) -> dict[str, float]:
    from onnxfuse.ort.sessions import parse_input_value

    if isinstance(value, dict):
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value.values()):
            raise InputError(f"{where}: input_values must map names to numbers")
        return {str(k): v for k, v in value.items()}
    if isinstance(value, str):
        return dict(parse_input_value(t.strip()) for t in value.split(";") if t.strip())
    raise InputError(f"{where}: input_values must be an object or NAME=V;... text")


MANIFEST_FIELDS = ("path", "input_shapes", "input_values", "target", "ort_level")


def _options_from(row: dict, defaults: ModelOptions, where: str) -> ModelOptions:
    from onnxfuse.ort.levels import ORT_LEVELS
    from onnxfuse.ort.providers import TARGETS

    unknown = set(row) - set(MANIFEST_FIELDS)
    if unknown:
        raise InputError(f"{where}: unknown field(s) {', '.join(sorted(unknown))} "
                         f"(known: {', '.join(MANIFEST_FIELDS)})")
    opts = ModelOptions(**{**defaults.__dict__, "input_shapes": dict(defaults.input_shapes),
                           "input_values": dict(defaults.input_values)})
    if row.get("input_shapes"):
        opts.input_shapes = _parse_shapes(row["input_shapes"], where)
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
    "input_values": {"sr": 16000}, "target": "cpu", "ort_level": "extended"}, ...]}`` (or just the list), or a CSV
    file with a header row of those field names (``input_shapes`` as ``x=1x3x224x224;y=1x8``, ``input_values`` as
    ``sr=16000``). Relative paths are relative to the manifest's folder; omitted fields take ``defaults``.

    Raises:
        InputError: unreadable file, bad JSON/CSV, an unknown field or value, a missing ``path``.
    """
    from onnxfuse.model.files import read_option_file

    text = read_option_file(path, "manifest", 64 * 2**20).decode("utf-8", errors="replace")
    rows: list[dict[str, Any]]
    if path.suffix.lower() == ".csv":
        rows = list(csv.DictReader(text.splitlines()))
    else:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"manifest {path}: not JSON ({exc})") from None
        found = doc.get("models") if isinstance(doc, dict) else doc
        if not isinstance(found, list) or not all(isinstance(r, dict) for r in found):
            raise InputError(f"manifest {path}: expected {{\"models\": [{{\"path\": ...}}, ...]}}")
        rows = found
    out = []
    for i, row in enumerate(rows, 1):
        where = f"manifest {path}, model {i}"
        if not row.get("path"):
            raise InputError(f"{where}: no path")
        model = Path(row["path"])
        model = model if model.is_absolute() else path.parent / model
        out.append((model, _options_from({k: v for k, v in row.items() if v not in (None, "")}, defaults, where)))
    return out


def collect(inputs: Iterable[str | os.PathLike], defaults: ModelOptions, exclude: Path | None = None) -> list[Entry]:
    """The models named by ``inputs``: ``.onnx`` files, folders (every ``*.onnx`` below, recursively, in sorted
    order) and manifests (``.json``/``.csv``, :func:`read_manifest`). Each model's name is its path relative to
    the folder given (a file's own name for a file), without ``.onnx``; a name taken twice gets a short hash of
    the path appended. Files under ``exclude`` (OUTDIR) are left out.

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
    names: Counter = Counter(n for _, n, _ in found)
    out = []
    for f, name, opts in found:
        if names[name] > 1:
            name = f"{name}-{hashlib.sha256(str(f.resolve()).encode()).hexdigest()[:8]}"
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


def _content_hash(path: Path) -> str:
    """SHA-256 over the model file's bytes and those of the external data files it references (sorted by name)."""
    from onnxfuse.model.io import referenced_data_files

    h = hashlib.sha256()
    for f in [path, *(path.parent / n for n in sorted(referenced_data_files(path)))]:
        h.update(f.name.encode() + b"\0")
        with contextlib.suppress(OSError), open(f, "rb") as fh:
            for chunk in iter(functools.partial(fh.read, 1 << 20), b""):
                h.update(chunk)
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


def _row(job: dict, status: str, reason: str | None, **extra) -> dict:
    row = {"name": job["name"], "model": job.get("shown", job["path"]), "key": job["key"], "options": job["options"],
           "status": status, "reason": reason, "verification": None, "fusions": None,
           "fusions_made_by_onnxruntime": None, "fusion_kinds": {}, "saved_bytes": None, "saved_bytes_beyond": None,
           "before_bytes": None, "after_bytes": None, "after_bytes_expr": None, "saved_bytes_expr": None,
           "unknown_nodes": None, "symbols": {}, "symbol_values": {}, "time_s": None, "peak_memory_bytes": None,
           "output": None, "report_json": None, "report_html": None, "cached": False, "worker_pid": None}
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
    from onnxfuse.verification.options import VerifyOptions

    o = job["options"]
    shapes = {k: tuple(v) for k, v in o["input_shapes"].items()}
    options = pipeline.Options(target=o["target"], input_shapes=shapes, ort_level=o["ort_level"],
                               compare_with_onnxruntime=o["verify"], plugins=tuple(o.get("plugins", ())))
    verify = VerifyOptions(input_shapes=shapes, input_values=dict(o["input_values"])) if o["verify"] else None
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
    status, reason, output = "ok", None, None
    if verification["status"] == "failed":
        status, reason = "mismatch", one_line(f"the optimized model does not match the original "
                                              f"({verification['reason']}); no model written")
    else:
        output = model_file(name)
        (stage / output).parent.mkdir(parents=True, exist_ok=True)
        model_io.save_model(result.model, stage / output, external_data=result.loaded.external_data)
    t, ort = doc["totals"], doc.get("onnxruntime") or {}
    return _row(job, status, reason, verification=verification["status"], fusions=len(doc["fusions"]),
                fusions_made_by_onnxruntime=ort.get("fusions_made_by_onnxruntime"),
                fusion_kinds=_fusion_kinds(doc["fusions"]), saved_bytes=t["saved_bytes"],
                saved_bytes_beyond=ort.get("saved_bytes_beyond"), before_bytes=t["before"]["total_bytes"],
                after_bytes=t["after"]["total_bytes"], after_bytes_expr=t["after"]["total_bytes_expr"],
                saved_bytes_expr=t["saved_bytes_expr"], unknown_nodes=t["after"]["unknown_nodes"],
                symbols=doc["symbols"], symbol_values=doc["symbol_values"], output=output, report_json=rjson,
                report_html=rhtml)


# ---------------------------------------------------------------------------------------------------- OUTDIR

def _atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, data)


def _commit_order(rel: str) -> tuple[int, str]:
    """External data files first, then models (whose reference to the data is then valid), then reports."""
    return (0 if not rel.endswith((".onnx", ".json", ".html")) else 1 if rel.endswith(".onnx") else 2, rel)


class Outdir:
    """OUTDIR: the outputs, the cache records (``.onnxfuse-batch/cache/KEY.json``) and the staging folder."""

    def __init__(self, path: Path):
        self.path = path
        self.state = path / STATE_DIR
        self.cache = self.state / "cache"
        self.staging = self.state / "staging"

    def prepare(self) -> None:
        """Create the folders; remove a staging folder left by an interrupted run (its files never reached
        OUTDIR's outputs)."""
        shutil.rmtree(self.staging, ignore_errors=True)
        self.cache.mkdir(parents=True, exist_ok=True)
        self.staging.mkdir(parents=True, exist_ok=True)

    def stage_for(self, key: str) -> Path:
        """An empty staging folder for the task of cache key ``key`` (an earlier one of that key is removed)."""
        p = self.staging / key
        shutil.rmtree(p, ignore_errors=True)
        p.mkdir(parents=True)
        return p

    def cached(self, key: str) -> dict | None:
        """The row of an earlier run with this key whose files are all present, or None."""
        try:
            row = json.loads((self.cache / f"{key}.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if any(row.get(k) and not (self.path / row[k]).is_file() for k in ("output", "report_json", "report_html")):
            return None
        return row

    def commit(self, row: dict) -> dict:
        """Move (or write) the task's files into OUTDIR, each complete (``os.replace``), then record the row in
        the cache; returns the row without its file payload. Crashed, timed-out and memory rows are not cached:
        a rerun tries them again."""
        staged, files = row.pop("staged", None) or {}, row.pop("files", None) or {}
        for rel in sorted({*staged, *files}, key=_commit_order):
            target = self.path / rel
            if rel in staged:
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(staged[rel], target)
            else:
                _atomic_write_bytes(target, files[rel])
        stage = row.pop("stage", None)
        if stage:
            shutil.rmtree(stage, ignore_errors=True)
        if row["status"] in ("ok", "mismatch", "error"):
            _atomic_write_bytes(self.cache / f"{row['key']}.json", json.dumps(row, sort_keys=True).encode())
        return row

    def cleanup(self) -> None:
        """Remove the staging folder (after a run, or an interrupted one)."""
        shutil.rmtree(self.staging, ignore_errors=True)


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


def _worker_main(conn, max_memory: int | None) -> None:
    """A local worker: ignore SIGINT (the driver stops workers), cap the address space, import the library once,
    say ready, then run jobs until it receives None."""
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
    def __init__(self, ctx, max_memory: int | None):
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_worker_main, args=(child, max_memory), daemon=True)
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
                pool.append(_Worker(ctx, max_memory))
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
    """The batch summary (``batch.schema.json``): rows sorted by name, counts per status, totals."""
    models = sorted(rows, key=lambda r: r["name"])
    counts = {s: sum(1 for r in models if r["status"] == s) for s in STATUSES}

    def total(key):
        values = [r[key] for r in models if r["status"] == "ok" and r[key] is not None]
        return sum(values) if values else None

    return {"schema_version": SUMMARY_SCHEMA_VERSION, "kind": "onnxfuse-batch-summary", "versions": versions,
            "engine": engine, "workers": workers, "shard": f"{shard[0]}/{shard[1]}" if shard else None,
            "wall_s": round(wall_s, 3), "counts": counts, "cached": sum(1 for r in models if r.get("cached")),
            "totals": {"models": len(models), "fusions": total("fusions"), "saved_bytes": total("saved_bytes"),
                       "saved_bytes_beyond": total("saved_bytes_beyond"), "time_s": total("time_s")},
            "models": models}


def schema() -> dict:
    """``onnxfuse/batch.schema.json``: the JSON Schema of the summary."""
    from importlib.resources import files

    return json.loads(files("onnxfuse").joinpath("batch.schema.json").read_text(encoding="utf-8"))


def load_summary(path: str | Path, option: str) -> dict:
    """A summary written by ``onnxfuse batch``, validated against its schema.

    Raises:
        InputError: unreadable, not JSON, or not a valid summary (one line).
    """
    import jsonschema

    from onnxfuse.model.files import read_option_file

    data = read_option_file(path, option, 256 * 2**20)
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{option} {path}: not JSON ({one_line(exc, 120)})") from None
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema()).iter_errors(doc))
    if error is not None:
        where = ".".join(str(p) for p in error.absolute_path) or "the top level"
        raise InputError(f"{option} {path}: not a valid onnxfuse batch summary (at {where}: {error.validator})")
    return doc


def merge(summaries: list[dict]) -> dict:
    """Join shard summaries into one (rows by name; a name in two summaries keeps the later one).

    Raises:
        InputError: the summaries come from different onnxfuse/onnxruntime versions.
    """
    versions = {json.dumps(s["versions"], sort_keys=True) for s in summaries}
    if len(versions) > 1:
        raise InputError("the summaries were made with different onnxfuse/onnx/onnxruntime versions; "
                         "merge summaries of one run")
    rows = {r["name"]: r for s in summaries for r in s["models"]}
    return summarize(list(rows.values()), versions=summaries[0]["versions"], shard=None,
                     engine="+".join(sorted({s["engine"] for s in summaries})),
                     wall_s=max(s["wall_s"] for s in summaries), workers=None)


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
    """The zoo-wide gate: per model present in both, what changed (``onnxfuse.report.baseline.compare`` on its fusions
    and optimized traffic). A model regressed when it lost a fusion, its optimized traffic grew, or it was ``ok``
    and no longer is. Models added or removed are listed, never a regression.

    Returns:
        ``{"regressed": bool, "models": {name: {"regressed", "lines"}}, "added": [...], "removed": [...]}``.
    """
    from onnxfuse.report import baseline

    old_rows, new_rows = {r["name"]: r for r in old["models"]}, {r["name"]: r for r in new["models"]}
    out: dict[str, Any] = {"added": sorted(set(new_rows) - set(old_rows)),
                           "removed": sorted(set(old_rows) - set(new_rows)), "models": {}}
    for name in sorted(set(old_rows) & set(new_rows)):
        a, b = old_rows[name], new_rows[name]
        if a["status"] != "ok":
            continue
        if b["status"] != "ok":
            out["models"][name] = {"regressed": True, "lines": [f"status: {b['status']} (was ok): {b['reason']}"]}
            continue
        c = baseline.compare(_doc_for_compare(a), _doc_for_compare(b))
        if c.regressed:
            lines = [x for x in c.lines() if x.startswith(("fusion lost", "optimized traffic"))]
            out["models"][name] = {"regressed": True, "lines": lines}
    out["regressed"] = any(m["regressed"] for m in out["models"].values())
    return out


def _human(n: int | None) -> str:
    from onnxfuse.report.present import human_bytes

    return human_bytes(n) if n is not None else "-"


def to_markdown(summary: dict, gate: dict | None = None) -> str:
    """The summary as Markdown for a CI job summary: counts, then one table row per model."""
    c, t = summary["counts"], summary["totals"]
    lines = ["# onnxfuse batch", "",
             f"{t['models']} models: " + ", ".join(f"{n} {s}" for s, n in c.items() if n) +
             f" ({summary['cached']} from the cache); {t['fusions'] or 0} fusions; "
             f"{_human(t['saved_bytes'])} of traffic saved against the graph, "
             f"{_human(t['saved_bytes_beyond'])} against onnxruntime.", "",
             "| model | status | fusions | saved vs graph | saved vs onnxruntime | time | peak memory | report |",
             "|---|---|--:|--:|--:|--:|--:|---|"]
    for r in summary["models"]:
        report = f"[html]({r['report_html']})" if r["report_html"] else (r["reason"] or "").replace("|", "\\|")
        time_s = f"{r['time_s']:.1f} s" if r["time_s"] is not None else "-"
        lines.append(f"| `{r['name']}` | {r['status']} | {r['fusions'] if r['fusions'] is not None else '-'} | "
                     f"{_human(r['saved_bytes'])} | {_human(r['saved_bytes_beyond'])} | {time_s} | "
                     f"{_human(r['peak_memory_bytes'])} | {report} |")
    if gate is not None:
        lines += ["", "## Against the baseline", ""]
        lines += [f"- **{name}**: " + "; ".join(m["lines"]) for name, m in gate["models"].items()]
        lines += [f"- added: `{n}`" for n in gate["added"]] + [f"- removed: `{n}`" for n in gate["removed"]]
        lines.append("- result: " + ("REGRESSION" if gate["regressed"] else "no regression"))
    return "\n".join(lines) + "\n"


def write_summary(outdir: Path, summary: dict, gate: dict | None = None) -> list[Path]:
    """Write ``summary.json``, ``summary.md`` and ``index.html`` into ``outdir``, each atomically."""
    from onnxfuse.report.batch_html import to_html

    out = []
    for name, text in (("summary.json", json.dumps(summary, indent=2, sort_keys=True) + "\n"),
                       ("summary.md", to_markdown(summary, gate)), ("index.html", to_html(summary))):
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
    """What a batch run does: every model of the shard, which are cached, which run."""

    entries: list[Entry]
    keys: dict[str, str]
    cached: list[dict]
    jobs: list[dict]


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
    keys, cached, jobs = {}, [], []
    for e in entries:
        keys[e.name] = key = cache_key(e, versions)
        row = outdir.cached(key)
        if row is not None:
            cached.append({**row, "cached": True})
        else:
            jobs.append(make_job(e, key, hooks))
    return Plan(entries, keys, cached, jobs)
