"""The memory-traffic report's data: :class:`Report`, its assembly from the pipeline's pieces (:func:`build`) and
its JSON form (:func:`to_json`). Never prints; what each format shows is ``onnxfuse.report.present``'s, the layout
the renderers' (``report.text``, ``report.markdown``, ``report.html``).

The JSON form is documented field by field in ``onnxfuse/report.schema.json`` (``schema_version`` 3; 3 only adds
to 2: ``fusions[].kind`` and ``folds``, ``profile.timing``). Every
byte count is a sympy expression in the model's symbolic input dims (``*_expr``, a string that
``sympy.sympify`` parses, and that onnxfuse reads back without ``eval`` with
:func:`onnxfuse.analysis.expressions.parse`;
names in ``symbols``) and, beside it, an exact integer for the input shapes used (null when a symbol
has no value or the size is unknown). :meth:`Report.to_dict` is what ``present.document`` reads; the renderers
draw that document only.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias, cast

import onnx

from onnxfuse._version import __version__
from onnxfuse.analysis.symbolic import SymbolicShapes, evaluate, growth_share, make_symbol, printer
from onnxfuse.analysis.traffic import ModelIndex, NodeTraffic, Sizes, add, chain_bytes, fused_estimate, totals
from onnxfuse.model.dtypes import np_dtype
from onnxfuse.records import CANONICALIZE_NAMES, Fusion, Skip
from onnxfuse.report.present import percent
from onnxfuse.report.schema import (
    REPORT_DOES_NOT_VERIFY,
    SCHEMA_VERSION,
    Bandwidth,
    BatchOne,
    ReportDict,
    SideTotals,
    SupportsToDict,
    Totals,
)

if TYPE_CHECKING:
    import sympy

    from onnxfuse.ort.optimized_graph import RuntimeGraphs

#: Bytes: an int, or a sympy expression in the input symbols (``onnxfuse.analysis.traffic``).
Bytes: TypeAlias = "sympy.Expr | int"

@dataclass(frozen=True)
class Report:
    """Everything ``onnxfuse report`` and ``optimize --report`` show; ``to_dict()`` is the JSON form. Built once,
    by :func:`build`, with everything the pipeline gathered, and frozen: no field is set afterwards (a report with
    something added, such as ``onnxfuse.api.profile``'s measurements, is a new one: :func:`with_profile`,
    :func:`with_warning`). What each format shows is ``present.document``'s, drawn by the renderers.

    Attributes (byte figures are integers for the input shapes used):
        model: ``path`` (or ``<ModelProto>``), ``sha256``, ``file_bytes``, ``external_data``.
        target: the ``--target``; passes: the pass names that ran, in order.
        totals: ``before`` / ``after`` (``read_bytes``, ``written_bytes``, ``total_bytes``, ``nodes``,
            ``unknown_nodes``), ``saved_bytes``, ``saved_percent``.
        fusions: one dict per fused node (``node``, ``op``, ``replaced``, ``activation``, ``saved_bytes``...).
        unfused: one dict per pattern left unfused (``nodes``, ``reason``, ``detail``, ``bytes``).
        verification: an ``onnxfuse.verification.result.Verification`` (None for ``analyse``).
        The rest is documented field by field in ``onnxfuse/report.schema.json``.
    """

    model: dict[str, Any]
    target: str
    passes: list[str]
    input_shapes: dict[str, list[int]]
    unknown_shapes: list[dict]
    symbols: dict[str, dict]
    symbol_values: dict[str, int]
    shape_assumptions: list[str]
    totals: Totals
    op_counts: dict[str, dict[str, int]]
    fusions: list[dict]
    unfused: list[dict]
    pass_stats: list[dict]
    unknown_nodes: list[dict]
    subgraph_nodes: int
    nodes: dict[str, list[dict]]
    warnings: list[str] | None = None
    verification: Any = None
    bandwidth: Bandwidth | None = None
    onnxruntime: dict | None = None
    deployment: dict | None = None
    profile: dict | None = None
    tune: dict | None = None
    onnxfuse_version: str = __version__

    def to_html(self) -> str:
        """The self-contained HTML page (``onnxfuse report -o report.html``)."""
        from onnxfuse.report.html import to_html  # imported here: only the html format needs plotly

        return to_html(self)

    @property
    def saved_bytes(self) -> int | None:
        """Bytes of memory traffic the rewrites removed (before - after) at the input shapes used. None when it
        is unknown: a size could not be inferred, or the model has symbolic dims (a dynamic batch or image size)
        and no input shapes were given (then ``totals["saved_bytes_expr"]`` has it as an expression in those
        dims, and ``onnxruntime["saved_bytes_beyond"]`` likewise)."""
        return self.totals["saved_bytes"]

    @property
    def saved_bytes_beyond_onnxruntime(self) -> int | None:
        """The figure the command's summary, the HTML page and the Markdown report lead with: bytes of memory
        traffic onnxfuse saves beyond what onnxruntime (the installed release, at ``ort_level``, CPU execution
        provider) already makes of the original when a session loads it. At the input shapes used, or, for
        symbolic dims without values, at the stated representative sizes (:attr:`figure_sizes`). 0 when nothing
        was fused; None when onnxruntime could not load a model for the comparison or a size is unknown. Source:
        ``present.saved_beyond_onnxruntime`` over the ``onnxruntime`` section (``ort/optimized_graph.py``)."""
        from onnxfuse.report.present import saved_beyond_onnxruntime

        return saved_beyond_onnxruntime(self.to_dict())

    @property
    def figure_sizes(self) -> dict[str, int] | None:
        """Symbol -> size at which :attr:`saved_bytes_beyond_onnxruntime` and the other figures are given when the
        model has symbolic dims and no input shapes fixed them (batch 1, 224 for the other dims: the sizes
        verification's first input set runs at too), each dim by the name every view gives it (the model's dim name
        when short and plain, else ``input[axis]``: ``present.display_names``); None when the figures are at the
        input shapes used."""
        from onnxfuse.report.present import display_names, figure_sizes

        doc = self.to_dict()
        sizes, names = figure_sizes(doc), display_names(doc)
        return None if sizes is None else {names.get(k, k): v for k, v in sizes.items()}

    @property
    def before_bytes(self) -> int | None:
        """Bytes read plus written by every node of the input model (nodes of unknown size left out)."""
        return self.totals["before"]["total_bytes"]

    @property
    def after_bytes(self) -> int | None:
        """Bytes read plus written by every node of the optimized model (nodes of unknown size left out)."""
        return self.totals["after"]["total_bytes"]

    def to_json(self) -> str:
        """The JSON form (see ``report.schema.json``): sorted keys, 2-space indent, trailing newline."""
        return to_json(self)

    def to_markdown(self, show_all: bool = True) -> str:
        """Markdown for pull-request comments and CI job summaries: every row, as in a report file
        (``present.show_every_row``); ``show_all=False``: the top rows per table, as on the terminal."""
        from onnxfuse.report.markdown import to_markdown

        return to_markdown(self, show_all)

    def to_text(self, show_all: bool = True, width: int = 120) -> str:
        """Terminal tables without colour codes, ``width`` columns wide: every row, as in a report file
        (``present.show_every_row``); ``show_all=False``: the top rows per table, as on the terminal."""
        from onnxfuse.report.text import to_text

        return to_text(self, show_all, width)

    def verification_dict(self) -> dict[str, Any]:
        """The ``verification`` object of the JSON form (``skipped`` when nothing verified, as in ``report``)."""
        if self.verification is None:
            return {"status": "skipped", "reason": REPORT_DOES_NOT_VERIFY}
        return self.verification.to_dict()

    def to_dict(self) -> ReportDict:
        """The JSON-ready dict described by ``report.schema.json`` (typed for mypy by ``schema.ReportDict``; a new
        field is documented in the JSON schema, not there)."""
        out: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "onnxfuse_version": self.onnxfuse_version,
            "model": self.model,
            "target": self.target,
            "passes": self.passes,
            "input_shapes": self.input_shapes,
            "unknown_shapes": self.unknown_shapes,
            "symbols": self.symbols,
            "symbol_values": self.symbol_values,
            "shape_assumptions": self.shape_assumptions,
            "totals": self.totals,
            "op_counts": self.op_counts,
            "fusions": self.fusions,
            "unfused": self.unfused,
            "pass_stats": self.pass_stats,
            "unknown_nodes": self.unknown_nodes,
            "nodes": self.nodes,
            "subgraph_nodes": self.subgraph_nodes,
            "warnings": list(self.warnings or []),
            "verification": self.verification_dict(),
            "bandwidth": self.bandwidth,
        }
        if self.onnxruntime is not None:
            out["onnxruntime"] = self.onnxruntime
        if self.deployment is not None:
            out["deployment"] = self.deployment
        if self.profile is not None:
            out["profile"] = self.profile
        if self.tune is not None:
            out["tune"] = self.tune
        return cast(ReportDict, out)


def dtype_name(elem_type: int) -> str:
    """numpy-style name of an ONNX dtype (``float32``, ``float16``, ``int64``; ``bfloat16`` where numpy has none)."""
    try:
        return str(np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        return onnx.helper.tensor_dtype_to_string(elem_type).replace("TensorProto.", "").lower()


class _Numbers:
    """Evaluates byte expressions at the symbol values of the input shapes used (cached per expression) and
    prints them."""

    def __init__(self, values: dict[sympy.Symbol, int]):
        self.values = values
        self.cache: dict[Bytes, int | None] = {}
        self.print = printer()

    def __call__(self, expr: Bytes | None) -> int | None:
        if expr is None:
            return None
        if expr not in self.cache:
            self.cache[expr] = evaluate(expr, self.values)
        return self.cache[expr]

    def text(self, expr: Bytes | None) -> str | None:
        """The expression as the report prints it; None for None."""
        return None if expr is None else self.print(expr)

    def pair(self, name: str, expr: Bytes | None) -> dict[str, int | str | None]:
        """``{name: number, name_expr: expression string}``."""
        return {name: self(expr), f"{name}_expr": self.text(expr)}


def _side(rows: list[NodeTraffic], num: _Numbers) -> tuple[SideTotals, Bytes | None]:
    """One side of the ``totals``: its sums over the nodes of known traffic, or None for every sum when the side
    has nodes and none of them was measured (an unmeasured total is unknown, not 0 B)."""
    t = totals(rows)
    measured = t.nodes == 0 or t.unknown_nodes < t.nodes
    read, written, total = (t.read_bytes, t.written_bytes, t.total_bytes) if measured else (None, None, None)
    out: SideTotals = {"read_bytes": num(read), "read_bytes_expr": num.text(read),
                       "written_bytes": num(written), "written_bytes_expr": num.text(written),
                       "total_bytes": num(total), "total_bytes_expr": num.text(total),
                       "nodes": t.nodes, "unknown_nodes": t.unknown_nodes}
    return out, total


def _node_row(r: NodeTraffic, num: _Numbers) -> dict:
    return {"name": r.name, "op": r.op, "output": r.key, **num.pair("read_bytes", r.read_bytes),
            **num.pair("written_bytes", r.written_bytes), "subgraph": r.subgraph}


def removed_outputs(f: Fusion, kept: frozenset[tuple[str, str]] = frozenset()) -> list[str]:
    """First-output names (in the input model) of the nodes a canonicalization rewrite ``f`` deleted: every
    replaced node except the one that still computes the result (``f.node``; empty when none does), whose op may
    have changed (prelu_leaky_relu's PRelu is now a LeakyRelu), and those still in the output by name and op
    (``kept``: a node layout_wrapper moved, not removed)."""
    return [key for name, op, key in f.replaced if not (f.node and name == f.node) and (name, op) not in kept]


def _batch_one(symbols: SymbolicShapes, values: dict[sympy.Symbol, int], before: Bytes | None,
               after: Bytes | None) -> BatchOne | None:
    """Totals at batch 1 where the batch (axis 0 of an input) is the only symbolic dim and no shape was given."""
    table = symbols.table.symbols
    if values or symbols.at_input_shapes or len(table) != 1:
        return None
    [(name, where)] = table.items()
    if where["axis"] != 0:
        return None
    one = {make_symbol(name): 1}
    b, a = evaluate(before, one), evaluate(after, one)
    return {"symbol": name, "before_total_bytes": b, "after_total_bytes": a,
            "saved_bytes": None if a is None or b is None else b - a}


def build(*, loaded, target: str, passes: list[str], input_shapes: dict, missing: list[dict],
          symbols: SymbolicShapes, before_rows: list[NodeTraffic], after_rows: list[NodeTraffic], before_ops: dict,
          after_ops: dict, fusions: list[Fusion], skips: list[Skip], after_index: ModelIndex,
          after_sizes: Sizes, runtime: RuntimeGraphs | None = None, bandwidth_gb_per_s: float | None = None,
          deployment: dict | None = None, optimized_bytes: int | None = None, warnings: list[str] | None = None,
          verification: Any = None, tune: dict | None = None) -> Report:
    """Assemble a :class:`Report` from the pipeline's pieces (see ``pipeline.analyse``).

    Fusions that built on each other (a BN fold, then the activation) become one row per final node, listing
    every original node; its ``saved_bytes`` = traffic of the original nodes - traffic of the final node.
    An unfused pattern's ``bytes`` = traffic of its nodes - what one fused node would move
    (``traffic.fused_estimate``). Either is None when a size is unknown. Numbers are the expressions evaluated
    at the symbol values that ``input_shapes`` bind.

    ``runtime``: onnxruntime's own graphs of both models at the user's level (``ort_graph.runtime_graphs``); each
    fusion row then says whether onnxruntime makes it itself at load (``made_by_onnxruntime``), and the report's
    ``onnxruntime`` section gives the kernels and bytes saved beyond it (:func:`_runtime_section`).
    ``bandwidth_gb_per_s``: also the ``bandwidth`` estimate (:func:`bandwidth_section`). ``deployment``
    (:func:`deployment_section`), ``optimized_bytes`` (the written model's serialized size, ``model``'s
    ``optimized_bytes``), ``warnings`` and ``verification``: what the pipeline gathered beside the traffic, so that
    the report is complete when built. ``tune``: the ``--tune`` section (``onnxfuse.tune.decide``; None without
    ``--tune``).
    """
    # counted at the input shapes (symbolic.SymbolicShapes.at_input_shapes): the bytes are ints, nothing to bind
    values = {} if symbols.at_input_shapes else symbols.table.values(input_shapes)
    num = _Numbers(values)
    before = {r.key: r for r in before_rows}
    after = {r.key: r for r in after_rows}
    fusion_rows, beyond = _fusion_rows(_lineage(fusions), before_rows, before, after, after_sizes, num, runtime)
    report = Report(
        model={"path": report_path_text(loaded), "sha256": loaded.sha256, "file_bytes": loaded.file_bytes,
               "external_data": loaded.external_data,
               "optimized_bytes": optimized_bytes},
        deployment=deployment, warnings=list(warnings) if warnings is not None else None, verification=verification,
        tune=tune,
        target=target, passes=list(passes), input_shapes={k: list(v) for k, v in input_shapes.items()},
        unknown_shapes=missing, symbols=symbols.table.symbols,
        symbol_values=symbols.table.int_values(input_shapes), shape_assumptions=list(symbols.assumptions),
        totals=_totals(before_rows, after_rows, symbols, values, num),
        op_counts={"before": before_ops, "after": after_ops},
        fusions=fusion_rows, unfused=_unfused_rows(skips, after, after_index, after_sizes, num),
        pass_stats=_pass_stats(passes, fusions, skips, before, num,
                               frozenset((r.name, r.op) for r in after_rows if r.name)),
        unknown_nodes=[{"node": r.name, "op": r.op, "output": r.key, "tensors": list(r.unknown),
                        "reason": r.reason} for r in after_rows if r.total_bytes is None],
        subgraph_nodes=sum(1 for r in before_rows if r.subgraph),
        nodes={"before": [_node_row(r, num) for r in before_rows], "after": [_node_row(r, num) for r in after_rows]},
        onnxruntime=None if runtime is None else _runtime_section(runtime, fusion_rows, beyond, num),
    )
    if bandwidth_gb_per_s is None:
        return report
    return dataclasses.replace(report, bandwidth=bandwidth_section(report.to_dict(), bandwidth_gb_per_s))


def with_profile(report: Report, profile: dict) -> Report:
    """A copy of ``report`` with its ``profile`` section (``onnxfuse.bench.report_profile``: ``report --profile``,
    ``onnxfuse.api.profile``); ``report`` is not changed."""
    return dataclasses.replace(report, profile=profile)


def with_warning(report: Report, warning: str) -> Report:
    """A copy of ``report`` with one more warning (``report --profile`` when the models could not be run or timed
    out); ``report`` is not changed."""
    return dataclasses.replace(report, warnings=[*(report.warnings or []), warning])


def bandwidth_section(doc: ReportDict | dict, gb_per_s: float) -> Bandwidth:
    """The report's ``bandwidth`` object: the estimated memory time at ``gb_per_s`` (10^9 bytes per second),
    bytes / bandwidth in milliseconds, of the graph as exported and of the optimized one. At the input shapes
    used (``at`` "input shapes"), else, for symbolic dims without values, at the sizes of every other figure
    (``present.figure_sizes``: ``at`` "batch 1" where the batch is the only symbolic dim, else "representative
    sizes"); times are None and ``at`` None when no number is known there. ``doc``: ``Report.to_dict()``."""
    from onnxfuse.report.present import at_values, figure_sizes

    t = doc["totals"]
    before, after = t["before"]["total_bytes"], t["after"]["total_bytes"]
    at: str | None = "input shapes"
    sizes = figure_sizes(doc)
    if before is None and sizes is not None:
        before, after = (at_values(t[side]["total_bytes_expr"], sizes) for side in ("before", "after"))
        at = "batch 1" if t.get("at_batch_1") else "representative sizes"
    if before is None or after is None:
        at = None

    def ms(n: int | None) -> float | None:
        return None if n is None or at is None else n / (gb_per_s * 1e9) * 1e3

    return {"gb_per_s": gb_per_s, "before_ms": ms(before), "after_ms": ms(after), "at": at, "estimate": True}


def _lineage(fusions: list[Fusion]) -> dict[str, dict[str, Any]]:
    """Current first-output name of a fused node -> the original nodes it now computes (``replaced``), the passes
    that built it, its activation, name and op. Canonicalization rewrites are left out: they remove nodes and are
    reported per pass (``pass_stats``), not as a fused node."""
    lineage: dict[str, dict[str, Any]] = {}
    for f in fusions:
        if f.pass_name in CANONICALIZE_NAMES:
            continue
        originals: list[dict[str, str]] = []
        passes_used: list[str] = []
        activation = None
        kind = str(f.kind)
        folds = 1 if kind == "fold" else 0
        for name, op, key in f.replaced:
            prev = lineage.pop(key, None)
            if prev:
                originals.extend(prev["replaced"])
                passes_used.extend(prev["passes"])
                activation = prev["activation"] or activation
                kind = "fuse" if "fuse" in (kind, prev["kind"]) else kind  # a fold inside a fusion: a fusion
                folds += prev["folds"]
            else:
                originals.append({"name": name, "op": op, "output": key})
        passes_used.append(f.pass_name)
        lineage[f.output] = {"replaced": originals, "passes": passes_used, "activation": f.activation or activation,
                             "node": f.node, "op": f.op, "kind": kind, "folds": folds}
    return lineage


def _fusion_rows(lineage: dict[str, dict[str, Any]], before_rows: list[NodeTraffic], before: dict[str, NodeTraffic],
                 after: dict[str, NodeTraffic], after_sizes: Sizes, num: _Numbers, runtime: RuntimeGraphs | None
                 ) -> tuple[list[dict[str, Any]], list[Bytes | None]]:
    """The ``fusions`` rows (one per final fused node of ``lineage``) and the saved bytes of those onnxruntime does
    not make itself (for the ``onnxruntime`` section; empty without ``runtime``)."""
    rows: list[dict[str, Any]] = []
    beyond: list[Bytes | None] = []
    for key, entry in lineage.items():
        before_b = chain_bytes(before, [o["output"] for o in entry["replaced"]])
        row = after.get(key)
        after_b = row.total_bytes if row is not None else None
        shape = after_sizes.shapes.get(key)
        elem = after_sizes.elem_types.get(key)
        saved = None if before_b is None or after_b is None else before_b - after_b
        rows.append({
            "node": entry["node"] or key, "op": entry["op"], "kind": entry["kind"], "folds": entry["folds"],
            "replaced": entry["replaced"],
            "activation": entry["activation"], "passes": entry["passes"], "output": key,
            "shape": None if shape is None else [_dim_json(d) for d in shape],
            "dtype": dtype_name(elem) if elem else None,
            **num.pair("bytes_before", before_b), **num.pair("bytes_after", after_b), **num.pair("saved_bytes", saved),
            "unknown_reason": None if saved is not None else _why(before_rows, entry["replaced"], row),
        })
        if runtime is not None and runtime.available:
            intermediates = [o["output"] for o in entry["replaced"] if o["output"] != key]
            rows[-1]["made_by_onnxruntime"] = runtime.made_by_onnxruntime(intermediates)
            if not rows[-1]["made_by_onnxruntime"]:
                beyond.append(_saved_beyond(saved, [before.get(i) for i in intermediates], runtime))
    return rows, beyond


def _unfused_rows(skips: list[Skip], after: dict[str, NodeTraffic], after_index: ModelIndex, after_sizes: Sizes,
                  num: _Numbers) -> list[dict[str, Any]]:
    """The ``unfused`` rows: one per pattern a fusion pass declined, with the bytes one fused node would save.
    Canonicalization's refusals are no fusion pattern: they are counted per pass (``pass_stats``)."""
    rows = []
    for s in skips:
        if s.pass_name in CANONICALIZE_NAMES:
            continue
        keys = [k for _, _, k in s.nodes]
        chain = chain_bytes(after, keys)
        fused = fused_estimate(after_index, keys, s.output, after_sizes)
        rows.append({
            "pass": s.pass_name, "nodes": [{"name": n, "op": op, "output": k} for n, op, k in s.nodes],
            "reason": str(s.reason), "detail": s.detail, "output": s.output,
            **num.pair("bytes", None if chain is None or fused is None else chain - fused),
        })
    return rows


def _totals(before_rows: list[NodeTraffic], after_rows: list[NodeTraffic], symbols: SymbolicShapes,
            values: dict[sympy.Symbol, int], num: _Numbers) -> Totals:
    """The ``totals`` object: both sides, the bytes saved, its share now and as the dims grow, at batch 1."""
    before_t, before_total = _side(before_rows, num)
    after_t, after_total = _side(after_rows, num)
    saved = None if before_total is None or after_total is None else before_total - after_total
    saved_n = num(saved)
    share = None if saved is None or before_total is None else growth_share(saved, before_total)
    return {"before": before_t, "after": after_t, "saved_bytes": saved_n, "saved_bytes_expr": num.text(saved),
            "saved_percent": percent(saved_n, before_t["total_bytes"]),
            "saved_percent_as_dims_grow": None if share is None else round(100.0 * share, 2),
            "at_batch_1": _batch_one(symbols, values, before_total, after_total)}


def _pass_stats(passes: list[str], fusions: list[Fusion], skips: list[Skip], before: dict[str, NodeTraffic],
                num: _Numbers, kept: frozenset[tuple[str, str]]) -> list[dict[str, Any]]:
    """The ``pass_stats`` rows: per pass, its rewrites and refusals by reason; for a canonicalization pass also the
    nodes it removed (not those still in the output, ``kept``: (name, op) of its named nodes) and their bytes."""
    stats = []
    for name in passes:
        applied = sum(1 for f in fusions if f.pass_name == name)
        reasons: dict[str, int] = {}
        for s in skips:
            if s.pass_name == name:
                reasons[str(s.reason)] = reasons.get(str(s.reason), 0) + 1
        row: dict[str, Any] = {"name": name, "applied": applied, "skipped": dict(sorted(reasons.items()))}
        if name in CANONICALIZE_NAMES:
            keys = [k for f in fusions if f.pass_name == name for k in removed_outputs(f, kept)]
            row["removed_nodes"] = len(keys)
            row.update(num.pair("removed_bytes", chain_bytes(before, keys) if keys else 0))
        stats.append(row)
    return stats


def report_path_text(loaded) -> str:
    """How a report names the model: ``loaded.label`` (the API's ``name``, ``<ModelProto>``), or its path as given
    when relative, else relative to the working folder when inside it, else the file name alone, so that no
    report (an artifact a CI job archives) carries a machine's absolute paths."""
    from onnxfuse.model.files import shown_path

    if loaded.name is not None or loaded.path is None:
        return loaded.label
    return shown_path(loaded.path)


def deployment_section(release: tuple[int, int], forms: dict[str, int], min_release: tuple[int, int]) -> dict:
    """The report's ``deployment`` object: the onnxruntime release the model is for (``--ort-version``, default the
    installed one), the oldest release that loads every FusedConv/FusedGemm form in it, and each form with its
    count and the release it needs (``providers.FORM_MIN_ORT``, from ``benchmarks/probe_ort_releases.py``)."""
    from onnxfuse.ort.providers import PROBED_ORT_RELEASES, form_min_release, release_text

    return {"ort_version": release_text(release), "min_onnxruntime": release_text(min_release),
            "probed": [release_text(PROBED_ORT_RELEASES[0]), release_text(PROBED_ORT_RELEASES[-1])],
            "forms": [{"form": f, "count": n, "min_onnxruntime": release_text(form_min_release(f))}
                      for f, n in sorted(forms.items())]}


def _saved_beyond(saved: Bytes | None, intermediates: list[NodeTraffic | None], runtime: RuntimeGraphs
                  ) -> Bytes | None:
    """What a fusion saves beyond onnxruntime: its ``saved`` bytes less, for each intermediate tensor that
    onnxruntime's own graph no longer writes (a part of the chain it fuses itself, such as a BatchNormalization it
    folds), that tensor's write and its one read (twice the producing node's written bytes). None when a size is
    unknown."""
    known = [n for n in intermediates if n is not None]
    if saved is None or len(known) < len(intermediates):
        return None
    gone = [n.written_bytes for n in known if not runtime.materialized(n.key)]
    if any(b is None for b in gone):
        return None
    return saved - 2 * add(gone) if gone else saved


def _runtime_section(runtime: RuntimeGraphs, rows: list[dict[str, Any]], beyond: list[Bytes | None], num: _Numbers
                     ) -> dict[str, Any]:
    """The report's ``onnxruntime`` object: what onnxfuse saves beyond what onnxruntime (the installed release, at
    the user's level, CPU execution provider) already makes of the original at load. ``saved_bytes_beyond`` sums
    the saved bytes of the fusions onnxruntime does not make (None where one is unknown); kernels are the nodes of
    onnxruntime's optimized graphs (``ort_graph``)."""
    out: dict[str, Any] = {"installed": runtime.onnxruntime, "level": runtime.level, "provider": runtime.provider,
           "status": "compared" if runtime.available else "unavailable", "reason": runtime.reason,
           "kernels_before": None, "kernels_after": None, "fusions": len(rows), "fusions_made_by_onnxruntime": None,
           "saved_bytes_beyond": None, "saved_bytes_beyond_expr": None, "ops_removed": {}, "ops_added": {}}
    if runtime.unchanged:  # nothing rewritten (pipeline, no session): 0 B beyond onnxruntime, said as such
        out.update(status="unchanged", reason="nothing was rewritten: onnxruntime runs the output as the original",
                   fusions_made_by_onnxruntime=0, saved_bytes_beyond=0, saved_bytes_beyond_expr="0")
    if not runtime.available or runtime.unchanged:
        return out
    from onnxfuse.ort.optimized_graph import kernels, ops_removed

    total = None if any(b is None for b in beyond) else add(beyond)
    out.update(kernels_before=kernels(runtime.original_ops), kernels_after=kernels(runtime.optimized_ops),
               fusions_made_by_onnxruntime=sum(1 for r in rows if r.get("made_by_onnxruntime")),
               **num.pair("saved_bytes_beyond", total),
               ops_removed=ops_removed(runtime.original_ops, runtime.optimized_ops),
               ops_added=ops_removed(runtime.optimized_ops, runtime.original_ops))
    return out


def _dim_json(d):
    if d is None or isinstance(d, int):
        return d
    return int(d) if getattr(d, "is_Integer", False) else str(d)


def _why(before_rows: list[NodeTraffic], replaced: list[dict], row: NodeTraffic | None) -> str:
    """The reason a fusion row's bytes are unknown."""
    keys = {o["output"] for o in replaced}
    for r in before_rows:
        if r.key in keys and r.reason:
            return r.reason
    return row.reason if row is not None and row.reason else "the size of a tensor it moves is unknown"


def to_json(report: SupportsToDict) -> str:
    """The report as JSON (sorted keys, 2-space indent, trailing newline): stable for diffs in CI."""
    return json.dumps(report.to_dict(), indent=2, sort_keys=True) + "\n"
