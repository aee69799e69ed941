"""Reading constants of an onnx-graphsurgeon graph, their dtypes, and making new ones with fresh names.

``Constant`` nodes (PaddleOCR exports keep every weight in one) are not initializers: :func:`constant_value`
reads both, and never hands out an array that may be edited in place.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.ir.tensor import LazyValues

from onnxfuse.errors import InputError, one_line
from onnxfuse.ir.edit import all_graphs, producer
from onnxfuse.model import io as model_io
from onnxfuse.model.domains import is_default_domain
from onnxfuse.model.dtypes import np_dtype, onnx_dtype_or_none

_CONSTANT_ATTRS = ("value_float", "value_floats", "value_int", "value_ints")


def is_constant(tensor: gs.Tensor, overridable: frozenset[str] = frozenset()) -> bool:
    """True when ``tensor`` is a constant as :func:`constant_value` defines it, decided from the graph alone
    (no weight is read or converted: walks over many tensors stay cheap)."""
    if isinstance(tensor, gs.Constant):
        return tensor.name not in overridable
    node = producer(tensor)
    if node is None or node.op != "Constant" or not is_default_domain(node.domain):
        return False
    return isinstance(node.attrs.get("value"), gs.Constant) or any(a in node.attrs for a in _CONSTANT_ATTRS)


def constant_value(tensor: gs.Tensor, overridable: frozenset[str] = frozenset()) -> np.ndarray | None:
    """The constant value of ``tensor`` as a read-only numpy array, or None if it is not a constant.

    A constant is an initializer that is not overridable (see :class:`LoadedModel`) or the output of a
    ``Constant`` node with a ``value`` attribute. The array is a read-only view: callers copy before editing.
    """
    if isinstance(tensor, gs.Constant):
        if tensor.name in overridable:
            return None
        values = _load(tensor)
    else:
        node = producer(tensor)
        if node is None or node.op != "Constant" or not is_default_domain(node.domain):
            return None
        attr = node.attrs.get("value")
        if isinstance(attr, gs.Constant):
            values = _load(attr)
        elif "value_float" in node.attrs:
            values = np.array(node.attrs["value_float"], dtype=np.float32)
        elif "value_floats" in node.attrs:
            values = np.array(node.attrs["value_floats"], dtype=np.float32)
        elif "value_int" in node.attrs:
            values = np.array(node.attrs["value_int"], dtype=np.int64)
        elif "value_ints" in node.attrs:
            values = np.array(node.attrs["value_ints"], dtype=np.int64)
        else:
            return None
    try:
        view = np.asarray(values).view()
    except ValueError:  # data that does not match its dims (onnx.checker lets it through): not usable
        return None
    view.flags.writeable = False
    return view


#: The fields of a TensorProto that ``make_tensor(name, data_type, dims, raw bytes, raw=True)`` writes.
_RAW_TENSOR_FIELDS = frozenset({"name", "data_type", "dims", "raw_data"})

#: Every other field of TensorProto: ``(name, repeated)``.
_OTHER_TENSOR_FIELDS = tuple((f.name, f.is_repeated) for f in onnx.TensorProto.DESCRIPTOR.fields
                             if f.name not in _RAW_TENSOR_FIELDS)


#: ONNX data types whose raw bytes ``onnx.numpy_helper.to_array`` reads as ``np.frombuffer(raw, dtype)
#: .reshape(dims)`` on a little-endian machine (on a big-endian one it byte-swaps: no entries there).
_RAW_DTYPES = {} if sys.byteorder != "little" else {
    t: np_dtype(t) for t in (
        onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.INT8,
        onnx.TensorProto.INT16, onnx.TensorProto.INT32, onnx.TensorProto.INT64, onnx.TensorProto.UINT8,
        onnx.TensorProto.UINT16, onnx.TensorProto.UINT32, onnx.TensorProto.UINT64, onnx.TensorProto.BOOL)}


def _raw_tensor_fields_only(proto: onnx.TensorProto) -> bool:
    """True when ``proto`` has raw_data and data_type set and no field outside :data:`_RAW_TENSOR_FIELDS` (what
    ``{d.name for d, _ in proto.ListFields()}`` would say, without ListFields' copy of the raw bytes)."""
    if not (proto.HasField("raw_data") and proto.HasField("data_type")):
        return False
    return not any(len(getattr(proto, name)) if repeated else proto.HasField(name)
                   for name, repeated in _OTHER_TENSOR_FIELDS)


def _load(constant: gs.Constant):
    """``constant.values`` without graphsurgeon's extra copy (``np.array(to_array(...))``); the array may be
    read-only, and every caller only reads it.

    A weight stored as exactly name, data type, dims and raw bytes stays lazily referenced (not cached): it is
    then exported as its original message, which has the same bytes graphsurgeon's export of the array would
    write, and the array is freed once the fold that read it is done (a cached copy of every read weight lived
    as long as the graph). Any other tensor is cached as ``Constant.values`` caches it, so that it is exported
    from the array as before. A weight still on disk (:func:`onnxfuse.model.io.is_lazy`) is read from its file
    each time it is asked for (:func:`onnxfuse.model.io.external_array`) and stays lazily referenced the same way.
    """
    lazy = constant._values
    if type(lazy) is LazyValues:
        proto = lazy.tensor
        if model_io.is_lazy(proto):
            return model_io.external_array(proto)
        try:
            raw_only = _raw_tensor_fields_only(proto)
            dtype = _RAW_DTYPES.get(proto.data_type) if raw_only else None
            if dtype is not None:  # what to_array returns for these, without its per-call lookups
                return np.frombuffer(proto.raw_data, dtype=dtype).reshape(proto.dims)
            array = onnx.numpy_helper.to_array(proto)
        except ValueError as exc:  # onnx.checker lets raw_data of the wrong length through; onnxruntime refuses it
            raise InputError(f"tensor {proto.name or constant.name}: its data does not match its dims "
                             f"{list(proto.dims)} and type ({one_line(exc)})") from None
        if raw_only and onnx_dtype_or_none(array.dtype) == proto.data_type:
            return array
        constant._values = array
    return constant.values


def tensor_dtype(tensor: gs.Tensor) -> np.dtype | None:
    """numpy dtype of ``tensor`` (from its values, or from graphsurgeon's inferred dtype), or None if unknown."""
    return _np(tensor.dtype)


def _np(dtype) -> np.dtype | None:
    if dtype is None:
        return None
    if isinstance(dtype, int):
        try:
            return np_dtype(dtype)
        except (KeyError, TypeError):
            return None
    try:
        return np.dtype(dtype)
    except TypeError:
        # graphsurgeon uses onnx.TensorProto.DataType ints for dtypes numpy lacks (bfloat16, float8)
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


#: Where :func:`new_constant` writes large new weights instead of keeping them in memory (:func:`spilling`; the
#: innermost block's folder last); empty: it keeps them.
_SPILL: list[Path] = []


@contextlib.contextmanager
def spilling(folder: Path):
    """Within the block, :func:`new_constant` writes each new weight of ``model_io.LAZY_MIN_BYTES`` or more to a
    file in ``folder`` (:func:`onnxfuse.model.io.spill`) and hands out a constant that reads it lazily: a run
    that keeps the input's weights on disk keeps its folded ones there too, so that memory holds the weights of
    one fold at a time, not every folded weight until the model is written."""
    _SPILL.append(folder)
    try:
        yield
    finally:
        _SPILL.pop()


def new_constant(namer: Namer, base: str, values: np.ndarray) -> gs.Constant:
    """A new initializer with a fresh name holding ``values``, which must be an array no one else holds (the
    result of the fold arithmetic); it is copied only if not C-contiguous or not writeable. Within
    :func:`spilling`, a large one is written to a file and read lazily from there.

    Raises:
        InputError: the spilled weight cannot be written (disk full).
    """
    name = namer.fresh(base)
    array = np.ascontiguousarray(values)
    if _SPILL and array.nbytes >= model_io.LAZY_MIN_BYTES:
        try:
            spilled = model_io.spill(array, name, _SPILL[-1])
        except OSError as exc:
            raise InputError(f"cannot write folded weight {name} to {_SPILL[-1]} ({exc.strerror or exc})") from None
        if spilled is not None:
            return gs.Constant(name, LazyValues(spilled))
    if not array.flags.writeable:
        array = array.copy()
    return gs.Constant(name, array)
