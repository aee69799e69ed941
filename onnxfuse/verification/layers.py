"""Layer by layer: which tensor first diverges between two models (``onnxfuse verify A B --layers``).

Both models are run with every tensor that a node of the main graph writes under the same name in both (and the
same element type) exposed as an extra graph output, the way Polygraphy's ``--outputs mark all`` does, and each is
judged by the calibrated rule of :mod:`onnxfuse.verification.rule` (:func:`onnxfuse.verification.verify.verify_models`:
the same input sets, noise floor, rounding floor and min floor, per tensor). The tensors that fail are listed in
the original's topological order (ONNX requires a graph's nodes in topological order: the ONNX IR spec, "Graphs"),
each with the node that writes it in either model.

Works for any pair of models (another optimizer's output too) as long as tensor names are kept: a rewrite that
fuses a chain keeps the chain's output name (onnxfuse's ``replace_chain``, onnxruntime's fusions), and one that
keeps a node but changes what it writes gives that output a new name (onnxfuse's ``passes._checks.renew_output``:
the Flatten that batchnorm_gemm keeps before the Gemm), so the tensors both models have mean the same thing.
Names that exist in one model only are not compared; when no intermediate tensor name is shared,
:attr:`Layers.note` says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import onnx

from onnxfuse.verification.models import Model, proto
from onnxfuse.verification.options import VerifyOptions
from onnxfuse.verification.result import OutputDiff, Verification

#: How many diverging tensors :attr:`Layers.first` lists.
FIRST_DIVERGING = 5


@dataclass
class Diverging:
    """One tensor whose values differ beyond tolerance: its comparison and the node that writes it in each model
    (``(name, op_type)``; the name is "" for an unnamed node)."""

    diff: OutputDiff
    original_node: tuple[str, str]
    candidate_node: tuple[str, str]

    def to_dict(self) -> dict[str, Any]:
        return {"tensor": self.diff.name, "original_node": list(self.original_node),
                "candidate_node": list(self.candidate_node), "max_abs_error": _finite(self.diff.max_abs_error),
                "tolerance": self.diff.tolerance}


@dataclass
class Layers:
    """The result of :func:`compare_layers`.

    Attributes:
        compared: tensors exposed in both models, in the original's topological order (graph outputs included).
        original_tensors / candidate_tensors: tensors written by a node of each main graph (not Constant nodes).
        first: the first :data:`FIRST_DIVERGING` tensors that fail, in topological order.
        diverging: how many fail in all.
        verification: the verification of the two exposed models (its ``outputs``: one per compared tensor).
        note: what limits the comparison (no shared names, skipped tensors); None when nothing does.
    """

    compared: list[str]
    original_tensors: int
    candidate_tensors: int
    first: list[Diverging] = field(default_factory=list)
    diverging: int = 0
    verification: Verification | None = None
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``onnxfuse verify --layers --format json``, key ``layers``; ``verification.layers`` of a
        failed ``optimize --layers`` report)."""
        v = self.verification
        return {"compared": len(self.compared), "original_tensors": self.original_tensors,
                "candidate_tensors": self.candidate_tensors, "diverging": self.diverging,
                "first": [d.to_dict() for d in self.first], "note": self.note,
                "status": None if v is None else str(v.status), "reason": None if v is None else v.reason}

    def lines(self) -> list[str]:
        """The text ``onnxfuse verify --layers`` prints (:func:`text_lines`)."""
        return text_lines(self.to_dict())


def text_lines(doc: dict[str, Any]) -> list[str]:
    """The lines that say what :meth:`Layers.to_dict`'s ``doc`` holds: how many tensors were compared, the note,
    and the first diverging tensors with the node that writes each in either model."""
    out = [f"layers: {doc['compared']} tensors compared (of {doc['original_tensors']} in ORIGINAL, "
           f"{doc['candidate_tensors']} in CANDIDATE, same name and dtype in both)"]
    if doc["note"]:
        out.append(f"layers: {doc['note']}")
    if doc["status"] == "skipped":
        out.append(f"layers: not compared ({doc['reason']})")
    elif doc["status"] is not None and not doc["diverging"]:
        out.append("layers: no tensor diverges")
    elif doc["first"]:
        out.append(f"layers: {doc['diverging']} tensor(s) diverge; the first, in ORIGINAL's topological order:")
        for d in doc["first"]:
            o, c = d["original_node"], d["candidate_node"]
            err = "-" if d["max_abs_error"] is None else f"{d['max_abs_error']:.3g}"
            tol = "" if d["tolerance"] is None else f", tolerance {d['tolerance']:.3g}"
            out.append(f"  {d['tensor']}: written by {o[0] or '(unnamed)'} ({o[1]}) in ORIGINAL, "
                       f"{c[0] or '(unnamed)'} ({c[1]}) in CANDIDATE; max abs error {err}{tol}")
    return out


def _finite(x: float) -> float | None:
    return x if x == x and abs(x) != float("inf") else None


def _written(model: onnx.ModelProto) -> dict[str, tuple[str, str, int]]:
    """Tensor name -> (producing node's name, its op type, its index) over the main graph (Constant nodes left out)."""
    out: dict[str, tuple[str, str, int]] = {}
    for i, node in enumerate(model.graph.node):
        if node.op_type == "Constant":
            continue
        for name in node.output:
            if name:
                out[name] = (node.name, node.op_type, i)
    return out


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    """Tensor name -> ONNX element type, from onnx shape inference (the model's own value_info where it fails)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:
        inferred = model
    g = inferred.graph
    return {vi.name: vi.type.tensor_type.elem_type for vi in (*g.value_info, *g.output, *g.input)
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type}


def _exposed(model: onnx.ModelProto, names: list[str], types: dict[str, int]) -> onnx.ModelProto:
    """A copy of ``model`` with ``names`` appended to its graph outputs (those already outputs kept as they are)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    present = {o.name for o in out.graph.output}
    for name in names:
        if name not in present:
            out.graph.output.append(onnx.helper.make_tensor_value_info(name, types[name], None))
    return out


def compare_layers(original: Model, candidate: Model, options: VerifyOptions | None = None) -> Layers:
    """Compare every tensor both models write under the same name (see the module docstring).

    Cost: one verification (:func:`onnxfuse.verification.verify.verify_models`) of the two models with those
    tensors exposed; every exposed tensor of one input set is held in memory at once.

    Raises:
        InputError: as :func:`onnxfuse.verification.verify.verify_models`.
    """
    from onnxfuse.verification import verify

    a, b = proto(original), proto(candidate)
    wa, wb = _written(a), _written(b)
    ta, tb = _elem_types(a), _elem_types(b)
    outputs = [o.name for o in a.graph.output]
    # a type onnx cannot infer on one side (a contrib op such as FusedConv has no schema in onnx) is the other's
    types = {n: ta.get(n) or tb.get(n) for n in wa if n in wb}
    shared = [n for n in sorted(types, key=lambda n: wa[n][2])
              if types[n] and (n not in ta or n not in tb or ta[n] == tb[n])]
    skipped = len(types) - len(shared)
    layers = Layers(shared, len(wa), len(wb))
    notes = []
    if not [n for n in shared if n not in outputs]:
        notes.append("no intermediate tensor exists under the same name in both models (the candidate's tensors "
                     "were renamed, or every node was rewritten): only the graph outputs are compared")
    if skipped:
        notes.append(f"{skipped} tensor(s) of the same name left out: their dtype differs or is unknown")
    layers.note = "; ".join(notes) or None
    names = [n for n in shared if n not in outputs]
    known = {n: t for n, t in types.items() if t}
    result = verify.verify_models(_exposed(a, names, known), _exposed(b, names, known), options)
    layers.verification = result
    order = {n: i for i, n in enumerate(shared)}
    failed = sorted((o for o in result.failed_outputs if o.name in order), key=lambda o: order[o.name])
    layers.diverging = len(failed)
    layers.first = [Diverging(o, wa[o.name][:2], wb[o.name][:2]) for o in failed[:FIRST_DIVERGING]]
    return layers
