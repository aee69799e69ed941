"""Fold every node whose inputs are all constants into the constant it computes.

Before => after::

    Reshape(Constant b, Constant shape) -> Add(conv, .)   =>   Add(conv, initializer b')
    Unsqueeze(Constant scale) -> BatchNormalization        =>   BatchNormalization(initializer scale')

Exporters write per-channel constants as small computations on constants (paddle2onnx 3: the conv bias is
``Reshape(Constant, Constant)``; caffe2-era graphs: BN parameters via ``Unsqueeze(Constant)``, weights via
``ConstantOfShape``); the fusion passes need them as plain constants. The value is computed by onnxruntime (CPU
execution provider, ``ORT_DISABLE_ALL``) running the node alone in a one-node model of the graph's opset, never
by op semantics written here. The folded tensor keeps its name, so graph outputs, readers and other tensors'
names are unchanged. Nodes in If/Loop/Scan bodies fold too (the pipeline runs every pass on every subgraph);
an If/Loop/Scan node itself is never folded (its body may read run-time tensors), nor a node that makes an
optional or a sequence (NON_TENSOR_OPS: a folded value is a plain tensor, and ``OptionalHasElement`` takes no
tensor before opset 18).

Memory: a node is run only once the bytes of its outputs are known and within the growth limits below, so the
fold never computes more than its constant inputs plus FOLD_GROWTH_LIMIT_BYTES (a 661-byte Range, Pad or Resize
can describe terabytes). The size comes from onnx shape inference on the node alone with its small constant
inputs as values (Range's count from its values); an output whose size stays unknown is not computed
(fold-size-unknown), except for the data-dependent ops of BOUNDED_OPS, whose input bounds it. After running, the
check is made again on the actual arrays.

Skipped when:
    initializer-is-graph-input     an input is an initializer also listed as a graph input (a caller may feed
                                   it; pass --constant-initializer-inputs if nobody does)
    random-op                      RandomNormal/RandomUniform(Like), Multinomial, Bernoulli, a Dropout whose
                                   training_mode is true: a new value per run
    quantize-dequantize-node       QuantizeLinear/DequantizeLinear: onnxruntime's QDQ fusions need them as nodes
    intermediate-is-graph-output   an output is an output of an If/Loop/Scan body (the body keeps its node); a
                                   main-graph output folds into an initializer of its name (onnxruntime runs a
                                   graph whose output is an initializer; ONNX IR.md allows it)
    fold-grows-model               the outputs would exceed the constant inputs by more than
                                   FOLD_GROWTH_LIMIT_BYTES (Expand, Tile, ConstantOfShape of a large shape), or
                                   the constant inputs that this node alone reads (the others stay) by more than
                                   SHARED_COPY_LIMIT_BYTES; checked before the node runs. A compact weight read
                                   by one node (int8 weights Cast to float32, then scaled) stays compact: the
                                   conv folds work on its computation (``_fold.compact_weight``), unless
                                   the growth fits ``--materialize-weights`` (Context.materialize_bytes) and
                                   the value only feeds conv/Gemm weights (:func:`_weight_only`)
    fold-size-unknown              an output's size is not known before running the node (onnx shape inference
                                   has no answer), so running it might need any amount of memory
    dtype-not-foldable             an input has a dtype numpy cannot hold (bfloat16, float8, string); outputs of
                                   those float types are read through an exact Cast to float32 and stored
                                   with their own dtype (ml_dtypes)
    evaluation-failed              onnxruntime could not run the node, or an output is not a tensor

``Shape`` and ``Size`` of a run-time tensor fold too when the dims they read are static numbers (from onnx shape
inference on the model's own input shapes, ``Context.shape``; :func:`static_shape_value`): a Keras ``Flatten``
(``Shape -> Gather -> Concat -> Reshape``) or a bias reshaped by ``Concat(Slice(Shape(x)), ...)`` on a static
input then folds node by node into constants. A symbolic or unknown dim is never frozen; ``Shape``'s ``start``/
``end`` attributes (opset 15) select the dims read, so ``Shape(x, start=1)`` folds even with a symbolic batch.
``CastLike(constant, x)`` folds with a run-time ``x`` whose element type is known: CastLike reads only the
element type of its ``target_type`` input (ONNX Operators.md, CastLike-15), so onnxruntime runs it with an empty
tensor of that type in x's place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from onnxfuse.ir import edit
from onnxfuse.model.domains import is_default_domain
from onnxfuse.model.dtypes import np_dtype, onnx_dtype
from onnxfuse.passes._checks import replaced, skip
from onnxfuse.passes.base import Context, Match, Pass
from onnxfuse.records import Fusion, Reason, RewriteKind, Skip

#: A fold may make the model at most this much larger than the constant inputs it reads (bytes, 1 MiB). It is also
#: the memory budget of a fold: a node is run only when its outputs, sized before it runs (``predicted_outputs``),
#: fit in its constant inputs' bytes plus this.
FOLD_GROWTH_LIMIT_BYTES = 1 << 20
#: A fold whose constant inputs stay in the model (other nodes read them) adds its whole output: allowed up to this
#: many bytes more than the inputs it frees (4 KiB: shapes, scalars, per-channel vectors). Without it, slices of
#: an LSTM weight read in both branches of an If (silero-vad) were copied into each branch, growing the file 40%.
SHARED_COPY_LIMIT_BYTES = 1 << 12

#: Constant inputs of at most this many bytes are given to onnx shape inference as values, so that the output
#: shapes computed from values (Range, ConstantOfShape, Expand, Tile, Pad, Resize) are known before the node runs;
#: larger ones (weights, which set no shape) as their shape and dtype only.
INFERENCE_VALUE_LIMIT_BYTES = 1 << 16
#: Data-dependent ops whose output shape onnx cannot infer but whose size their input bounds (see ``_bound``):
#: they fold when that bound fits the growth limits. Any other op whose output size stays unknown is not run.
BOUNDED_OPS = ("NonZero", "Unique", "Compress")

RANDOM_OPS = ("RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli")
QDQ_OPS = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear")
#: Ops whose output is an optional or a sequence, never a tensor (ONNX Operators.md): not folded.
NON_TENSOR_OPS = ("Optional", "SequenceConstruct", "SequenceEmpty", "SequenceInsert", "SequenceErase",
                  "SplitToSequence")


@dataclass
class ConstantFoldMatch(Match):
    """A node computed from constants only, to replace by its outputs' values (one array per output; None for an
    unnamed output)."""

    values: list[np.ndarray | None] = field(default_factory=list)
    growth: int = 0  # bytes of Context.materialize_bytes this fold spends (a weight materialized past the limits)


def _has_subgraph(node: gs.Node) -> bool:
    return any(isinstance(v, gs.Graph) or (isinstance(v, (list, tuple)) and any(isinstance(s, gs.Graph) for s in v))
               for v in node.attrs.values())


def _native(dtype: np.dtype) -> bool:
    """True for numpy's own dtypes (bool, ints, floats, object), False for ml_dtypes ones (bfloat16, float8,
    int4: ``isbuiltin`` 2, user-defined), which onnxruntime's Python API does not take or hand back."""
    return np.dtype(dtype).isbuiltin == 1


def _one_node_model(node: gs.Node, inputs: list[np.ndarray | None], opset: int, values_up_to: int
                    ) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """``node`` alone in a model of the default-domain ``opset``: each distinct named input of at most
    ``values_up_to`` bytes is an initializer (its value known to shape inference), the others are graph inputs of
    their shape and dtype, returned as feeds. Outputs are declared without a type."""
    proto = gs.exporters.onnx_exporter.OnnxExporter.export_node(node)
    feeds, graph_inputs, inits, seen = {}, [], [], set()
    for t, value in zip(node.inputs, inputs, strict=True):
        if not t.name or t.name in seen:
            continue
        seen.add(t.name)
        assert value is not None  # ConstantFold.match has a value for every named input
        if value.nbytes <= values_up_to:
            inits.append(onnx.numpy_helper.from_array(np.asarray(value), t.name))
        else:
            feeds[t.name] = value
            elem = onnx_dtype(value.dtype)
            graph_inputs.append(onnx.helper.make_tensor_value_info(t.name, elem, list(value.shape)))
    named = [t.name for t in node.outputs if t.name]
    graph = onnx.helper.make_graph([proto], "fold", graph_inputs, [onnx.ValueInfoProto(name=n) for n in named],
                                   initializer=inits)
    opsets = [onnx.helper.make_opsetid("", opset)]
    model = onnx.helper.make_model(graph, opset_imports=opsets)
    # IR 4 at least: initializers need not be graph inputs (shape inference ignores IR 3 initializers otherwise)
    model.ir_version = max(4, onnx.helper.find_min_ir_version_for(opsets, ignore_unknown=True))
    return model, feeds


def _range_length(inputs: list[np.ndarray | None]) -> int | None:
    """Elements of Range(start, limit, delta): ``max(ceil((limit - start) / delta), 0)`` (ONNX Operators.md,
    Range), in Python ints for integer inputs and floats otherwise; None when it is not a finite number. onnx
    shape inference overflows here (Range(0, 1e30, 1e-30) infers 0 elements), so the count is taken from the
    values."""
    values = [v for v in inputs if v is not None and v.size == 1]
    if len(inputs) != 3 or len(values) != 3:
        return None
    start, limit, delta = (v.reshape(-1)[0].item() for v in values)
    if delta == 0:
        return None
    if all(isinstance(v, int) for v in (start, limit, delta)):
        return max(-((start - limit) // delta), 0)  # exact ceil division of Python ints
    n = (float(limit) - float(start)) / float(delta)
    return max(math.ceil(n), 0) if math.isfinite(n) else None


def _bound(node: gs.Node, inputs: list[np.ndarray | None]) -> int | None:
    """Most bytes the outputs of a data-dependent op of :data:`BOUNDED_OPS` can hold (int64 indices), or None."""
    if not inputs or inputs[0] is None:
        return None
    x = inputs[0]
    if node.op == "NonZero":
        return max(x.ndim, 1) * x.size * 8
    if node.op == "Unique":
        return x.nbytes + 3 * x.size * 8  # Y, indices, inverse_indices, counts
    if node.op == "Compress":
        return x.nbytes
    return None


def predicted_outputs(node: gs.Node, inputs: list[np.ndarray | None], opset: int
                      ) -> tuple[int | None, list[int]]:
    """What ``node``'s named outputs will be, known before running it: ``(bytes, elem types)``.

    The bytes are the sum over named outputs of element count times itemsize, from onnx shape inference
    (``data_prop``) on the node alone with its constant inputs of up to :data:`INFERENCE_VALUE_LIMIT_BYTES` given
    as values: that sizes the outputs whose shape is a function of input values (Range, ConstantOfShape, Expand,
    Tile, Pad, Resize, Upsample, OneHot, Reshape). Range's count is computed from its values
    (:func:`_range_length`). Data-dependent ops of :data:`BOUNDED_OPS` get their upper bound. None when some
    output's shape or dtype stays unknown (shape inference has no rule for the op, or failed). The elem types are
    ``TensorProto.DataType`` codes, one per named output (0 where unknown).
    """
    try:
        model, _ = _one_node_model(node, inputs, opset, INFERENCE_VALUE_LIMIT_BYTES)
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception:  # onnx raises its own InferenceError/ValidationError types; the fold is then unsized
        return None, [0] * sum(bool(t.name) for t in node.outputs)
    total: int | None = 0
    elems: list[int] = []
    for out in inferred.graph.output:
        tt = out.type.tensor_type
        elems.append(tt.elem_type)
        if node.op == "Range":
            dims = [_range_length(inputs)]
        elif tt.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        else:
            dims = [None]  # not even the rank is known
        itemsize: int | None
        try:
            itemsize = np_dtype(tt.elem_type).itemsize
        except (KeyError, TypeError, ValueError):
            itemsize = None
        known = [d for d in dims if d is not None and d >= 0]
        if total is None or itemsize is None or len(known) != len(dims):
            total = None
            continue
        total += math.prod(known) * itemsize
    if total is None and node.op in BOUNDED_OPS:
        total = _bound(node, inputs)
    return total, elems


def evaluate(node: gs.Node, inputs: list[np.ndarray | None], opset: int, elems: list[int] | None = None) -> list:
    """Run ``node`` alone in onnxruntime (CPU, ORT_DISABLE_ALL) on ``inputs`` (None for an omitted optional
    input) and return its outputs (None for unnamed ones).

    ``elems``: the ``TensorProto.DataType`` of each named output where known (see :func:`predicted_outputs`).
    onnxruntime's Python API hands back no bfloat16 or float8 array (it raises, or returns float8e4m3fn as its
    uint8 bits), so such an output is read through an added exact Cast to float32 (int32 for int4/uint4: every
    value of those types is one of these) and returned in its own ml_dtypes dtype.

    Raises:
        Exception: whatever onnxruntime raises for a node it cannot run (bad attributes, an op it lacks), and
            ValueError when an array's dtype is not the type onnxruntime declares for that output.
    """
    from onnxfuse.ort.sessions import session  # here: most models fold nothing, and optimize --no-verify needs no more

    model, feeds = _one_node_model(node, inputs, opset, -1)
    named = [t.name for t in node.outputs if t.name]
    fetch, wanted = list(named), {}
    for i, (name, elem) in enumerate(zip(named, elems or [0] * len(named), strict=True)):
        if not elem:
            continue
        dtype = np_dtype(elem)
        if _native(dtype):
            continue
        integer = onnx.TensorProto.DataType.Name(elem).startswith(("INT", "UINT"))  # INT4, UINT4, INT2, UINT2
        wide = onnx.TensorProto.INT32 if integer else onnx.TensorProto.FLOAT
        fetch[i] = f"{name}__onnxfuse_wide"
        model.graph.node.append(onnx.helper.make_node("Cast", [name], [fetch[i]], to=wide))
        model.graph.output.append(onnx.ValueInfoProto(name=fetch[i]))
        wanted[name] = dtype
    sess = session(model.SerializeToString(), threads=1)
    declared = {o.name: o.type for o in sess.get_outputs()}
    got = {}
    for name, key, value in zip(named, fetch, sess.run(fetch, feeds), strict=True):
        ort_name = {"float32": "float", "float64": "double", "object": "string"}.get(value.dtype.name,
                                                                                   value.dtype.name)
        if declared.get(key) != f"tensor({ort_name})":
            raise ValueError(f"onnxruntime returned {value.dtype} for {key} of type {declared.get(key)}")
        got[name] = value.astype(wanted[name]) if name in wanted else value
    return [got.get(t.name) if t.name else None for t in node.outputs]


#: Ops whose output depends only on the shape of their input: folded from static shapes (:func:`static_shape_value`).
SHAPE_OPS = ("Shape", "Size")


def static_shape_value(node: gs.Node, ctx: Context) -> np.ndarray | None:
    """The int64 value of a ``Shape`` ([k] dims) or ``Size`` (scalar element count) node, computed from the static
    shape of its input (``ctx.shape``), or None when a dim it reads is not a known number of at least 1 (a named
    symbolic dim, an unknown dim, an unknown rank, or a 0/-1 that an exporter writes for "dynamic").

    ``Shape`` reads the dims ``start:end`` (ONNX Operators.md, Shape-15: negative values count from the end, out
    of range values are clamped to [0, rank]: exactly Python's slice of the dims tuple); before opset 15 there
    are no such attributes and the defaults (all dims) apply. ``Size`` reads every dim (Operators.md, Size).
    """
    shape = ctx.shape(node.inputs[0])
    if shape is None:
        return None
    if node.op == "Shape":
        start, end = node.attrs.get("start", 0), node.attrs.get("end")
        dims = tuple(shape)[int(start):None if end is None else int(end)]
    else:
        dims = tuple(shape)
    if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 1 for d in dims):
        return None
    if node.op == "Shape":
        return np.array(dims, dtype=np.int64)
    return np.array(int(np.prod(dims, dtype=np.int64)), dtype=np.int64)


def _fold_static_shape(node: gs.Node, ctx: Context) -> ConstantFoldMatch | Skip | None:
    """A :class:`ConstantFoldMatch` for a ``Shape``/``Size`` of a run-time tensor whose read dims are static, a Skip
    when its output is a graph output, None when a dim is not static (the node stays)."""
    value = static_shape_value(node, ctx)
    if value is None:
        return None
    nodes, out = [node], node.outputs[0]
    if edit.is_graph_output(out, ctx.graph):
        return skip(Reason.GRAPH_OUTPUT, f"{out.name} is a graph output", nodes, out)
    return ConstantFoldMatch(nodes, values=[value])


#: Constants of at most this many elements keep their values in the graph that :func:`refresh_shapes` infers on
#: (shape vectors, axes, scalars: what shape inference reads); larger ones are passed as name, dtype and dims only.
SHAPE_INFERENCE_MAX_ELEMENTS = 64


def refresh_shapes(graph: gs.Graph, ctx: Context) -> None:
    """Re-run onnx shape inference (:func:`onnxfuse.analysis.shapes.infer`) on ``graph`` as it is now, and fill in
    ``ctx.shapes`` where it knew less: an unknown rank, or unknown dims where the new shape has the same rank.
    Known shapes are never changed.

    After a ``Shape`` of a static tensor folded, a ``Reshape`` reads a constant shape and onnx infers its output
    (a Keras ``Flatten``: the MatMuls behind it are then seen as 2-D). The graph is exported without the values of
    constants over :data:`SHAPE_INFERENCE_MAX_ELEMENTS` elements (as :func:`onnxfuse.model.proto.skeleton` does), so
    the weights are not copied. Leaves ``ctx.shapes`` as it was when the graph cannot be exported.
    """
    from onnxfuse.analysis import shapes

    exporter = gs.exporters.onnx_exporter.OnnxExporter
    try:
        nodes = [exporter.export_node(n) for n in graph.nodes]
        inits, seen = [], set()
        for n in graph.nodes:
            for t in n.inputs:
                if not isinstance(t, gs.Constant) or not t.name or t.name in seen:
                    continue
                seen.add(t.name)
                if int(np.prod(t.shape, dtype=np.int64)) <= SHAPE_INFERENCE_MAX_ELEMENTS:
                    inits.append(onnx.numpy_helper.from_array(np.asarray(t.values), t.name))
                else:
                    inits.append(onnx.TensorProto(name=t.name, dims=list(t.shape),
                                                  data_type=onnx_dtype(t.dtype)))
        proto = onnx.helper.make_graph(
            nodes, "shapes", [exporter.export_value_info_proto(t, do_type_check=False) for t in graph.inputs],
            [exporter.export_value_info_proto(t, do_type_check=False) for t in graph.outputs], inits)
        opsets = list(graph.import_domains or [onnx.helper.make_opsetid("", int(graph.opset))])
        model = onnx.helper.make_model(proto, opset_imports=opsets)
        model.ir_version = onnx.helper.find_min_ir_version_for(opsets, ignore_unknown=True)
    except Exception:  # an attribute or dtype graphsurgeon cannot export: keep what is known
        return
    info, _ = shapes.infer(model)
    for name, (shape, dtype) in info.items():
        old = ctx.shapes.get(name)
        if shape is None:
            continue
        if old is None or old[0] is None or (len(old[0]) == len(shape) and None in old[0]
                                               and all(o is None or o == s for o, s in zip(old[0], shape,
                                                                                          strict=True))):
            ctx.shapes[name] = (shape, dtype if old is None or old[1] is None else old[1])


def _dropout_training(node: gs.Node, inputs: list[np.ndarray | None]) -> bool:
    """True for a Dropout whose ``training_mode`` input (opset 12+) is a constant true: ONNX Operators.md,
    Dropout: in training mode the output is the input masked at random (a run-time ``training_mode`` makes the
    node no fold candidate; opsets before 7, with ``is_test``, are refused at load)."""
    return (node.op == "Dropout" and len(inputs) > 2 and inputs[2] is not None
            and bool(np.asarray(inputs[2]).reshape(-1)[0]))


#: Ops whose input 1 (the weight) and 2 (the bias) a weight-only value feeds (:func:`_weight_only`).
WEIGHT_READERS = ("Conv", "ConvTranspose", "Gemm")


def _weight_only(node: gs.Node, graph: gs.Graph, depth: int = 8) -> bool:
    """True when every named output of ``node`` is read, through at most ``depth`` single-output default-domain
    nodes (Cast, Mul by a scale, Reshape...), only as input 1 or 2 (weight, bias) of a Conv, ConvTranspose or
    Gemm, and none is an output of ``graph``: a weight computed from compact constants, which
    ``--materialize-weights`` lets grow."""
    outputs = [t for t in node.outputs if t.name]
    if not outputs:
        return False
    for t in outputs:
        readers = edit.consumers(t)
        if not readers or edit.is_graph_output(t, graph):
            return False
        for r in readers:
            if not is_default_domain(r.domain):
                return False
            if r.op in WEIGHT_READERS and any(x is t for x in r.inputs[1:3]) and t is not r.inputs[0]:
                continue
            if depth <= 0 or len(r.outputs) != 1 or not _weight_only(r, graph, depth - 1):
                return False
    return True


def _main_graph(ctx: Context) -> bool:
    """True when the graph being folded is the model's main graph (an If/Loop/Scan body is not)."""
    return ctx.graph is not None and ctx.graph is ctx.main_graph


class ConstantFold(Pass[ConstantFoldMatch]):
    """Node with constant inputs => the constant it computes (onnxruntime evaluates it)."""

    name = "constant_fold"
    kind = RewriteKind.CANONICALIZE
    summary = "replace nodes whose inputs are all constants by their values (computed by onnxruntime)"
    reasons = (Reason.INITIALIZER_IS_INPUT, Reason.RANDOM_OP, Reason.QDQ_NODE, Reason.GRAPH_OUTPUT,
               Reason.FOLD_GROWS, Reason.FOLD_SIZE_UNKNOWN, Reason.DTYPE_NOT_FOLDABLE, Reason.EVALUATION_FAILED)

    def match(self, node: gs.Node, ctx: Context) -> ConstantFoldMatch | Skip | None:
        if node.op == "Constant" or not is_default_domain(node.domain) or _has_subgraph(node) or not node.outputs:
            return None
        if node.op in NON_TENSOR_OPS:
            return None
        if not node.inputs and node.op not in RANDOM_OPS:
            return None  # EyeLike-style sources without inputs do not exist in ONNX; nothing to fold
        if node.op in SHAPE_OPS and node.inputs and ctx.constant(node.inputs[0])[0] is None:
            return _fold_static_shape(node, ctx)
        values: list[np.ndarray | None] = []
        overridable: list[str] = []
        for i, t in enumerate(node.inputs):
            if not t.name:
                values.append(None)
                continue
            value, why = ctx.constant(t)
            if value is None and i == 1 and node.op == "CastLike" and ctx.dtype(t) is not None:
                value = np.zeros((0,), ctx.dtype(t))  # only target_type's element type is read (ONNX CastLike)
            if value is None:
                if why != Reason.INITIALIZER_IS_INPUT:
                    return None  # a run-time input: not a fold candidate
                overridable.append(t.name)
            values.append(value)
        nodes, out = [node], node.outputs[0]
        if overridable:
            return skip(Reason.INITIALIZER_IS_INPUT, f"{overridable[0]} is an initializer listed as a graph input "
                        "(overridable); pass --constant-initializer-inputs if it never changes", nodes, out)
        if node.op in RANDOM_OPS:
            return skip(Reason.RANDOM_OP, f"{node.op} draws new values on every run", nodes, out)
        if _dropout_training(node, values):
            return skip(Reason.RANDOM_OP, f"Dropout in training mode ({node.inputs[2].name} is true) draws a new "
                        "mask on every run", nodes, out)
        if node.op in QDQ_OPS:
            return skip(Reason.QDQ_NODE, f"{node.op} stays a node for onnxruntime's QDQ fusions", nodes, out)
        for t in node.outputs:
            if edit.is_graph_output(t, ctx.graph) and not _main_graph(ctx):
                return skip(Reason.GRAPH_OUTPUT, f"{t.name} is an output of a subgraph", nodes, out)
        for t, v in zip(node.inputs, values, strict=True):
            if v is not None and (v.dtype.kind not in "biuf" or not _native(v.dtype)):
                return skip(Reason.DTYPE_NOT_FOLDABLE, f"input {t.name} has dtype {v.dtype}", nodes, out)
        distinct = {id(t): (t, v) for t, v in zip(node.inputs, values, strict=True) if v is not None}
        in_bytes = sum(v.nbytes for _, v in distinct.values())
        freed = sum(v.nbytes for t, v in distinct.values() if all(r is node for r in edit.consumers(t)))
        predicted, elems = predicted_outputs(node, values, ctx.opset)
        if predicted is None:
            return skip(Reason.FOLD_SIZE_UNKNOWN, f"the size of {node.op}'s output is not known before running it "
                        "(onnx shape inference cannot tell it), so it may be any size", nodes, out)
        materialize = ctx.materialize_bytes if ctx.materialize_bytes and _weight_only(node, ctx.graph) else 0
        grows = self._grows(predicted, in_bytes, freed, nodes, out, materialize)
        if grows:
            return grows
        try:
            results = evaluate(node, values, ctx.opset, elems)
        except Exception as exc:  # onnxruntime raises its own Fail/InvalidArgument/NotImplemented types
            return skip(Reason.EVALUATION_FAILED, f"onnxruntime could not run {node.op}: "
                        f"{' '.join(str(exc).split())[:200]}", nodes, out)
        if any(t.name and not isinstance(r, np.ndarray) for t, r in zip(node.outputs, results, strict=True)):
            return skip(Reason.EVALUATION_FAILED, f"an output of {node.op} is not a tensor", nodes, out)
        out_bytes = sum(r.nbytes for r in results if r is not None)
        grows = self._grows(out_bytes, in_bytes, freed, nodes, out, materialize)
        if grows:
            return grows
        over = out_bytes > freed + SHARED_COPY_LIMIT_BYTES or out_bytes > in_bytes + FOLD_GROWTH_LIMIT_BYTES
        return ConstantFoldMatch(nodes, values=results, growth=out_bytes - freed if over else 0)

    @staticmethod
    def _grows(out_bytes: int | None, in_bytes: int, freed: int, nodes: list[gs.Node], out: gs.Tensor,
               materialize: int = 0) -> Skip | None:
        """Skip when the fold would grow the model too much (bytes: ``in_bytes`` of distinct constant inputs, of
        which ``freed`` are read by this node only and leave the model with it), unless the growth
        ``out_bytes - freed`` fits ``materialize`` (the bytes left of ``--materialize-weights`` for a value that
        only conv/Gemm weights are computed from)."""
        if out_bytes is None or out_bytes - freed <= materialize:
            return None
        if out_bytes > in_bytes + FOLD_GROWTH_LIMIT_BYTES:
            return skip(Reason.FOLD_GROWS, f"the folded value would hold {out_bytes} bytes from {in_bytes} bytes "
                        f"of constant inputs (limit: inputs + {FOLD_GROWTH_LIMIT_BYTES})", nodes, out)
        if out_bytes > freed + SHARED_COPY_LIMIT_BYTES and freed < in_bytes:
            return skip(Reason.FOLD_GROWS, f"the folded value ({out_bytes} bytes) would be a copy: its constant "
                        f"inputs stay for their other readers (limit: {SHARED_COPY_LIMIT_BYTES} bytes)", nodes, out)
        if out_bytes > freed + SHARED_COPY_LIMIT_BYTES:
            return skip(Reason.FOLD_GROWS, f"the folded value ({out_bytes} bytes) would be larger than its compact "
                        f"constant inputs ({in_bytes} bytes, read by this node only; limit: inputs + "
                        f"{SHARED_COPY_LIMIT_BYTES} bytes), so they stay compact and onnxruntime computes the value "
                        "when it loads the model: the folds into a conv weight go into its per-channel scale or a "
                        "per-channel Mul before the conv (--materialize-weights MIB stores such weights as plain "
                        "floats)", nodes, out)
        return None

    def rewrite(self, match: ConstantFoldMatch, ctx: Context) -> Fusion:
        node = match.nodes[0]
        original = replaced(match.nodes)
        ctx.materialize_bytes -= match.growth
        edit.fold_to_constants(ctx.edit_order, node, match.values)
        # node and op "": nothing computes it now
        return Fusion(self.name, "", "", original, None, original[0][2], self.kind)
