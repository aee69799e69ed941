"""The HTML index page of an ``onnxfuse batch`` run (``OUTDIR/index.html``): one table row per model (status,
fusions, bytes saved against the graph and against onnxruntime, time, peak memory, a link to the model's own
report), sortable by any column. Never prints.

Same rules as the per-model page (``onnxfuse.report.html``): one self-contained file, no network (a
Content-Security-Policy with ``default-src 'none'``), the summary's JSON embedded unchanged in
``<script type="application/json" id="onnxfuse-batch-summary">``. The rows are plain HTML written here; the
script only sorts them.
"""

from __future__ import annotations

from onnxfuse.analysis.shapes import REPRESENTATIVE_BATCH, REPRESENTATIVE_SIZE
from onnxfuse.report.escape import html_text as _e
from onnxfuse.report.escape import json_for_script as _json_for_script
from onnxfuse.report.escape import text as _text
from onnxfuse.report.escape import url_path
from onnxfuse.report.present import human_bytes

#: Columns: heading, sort kind (``num`` sorts by the cell's ``data-v``), the row's key.
COLUMNS = (("model", "text", "name"), ("status", "text", "status"), ("verification", "text", "verification"),
           ("fusions", "num", "fusions"), ("saved vs onnxruntime", "num", "saved_bytes_beyond"),
           ("saved vs graph", "num", "saved_bytes"), ("time", "num", "time_s"),
           ("peak memory", "num", "peak_memory_bytes"), ("report", "text", None))


def _bytes(n) -> str:
    return human_bytes(n) if n is not None else "unknown"


def sizes_note(summary: dict) -> str | None:
    """The one sentence saying at which sizes the figures of models with symbolic dims are given, or None when
    every row's figures are at its input shapes."""
    n = sum(1 for r in summary["models"] if r.get("representative_sizes"))
    if not n:
        return None
    return (f"The figures of {n} model{'s' if n > 1 else ''} with symbolic dims are at the single-model report's "
            f"representative sizes: batch {REPRESENTATIVE_BATCH}, {REPRESENTATIVE_SIZE} for the other dims "
            "(give input_shapes in a manifest for your own).")


def _total(t: dict, key: str) -> str:
    """A total of the summary with, when some models' figure is unknown (not in it), how many: never 0 B for
    "unknown" (a summary written before ``totals.unknown`` existed has no such count)."""
    unknown, written = (t.get("unknown") or {}).get(key, 0), t.get("written")
    if not unknown or t[key] is None:
        return _bytes(t[key])
    return f"{_bytes(t[key])} ({unknown} of {written} models unknown, not counted)"


def headline(summary: dict) -> str:
    """The summary's first sentence (text; names are not in it): counts per status, fusions, bytes saved (the
    figure against onnxruntime first, as every model's own report leads with it)."""
    c, t = summary["counts"], summary["totals"]
    return (f"{t['models']} models: " + (", ".join(f"{n} {s}" for s, n in c.items() if n) or "none") +
            f" ({summary['cached']} from the cache); {t['fusions'] or 0} fusions; memory traffic saved beyond "
            f"onnxruntime at the chosen level: {_total(t, 'saved_bytes_beyond')}; against the graph as exported: "
            f"{_total(t, 'saved_bytes')}.")


def _num_cell(value, text: str) -> str:
    v = "" if value is None else value
    return f'<td class="num" data-v="{_e(v)}">{_e(text)}</td>'


def _row(r: dict) -> str:
    reason = f'<span class="reason">{_e(_text(r.get("reason") or ""))}</span>'
    link = (f'<a href="{_e(url_path(r["report_html"]))}">report</a>' + (" " + reason if r.get("reason") else "")
            if r.get("report_html") else reason)
    bytes_ = {k: _bytes(r[k]) for k in ("saved_bytes", "saved_bytes_beyond", "peak_memory_bytes")}
    name = _e(_text(r["name"]))
    return (f'<tr class="status-{_e(r["status"])}" data-name="{name}"><td><code>{name}</code></td>'
            f'<td class="status">{_e(r["status"])}{" (cached)" if r.get("cached") else ""}</td>'
            f'<td>{_e(_text(r.get("verification") or "-"))}</td>'
            + _num_cell(r["fusions"], "-" if r["fusions"] is None else str(r["fusions"]))
            + _num_cell(r["saved_bytes_beyond"], bytes_["saved_bytes_beyond"])
            + _num_cell(r["saved_bytes"], bytes_["saved_bytes"])
            + _num_cell(r["time_s"], "-" if r["time_s"] is None else f"{r['time_s']:.1f} s")
            + _num_cell(r["peak_memory_bytes"], bytes_["peak_memory_bytes"])
            + f"<td>{link}</td></tr>")


def to_html(summary: dict) -> str:
    """The index page (UTF-8 text) of ``summary`` (``batch.summarize``'s dict, ``batch.schema.json``).

    Raises:
        KeyError: ``summary`` lacks a field the schema requires.
    """
    t = summary["totals"]
    note = sizes_note(summary)
    head = "".join(f'<th data-kind="{kind}" tabindex="0" aria-sort="none">{_e(h)}</th>' for h, kind, _ in COLUMNS)
    body = "".join(_row(r) for r in summary["models"])
    versions = " · ".join(f"{k} {v}" for k, v in summary["versions"].items())
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; script-src 'unsafe-inline'; "
        "style-src 'unsafe-inline'\">"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>onnxfuse batch: {t['models']} models</title><style>{_CSS}</style></head><body>"
        "<h1>onnxfuse batch</h1>"
        f'<p id="counts">{_e(headline(summary))}</p>'
        + (f'<p id="sizes" class="meta">{_e(note)}</p>' if note else "") +
        f'<p class="meta">{_e(_text(versions))} · engine {_e(_text(summary["engine"]))}'
        f'{" · shard " + _e(summary["shard"]) if summary.get("shard") else ""}</p>'
        '<p class="meta">Click a column heading to sort by it (again to reverse).</p>'
        f'<table id="models"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
        f'<script type="application/json" id="onnxfuse-batch-summary">{_json_for_script(summary)}</script>'
        f"<script>{_JS}</script></body></html>\n"
    )


_CSS = """
body { font-family: system-ui, sans-serif; color: #111; background: #fff; margin: 1.5rem auto; max-width: 1400px;
       padding: 0 1rem; line-height: 1.4; }
h1 { font-size: 1.3rem; } .meta { color: #555; font-size: 0.9em; }
table { border-collapse: collapse; width: 100%; font-size: 0.92em; }
th, td { border-bottom: 1px solid #ddd; padding: 0.3rem 0.5rem; text-align: left; vertical-align: top; }
th { cursor: pointer; background: #f4f4f4; user-select: none; position: sticky; top: 0; }
th[aria-sort="ascending"]::after { content: " ▲"; } th[aria-sort="descending"]::after { content: " ▼"; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.status-ok td.status { color: #0a6b2d; } tr:not(.status-ok) td.status { color: #b00020; font-weight: 600; }
.reason { font-size: 0.9em; color: #555; }
@media print { th { position: static; } }
"""

_JS = r"""
(function () {
  var table = document.getElementById('models');
  var heads = table.tHead.rows[0].cells;
  function key(row, i, kind) {
    var cell = row.cells[i];
    if (kind === 'num') { var v = cell.getAttribute('data-v'); return v === '' ? -Infinity : parseFloat(v); }
    return cell.textContent.toLowerCase();
  }
  function sortBy(i) {
    var th = heads[i], kind = th.getAttribute('data-kind');
    var dir = th.getAttribute('aria-sort') === 'ascending' ? -1 : 1;
    for (var j = 0; j < heads.length; j++) heads[j].setAttribute('aria-sort', 'none');
    th.setAttribute('aria-sort', dir === 1 ? 'ascending' : 'descending');
    var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = key(a, i, kind), y = key(b, i, kind);
      return (x < y ? -1 : x > y ? 1 : 0) * dir;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  }
  Array.prototype.forEach.call(heads, function (th, i) {
    th.addEventListener('click', function () { sortBy(i); });
    th.addEventListener('keydown', function (e) { if (e.key === 'Enter') sortBy(i); });
  });
})();
"""
