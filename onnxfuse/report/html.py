"""The memory-traffic report as one self-contained HTML page (``--format html``). Draws the one document of
``onnxfuse.report.present.document`` (``onnxfuse.report.document``) and reads nothing else; never prints.

The page embeds the report's JSON form (``Document.data``, ``report.schema.json``) unchanged in
``<script type="application/json" id="onnxfuse-report">``. It works offline: the charting library (plotly.js, from
the ``plotly`` Python package's ``get_plotlyjs()``) is inlined gzip-compressed and base64-encoded (1.96 MB instead
of 4.8 MB for plotly 7.1) and unpacked in the browser with the standard ``DecompressionStream``; a
Content-Security-Policy with ``default-src 'none'`` forbids every network request. Tables are plain HTML (they
read and print without JavaScript); a few lines of script make the fusion and unfused tables sortable.

Bytes are shown as KiB/MiB/GiB (powers of 1024), as in the text report, charts included; hover labels add the
exact bytes. A byte count the report does not know as a number is shown as its expression, or "unknown"; its
bar is drawn at zero.
"""

from __future__ import annotations

import base64
import functools
import gzip
from typing import TYPE_CHECKING

from onnxfuse.report.document import (
    Bars,
    Bytes,
    Cell,
    Code,
    Column,
    Document,
    Layer,
    Name,
    Note,
    Num,
    Prose,
    Section,
    Sentence,
    Span,
    TotalsBar,
)
from onnxfuse.report.escape import html_text as _e
from onnxfuse.report.escape import json_for_script as _json_for_script
from onnxfuse.report.escape import text as _plain

if TYPE_CHECKING:
    from onnxfuse.report.schema import Doc, SupportsToDict

#: Chart trace names, one per kind of layer; the legend shows them, the tests look them up.
TRACE_BEFORE = "before: original nodes"
TRACE_AFTER = "after: unchanged node"
TRACE_FUSED = "after: fused group (hatched /)"
TRACE_UNFUSED = "after: in a pattern left unfused (dotted)"

#: Most node names listed in one hover label (the rest are counted).
HOVER_NODES = 8

#: Longer cell texts (byte expressions) are folded: the start shows, a click opens the rest.
FOLD_CHARS = 20


# ---------------------------------------------------------------------------------------------------------------
# Text


def _span(s: Span) -> str:
    if isinstance(s, Prose):
        return _e(s.text)
    if isinstance(s, Name):
        return _e(_plain(s.text))
    if isinstance(s, Code):
        return f"<code>{_e(_plain(s.text))}</code>"
    status = _plain(s.text)
    return f'<span class="status status-{_e(status.replace(" ", "-"))}" id="verification-status">{_e(status)}</span>'


def _line(spans: Sentence) -> str:
    return "".join(_span(s) for s in spans)


def _folded(text: str) -> str:
    """``text`` escaped, in a ``<details>`` showing its first :data:`FOLD_CHARS` characters when it is longer."""
    if len(text) <= FOLD_CHARS:
        return _e(text)
    return f'<details class="fold"><summary>{_e(text[:FOLD_CHARS])}…</summary><code>{_e(text)}</code></details>'


def _bytes(c: Bytes, fold: bool = True) -> str:
    """A byte figure: the number, an expression (folded past :data:`FOLD_CHARS` when ``fold``), or the leading terms
    of a long expression opening to the exact one."""
    text = _plain(c.text)
    if c.exact is not None:
        body = (f'<details class="fold"><summary>{_e(text)}</summary><code>{_e(_plain(c.exact))}</code>'
                "</details>")
    else:
        body = _folded(text) if fold else _e(text)
    return body + _e(_plain(c.suffix))


def _td(c: Cell, column: Column, anchor_bold: bool = False) -> str:
    if isinstance(c, Bytes):
        kind = "num" if c.expr is None else "num expr"
        sort = c.number if c.number is not None else (c.sort if c.expr is not None else "")
        title = f"{c.number:,} bytes" if c.number is not None else c.why or ""
        anchor = f' id="{_e(c.anchor)}" data-bytes="{_e("" if c.number is None else c.number)}"' if c.anchor else ""
        body = _bytes(c, fold=not c.anchor)
        if c.anchor and anchor_bold:
            body = f"<b>{body}</b>"
        return (f'<td class="{kind}" data-value="{_e(sort)}"' + (f' title="{_e(_plain(title))}"' if title else "")
                + f"{anchor}>{body}</td>")
    if isinstance(c, Num):
        return f'<td class="num" data-value="{_e("" if c.value is None else c.value)}">{_e(c.text)}</td>'
    if isinstance(c, Bars):
        bars = "".join(f'<div class="mbar {cls}" style="width:{100 * f:.1f}%"></div>'
                       for cls, f in zip(("before", "after"), c.fractions, strict=False))
        return f'<td class="bars">{bars}</td>'
    body = _line(c) if isinstance(c, tuple) else _span(c)
    return f'<td class="num">{body}</td>' if column.numeric else f"<td>{body}</td>"


def _note(n: Note) -> str:
    ident = f' id="{_e(n.id)}"' if n.id else ""
    if n.warning:
        return f'<p class="warning"{ident}><b>Warning:</b> {_line(n.sentence)}</p>'
    return f"<p{ident}>{_line(n.sentence)}</p>"


def _table(section: Section) -> str:
    if not section.columns:
        return ""
    if section.sortable:
        head = "".join(f'<th data-type="{"num" if c.numeric else "text"}" aria-sort="none"><button type="button">'
                       f'{_e(c.title)}<span class="arrow" aria-hidden="true"></span></button></th>'
                       for c in section.columns)
    else:
        head = "".join(f"<th>{_e(c.title)}</th>" for c in section.columns)
    rows = "".join("<tr>" + "".join(_td(c, col, section.id == "totals") for c, col in
                                    zip(row, section.columns, strict=True)) + "</tr>" for row in section.rows)
    cls = "sortable" if section.sortable else "compact"
    return (f'<div class="scroll"><table class="{cls}" id="{_e(section.id)}"><thead><tr>{head}</tr></thead>'
            f"<tbody>{rows}</tbody></table></div>")


def _section(section: Section, extra: str = "") -> str:
    hidden = f"<p>{section.hidden} {_e(section.hidden_note)}.</p>" if section.hidden else ""
    return (f'<section id="{_e(section.id)}-section"><h2>{_e(section.title)}</h2>'
            + "".join(_note(n) for n in section.lead) + _table(section) + hidden
            + "".join(_note(n) for n in section.notes) + extra + "</section>")


# ---------------------------------------------------------------------------------------------------------------
# The charts


def _short(text: str, limit: int = 48) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _hover(index: int, layer: Layer) -> str:
    """Hover label of one bar (plotly renders <br> and <b>; everything else is escaped)."""
    nodes = layer.nodes
    kind = {"fused": f"fused group of {len(nodes)} nodes", "unfused": "in a pattern left unfused",
            "removed": "removed by a rewrite", "new": "added by a rewrite", "node": "unchanged"}[layer.kind]
    lines = [f"<b>layer {index}: {kind}</b>"]
    lines += [_e(_plain(f"{op} {_short(name)}")) for op, name in nodes[:HOVER_NODES]]
    if len(nodes) > HOVER_NODES:
        lines.append(f"… and {len(nodes) - HOVER_NODES} more")
    if layer.into:
        lines.append(_e(_plain(f"→ {_short(layer.into)}")))
    if layer.reason:
        lines.append(_e(_plain(f"reason: {layer.reason}")))
    return "<br>".join(lines)


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


def traffic_figure(layers: tuple[Layer, ...] | list[Layer]) -> dict:
    """The plotly figure (``data``, ``layout``) of bytes per layer (``present.chart_layers``): a wide light bar per
    layer for the original nodes and a narrow dark bar inside it for the optimized model, hatched for a fused
    group and dotted for a pattern left unfused, so that the kinds differ without colour. The x axis is the
    layer's position in execution order; a range slider zooms. Values are in the KiB/MiB/GiB unit that fits the
    largest layer."""
    known = [v for u in layers for v in (u.before, u.after) if v is not None]
    unit_name, size = chart_unit(max(known, default=None))

    def trace(name: str, members: list[int], side: str, **style) -> dict:
        template = f"{side}: %{{customdata[1]}}" + ("<br>%{customdata[0]}" if side == "before" else "")
        values = [layers[i].before if side == "before" else layers[i].after for i in members]
        texts = [layers[i].before_text if side == "before" else layers[i].after_text for i in members]
        return {"type": "bar", "name": name, "x": members, "y": [_scaled(v, size) for v in values],
                "customdata": [[_hover(i, layers[i]), _e(_plain(t))] for i, t in zip(members, texts, strict=True)],
                "hovertemplate": template + "<extra></extra>", **style}

    everything = list(range(len(layers)))
    fused = [i for i, u in enumerate(layers) if u.kind == "fused"]
    unfused = [i for i, u in enumerate(layers) if u.kind == "unfused"]
    plain = [i for i, u in enumerate(layers) if u.kind not in ("fused", "unfused")]
    line = {"color": "#222222", "width": 0.5}
    data = [
        trace(TRACE_BEFORE, everything, "before", width=0.9, marker={"color": "#d4d4d4", "line": line}),
        trace(TRACE_AFTER, plain, "after", width=0.5, marker={"color": "#4d4d4d"}),
        trace(TRACE_FUSED, fused, "after", width=0.5,
              marker={"color": "#1f5fa8", "line": line,
                      "pattern": {"shape": "/", "bgcolor": "#bcd3ee", "fgcolor": "#1f5fa8", "size": 6,
                                  "solidity": 0.45}}),
        trace(TRACE_UNFUSED, unfused, "after", width=0.5,
              marker={"color": "#a34f00", "line": line,
                      "pattern": {"shape": ".", "bgcolor": "#f3d2b3", "fgcolor": "#a34f00", "size": 5,
                                  "solidity": 0.5}}),
    ]
    layout = {
        "barmode": "overlay", "hovermode": "x unified", "height": 460, "margin": {"l": 70, "r": 20, "t": 10, "b": 40},
        "font": {"family": "system-ui, sans-serif", "size": 12},
        "legend": {"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 0},
        "xaxis": {"title": {"text": "layer, in execution order (drag the slider or across the plot to zoom)"},
                  "rangeslider": {"visible": True, "thickness": 0.08}, "range": [-0.5, len(layers) - 0.5]},
        "yaxis": {"title": {"text": f"{unit_name} moved (read + written)" if known else "bytes unknown at these "
                            "shapes (hover for expressions)"}, "fixedrange": True, "rangemode": "tozero",
                  "showticklabels": bool(known)},
        "plot_bgcolor": "#ffffff",
    }
    return {"data": data, "layout": layout}


def totals_figure(bar: TotalsBar | None) -> dict | None:
    """A horizontal bar of bytes before and after against the graph as exported, with the saved bytes hatched
    beside the after bar, and above them the bar the page leads with: the bytes saved beyond what onnxruntime
    makes itself at load. None when either total is unknown (``bar`` None)."""
    if bar is None:
        return None
    saved = bar.before - bar.after
    unit_name, size = chart_unit(max(bar.before, bar.after))
    lead = []
    if bar.beyond is not None and bar.beyond_text is not None:
        lead = [{"type": "bar", "orientation": "h", "name": "saved beyond onnxruntime", "y": ["beyond onnxruntime"],
                 "x": [max(bar.beyond, 0) / size], "text": [_e(bar.beyond_text)],
                 "textposition": "outside", "cliponaxis": False, "customdata": [f"{bar.beyond:,} B"],
                 "marker": {"color": "#1f5fa8", "line": {"color": "#1f5fa8", "width": 1},
                            "pattern": {"shape": "/", "bgcolor": "#bcd3ee", "fgcolor": "#1f5fa8", "size": 6}},
                 "hovertemplate": "%{text} (%{customdata})<extra></extra>"}]
    data = [
        *lead,
        {"type": "bar", "orientation": "h", "name": "moved", "y": ["after", "before"],
         "x": [bar.after / size, bar.before / size], "text": [_e(bar.after_text), _e(bar.before_text)],
         "textposition": "inside", "insidetextanchor": "start", "marker": {"color": "#4d4d4d"},
         "textfont": {"color": "#ffffff"}, "customdata": [f"{bar.after:,} B", f"{bar.before:,} B"],
         "hovertemplate": "%{text} (%{customdata})<extra></extra>"},
        {"type": "bar", "orientation": "h", "name": "saved (hatched)", "y": ["after"], "x": [max(saved, 0) / size],
         "customdata": [f"{_e(bar.saved_text)} ({saved:,} B)"],
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


def to_html(report: SupportsToDict | Doc) -> str:
    """The page of ``report`` (a ``report.model.Report``, or its JSON dict): :func:`draw` of its document, every
    row shown.

    Raises:
        KeyError: a dict that lacks a field that ``report.schema.json`` requires.
    """
    from onnxfuse.report.present import document

    return draw(document(report, show_all=True))


def draw(doc: Document) -> str:
    """The self-contained HTML page (UTF-8 text, about 2 MB) of ``doc``: the header, the headline, each section,
    the charts after the totals, the report's JSON embedded as it is."""
    chart = doc.chart
    totals_fig = totals_figure(chart.totals) if chart else None
    figures = {"traffic": traffic_figure(chart.layers) if chart else None, "totals": totals_fig}
    header = ("<h1>" + _e(doc.title) + "</h1>" + '<dl class="meta">'
              + "".join(f"<dt>{_e(f.label)}</dt><dd" + (f' id="{_e(f.id)}"' if f.id else "") + f">{_line(f.value)}</dd>"
                        for f in doc.fields) + "</dl>")
    body = [f"<header>{header}</header>",
            '<section id="summary"><ul class="headline">'
            + "".join(f"<li>{_line(line)}</li>" for line in doc.headline) + "</ul></section>"]
    for section in doc.sections:
        if section.id != "totals" or chart is None:
            body.append(_section(section))
            continue
        bar = ('<div id="totals-chart" class="chart" role="img" aria-label="bar: bytes before and after, saved bytes '
               'hatched"></div>' if totals_fig else "")
        body.append(_section(section, bar + "".join(_note(n) for n in chart.notes)))
        body.append('<section id="traffic"><h2>Traffic per layer</h2>'
                    f"<p>{_e(chart.caption)}</p>"
                    '<div id="traffic-chart" class="chart" role="img" aria-label="bar chart of bytes moved per layer, '
                    'before and after fusion"></div><p class="nochart" hidden>The chart needs a browser with '
                    "DecompressionStream (Chromium 80, Firefox 113, Safari 16.4 or later); the tables hold the same "
                    "figures.</p></section>")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; script-src 'unsafe-inline' "
        "'unsafe-eval'; style-src 'unsafe-inline'; img-src data:; font-src data:\">"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(doc.title)}: {_e(_plain(doc.subject))}</title><style>{_CSS}</style></head><body>{''.join(body)}"
        f'<script type="application/json" id="onnxfuse-report">{_json_for_script(doc.data)}</script>'
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
