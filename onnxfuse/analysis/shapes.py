"""Static tensor shapes and dtypes from ``onnx.shape_inference``, without copying the weights.

Shape inference runs on a weight-free *skeleton* of the model (:func:`onnxfuse.model.proto.skeleton`), so that
inferring shapes of a model with gigabytes of weights costs kilobytes.
"""

from __future__ import annotations

import zipfile

import numpy as np
import onnx

from onnxfuse.errors import InputError
from onnxfuse.model.dtypes import np_dtype_or_none
from onnxfuse.model.proto import is_placeholder_dim, proto_graphs

#: The sizes a report's figures are given at when the model has symbolic dims and no value was given for them
#: (the export of a model with dynamic axes, without --input-shape): batch 1 for a dim on axis 0 of an input,
#: 224 for every other one (an image side or a sequence length of that order). Always stated beside the figure.
REPRESENTATIVE_BATCH, REPRESENTATIVE_SIZE = 1, 224

TensorInfo = tuple  # (shape: tuple[int | str | None, ...] | None, dtype: numpy.dtype | None)


def apply_input_shapes(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> None:
    """Set the dims of the named graph inputs of ``model`` (a skeleton) in place.

    Raises:
        InputError: a name that is not a graph input, or a rank or fixed dim that contradicts the model.
    """
    inputs = {i.name: i for i in model.graph.input}
    inits = {t.name for t in model.graph.initializer}
    for name, dims in shapes.items():
        if name not in inputs:
            # name the run-time inputs only: old exporters (IR < 4) list every initializer as a graph input too
            runtime = [i for i in inputs if i not in inits]
            listed = ", ".join(runtime[:10]) + (f" and {len(runtime) - 10} more" if len(runtime) > 10 else "")
            raise InputError(f"--input-shape {name}: the model has no graph input named {name!r} "
                             f"(inputs: {listed or 'none'})")
        tensor_type = inputs[name].type.tensor_type
        old = tensor_type.shape.dim if tensor_type.HasField("shape") else None
        if old is not None and len(old) != len(dims):
            raise InputError(f"--input-shape {name}: rank {len(dims)} given, the model says {len(old)}")
        for i, d in enumerate(dims):
            if old is not None and old[i].HasField("dim_value") and old[i].dim_value != d:
                raise InputError(f"--input-shape {name}: dim {i} is fixed at {old[i].dim_value} in the model, "
                                 f"{d} given")
        tensor_type.ClearField("shape")
        tensor_type.shape.SetInParent()
        for d in dims:
            tensor_type.shape.dim.add().dim_value = d


def complete_input_shapes(model: onnx.ModelProto, given: dict[str, tuple[int, ...]]
                          ) -> dict[str, tuple[int, ...]]:
    """``given`` plus every other graph input whose dims are all numbers or named dims that ``given`` binds
    (``--input-shape input=1x512`` fixes silero's ``state [2, batch, 128]`` to 2x1x128). Placeholder dims
    (``?``, :func:`is_placeholder_dim`) bind nothing: each is a size of its own.

    Raises:
        InputError: two given shapes give one named dim (``dim_param``) two sizes, e.g. silero's
            ``input=1x512`` (batch 1) with ``state=2x4x128`` (batch 4).
    """
    inits = {t.name for t in model.graph.initializer}
    bound: dict[str, tuple[int, str]] = {}
    inputs = {vi.name: vi for vi in model.graph.input if vi.name not in inits}
    for name, dims in given.items():
        vi = inputs.get(name)
        if vi is None or not vi.type.tensor_type.HasField("shape"):
            continue
        for axis, (d, v) in enumerate(zip(vi.type.tensor_type.shape.dim, dims, strict=False)):
            if is_placeholder_dim(d.dim_param):
                continue
            first = bound.setdefault(d.dim_param, (v, f"{name}={'x'.join(map(str, dims))}"))
            if first[0] != v:
                raise InputError(f"--input-shape {name}={'x'.join(map(str, dims))} gives dim {d.dim_param!r} "
                                 f"(axis {axis}) the size {v}, but {first[1]} gives it {first[0]}")
    out = dict(given)
    for name, vi in inputs.items():
        tt = vi.type.tensor_type
        if name in out or not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
            continue
        found = [d.dim_value if d.HasField("dim_value") else None if is_placeholder_dim(d.dim_param)
                 else bound.get(d.dim_param, (None,))[0] for d in tt.shape.dim]
        sizes = [d for d in found if isinstance(d, int) and d > 0]
        if found and len(sizes) == len(found) and any(not d.HasField("dim_value") for d in tt.shape.dim):
            out[name] = tuple(sizes)
    return out


def npz_shapes(path: str) -> dict[str, tuple[int, ...]]:
    """Array name -> shape of each array in the ``.npz`` file ``path``, read from the ``.npy`` headers only
    (numpy format spec, ``numpy.lib.format``), so no array data is loaded.

    Raises:
        InputError: the file is not a readable ``.npz`` of ``.npy`` arrays.
    """
    out: dict[str, tuple[int, ...]] = {}
    try:
        with zipfile.ZipFile(path) as zf:
            for entry in zf.namelist():
                if not entry.endswith(".npy"):
                    continue
                with zf.open(entry) as fh:
                    major, _ = np.lib.format.read_magic(fh)
                    read_header = (np.lib.format.read_array_header_1_0 if major == 1
                                   else np.lib.format.read_array_header_2_0)
                    shape, _, _ = read_header(fh)
                out[entry[: -len(".npy")]] = tuple(int(d) for d in shape)
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise InputError(f"--input-data {path}: not a readable .npz file ({exc})") from None
    return out


def merge_input_data_shapes(given: dict[str, tuple[int, ...]], data: dict[str, tuple[int, ...]],
                            input_names: set[str], source: str) -> dict[str, tuple[int, ...]]:
    """``given`` (``--input-shape``) plus the shapes of the ``--input-data`` arrays that feed graph inputs
    ``input_names``: real inputs fix the shapes for the traffic report too.

    Raises:
        InputError: an array whose shape differs from the ``--input-shape`` given for the same input.
    """
    out = dict(given)
    for name, shape in data.items():
        if name not in input_names:
            continue
        if name in given and tuple(given[name]) != shape:
            raise InputError(f"--input-data {source}: array {name!r} has shape {'x'.join(map(str, shape)) or '()'} "
                             f"but --input-shape gives {name}={'x'.join(map(str, given[name]))}")
        out[name] = shape
    return out


def _info(vi: onnx.ValueInfoProto) -> TensorInfo:
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type"):
        return None, None
    shape = None
    if tt.HasField("shape"):
        shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)
    return shape, (np_dtype_or_none(tt.elem_type) if tt.elem_type else None)


def _collect(root: onnx.GraphProto, out: dict[str, TensorInfo], elem_sizes: dict) -> None:
    for graph, _ in proto_graphs(root):
        _collect_one(graph, out, elem_sizes)


def _collect_one(graph: onnx.GraphProto, out: dict[str, TensorInfo], elem_sizes: dict) -> None:
    for t in graph.initializer:
        out[t.name] = (tuple(t.dims), np_dtype_or_none(t.data_type))
        elem_sizes[t.name] = t.data_type
    for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
        if vi.name not in out or out[vi.name][0] is None:
            out[vi.name] = _info(vi)
        if vi.type.HasField("tensor_type"):
            elem_sizes.setdefault(vi.name, vi.type.tensor_type.elem_type)
    for node in graph.node:
        if node.op_type == "Constant" and node.output:
            for attr in node.attribute:
                if attr.name == "value":
                    out[node.output[0]] = (tuple(attr.t.dims), np_dtype_or_none(attr.t.data_type))
                    elem_sizes[node.output[0]] = attr.t.data_type


def infer(skel: onnx.ModelProto) -> tuple[dict[str, TensorInfo], dict[str, int]]:
    """Shapes and dtypes of every tensor onnx can infer, in every graph of ``skel`` (a :func:`skeleton`,
    after :func:`apply_input_shapes` where concrete input shapes are wanted; it is not modified).

    Returns:
        ``(info, elem_types)``: tensor name -> ``(shape, numpy dtype)`` where a shape is a tuple of ints (known
        dims), strings (named symbolic dims) and None (unknown dims), or None for unknown rank; and tensor
        name -> ONNX ``TensorProto.DataType`` (for dtypes numpy lacks, such as bfloat16).

    """
    try:
        inferred = onnx.shape_inference.infer_shapes(skel, check_type=False, strict_mode=False, data_prop=True)
    except Exception:
        inferred = skel
    return inferred_info(inferred)


def inferred_info(inferred: onnx.ModelProto) -> tuple[dict[str, TensorInfo], dict[str, int]]:
    """What :func:`infer` returns, read from ``inferred``, a skeleton that ``onnx.shape_inference`` (with data
    propagation) has already inferred (``onnxfuse.model.io.checked_shapes``). Nothing is inferred again."""
    info: dict[str, TensorInfo] = {}
    elem_types: dict[str, int] = {}
    _collect(inferred.graph, info, elem_types)
    return info, elem_types
