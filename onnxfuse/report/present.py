"""What every report format shows, decided once: the byte rules (:func:`human_bytes`, :func:`bytes_text`,
:func:`leading_terms`: KiB/MiB/GiB in powers of 1024, long expressions by their leading terms), the cells and
sentences (:func:`headline`, :func:`summary_lines`, the verification, bandwidth, deployment and profile lines),
the grouping of unfused patterns and their remedies, the representative sizes a symbolic report is shown at, the
layers of the HTML chart, and :func:`document`: the one :class:`~onnxfuse.report.document.Document` (header,
headline, sections, rows, notes, chart) that the renderers (``report.text``, ``report.markdown``,
``report.html``) draw and that is all they read. It reads the report's dict (``Report.to_dict()``,
``report.schema.json``) only: it imports neither the data module (``report.model``) nor any renderer. Never
prints.
"""

from __future__ import annotations

import functools
import json
import re

from onnxfuse.analysis import expressions
from onnxfuse.analysis.shapes import REPRESENTATIVE_BATCH, REPRESENTATIVE_SIZE
from onnxfuse.analysis.symbolic import make_symbol, printer
from onnxfuse.analysis.traffic import add
from onnxfuse.ort.providers import TARGETS
from onnxfuse.records import Reason
from onnxfuse.report import escape
from onnxfuse.report.document import (
    Bars,
    Bytes,
    Cell,
    Chart,
    Code,
    Column,
    Document,
    Field,
    Layer,
    Name,
    Note,
    Num,
    Prose,
    Section,
    Sentence,
    Span,
    Status,
    TotalsBar,
)
from onnxfuse.report.remedies import remedy
from onnxfuse.report.schema import REPORT_DOES_NOT_VERIFY, Doc, SupportsToDict

# ---------------------------------------------------------------------------------------------------------------
# Byte figures


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


def percent(part: int | None, whole: int | None) -> float | None:
    """``part`` as a percentage of ``whole`` (bytes), to 2 decimals; None when either is unknown or whole is 0."""
    if part is None or not whole:
        return None
    return round(100.0 * part / whole, 2)


def bytes_text(number: int | None, expr: str | None, code=False) -> str:
    """A byte figure for people: the number when there is one (KiB/MiB...), else the expression in bytes (in a
    Markdown code span when ``code``: its ``*`` would start emphasis), else "unknown"."""
    if number is not None:
        return human_bytes(number)
    if expr is None:
        return "unknown"
    try:
        return human_bytes(int(expr))
    except ValueError:
        return f"{_code_fn(code)(expr)} B" if code else f"{expr} B"


#: Expressions longer than this are shown to people by their leading terms (:func:`leading_terms`).
LONG_EXPRESSION_CHARS = 60


def display_names(doc: Doc) -> dict[str, str]:
    """Symbol -> how people read it: the model's own dim name when it is short and plain (``N``, ``height``),
    else ``input[axis]`` (``x[2]`` instead of ``p2o_DynamicDimension_1``)."""
    names = {}
    for sym, where in doc.get("symbols", {}).items():
        dim = where.get("dim_param") or ""
        names[sym] = dim if dim.isidentifier() and len(dim) <= 12 else f"{where['input']}[{where['axis']}]"
    return names


def leading_terms(expr: str, doc: Doc) -> str:
    """A byte expression as people read it: floor/ceiling dropped (``floor((H - 1)/2) + 1`` ~ ``H/2``), expanded,
    only the terms of the highest degree in the symbols kept plus the constant term (weights), coefficients to 4
    significant digits, the constant in KiB/MiB; symbols by :func:`display_names`. An approximation for large
    inputs, prefixed "~"; the exact expression stays in the JSON report."""
    import sympy

    values = {name: make_symbol(name) for name in doc.get("symbols", {})}
    e = expressions.parse(expr, values)
    e = sympy.expand(e.replace(sympy.floor, lambda a: a).replace(sympy.ceiling, lambda a: a))
    poly = sympy.Poly(e, *values.values()) if values else None
    if poly is None or not poly.free_symbols:
        return human_bytes(int(sympy.ceiling(e)))
    top = poly.total_degree()
    names = display_names(doc)
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


def short_expression(expr: str, doc: Doc) -> str | None:
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


def named(expr: str, doc: Doc) -> str:
    """An exact byte expression with its symbols by their :func:`display_names` (``4864*N`` for the report's
    ``4864*N_``, ``x[2]`` for ``p2o_DynamicDimension_1``), so that a dim has one name in every view; ``expr`` as
    written when it is not in the grammar or has no symbol of ``doc``."""
    names = {sym: name for sym, name in display_names(doc).items() if sym != name and sym in expr}
    if not names:
        return expr
    import sympy

    try:
        e = expressions.parse(expr)
    except (ValueError, TypeError):
        return expr
    return str(e.xreplace({s: sympy.Symbol(names[s.name]) for s in e.free_symbols if s.name in names}))


def expr_text(expr: str | None, doc: Doc, code) -> str:
    """An expression for the headline: :func:`short_expression` where it gives one, else exact (symbols by their
    display names, :func:`named`)."""
    text = short_expression(expr, doc) if expr is not None else None
    if text is None:
        return bytes_text(None, named(expr, doc) if expr is not None else None, code)
    return _code_fn(code)(text) if code else text


def _code_fn(code):
    """What marks an expression as code: ``code`` itself when it is a function, else a Markdown code span."""
    return code if callable(code) else escape.markdown_code


def cell(number: int | None, expr: str | None, doc: Doc, code=False) -> str:
    """A byte figure for a table cell or line: the number when there is one, else the expression (by its leading
    terms when long, :func:`expr_text`)."""
    return human_bytes(number) if number is not None else expr_text(expr, doc, code)


def bytes_of(obj: dict | None, key: str, doc: Doc | None = None, exact: bool = False) -> str:
    """``obj[key]`` as KiB/MiB, else its ``key_expr`` (symbolic, schema 2) with a unit, else "unknown". With the
    report ``doc``, a long expression is given by its leading terms (:func:`leading_terms`), as the text
    report does; with ``exact``, the whole expression (its symbols by their display names all the same)."""
    value = None if obj is None else obj.get(key)
    if value is not None:
        return human_bytes(value)
    expr = None if obj is None else obj.get(f"{key}_expr")
    if expr and expr.lstrip("-").isdigit():  # an expression without symbols is a number
        return human_bytes(int(expr))
    if expr and doc is not None and len(expr) > LONG_EXPRESSION_CHARS and not exact:
        return _leading(expr, json.dumps(doc.get("symbols") or {}, sort_keys=True))
    if expr and doc is not None:
        expr = named(expr, doc)
    return f"{expr} B" if expr else "unknown"


@functools.lru_cache(maxsize=4096)
def _leading(expr: str, symbols_json: str) -> str:
    return leading_terms(expr, {"symbols": json.loads(symbols_json)})


def node_total(row: dict | None) -> tuple[int | None, str | None]:
    """(read + written bytes or None, symbolic expression or None) of a ``nodes.before/after`` row."""
    if row is None:
        return None, None
    r, w = row.get("read_bytes"), row.get("written_bytes")
    if r is not None and w is not None:
        return r + w, None
    expr = row.get("total_bytes_expr")
    if expr is None and row.get("read_bytes_expr") and row.get("written_bytes_expr"):
        expr = _add_exprs(row["read_bytes_expr"], row["written_bytes_expr"])
    return None, expr


def _add_exprs(a: str, b: str) -> str:
    """The sum of two byte expressions (read without eval, :func:`onnxfuse.analysis.expressions.parse`), else as
    written."""
    try:
        return str(expressions.parse(a) + expressions.parse(b))
    except ValueError:
        return f"{a} + {b}"


def _sum_expressions(exprs: list[str]) -> str:
    """The sum of byte expressions (report strings), printed as the report prints them."""
    total = add([expressions.parse(e) for e in exprs])
    return printer()(total)


def representative_values(doc: Doc) -> dict[str, int]:
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


# ---------------------------------------------------------------------------------------------------------------
# Names, chains and shapes


def label(node: dict) -> str:
    """A node's name, or its output tensor's name when the model left the node unnamed."""
    return node["name"] or node["output"]


def chain(nodes: list[dict], arrow: str = " -> ") -> str:
    """The ops of ``nodes`` joined by ``arrow``: ``Conv -> BatchNormalization -> Relu``."""
    return arrow.join(n["op"] for n in nodes)


def plural(n: int, word: str) -> str:
    """``1 fusion``, ``2 fusions``: ``n`` and ``word``, with an ``s`` unless ``n`` is 1."""
    return f"{n} {word}" + ("" if n == 1 else "s")


def shapes_text(doc: Doc) -> str:
    """``x=1x3x640x640, sr=scalar``: a scalar input has no dims to join."""
    return ", ".join(f"{k}={'x'.join(map(str, v)) or 'scalar'}" for k, v in doc["input_shapes"].items())


def fusion_kind(row: dict) -> str:
    """A ``fusions`` row's kind, ``fold`` or ``fuse`` (its ``kind``, schema 3; for a schema-2 row, which lacks it:
    ``fuse`` for a FusedConv or FusedGemm, else ``fold``)."""
    return row.get("kind") or ("fuse" if row["op"] in ("FusedConv", "FusedGemm") else "fold")


def kinds(doc: Doc) -> str:
    """``11 FusedConv, 31 folds``, with ``1 FusedGemm`` and ``2 fused Gemm`` (MatMul + Add into Gemm) where there
    are such (each row by :func:`fusion_kind`; a fold keeps the op it folded into), and ``; 3 folds inside the fused
    nodes`` for the folds that a later fusion of the same node took in (each row's ``folds``, schema 3): a row
    is a fusion once an activation joins it, so without them a model whose folds all end in FusedConvs (a
    layout_wrapper moving the affine and the activation before the Transpose) read "0 folds"."""
    rows = doc["fusions"]
    conv = sum(1 for f in rows if f["op"] == "FusedConv")
    gemm = sum(1 for f in rows if f["op"] == "FusedGemm")
    other: dict[str, int] = {}
    for f in rows:
        if fusion_kind(f) == "fuse" and f["op"] not in ("FusedConv", "FusedGemm"):
            other[f["op"]] = other.get(f["op"], 0) + 1
    folds = plural(sum(1 for f in rows if fusion_kind(f) == "fold"), "fold")
    # the folds a later fusion took in (conv_affine, then the activation into a FusedConv): counted, not lost
    inner = sum(f.get("folds") or 0 for f in rows if fusion_kind(f) == "fuse")
    return (f"{conv} FusedConv, " + (f"{gemm} FusedGemm, " if gemm else "")
            + "".join(f"{n} fused {op}, " for op, n in sorted(other.items())) + folds
            + (f"; {plural(inner, 'fold')} inside the fused nodes" if inner else ""))


def fused_count(doc: Doc) -> str:
    """``3 fused nodes (2 FusedConv, 1 fold)``: the report's fusions, counted by kind."""
    return f"{plural(len(doc['fusions']), 'fused node')} ({kinds(doc)})"


def passes_text(passes: list[str]) -> str:
    """``conv_affine x2, conv_hardswish``: the passes that built a node, each once with how often it applied."""
    counts: dict[str, int] = {}
    for p in passes:
        counts[p] = counts.get(p, 0) + 1
    return ", ".join(f"{p} x{n}" if n > 1 else p for p, n in counts.items())


def made_by_onnxruntime(row: dict) -> str:
    """``yes`` when onnxruntime makes this fusion itself at load (the report's level), ``no`` when it does not,
    empty when the report did not compare."""
    made = row.get("made_by_onnxruntime")
    return "" if made is None else ("yes" if made else "no")


def target_providers(doc: Doc) -> str:
    """The execution providers of the report's ``--target`` (``providers.TARGETS``), or "standard ONNX only"."""
    target = TARGETS.get(doc["target"])
    return ", ".join(target.providers) if target and target.providers else "standard ONNX only"


def unfused_label(row: dict, name, ops) -> str:
    """``conv1: Conv -> Relu``, or ``45 x Conv -> Relu (first conv1)`` for a group of :func:`grouped_unfused`;
    ``name`` and ``ops`` format the node name and the chain (code span and escaping in Markdown)."""
    first, ops_text = name(label(row["nodes"][0])), ops(chain(row["nodes"]))
    if row.get("count", 1) > 1:
        return f"{row['count']} x {ops_text} (first {first})"
    return f"{first}: {ops_text}"


def shape_text(row: dict, doc: Doc | None = None) -> str:
    """``1x8x32x32 float32``; a symbolic shape as ``[N_, 8, H, W]`` (an ``x`` between expressions would read as a
    product), a long dim by its leading terms (``~H/4``, :func:`short_dim`; the JSON has it exact)."""
    dims = row["shape"] or ["?"]
    if all(isinstance(d, int) for d in dims):
        text = "x".join(map(str, dims))
    else:
        names = display_names(doc) if doc else {}
        text = f"[{', '.join(short_dim(d, names) for d in dims)}]"
    return f"{text} {row['dtype'] or '?'}"


def short_dim(dim, names: dict[str, str]) -> str:
    """A dim for a table cell, its symbols by their display names (``names``, :func:`display_names`): as it is
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


def dim_text(dim: int | str | None, doc: Doc) -> str:
    """One output dim: its number; a symbolic one (schema 2) evaluated at ``symbol_values`` when those fix it,
    else the expression with the symbols' display names, by its leading term when long (``~x[2]/4``, as the text
    report shows it); "?" when unknown."""
    if dim is None:
        return "?"
    if isinstance(dim, int):
        return str(dim)
    if doc.get("symbol_values"):
        import sympy

        try:
            value = sympy.sympify(expressions.parse(str(dim)).xreplace(
                {make_symbol(k): sympy.Integer(v) for k, v in doc["symbol_values"].items()}))
            if value.is_number:
                return str(int(value))
        except (ValueError, TypeError):
            pass
    return short_dim(dim, display_names(doc))


def display_name(doc: Doc, symbol: str) -> str:
    """How the page names a symbol: the model's dim name when short and plain, else ``input[axis]``."""
    return display_names(doc).get(symbol, symbol)


# ---------------------------------------------------------------------------------------------------------------
# Rows: order, top rows, grouping


#: Rows shown per table in text and Markdown unless ``show_all`` (largest byte figures first).
DEFAULT_TOP_ROWS = 20


def show_every_row(to_terminal: bool, show_all: bool = False) -> bool:
    """The one rule for how many rows a text or Markdown report has: every row in a report written to a file
    (``optimize --report``, ``report -o``) or returned by the API (``Report.to_markdown``, ``to_text``), so that the
    same report has the same rows wherever it is kept; the top :data:`DEFAULT_TOP_ROWS` per table on the terminal
    unless ``--all``. JSON and HTML always have every row."""
    return show_all or not to_terminal


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


def first_rows(rows: list[dict], show_all: bool) -> list[dict]:
    """The rows a table shows in their order: all with ``show_all``, else the first :data:`DEFAULT_TOP_ROWS`."""
    return rows if show_all else rows[:DEFAULT_TOP_ROWS]


def top_rows(rows: list[dict], key: str, show_all: bool) -> tuple[list[dict], int]:
    """The rows a table shows, largest ``key`` (a byte figure, symbolic ones compared at 64 per symbol) first: all
    with ``show_all``, else the first :data:`DEFAULT_TOP_ROWS`; and how many were left out."""
    ordered = sorted(rows, key=lambda r: -_sort_value(r, key))
    if show_all or len(ordered) <= DEFAULT_TOP_ROWS:
        return ordered, 0
    return ordered[:DEFAULT_TOP_ROWS], len(ordered) - DEFAULT_TOP_ROWS


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


def unfused_groups(doc: Doc) -> list[tuple[str, int, str]]:
    """The unfused patterns of a report dict grouped by reason: ``(reason, count, what would fuse them)``, most
    frequent first (``onnxfuse.report.remedies.remedy`` of each pattern; where a target-dependent reason's patterns
    have different remedies, each with its count: ``--target cpu (16 of them), --target cpu ... (9 of them)``)."""
    fixes: dict[str, dict[str, int]] = {}
    for row in doc["unfused"]:
        by_fix = fixes.setdefault(row["reason"], {})
        fix = remedy(row, doc["target"])
        by_fix[fix] = by_fix.get(fix, 0) + 1
    counts = {r: sum(f.values()) for r, f in fixes.items()}
    order = sorted(counts, key=lambda r: (-counts[r], r))

    def fix_text(by_fix: dict[str, int]) -> str:
        if len(by_fix) == 1:
            return next(iter(by_fix))
        return ", ".join(f"{fix} ({n} of them)" for fix, n in sorted(by_fix.items(), key=lambda fn: (-fn[1], fn[0])))

    return [(r, counts[r], fix_text(fixes[r])) for r in order]


# ---------------------------------------------------------------------------------------------------------------
# Sentences: the summary and its lines

#: The refusal codes of a pattern inside QuantizeLinear/DequantizeLinear pairs (passes/conv_unfused.py and the Gemm
#: passes): a Conv or ConvTranspose, and a Gemm or MatMul. The summary's ``quantized:`` line counts both.
QDQ_REASONS = frozenset({Reason.QDQ.value, Reason.QDQ_GEMM.value})


def summary_lines(report: SupportsToDict, hints: bool = True) -> list[str]:
    """The short summary ``optimize`` prints: traffic, fusion count, unfused count, for a QDQ model what
    onnxruntime does with its quantized patterns, verification, bandwidth, and (when ``hints``)
    :func:`unknown_shapes_hint`. Names escaped for a terminal (:func:`onnxfuse.report.escape.text`). The same
    lines as the headline of every report format (:func:`document`)."""
    return _summary(_summary_doc(report.to_dict()), hints)


def _summary(doc: Doc, hints: bool, code=False, plain=str) -> list[str]:
    """:func:`summary_lines` of a report dict; ``code`` and ``plain`` as in :func:`headline`."""
    lines = [*headline(doc, code=code, hints=hints, plain=plain),
             f"fusions: {fused_count(doc)}; {plural(len(doc['unfused']), 'pattern')} left unfused "
             f"(target {plain(doc['target'])})"]
    if doc["unfused"]:
        lines.append(unfused_line(doc))
    quantized = sum(u["reason"] in QDQ_REASONS for u in doc["unfused"])
    if quantized:  # a QDQ model: onnxfuse leaves its Conv/Gemm/MatMul groups to onnxruntime (passes/conv_unfused.py)
        lines.append(f"quantized: {plural(quantized, 'pattern')} inside QuantizeLinear/DequantizeLinear pairs "
                     "left as they are; onnxruntime turns them into quantized kernels (QLinearConv, QGemm, "
                     "QLinearMatMul) at load, at level extended and above (core/optimizer/qdq_transformer)")
    lines.append(plain(verification_line(doc)))
    if doc["bandwidth"]:
        lines.append(bandwidth_line(doc["bandwidth"]))
    return lines


def unknown_shapes_hint(report: SupportsToDict) -> str | None:
    """``give --input-shape for the figures at one input size (symbols: N_ = x[0], ...)`` when the report has
    symbols, no value for them and no figures at batch 1; else None. Names escaped for a terminal
    (:func:`onnxfuse.report.escape.text`)."""
    doc = report.to_dict()
    t = doc["totals"]
    if not doc["symbols"] or t["saved_bytes"] is not None or (t["at_batch_1"] and
                                                             t["at_batch_1"]["saved_bytes"] is not None):
        return None
    return input_shape_hint(_summary_doc(doc))


def _summary_doc(doc: Doc) -> Doc:
    """A report's dict escaped for a terminal (:func:`onnxfuse.report.escape.escaped`) without its per-node rows
    (``nodes``), which neither :func:`summary_lines` nor :func:`input_shape_hint` reads: escaping them was most
    of the summary's time on a model of thousands of nodes."""
    return escape.escaped({k: v for k, v in doc.items() if k != "nodes"})


def input_shape_hint(doc: Doc) -> str:
    """The line that says which ``--input-shape`` gives the figures at one's own sizes, naming each symbol's
    input and axis."""
    names = display_names(doc)

    def symbol(k: str, where: dict) -> str:
        dim = f"{where['input']}[{where['axis']}]"
        return dim if names.get(k, k) == dim else f"{names.get(k, k)} = {dim}"

    return ("give --input-shape for the figures at your input sizes (symbols: "
            + ", ".join(symbol(k, v) for k, v in doc["symbols"].items()) + ")")


def headline(doc: Doc, code=False, hints: bool = True, plain=str) -> list[str]:
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
        label = f" at {plain(shapes_text(doc))}" if doc["input_shapes"] else ""
        at = (f"vs the graph as exported{label}", before["total_bytes"], after["total_bytes"], t["saved_bytes"])
    elif t["at_batch_1"] and t["at_batch_1"]["saved_bytes"] is not None:
        b = t["at_batch_1"]
        at = (f"vs the graph as exported, at batch 1 ({plain(display_name(doc, b['symbol']))} is the only symbolic "
              "dim)",
              b["before_total_bytes"], b["after_total_bytes"], b["saved_bytes"])
    elif doc["symbols"] and not doc["symbol_values"]:
        values = representative_values(doc)
        before_n, after_n = (at_values(x, values) for x in (before["total_bytes_expr"], after["total_bytes_expr"]))
        if before_n is not None and after_n is not None:
            names = display_names(doc)
            sizes = ", ".join(f"{plain(names.get(k, k))}={v}" for k, v in values.items())
            at = (f"vs the graph as exported, at representative sizes {sizes}", before_n, after_n, before_n - after_n)
    if doc["fusions"] and len(unknown_fusions) == len(doc["fusions"]):
        lines.append(f"saved vs the graph as exported: unknown ({plain(unknown_fusions[0]['unknown_reason'])})")
    elif at is not None:
        pct = f", {percent(at[3], at[1]):.1f}%" if at[1] else ""
        lines.append(f"{at[0]}: {human_bytes(at[1])} -> {human_bytes(at[2])} (saved {human_bytes(at[3])}{pct})")
    elif before["total_bytes_expr"] is None or after["total_bytes_expr"] is None:
        first = doc["unknown_nodes"][0]["reason"] if doc["unknown_nodes"] else "no node's traffic is known"
        lines.append(f"vs the graph as exported: unknown (no node's traffic is known on one side: {plain(first)})")
    if doc["symbols"] and not doc["symbol_values"]:
        lines.append(f"as expressions in the input dims: {expr_text(before['total_bytes_expr'], doc, code)} -> "
                     f"{expr_text(after['total_bytes_expr'], doc, code)} (saved "
                     f"{expr_text(t['saved_bytes_expr'], doc, code)})")
        if hints:
            lines.append(plain(input_shape_hint(doc)))
    if unknown_fusions and len(unknown_fusions) < len(doc["fusions"]):
        lines.append(f"{plural(len(unknown_fusions), 'fusion')} of unknown size not counted in the saving "
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
    if (line := tune_line(doc)) is not None:
        lines.append(line)
    return lines


def figure_sizes(doc: Doc) -> dict[str, int] | None:
    """The sizes every figure of a report is given at when its model has symbolic dims and no value was given for
    them: the stated representative sizes (:func:`representative_values`: batch 1, 224 for the other dims), the
    ones verification's first input set runs at too (``onnxfuse.ort.sessions.DEFAULT_BATCH_DIM`` /
    ``DEFAULT_OTHER_DIM``); None when the report has numbers (no symbols, or ``symbol_values``)."""
    if not doc.get("symbols") or doc.get("symbol_values"):
        return None
    return representative_values(doc)


def saved_beyond_onnxruntime(doc: Doc) -> int | None:
    """The figure every view leads with: bytes of memory traffic onnxfuse saves beyond what onnxruntime (the
    installed release, the report's ``--ort-level``, CPU execution provider) already makes of the original at load
    (the ``onnxruntime`` section's ``saved_bytes_beyond``), at the input shapes used or, for symbolic dims without
    values, at :func:`figure_sizes`. 0 when nothing was fused; None when the comparison was not made (onnxruntime
    could not load a model) or a size is unknown."""
    rt = doc.get("onnxruntime")
    if not doc["fusions"]:
        return 0
    if not rt or rt["status"] != "compared":
        return None
    if rt["saved_bytes_beyond"] is not None:
        return int(rt["saved_bytes_beyond"])
    sizes = figure_sizes(doc)
    return at_values(rt["saved_bytes_beyond_expr"], sizes) if sizes is not None else None


def saved_vs_exported(doc: Doc) -> int | None:
    """The figure beside it: bytes saved against the graph as exported (``totals.saved_bytes``), at the same
    sizes as :func:`saved_beyond_onnxruntime`; None when unknown."""
    t = doc["totals"]
    if t["saved_bytes"] is not None:
        return int(t["saved_bytes"])
    sizes = figure_sizes(doc)
    return at_values(t["saved_bytes_expr"], sizes) if sizes is not None else None


def sizes_label(doc: Doc, plain=str) -> str:
    """Where the figures are given: `` at x=1x3x640x640`` (the input shapes used), `` at representative sizes
    N=1, H=224`` (:func:`figure_sizes`, by display names), or empty (the model's own fixed shapes)."""
    sizes = figure_sizes(doc)
    if sizes is not None:
        names = display_names(doc)
        return " at representative sizes " + ", ".join(f"{plain(names.get(k, k))}={v}" for k, v in sizes.items())
    return f" at {plain(shapes_text(doc))}" if doc["input_shapes"] else ""


def _other_release(doc: Doc) -> str:
    """``; measured with it, not the 1.20 the model is for`` when the report is for another onnxruntime release
    (``--ort-version``, the ``deployment`` section) than the installed one, which made the runtime comparison
    (only the installed release can load a model here); else empty."""
    wanted = (doc.get("deployment") or {}).get("ort_version")
    installed = (doc.get("onnxruntime") or {}).get("installed") or ""
    if not wanted or installed.split(".")[:2] == wanted.split(".")[:2]:
        return ""
    return f"; measured with it, not the {wanted} the model is for"


def runtime_line(doc: Doc, code=False, plain=str) -> str | None:
    """The summary's first line: what onnxfuse saves beyond what onnxruntime already makes of the original at
    load (the report's ``onnxruntime`` section; 0 B when nothing was fused), or None when nothing was compared.
    ``plain``: applied to text taken from the model or onnxruntime's messages (as in :func:`headline`)."""
    rt = doc.get("onnxruntime")
    if not rt:
        return None
    head = f"vs onnxruntime {rt['installed']} (installed, CPU provider{_other_release(doc)}) at level {rt['level']}"
    if not doc["fusions"]:  # nothing fused: a true 0, stated as such (saved_beyond_onnxruntime)
        return f"{head}: nothing was fused, so nothing is saved beyond it (0 B)"
    if rt["status"] != "compared":
        return f"{head}: not compared ({plain(rt['reason'])})"
    made, total = rt["fusions_made_by_onnxruntime"], rt["fusions"]
    kernels = f"{rt['kernels_before']} -> {rt['kernels_after']} kernels"
    if made == total and rt["kernels_after"] >= rt["kernels_before"]:
        return (f"{head}: onnxruntime makes all {total} of these fusions itself when it loads the original "
                f"({kernels}); nothing is saved beyond it")
    at = ""
    figure = saved_beyond_onnxruntime(doc)
    if figure is not None:
        saved, at = human_bytes(figure), sizes_label(doc, plain)
    elif rt["saved_bytes_beyond_expr"] is not None:
        saved = expr_text(rt["saved_bytes_beyond_expr"], doc, code)
    else:
        saved = "an unknown number of bytes"
    return (f"{head}: {total - made} of {total} fusions go beyond what onnxruntime makes itself at load "
            f"({kernels}), saving {saved}{at}")


#: What every format says of the verification of a report that ``onnxfuse report`` made (it runs nothing).
NOT_RUN_STATUS, NOT_RUN_DETAIL = "not run", "onnxfuse report only analyses; onnxfuse optimize verifies what it writes"


def verification_not_run(doc: Doc) -> bool:
    """True for a report of ``onnxfuse report``: nothing was run, so nothing passed or failed."""
    return (doc["verification"] or {}).get("reason") == REPORT_DOES_NOT_VERIFY


def verification_line(doc: Doc) -> str:
    """``verification: passed (...)``: the verdict and its summary, or why it was skipped or not run
    (:func:`verification_parts`)."""
    status, detail = verification_parts(doc)
    return f"verification: {status}" + (f" ({detail})" if detail else "")


def bandwidth_line(b: Doc) -> str:
    """``--bandwidth``'s estimate of memory time (bytes / bandwidth), before and after, or why it is unknown."""
    if b["at"] is None:
        return (f"estimated memory time at {b['gb_per_s']:g} GB/s: unknown (no input size: give --input-shape)")
    at = "" if b["at"] == "input shapes" else f", at {b['at']}"
    return (f"estimated memory time at {b['gb_per_s']:g} GB/s of the graph as exported and of the optimized one "
            f"(bytes / bandwidth, an estimate{at}; onnxruntime's own fusions at load are not in it): "
            f"{human_time(b['before_ms'])} -> {human_time(b['after_ms'])}")


def unfused_line(doc: Doc) -> str:
    """``left unfused: 45 dtype-has-no-fusedconv-kernel (no target: ...); 1 ...``: one line, each reason with its
    count and what would fuse those patterns, in the words of ``onnxfuse/report/remedies.py``."""
    return "left unfused: " + "; ".join(f"{n} {reason} (what would fuse {'it' if n == 1 else 'them'}: {fix})"
                                        for reason, n, fix in unfused_groups(doc))


def deployment_line(doc: Doc) -> str | None:
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


def file_line(doc: Doc) -> str | None:
    """``model file: 11.1 MiB -> 11.1 MiB``: the input file (with its external data) and the optimized model's
    serialized size (weights computed from compact constants, int8 x scale and the like, stay compact unless
    ``--materialize-weights`` allows floats); None when a size is unknown."""
    m = doc["model"]
    after = m.get("optimized_bytes")
    if after is None or not m.get("file_bytes"):
        return None
    return f"model file: {human_bytes(m['file_bytes'])} -> {human_bytes(after)}"


def profile_line(doc: Doc, plain=str) -> str | None:
    """``measured by onnxruntime's profiler at level all: 400 -> 238 kernels, 812 ms -> 655 ms, 1.9 GiB -> 1.2 GiB
    read and written (at x=1x3x640x640)``; None without a ``profile`` section (``report --profile``)."""
    p = doc.get("profile")
    if not p:
        return None
    o, a = p["original"], p["optimized"]
    shapes = ", ".join(f"{plain(k)}={'x'.join(map(str, v)) or 'scalar'}" for k, v in p["input_shapes"].items())
    timing = timing_text(p)
    kernel_ms = ("" if timing else f", {o['total_ms']:.3f} ms -> {a['total_ms']:.3f} ms")  # a report without timing
    return ((f"{timing}; " if timing else "")
            + f"measured by onnxruntime's profiler at level {p['level']}, {p['threads']} thread(s), median of "
            f"{p['runs']} runs: {o['kernels']} -> {a['kernels']} kernels{kernel_ms}, "
            f"{human_bytes(o['total_bytes'])} -> {human_bytes(a['total_bytes'])} read and written (at {shapes})")


def tune_line(doc: Doc) -> str | None:
    """``tuned by measurement (--tune, onnxruntime 1.32.0 at level all, 1 thread(s), 4.2 s): 3 groups, 1 dropped
    (slower-when-measured), 1 kept, 1 inconclusive (the rule's choice kept)``; None without a ``tune`` section."""
    t = doc.get("tune")
    if not t:
        return None
    n = {v: sum(g["verdict"] == v for g in t["groups"]) for v in ("dropped", "kept", "inconclusive")}
    head = (f"tuned by measurement (--tune, onnxruntime {t['onnxruntime']} at level {t['level']}, {t['threads']} "
            f"thread(s), {t['seconds']:.1f} s): ")
    if not t["groups"]:
        return head + "no group of rewrites to time"
    return (head + f"{plural(len(t['groups']), 'group')}, {n['dropped']} dropped (slower-when-measured), "
            f"{n['kept']} kept, {n['inconclusive']} inconclusive (the rule's choice kept)")


def timing_text(p: Doc) -> str | None:
    """``latency at level all (onnxfuse bench's paired rounds, 16 rounds): 7.02 ms -> 12.0 ms, ratio 1.71 (99.97%
    interval 0.93 to 2.41): inconclusive`` from a profile section's ``timing`` (``bench.report_profile``); None
    for a profile without it (an older report). The verdict is bench's, with its margin."""
    t = p.get("timing")
    if not t:
        return None
    verdict = t["verdict"]
    if verdict == "same" and t.get("same_kernels"):
        verdict = "same (onnxruntime runs the same kernels for both)"
    elif verdict == "inconclusive":
        verdict = f"inconclusive (the interval is not all within or all outside 1 +-{t['margin']:.0%})"
    return (f"latency at level {p['level']} (onnxfuse bench's paired rounds, {t['rounds']} rounds): "
            f"{t['original_ms']:.3g} ms -> {t['optimized_ms']:.3g} ms, ratio {t['ratio']:.3g} "
            f"({100 * t['ci_confidence']:.4g}% interval {t['ci_low']:.3g} to {t['ci_high']:.3g}): {verdict}")


# ---------------------------------------------------------------------------------------------------------------
# The HTML chart's layers and sizes


def layer_units(doc: Doc) -> list[dict]:
    """The chart's bars: the model's nodes in execution order (``nodes.before``), one bar per node, except that
    each fused group (a ``fusions`` row) is one bar placed at its first original node, and ``Constant`` nodes
    (which move no bytes) are left out. Nodes that only the optimized model has come after the bar of the node
    before them in ``nodes.after``.

    Returns dicts with ``kind`` (``node``, ``fused``, ``unfused``: in a pattern left unfused, ``removed``,
    ``new``), ``nodes`` (``{name, op, output}`` of the original nodes), ``before``/``after`` (bytes or None),
    ``before_expr``/``after_expr`` (symbolic or None), ``into`` (the fused node, for ``fused``) and
    ``reason`` (for ``unfused``).
    """
    before_rows, after_rows = doc["nodes"]["before"], doc["nodes"]["after"]
    after_by_key = {r["output"]: r for r in after_rows}
    before_keys = {r["output"] for r in before_rows}
    group_of = {n["output"]: i for i, f in enumerate(doc["fusions"]) for n in f["replaced"]}
    fusion_outputs = {f["output"]: i for i, f in enumerate(doc["fusions"])}
    unfused_of: dict[str, dict] = {}
    for u in doc["unfused"]:
        for n in u["nodes"]:
            unfused_of.setdefault(n["output"], u)

    units: list[dict] = []
    unit_of_after: dict[str, int] = {}
    emitted: set[int] = set()
    for row in before_rows:
        key = row["output"]
        if key in group_of:
            i = group_of[key]
            if i in emitted:
                continue
            emitted.add(i)
            f = doc["fusions"][i]
            unit_of_after[f["output"]] = len(units)
            units.append({"kind": "fused", "nodes": [_ref(n) for n in f["replaced"]],
                          "before": f.get("bytes_before"), "before_expr": f.get("bytes_before_expr"),
                          "after": f.get("bytes_after"), "after_expr": f.get("bytes_after_expr"),
                          "into": {"name": f["node"], "op": f["op"]}, "reason": None})
            continue
        if row["op"] == "Constant":
            continue
        before, before_expr = node_total(row)
        after_row = after_by_key.get(key) if key not in fusion_outputs else None
        after, after_expr = node_total(after_row) if after_row is not None else (0, None)
        kind = "unfused" if key in unfused_of else ("node" if after_row is not None else "removed")
        if after_row is not None:
            unit_of_after[key] = len(units)
        units.append({"kind": kind, "nodes": [_ref(row)], "before": before, "before_expr": before_expr,
                      "after": after, "after_expr": after_expr, "into": None,
                      "reason": unfused_of[key]["reason"] if key in unfused_of else None})

    # nodes only the optimized model has: after the bar of the node that precedes them there
    extra: dict[int, list[dict]] = {}
    last = -1
    for row in after_rows:
        key = row["output"]
        if key in unit_of_after:
            last = unit_of_after[key]
        elif key not in before_keys and row["op"] != "Constant":
            after, after_expr = node_total(row)
            extra.setdefault(last, []).append({"kind": "new", "nodes": [_ref(row)], "before": 0,
                                               "before_expr": None, "after": after, "after_expr": after_expr,
                                               "into": None, "reason": None})
    if not extra:
        return units
    out = list(extra.get(-1, []))
    for i, u in enumerate(units):
        out.append(u)
        out.extend(extra.get(i, []))
    return out


def _ref(row: dict) -> dict:
    return {"name": row.get("name") or "", "op": row["op"], "output": row["output"]}


def chart_sizes(doc: Doc) -> tuple[dict[str, int], str] | None:
    """``(symbol -> size, where the sizes come from)`` for a report with symbolic dims and no value for them: the
    sizes of every figure of the run (:func:`figure_sizes`, the stated representative sizes, which verification's
    first input set also runs at), so that the chart and the summary give the same number. None when the report
    has numbers (no symbols, or values for them)."""
    sizes = figure_sizes(doc)
    if sizes is None:
        return None
    return (sizes,
            f"representative sizes: batch {REPRESENTATIVE_BATCH}, {REPRESENTATIVE_SIZE} for the other dims")


def draw_at(units: list[dict], values: dict[str, int]) -> None:
    """Give each layer whose bytes are only an expression its number at ``values`` (symbol -> size), in place; the
    expressions stay for the hover labels."""
    import sympy

    at = {make_symbol(k): sympy.Integer(v) for k, v in values.items()}
    for u in units:
        for side in ("before", "after"):
            if u[side] is None and u.get(f"{side}_expr"):
                try:
                    value = sympy.sympify(expressions.parse(u[f"{side}_expr"]).xreplace(at))
                    u[side] = int(value) if value.is_number else None
                except (ValueError, TypeError):
                    u[side] = None


# ---------------------------------------------------------------------------------------------------------------
# The document every format draws


def document(report: SupportsToDict | Doc, *, show_all: bool, chart: bool = True) -> Document:
    """The one :class:`~onnxfuse.report.document.Document` of a report (a ``report.model.Report``, or its JSON
    dict) that text, Markdown and HTML draw (``report.text``, ``report.markdown``, ``report.html``), decided here
    once: the header, the headline (the runtime figure first: :func:`runtime_line`), which sections exist and in
    which order, their columns, the cells (semantic: each format escapes names and draws code spans and byte
    figures its own way), row order, grouping and caps (the top :data:`DEFAULT_TOP_ROWS` per table unless
    ``show_all``; :func:`show_every_row` says when), and the page's chart (``chart``: False leaves it out, for
    the formats that have no figures: its layers cost a walk of every node). Empty sections are left out."""
    doc: Doc = report.to_dict() if hasattr(report, "to_dict") else report
    m = doc["model"]
    fields = [
        Field("model", (Code(m["path"]), Prose(f" · {human_bytes(m.get('file_bytes'))}"
                                                + (" · external data" if m.get("external_data") else ""))),
              "model-path"),
        Field("sha256", (Code(m["sha256"]),), "model-sha256"),
        Field("target", (Code(doc["target"]), Prose(f" ({target_providers(doc)})"))),
        Field("input shapes", _shapes_sentence(doc)),
        Field("onnxfuse", (Prose(doc["onnxfuse_version"]),)),
    ]
    headline_lines = tuple(sentence(line) for line in _summary(doc, True, _as_code, _as_name))
    sections = [s for s in (
        _warnings_section(doc), _totals_section(doc), _fusions_section(doc, show_all),
        _unfused_section(doc, show_all), _unknown_section(doc, show_all), _verification_section(doc),
        _runtime_section(doc), _deployment_section(doc), _bandwidth_section(doc), *_profile_sections(doc),
        _tune_section(doc), _symbols_section(doc), _passes_section(doc), _ops_section(doc)) if s is not None]
    return Document("onnxfuse memory-traffic report", m["path"], tuple(fields), headline_lines, tuple(sections),
                    _chart(doc) if chart else None, data=doc)


# Marks that the sentence functions above put around text from the model (``plain``) and around expressions
# (``code``), so that one sentence becomes spans (:func:`sentence`). A mark character inside a name is replaced
# (U+FFFD) first: no name can open or close a span.
_NAME_OPEN, _NAME_CLOSE, _CODE_OPEN, _CODE_CLOSE = "\ue000", "\ue001", "\ue002", "\ue003"
_MARKS = re.compile("[\ue000-\ue003]")
_SPANS = re.compile("\ue000(.*?)\ue001|\ue002(.*?)\ue003", re.S)


def _as_name(value: object) -> str:
    return _NAME_OPEN + _MARKS.sub("\ufffd", str(value)) + _NAME_CLOSE


def _as_code(value: object) -> str:
    return _CODE_OPEN + _MARKS.sub("\ufffd", str(value)) + _CODE_CLOSE


def sentence(text: str) -> Sentence:
    """A line made by the sentence functions with :func:`_as_name` / :func:`_as_code` marks, as spans: the
    unmarked text :class:`Prose`, the marked parts :class:`Name` and :class:`Code`."""
    spans: list[Span] = []
    pos = 0
    for match in _SPANS.finditer(text):
        if match.start() > pos:
            spans.append(Prose(text[pos:match.start()]))
        spans.append(Name(match.group(1)) if match.group(1) is not None else Code(match.group(2)))
        pos = match.end()
    if pos < len(text):
        spans.append(Prose(text[pos:]))
    return tuple(s for s in spans if s.text)


def byte_cell(number: int | None, expr: str | None, doc: Doc, why: str | None = None, suffix: str = "",
              anchor: str | None = None) -> Bytes:
    """A byte figure as a cell: the number (KiB/MiB...) when there is one, else the expression by its leading terms
    when long (:func:`short_expression`, the exact one beside it), else exact (symbols by their display names),
    else unknown (``why``)."""
    if number is None and expr is not None and expr.lstrip("-").isdigit():
        number = int(expr)
    if number is not None:
        return Bytes(human_bytes(number), number, float(number), why=why, suffix=suffix, anchor=anchor)
    if expr is None:
        return Bytes("unknown", None, float("-inf"), why=why, suffix=suffix, anchor=anchor)
    sort = _sort_value({"x_expr": expr}, "x")
    exact = named(expr, doc)
    short = short_expression(expr, doc)
    if short is not None:
        return Bytes(short, None, sort, expr=short, exact=f"{exact} B", why=why, suffix=suffix, anchor=anchor)
    return Bytes(f"{exact} B", None, sort, expr=exact, why=why, suffix=suffix, anchor=anchor)


def _num(value: float | int | None, fmt: str = "") -> Num:
    return Num("" if value is None else format(value, fmt), None if value is None else float(value))


_EMPTY = Prose("")

#: The sentence under a table that leaves rows out.
HIDDEN_NOTE = "more rows not shown (--all shows every row; JSON and HTML always do)"


def verification_parts(doc: Doc) -> tuple[str, str | None]:
    """(status, detail) of :func:`verification_line`: ``not run`` for a report of ``onnxfuse report``."""
    v = doc["verification"]
    if verification_not_run(doc):
        return NOT_RUN_STATUS, NOT_RUN_DETAIL
    detail = v.get("summary") or v.get("reason")
    if not detail and v.get("max_abs_error") is not None:
        detail = f"max abs error {v['max_abs_error']:.3g}, max rel error {v['max_rel_error']:.3g}"
    if v["status"] in ("passed", "failed", "partial") and v.get("input_shapes"):  # what was run: sizes may be generated
        shapes = shapes_text({"input_shapes": v["input_shapes"]})
        detail = f"{detail}; inputs {shapes}" if detail else f"inputs {shapes}"
    return v["status"], detail


def _shapes_sentence(doc: Doc) -> Sentence:
    spans: list[Span] = [Name(shapes_text(doc))] if doc["input_shapes"] else [Prose("from the model")]
    for u in doc.get("unknown_shapes") or []:
        spans += [Prose("; "), Code(u["input"]), Prose(" = "), Name(f"[{', '.join(map(str, u.get('shape') or []))}]"),
                  Prose(" (symbolic)")]
    return tuple(spans)


def _warnings_section(doc: Doc) -> Section | None:
    if not doc["warnings"]:
        return None
    return Section("warnings", "Warnings", lead=tuple(Note((Name(w),), warning=True) for w in doc["warnings"]))


def _totals_section(doc: Doc) -> Section:
    t = doc["totals"]
    columns = (Column(""), Column("read", True), Column("written", True), Column("total", True),
               Column("nodes", True), Column("unknown nodes", True))
    rows: list[tuple[Cell, ...]] = []
    rt = doc.get("onnxruntime")
    if rt:  # the figure every view leads with, first (0 B when nothing was fused); the exported-graph one beside it
        beyond = saved_beyond_onnxruntime(doc)
        if beyond is not None:
            lead = byte_cell(beyond, None, doc, suffix=sizes_label(doc), anchor="total-saved-beyond")
        elif rt["status"] != "compared":
            lead = Bytes("not compared", None, float("-inf"), why=rt["reason"], anchor="total-saved-beyond")
        else:
            lead = byte_cell(None, rt["saved_bytes_beyond_expr"], doc, anchor="total-saved-beyond")
        rows.append((Prose(f"saved beyond onnxruntime {rt['installed']} at level {rt['level']}"), _EMPTY, _EMPTY,
                     lead, _EMPTY, _EMPTY))
    for side in ("before", "after"):
        s = t[side]
        rows.append((Prose(side), byte_cell(s["read_bytes"], s["read_bytes_expr"], doc),
                     byte_cell(s["written_bytes"], s["written_bytes_expr"], doc),
                     byte_cell(s["total_bytes"], s["total_bytes_expr"], doc, anchor=f"total-{side}"),
                     _num(s["nodes"]), _num(s["unknown_nodes"])))
    pct = f" ({t['saved_percent']:.1f}%)" if t["saved_percent"] is not None else ""
    rows.append((Prose("saved vs the graph as exported"), _EMPTY, _EMPTY,
                 byte_cell(t["saved_bytes"], t["saved_bytes_expr"], doc, suffix=pct, anchor="total-saved"),
                 _EMPTY, _EMPTY))
    beyond_note = " (the first line of the summary says what is saved beyond onnxruntime)" if rt else ""
    notes = [Note(sentence(f"Saved {cell(t['saved_bytes'], t['saved_bytes_expr'], doc, _as_code)}{pct} of memory "
                           f"traffic against the graph as exported{beyond_note} with {fused_count(doc)}; "
                           f"{plural(len(doc['unfused']), 'pattern')} left unfused."))]
    if doc.get("unknown_shapes"):
        spans: list[Span] = [Prose("Unknown shapes: give --input-shape for ")]
        for i, u in enumerate(doc["unknown_shapes"]):
            spans += [Prose(", ")] if i else []
            spans.append(Code(u["input"]))
        notes.append(Note((*spans, Prose(" to count every byte.")), warning=True))
    if doc["subgraph_nodes"]:
        notes.append(Note((Prose(f"{doc['subgraph_nodes']} nodes inside If/Loop/Scan bodies are counted once "
                                 "each."),)))
    return Section("totals", "Totals (bytes moved to and from device memory)", columns=columns, rows=tuple(rows),
                   notes=tuple(notes))


def output_shape(row: dict, doc: Doc) -> str:
    """``1x8x16x16 float32``; a symbolic shape evaluated at the report's symbol values where they fix it, else
    ``[N, 8, ~x[2]/4, 16] float32`` (:func:`dim_text`); ``unknown`` without a shape."""
    dims = [dim_text(d, doc) for d in row["shape"]] if row.get("shape") else None
    shape = ("unknown" if dims is None else "x".join(dims) if all(d.isdigit() for d in dims)
             else f"[{', '.join(dims)}]")
    return f"{shape} {row.get('dtype') or '?'}"


def _fusions_section(doc: Doc, show_all: bool) -> Section | None:
    if not doc["fusions"]:
        return None
    rows, hidden = top_rows(doc["fusions"], "saved_bytes", show_all)
    columns = (Column("node"), Column("op", wide=True), Column("replaced"), Column("activation"),
               Column("passes", wide=True), Column("output"), Column("bytes before", True, wide=True),
               Column("bytes after", True, wide=True), Column("saved", True),
               Column("onnxruntime makes it too", wide=True))
    cells = tuple((Code(r["node"]), Name(r["op"]), Name(chain(r["replaced"])), Name(r["activation"] or ""),
                   Prose(passes_text(r.get("passes") or [])), Name(output_shape(r, doc)),
                   byte_cell(r.get("bytes_before"), r.get("bytes_before_expr"), doc),
                   byte_cell(r.get("bytes_after"), r.get("bytes_after_expr"), doc),
                   byte_cell(r["saved_bytes"], r["saved_bytes_expr"], doc, why=r.get("unknown_reason")),
                   Prose(made_by_onnxruntime(r))) for r in rows)
    return Section("fusions", f"Fusions applied ({len(doc['fusions'])}: {kinds(doc)})", columns=columns, rows=cells,
                   hidden=hidden, hidden_note=HIDDEN_NOTE, sortable=True)


def _unfused_section(doc: Doc, show_all: bool) -> Section | None:
    if not doc["unfused"]:
        return None
    rows, hidden = top_rows(grouped_unfused(doc["unfused"]), "bytes", show_all)
    columns = (Column("nodes"), Column("reason"), Column("detail"), Column("would save", True),
               Column("pass", wide=True), Column("what would allow it", wide=True))
    cells = tuple((sentence(unfused_label(r, _as_code, _as_name)), Code(r["reason"]), Name(r["detail"] or ""),
                   byte_cell(r["bytes"], r["bytes_expr"], doc), Name(r.get("pass") or ""),
                   Prose(remedy(r, doc["target"]))) for r in rows)
    return Section("unfused", f"Left unfused ({len(doc['unfused'])})",
                   lead=(Note((Prose("Each pattern a pass found but declined (the same chain and reason counted "
                                     "once), with the bytes one fused node would save and what option or target "
                                     "would allow it."),)),),
                   columns=columns, rows=cells, hidden=hidden, hidden_note=HIDDEN_NOTE, sortable=True)


def _unknown_section(doc: Doc, show_all: bool) -> Section | None:
    unknown = doc["unknown_nodes"]
    if not unknown:
        return None
    rows = first_rows(unknown, show_all)
    return Section("unknown", f"Nodes of unknown size ({len(unknown)}, left out of the totals)",
                   columns=(Column("node"), Column("op"), Column("tensors of unknown size", wide=True),
                            Column("why")),
                   rows=tuple((Code(r["node"] or r["output"]), Name(r["op"]), Name(", ".join(r.get("tensors") or [])),
                               Name(r.get("reason") or "")) for r in rows),
                   hidden=len(unknown) - len(rows), hidden_note=HIDDEN_NOTE)


def _verification_section(doc: Doc) -> Section:
    v = doc["verification"] or {}
    status, detail = verification_parts(doc)
    lead = (Note((Prose("verification: "), Status(status)) + ((Name(f" ({detail})"),) if detail else ())),)
    outputs = [] if verification_not_run(doc) else v.get("outputs") or []
    if not outputs:
        return Section("verification", "Verification", lead=lead)
    keys = [(title, key) for title, key in (("max abs error", "max_abs_error"), ("max rel error", "max_rel_error"),
                                            ("tolerance", "tolerance"), ("atol", "atol"), ("rtol", "rtol"))
            if any(o.get(key) is not None for o in outputs)]
    rule = f" (rule {v['rule']})" if v.get("rule") else ""
    columns = (Column("output"), Column("dtype"), *(Column(title, True) for title, _ in keys),
               Column(f"within tolerance{rule}"))
    rows: tuple[tuple[Cell, ...], ...] = tuple(
        (Code(o.get("name") or ""), Name(o.get("dtype") or ""), *(_num(o.get(key), ".3g") for _, key in keys),
         Prose("pass" if o.get("passed") else "FAIL")) for o in outputs)
    return Section("verification", "Verification", lead=lead, columns=columns, rows=rows)


def _runtime_section(doc: Doc) -> Section | None:
    rt = doc.get("onnxruntime")
    line = runtime_line(doc, _as_code, _as_name)
    if not rt or line is None:
        return None
    what = Prose("What onnxruntime itself makes of each model when a session loads it (the installed release, CPU "
                 "provider; the first line of the summary is the figure beyond it)")
    if rt["status"] != "compared":
        lead = (Note((what, Prose(": not compared ("), Name(rt["reason"] or ""), Prose(")"))),)
    else:
        lead = (Note((what,)),)
    title = f"Beyond onnxruntime {rt['installed']} at level {rt['level']}"
    if rt["status"] != "compared":
        return Section("onnxruntime", title, lead=lead)
    rows: list[tuple[Cell, ...]] = [(Prose("kernels, the original"), _num(rt["kernels_before"])),
                                    (Prose("kernels, the optimized model"), _num(rt["kernels_after"]))]
    rows += [((Name(op), Prose(" fewer")), _num(n)) for op, n in rt["ops_removed"].items()]
    rows += [((Name(op), Prose(" more")), _num(n)) for op, n in rt["ops_added"].items()]
    return Section("onnxruntime", title, lead=lead,
                   columns=(Column("in onnxruntime's own graph at load"), Column("count", True)), rows=tuple(rows))


def _deployment_section(doc: Doc) -> Section | None:
    d = doc.get("deployment")
    line = deployment_line(doc)
    if not d or line is None:
        return None
    return Section("deployment", f"onnxruntime releases (the model is for {d['ort_version']})",
                   lead=(Note((Prose(line),)),),
                   columns=(Column("form written"), Column("count", True), Column("needs onnxruntime")),
                   rows=tuple((Code(f["form"]), _num(f["count"]), Prose(f">= {f['min_onnxruntime']}"))
                              for f in d["forms"]))


def _bandwidth_section(doc: Doc) -> Section | None:
    b = doc["bandwidth"]
    if not b:
        return None
    return Section("bandwidth", "Estimated memory time", lead=(Note((Prose(bandwidth_line(b)),), id="bandwidth"),))


def _profile_sections(doc: Doc) -> list[Section]:
    """The measured part of ``report --profile``: per op, kernels, time and the bytes onnxruntime's profiler
    records for the original and the optimized model; per fusion, the kernel that computes it."""
    p = doc.get("profile")
    line = profile_line(doc, _as_name)
    if not p or line is None:
        return []
    o, a = p["original"], p["optimized"]

    def total(row: dict | None) -> int:
        return 0 if row is None else row["output_bytes"] + row["activation_bytes"] + row["parameter_bytes"]

    ops = list(dict.fromkeys([*o["by_op"], *a["by_op"]]))
    largest = max([total(side["by_op"].get(op)) for side in (o, a) for op in ops] + [1])
    rows = []
    for op in ops:
        before, after = o["by_op"].get(op), a["by_op"].get(op)
        rows.append((Code(op), _num(before["kernels"] if before else 0), _num(after["kernels"] if after else 0),
                     _num(before["ms"] if before else 0.0, ".3f"), _num(after["ms"] if after else 0.0, ".3f"),
                     byte_cell(total(before), None, doc), byte_cell(total(after), None, doc),
                     Bars((total(before) / largest, total(after) / largest))))
    lead = [Note(sentence(line), id="profile-timing")]
    if p.get("timing"):
        lead.append(Note((Prose("The per-kernel times below are one profiled run each and carry no interval: "
                                "quote the latency line."),)))
    lead.append(Note((Prose("Bytes are what the profiler records per kernel (outputs written, activations and "
                            "parameters read); they differ from the counted traffic where onnxruntime changes the "
                            "layout (NCHWc reorders) or fuses more itself."),)))
    sections = [Section("profile-ops", "Measured in onnxruntime, per op", lead=tuple(lead),
                        columns=(Column("op"), Column("kernels (original)", True),
                                 Column("kernels (optimized)", True), Column("ms (original)", True),
                                 Column("ms (optimized)", True), Column("measured bytes (original)", True),
                                 Column("measured bytes (optimized)", True),
                                 Column("original (light) / optimized (dark)", wide=True)),
                        rows=tuple(rows))]
    if p.get("by_fusion"):
        sections.append(Section(
            "profile-fusions", "Measured in onnxruntime, per fusion",
            columns=(Column("fusion"), Column("replaced"), Column("kernel that computes it"), Column("ms", True),
                     Column("measured bytes", True), Column("saved (counted)", True)),
            rows=tuple((Code(f["node"]), Name(f["replaced"]), Code(f["kernel"] or "-"), _num(f["ms"], ".3f"),
                        byte_cell(f["total_bytes"], None, doc), byte_cell(f["counted_saved_bytes"], None, doc))
                       for f in p["by_fusion"])))
    return sections


def _tune_section(doc: Doc) -> Section | None:
    """``optimize --tune``: one row per group of rewrites timed (``tune.groups``), its ratio without / with and the
    interval, rounds and verdict; the lead is :func:`tune_line`."""
    t, line = doc.get("tune"), tune_line(doc)
    if not t or line is None:
        return None
    rows = []
    for g in t["groups"]:
        timed = g["ratio"] is not None
        interval = (f"{g['ci_low']:.3g} to {g['ci_high']:.3g} ({100 * g['ci_confidence']:.4g}%)" if timed
                    else "not timed")
        rows.append((Code(g["pass"]), Name(g["form"]), _num(g["sites"]),
                     _num(g["ratio"], ".3g") if timed else _EMPTY, Prose(interval),
                     _num(g["rounds"]) if timed else _EMPTY, Prose(g["verdict"]), Name(g["note"] or "")))
    return Section("tune", "Tuned by measurement (--tune)", lead=(Note((Prose(line),), id="tune"),),
                   columns=(Column("pass"), Column("form"), Column("sites", True), Column("without / with", True),
                            Column("interval"), Column("rounds", True), Column("verdict"), Column("note")),
                   rows=tuple(rows))


def _symbols_section(doc: Doc) -> Section | None:
    if not doc["symbols"]:
        return None
    names = display_names(doc)
    rows = tuple((Code(names.get(sym, sym)), Name(where["input"]), _num(where["axis"]),
                  Name(where["dim_param"] or "(unnamed)"), _num(doc["symbol_values"].get(sym)))
                 for sym, where in doc["symbols"].items())
    notes = tuple(Note((Prose("assumed: "), Code(a))) for a in doc.get("shape_assumptions") or [])
    return Section("symbols", "Symbols (the model's symbolic input dims)",
                   columns=(Column("symbol"), Column("input"), Column("axis", True), Column("model's dim name"),
                            Column("value", True)), rows=rows, notes=notes)


def _passes_section(doc: Doc) -> Section:
    rows = []
    for s in doc["pass_stats"]:
        removed: Cell = _EMPTY
        if "removed_nodes" in s:
            removed = _num(s["removed_nodes"]) if not s["removed_nodes"] else Num(
                f"{s['removed_nodes']} ({bytes_text(s['removed_bytes'], s['removed_bytes_expr'])})",
                float(s["removed_nodes"]))
        rows.append((Code(s["name"]), _num(s["applied"]), removed,
                     Name(", ".join(f"{k} {v}" for k, v in s["skipped"].items()) or "-")))
    return Section("passes", "Passes", columns=(Column("pass"), Column("rewrites", True),
                                                Column("nodes removed", True), Column("skipped by reason")),
                   rows=tuple(rows))


def _ops_section(doc: Doc) -> Section:
    ops = doc["op_counts"]
    return Section("ops", "Nodes by op type", columns=(Column("op"), Column("before", True), Column("after", True)),
                   rows=tuple((Name(op), _num(ops["before"].get(op, 0)), _num(ops["after"].get(op, 0)))
                              for op in sorted(set(ops["before"]) | set(ops["after"]))))


def _layer_text(unit: dict, side: str, doc: Doc, at_sizes: bool) -> str:
    """Hover text of one side of a layer: KiB/MiB and the exact bytes, or the expression, or unknown; a number
    drawn at the chart's sizes comes with its expression."""
    value, expr = unit[side], unit.get(f"{side}_expr")
    if value is not None and expr is not None and at_sizes:
        return f"{human_bytes(value)} at the chart's sizes; {_shortened(bytes_of({'x_expr': expr}, 'x', doc))}"
    if value is not None:
        return f"{human_bytes(value)} ({value:,} B)"
    return _shortened(bytes_of({side: value, f"{side}_expr": expr}, side, doc))


def _shortened(text: str, limit: int = 100) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def chart_layers(doc: Doc) -> tuple[Layer, ...]:
    """The page's bars (:func:`layer_units`), drawn at :func:`chart_sizes` when the dims have no values, as
    :class:`~onnxfuse.report.document.Layer` records with their hover texts."""
    units = layer_units(doc)
    sizes = chart_sizes(doc)
    if sizes is not None:
        draw_at(units, sizes[0])
    drawn = sizes is not None
    return tuple(Layer(u["kind"], tuple((n["op"], label(n)) for n in u["nodes"]), u["before"], u["after"],
                       _layer_text(u, "before", doc, drawn), _layer_text(u, "after", doc, drawn),
                       None if not u["into"] else f"{u['into']['op']} {u['into']['name']}", u["reason"])
                 for u in units)


def _chart(doc: Doc) -> Chart:
    layers = chart_layers(doc)
    constants = sum(1 for r in doc["nodes"]["before"] if r["op"] == "Constant")
    fused = sum(1 for u in layers if u.kind == "fused")
    caption = (f"{len(layers)} layers in execution order: {fused} fused groups (one bar each, hatched), the other "
               f"nodes one bar each; {constants} Constant nodes move nothing and are not drawn. The light bar is the "
               "original model, the dark bar inside it the optimized one. Hover a bar for its nodes; drag the slider "
               "below the chart or drag across the plot to zoom, double-click to reset.")
    notes = []
    sizes = chart_sizes(doc)
    names = display_names(doc)
    if sizes is not None:
        values, source = sizes
        spans: list[Span] = [Prose("The model has symbolic dims and no value was given for them: the chart draws "
                                   "every layer at ")]
        for i, (s, v) in enumerate(values.items()):
            spans += [Prose(", ")] if i else []
            spans.append(Code(f"{names.get(s, s)}={v}"))
        spans.append(Prose(f" ({source}). The tables and hover labels give every byte count as an expression; give "
                           "--input-shape NAME=DIMS to draw your sizes."))
        notes.append(Note(tuple(spans), id="chart-sizes"))
    unknown = sum(1 for u in layers if u.before is None or u.after is None)
    if layers and unknown == len(layers) and doc.get("symbols"):
        spans = [Prose("No layer has a byte count at these shapes: the model has symbolic dims (")]
        for i, s in enumerate(sorted(doc["symbols"])):
            spans += [Prose(", ")] if i else []
            spans.append(Code(names.get(s, s)))
        spans.append(Prose(") without a value, so the bars are empty. The hover labels and the tables give every "
                           "byte count as an expression; give --input-shape NAME=DIMS to draw them."))
        notes.append(Note(tuple(spans)))
    elif unknown:
        notes.append(Note((Prose(f"{unknown} of {len(layers)} layers have an unknown size (drawn at zero; their hover "
                                 "label says unknown or gives the expression)."),)))
    return Chart(layers, _totals_bar(doc), caption, tuple(notes))


def _totals_bar(doc: Doc) -> TotalsBar | None:
    t = doc["totals"]
    before, after = t["before"]["total_bytes"], t["after"]["total_bytes"]
    if before is None or after is None:
        return None
    saved = before - after
    pct = 100.0 * saved / before if before else 0.0
    rt = doc.get("onnxruntime")
    beyond = saved_beyond_onnxruntime(doc) if rt and doc["fusions"] else None
    beyond_text = None if beyond is None or not rt else (f"saved {human_bytes(beyond)} beyond what onnxruntime "
                                                         f"{rt['installed']} makes itself at level {rt['level']}")
    return TotalsBar(before, after, beyond if beyond_text else None, beyond_text,
                     f"vs the graph as exported: after {human_bytes(after)} · saved {human_bytes(saved)} ({pct:.1f}%)",
                     f"the graph as exported: before {human_bytes(before)}", f"saved {human_bytes(saved)}")
