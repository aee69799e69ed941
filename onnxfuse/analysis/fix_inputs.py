"""``--fix-input-shape``: concrete sizes written into the model's graph inputs, so that the optimized model is
static (what onnxsim's ``--overwrite-input-shape`` and onnxslim's ``--input-shapes`` do).

:func:`fix_input_shapes` sets the dims of the named graph inputs, drops the main graph's ``value_info`` (shapes
inferred for the old, symbolic inputs; onnx shape inference writes them again), re-infers every shape with onnx
shape inference (strict mode, data propagation: ``onnx.shape_inference.infer_shapes``) and writes the graph
outputs' now static shapes. The passes then see static shapes: ``constant_fold`` folds a ``Shape``/``Size`` of a
static tensor and what only depends on it (``onnxfuse.passes.constant_fold``, "Shape and Size of a run-time
tensor"). The pipeline verifies the result against the original at exactly these sizes.
"""

from __future__ import annotations

import onnx

from onnxfuse.analysis.shapes import apply_input_shapes
from onnxfuse.errors import InputError, one_line
from onnxfuse.model import proto

OPTION = "--fix-input-shape"


def fix_input_shapes(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> None:
    """Write ``shapes`` (graph input name -> dims, each >= 1) into ``model``'s graph inputs, in place, and
    re-infer its shapes (see the module docstring). Graph outputs get the dims inference finds for them (a dim
    it cannot find keeps what the model said).

    Raises:
        InputError: (one line, naming :data:`OPTION`) a name that is no graph input, a rank other than the
            model's, a dim the model fixes to another value (``shapes.apply_input_shapes``), or sizes the model
            cannot take: onnx shape inference in strict mode fails at them (a Reshape whose element count no
            longer matches, a broadcast of unequal dims).
    """
    named = _named_dims(model, shapes)
    try:
        apply_input_shapes(model, shapes)
    except InputError as exc:
        raise InputError(str(exc).replace("--input-shape", OPTION, 1)) from None
    del model.graph.value_info[:]
    given = ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in shapes.items())
    try:
        inferred = onnx.shape_inference.infer_shapes(proto.skeleton(model), strict_mode=True, data_prop=True)
    except Exception as exc:  # onnx raises InferenceError, ValidationError or RuntimeError here
        raise InputError(f"{OPTION} {given}: the model cannot take these sizes (onnx shape inference: "
                         f"{one_line(exc, 240)})") from None
    found = {o.name: o for o in inferred.graph.output}
    for out in model.graph.output:
        if not out.type.HasField("tensor_type"):
            continue
        old = out.type.tensor_type.shape.dim if out.type.tensor_type.HasField("shape") else None
        for d in old or ():
            if d.HasField("dim_param") and d.dim_param in named:  # one name, one size (IR.md)
                d.dim_value = named[d.dim_param]
        new = found.get(out.name)
        if new is None or not new.type.HasField("tensor_type") or not new.type.tensor_type.HasField("shape"):
            continue
        dims = new.type.tensor_type.shape.dim
        if old is not None and len(old) != len(dims):
            continue
        shape = out.type.tensor_type.shape
        for i, d in enumerate(dims):
            if old is not None and old[i].HasField("dim_value"):
                continue
            target = shape.dim[i] if old is not None else shape.dim.add()
            if d.HasField("dim_value"):
                target.dim_value = d.dim_value
            elif old is None and d.HasField("dim_param"):
                target.dim_param = d.dim_param
            elif old is None:
                target.Clear()


def _named_dims(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> dict[str, int]:
    """Named dims (``dim_param``) of the graph inputs in ``shapes`` -> the size ``shapes`` gives them (ONNX IR.md,
    "Tensor shapes": a dim_param names one size wherever it appears in the graph's inputs and outputs)."""
    named: dict[str, int] = {}
    for vi in model.graph.input:
        if vi.name in shapes and vi.type.tensor_type.HasField("shape"):
            for d, size in zip(vi.type.tensor_type.shape.dim, shapes[vi.name], strict=False):
                if d.HasField("dim_param") and d.dim_param:
                    named.setdefault(d.dim_param, size)
    return named


def merged_shapes(input_shapes: dict[str, tuple[int, ...]], fixed: dict[str, tuple[int, ...]]
                  ) -> dict[str, tuple[int, ...]]:
    """The sizes analysis and verification use: ``input_shapes`` (``--input-shape``) and ``fixed``
    (``--fix-input-shape``) together.

    Raises:
        InputError: an input given two different sizes by the two options.
    """
    for name, dims in fixed.items():
        if name in input_shapes and tuple(input_shapes[name]) != tuple(dims):
            raise InputError(f"{OPTION} {name}={'x'.join(map(str, dims))} and --input-shape "
                             f"{name}={'x'.join(map(str, input_shapes[name]))} disagree; give one size")
    return {**input_shapes, **fixed}
