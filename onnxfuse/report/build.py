"""The memory-traffic report: data (``Report``) and its renderers (text, JSON, Markdown; HTML in
``report_html``). Never prints.

The JSON form is documented field by field in ``onnxfuse/report.schema.json`` (``schema_version`` 2). Every
byte count is a sympy expression in the model's symbolic input dims (``*_expr``, a string that
``sympy.sympify`` parses, and that onnxfuse reads back without ``eval`` with
:func:`onnxfuse.analysis.expressions.parse`;
names in ``symbols``) and, beside it, an exact integer for the input shapes used (null when a symbol
has no value or the size is unknown). Text and Markdown show KiB/MiB/GiB (powers of 1024).
:meth:`Report.to_dict` is the one source every renderer reads.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import onnx

from onnxfuse._version import __version__
from onnxfuse.analysis import expressions
from onnxfuse.analysis.shapes import REPRESENTATIVE_BATCH, REPRESENTATIVE_SIZE
from onnxfuse.analysis.symbolic import SymbolicShapes, evaluate, growth_share, make_symbol, printer
from onnxfuse.analysis.traffic import Bytes, ModelIndex, NodeTraffic, Sizes, add, chain_bytes, fused_estimate, totals
from onnxfuse.model.dtypes import np_dtype
from onnxfuse.records import CANONICALIZE_NAMES, Fusion, Skip
from onnxfuse.report import escape

if TYPE_CHECKING:
    from onnxfuse.ort.optimized_graph import RuntimeGraphs

SCHEMA_VERSION = 2

#: The verification reason of a report that ``onnxfuse report`` (or the API's ``analyse``) made: nothing was run.
REPORT_DOES_NOT_VERIFY = "onnxfuse report does not verify"

#: Formats ``render`` accepts (the CLI's ``--format`` and ``--report-format`` choices).
FORMATS = ("text", "json", "markdown", "html")

#: Rows shown per table in text and Markdown unless ``show_all`` (largest byte figures first).
DEFAULT_TOP_ROWS = 20

#: Report file extension -> format, for ``report -o FILE`` and ``optimize --report FILE``. Add a renderer's
#: extensions here.
REPORT_EXTENSIONS = {".json": "json", ".md": "markdown", ".markdown": "markdown", ".txt": "text", ".html": "html",
                     ".htm": "html"}


@dataclass
class Report:
    """Everything ``onnxfuse report`` and ``optimize --report`` show; ``to_dict()`` is the JSON form.

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
    totals: dict[str, Any]
    op_counts: dict[str, dict[str, int]]
    fusions: list[dict]
    unfused: list[dict]
    pass_stats: list[dict]
    unknown_nodes: list[dict]
    subgraph_nodes: int
    nodes: dict[str, list[dict]]
    warnings: list[str] | None = None
    verification: Any = None
    bandwidth: dict | None = None
    onnxruntime: dict | None = None
    deployment: dict | None = None
    profile: dict | None = None
    onnxfuse_version: str = __version__

    def to_html(self) -> str:
        """The self-contained HTML page (``onnxfuse report -o report.html``)."""
        return render(self, "html")

    @property
    def saved_bytes(self) -> int | None:
        """Bytes of memory traffic the rewrites removed (before - after) at the input shapes used. None when it
        is unknown: a size could not be inferred, or the model has symbolic dims (a dynamic batch or image size)
        and no input shapes were given (then ``totals["saved_bytes_expr"]`` has it as an expression in those
        dims, and ``onnxruntime["saved_bytes_beyond"]`` likewise)."""
        return self.totals["saved_bytes"]

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

    def to_markdown(self, show_all: bool = False) -> str:
        """Markdown for pull-request comments and CI job summaries (top rows unless ``show_all``)."""
        return to_markdown(self, show_all)

    def to_text(self, show_all: bool = False, width: int = 120) -> str:
        """Terminal tables without colour codes, ``width`` columns wide (top rows unless ``show_all``)."""
        return to_text(self, show_all, width)

    def set_bandwidth(self, gb_per_s: float) -> None:
        """Add the estimated memory time at ``gb_per_s`` (10^9 bytes per second): bytes / bandwidth, at the input
        shapes used, else at batch 1 where the batch is the only symbolic dim; times are None when neither
        gives a number."""
        t = self.totals
        before, after, at = t["before"]["total_bytes"], t["after"]["total_bytes"], "input shapes"
        if before is None and t["at_batch_1"]:
            before, after, at = t["at_batch_1"]["before_total_bytes"], t["at_batch_1"]["after_total_bytes"], \
                "batch 1"
        if before is None or after is None:
            at = None

        def ms(n):
            return None if n is None or at is None else n / (gb_per_s * 1e9) * 1e3

        self.bandwidth = {"gb_per_s": gb_per_s, "before_ms": ms(before), "after_ms": ms(after), "at": at,
                          "estimate": True}

    def verification_dict(self) -> dict[str, Any]:
        """The ``verification`` object of the JSON form (``skipped`` when nothing verified, as in ``report``)."""
        if self.verification is None:
            return {"status": "skipped", "reason": REPORT_DOES_NOT_VERIFY}
        return self.verification.to_dict()

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready dict described by ``report.schema.json``."""
        return {
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
            **({"onnxruntime": self.onnxruntime} if self.onnxruntime is not None else {}),
            **({"deployment": self.deployment} if self.deployment is not None else {}),
            **({"profile": self.profile} if self.profile is not None else {}),
        }


def dtype_name(elem_type: int) -> str:
    """numpy-style name of an ONNX dtype (``float32``, ``float16``, ``int64``; ``bfloat16`` where numpy has none)."""
    try:
        return str(np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        return onnx.helper.tensor_dtype_to_string(elem_type).replace("TensorProto.", "").lower()


class _Numbers:
    """Evaluates byte expressions at the symbol values of the input shapes used (cached per expression) and
    prints them."""

    def __init__(self, values: dict):
        self.values = values
        self.cache: dict = {}
        self.print = printer()

    def __call__(self, expr) -> int | None:
        if expr is None:
            return None
        if expr not in self.cache:
            self.cache[expr] = evaluate(expr, self.values)
        return self.cache[expr]

    def pair(self, name: str, expr) -> dict:
        """``{name: number, name_expr: expression string}``."""
        return {name: self(expr), f"{name}_expr": None if expr is None else self.print(expr)}


def _side(rows: list[NodeTraffic], num: _Numbers) -> tuple[dict, Bytes]:
    t = totals(rows)
    out = {**num.pair("read_bytes", t.read_bytes), **num.pair("written_bytes", t.written_bytes),
           **num.pair("total_bytes", t.total_bytes), "nodes": t.nodes, "unknown_nodes": t.unknown_nodes}
    return out, t.total_bytes


def _node_row(r: NodeTraffic, num: _Numbers) -> dict:
    return {"name": r.name, "op": r.op, "output": r.key, **num.pair("read_bytes", r.read_bytes),
            **num.pair("written_bytes", r.written_bytes), "subgraph": r.subgraph}


def removed_outputs(f: Fusion) -> list[str]:
    """First-output names (in the input model) of the nodes a canonicalization rewrite ``f`` deleted: every
    replaced node except the one that still computes the result (``f.node``; empty when none does)."""
    return [key for name, op, key in f.replaced if not (f.node and name == f.node and op == f.op)]


def _percent(part: int | None, whole: int | None) -> float | None:
    if part is None or not whole:
        return None
    return round(100.0 * part / whole, 2)


def _batch_one(symbols: SymbolicShapes, values: dict, before, after) -> dict | None:
    """Totals at batch 1 where the batch (axis 0 of an input) is the only symbolic dim and no shape was given."""
    table = symbols.table.symbols
    if values or len(table) != 1:
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
          after_sizes: Sizes, runtime: RuntimeGraphs | None = None) -> Report:
    """Assemble a :class:`Report` from the pipeline's pieces (see ``pipeline.analyse``).

    Fusions that built on each other (a BN fold, then the activation) become one row per final node, listing
    every original node; its ``saved_bytes`` = traffic of the original nodes - traffic of the final node.
    An unfused pattern's ``bytes`` = traffic of its nodes - what one fused node would move
    (``traffic.fused_estimate``). Either is None when a size is unknown. Numbers are the expressions evaluated
    at the symbol values that ``input_shapes`` bind.

    ``runtime``: onnxruntime's own graphs of both models at the user's level (``ort_graph.runtime_graphs``); each
    fusion row then says whether onnxruntime makes it itself at load (``made_by_onnxruntime``), and the report's
    ``onnxruntime`` section gives the kernels and bytes saved beyond it (:func:`_runtime_section`).
    """
    values = symbols.table.values(input_shapes)
    num = _Numbers(values)
    before = {r.key: r for r in before_rows}
    after = {r.key: r for r in after_rows}
    # lineage: current first-output name of a node -> the original nodes it now computes
    lineage: dict[str, dict] = {}
    for f in fusions:
        if f.pass_name in CANONICALIZE_NAMES:
            continue  # canonicalization removes nodes; it is reported per pass below, not as a fused node
        originals, passes_used, activation = [], [], None
        for name, op, key in f.replaced:
            prev = lineage.pop(key, None)
            if prev:
                originals.extend(prev["replaced"])
                passes_used.extend(prev["passes"])
                activation = prev["activation"] or activation
            else:
                originals.append({"name": name, "op": op, "output": key})
        passes_used.append(f.pass_name)
        lineage[f.output] = {"replaced": originals, "passes": passes_used, "activation": f.activation or activation,
                             "node": f.node, "op": f.op}
    fusion_rows: list[dict] = []
    beyond: list[Bytes | None] = []  # saved bytes of the fusions onnxruntime does not make itself
    for key, entry in lineage.items():
        before_b = chain_bytes(before, [o["output"] for o in entry["replaced"]])
        row = after.get(key)
        after_b = row.total_bytes if row is not None else None
        shape = after_sizes.shapes.get(key)
        elem = after_sizes.elem_types.get(key)
        saved = None if before_b is None or after_b is None else before_b - after_b
        fusion_rows.append({
            "node": entry["node"] or key, "op": entry["op"], "replaced": entry["replaced"],
            "activation": entry["activation"], "passes": entry["passes"], "output": key,
            "shape": None if shape is None else [_dim_json(d) for d in shape],
            "dtype": dtype_name(elem) if elem else None,
            **num.pair("bytes_before", before_b), **num.pair("bytes_after", after_b), **num.pair("saved_bytes", saved),
            "unknown_reason": None if saved is not None else _why(before_rows, entry["replaced"], row),
        })
        if runtime is not None and runtime.available:
            intermediates = [o["output"] for o in entry["replaced"] if o["output"] != key]
            fusion_rows[-1]["made_by_onnxruntime"] = runtime.made_by_onnxruntime(intermediates)
            if not fusion_rows[-1]["made_by_onnxruntime"]:
                beyond.append(_saved_beyond(saved, [before.get(i) for i in intermediates], runtime))
    unfused_rows = []
    for s in skips:
        if s.pass_name in CANONICALIZE_NAMES:
            continue  # not a fusion pattern: counted per pass (pass_stats); conv_unfused lists broken conv chains
        keys = [k for _, _, k in s.nodes]
        chain = chain_bytes(after, keys)
        fused = fused_estimate(after_index, keys, s.output, after_sizes)
        unfused_rows.append({
            "pass": s.pass_name, "nodes": [{"name": n, "op": op, "output": k} for n, op, k in s.nodes],
            "reason": str(s.reason), "detail": s.detail, "output": s.output,
            **num.pair("bytes", None if chain is None or fused is None else chain - fused),
        })
    before_t, before_total = _side(before_rows, num)
    after_t, after_total = _side(after_rows, num)
    saved = before_total - after_total
    saved_n = num(saved)
    share = growth_share(saved, before_total)
    stats = []
    for name in passes:
        applied = sum(1 for f in fusions if f.pass_name == name)
        reasons: dict[str, int] = {}
        for s in skips:
            if s.pass_name == name:
                reasons[str(s.reason)] = reasons.get(str(s.reason), 0) + 1
        row = {"name": name, "applied": applied, "skipped": dict(sorted(reasons.items()))}
        if name in CANONICALIZE_NAMES:
            keys = [k for f in fusions if f.pass_name == name for k in removed_outputs(f)]
            row["removed_nodes"] = len(keys)
            row.update(num.pair("removed_bytes", chain_bytes(before, keys) if keys else 0))
        stats.append(row)
    return Report(
        model={"path": report_path_text(loaded), "sha256": loaded.sha256, "file_bytes": loaded.file_bytes,
               "external_data": loaded.external_data},
        target=target, passes=list(passes), input_shapes={k: list(v) for k, v in input_shapes.items()},
        unknown_shapes=missing, symbols=symbols.table.symbols,
        symbol_values={str(k): int(v) for k, v in values.items()}, shape_assumptions=list(symbols.assumptions),
        totals={"before": before_t, "after": after_t, "saved_bytes": saved_n, "saved_bytes_expr": num.print(saved),
                "saved_percent": _percent(saved_n, before_t["total_bytes"]),
                "saved_percent_as_dims_grow": None if share is None else round(100.0 * share, 2),
                "at_batch_1": _batch_one(symbols, values, before_total, after_total)},
        op_counts={"before": before_ops, "after": after_ops},
        fusions=fusion_rows, unfused=unfused_rows, pass_stats=stats,
        unknown_nodes=[{"node": r.name, "op": r.op, "output": r.key, "tensors": list(r.unknown),
                        "reason": r.reason} for r in after_rows if r.total_bytes is None],
        subgraph_nodes=sum(1 for r in before_rows if r.subgraph),
        nodes={"before": [_node_row(r, num) for r in before_rows], "after": [_node_row(r, num) for r in after_rows]},
        onnxruntime=None if runtime is None else _runtime_section(runtime, fusion_rows, beyond, num),
    )


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


def deployment_line(doc: dict) -> str | None:
    """``runs on: onnxruntime >= 1.30 (FusedConv(HardSwish) x24 needs it; ...)``: the oldest onnxruntime release
    that loads what was written, and what an older ``--ort-version`` would leave unfused; None without a
    ``deployment`` section."""
    d = doc.get("deployment")
    if not d:
        return None
    oldest, newest = d["probed"]
    if not d["forms"]:
        return "runs on: any onnxruntime that runs the original (no onnxruntime-specific op was written)"
    newer = [f for f in d["forms"] if f["min_onnxruntime"] != oldest]
    if not newer:
        return (f"runs on: onnxruntime >= {oldest} for what onnxfuse wrote (every release probed, {oldest} to "
                f"{newest}, loads each form; the model's other ops need what the original needs)")
    needs = ", ".join(f"{f['form']} x{f['count']} needs {f['min_onnxruntime']}" for f in newer)
    return (f"runs on: onnxruntime >= {d['min_onnxruntime']} ({needs}; an older --ort-version leaves "
            f"{'it' if len(newer) == 1 and newer[0]['count'] == 1 else 'them'} unfused)")


def _saved_beyond(saved: Bytes | None, intermediates: list[NodeTraffic | None], runtime: RuntimeGraphs
                  ) -> Bytes | None:
    """What a fusion saves beyond onnxruntime: its ``saved`` bytes less, for each intermediate tensor that
    onnxruntime's own graph no longer writes (a part of the chain it fuses itself, such as a BatchNormalization it
    folds), that tensor's write and its one read (twice the producing node's written bytes). None when a size is
    unknown."""
    if saved is None or any(n is None for n in intermediates):
        return None
    gone = [n.written_bytes for n in intermediates if not runtime.materialized(n.key)]
    if any(b is None for b in gone):
        return None
    return saved - 2 * add(gone) if gone else saved


def _runtime_section(runtime: RuntimeGraphs, rows: list[dict], beyond: list, num: _Numbers) -> dict:
    """The report's ``onnxruntime`` object: what onnxfuse saves beyond what onnxruntime (the installed release, at
    the user's level, CPU execution provider) already makes of the original at load. ``saved_bytes_beyond`` sums
    the saved bytes of the fusions onnxruntime does not make (None where one is unknown); kernels are the nodes of
    onnxruntime's optimized graphs (``ort_graph``)."""
    out = {"installed": runtime.onnxruntime, "level": runtime.level, "provider": runtime.provider,
           "status": "compared" if runtime.available else "unavailable", "reason": runtime.reason,
           "kernels_before": None, "kernels_after": None, "fusions": len(rows), "fusions_made_by_onnxruntime": None,
           "saved_bytes_beyond": None, "saved_bytes_beyond_expr": None, "ops_removed": {}, "ops_added": {}}
    if not runtime.available:
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


# ---------------------------------------------------------------------------------------------------------------
# Renderers (they read Report.to_dict(), the one source)


def human_bytes(n: int | None) -> str:
    """``n`` bytes as B/KiB/MiB/GiB (powers of 1024) with one decimal; "unknown" for None."""
    if n is None:
        return "unknown"
    sign, v = ("-" if n < 0 else ""), float(abs(n))
    for unit in ("B", "KiB", "MiB", "GiB"):
        if v < 1024 or unit == "GiB":
            return f"{sign}{v:.0f} {unit}" if unit == "B" else f"{sign}{v:.1f} {unit}"
        v /= 1024
    return f"{sign}{v:.1f} TiB"  # pragma: no cover


def human_time(ms: float | None) -> str:
    """A duration given in milliseconds, in ns/µs/ms/s with three significant digits; "unknown" for None."""
    if ms is None:
        return "unknown"
    seconds = ms / 1e3
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def bytes_text(number: int | None, expr: str | None, code: bool = False) -> str:
    """A byte figure for people: the number when there is one (KiB/MiB...), else the expression in bytes (in a
    Markdown code span when ``code``: its ``*`` would start emphasis), else "unknown"."""
    if number is not None:
        return human_bytes(number)
    if expr is None:
        return "unknown"
    try:
        return human_bytes(int(expr))
    except ValueError:
        return f"{escape.markdown_code(expr)} B" if code else f"{expr} B"


#: Expressions longer than this are shown to people by their leading terms (:func:`leading_terms`).
LONG_EXPRESSION_CHARS = 60


def _display_names(doc: dict) -> dict[str, str]:
    """Symbol -> how people read it: the model's own dim name when it is short and plain (``N``, ``height``),
    else ``input[axis]`` (``x[2]`` instead of ``p2o_DynamicDimension_1``)."""
    names = {}
    for sym, where in doc.get("symbols", {}).items():
        dim = where.get("dim_param") or ""
        names[sym] = dim if dim.isidentifier() and len(dim) <= 12 else f"{where['input']}[{where['axis']}]"
    return names


def leading_terms(expr: str, doc: dict) -> str:
    """A byte expression as people read it: floor/ceiling dropped (``floor((H - 1)/2) + 1`` ~ ``H/2``), expanded,
    only the terms of the highest degree in the symbols kept plus the constant term (weights), coefficients to 4
    significant digits, the constant in KiB/MiB; symbols by :func:`_display_names`. An approximation for large
    inputs, prefixed "~"; the exact expression stays in the JSON report."""
    import sympy

    values = {name: make_symbol(name) for name in doc.get("symbols", {})}
    e = expressions.parse(expr, values)
    e = sympy.expand(e.replace(sympy.floor, lambda a: a).replace(sympy.ceiling, lambda a: a))
    poly = sympy.Poly(e, *values.values()) if values else None
    if poly is None or not poly.free_symbols:
        return human_bytes(int(sympy.ceiling(e)))
    top = poly.total_degree()
    names = _display_names(doc)
    parts, dropped = [], False
    for monom, coeff in sorted(poly.terms(), key=lambda t: (-sum(t[0]), [-m for m in t[0]])):
        degree = sum(monom)
        if degree == 0:
            continue
        if degree < top:
            dropped = True
            continue
        factors = [names[str(s)] + (f"^{k}" if k > 1 else "") for s, k in zip(values.values(), monom, strict=True)
                   if k]
        parts.append(f"{float(coeff):.4g}*" + "*".join(factors))
    const = poly.coeff_monomial(1)
    text = " + ".join(parts) + " bytes"  # not "B": a model may call its batch dim B
    if const:
        text += f" + {human_bytes(int(sympy.ceiling(const)))}"
    return "~" + text + (" (+ smaller terms)" if dropped else "")


def _cell(number: int | None, expr: str | None, doc: dict, code: bool = False) -> str:
    """A byte figure for a table cell or line: the number when there is one, else the expression (by its leading
    terms when long, :func:`_expr_text`)."""
    return human_bytes(number) if number is not None else _expr_text(expr, doc, code)


def short_expression(expr: str, doc: dict) -> str | None:
    """:func:`leading_terms` of a byte expression longer than LONG_EXPRESSION_CHARS; None when it is short, or
    when the leading terms cannot be taken (no polynomial once floors are dropped: ``Max``, ``Mod``), so that the
    caller shows it exact. ``doc``: a report dict, or any dict with its ``symbols``."""
    if len(expr) <= LONG_EXPRESSION_CHARS:
        return None
    import sympy

    try:
        return leading_terms(expr, doc)
    except (sympy.PolynomialError, TypeError, ValueError, KeyError):  # ExpressionError is a ValueError
        return None


def _expr_text(expr: str | None, doc: dict, code: bool) -> str:
    """An expression for the headline: :func:`short_expression` where it gives one, else exact."""
    text = short_expression(expr, doc) if expr is not None else None
    if text is None:
        return bytes_text(None, expr, code)
    return escape.markdown_code(text) if code else text


def to_json(report: Report) -> str:
    """The report as JSON (sorted keys, 2-space indent, trailing newline): stable for diffs in CI."""
    return json.dumps(report.to_dict(), indent=2, sort_keys=True) + "\n"


def _sort_value(row: dict, key: str) -> float:
    """Rows largest first: by the number, else by the expression with every symbol at 64 (a mid-size dim)."""
    if row.get(key) is not None:
        return float(row[key])
    text = row.get(f"{key}_expr")
    if text is None:
        return 0.0
    try:
        expr = expressions.parse(text)
        return float(expr.xreplace({s: 64 for s in expr.free_symbols}))
    except (TypeError, ValueError):  # ExpressionError is a ValueError
        return 0.0


def _top(rows: list[dict], key: str, show_all: bool) -> tuple[list[dict], int]:
    ordered = sorted(rows, key=lambda r: -_sort_value(r, key))
    if show_all or len(ordered) <= DEFAULT_TOP_ROWS:
        return ordered, 0
    return ordered[:DEFAULT_TOP_ROWS], len(ordered) - DEFAULT_TOP_ROWS


def _chain(nodes: list[dict]) -> str:
    return " -> ".join(n["op"] for n in nodes)


def _verification_line(doc: dict) -> str:
    v = doc["verification"]
    if v.get("reason") == REPORT_DOES_NOT_VERIFY:
        return "verification: not run (onnxfuse report only analyses; onnxfuse optimize verifies what it writes)"
    detail = v.get("summary") or v.get("reason")
    if not detail and v.get("max_abs_error") is not None:
        detail = f"max abs error {v['max_abs_error']:.3g}, max rel error {v['max_rel_error']:.3g}"
    if v["status"] in ("passed", "failed") and v.get("input_shapes"):  # what was run: sizes may be generated
        shapes = _shapes_text({"input_shapes": v["input_shapes"]})
        detail = f"{detail}; inputs {shapes}" if detail else f"inputs {shapes}"
    return f"verification: {v['status']}" + (f" ({detail})" if detail else "")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _shapes_text(doc: dict) -> str:
    """``x=1x3x640x640, sr=scalar``: a scalar input has no dims to join."""
    return ", ".join(f"{k}={'x'.join(map(str, v)) or 'scalar'}" for k, v in doc["input_shapes"].items())


def _kinds(doc: dict) -> str:
    """``11 FusedConv, 31 folds``, with ``1 FusedGemm`` where there is one (a fold keeps the op it folded into)."""
    conv = sum(1 for f in doc["fusions"] if f["op"] == "FusedConv")
    gemm = sum(1 for f in doc["fusions"] if f["op"] == "FusedGemm")
    folds = _plural(len(doc["fusions"]) - conv - gemm, "fold")
    return f"{conv} FusedConv, " + (f"{gemm} FusedGemm, " if gemm else "") + folds


def _fused_count(doc: dict) -> str:
    return f"{_plural(len(doc['fusions']), 'fused node')} ({_kinds(doc)})"


def headline(doc: dict, code: bool = False, hints: bool = True, plain=str) -> list[str]:
    """The traffic lines of the summary, each saying what it is measured against: first what onnxfuse saves beyond
    what onnxruntime already runs (:func:`runtime_line`), then against the graph as exported, at the input shapes
    used, else (symbolic dims without values) at batch 1 when that is the only symbolic dim, else at the stated
    representative sizes (:func:`representative_values`) with the expressions beside, else as expressions alone;
    one percentage, at the sizes it names. Unknown figures say "unknown" and why. ``code``: expressions in Markdown
    code spans. ``hints``: also the line that says which ``--input-shape`` would give the figures at one's own
    sizes. Long expressions are shown by their leading terms (:func:`leading_terms`); the JSON report has them
    exact. ``plain``: applied to the text taken from the model (input names, reasons), e.g.
    :func:`onnxfuse.report.escape.markdown`."""
    t = doc["totals"]
    before, after = t["before"], t["after"]
    unknown_fusions = [f for f in doc["fusions"] if f["saved_bytes_expr"] is None]
    lines = [line] if (line := runtime_line(doc, code, plain)) else []
    at = None
    if t["saved_bytes"] is not None and before["total_bytes"] is not None:
        label = f" at {plain(_shapes_text(doc))}" if doc["input_shapes"] else ""
        at = (f"vs the graph as exported{label}", before["total_bytes"], after["total_bytes"], t["saved_bytes"])
    elif t["at_batch_1"] and t["at_batch_1"]["saved_bytes"] is not None:
        b = t["at_batch_1"]
        at = (f"vs the graph as exported, at batch 1 ({plain(b['symbol'])} is the only symbolic dim)",
              b["before_total_bytes"], b["after_total_bytes"], b["saved_bytes"])
    elif doc["symbols"] and not doc["symbol_values"]:
        values = representative_values(doc)
        numbers = [at_values(x, values) for x in (before["total_bytes_expr"], after["total_bytes_expr"])]
        if None not in numbers:
            names = _display_names(doc)
            sizes = ", ".join(f"{plain(names.get(k, k))}={v}" for k, v in values.items())
            at = (f"vs the graph as exported, at representative sizes {sizes}", numbers[0], numbers[1],
                  numbers[0] - numbers[1])
    if doc["fusions"] and len(unknown_fusions) == len(doc["fusions"]):
        lines.append(f"saved vs the graph as exported: unknown ({plain(unknown_fusions[0]['unknown_reason'])})")
    elif at is not None:
        pct = f", {_percent(at[3], at[1]):.1f}%" if at[1] else ""
        lines.append(f"{at[0]}: {human_bytes(at[1])} -> {human_bytes(at[2])} (saved {human_bytes(at[3])}{pct})")
    if doc["symbols"] and not doc["symbol_values"]:
        lines.append(f"as expressions in the input dims: {_expr_text(before['total_bytes_expr'], doc, code)} -> "
                     f"{_expr_text(after['total_bytes_expr'], doc, code)} (saved "
                     f"{_expr_text(t['saved_bytes_expr'], doc, code)})")
        if hints:
            lines.append(plain(_hint(doc)))
    if unknown_fusions and len(unknown_fusions) < len(doc["fusions"]):
        lines.append(f"{_plural(len(unknown_fusions), 'fusion')} of unknown size not counted in the saving "
                     f"({plain(unknown_fusions[0]['unknown_reason'])})")
    if before["unknown_nodes"] or after["unknown_nodes"]:
        first = doc["unknown_nodes"][0]["reason"] if doc["unknown_nodes"] else ""
        lines.append(f"unknown: {before['unknown_nodes']} of {before['nodes']} nodes before and "
                     f"{after['unknown_nodes']} of {after['nodes']} after are left out of these totals "
                     f"({plain(first)})")
    if (line := deployment_line(doc)) is not None:
        lines.append(line)
    if (line := file_line(doc)) is not None:
        lines.append(line)
    if (line := profile_line(doc, plain)) is not None:
        lines.append(line)
    return lines


def file_line(doc: dict) -> str | None:
    """``model file: 11.1 MiB -> 11.1 MiB``: the input file (with its external data) and the optimized model's
    serialized size (weights computed from compact constants, int8 x scale and the like, stay compact unless
    ``--materialize-weights`` allows floats); None when a size is unknown."""
    m = doc["model"]
    after = m.get("optimized_bytes")
    if after is None or not m.get("file_bytes"):
        return None
    return f"model file: {human_bytes(m['file_bytes'])} -> {human_bytes(after)}"


def profile_line(doc: dict, plain=str) -> str | None:
    """``measured by onnxruntime's profiler at level all: 400 -> 238 kernels, 812 ms -> 655 ms, 1.9 GiB -> 1.2 GiB
    read and written (at x=1x3x640x640)``; None without a ``profile`` section (``report --profile``)."""
    p = doc.get("profile")
    if not p:
        return None
    o, a = p["original"], p["optimized"]
    shapes = ", ".join(f"{plain(k)}={'x'.join(map(str, v)) or 'scalar'}" for k, v in p["input_shapes"].items())
    return (f"measured by onnxruntime's profiler at level {p['level']}, {p['threads']} thread(s), median of "
            f"{p['runs']} runs: {o['kernels']} -> {a['kernels']} kernels, {o['total_ms']:.3f} ms -> "
            f"{a['total_ms']:.3f} ms, {human_bytes(o['total_bytes'])} -> {human_bytes(a['total_bytes'])} read and "
            f"written (at {shapes})")


def representative_values(doc: dict) -> dict[str, int]:
    """Symbol -> :data:`REPRESENTATIVE_BATCH` for a dim on axis 0 of an input, else :data:`REPRESENTATIVE_SIZE`,
    for the symbols of a report dict."""
    return {name: REPRESENTATIVE_BATCH if where["axis"] == 0 else REPRESENTATIVE_SIZE
            for name, where in doc["symbols"].items()}


def at_values(expr: str | None, values: dict[str, int]) -> int | None:
    """A report's byte expression evaluated at ``values`` (symbol name -> size), read without eval
    (:func:`onnxfuse.analysis.expressions.parse`); None when it is None, not in the grammar or not a number there."""
    if expr is None:
        return None
    import sympy

    try:
        value = sympy.sympify(expressions.parse(expr).xreplace(
            {make_symbol(k): sympy.Integer(v) for k, v in values.items()}))
    except (ValueError, TypeError):
        return None
    return int(value) if value.is_number else None


def runtime_line(doc: dict, code: bool = False, plain=str) -> str | None:
    """The summary's first line: what onnxfuse saves beyond what onnxruntime already makes of the original at
    load (the report's ``onnxruntime`` section), or None when nothing was fused or nothing was compared.
    ``plain``: applied to text taken from the model or onnxruntime's messages (as in :func:`headline`)."""
    rt = doc.get("onnxruntime")
    if not rt or not doc["fusions"]:
        return None
    head = f"vs onnxruntime {rt['installed']} (installed, CPU provider) at level {rt['level']}"
    if rt["status"] != "compared":
        return f"{head}: not compared ({plain(rt['reason'])})"
    made, total = rt["fusions_made_by_onnxruntime"], rt["fusions"]
    kernels = f"{rt['kernels_before']} -> {rt['kernels_after']} kernels"
    if made == total and rt["kernels_after"] >= rt["kernels_before"]:
        return (f"{head}: onnxruntime makes all {total} of these fusions itself when it loads the original "
                f"({kernels}); nothing is saved beyond it")
    at = ""
    representative = (at_values(rt["saved_bytes_beyond_expr"], representative_values(doc))
                      if rt["saved_bytes_beyond"] is None and doc["symbols"] and not doc["symbol_values"] else None)
    if rt["saved_bytes_beyond"] is not None:
        saved = human_bytes(rt["saved_bytes_beyond"])
        at = f" at {plain(_shapes_text(doc))}" if doc["input_shapes"] else ""
    elif representative is not None:
        saved, at = human_bytes(representative), " at representative sizes"
    elif rt["saved_bytes_beyond_expr"] is not None:
        saved = _expr_text(rt["saved_bytes_beyond_expr"], doc, code)
    else:
        saved = "an unknown number of bytes"
    return (f"{head}: {total - made} of {total} fusions go beyond what onnxruntime makes itself at load "
            f"({kernels}), saving {saved}{at}")


def _hint(doc: dict) -> str:
    names = _display_names(doc)

    def symbol(k: str, where: dict) -> str:
        dim = f"{where['input']}[{where['axis']}]"
        return dim if names.get(k, k) == dim else f"{names.get(k, k)} = {dim}"

    return ("give --input-shape for the figures at your input sizes (symbols: "
            + ", ".join(symbol(k, v) for k, v in doc["symbols"].items()) + ")")


def unknown_shapes_hint(report: Report) -> str | None:
    """``give --input-shape for the figures at one input size (symbols: N_ = x[0], ...)`` when the report has
    symbols, no value for them and no figures at batch 1; else None. Names escaped for a terminal
    (:func:`onnxfuse.report.escape.text`)."""
    doc = escape.escaped(report.to_dict())
    t = doc["totals"]
    if not doc["symbols"] or t["saved_bytes"] is not None or (t["at_batch_1"] and
                                                             t["at_batch_1"]["saved_bytes"] is not None):
        return None
    return _hint(doc)


def summary_lines(report: Report, hints: bool = True) -> list[str]:
    """The short summary ``optimize`` prints: traffic, fusion count, unfused count, for a QDQ model what
    onnxruntime does with its quantized patterns, verification, bandwidth, and (when ``hints``)
    :func:`unknown_shapes_hint`. Names escaped for a terminal (:func:`onnxfuse.report.escape.text`)."""
    doc = escape.escaped(report.to_dict())
    lines = [*headline(doc, hints=hints),
             f"fusions: {_fused_count(doc)}; {_plural(len(doc['unfused']), 'pattern')} left unfused "
             f"(target {doc['target']})"]
    if doc["unfused"]:
        lines.append(unfused_line(doc))
    quantized = sum(u["reason"] == "quantized-conv" for u in doc["unfused"])
    if quantized:  # a QDQ model: onnxfuse leaves its Conv/Gemm/MatMul groups to onnxruntime (passes/conv_unfused.py)
        lines.append(f"quantized: {_plural(quantized, 'pattern')} inside QuantizeLinear/DequantizeLinear pairs "
                     "left as they are; onnxruntime turns them into quantized kernels (QLinearConv, QGemm, "
                     "QLinearMatMul) at load, at level extended and above (core/optimizer/qdq_transformer)")
    lines.append(_verification_line(doc))
    if doc["bandwidth"]:
        lines.append(_bandwidth_line(doc["bandwidth"]))
    return lines


def unfused_groups(doc: dict) -> list[tuple[str, int, str]]:
    """The unfused patterns of a report dict grouped by reason: ``(reason, count, what would fuse them)``, most
    frequent first (``onnxfuse.report.remedies.remedy``; for a target-dependent reason, the first pattern's)."""
    from onnxfuse.report.remedies import remedy

    counts: dict[str, int] = {}
    first: dict[str, dict] = {}
    for row in doc["unfused"]:
        counts[row["reason"]] = counts.get(row["reason"], 0) + 1
        first.setdefault(row["reason"], row)
    order = sorted(counts, key=lambda r: (-counts[r], r))
    return [(r, counts[r], remedy(first[r], doc["target"])) for r in order]


def unfused_line(doc: dict) -> str:
    """``left unfused: 45 dtype-has-no-fusedconv-kernel (no target: ...); 1 ...``: one line, each reason with its
    count and what would fuse those patterns, in the words of ``onnxfuse/report/remedies.py``."""
    return "left unfused: " + "; ".join(f"{n} {reason} (what would fuse {'it' if n == 1 else 'them'}: {fix})"
                                        for reason, n, fix in unfused_groups(doc))


def grouped_unfused(rows: list[dict]) -> list[dict]:
    """Unfused rows with the same chain of ops and reason merged into one: ``count``, the first row's nodes and
    detail, ``bytes`` summed when every one is known (``bytes_expr`` summed likewise). Order: first appearance."""
    groups: dict[tuple, dict] = {}
    for r in rows:
        key = (tuple(n["op"] for n in r["nodes"]), r["reason"])
        g = groups.get(key)
        if g is None:
            groups[key] = {**r, "count": 1, "_exprs": [r["bytes_expr"]]}
            continue
        g["count"] += 1
        g["bytes"] = None if g["bytes"] is None or r["bytes"] is None else g["bytes"] + r["bytes"]
        g["_exprs"].append(r["bytes_expr"])
    out = []
    for g in groups.values():
        exprs = g.pop("_exprs")
        if g["count"] > 1:
            g["bytes_expr"] = None if None in exprs else _sum_expressions(exprs)
        out.append(g)
    return out


def _sum_expressions(exprs: list[str]) -> str:
    """The sum of byte expressions (report strings), printed as the report prints them."""
    total = add([expressions.parse(e) for e in exprs])
    return printer()(total)


def _bandwidth_line(b: dict) -> str:
    if b["at"] is None:
        return (f"estimated memory time at {b['gb_per_s']:g} GB/s: unknown (no input size: give --input-shape)")
    at = "" if b["at"] == "input shapes" else f", at {b['at']}"
    return (f"estimated memory time at {b['gb_per_s']:g} GB/s of the graph as exported and of the optimized one "
            f"(bytes / bandwidth, an estimate{at}; onnxruntime's own fusions at load are not in it): "
            f"{human_time(b['before_ms'])} -> {human_time(b['after_ms'])}")


def _unfused_label(row: dict, name, ops) -> str:
    """``conv1: Conv -> Relu``, or ``45 x Conv -> Relu (first conv1)`` for a group of :func:`grouped_unfused`;
    ``name`` and ``ops`` format the node name and the chain (code span and escaping in Markdown)."""
    first, chain = name(_label(row["nodes"][0])), ops(_chain(row["nodes"]))
    if row.get("count", 1) > 1:
        return f"{row['count']} x {chain} (first {first})"
    return f"{first}: {chain}"


def _label(node: dict) -> str:
    """A node's name, or its output tensor's name when the model left the node unnamed."""
    return node["name"] or node["output"]


def _shape_text(row: dict, doc: dict | None = None) -> str:
    """``1x8x32x32 float32``; a symbolic shape as ``[N_, 8, H, W]`` (an ``x`` between expressions would read as a
    product), a long dim by its leading terms (``~H/4``, :func:`_short_dim`; the JSON has it exact)."""
    dims = row["shape"] or ["?"]
    if all(isinstance(d, int) for d in dims):
        text = "x".join(map(str, dims))
    else:
        names = _display_names(doc) if doc else {}
        text = f"[{', '.join(_short_dim(d, names) for d in dims)}]"
    return f"{text} {row['dtype'] or '?'}"


def _short_dim(dim, names: dict[str, str]) -> str:
    """A dim for a table cell, its symbols by their display names (``names``, :func:`_display_names`): as it is
    when short, else ``~`` and its highest-degree terms once floors and ceilings are dropped
    (``floor(floor(H/2 - 1/2)/2) + 1`` -> ``~H/4``), or its first characters when it is no polynomial."""
    text = str(dim)
    if dim is None or isinstance(dim, int):
        return "?" if dim is None else text
    import sympy

    try:
        e = expressions.parse(text)
        e = e.xreplace({s: sympy.Symbol(names.get(s.name, s.name)) for s in e.free_symbols})
        if len(str(e)) <= 16:
            return str(e)
        e = sympy.expand(e.replace(sympy.floor, lambda a: a).replace(sympy.ceiling, lambda a: a))
        poly = sympy.Poly(e, *sorted(e.free_symbols, key=str))
        top = poly.total_degree()
        lead = sum((c * sympy.prod(s**k for s, k in zip(poly.gens, m)) for m, c in poly.terms() if sum(m) == top),
                   sympy.Integer(0))
        return "~" + str(lead)
    except (ValueError, TypeError, sympy.PolynomialError):
        return text[:13] + "..."


def to_text(report: Report, show_all: bool = False, width: int = 110) -> str:
    """Terminal tables (rich, no colour codes), ``width`` columns wide, the largest rows first. Every string from
    the model is escaped (:func:`onnxfuse.report.escape.text`) and rich reads no markup (``[red]`` in a name is
    text)."""
    from rich import box  # imported here: only the text format needs it, and it costs start-up time
    from rich.console import Console
    from rich.table import Table
    doc = escape.escaped(report.to_dict())
    buf = io.StringIO()
    console = Console(file=buf, width=width, color_system=None, force_terminal=False, highlight=False, markup=False,
                      emoji=False)
    m = doc["model"]
    console.print(f"onnxfuse {doc['onnxfuse_version']} memory-traffic report")
    console.print(f"model: {m['path']}  sha256 {m['sha256'][:16]}...  {human_bytes(m['file_bytes'])}")
    console.print(f"target: {doc['target']}   input shapes: {_shapes_text(doc) or 'from the model'}")
    for line in summary_lines(report) + [f"warning: {w}" for w in doc["warnings"]]:
        console.print(line)
    if doc["subgraph_nodes"]:
        console.print(f"note: {doc['subgraph_nodes']} nodes inside If/Loop/Scan bodies are counted once each")

    def table(title: str, columns: list[tuple[str, dict]]) -> Table:
        t = Table(title=title, box=box.SIMPLE, title_justify="left", pad_edge=False)
        for name, opts in columns:
            t.add_column(name, **opts)
        return t

    right, fold = {"justify": "right", "overflow": "fold"}, {"overflow": "fold"}
    t = doc["totals"]
    tab = table("Totals (bytes moved to and from device memory)",
                [("", {}), ("read", right), ("written", right), ("total", right), ("nodes", right),
                 ("unknown nodes", right)])
    for side in ("before", "after"):
        s = t[side]
        tab.add_row(side, _cell(s["read_bytes"], s["read_bytes_expr"], doc),
                    _cell(s["written_bytes"], s["written_bytes_expr"], doc),
                    _cell(s["total_bytes"], s["total_bytes_expr"], doc), str(s["nodes"]), str(s["unknown_nodes"]))
    pct = f" ({t['saved_percent']:.1f}%)" if t["saved_percent"] is not None else ""
    tab.add_row("saved", "", "", _cell(t["saved_bytes"], t["saved_bytes_expr"], doc) + pct, "", "")
    console.print()
    console.print(tab)
    if doc["fusions"]:
        rows, hidden = _top(doc["fusions"], "saved_bytes", show_all)
        tab = table(f"Fusions applied ({len(doc['fusions'])}: {_kinds(doc)})",
                    [("node", fold), ("replaced", fold), ("activation", {"no_wrap": True}), ("output", fold),
                     ("saved", right)])
        for r in rows:
            tab.add_row(r["node"], _chain(r["replaced"]), r["activation"] or "", _shape_text(r, doc),
                        _cell(r["saved_bytes"], r["saved_bytes_expr"], doc))
        console.print(tab)
        if hidden:
            console.print(f"... {hidden} more fusions (use --all to show every row)")
    if doc["unfused"]:
        rows, hidden = _top(grouped_unfused(doc["unfused"]), "bytes", show_all)
        tab = table(f"Left unfused ({len(doc['unfused'])})",
                    [("nodes", fold), ("reason", {"no_wrap": True}), ("detail", fold), ("would save", right)])
        for r in rows:
            tab.add_row(_unfused_label(r, str, str), r["reason"], r["detail"], _cell(r["bytes"], r["bytes_expr"], doc))
        console.print()
        console.print(tab)
        if hidden:
            console.print(f"... {hidden} more patterns (use --all to show every row)")
    if doc["unknown_nodes"]:
        rows = doc["unknown_nodes"] if show_all else doc["unknown_nodes"][:DEFAULT_TOP_ROWS]
        tab = table(f"Nodes of unknown size ({len(doc['unknown_nodes'])}, left out of the totals)",
                    [("node", fold), ("op", {}), ("why", fold)])
        for r in rows:
            tab.add_row(r["node"] or r["output"], r["op"], r["reason"])
        console.print()
        console.print(tab)
        if len(rows) < len(doc["unknown_nodes"]):
            console.print(f"... {len(doc['unknown_nodes']) - len(rows)} more (use --all to show every row)")
    if doc["symbols"]:
        tab = table("Symbols (the model's symbolic input dims)", [("symbol", {}), ("input", fold), ("axis", right),
                                                                   ("model's dim name", fold), ("value", right)])
        for name, where in doc["symbols"].items():
            value = doc["symbol_values"].get(name)
            tab.add_row(name, where["input"], str(where["axis"]), where["dim_param"] or "(unnamed)",
                        "" if value is None else str(value))
        console.print()
        console.print(tab)
    tab = table("Passes", [("pass", {}), ("rewrites", right), ("nodes removed", right), ("skipped by reason", fold)])
    for s in doc["pass_stats"]:
        removed = "" if "removed_nodes" not in s else str(s["removed_nodes"]) if not s["removed_nodes"] else \
            f"{s['removed_nodes']} ({bytes_text(s['removed_bytes'], s['removed_bytes_expr'])})"
        tab.add_row(s["name"], str(s["applied"]), removed,
                    ", ".join(f"{k} {v}" for k, v in s["skipped"].items()) or "-")
    console.print()
    console.print(tab)
    ops = doc["op_counts"]
    tab = table("Nodes by op type", [("op", {}), ("before", right), ("after", right)])
    for op in sorted(set(ops["before"]) | set(ops["after"])):
        tab.add_row(op, str(ops["before"].get(op, 0)), str(ops["after"].get(op, 0)))
    console.print()
    console.print(tab)
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n"


def _md_row(cells: list) -> str:
    """A Markdown table row: a backslash before each ``|`` that has none (one :func:`onnxfuse.report.escape.markdown`
    escaped already stays as it is), so that no cell is split."""
    return "| " + " | ".join(re.sub(r"\\.|\|", lambda m: "\\|" if m.group(0) == "|" else m.group(0), str(c))
                             for c in cells) + " |"


def to_markdown(report: Report, show_all: bool = False) -> str:
    """GitHub-flavoured Markdown for a pull-request comment or a CI job summary. Text from the model is escaped
    (:func:`onnxfuse.report.escape.markdown`, :func:`onnxfuse.report.escape.markdown_code`): no name adds a line,
    splits a table
    cell or reads as formatting or HTML."""
    md, code = escape.markdown, escape.markdown_code
    doc = report.to_dict()
    t = doc["totals"]
    m = doc["model"]
    out = [f"### onnxfuse memory-traffic report: {code(m['path'])}", "",
           f"onnxfuse {doc['onnxfuse_version']} · target `{doc['target']}` · sha256 `{m['sha256'][:16]}` · "
           + md(_verification_line(doc)), ""]
    out += [f"> **Warning:** {md(w)}" for w in doc["warnings"]] + ([""] if doc["warnings"] else [])
    lines = headline(doc, code=True, plain=md)
    if lines:
        out += [lines[0], ""] + [f"- {line}" for line in lines[1:]] + ([""] if lines[1:] else [])
    out += [_md_row(["", "read", "written", "total", "nodes", "unknown nodes"]), _md_row(["---"] * 6)]
    for side in ("before", "after"):
        s = t[side]
        out.append(_md_row([side, _cell(s["read_bytes"], s["read_bytes_expr"], doc, True),
                            _cell(s["written_bytes"], s["written_bytes_expr"], doc, True),
                            _cell(s["total_bytes"], s["total_bytes_expr"], doc, True), s["nodes"], s["unknown_nodes"]]))
    pct = f" ({t['saved_percent']:.1f}%)" if t["saved_percent"] is not None else ""
    out += ["", f"Saved {_cell(t['saved_bytes'], t['saved_bytes_expr'], doc, True)}{pct} of memory traffic against "
                f"the graph as exported (the first line above says what is saved beyond onnxruntime) with "
                f"{_fused_count(doc)}; {_plural(len(doc['unfused']), 'pattern')} left unfused.", ""]
    if doc["bandwidth"]:
        out += [_bandwidth_line(doc["bandwidth"]), ""]
    if doc["fusions"]:
        rows, hidden = _top(doc["fusions"], "saved_bytes", show_all)
        out += [f"#### Fusions applied ({len(doc['fusions'])}: {_kinds(doc)})", "",
                _md_row(["node", "replaced", "activation", "saved", "onnxruntime makes it too"]), _md_row(["---"] * 5)]
        out += [_md_row([code(r["node"]), md(_chain(r["replaced"])), md(r["activation"] or ""),
                         _cell(r["saved_bytes"], r["saved_bytes_expr"], doc, True),
                         {True: "yes", False: "no"}.get(r.get("made_by_onnxruntime"), "")]) for r in rows]
        if hidden:
            out.append(f"\n_{hidden} more rows not shown (onnxfuse report --all shows every row; JSON and HTML always "
                       "do)._")
        out.append("")
    if doc["unfused"]:
        rows, hidden = _top(grouped_unfused(doc["unfused"]), "bytes", show_all)
        out += [f"#### Left unfused ({len(doc['unfused'])})", "",
                _md_row(["nodes", "reason", "detail", "would save"]), _md_row(["---"] * 4)]
        out += [_md_row([_unfused_label(r, code, md), code(r["reason"]), md(r["detail"]),
                         _cell(r["bytes"], r["bytes_expr"], doc, True)]) for r in rows]
        if hidden:
            out.append(f"\n_{hidden} more rows not shown (onnxfuse report --all shows every row; JSON and HTML always "
                       "do)._")
        out.append("")
    if doc["unknown_nodes"]:
        out += [f"#### Nodes of unknown size ({len(doc['unknown_nodes'])}, left out of the totals)", "",
                _md_row(["node", "op", "why"]), _md_row(["---"] * 3)]
        rows = doc["unknown_nodes"] if show_all else doc["unknown_nodes"][:DEFAULT_TOP_ROWS]
        out += [_md_row([code(r["node"] or r["output"]), md(r["op"]), md(r["reason"])]) for r in rows]
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def render(report: Report, fmt: str, show_all: bool = False, width: int = 120) -> str:
    """Render ``report`` as ``fmt`` (``text``, ``json``, ``markdown`` or ``html``; HTML always has every row).

    Raises:
        ValueError: unknown format.
    """
    if fmt == "json":
        return to_json(report)
    if fmt == "markdown":
        return to_markdown(report, show_all)
    if fmt == "text":
        return to_text(report, show_all, width)
    if fmt == "html":
        from onnxfuse.report.html import to_html  # imported here: only the html format needs plotly

        return to_html(report.to_dict())
    raise ValueError(f"unknown report format {fmt!r}")


def format_for_path(path: str) -> str | None:
    """Report format implied by a file extension (:data:`REPORT_EXTENSIONS`), or None."""
    lower = path.lower()
    for ext, fmt in REPORT_EXTENSIONS.items():
        if lower.endswith(ext):
            return fmt
    return None
