"""Static tensor shapes and dtypes from ``onnx.shape_inference``, without copying the weights.

Shape inference runs on a *skeleton* of the model: the same nodes and tensor types, with the data of large
float tensors (initializers and ``Constant`` node values) left out, so that inferring shapes of a model with
gigabytes of weights costs kilobytes. Small tensors (int64 shapes, axes, scalars) keep their data, so data
propagation through Reshape/Resize/Slice still works.
"""

from __future__ import annotations

import math
import zipfile

import numpy as np
import onnx
from onnx import TensorProto

from onnxfuse.errors import InputError
from onnxfuse.ir.graph import copy_model_fields, proto_graphs

#: Tensors with more elements than this lose their data in the skeleton (only dims and dtype are kept).
SKELETON_MAX_ELEMENTS = 1024


TensorInfo = tuple  # (shape: tuple[int | str | None, ...] | None, dtype: numpy.dtype | None)

#: ``dim_param`` texts that exporters write for "unknown", not as a name: ``?`` (paddle2onnx writes
#: ``[-1, 3, '?', '?']``; it is also how onnx's printer shows an unknown dim) and ``None`` (a stringified Python
#: None). Integer texts such as ``-1`` (a -1 dim written as text) and empty or blank names are placeholders too
#: (:func:`is_placeholder_dim`). Each such dim is its own anonymous symbol, as a dim with neither value nor name
#: is (onnx.proto, TensorShapeProto: a dim is an integer or a symbolic variable; onnx's shape inference and
#: onnxruntime's symbolic shape inference take one name for one size). tf2onnx's ``unk__N`` is no placeholder:
#: tf2onnx numbers every unknown dim afresh, so a name it repeats is one size.
PLACEHOLDER_DIM_PARAMS = frozenset({"?", "None"})


def is_placeholder_dim(dim_param: str | None) -> bool:
    """True when ``dim_param`` (a ``TensorShapeProto.Dimension.dim_param``, or an onnxruntime ``NodeArg.shape``
    entry) names no size: None, empty or blank, an integer text, or one of :data:`PLACEHOLDER_DIM_PARAMS`.
    Two such dims are different unknown sizes, never one symbol."""
    if dim_param is None:
        return True
    text = dim_param.strip()
    if not text or text in PLACEHOLDER_DIM_PARAMS:
        return True
    try:
        int(text)
    except ValueError:
        return False
    return True


def anonymize_placeholder_dims(graph: onnx.GraphProto) -> None:
    """Clear, in place, every placeholder ``dim_param`` (:func:`is_placeholder_dim`) of the tensor types of the
    inputs, outputs and value_info of ``graph`` and its subgraphs, so that shape inference and the symbol table
    see unknown dims instead of one shared name."""
    for sub, _ in proto_graphs(graph):
        for vi in (*sub.input, *sub.output, *sub.value_info):
            if not vi.type.HasField("tensor_type"):
                continue
            for d in vi.type.tensor_type.shape.dim:
                if d.HasField("dim_param") and is_placeholder_dim(d.dim_param):
                    d.ClearField("dim_param")


def _strip(t: TensorProto) -> TensorProto:
    if math.prod(t.dims) <= SKELETON_MAX_ELEMENTS or t.data_location == TensorProto.EXTERNAL:
        return t
    slim = TensorProto(name=t.name, data_type=t.data_type, dims=t.dims, doc_string=t.doc_string)
    return slim


def _skeleton_graph(graph: onnx.GraphProto) -> onnx.GraphProto:
    out = onnx.GraphProto(name=graph.name)
    out.input.extend(graph.input)
    out.output.extend(graph.output)
    out.value_info.extend(graph.value_info)
    out.initializer.extend(_strip(t) for t in graph.initializer)
    for node in graph.node:
        new = out.node.add()
        new.output.extend(node.output)
        new.op_type, new.domain, new.name = node.op_type, node.domain, node.name
        fused = node.op_type == "FusedConv" and node.domain == "com.microsoft"
        if fused:
            # onnx cannot infer through FusedConv; its output has the shape of the plain Conv (Z has it too).
            new.op_type, new.domain = "Conv", ""
        new.input.extend(node.input[:3] if fused else node.input)
        for attr in node.attribute:
            if fused and attr.name in ("activation", "activation_params"):
                continue
            a = new.attribute.add()
            if attr.type == onnx.AttributeProto.TENSOR:
                a.name, a.type = attr.name, attr.type
                a.t.CopyFrom(_strip(attr.t))
            elif attr.type == onnx.AttributeProto.GRAPH:
                a.name, a.type = attr.name, attr.type
                a.g.CopyFrom(_skeleton_graph(attr.g))
            else:
                a.CopyFrom(attr)
    return out


def skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose large float tensors carry no data (see the module docstring) and whose
    placeholder dims (``?``, ``-1`` as text: :func:`is_placeholder_dim`) are unnamed, each its own unknown."""
    out = onnx.ModelProto()
    copy_model_fields(model, out)
    out.graph.CopyFrom(_skeleton_graph(model.graph))
    anonymize_placeholder_dims(out.graph)
    return out


def strip_declared_shapes(model: onnx.ModelProto) -> None:
    """Remove, in place, every shape ``model`` only declares: ``value_info`` entries and the shapes of graph
    outputs, in every graph (If/Loop/Scan bodies too); dtypes stay. ``onnx.shape_inference`` (non-strict) keeps
    a declared shape it cannot check, so a wrong ``value_info`` would otherwise be counted as if inferred."""
    for graph, _ in proto_graphs(model.graph):
        del graph.value_info[:]
        for vi in graph.output:
            if vi.type.HasField("tensor_type"):
                vi.type.tensor_type.ClearField("shape")


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
        dims = [d.dim_value if d.HasField("dim_value") else None if is_placeholder_dim(d.dim_param)
                else bound.get(d.dim_param, (None,))[0] for d in tt.shape.dim]
        if dims and all(isinstance(d, int) and d > 0 for d in dims) and any(not d.HasField("dim_value")
                                                                             for d in tt.shape.dim):
            out[name] = tuple(dims)
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


def _dtype(elem_type: int) -> np.dtype | None:
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        return None


def _info(vi: onnx.ValueInfoProto) -> TensorInfo:
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type"):
        return None, None
    shape = None
    if tt.HasField("shape"):
        shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)
    return shape, (_dtype(tt.elem_type) if tt.elem_type else None)


def _collect(root: onnx.GraphProto, out: dict[str, TensorInfo], elem_sizes: dict) -> None:
    for graph, _ in proto_graphs(root):
        _collect_one(graph, out, elem_sizes)


def _collect_one(graph: onnx.GraphProto, out: dict[str, TensorInfo], elem_sizes: dict) -> None:
    for t in graph.initializer:
        out[t.name] = (tuple(t.dims), _dtype(t.data_type))
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
                    out[node.output[0]] = (tuple(attr.t.dims), _dtype(attr.t.data_type))
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
    info: dict[str, TensorInfo] = {}
    elem_types: dict[str, int] = {}
    _collect(inferred.graph, info, elem_types)
    return info, elem_types
