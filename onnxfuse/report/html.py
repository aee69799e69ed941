"""The memory-traffic report as one self-contained HTML page (``--format html``). Never prints.

The page is built from ``Report.to_dict()`` only (the JSON form, ``report.schema.json``), which it also embeds
unchanged in ``<script type="application/json" id="onnxfuse-report">``. It works offline: the charting library
(plotly.js, from the ``plotly`` Python package's ``get_plotlyjs()``) is inlined gzip-compressed and base64-encoded
(1.96 MB instead of 4.8 MB for plotly 7.1) and unpacked in the browser with the standard ``DecompressionStream``; a
Content-Security-Policy with ``default-src 'none'`` forbids every network request. Tables are plain HTML (they
read and print without JavaScript); a few lines of script make them sortable.

Bytes are shown as KiB/MiB/GiB (powers of 1024), as in the text report, charts included; hover labels add the
exact bytes. A byte count that is null in the JSON (unknown size, or a symbolic dim without a value) is shown as
"unknown", or as its ``*_expr`` expression (schema_version 2) when the JSON has one; its bar is drawn at zero.
"""

from __future__ import annotations

import base64
import functools
import gzip
import html

from onnxfuse.report import escape
from onnxfuse.report.escape import html_text as _e
from onnxfuse.report.escape import json_for_script as _json_for_script
from onnxfuse.report.present import (
    NOT_RUN_DETAIL,
    NOT_RUN_STATUS,
    bandwidth_line,
    bytes_of,
    chain,
    chart_sizes,
    dim_text,
    display_name,
    display_names,
    draw_at,
    headline,
    human_bytes,
    label,
    layer_units,
    made_by_onnxruntime,
    passes_text,
    saved_beyond_onnxruntime,
    sizes_label,
    target_providers,
    timing_text,
    verification_not_run,
)
from onnxfuse.report.remedies import remedy
from onnxfuse.report.schema import Doc

#: Chart trace names, one per kind of layer; the legend shows them, the tests look them up.
TRACE_BEFORE = "before: original nodes"
TRACE_AFTER = "after: unchanged node"
TRACE_FUSED = "after: fused group (hatched /)"
TRACE_UNFUSED = "after: in a pattern left unfused (dotted)"

#: Most node names listed in one hover label (the rest are counted).
HOVER_NODES = 8

#: Between the ops of a chain in the tables.
_ARROW = " → "


# ---------------------------------------------------------------------------------------------------------------
# Numbers


def _bytes_cell(obj: dict | None, key: str, doc: Doc | None = None) -> str:
    """A ``<td>`` for a byte count, sortable by its exact value (unknown sorts first), exact bytes on hover; an
    expression wraps (class ``expr``), long ones show their leading terms and open to the exact expression."""
    value = None if obj is None else obj.get(key)
    title = f' title="{value:,} bytes"' if value is not None else ""
    sort = value if value is not None else ""
    kind = _cell_class(obj or {}, key)
    return f'<td class="{kind}" data-value="{sort}"{title}>{_expression(obj, key, doc)}</td>'


def _expression(obj: dict | None, key: str, doc: Doc | None, fold: bool = True) -> str:
    """HTML of a byte figure: the number, an expression (folded past :data:`FOLD_CHARS` when ``fold``), or the
    leading terms of a long expression opening to the exact one."""
    exact, readable = bytes_of(obj, key, doc, exact=True), bytes_of(obj, key, doc)
    if readable == exact:
        return _folded(exact) if fold else html.escape(exact)
    return (f'<details class="fold"><summary>{html.escape(readable)}</summary>'
            f"<code>{html.escape(exact)}</code></details>")


#: Longer cell texts (byte expressions, symbolic shapes) are folded: the start shows, a click opens the rest.
FOLD_CHARS = 20


def _folded(text: str) -> str:
    """``text`` escaped, in a ``<details>`` showing its first :data:`FOLD_CHARS` characters when it is longer."""
    if len(text) <= FOLD_CHARS:
        return html.escape(text)
    return (f'<details class="fold"><summary>{html.escape(text[:FOLD_CHARS])}…</summary>'
            f"<code>{html.escape(text)}</code></details>")


def _cell_class(obj: dict, key: str) -> str:
    """``num``, or ``num expr`` (a cell that may wrap) when ``obj[key]`` is shown as an expression."""
    return "num" if obj.get(key) is not None or not obj.get(f"{key}_expr") else "num expr"


# ---------------------------------------------------------------------------------------------------------------
# Layers of the chart


def _short(text: str, limit: int = 48) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _hover(index: int, unit: dict) -> str:
    """Hover label of one bar (plotly renders <br> and <b>; everything else is escaped)."""
    nodes = unit["nodes"]
    kind = {"fused": f"fused group of {len(nodes)} nodes", "unfused": "in a pattern left unfused",
            "removed": "removed by a rewrite", "new": "added by a rewrite", "node": "unchanged"}[unit["kind"]]
    lines = [f"<b>layer {index}: {kind}</b>"]
    for n in nodes[:HOVER_NODES]:
        lines.append(html.escape(f"{n['op']} {_short(label(n))}"))
    if len(nodes) > HOVER_NODES:
        lines.append(f"… and {len(nodes) - HOVER_NODES} more")
    if unit["into"]:
        lines.append(html.escape(f"→ {unit['into']['op']} {_short(unit['into']['name'])}"))
    if unit["reason"]:
        lines.append(html.escape(f"reason: {unit['reason']}"))
    return "<br>".join(lines)


def _exact(obj: dict, key: str, doc: Doc | None = None) -> str:
    """Hover text of a byte count: KiB/MiB and the exact bytes, or the symbolic expression, or unknown; a number
    drawn at the chart's sizes (:func:`chart_sizes`) comes with its expression."""
    value = obj.get(key)
    expr = obj.get(f"{key}_expr")
    if value is not None and expr is not None and doc is not None and chart_sizes(doc) is not None:
        return (f"{human_bytes(value)} at the chart's sizes; "
                f"{html.escape(_short(bytes_of({key: None, f'{key}_expr': expr}, key, doc), 100))}")
    if value is not None:
        return f"{human_bytes(value)} ({value:,} B)"
    return html.escape(_short(bytes_of(obj, key, doc), 100))  # the tables give exact expressions


def chart_unit(largest: int | None) -> tuple[str, int]:
    """(name, bytes) of the power-of-1024 unit for an axis whose largest value is ``largest`` bytes."""
    name, size = "B", 1
    for candidate, candidate_size in (("KiB", 1024), ("MiB", 1024**2), ("GiB", 1024**3)):
        if largest is not None and largest >= candidate_size:
            name, size = candidate, candidate_size
    return name, size


def _scaled(value: int | None, size: int) -> float:
    """``value`` bytes in units of ``size``; 0 for an unknown size, so that the bar still has a hover label
    (plotly gives a null value none), which says unknown or gives the expression."""
    return 0 if value is None else value / size


def traffic_figure(units: list[dict], doc: Doc | None = None) -> dict:
    """The plotly figure (``data``, ``layout``) of bytes per layer: a wide light bar per layer for the original
    nodes and a narrow dark bar inside it for the optimized model, hatched for a fused group and dotted for a
    pattern left unfused, so that the kinds differ without colour. The x axis is the layer's position in
    execution order; a range slider zooms. Values are in the KiB/MiB/GiB unit that fits the largest layer."""
    known = [u[k] for u in units for k in ("before", "after") if u[k] is not None]
    unit_name, size = chart_unit(max(known, default=None))

    def trace(name: str, members: list[int], side: str, **style) -> dict:
        template = f"{side}: %{{customdata[1]}}" + ("<br>%{customdata[0]}" if side == "before" else "")
        return {"type": "bar", "name": name, "x": members, "y": [_scaled(units[i][side], size) for i in members],
                "customdata": [[_hover(i, units[i]), _exact(units[i], side, doc)] for i in members],
                "hovertemplate": template + "<extra></extra>", **style}

    everything = list(range(len(units)))
    by_kind: dict[str, list[int]] = {"plain": [], "fused": [], "unfused": []}
    for i, u in enumerate(units):
        by_kind[u["kind"] if u["kind"] in ("fused", "unfused") else "plain"].append(i)
    line = {"color": "#222222", "width": 0.5}
    data = [
        trace(TRACE_BEFORE, everything, "before", width=0.9, marker={"color": "#d4d4d4", "line": line}),
        trace(TRACE_AFTER, by_kind["plain"], "after", width=0.5, marker={"color": "#4d4d4d"}),
        trace(TRACE_FUSED, by_kind["fused"], "after", width=0.5,
              marker={"color": "#1f5fa8", "line": line,
                      "pattern": {"shape": "/", "bgcolor": "#bcd3ee", "fgcolor": "#1f5fa8", "size": 6,
                                  "solidity": 0.45}}),
        trace(TRACE_UNFUSED, by_kind["unfused"], "after", width=0.5,
              marker={"color": "#a34f00", "line": line,
                      "pattern": {"shape": ".", "bgcolor": "#f3d2b3", "fgcolor": "#a34f00", "size": 5,
                                  "solidity": 0.5}}),
    ]
    layout = {
        "barmode": "overlay", "hovermode": "x unified", "height": 460, "margin": {"l": 70, "r": 20, "t": 10, "b": 40},
        "font": {"family": "system-ui, sans-serif", "size": 12},
        "legend": {"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 0},
        "xaxis": {"title": {"text": "layer, in execution order (drag the slider or across the plot to zoom)"},
                  "rangeslider": {"visible": True, "thickness": 0.08}, "range": [-0.5, len(units) - 0.5]},
        "yaxis": {"title": {"text": f"{unit_name} moved (read + written)" if known else "bytes unknown at these "
                            "shapes (hover for expressions)"}, "fixedrange": True, "rangemode": "tozero",
                  "showticklabels": bool(known)},
        "plot_bgcolor": "#ffffff",
    }
    return {"data": data, "layout": layout}


def totals_figure(totals: dict, doc: Doc | None = None) -> dict | None:
    """A horizontal bar of bytes before and after against the graph as exported, with the saved bytes hatched
    beside the after bar, and above them (with the report ``doc``) the bar the page leads with: the bytes saved
    beyond what onnxruntime makes itself at load (``present.saved_beyond_onnxruntime``). None when either total
    is unknown."""
    before, after = totals["before"].get("total_bytes"), totals["after"].get("total_bytes")
    if before is None or after is None:
        return None
    saved = before - after
    percent = 100.0 * saved / before if before else 0.0
    unit_name, size = chart_unit(max(before, after))
    rt = (doc or {}).get("onnxruntime")
    beyond = saved_beyond_onnxruntime(doc) if doc is not None and rt and doc["fusions"] else None
    lead = []
    if beyond is not None and rt is not None:
        lead = [{"type": "bar", "orientation": "h", "name": "saved beyond onnxruntime", "y": ["beyond onnxruntime"],
                 "x": [max(beyond, 0) / size], "text": [f"saved {human_bytes(beyond)} beyond what onnxruntime "
                                                        f"{rt['installed']} makes itself at level {rt['level']}"],
                 "textposition": "outside", "cliponaxis": False, "customdata": [f"{beyond:,} B"],
                 "marker": {"color": "#1f5fa8", "line": {"color": "#1f5fa8", "width": 1},
                            "pattern": {"shape": "/", "bgcolor": "#bcd3ee", "fgcolor": "#1f5fa8", "size": 6}},
                 "hovertemplate": "%{text} (%{customdata})<extra></extra>"}]
    data = [
        *lead,
        {"type": "bar", "orientation": "h", "name": "moved", "y": ["after", "before"],
         "x": [after / size, before / size],
         "text": [f"vs the graph as exported: after {human_bytes(after)} · saved {human_bytes(saved)} "
                  f"({percent:.1f}%)", f"the graph as exported: before {human_bytes(before)}"],
         "textposition": "inside", "insidetextanchor": "start", "marker": {"color": "#4d4d4d"},
         "textfont": {"color": "#ffffff"}, "customdata": [f"{after:,} B", f"{before:,} B"],
         "hovertemplate": "%{text} (%{customdata})<extra></extra>"},
        {"type": "bar", "orientation": "h", "name": "saved (hatched)", "y": ["after"], "x": [max(saved, 0) / size],
         "customdata": [f"saved {human_bytes(saved)} ({saved:,} B)"],
         "marker": {"color": "#ffffff", "line": {"color": "#1f5fa8", "width": 1},
                    "pattern": {"shape": "/", "bgcolor": "#ffffff", "fgcolor": "#1f5fa8", "size": 6}},
         "hovertemplate": "%{customdata}<extra></extra>"},
    ]
    layout = {"barmode": "stack", "height": 190 if lead else 150, "margin": {"l": 20, "r": 20, "t": 5, "b": 40},
              "showlegend": False, "font": {"family": "system-ui, sans-serif", "size": 12},
              "xaxis": {"title": {"text": unit_name}, "fixedrange": True},
              "yaxis": {"fixedrange": True, "showticklabels": False, "categoryorder": "array",
                        "categoryarray": ["after", "before", "beyond onnxruntime"]},
              "plot_bgcolor": "#ffffff"}
    return {"data": data, "layout": layout}


# ---------------------------------------------------------------------------------------------------------------
# Page


@functools.lru_cache(maxsize=1)
def plotly_js_gzip_base64() -> str:
    """plotly.js (from the ``plotly`` package, ``plotly.offline.get_plotlyjs()``) gzip-compressed (level 9,
    mtime 0 so the page is reproducible) and base64-encoded."""
    from plotly.offline import get_plotlyjs

    return base64.b64encode(gzip.compress(get_plotlyjs().encode("utf-8"), compresslevel=9, mtime=0)).decode()


def _shapes_html(doc: Doc) -> str:
    parts = [f"<code>{_e(k)}</code> = {_e('x'.join(map(str, v)))}" for k, v in doc["input_shapes"].items()]
    for u in doc.get("unknown_shapes") or []:
        dims = ", ".join(map(str, u.get("shape") or []))
        parts.append(f"<code>{_e(u['input'])}</code> = [{_e(dims)}] (symbolic)")
    text = "; ".join(parts) or "as stored in the model"
    symbols = doc.get("symbols") or {}
    if symbols:
        names = display_names(doc)  # one name per dim, as in every other view
        text += "<br>symbols: " + "; ".join(
            f"<code>{_e(names.get(s, s))}</code> = {_e(v.get('input'))}[{_e(v.get('axis'))}]"
            + (f" ({_e(v['dim_param'])})" if v.get("dim_param") and v["dim_param"] != names.get(s, s) else "")
            for s, v in sorted(symbols.items()))
    values = doc.get("symbol_values") or {}
    if values:
        names = display_names(doc)
        text += "<br>symbol values: " + ", ".join(f"<code>{_e(names.get(k, k))}</code> = {_e(v)}"
                                                  for k, v in sorted(values.items()))
    return text


def _verification_html(doc: Doc) -> str:
    """Status, its summary (or the reason it was skipped), and each output's errors against its tolerance."""
    v = doc["verification"] or {}
    status = v.get("status", "unknown")
    if verification_not_run(doc):
        return f'<span class="status" id="verification-status">{_e(NOT_RUN_STATUS)}</span> ({_e(NOT_RUN_DETAIL)})'
    out = [f'<span class="status status-{_e(status)}" id="verification-status">{_e(status)}</span>']
    if v.get("reason"):
        out.append(f" ({_e(v['reason'])})")
    if v.get("summary"):
        out.append(f" {_e(v['summary'])}")
    elif v.get("max_abs_error") is not None:
        out.append(f"; max abs error {v['max_abs_error']:.3g}, max rel error {v.get('max_rel_error') or 0:.3g}")
    outputs = v.get("outputs") or []
    if outputs:
        columns = [("max abs error", "max_abs_error"), ("max rel error", "max_rel_error"),
                   ("tolerance", "tolerance"), ("atol", "atol"), ("rtol", "rtol")]
        columns = [c for c in columns if any(o.get(c[1]) is not None for o in outputs)]
        rows = "".join(
            f"<tr><td><code>{_e(o.get('name'))}</code></td><td>{_e(o.get('dtype'))}</td>"
            + "".join(f"<td class=num>{_num(o.get(key))}</td>" for _, key in columns)
            + f"<td>{'pass' if o.get('passed') else 'FAIL'}</td></tr>" for o in outputs)
        rule = f" (rule {_e(v['rule'])})" if v.get("rule") else ""
        out.append('<div class="scroll"><table class="compact"><thead><tr><th>output</th><th>dtype</th>'
                   + "".join(f"<th>{title}</th>" for title, _ in columns)
                   + f"<th>within tolerance{rule}</th></tr></thead><tbody>{rows}</tbody></table></div>")
    return "".join(out)


def _num(x: float | None) -> str:
    return "unknown" if x is None else f"{x:.3g}"


def _headline_html(doc: Doc) -> str:
    """The summary lines of the text report (``present.headline``): the traffic and saved expressions, the share
    as the dims grow, the figures at the shapes used, unknowns and why."""
    return ('<ul class="headline">' + "".join(f"<li>{_e(line)}</li>" for line in headline(doc, plain=escape.text))
            + "</ul>")


def _totals_html(doc: Doc) -> str:
    t = doc["totals"]
    rows = []
    for side in ("before", "after"):
        s = t[side]
        rows.append(f'<tr><th scope="row">{side}</th>{_bytes_cell(s, "read_bytes", doc)}'
                    f'{_bytes_cell(s, "written_bytes", doc)}'
                    f'<td class="{_cell_class(s, "total_bytes")}" id="total-{side}" '
                    f'data-bytes="{_e(s.get("total_bytes"))}">'
                    f"<b>{_expression(s, 'total_bytes', doc, fold=False)}</b></td>"
                    f"<td class=num>{_e(s.get('nodes'))}</td>"
                    f"<td class=num>{_e(s.get('unknown_nodes'))}</td></tr>")
    pct = t.get("saved_percent")
    pct_text = f" ({pct:.1f}%)" if pct is not None else ""
    rt = doc.get("onnxruntime")
    if rt:  # the figure every view leads with, first (0 B when nothing was fused); the exported-graph one beside it
        beyond = saved_beyond_onnxruntime(doc)
        text = (human_bytes(beyond) + sizes_label(doc, escape.text) if beyond is not None else
                "not compared" if rt["status"] != "compared" else bytes_of(rt, "saved_bytes_beyond", doc))
        rows.insert(0, f'<tr><th scope="row">saved beyond onnxruntime {_e(rt["installed"])} at level '
                       f'{_e(rt["level"])}</th><td></td><td></td><td class="num" id="total-saved-beyond" '
                       f'data-bytes="{_e(beyond)}"><b>{_e(text)}</b></td><td></td><td></td></tr>')
    rows.append('<tr><th scope="row">saved vs the graph as exported</th><td></td><td></td>'
                f'<td class="{_cell_class(t, "saved_bytes")}" '
                'id="total-saved" '
                f'data-bytes="{_e(t.get("saved_bytes"))}">'
                f'<b>{_expression(t, "saved_bytes", doc, fold=False)}{pct_text}</b>'
                "</td><td></td><td></td></tr>")
    return ('<div class="scroll"><table class="totals"><thead><tr><th></th><th>read</th><th>written</th>'
            "<th>total</th><th>nodes</th>"
            f"<th>unknown nodes</th></tr></thead><tbody>{''.join(rows)}</tbody></table></div>")


def _sortable(table_id: str, columns: list[tuple[str, str]], rows: list[str], empty: str) -> str:
    """A table sortable by clicking a header button; ``columns`` are (title, "num" or "text")."""
    if not rows:
        return f"<p>{_e(empty)}</p>"
    head = "".join(f'<th data-type="{kind}" aria-sort="none"><button type="button">{_e(title)}'
                   '<span class="arrow" aria-hidden="true"></span></button></th>' for title, kind in columns)
    return (f'<div class="scroll"><table class="sortable" id="{table_id}"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table></div>")


def _fusion_rows(doc: Doc) -> list[str]:
    rows = []
    for f in doc["fusions"]:
        names = ", ".join(label(n) for n in f["replaced"])
        dims = [dim_text(d, doc) for d in f["shape"]] if f.get("shape") else None
        shape = ("unknown" if dims is None else "x".join(dims) if all(d.isdigit() for d in dims)
                 else f"[{', '.join(dims)}]")
        output = f"{shape} {f.get('dtype') or ''}"
        saved = _bytes_cell(f, "saved_bytes", doc)
        if f.get("saved_bytes") is None and f.get("unknown_reason"):
            saved = saved.replace("<td ", f'<td title="{_e(f["unknown_reason"])}" ', 1)
        rows.append(f"<tr><td><code>{_e(f['node'])}</code></td><td>{_e(f['op'])}</td>"
                    f'<td title="{_e(names)}">{_e(chain(f["replaced"], _ARROW))}</td>'
                    f'<td>{_e(f.get("activation") or "")}</td>'
                    f"<td>{_e(passes_text(f.get('passes') or []))}</td><td class=\"shape\">{_e(output)}"
                    f"</td>{_bytes_cell(f, 'bytes_before', doc)}{_bytes_cell(f, 'bytes_after', doc)}"
                    f"{saved}<td>{made_by_onnxruntime(f)}</td></tr>")
    return rows


def _unfused_rows(doc: Doc) -> list[str]:
    rows = []
    for u in doc["unfused"]:
        first = label(u["nodes"][0]) if u["nodes"] else ""
        rows.append(f"<tr><td><code>{_e(first)}</code></td><td>{_e(chain(u['nodes'], _ARROW))}</td>"
                    f"<td>{_e(u.get('pass') or '')}</td><td><code>{_e(u['reason'])}</code></td>"
                    f"<td>{_e(u.get('detail') or '')}</td>{_bytes_cell(u, 'bytes', doc)}"
                    f"<td>{_e(remedy(u, doc['target']))}</td></tr>")
    return rows


def _other_html(doc: Doc) -> str:
    stats = "".join(
        f"<tr><td>{_e(s['name'])}</td><td class=num>{_e(s['applied'])}</td><td>"
        f"{_e(', '.join(f'{k} {v}' for k, v in s['skipped'].items()) or '-')}</td></tr>" for s in doc["pass_stats"])
    ops = doc["op_counts"]
    op_rows = "".join(f"<tr><td>{_e(op)}</td><td class=num>{ops['before'].get(op, 0)}</td>"
                      f"<td class=num>{ops['after'].get(op, 0)}</td></tr>"
                      for op in sorted(set(ops["before"]) | set(ops["after"])))
    return ('<div class="two"><div><h3>Passes</h3><table class="compact"><thead><tr><th>pass</th><th>rewrites</th>'
            f"<th>skipped by reason</th></tr></thead><tbody>{stats}</tbody></table></div>"
            '<div><h3>Nodes by op type</h3><table class="compact"><thead><tr><th>op</th><th>before</th>'
            f"<th>after</th></tr></thead><tbody>{op_rows}</tbody></table></div></div>")


def _unknown_html(doc: Doc) -> str:
    """The nodes of the optimized model whose traffic is unknown, with their tensors and (schema 2) the reason."""
    rows = "".join(
        f"<tr><td><code>{_e(u.get('node') or u.get('output'))}</code></td><td>{_e(u.get('op'))}</td>"
        f"<td>{_e(', '.join(u.get('tensors') or []))}</td><td>{_e(u.get('reason') or '')}</td></tr>"
        for u in doc.get("unknown_nodes") or [])
    if not rows:
        return ""
    return (f'<section id="unknown-section"><h2>Nodes of unknown size ({len(doc["unknown_nodes"])})</h2>'
            "<p>Left out of every total: the size of a tensor they read or write is not known.</p>"
            '<table class="compact"><thead><tr><th>node</th><th>op</th><th>tensors of unknown size</th>'
            f"<th>why</th></tr></thead><tbody>{rows}</tbody></table></section>")


def _notes_html(doc: Doc, units: list[dict]) -> str:
    notes = [f'<p class="warning"><b>Warning:</b> {_e(w)}</p>' for w in doc.get("warnings") or []]
    if doc.get("unknown_shapes"):
        notes.append('<p class="warning"><b>Unknown shapes:</b> give <code>--input-shape</code> for '
                     + ", ".join(f"<code>{_e(u['input'])}</code>" for u in doc["unknown_shapes"])
                     + " to count every byte.</p>")
    if doc.get("subgraph_nodes"):
        notes.append(f"<p>{_e(doc['subgraph_nodes'])} nodes inside If/Loop/Scan bodies are counted once each.</p>")
    b = doc.get("bandwidth")
    if b:  # the one sentence of every format (present.bandwidth_line), in the same units
        line = bandwidth_line(b)
        notes.append(f'<p id="bandwidth">{_e(line[0].upper() + line[1:])}.</p>')
    assumptions = doc.get("shape_assumptions") or []
    if assumptions:
        notes.append(f"<details><summary>{len(assumptions)} assumptions about the symbolic dims</summary><ul>"
                     + "".join(f"<li><code>{_e(a)}</code></li>" for a in assumptions) + "</ul></details>")
    sizes = chart_sizes(doc)
    if sizes is not None:
        values, source = sizes
        notes.append('<p class="note" id="chart-sizes">The model has symbolic dims and no value was given for them: '
                     "the chart draws every layer at " + ", ".join(
                         f"<code>{_e(display_name(doc, s))}={v}</code>" for s, v in values.items())
                     + f" ({_e(source)}). The tables and hover labels give every byte count as an expression; "
                     "give <code>--input-shape NAME=DIMS</code> to draw your sizes.</p>")
    unknown = sum(1 for u in units if u["before"] is None or u["after"] is None)
    if units and unknown == len(units) and doc.get("symbols"):
        notes.append("<p>No layer has a byte count at these shapes: the model has symbolic dims ("
                     + ", ".join(f"<code>{_e(s)}</code>" for s in sorted(doc["symbols"]))
                     + ") without a value, so the bars are empty. The hover labels and the tables give every byte "
                     "count as an expression; give <code>--input-shape NAME=DIMS</code> to draw them.</p>")
    elif unknown:
        notes.append(f"<p>{unknown} of {len(units)} layers have an unknown size "
                     "(drawn at zero; their hover label says unknown or gives the expression).</p>")
    return "".join(notes)


def _profile_html(doc: Doc) -> str:
    """The "Measured in onnxruntime" panel of a report made with ``--profile``: per op, the kernels, time and the
    bytes onnxruntime's profiler records for the original and the optimized model, with bars to compare beside
    the counted traffic; per fusion, the kernel that computes it. Empty without a ``profile`` section."""
    p = doc.get("profile")
    if not p:
        return ""
    o, a = p["original"], p["optimized"]

    def total(row: dict | None) -> int:
        return 0 if row is None else row["output_bytes"] + row["activation_bytes"] + row["parameter_bytes"]

    ops = list(dict.fromkeys([*o["by_op"], *a["by_op"]]))
    largest = max([total(side["by_op"].get(op)) for side in (o, a) for op in ops] + [1])
    rows = []
    for op in ops:
        before, after = o["by_op"].get(op), a["by_op"].get(op)
        bars = "".join(f'<div class="mbar {cls}" style="width:{100 * total(row) / largest:.1f}%"></div>'
                       for cls, row in (("before", before), ("after", after)))
        rows.append(f"<tr><td><code>{_e(op)}</code></td><td class=\"num\">{before['kernels'] if before else 0} / "
                    f"{after['kernels'] if after else 0}</td><td class=\"num\">"
                    f"{before['ms'] if before else 0:.3f} / {after['ms'] if after else 0:.3f}</td>"
                    f"<td class=\"num\">{_e(human_bytes(total(before)))} / {_e(human_bytes(total(after)))}</td>"
                    f'<td class="bars">{bars}</td></tr>')
    fusion_rows = [f"<tr><td><code>{_e(f['node'])}</code></td><td>{_e(f['replaced'])}</td>"
                   f"<td><code>{_e(f['kernel'] or '-')}</code></td><td class=\"num\">"
                   f"{'-' if f['ms'] is None else format(f['ms'], '.3f')}</td><td class=\"num\">"
                   f"{_e(human_bytes(f['total_bytes']))}</td><td class=\"num\">"
                   f"{_e(human_bytes(f['counted_saved_bytes']))}</td></tr>" for f in p["by_fusion"]]
    shapes = ", ".join(f"{k}={'x'.join(map(str, v)) or 'scalar'}" for k, v in p["input_shapes"].items())
    timing = timing_text(p)
    return (
        '<section id="profile"><h2>Measured in onnxruntime</h2>'
        + (f'<p id="profile-timing"><b>{_e(timing)}</b>. The per-kernel times below are one profiled run each and '
           "carry no interval: quote this line.</p>" if timing else "")
        + f"<p>Both models run under onnxruntime's profiler at level <code>{_e(p['level'])}</code>, "
        f"{_e(p['threads'])} thread(s), on the same inputs ({_e(shapes)}); time is the median of {p['runs']} runs "
        f"per kernel, bytes are what the profiler records per kernel (outputs written, activations and parameters "
        f"read): original {o['kernels']} kernels, {o['total_ms']:.3f} ms, {_e(human_bytes(o['total_bytes']))}; "
        f"optimized {a['kernels']} kernels, {a['total_ms']:.3f} ms, {_e(human_bytes(a['total_bytes']))}. They "
        "differ from the counted traffic above where onnxruntime changes the layout (NCHWc reorders) or fuses "
        "more itself.</p>"
        '<div class="scroll"><table id="profile-ops"><thead><tr><th>op</th><th>kernels (original / optimized)'
        "</th><th>ms</th><th>measured bytes</th><th>original (light) / optimized (dark)</th></tr></thead><tbody>"
        + "".join(rows) + "</tbody></table></div>"
        + ('<div class="scroll"><table id="profile-fusions"><thead><tr><th>fusion</th><th>replaced</th>'
           "<th>kernel that computes it</th><th>ms</th><th>measured bytes</th><th>saved (counted)</th></tr></thead>"
           "<tbody>" + "".join(fusion_rows) + "</tbody></table></div>" if fusion_rows else "")
        + "</section>")


def to_html(doc: Doc) -> str:
    """The self-contained HTML page (UTF-8 text, about 2 MB) for the report ``doc``: the dict of
    ``Report.to_dict()``, schema_version 2.

    Raises:
        KeyError: ``doc`` lacks a field that ``report.schema.json`` requires.
    """
    m, t = doc["model"], doc["totals"]
    units = layer_units(doc)
    sizes = chart_sizes(doc)
    if sizes is not None:
        draw_at(units, sizes[0])
    constants = sum(1 for r in doc["nodes"]["before"] if r["op"] == "Constant")
    fused_units = sum(1 for u in units if u["kind"] == "fused")
    totals_fig = totals_figure(t, doc)
    figures = {"traffic": traffic_figure(units, doc), "totals": totals_fig}
    header = (
        "<h1>onnxfuse memory-traffic report</h1>"
        '<dl class="meta">'
        f'<dt>model</dt><dd><code id="model-path">{_e(m["path"])}</code> · {_e(human_bytes(m.get("file_bytes")))}'
        f"{' · external data' if m.get('external_data') else ''}</dd>"
        f'<dt>sha256</dt><dd><code id="model-sha256">{_e(m["sha256"])}</code></dd>'
        f"<dt>target</dt><dd><code>{_e(doc['target'])}</code> ({_e(target_providers(doc))})</dd>"
        f"<dt>input shapes</dt><dd>{_shapes_html(doc)}</dd>"
        f"<dt>verification</dt><dd>{_verification_html(doc)}</dd>"
        f"<dt>onnxfuse</dt><dd>{_e(doc['onnxfuse_version'])} · passes {_e(', '.join(doc['passes']))}</dd>"
        "</dl>"
    )
    fusion_table = _sortable(
        "fusions", [("node", "text"), ("op", "text"), ("replaced", "text"), ("activation", "text"),
                    ("passes", "text"), ("output", "text"), ("bytes before", "num"), ("bytes after", "num"),
                    ("saved", "num"), ("onnxruntime makes it too", "text")], _fusion_rows(doc),
        "No pattern was fused.")
    unfused_table = _sortable(
        "unfused", [("first node", "text"), ("pattern", "text"), ("pass", "text"), ("reason", "text"),
                    ("detail", "text"), ("would save", "num"), ("what would allow it", "text")],
        _unfused_rows(doc), "No pattern was left unfused.")
    body = (
        f"<header>{header}</header>"
        f"<section id=\"totals\"><h2>Totals (bytes moved to and from device memory)</h2>{_headline_html(doc)}"
        f"{_totals_html(doc)}"
        + ('<div id="totals-chart" class="chart" role="img" aria-label="bar: bytes before and after, saved bytes '
           'hatched"></div>' if totals_fig else "")
        + f"{_notes_html(doc, units)}</section>"
        '<section id="traffic"><h2>Traffic per layer</h2>'
        f"<p>{len(units)} layers in execution order: {fused_units} fused groups (one bar each, hatched), the other "
        f"nodes one bar each; {constants} Constant nodes move nothing and are not drawn. The light bar is the "
        "original model, the dark bar inside it the optimized one. Hover a bar for its nodes; drag the slider "
        "below the chart or drag across the plot to zoom, double-click to reset.</p>"
        '<div id="traffic-chart" class="chart" role="img" aria-label="bar chart of bytes moved per layer, before '
        'and after fusion"></div><p class="nochart" hidden>The chart needs a browser with DecompressionStream '
        "(Chromium 80, Firefox 113, Safari 16.4 or later); the tables below hold the same figures.</p></section>"
        f"{_profile_html(doc)}"
        f'<section id="fusions-section"><h2>Fusions applied ({len(doc["fusions"])})</h2>{fusion_table}</section>'
        f'<section id="unfused-section"><h2>Left unfused ({len(doc["unfused"])})</h2>'
        "<p>Each pattern a pass found but declined, with the reason, the bytes one fused node would save, and what "
        f"option or target would allow it.</p>{unfused_table}</section>"
        f"{_unknown_html(doc)}"
        f'<section id="other"><h2>Passes and op types</h2>{_other_html(doc)}</section>'
    )
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; script-src 'unsafe-inline' "
        "'unsafe-eval'; style-src 'unsafe-inline'; img-src data:; font-src data:\">"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>onnxfuse report: {_e(m['path'])}</title><style>{_CSS}</style></head><body>{body}"
        f'<script type="application/json" id="onnxfuse-report">{_json_for_script(doc)}</script>'
        f'<script type="application/json" id="onnxfuse-figures">{_json_for_script(figures)}</script>'
        f'<script type="application/octet-stream" id="plotly-gzip-base64">{plotly_js_gzip_base64()}</script>'
        f"<script>{_JS}</script></body></html>\n"
    )


_CSS = """
body { font-family: system-ui, sans-serif; color: #111; background: #fff; margin: 1.5rem auto; max-width: 1400px;
       padding: 0 1rem; line-height: 1.4; }
h1 { font-size: 1.3rem; word-break: break-all; } h2 { font-size: 1.15rem; margin-top: 2rem; }
h3 { font-size: 1rem; }
code { font-family: ui-monospace, monospace; font-size: 0.92em; overflow-wrap: anywhere; }
dl.meta { display: grid; grid-template-columns: max-content 1fr; gap: 0.2rem 1rem; margin: 0; }
dl.meta dt { font-weight: 600; } dl.meta dd { margin: 0; }
table { border-collapse: collapse; margin: 0.5rem 0; font-size: 0.9rem; }
th, td { border: 1px solid #bbb; padding: 0.2rem 0.45rem; text-align: left; vertical-align: top; }
td.num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
td.expr { white-space: normal; text-align: left; overflow-wrap: break-word; max-width: 30rem;
          font-family: ui-monospace, monospace; font-size: 0.85em; }
details.fold summary { cursor: pointer; overflow-wrap: break-word; }
td details.fold { min-width: 18ch; }
details.fold code { white-space: normal; overflow-wrap: anywhere; }
thead th { background: #eee; }
th button { all: unset; cursor: pointer; display: block; width: 100%; }
th button:focus-visible { outline: 2px solid #000; }
th[aria-sort="ascending"] .arrow::after { content: " ▲"; }
th[aria-sort="descending"] .arrow::after { content: " ▼"; }
th[aria-sort="none"] .arrow::after { content: " ↕"; color: #777; }
.status { font-weight: 700; padding: 0 0.3rem; border: 1px solid #000; }
.status-passed::before { content: "✓ "; } .status-failed::before { content: "✗ "; }
.status-skipped::before { content: "\\2013  "; } .status-failed { background: #fdd; }
.warning { border-left: 4px solid #000; padding-left: 0.5rem; }
.scroll { overflow-x: auto; } .chart { width: 100%; }
td.bars { min-width: 12rem; } .mbar { height: 0.45rem; margin: 0.1rem 0; }
.mbar.before { background: #c8c8c8; } .mbar.after { background: #4d4d4d; }
td.shape { white-space: nowrap; font-family: ui-monospace, monospace; font-size: 0.85em; }
table.sortable td { min-width: 4ch; } td.expr { min-width: 14ch; }
@media (max-width: 900px) { body { padding: 0 0.5rem; } table { font-size: 0.82rem; } }
.two { display: flex; gap: 2rem; flex-wrap: wrap; }
table.sortable td:first-child { min-width: 9rem; } #unfused td:nth-child(4) { min-width: 11rem; }
#unfused td:nth-child(5) { max-width: 36rem; }
@media print {
  body { max-width: none; margin: 0; font-size: 10pt; }
  th button .arrow, .rangeslider-container, .modebar-container { display: none !important; }
  .scroll { overflow: visible; } section { break-inside: auto; } tr, .chart { break-inside: avoid; }
  thead { display: table-header-group; } h2 { break-after: avoid; }
}
"""

_JS = r"""
"use strict";
(function () {
  function sortBy(table, th, index) {
    const numeric = th.dataset.type === "num";
    const ascending = th.getAttribute("aria-sort") !== "ascending";
    for (const other of table.tHead.rows[0].cells) other.setAttribute("aria-sort", "none");
    th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
    const body = table.tBodies[0];
    const key = (row) => {
      const cell = row.cells[index];
      if (!numeric) return cell.textContent.trim().toLowerCase();
      return cell.dataset.value === "" ? -Infinity : Number(cell.dataset.value);
    };
    const rows = Array.from(body.rows).sort((a, b) => {
      const x = key(a), y = key(b);
      return (x < y ? -1 : x > y ? 1 : 0) * (ascending ? 1 : -1);
    });
    for (const row of rows) body.appendChild(row);
  }
  for (const table of document.querySelectorAll("table.sortable")) {
    Array.from(table.tHead.rows[0].cells).forEach((th, index) => {
      th.querySelector("button").addEventListener("click", () => sortBy(table, th, index));
    });
  }

  window.addEventListener("beforeprint", () => {
    for (const d of document.querySelectorAll("details")) d.open = true;
  });

  async function loadPlotly() {
    const packed = document.getElementById("plotly-gzip-base64").textContent;
    const bytes = Uint8Array.from(atob(packed), (c) => c.charCodeAt(0));
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    const code = await new Response(stream).text();
    (0, eval)(code);
  }

  async function draw() {
    const figures = JSON.parse(document.getElementById("onnxfuse-figures").textContent);
    if (typeof DecompressionStream === "undefined") {
      document.querySelector(".nochart").hidden = false;
      return;
    }
    await loadPlotly();
    const config = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["select2d", "lasso2d"] };
    const plots = [];
    for (const [name, fig] of Object.entries(figures)) {
      const div = document.getElementById(name + "-chart");
      if (fig && div) plots.push(Plotly.newPlot(div, fig.data, fig.layout, config));
    }
    await Promise.all(plots);
    document.body.dataset.chartsReady = "true";
  }
  draw().catch((err) => { console.error("onnxfuse report: " + err); });
})();
"""
