"""The report as GitHub-flavoured Markdown (``--format markdown``): pull-request comments and CI job summaries.
Lays out what ``onnxfuse.report.present`` decides (cells, sentences, grouping, row order); never prints.
"""

from __future__ import annotations

import re
from typing import Any

from onnxfuse.report import escape
from onnxfuse.report.present import (
    bandwidth_line,
    cell,
    chain,
    first_rows,
    fused_count,
    grouped_unfused,
    headline,
    kinds,
    made_by_onnxruntime,
    passes_text,
    plural,
    top_rows,
    tune_rows,
    unfused_label,
    verification_line,
)
from onnxfuse.report.schema import SupportsToDict


def _md_row(cells: list[Any]) -> str:
    """A Markdown table row: a backslash before each ``|`` that has none (one :func:`onnxfuse.report.escape.markdown`
    escaped already stays as it is), so that no cell is split."""
    return "| " + " | ".join(re.sub(r"\\.|\|", lambda m: "\\|" if m.group(0) == "|" else m.group(0), str(c))
                             for c in cells) + " |"


def to_markdown(report: SupportsToDict, show_all: bool = False) -> str:
    """GitHub-flavoured Markdown for a pull-request comment or a CI job summary. Text from the model is escaped
    (:func:`onnxfuse.report.escape.markdown`, :func:`onnxfuse.report.escape.markdown_code`): no name adds a line,
    splits a table cell or reads as formatting or HTML."""
    md, code = escape.markdown, escape.markdown_code
    doc = report.to_dict()
    t = doc["totals"]
    m = doc["model"]
    out = [f"### onnxfuse memory-traffic report: {code(m['path'])}", "",
           f"onnxfuse {doc['onnxfuse_version']} · target `{doc['target']}` · sha256 `{m['sha256'][:16]}` · "
           + md(verification_line(doc)), ""]
    out += [f"> **Warning:** {md(w)}" for w in doc["warnings"]] + ([""] if doc["warnings"] else [])
    lines = headline(doc, code=True, plain=md)
    if lines:
        out += [lines[0], ""] + [f"- {line}" for line in lines[1:]] + ([""] if lines[1:] else [])
    out += [_md_row(["", "read", "written", "total", "nodes", "unknown nodes"]), _md_row(["---"] * 6)]
    for side in ("before", "after"):
        s = t[side]
        out.append(_md_row([side, cell(s["read_bytes"], s["read_bytes_expr"], doc, True),
                            cell(s["written_bytes"], s["written_bytes_expr"], doc, True),
                            cell(s["total_bytes"], s["total_bytes_expr"], doc, True), s["nodes"], s["unknown_nodes"]]))
    pct = f" ({t['saved_percent']:.1f}%)" if t["saved_percent"] is not None else ""
    beyond = " (the first line above says what is saved beyond onnxruntime)" if doc.get("onnxruntime") else ""
    out += ["", f"Saved {cell(t['saved_bytes'], t['saved_bytes_expr'], doc, True)}{pct} of memory traffic against "
                f"the graph as exported{beyond} with "
                f"{fused_count(doc)}; {plural(len(doc['unfused']), 'pattern')} left unfused.", ""]
    if doc["bandwidth"]:
        out += [bandwidth_line(doc["bandwidth"]), ""]
    if doc["fusions"]:
        rows, hidden = top_rows(doc["fusions"], "saved_bytes", show_all)
        out += [f"#### Fusions applied ({len(doc['fusions'])}: {kinds(doc)})", "",
                _md_row(["node", "replaced", "activation", "saved", "onnxruntime makes it too", "passes"]),
                _md_row(["---"] * 6)]
        out += [_md_row([code(r["node"]), md(chain(r["replaced"])), md(r["activation"] or ""),
                         cell(r["saved_bytes"], r["saved_bytes_expr"], doc, True),
                         made_by_onnxruntime(r), md(passes_text(r.get("passes") or []))]) for r in rows]
        if hidden:
            out.append(f"\n_{hidden} more rows not shown (onnxfuse report --all shows every row; JSON and HTML always "
                       "do)._")
        out.append("")
    if doc["unfused"]:
        rows, hidden = top_rows(grouped_unfused(doc["unfused"]), "bytes", show_all)
        out += [f"#### Left unfused ({len(doc['unfused'])})", "",
                _md_row(["nodes", "reason", "detail", "would save", "pass"]), _md_row(["---"] * 5)]
        out += [_md_row([unfused_label(r, code, md), code(r["reason"]), md(r["detail"]),
                         cell(r["bytes"], r["bytes_expr"], doc, True), md(r.get("pass") or "")]) for r in rows]
        if hidden:
            out.append(f"\n_{hidden} more rows not shown (onnxfuse report --all shows every row; JSON and HTML always "
                       "do)._")
        out.append("")
    if doc["unknown_nodes"]:
        out += [f"#### Nodes of unknown size ({len(doc['unknown_nodes'])}, left out of the totals)", "",
                _md_row(["node", "op", "why"]), _md_row(["---"] * 3)]
        rows = first_rows(doc["unknown_nodes"], show_all)
        out += [_md_row([code(r["node"] or r["output"]), md(r["op"]), md(r["reason"])]) for r in rows]
        out.append("")
    if tuned := tune_rows(doc):  # --tune: one item per group timed
        out += ["#### Tuned by measurement (--tune)", ""] + [f"- {md(r)}" for r in tuned] + [""]
    return "\n".join(out).rstrip("\n") + "\n"
