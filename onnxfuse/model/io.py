"""Reading and writing model files: load and check, atomic save, external data. No graph rewiring here
(that is :mod:`onnxfuse.ir.edit`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import math
import mmap
import os
import re
import stat
import sys
import tempfile
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.json_format import ParseError
from google.protobuf.message import DecodeError
from google.protobuf.text_format import ParseError as TextParseError
from onnx.parser import ParseError as OnnxTextParseError

from onnxfuse.errors import InputError, one_line
from onnxfuse.model import hygiene, proto
from onnxfuse.model.domains import is_default_domain

#: Oldest IR version and default-domain opset that onnxfuse accepts. Opset 7 is where Conv, BatchNormalization
#: (without the removed ``spatial``/``is_test`` semantics of opset 6) and the broadcasting Add/Mul of the ONNX
#: spec (Operators.md, "Broadcasting in ONNX") all exist in the form the passes assume.
MIN_IR_VERSION = 3
MIN_OPSET = 7

#: protobuf refuses to serialize a message over 2 GiB; models above this are written with external data.
PROTOBUF_LIMIT_BYTES = 2**31 - 1

#: External initializers of the main graph with at least this many bytes stay on disk when a model is loaded with
#: ``lazy=True`` (:func:`load_model`): read when a pass reads them (:func:`external_array`), copied file to file
#: when the model is written (:func:`save_model`). Smaller ones (shapes, axes, biases) are read in at load.
LAZY_MIN_BYTES = 1 << 20

#: The ``external_data`` key that marks a tensor whose data is still on disk, in memory only: the absolute folder
#: its ``location`` is relative to (onnx's own key for it, ``onnx.external_data_helper.set_external_data``).
#: :func:`save_model` never writes it; :func:`materialize` reads such tensors in.
BASEPATH_KEY = "basepath"

#: The ``external_data`` key that marks, in memory only, a lazy tensor :func:`spill` wrote: its inline form has
#: no ``data_location`` field (a folded weight's ``make_tensor`` form), which :func:`inline_bytes` counts.
SPILLED_KEY = "onnxfuse_spilled"

#: ONNX types whose external bytes are read as ``numpy.fromfile`` of the little-endian dtype (ONNX IR.md,
#: "External tensor data": raw little-endian bytes); tensors of other types are read in at load.
_LAZY_DTYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
                          onnx.TensorProto.INT8, onnx.TensorProto.INT16, onnx.TensorProto.INT32,
                          onnx.TensorProto.INT64, onnx.TensorProto.UINT8, onnx.TensorProto.UINT16,
                          onnx.TensorProto.UINT32, onnx.TensorProto.UINT64, onnx.TensorProto.BOOL})

#: What onnx raises for bytes that are no model in the format the file's extension names (binary protobuf,
#: ``.json``, ``.textproto``, ``.onnxtxt``; onnx.serialization's registry).
_PARSE_ERRORS = (DecodeError, ParseError, TextParseError, OnnxTextParseError, RuntimeError, ValueError)


@dataclass
class LoadedModel:
    """A model read from disk (or handed over as a ModelProto) and checked.

    Attributes:
        model: the ModelProto with its external data loaded into memory (with :func:`load_model`'s ``lazy``, the
            large weights left on disk: :func:`is_lazy`); ``pipeline.analyse`` sets it to None
            once it has built a new model, to free the memory. For a ModelProto input this is a copy.
        path: the file it came from; None for a ModelProto input.
        sha256: hex SHA-256 of the model file's bytes (not of external data files); for a ModelProto input, of
            its deterministic serialization.
        file_bytes: size of the model file plus its external data files, in bytes (a ModelProto: its
            serialized size).
        external_data: True when at least one tensor was stored in an external data file.
        overridable: names of the initializers a caller may feed (:func:`overridable_initializers`): not
            constants unless the user says so (``--constant-initializer-inputs``); empty below IR version 4.
        data_files: the external data files the model reads.
        warnings: what the checks at load let through but the user should know (:func:`check_shapes`: declared
            shapes that contradict shape inference).
        name: what reports call the model instead of its path (the API's ``name``); None: the path.
        shape_inference: ``(skeleton, inferred)`` from the load's strict shape check (:func:`checked_shapes`):
            :func:`onnxfuse.model.proto.skeleton` of :attr:`model` and onnx's inference of it with data
            propagation, which ``pipeline.analyse`` uses instead of making and inferring a second skeleton; None
            when the check could not give it (external data, declared shapes that contradict inference).
            Weight-free.
        file_id: ``(st_dev, st_ino)`` of the model file as it was opened and read (``os.fstat``); None for a
            ModelProto input. :func:`save_model` refuses to replace that file (``never_replace``), whatever the
            output path has come to name since.
    """

    model: onnx.ModelProto | None
    path: Path | None
    sha256: str
    file_bytes: int
    external_data: bool
    overridable: frozenset[str] = field(default_factory=frozenset)
    data_files: tuple[Path, ...] = ()
    proto: onnx.ModelProto | None = field(default=None, repr=False)
    warnings: list[str] = field(default_factory=list)
    name: str | None = None
    shape_inference: tuple[onnx.ModelProto, onnx.ModelProto] | None = field(default=None, repr=False)
    file_id: tuple[int, int] | None = None

    @property
    def label(self) -> str:
        """How messages and reports name the model: :attr:`name` when given, else its path, else
        ``<ModelProto>``."""
        if self.name is not None:
            return self.name
        return str(self.path) if self.path is not None else "<ModelProto>"

    def ort_source(self) -> str | bytes:
        """What onnxruntime loads the original from: the file path, or the caller's ModelProto serialized
        (read only; it is never modified).

        Raises:
            TypeError: neither a path nor the caller's ModelProto is known (a LoadedModel built by hand).
        """
        if self.path is not None:
            return str(self.path)
        if self.proto is None:
            raise TypeError(f"{self.label}: neither the file nor the caller's ModelProto is known")
        return self.proto.SerializeToString()


def load_model(path: str | os.PathLike, lazy: bool = False) -> LoadedModel:
    """Read, check and return the model at ``path``.

    External data is read from files beside the model. The file itself is only read. With ``lazy`` the large
    weights stay on disk (:func:`_load_small_external`), so that memory holds only those a pass reads; such a
    model goes through :func:`materialize` before anything else reads its weights (onnxruntime, numpy_helper).

    Raises:
        InputError: with a one-line message naming the file and the cause, when the path is missing, a directory
            or empty, the bytes are not an ONNX protobuf (or are truncated), an external data reference is
            malformed (:func:`check_external_data`), its file is missing or (``lazy``) shorter than the range a
            tensor names, ``onnx.checker`` rejects the model
            (:func:`check_shapes`: as with ``full_check``), two nodes of a graph share a name
            (:func:`check_node_names`), or its IR version / opset is older than MIN_IR_VERSION / MIN_OPSET.
    """
    p = Path(path)
    _check_model_file(p)
    # The file is read once: the checker, the parse and the SHA-256 all use these bytes (the checker given the
    # path reads the file again, several times slower than on bytes). The checker runs before Python parses
    # its own copy; its verdict is reported after the more specific checks below.
    # It checks the whole model, not the weight-stripped skeleton of onnxfuse.analysis.shapes: onnx.checker (1.23)
    # compares every tensor's raw_data size with its dims and data type and refuses a tensor with no data field,
    # so a skeleton would pass truncated weights it refuses, or fail on the stripped ones. Its C++ parse of the
    # bytes is most of its cost (after the one-time operator schema set-up that shape inference would pay
    # anyway). It releases the GIL, but running it beside the parse would hold a third copy of the weights.
    fmt = onnx.serialization.registry.get_format_from_file_extension(p.suffix) or "protobuf"
    try:
        with open(p, "rb") as fh:
            opened = os.fstat(fh.fileno())  # the file read, whatever the path names later
            data = fh.read()
    except OSError as exc:
        raise InputError(f"{p}: cannot read the file ({exc.strerror or exc})") from None
    # hashlib releases the GIL on large buffers: the digest is computed on another thread while the checker and
    # the parse run (wall time; the CPU time is the same).
    digest = hashlib.sha256()
    hasher = threading.Thread(target=digest.update, args=(data,), daemon=True)
    hasher.start()
    try:
        rejected = _checker_verdict(data if fmt == "protobuf" else str(p))
        try:
            with warnings.catch_warnings():  # onnx warns on every .onnxtxt read: one line per error is the rule
                warnings.filterwarnings("ignore", message="The onnxtxt format is experimental", category=UserWarning)
                model = onnx.load_model_from_string(data, format=fmt)
        except _PARSE_ERRORS as exc:
            raise InputError(f"{p}: not a readable ONNX model (protobuf parse failed: {exc})") from None
    finally:
        hasher.join()
    sha256 = digest.hexdigest()
    del data
    _check_versions(model, str(p))
    external = [t for t in onnx.external_data_helper._get_all_tensors(model)
                if t.data_location == onnx.TensorProto.EXTERNAL]
    has_external = bool(external)
    file_bytes = p.stat().st_size
    locations: set[str] = set()
    base = p.absolute().parent  # like onnxruntime: beside the path as given (a symlinked model's data too)
    if has_external:
        for t in external:
            info = check_external_data(t, str(p))  # before any file is looked at: no existence oracle
            if not (base / info.location).is_file():
                raise InputError(f"{p}: external data file {info.location!r} of tensor {t.name!r} is missing")
            locations.add(info.location)
        file_bytes += sum((base / loc).stat().st_size for loc in locations)
    if has_external and fmt == "protobuf":
        rejected = _checker_verdict(str(p))  # on the path, so that it finds and checks the external data files
    rejected, notes = _after_hygiene(model, rejected)
    if rejected is not None:
        raise InputError(f"{p}: onnx.checker rejected the model: {one_line(rejected)}")
    check_node_names(model, str(p))
    hygiene.negative_dims_to_symbolic(model)
    warning, inferred = checked_shapes(model, str(p))
    if has_external:
        _read_external(model, base, str(p), lazy)
    overridable = overridable_initializers(model)
    return LoadedModel(model, p, sha256, file_bytes, has_external, overridable,
                       tuple(base / loc for loc in sorted(locations)),
                       warnings=notes + ([warning] if warning else []),
                       # the skeleton was made before the external data was read in: it would differ from one now
                       shape_inference=None if has_external else inferred, file_id=(opened.st_dev, opened.st_ino))


def _read_external(model: onnx.ModelProto, base: Path, label: str, lazy: bool) -> None:
    """Read ``model``'s external data from ``base`` (``lazy``: :func:`_load_small_external`).

    Raises:
        InputError: one line naming ``label`` and the defect.
    """
    try:
        if lazy:
            _load_small_external(model, base, label)
        else:
            onnx.load_external_data_for_model(model, str(base))
    except InputError:
        raise
    except Exception as exc:  # onnx raises ValidationError/OSError/ValueError here depending on the defect
        raise InputError(f"{label}: cannot read external data ({one_line(exc)})") from None


def _load_small_external(model: onnx.ModelProto, base: Path, label: str) -> None:
    """:func:`load_model`'s ``lazy`` read of external data: the main graph's external initializers of
    :data:`LAZY_MIN_BYTES` or more, of a type in :data:`_LAZY_DTYPES`, get a :data:`BASEPATH_KEY` entry (the
    model's folder) and stay on disk, read by :func:`external_array` when a pass reads them and copied file to
    file by :func:`save_model`; every other external tensor is read in as ``onnx.load_external_data_for_model``
    reads it.

    Raises:
        InputError: a large tensor's range lies beyond its file's end, or its length differs from its dims and
            type (what the read of an eager load would leave for onnx.checker or the first read to find).
    """
    sizes: dict[str, int] = {}
    for tensor in model.graph.initializer:
        if tensor.data_location != onnx.TensorProto.EXTERNAL or tensor.data_type not in _LAZY_DTYPES:
            continue
        info = onnx.external_data_helper.ExternalDataInfo(tensor)
        if info.location not in sizes:
            sizes[info.location] = (base / info.location).stat().st_size
        offset = int(info.offset or 0)
        length = int(info.length) if info.length is not None else sizes[info.location] - offset
        if length < LAZY_MIN_BYTES:
            continue
        expected = math.prod(tensor.dims) * np.dtype(_NP_OF[tensor.data_type]).itemsize
        if offset + length > sizes[info.location] or length != expected:
            raise InputError(f"{label}: tensor {tensor.name!r} names {length} bytes at offset {offset} of "
                             f"{info.location!r} ({sizes[info.location]} bytes); its dims {list(tensor.dims)} "
                             f"and type need {expected} bytes inside the file")
        tensor.external_data.add(key=BASEPATH_KEY, value=str(base))
    for tensor in onnx.external_data_helper._get_all_tensors(model):
        if onnx.external_data_helper.uses_external_data(tensor) and not is_lazy(tensor):
            onnx.external_data_helper.load_external_data_for_tensor(tensor, str(base))
            tensor.data_location = onnx.TensorProto.DEFAULT
            del tensor.external_data[:]


_NP_OF: dict[int, np.dtype] = {t: onnx.helper.tensor_dtype_to_np_dtype(t) for t in _LAZY_DTYPES}


def is_lazy(tensor: onnx.TensorProto) -> bool:
    """True when ``tensor``'s data is still on disk (:func:`load_model` with ``lazy``): it is external and has a
    :data:`BASEPATH_KEY` entry."""
    return tensor.data_location == onnx.TensorProto.EXTERNAL and any(
        e.key == BASEPATH_KEY for e in tensor.external_data)


def _external_source(tensor: onnx.TensorProto) -> tuple[Path, int, int]:
    """``(file, offset, length in bytes)`` of a lazy tensor's data (:func:`is_lazy`)."""
    entries = {e.key: e.value for e in tensor.external_data}
    offset = int(entries.get("offset") or 0)
    length = entries.get("length")
    path = Path(entries[BASEPATH_KEY]) / entries["location"]
    return path, offset, int(length) if length else path.stat().st_size - offset


def external_array(tensor: onnx.TensorProto) -> np.ndarray:
    """The values of the lazy ``tensor`` (:func:`is_lazy`): a read-only array of its dims and the numpy dtype of
    its type, memory-mapped from its file (``mmap``, read access), so that reading its shape or dtype reads no
    byte and a fold reads only what it computes from; the mapping goes with the last view of it (where no mapping
    can be made, each holding a file descriptor, the bytes are read instead). ONNX IR.md
    ("External tensor data") stores little-endian bytes: on a big-endian machine the values are a converted copy.
    The tensor is not changed.

    Raises:
        InputError: the file is unreadable or holds fewer bytes than the tensor needs (it changed since the load).
    """
    path, offset, _ = _external_source(tensor)
    dtype = np.dtype(_NP_OF[tensor.data_type]).newbyteorder("<")
    count = math.prod(tensor.dims)
    length = count * dtype.itemsize
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size < offset + length:
                raise InputError(f"tensor {tensor.name!r}: {path.name} holds {max(0, size - offset)} of its {length} "
                                 f"bytes at offset {offset} (the file changed since the model was read)")
            if not length:
                return np.empty(tuple(tensor.dims), dtype.newbyteorder("="))
            start = offset - offset % mmap.ALLOCATIONGRANULARITY
            try:
                mapped = mmap.mmap(fh.fileno(), offset + length - start, access=mmap.ACCESS_READ, offset=start)
            except OSError:  # no mapping to be had (each holds a descriptor: EMFILE, ENOMEM): read it instead
                array = np.fromfile(fh, dtype=dtype, count=count, offset=offset)
                return array.astype(dtype.newbyteorder("="), copy=False).reshape(tuple(tensor.dims))
    except (OSError, ValueError) as exc:
        raise InputError(f"tensor {tensor.name!r}: cannot read its external data from {path.name} "
                         f"({one_line(exc)})") from None
    array = np.frombuffer(mapped, dtype=dtype, count=count, offset=offset - start)
    return array.astype(dtype.newbyteorder("="), copy=False).reshape(tuple(tensor.dims))


def materialize(model: onnx.ModelProto) -> None:
    """Read every lazy tensor of ``model`` (:func:`is_lazy`, any graph) into its ``raw_data``, in place, and make
    it an ordinary inline tensor, as ``onnx.load_external_data_for_model`` leaves it: for what reads weights
    from the proto itself (onnxruntime given the model, ``onnx.numpy_helper``). Memory: the weights' size.

    Raises:
        InputError: as :func:`external_array`.
    """
    for tensor in onnx.external_data_helper._get_all_tensors(model):
        if not is_lazy(tensor):
            continue
        path, offset, length = _external_source(tensor)
        try:
            with open(path, "rb") as fh:
                fh.seek(offset)
                data = fh.read(length)
        except OSError as exc:
            raise InputError(f"tensor {tensor.name!r}: cannot read its external data from {path.name} "
                             f"({exc.strerror or exc})") from None
        if len(data) != length:
            raise InputError(f"tensor {tensor.name!r}: {path.name} holds {len(data)} of its {length} bytes at "
                             f"offset {offset} (the file changed since the model was read)")
        tensor.raw_data = data
        del data
        tensor.data_location = onnx.TensorProto.DEFAULT
        del tensor.external_data[:]


def spill(array: np.ndarray, name: str, folder: Path) -> onnx.TensorProto | None:
    """Write ``array`` to a new file in ``folder`` (zeros left as holes) and return a lazy TensorProto of it
    (:func:`is_lazy`: external, ``basepath`` ``folder``) named ``name``: a folded weight that waits for the write
    on disk rather than in memory. None, writing nothing, when its dtype is not in :data:`_LAZY_DTYPES`.

    Raises:
        OSError: the file cannot be written (disk full).
    """
    data_type = next((t for t, d in _NP_OF.items() if np.dtype(d) == array.dtype), None)
    if data_type is None:
        return None
    fd, path = tempfile.mkstemp(suffix=".data", dir=folder)
    try:
        raw = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False)
        _write_sparse(fd, raw.data, 0)
        os.ftruncate(fd, raw.nbytes)
    finally:
        os.close(fd)
    tensor = onnx.TensorProto(name=name, data_type=data_type, dims=array.shape)
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", Path(path).name), ("offset", "0"), ("length", str(raw.nbytes)),
                       (BASEPATH_KEY, str(folder)), (SPILLED_KEY, "1")):
        tensor.external_data.add(key=key, value=value)
    return tensor


def has_lazy(model: onnx.ModelProto) -> bool:
    """True when a tensor of ``model`` is lazy (:func:`is_lazy`)."""
    return any(is_lazy(t) for t in onnx.external_data_helper._get_all_tensors(model))


def _check_model_file(p: Path) -> None:
    """Refuse a ``p`` that is missing, a directory, not a regular file or empty.

    Raises:
        InputError: one line naming ``p`` and which of these it is.
    """
    if not p.exists():
        raise InputError(f"{p}: no such file")
    if p.is_dir():
        raise InputError(f"{p}: is a directory, not an ONNX model file")
    if not p.is_file():
        raise InputError(f"{p}: is not a regular file (a device or FIFO)")
    if p.stat().st_size == 0:
        raise InputError(f"{p}: the file is empty")


def _checker_verdict(source: bytes | str) -> Exception | None:
    """The error ``onnx.checker.check_model`` raises for ``source`` (serialized bytes or a path), or None."""
    try:
        onnx.checker.check_model(source)
    except (onnx.checker.ValidationError, ValueError) as exc:  # ValueError: bytes the C++ parser refuses
        return exc
    return None


def check_shapes(model: onnx.ModelProto, label: str) -> str | None:
    """Run the part of ``onnx.checker.check_model(full_check=True)`` that the plain check leaves out: strict shape
    and type inference (``onnx.shape_inference.infer_shapes(check_type=True, strict_mode=True)``).

    It refuses what onnxruntime also refuses when it loads the model: a Conv stride or dilation below 1 or a
    negative pad, a Pad naming an axis twice, BatchNormalization parameters of the wrong length, an operator's
    input of a type it does not take. It runs on the weight-free skeleton of :func:`onnxfuse.model.proto.skeleton`
    (inference reads no large tensor's data), after :mod:`onnxfuse.model.hygiene` has sorted the nodes and turned
    ``-1`` dims into unknown ones, which onnxruntime accepts and onnx's check would not.

    One defect full_check refuses is let through, with a warning: a *declared* shape (``value_info``, a graph
    output's shape) that contradicts the one the operators give. onnxruntime loads and runs such a model (it
    keeps the inferred shape), exporters leave stale declarations behind (a batch dim made dynamic in the
    inputs only), and onnxfuse never counts a declared shape
    (:func:`onnxfuse.model.proto.strip_declared_shapes`). The
    output keeps the declaration, so it fails full_check as the input does; the warning says so. Telling this case
    apart costs a second inference, only for a model that fails the first.

    Returns:
        the warning, or None.

    Raises:
        InputError: one line with onnx's message.
    """
    return checked_shapes(model, label)[0]


def checked_shapes(model: onnx.ModelProto, label: str
                   ) -> tuple[str | None, tuple[onnx.ModelProto, onnx.ModelProto] | None]:
    """:func:`check_shapes`, also returning the inference it ran when that is the one ``pipeline.analyse`` needs:
    ``(warning, (skeleton, inferred))``, where ``skeleton`` is :func:`onnxfuse.model.proto.skeleton` of ``model``
    and ``inferred`` is ``onnx.shape_inference.infer_shapes(skeleton, data_prop=True)`` (what
    :func:`onnxfuse.analysis.shapes.infer` runs), or ``(warning, None)``.

    The check first runs strict inference *with* data propagation. Where it passes, its result is the one
    :func:`onnxfuse.analysis.shapes.infer` computes (``strict_mode`` and ``check_type`` only decide whether an
    error is raised; without one, the same inference writes the same shapes: onnx
    ``shape_inference/implementation.cc``), and the check without data propagation passes too (data propagation
    only adds known dims and values, so it can only find more contradictions, never fewer). Where it fails, the
    check is made as :func:`check_shapes` describes, without data propagation, so no model is refused that was
    accepted before.

    Raises:
        InputError: as :func:`check_shapes`.
    """
    skel = proto.skeleton(model)
    errors = (onnx.shape_inference.InferenceError, onnx.checker.ValidationError)
    try:
        inferred = onnx.shape_inference.infer_shapes(skel, check_type=True, strict_mode=True, data_prop=True)
        return None, (skel, inferred)
    except errors:
        pass
    try:
        onnx.shape_inference.infer_shapes(skel, check_type=True, strict_mode=True)
        return None, None
    except errors as exc:
        declared = exc
    proto.strip_declared_shapes(skel)
    try:
        onnx.shape_inference.infer_shapes(skel, check_type=True, strict_mode=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as exc:
        raise InputError(f"{label}: onnx.checker (full_check) rejected the model: {one_line(exc)}") from None
    return (f"the model declares shapes that its operators contradict ({one_line(declared, 200)}); onnxruntime "
            "runs it and onnxfuse counts the inferred shapes, but onnx.checker with full_check rejects it, and the "
            "output keeps the declarations"), None


def check_external_data(tensor: onnx.TensorProto, label: str) -> onnx.external_data_helper.ExternalDataInfo:
    """The external data reference of ``tensor``, checked before any file is opened or looked for.

    ONNX IR.md ("External Tensor Data"): ``location`` is a path relative to the model file's folder; ``offset``
    and ``length`` are non-negative byte counts. A location that is absolute or has a ``..`` part is refused
    whether or not such a file exists (onnx.checker and onnxruntime refuse it too, but only once they find the
    file, so the message would tell whether a file outside the folder exists).

    Raises:
        InputError: an empty, absolute or escaping location, or an offset or length that is not a non-negative
            integer.
    """
    entries = {e.key: e.value for e in tensor.external_data}
    location = entries.get("location", "")
    parts = location.replace("\\", "/").split("/")
    if not location or os.path.isabs(location) or location.startswith(("/", "\\")) or ".." in parts:
        raise InputError(f"{label}: tensor {tensor.name!r} has external data location {location!r}, which is not "
                         "a file inside the model's folder")
    for key in ("offset", "length"):
        if key in entries:
            value = entries[key].strip()
            if not (value.isascii() and value.isdigit()):
                raise InputError(f"{label}: tensor {tensor.name!r} has external data {key} {entries[key]!r}; "
                                 "it must be a non-negative integer (bytes)")
    try:
        return onnx.external_data_helper.ExternalDataInfo(tensor)
    except ValueError as exc:
        raise InputError(f"{label}: tensor {tensor.name!r}: {one_line(exc)}") from None


def check_node_names(model: onnx.ModelProto, label: str) -> None:
    """Refuse two nodes of one graph (the main graph or a subgraph body) with the same non-empty name.

    onnx.checker allows it; onnxruntime refuses to load such a model ("two nodes with same node name",
    onnxruntime/core/graph/graph.cc), and the report would not tell the nodes apart.

    Raises:
        InputError: naming the graph and the repeated node name.
    """
    for graph in hygiene.all_graphs(model):
        seen: set[str] = set()
        for node in graph.node:
            if node.name and node.name in seen:
                raise InputError(f"{label}: two nodes of graph {graph.name!r} are named {node.name!r}; onnxruntime "
                                 "refuses to load such a model")
            seen.add(node.name)


def _ints(node: onnx.NodeProto, name: str) -> list[int] | None:
    for a in node.attribute:
        if a.name == name:
            return list(a.ints)
    return None


def _int(node: onnx.NodeProto, name: str, default: int) -> int:
    for a in node.attribute:
        if a.name == name:
            return a.i
    return default


def check_convs(model: onnx.ModelProto, info: dict, label: str) -> None:
    """Refuse a Conv or ConvTranspose (in any graph) whose attributes or weight and bias shapes contradict each
    other or its input, as onnxruntime would only when it runs the node (its load accepts them).

    ``info``: tensor name -> ``(shape, dtype)`` from :func:`onnxfuse.analysis.shapes.infer`; a dim that is not an int is
    not checked. The rules (ONNX Operators.md, Conv and ConvTranspose; onnxruntime's conv_attributes.h):
    ``group`` >= 1; ``strides`` and ``dilations`` > 0 and ``pads`` >= 0, one per spatial axis (two for pads);
    X and W of the same rank; ``kernel_shape`` equal to W's spatial dims; Conv: X's channels C = W.shape[1] x
    group and W.shape[0] (M) a multiple of group; ConvTranspose: C = W.shape[0], a multiple of group; the bias
    B one-dimensional with M elements (ConvTranspose: M = W.shape[1] x group).

    Raises:
        InputError: one line naming the node and the contradiction.
    """
    for graph in hygiene.all_graphs(model):
        for node in graph.node:
            if not is_default_domain(node.domain) or node.op_type not in ("Conv", "ConvTranspose"):
                continue
            problem = _conv_problem(node, info)
            if problem:
                raise InputError(f"{label}: {node.op_type} {node.name or node.output[0]!r}: {problem}")


def _conv_problem(node: onnx.NodeProto, info: dict) -> str | None:
    def shape(i: int):
        if len(node.input) <= i or not node.input[i]:
            return None
        return (info.get(node.input[i]) or (None, None))[0]

    group = _int(node, "group", 1)
    if group < 1:
        return f"group is {group}; it must be at least 1"
    for name, low in (("strides", 1), ("dilations", 1), ("pads", 0)):
        values = _ints(node, name)
        if values and min(values) < low:
            return f"{name} {values} must all be {'positive' if low else 'non-negative'}"
    x, w, b = shape(0), shape(1), shape(2)
    if w is None:
        return None
    spatial = len(w) - 2
    if spatial < 1:
        return f"the weight has rank {len(w)}; it needs at least 3 dims (M, C/group, kernel...)"
    if x is not None and len(x) != len(w):
        return f"the input has rank {len(x)} and the weight rank {len(w)}; they must be equal"
    for name, count in (("strides", spatial), ("dilations", spatial), ("pads", 2 * spatial),
                        ("kernel_shape", spatial)):
        values = _ints(node, name)
        if values is not None and len(values) != count:
            return f"{name} {values} has {len(values)} values; the {spatial}-d kernel needs {count}"
    kernel = _ints(node, "kernel_shape")
    if kernel is not None and all(isinstance(d, int) for d in w[2:]) and list(w[2:]) != kernel:
        return f"kernel_shape {kernel} differs from the weight's spatial dims {list(w[2:])}"
    c = x[1] if x is not None and len(x) > 1 and isinstance(x[1], int) else None
    if node.op_type == "Conv":
        m = w[0] if isinstance(w[0], int) else None
        if c is not None and isinstance(w[1], int) and c != w[1] * group:
            return (f"the input has {c} channels but the weight and group expect {w[1] * group} "
                    f"(W.shape[1] {w[1]} x group {group})")
        if m is not None and m % group:
            return f"group {group} does not divide the {m} output channels"
    else:
        if c is not None and isinstance(w[0], int) and c != w[0]:
            return f"the input has {c} channels but the weight expects {w[0]} (W.shape[0])"
        if isinstance(w[0], int) and w[0] % group:
            return f"group {group} does not divide the {w[0]} input channels"
        m = w[1] * group if isinstance(w[1], int) else None
    if b is not None and (len(b) != 1 or (m is not None and isinstance(b[0], int) and b[0] != m)):
        return f"the bias has shape {list(b)}; it must be one-dimensional with {m} elements (one per output channel)"
    return None


def overridable_initializers(model: onnx.ModelProto) -> frozenset[str]:
    """Names of the main graph's initializers that a caller may override by feeding a graph input of that name.

    onnxruntime's rule (``onnxruntime/core/graph/graph.h``, ``Graph::CanOverrideInitializer``: ``ir_version_ >=
    4``): from IR version 4 on, an initializer that is also listed as a graph input is a default value that the
    caller may replace; before IR version 4 the ONNX format required every initializer to be listed as a graph
    input (ONNX IR.md, "Graphs"), so there the listing says nothing and onnxruntime treats the initializer as a
    constant (its optimizer folds and fuses it at load). Empty below IR version 4, else the initializers that are
    also graph inputs.
    """
    if model.ir_version < 4:
        return frozenset()
    return frozenset({t.name for t in model.graph.initializer} & {i.name for i in model.graph.input})


def _check_versions(model: onnx.ModelProto, label: str) -> None:
    if not model.ir_version or not model.HasField("graph"):
        raise InputError(f"{label}: not an ONNX model (no IR version or graph in the file)")
    if model.ir_version < MIN_IR_VERSION:
        raise InputError(f"{label}: IR version {model.ir_version} is older than the oldest supported "
                         f"({MIN_IR_VERSION})")
    opset = default_opset(model)
    if opset is None or opset < MIN_OPSET:
        raise InputError(
            f"{label}: ai.onnx opset {opset} is older than the oldest supported ({MIN_OPSET}); "
            "upgrade it with onnx.version_converter"
        )


def load_proto(model: onnx.ModelProto) -> LoadedModel:
    """Check an in-memory ``model`` and wrap a copy of it; ``model`` itself is never modified.

    Tensors stored as external data must already be loaded into ``model`` (``onnx.load`` does that by default).

    Raises:
        InputError: ``model`` is not a ModelProto, has tensors whose external data is not loaded, is rejected by
            ``onnx.checker`` (:func:`check_shapes`: as with ``full_check``), has two nodes of a graph with one
            name, or its IR version / opset is older than MIN_IR_VERSION / MIN_OPSET.
    """
    label = "<ModelProto>"
    if not isinstance(model, onnx.ModelProto):
        raise InputError(f"expected an onnx.ModelProto or a path, got {type(model).__name__}")
    _check_versions(model, label)
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in onnx.external_data_helper._get_all_tensors(model)):
        raise InputError(f"{label}: it refers to external data that is not loaded; pass its path instead, or "
                         "load it with onnx.load(path) (load_external_data=True)")
    try:
        data = model.SerializeToString(deterministic=True)
    except Exception as exc:
        raise InputError(f"{label}: it cannot be serialized ({one_line(exc)}); models over 2 GiB must be "
                         "passed as a path with external data") from None
    copy = onnx.ModelProto()
    copy.ParseFromString(data)
    rejected, notes = _after_hygiene(copy, _recheck(data))
    if rejected is not None:
        raise InputError(f"{label}: onnx.checker rejected the model: {one_line(rejected)}") from None
    check_node_names(copy, label)
    hygiene.negative_dims_to_symbolic(copy)
    warning, inferred = checked_shapes(copy, label)
    overridable = overridable_initializers(copy)
    return LoadedModel(copy, None, hashlib.sha256(data).hexdigest(), len(data), False, overridable, (), model,
                       notes + ([warning] if warning else []), shape_inference=inferred)


def _after_hygiene(model: onnx.ModelProto, rejected: Exception | None) -> tuple[Exception | None, list[str]]:
    """The checker's verdict on ``model`` once what onnxruntime accepts is put right (in place, only when it was
    ``rejected``): nodes sorted (onnxruntime sorts too; the checker does not), then :func:`repair_for_checker`.
    Returns ``(verdict, notes of the repairs)``."""
    if rejected is not None and hygiene.sort_topologically(model):
        rejected = _recheck(model)
    if rejected is None:
        return None, []
    return repair_for_checker(model)


def repair_for_checker(model: onnx.ModelProto) -> tuple[Exception | None, list[str]]:
    """Repair in place, in a model ``onnx.checker`` rejected, what onnxruntime loads as it is
    (:mod:`onnxfuse.model.hygiene`): IR 3 initializers not all listed as graph inputs
    (:func:`~onnxfuse.model.hygiene.list_ir3_initializers`), graph outputs without a type or shape
    (:func:`~onnxfuse.model.hygiene.type_untyped_outputs`, shapes from onnx shape
    inference on the weight-free skeleton). The written model keeps the repair, so it passes the checker.

    Returns:
        ``(the checker's verdict after the repair (None: it passes), one note per repair made)``; a model that
        still fails is refused by the caller with that verdict, as onnxruntime would refuse what is left.
    """
    notes = []
    listed = hygiene.list_ir3_initializers(model)
    if listed:
        notes.append(f"initializer {_names(listed)} {'was' if len(listed) == 1 else 'were'} not listed as a "
                     "graph input, which IR version 3 requires (onnx.checker refuses it; onnxruntime loads it): "
                     "the output lists every initializer")
    # initializers that are graph outputs first: shape inference reads their declared (shapeless) output type
    typed, _ = hygiene.type_untyped_outputs(model, None)
    try:
        inferred: onnx.ModelProto | None = onnx.shape_inference.infer_shapes(proto.skeleton(model))
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError):
        inferred = None
    typed += hygiene.type_untyped_outputs(model, inferred)[0]
    if typed:
        notes.append(f"graph output {_names(typed)} had no type or shape (onnx.checker refuses it; onnxruntime "
                     "infers it): the output declares the one onnx shape inference gives")
    verdict = _recheck(model)
    shapeless = [vi.name for vi in model.graph.input if vi.type.WhichOneof("value") == "tensor_type"
                 and vi.type.tensor_type.elem_type and not vi.type.tensor_type.HasField("shape")]
    if verdict is not None and shapeless:
        # onnxruntime takes an input of any shape there; the checker judges the rest on a copy that gives those
        # inputs an empty shape field (the plain check reads no dims), the model itself is left as it is
        probe = onnx.ModelProto()
        probe.CopyFrom(model)
        for vi in probe.graph.input:
            if vi.name in shapeless:
                vi.type.tensor_type.shape.SetInParent()
        verdict = _recheck(probe)
        if verdict is None:
            notes.append(f"graph input {_names(shapeless)} has no shape (onnx.checker refuses it; onnxruntime takes "
                         "any shape): its sizes are unknown, give --input-shape; the output keeps the input as it "
                         "is, so it fails onnx.checker as the input does")
    return verdict, notes


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _recheck(model: onnx.ModelProto | bytes) -> Exception | None:
    """onnx.checker's verdict on an in-memory model: None when it passes, else the error."""
    try:
        onnx.checker.check_model(model)
    except (onnx.checker.ValidationError, ValueError) as exc:
        return exc
    return None


def default_opset(model: onnx.ModelProto) -> int | None:
    """Version of the default ONNX domain (``""`` or ``"ai.onnx"``) that ``model`` imports, or None."""
    for imp in model.opset_import:
        if is_default_domain(imp.domain):
            return imp.version
    return None


# ---------------------------------------------------------------------------------------------------------------
# Saving


def exceeds_protobuf_limit(model: onnx.ModelProto) -> bool:
    """True when ``model`` cannot be serialized as one protobuf message (over 2 GiB; protobuf then raises
    instead of returning a size).

    The size is the sum of the sizes of the graph's parts (:func:`serialized_parts`), which is what
    ``ModelProto.ByteSize()`` would return without serializing the whole model at once (upb's ``ByteSize`` encodes
    the message, as slowly as ``SerializeToString``).
    """
    try:
        return serialized_parts(model)[1] > PROTOBUF_LIMIT_BYTES
    except Exception:
        return True


def _varint(value: int) -> bytes:
    """``value`` (>= 0) as a protobuf base-128 varint (protobuf encoding guide, "Base 128 Varints")."""
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        if not value:
            out.append(low)
            return bytes(out)
        out.append(low | 0x80)


def _one_field(message_type, desc, value) -> bytes:
    """The wire bytes of one (possibly repeated) field: a message holding only that field, serialized."""
    tmp = message_type()
    target = getattr(tmp, desc.name)
    if desc.is_repeated:
        target.extend(value)
    elif desc.type == desc.TYPE_MESSAGE:
        target.CopyFrom(value)
    else:
        setattr(tmp, desc.name, value)
    return tmp.SerializeToString(deterministic=True)


def _has_unknown_fields(message) -> bool:
    from google.protobuf import unknown_fields

    return len(unknown_fields.UnknownFieldSet(message)) > 0


#: The fields of a TensorProto of raw bytes (``make_tensor(..., raw=True)``), which :func:`_message_size` sizes
#: without encoding; every other field, ``(name, repeated)``.
_RAW_FIELDS = frozenset({"name", "data_type", "dims", "raw_data"})
_OTHER_FIELDS = tuple((f.name, f.is_repeated) for f in onnx.TensorProto.DESCRIPTOR.fields if f.name not in _RAW_FIELDS)


def _int_varint_size(value: int) -> int:
    """Bytes of an int32/int64 field's varint: a negative value takes 10 (protobuf encoding guide, "Signed
    Integers")."""
    return 10 if value < 0 else len(_varint(value))


def _message_size(message) -> int:
    """``message.ByteSize()``; for a large TensorProto of raw bytes alone (name, data type, dims, raw_data; the
    form folds write), computed from its fields instead: upb's ByteSize encodes the message, which held two more
    copies of a folded weight at once (the report sized the model at its peak). Reading the length of
    ``raw_data`` still copies it once."""
    if not isinstance(message, onnx.TensorProto) or math.prod(message.dims) < LAZY_MIN_BYTES // 8 \
            or not (message.HasField("raw_data") and message.HasField("data_type")) \
            or any(len(getattr(message, name)) if repeated else message.HasField(name)
                   for name, repeated in _OTHER_FIELDS):
        return message.ByteSize()
    size = 1 + _int_varint_size(message.data_type) + sum(1 + _int_varint_size(d) for d in message.dims)
    if message.HasField("name"):
        name = len(message.name.encode("utf-8"))
        size += 1 + len(_varint(name)) + name
    raw = len(message.raw_data)
    return size + 1 + len(_varint(raw)) + raw


def serialized_parts(model: onnx.ModelProto) -> tuple[list, int]:
    """Plan ``model``'s serialization in parts: ``(parts, total bytes)``.

    Each part is either ``bytes`` or a message (a graph's node, initializer, value info, ...) to be serialized on
    its own when written, so that the whole model never exists as one ``bytes`` object and every weight is
    encoded once. Concatenating the parts (messages serialized with ``deterministic=True``) gives exactly
    ``model.SerializeToString(deterministic=True)``: deterministic protobuf serialization writes known fields in
    field-number order, which ``ListFields`` returns, and a length-delimited field is its tag, the varint length
    and the bytes (protobuf encoding guide, "Length-Delimited Records"). Models with fields this onnx version
    does not know (unknown fields), which would be written at the end, are planned as one whole message.

    Raises:
        whatever protobuf raises for a part over 2 GiB (``ByteSize`` of that part).
    """
    if _has_unknown_fields(model) or (model.HasField("graph") and _has_unknown_fields(model.graph)):
        return [model], model.ByteSize()
    parts: list = []
    total = 0
    for desc, value in model.ListFields():
        if desc.name != "graph":
            data = _one_field(onnx.ModelProto, desc, value)
            parts.append(data)
            total += len(data)
            continue
        graph_parts: list = []
        graph_size = 0
        for gdesc, gvalue in value.ListFields():
            if gdesc.is_repeated and gdesc.type == gdesc.TYPE_MESSAGE:
                tag = _varint(gdesc.number << 3 | 2)
                for element in gvalue:
                    size = _message_size(element)
                    head = tag + _varint(size)
                    graph_parts += (head, element)
                    graph_size += len(head) + size
            else:
                data = _one_field(onnx.GraphProto, gdesc, gvalue)
                graph_parts.append(data)
                graph_size += len(data)
        head = _varint(desc.number << 3 | 2) + _varint(graph_size)
        parts.append(head)
        parts += graph_parts
        total += len(head) + graph_size
    return parts, total


def inline_bytes(model: onnx.ModelProto) -> int:
    """Bytes of ``model`` serialized with every weight inline: :func:`serialized_parts`'s total, where each lazy
    main-graph initializer (:func:`is_lazy`) counts as the tensor an eager load gives (its ``raw_data`` of the
    external length instead of its ``external_data`` entries; ``data_location`` is set either way, 2 bytes,
    except for a spilled fold, :data:`SPILLED_KEY`, whose inline form has none), so
    that the report's figure does not depend on how the model was loaded (protobuf encoding guide,
    "Length-Delimited Records").

    Raises:
        as :func:`serialized_parts`.
    """
    total = serialized_parts(model)[1]
    lazy = [t for t in model.graph.initializer if is_lazy(t)]
    if not lazy or not model.HasField("graph"):
        return total
    delta = 0
    for tensor in lazy:
        old = tensor.ByteSize()
        length = _external_source(tensor)[2]
        entries = sum(1 + len(_varint(e.ByteSize())) + e.ByteSize() for e in tensor.external_data)
        spilled = any(e.key == SPILLED_KEY for e in tensor.external_data)  # no data_location inline: 2 bytes less
        new = old - entries + 1 + len(_varint(length)) + length - (2 if spilled else 0)
        delta += len(_varint(new)) + new - len(_varint(old)) - old
    graph = 0
    for gdesc, gvalue in model.graph.ListFields():
        if gdesc.is_repeated and gdesc.type == gdesc.TYPE_MESSAGE:
            graph += sum(len(_varint(gdesc.number << 3 | 2)) + len(_varint(n)) + n
                         for n in (_message_size(element) for element in gvalue))
        else:
            graph += len(_one_field(onnx.GraphProto, gdesc, gvalue))
    return total + delta + len(_varint(graph + delta)) - len(_varint(graph))


def write_parts(path: str | os.PathLike, parts: list) -> None:
    """Write the parts of :func:`serialized_parts` to ``path`` one at a time (each message serialized with
    ``deterministic=True`` as it is written), so that the whole model never exists as one ``bytes`` object.

    Raises:
        OSError: the file cannot be written (callers turn it into their own message).
    """
    with open(path, "wb") as fh:
        for part in parts:
            fh.write(part if isinstance(part, bytes) else part.SerializeToString(deterministic=True))


#: Name of the new weights inside the temporary folder, before they get their content-derived name.
_STAGED_DATA = "weights.data"


def data_file_name(model_name: str, digest: str, name_max: int = 255) -> str:
    """The external data file name of a model file named ``model_name`` whose weights have SHA-256 ``digest``
    (hex): ``<model_name>.<first 16 hex digits>.data``, the model name shortened from its end where the whole
    would exceed ``name_max`` bytes (a file system's NAME_MAX). Named by content, a new data file never takes the
    name of the one an older OUTPUT references (unless the bytes are the same), and the same weights always get the
    same name: the written model's bytes do not depend on what was in the folder before."""
    suffix = f".{digest[:16]}.data"
    stem = model_name
    while len(os.fsencode(stem + suffix)) > name_max:
        stem = stem[:-1]
    return stem + suffix


def referenced_data_files(path: Path) -> set[str]:
    """The external data locations that the model file ``path`` references (names relative to its folder); an
    empty set when ``path`` is missing, not a regular file, or not a readable ONNX model. Reads the model without
    its external data."""
    try:
        # a model file over 64 MiB holds its weights inline: not read (its memory), nothing cleaned up after it
        if not path.is_file() or path.stat().st_size > 64 * 2**20:
            return set()
        old = onnx.load_model(str(path), load_external_data=False)
        return {onnx.external_data_helper.ExternalDataInfo(t).location
                for t in onnx.external_data_helper._get_all_tensors(old)
                if t.data_location == onnx.TensorProto.EXTERNAL}
    except Exception:  # anything unreadable references nothing onnxfuse could clean up
        return set()


def save_model(model: onnx.ModelProto, path: str | os.PathLike, external_data: bool = False,
               protected: tuple[Path, ...] = (), never_replace: tuple[int, int] | None = None,
               in_place: bool = False) -> list[Path]:
    """Write ``model`` to ``path`` atomically and return the files written.

    Without external data the model is written to a temporary folder in the target folder and moved into place
    with ``os.replace``, which is atomic on POSIX. With ``external_data``, or when the model exceeds protobuf's 2 GiB
    limit, the weights go to one data file named by their content (:func:`data_file_name`), so the commit is the
    one rename of the model file:

    1. the model and its data file are written and fsynced in the temporary folder;
    2. the data file is moved beside ``path`` under its new name, which the old model at ``path`` does not
       reference (same name only for the same bytes);
    3. the model is moved onto ``path``: the commit point;
    4. the data files the old model referenced and the new one does not are removed, where they are onnxfuse's
       own (``<name>.data`` or :func:`data_file_name`'s form; with ``in_place``, any the input referenced in its
       folder), not ``protected`` (with ``in_place``, the input's own are not protected from removal, only from
       being replaced) and no other model file in the folder references them (:func:`_used_elsewhere`).

    A replaced ``path`` keeps its permission bits (a 0600 model stays 0600, its data file too); a new file gets
    0666 less the umask. Lazy weights (:func:`is_lazy`) are copied from their files.

    A crash or failure at any point leaves the old model with its data, or the new model with its data, never a
    mix; a failure before step 3 removes what step 2 moved. A ``path`` that is a symbolic link is written through:
    the file it points to is replaced and the link stays. Writing external data moves the weights out of
    ``model`` into the file; they stay lazy there (:func:`is_lazy`).

    Args:
        protected: files that must not be replaced or removed (the input model's external data files).
        in_place: ``path`` is the input model itself (``--in-place``): the data files only it referenced are
            removed once it is replaced, ``protected`` or not, unless another model in the folder references them.
        never_replace: ``(st_dev, st_ino)`` of a file that must not be replaced (the input model as it was read,
            :attr:`LoadedModel.file_id`): checked where ``path`` leads before anything is written, and again on
            the file at the commit point (``os.lstat``), so that an OUTPUT that has become a symbolic or hard link
            to INPUT (or sits in a folder swapped for INPUT's) during the run never replaces it.

    Raises:
        InputError: the target is not a regular file, its folder does not exist or is not writable, the data
            file would replace a protected file, ``path`` leads to the ``never_replace`` file, or writing failed
            (disk full, I/O error); the temporary folder and any moved data file are removed first, and nothing at
            ``path`` changed.
    """
    given = Path(path)
    target, folder = _output_place(given)
    _check_not_replacing(given, target, never_replace, os.stat)
    parts = None if has_lazy(model) else _inline_parts(model, external_data)
    if parts is None and given.is_symlink() and Path(os.path.abspath(given)).parent.resolve() != folder:
        raise InputError(f"{given}: is a symbolic link into another folder ({folder}), and the model has external "
                         "data, which onnx and onnxruntime look for beside the path they open: give the real path")
    old_locations, old_mode = _old_output(target, folder, in_place)
    tmpdir = _temporary_folder(given, folder)
    written: list[Path] = []
    moved, location = None, None
    repointed: list = []  # lazy tensors pointed at the new data file (back to their old one unless committed)
    try:
        tmp_model = tmpdir / "model.onnx"
        if parts is None:
            location = _stage_external(model, tmpdir, tmp_model, target.name, folder, repointed)
        else:
            write_parts(tmp_model, parts)  # streamed: the whole model is never one bytes object
        _give_mode(old_mode, tmp_model, None if location is None else tmpdir / _STAGED_DATA)
        if location is not None:
            moved = _place_data_file(given, tmpdir, folder, location, protected)
            written.append(given.parent / location)
        _fsync(tmp_model)
        _commit_hook()
        _check_not_replacing(given, target, never_replace, os.lstat)
        os.replace(tmp_model, target)  # the commit point
        moved, parts, repointed = None, [], []  # committed: the weights are the data file's now (nothing to restore)
        _mark_lazy(model, location, folder)
        _fsync_folder(folder)
        written.insert(0, given)
    except OSError as exc:
        raise InputError(f"{given}: cannot write the output ({exc.strerror or exc}); nothing was written") from None
    finally:
        if parts is None:  # not committed: the written weights come back into ``model``
            _undo_write(model, repointed, location, (tmpdir / _STAGED_DATA, moved))
        _discard(tmpdir, moved)
    _remove_stale_data(folder, target, old_locations - {location}, () if in_place else protected, in_place)
    return written


def _old_output(target: Path, folder: Path, in_place: bool) -> tuple[set[str], int | None]:
    """(the data files the file at ``target`` references, its permission bits): what :func:`save_model` cleans up
    after it and keeps. The old file is read only when ``in_place`` or when a data file of onnxfuse's form for it
    is in ``folder``: reading a large inline model just to find it references none cost its size in memory and
    0.1 s on 57 MB."""
    ours = in_place or any(p.name.endswith(".data") and _own_data_name(target.name, p.name) for p in folder.iterdir())
    return referenced_data_files(target) if ours else set(), _mode_of(target)


def _undo_write(model: onnx.ModelProto, repointed: list, location: str | None, sources: tuple[Path | None, ...]
                ) -> None:
    """Undo an external-data write that was not committed: the lazy tensors read their old files again
    (:func:`_repoint`), the others get their bytes back (:func:`_restore_weights`)."""
    _repoint(repointed)
    if location is not None:
        _restore_weights(model, {location}, sources)


def _mark_lazy(model: onnx.ModelProto, location: str | None, folder: Path) -> None:
    """After the commit: every main-graph initializer the write put in the data file ``location`` (None: none)
    becomes lazy
    (:func:`is_lazy`) on that file in ``folder``, so that ``model`` stays whole in memory: readable
    (:func:`external_array`, :func:`materialize`) and writable again (:func:`save_model`)."""
    if location is None:
        return
    for tensor in model.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL and not is_lazy(tensor) and any(
                e.key == "location" and e.value == location for e in tensor.external_data):
            tensor.external_data.add(key=BASEPATH_KEY, value=str(folder))


def _restore_weights(model: onnx.ModelProto, names: set[str], sources: tuple[Path | None, ...]) -> None:
    """Undo a failed external-data write on ``model`` (in memory): the write marks each tensor external and clears
    its ``raw_data`` once the data file holds it, so a failure after that (the model file's write, the commit)
    left the caller's model without those weights (a retry of the save wrote a broken model). Each tensor that
    onnxfuse's write made external (its location one of ``names``: ``weights.data`` or the content name; lazy
    ones are :func:`_repoint`'s) gets its bytes back from the first of ``sources`` that exists, the staged or moved
    data file, and is inline again.

    Raises:
        OSError: the data file cannot be read back (the save's own error is then the one reported).
    """
    staged = [t for t in onnx.external_data_helper._get_all_tensors(model)
              if t.data_location == onnx.TensorProto.EXTERNAL and not is_lazy(t)
              and any(e.key == "location" and e.value in names for e in t.external_data)]
    source = next((p for p in sources if p is not None and p.is_file()), None)
    for tensor in staged:
        if not tensor.HasField("raw_data"):
            if source is None:
                continue
            info = onnx.external_data_helper.ExternalDataInfo(tensor)
            with open(source, "rb") as fh:
                fh.seek(info.offset or 0)
                tensor.raw_data = fh.read(info.length) if info.length is not None else fh.read()
        del tensor.external_data[:]
        tensor.data_location = onnx.TensorProto.DEFAULT


def _give_mode(mode: int | None, *paths: Path | None) -> None:
    """Give ``paths`` (None: skipped) the permission bits ``mode`` of the file they replace (None: keep theirs)."""
    for path in paths:
        if mode is not None and path is not None:
            os.chmod(path, mode)


def _mode_of(target: Path) -> int | None:
    """The permission bits of the regular file ``target``; None when there is none."""
    try:
        found = os.stat(target)
    except OSError:
        return None
    return stat.S_IMODE(found.st_mode) if stat.S_ISREG(found.st_mode) else None


def _check_not_replacing(given: Path, target: Path, never_replace: tuple[int, int] | None, stat_of) -> None:
    """Refuse when ``target`` (``stat_of``: ``os.stat`` follows a symbolic link, ``os.lstat`` looks at the entry
    that ``os.replace`` would replace) is the file ``never_replace`` identifies.

    Raises:
        InputError: it is; nothing has been written or moved yet.
    """
    if never_replace is None:
        return
    try:
        found = stat_of(target)
    except OSError:  # nothing there (yet): nothing to replace
        return
    if (found.st_dev, found.st_ino) == tuple(never_replace):
        raise InputError(f"{given}: now leads to the input model (a link or a moved folder made since the run "
                         "began); the input was not replaced and nothing was written")


def _output_place(given: Path) -> tuple[Path, Path]:
    """(the file :func:`save_model` replaces, its folder): ``given`` made absolute, or the file a symbolic link
    points to.

    Raises:
        InputError: ``given`` exists and is not a regular file, or its folder does not exist or is not writable.
    """
    if given.exists() and not given.is_file():
        raise InputError(f"{given}: exists and is not a regular file (a device, FIFO or folder); "
                         "onnxfuse will not replace it")
    target = given.resolve() if given.is_symlink() else Path(os.path.abspath(given))
    folder = target.parent
    if not folder.is_dir():
        raise InputError(f"{given}: the output folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise InputError(f"{given}: the output folder {folder} is not writable")
    return target, folder


def _inline_parts(model: onnx.ModelProto, external_data: bool) -> list | None:
    """The parts of :func:`serialized_parts` when ``model`` is written as one file; None when its weights go to
    an external data file: ``external_data`` asks for it, or the model exceeds PROTOBUF_LIMIT_BYTES."""
    if external_data:
        return None
    try:
        parts, size = serialized_parts(model)
    except Exception:  # a part over 2 GiB: protobuf raises instead of sizing it
        return None
    return parts if size <= PROTOBUF_LIMIT_BYTES else None


def _temporary_folder(given: Path, folder: Path) -> Path:
    """A new temporary folder in ``folder``, where :func:`save_model` writes before it moves into place.

    Raises:
        InputError: the folder takes no new file.
    """
    try:  # a short name: OUTPUT names up to NAME_MAX must not fail on the temporary one
        return Path(tempfile.mkdtemp(prefix=".onnxfuse-", suffix=".tmp", dir=folder))
    except OSError as exc:  # /proc, /sys: the folder passes os.access but takes no new file
        raise InputError(f"{given}: cannot write in the output folder {folder} ({exc.strerror or exc}); "
                         "nothing was written") from None


def _place_data_file(given: Path, tmpdir: Path, folder: Path, location: str, protected: tuple[Path, ...]
                     ) -> Path | None:
    """Step 2 of :func:`save_model`: move the staged data file to ``folder / location``; the path moved
    (None when the same bytes are already there under that name, a rerun: they are kept as they are).

    Raises:
        InputError: that path is one of the ``protected`` files.
        OSError: the move failed.
    """
    final = folder / location
    if _same_bytes(final, tmpdir / _STAGED_DATA):
        return None
    if any(same_file(final, p) for p in protected):
        raise InputError(f"{given}: its data file {location} would replace the input model's external "
                         "data; choose another OUTPUT name")
    os.replace(tmpdir / _STAGED_DATA, final)
    return final


def _discard(tmpdir: Path, moved: Path | None) -> None:
    """Remove :func:`save_model`'s temporary folder, and ``moved``, the data file moved beside the output when the
    model was not replaced (its old data stays, the new data goes)."""
    if moved is not None:
        with contextlib.suppress(OSError):
            moved.unlink()
    for leftover in tmpdir.iterdir():
        leftover.unlink()
    tmpdir.rmdir()


def _commit_hook() -> None:
    """Runs just before the model file is moved into place (step 3 of :func:`save_model`); tests replace it to
    inject a failure or a kill between the data file's move and the model's."""


def _stage_external(model: onnx.ModelProto, tmpdir: Path, tmp_model: Path, model_name: str,
                    folder: Path, repointed: list) -> str | None:
    """Write ``model`` with its weights in ``tmpdir/weights.data``, give that file the model file's mode and its
    content name (:func:`data_file_name`) in the model, write the model to ``tmp_model``; return the data file's
    name, or None when no tensor went external (all under onnx's 1 KiB threshold). ``repointed`` receives
    ``(tensor, its external_data entries before)`` for every lazy tensor (:func:`is_lazy`) the write points at
    the new file, for :func:`_repoint` to undo."""
    staged = tmpdir / _STAGED_DATA
    try:
        return _write_external(model, tmpdir, tmp_model, model_name, folder, repointed)
    except BaseException:
        _repoint(repointed)
        _restore_weights(model, {_STAGED_DATA} | {
            e.value for t in onnx.external_data_helper._get_all_tensors(model) for e in t.external_data
            if e.key == "location" and _own_data_name(model_name, e.value) and e.value.endswith(".data")}, (staged,))
        raise


def _repoint(repointed: list) -> None:
    """Give each lazy tensor of ``repointed`` (:func:`_stage_external`) its external_data entries back: it reads
    its old file again. Empties ``repointed``."""
    for tensor, entries in repointed:
        del tensor.external_data[:]
        for key, value in entries:
            tensor.external_data.add(key=key, value=value)
        tensor.data_location = onnx.TensorProto.EXTERNAL
    del repointed[:]


def _write_external(model: onnx.ModelProto, tmpdir: Path, tmp_model: Path, model_name: str,
                    folder: Path, repointed: list) -> str | None:
    """:func:`_stage_external`'s work, which it undoes on ``model`` when this raises.

    The data file has the layout ``onnx.save_model(save_as_external_data=True, all_tensors_to_one_file=True,
    size_threshold=1024)`` gives it (onnx.external_data_helper: every initializer, subgraphs' too, whose
    ``raw_data`` is at least the threshold by ``sys.getsizeof``, one after the other in
    ``_get_initializer_tensors`` order, no padding), written by :func:`_write_data_file`: a lazy tensor's bytes
    are copied from its file without passing through memory, and zeros are left as holes.
    """
    staged = tmpdir / _STAGED_DATA
    placed = _write_data_file(model, staged)
    if not placed:
        write_parts(tmp_model, serialized_parts(model)[0])
        return None
    for tensor, offset, length in placed:
        if is_lazy(tensor):
            repointed.append((tensor, [(e.key, e.value) for e in tensor.external_data]))
        del tensor.external_data[:]
        tensor.ClearField("raw_data")
        tensor.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", _STAGED_DATA), ("offset", str(offset)), ("length", str(length))):
            tensor.external_data.add(key=key, value=value)
    digest = _sha256(staged)
    try:
        name_max = os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    location = data_file_name(model_name, digest.hexdigest(), name_max)
    for tensor, _, _ in placed:
        for entry in tensor.external_data:
            if entry.key == "location" and entry.value == _STAGED_DATA:
                entry.value = location
    write_parts(tmp_model, serialized_parts(model)[0])  # the weights are out of the model: it is small now
    # the data file was created with mode 0600; give it the model file's (0666 less the umask), so that whoever
    # may read the model may read its weights too
    os.chmod(staged, stat.S_IMODE(os.stat(tmp_model).st_mode))
    _fsync(staged)
    return location


#: Block size of the data file's writes and copies, in bytes.
_BLOCK = 1 << 22


def _sha256(path: Path):
    """The SHA-256 of the file ``path`` (a ``hashlib`` object), its holes (``SEEK_HOLE``) hashed from a block of
    zeros in memory rather than read: reading a hole makes the kernel zero a page-cache page for every page."""
    digest = hashlib.sha256()
    zeros = memoryview(bytes(_BLOCK))
    with open(path, "rb") as fh:
        fd, size, pos = fh.fileno(), os.fstat(fh.fileno()).st_size, 0
        while pos < size:
            try:
                data = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError as exc:
                data = size if exc.errno == errno.ENXIO else pos  # ENXIO: only a hole is left
            except AttributeError:  # no SEEK_DATA on this platform
                data = pos
            for start in range(pos, data, _BLOCK):
                digest.update(zeros[:min(_BLOCK, data - start)])
            if data >= size:
                break
            try:
                hole = os.lseek(fd, data, os.SEEK_HOLE)
            except (OSError, AttributeError):
                hole = size
            pos = data
            while pos < hole:
                block = os.pread(fd, min(_BLOCK, hole - pos), pos)
                if not block:
                    raise OSError(errno.EIO, f"{path.name} ended while it was read")
                digest.update(block)
                pos += len(block)
    return digest


def _write_data_file(model: onnx.ModelProto, staged: Path) -> list[tuple[onnx.TensorProto, int, int]]:
    """Write the data of every initializer of ``model`` that goes external (see :func:`_write_external`) to
    ``staged``, created only when one does; return ``(tensor, offset, length)`` of each, in file order. The
    tensors are not changed. A lazy tensor (:func:`is_lazy`) is copied from its file (:func:`_copy_range`), an
    inline one written from its ``raw_data`` one block at a time, blocks of zeros skipped; the file is then
    truncated to its length, so that skipped zeros read back as zeros (holes where the file system has them).

    Raises:
        OSError: a file cannot be read or written (disk full).
    """
    placed: list[tuple[onnx.TensorProto, int, int]] = []
    fd: int | None = None
    end = 0
    try:
        for tensor in onnx.external_data_helper._get_initializer_tensors(model):
            if is_lazy(tensor):
                source, offset, length = _external_source(tensor)
                fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600) if fd is None else fd
                with open(source, "rb") as fh:
                    _copy_range(fh.fileno(), fd, offset, length, end)
            elif tensor.HasField("raw_data"):
                raw = tensor.raw_data  # one copy (protobuf hands out new bytes), freed once written
                if sys.getsizeof(raw) < 1024:  # onnx's test (convert_model_to_external_data)
                    continue
                length = len(raw)
                fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600) if fd is None else fd
                _write_sparse(fd, raw, end)
                del raw
            else:
                continue
            placed.append((tensor, end, length))
            end += length
        if fd is not None:
            os.ftruncate(fd, end)
    finally:
        if fd is not None:
            os.close(fd)
    return placed


def _write_sparse(fd: int, data: bytes | memoryview, offset: int) -> None:
    """Write ``data`` at ``offset`` of ``fd``, one :data:`_BLOCK` at a time, leaving out blocks of zeros (the
    caller truncates the file to its full length)."""
    view = memoryview(data).cast("B")
    for start in range(0, len(view), _BLOCK):
        stop = min(start + _BLOCK, len(view))
        if bytes(view[start:stop]).count(0) == stop - start:  # a block of zeros: left as a hole
            continue
        _pwrite_all(fd, view[start:stop], offset + start)


def _pwrite_all(fd: int, data, offset: int) -> None:
    while len(data):
        done = os.pwrite(fd, data, offset)
        data, offset = data[done:], offset + done


def _copy_range(src: int, dst: int, offset: int, length: int, dst_offset: int) -> None:
    """Copy ``length`` bytes at ``offset`` of file ``src`` to ``dst_offset`` of file ``dst`` (descriptors), the
    data regions only (``lseek`` ``SEEK_DATA``/``SEEK_HOLE``, Linux and the BSDs): holes stay holes where the
    file system reports them, and the caller truncates ``dst`` to its length.

    Raises:
        OSError: a read or write failed, or ``src`` ends before the range does.
    """
    end = offset + length
    pos = offset
    while pos < end:
        try:
            data = os.lseek(src, pos, os.SEEK_DATA)
            hole = min(os.lseek(src, data, os.SEEK_HOLE), end)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # no data after pos: the rest of the range is a hole
                if os.fstat(src).st_size < end:
                    raise OSError(errno.EIO, "the external data file is shorter than the tensor's range") from None
                return
            data, hole = pos, end  # no hole support: copy everything
        except AttributeError:  # os.SEEK_DATA missing on this platform
            data, hole = pos, end
        if data >= end:
            return
        _copy_bytes(src, dst, data, hole - data, dst_offset + data - offset)
        pos = hole


def _copy_bytes(src: int, dst: int, offset: int, length: int, dst_offset: int) -> None:
    """``length`` bytes from ``offset`` of ``src`` to ``dst_offset`` of ``dst``: ``os.copy_file_range`` (the
    kernel copies, no user-space buffer), else ``pread``/``pwrite`` in :data:`_BLOCK` blocks."""
    copy = getattr(os, "copy_file_range", None)
    while length > 0:
        n = 0
        if copy is not None:
            try:
                n = copy(src, dst, min(length, 1 << 30), offset, dst_offset)
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ETXTBSY):
                    raise
                copy = None
                continue
        else:
            block = os.pread(src, min(length, _BLOCK), offset)
            n = len(block)
            if n:
                _pwrite_all(dst, block, dst_offset)
        if n == 0:
            raise OSError(errno.EIO, "the external data file is shorter than the tensor's range")
        offset, dst_offset, length = offset + n, dst_offset + n, length - n


def _same_bytes(a: Path, b: Path) -> bool:
    """True when files ``a`` and ``b`` both exist and hold the same bytes."""
    try:
        if a.stat().st_size != b.stat().st_size:
            return False
        with open(a, "rb") as fa, open(b, "rb") as fb:
            while True:
                x, y = fa.read(1 << 22), fb.read(1 << 22)
                if x != y:
                    return False
                if not x:
                    return True
    except OSError:
        return False


def _own_data_name(model_name: str, location: str) -> bool:
    """True when ``location`` is a data file name onnxfuse gives a model named ``model_name``: ``<name>.data``, or
    :func:`data_file_name`'s (which shortens the model name from its end to fit NAME_MAX)."""
    hashed = re.fullmatch(r"(.+)\.[0-9a-f]{16}\.data", location)
    return location == f"{model_name}.data" or (hashed is not None and model_name.startswith(hashed.group(1)))


def _remove_stale_data(folder: Path, target: Path, locations: set[str], protected: tuple[Path, ...],
                       any_name: bool = False) -> None:
    """Remove the data files that the replaced model ``target`` referenced and the new one does not, where they are
    onnxfuse's own names for it (``<name>.data``, :func:`data_file_name`; ``any_name``: any name in ``folder``
    itself), not ``protected`` and not referenced by another model file in the folder (:func:`_used_elsewhere`).
    A failure leaves the file: the new model is already complete."""
    candidates = [loc for loc in sorted(locations) if "/" not in loc and "\\" not in loc
                  and (any_name or _own_data_name(target.name, loc))
                  and not any(same_file(folder / loc, p) for p in protected)]
    if not candidates:
        return
    used = _used_elsewhere(folder, target)
    for location in candidates:
        candidate = folder / location
        if location in used or not candidate.is_file():
            continue
        with contextlib.suppress(OSError):
            candidate.unlink()


def _used_elsewhere(folder: Path, target: Path) -> set[str]:
    """The external data locations that the model files in ``folder`` other than ``target`` reference (names
    ending ``.onnx``; :func:`referenced_data_files`, which reads none over 64 MiB: those hold their weights
    inline). Another copy of a model, or another model of the same export, may read the same data file."""
    used: set[str] = set()
    with contextlib.suppress(OSError):
        for entry in folder.iterdir():
            if entry.name.endswith(".onnx") and entry.name != target.name and not entry.name.startswith("."):
                used |= referenced_data_files(entry)
    return used


def _fsync_folder(folder: Path) -> None:
    """fsync the folder, so that the renames into it survive a power loss (POSIX: a rename is durable once its
    directory is synced); a file system that cannot sync a directory is left as it is."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """True when paths ``a`` and ``b`` name the same file (symlinks and hard links included). A symbolic link
    that loops names no file: it is the same as ``b`` only when both are the same path."""
    pa, pb = Path(a), Path(b)
    if pb.exists() and pa.exists():
        return os.path.samefile(pa, pb)
    try:
        return pa.resolve() == pb.resolve()
    except (RuntimeError, OSError):  # a symlink loop (RuntimeError up to Python 3.12, OSError since)
        return os.path.abspath(pa) == os.path.abspath(pb)
