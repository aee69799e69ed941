"""The report as terminal tables (``--format text``, the default): rich tables without colour codes. Lays out what
``onnxfuse.report.present`` decides (cells, sentences, grouping, row order); never prints to the terminal itself.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

from onnxfuse.report import escape
from onnxfuse.report.present import (
    bytes_text,
    cell,
    chain,
    first_rows,
    grouped_unfused,
    human_bytes,
    kinds,
    shape_text,
    shapes_text,
    summary_lines,
    top_rows,
    tune_rows,
    unfused_label,
)
from onnxfuse.report.schema import Doc, SupportsToDict

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

_RIGHT: dict[str, Any] = {"justify": "right", "overflow": "fold"}
_FOLD: dict[str, Any] = {"overflow": "fold"}


def to_text(report: SupportsToDict, show_all: bool = False, width: int = 110) -> str:
    """Terminal tables (rich, no colour codes), ``width`` columns wide, the largest rows first (top rows unless
    ``show_all``). Every string from the model is escaped (:func:`onnxfuse.report.escape.text`) and rich reads no
    markup (``[red]`` in a name is text)."""
    from rich.console import Console  # imported here: only the text format needs it, and it costs start-up time

    doc = escape.escaped(report.to_dict())
    buf = io.StringIO()
    console = Console(file=buf, width=width, color_system=None, force_terminal=False, highlight=False, markup=False,
                      emoji=False)
    m = doc["model"]
    console.print(f"onnxfuse {doc['onnxfuse_version']} memory-traffic report")
    console.print(f"model: {m['path']}  sha256 {m['sha256'][:16]}...  {human_bytes(m['file_bytes'])}")
    console.print(f"target: {doc['target']}   input shapes: {shapes_text(doc) or 'from the model'}")
    for line in summary_lines(report) + [f"warning: {w}" for w in doc["warnings"]]:
        console.print(line)
    if doc["subgraph_nodes"]:
        console.print(f"note: {doc['subgraph_nodes']} nodes inside If/Loop/Scan bodies are counted once each")
    console.print()
    console.print(_totals_table(doc))
    _fusions(console, doc, show_all)
    _unfused(console, doc, show_all)
    _unknown_nodes(console, doc, show_all)
    for line in tune_rows(doc):  # --tune: one line per group timed
        console.print(f"tune: {line}")
    for tab in (_symbols_table(doc), _passes_table(doc), _ops_table(doc)):
        if tab is not None:
            console.print()
            console.print(tab)
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n"


def _table(title: str, columns: list[tuple[str, dict[str, Any]]]) -> Table:
    from rich import box
    from rich.table import Table

    t = Table(title=title, box=box.SIMPLE, title_justify="left", pad_edge=False)
    for name, opts in columns:
        t.add_column(name, **opts)
    return t


def _totals_table(doc: Doc) -> Table:
    t = doc["totals"]
    tab = _table("Totals (bytes moved to and from device memory)",
                 [("", {}), ("read", _RIGHT), ("written", _RIGHT), ("total", _RIGHT), ("nodes", _RIGHT),
                  ("unknown nodes", _RIGHT)])
    for side in ("before", "after"):
        s = t[side]
        tab.add_row(side, cell(s["read_bytes"], s["read_bytes_expr"], doc),
                    cell(s["written_bytes"], s["written_bytes_expr"], doc),
                    cell(s["total_bytes"], s["total_bytes_expr"], doc), str(s["nodes"]), str(s["unknown_nodes"]))
    pct = f" ({t['saved_percent']:.1f}%)" if t["saved_percent"] is not None else ""
    tab.add_row("saved", "", "", cell(t["saved_bytes"], t["saved_bytes_expr"], doc) + pct, "", "")
    return tab


def _fusions(console: Console, doc: Doc, show_all: bool) -> None:
    if not doc["fusions"]:
        return
    rows, hidden = top_rows(doc["fusions"], "saved_bytes", show_all)
    tab = _table(f"Fusions applied ({len(doc['fusions'])}: {kinds(doc)})",
                 [("node", _FOLD), ("replaced", _FOLD), ("activation", {"no_wrap": True}), ("output", _FOLD),
                  ("saved", _RIGHT)])
    for r in rows:
        tab.add_row(r["node"], chain(r["replaced"]), r["activation"] or "", shape_text(r, doc),
                    cell(r["saved_bytes"], r["saved_bytes_expr"], doc))
    console.print(tab)
    if hidden:
        console.print(f"... {hidden} more fusions (use --all to show every row)")


def _unfused(console: Console, doc: Doc, show_all: bool) -> None:
    if not doc["unfused"]:
        return
    rows, hidden = top_rows(grouped_unfused(doc["unfused"]), "bytes", show_all)
    tab = _table(f"Left unfused ({len(doc['unfused'])})",
                 [("nodes", _FOLD), ("reason", {"no_wrap": True}), ("detail", _FOLD), ("would save", _RIGHT)])
    for r in rows:
        tab.add_row(unfused_label(r, str, str), r["reason"], r["detail"], cell(r["bytes"], r["bytes_expr"], doc))
    console.print()
    console.print(tab)
    if hidden:
        console.print(f"... {hidden} more patterns (use --all to show every row)")


def _unknown_nodes(console: Console, doc: Doc, show_all: bool) -> None:
    if not doc["unknown_nodes"]:
        return
    rows = first_rows(doc["unknown_nodes"], show_all)
    tab = _table(f"Nodes of unknown size ({len(doc['unknown_nodes'])}, left out of the totals)",
                 [("node", _FOLD), ("op", {}), ("why", _FOLD)])
    for r in rows:
        tab.add_row(r["node"] or r["output"], r["op"], r["reason"])
    console.print()
    console.print(tab)
    if len(rows) < len(doc["unknown_nodes"]):
        console.print(f"... {len(doc['unknown_nodes']) - len(rows)} more (use --all to show every row)")


def _symbols_table(doc: Doc) -> Table | None:
    if not doc["symbols"]:
        return None
    tab = _table("Symbols (the model's symbolic input dims)", [("symbol", {}), ("input", _FOLD), ("axis", _RIGHT),
                                                               ("model's dim name", _FOLD), ("value", _RIGHT)])
    for name, where in doc["symbols"].items():
        value = doc["symbol_values"].get(name)
        tab.add_row(name, where["input"], str(where["axis"]), where["dim_param"] or "(unnamed)",
                    "" if value is None else str(value))
    return tab


def _passes_table(doc: Doc) -> Table:
    tab = _table("Passes", [("pass", {}), ("rewrites", _RIGHT), ("nodes removed", _RIGHT),
                            ("skipped by reason", _FOLD)])
    for s in doc["pass_stats"]:
        removed = "" if "removed_nodes" not in s else str(s["removed_nodes"]) if not s["removed_nodes"] else \
            f"{s['removed_nodes']} ({bytes_text(s['removed_bytes'], s['removed_bytes_expr'])})"
        tab.add_row(s["name"], str(s["applied"]), removed,
                    ", ".join(f"{k} {v}" for k, v in s["skipped"].items()) or "-")
    return tab


def _ops_table(doc: Doc) -> Table:
    ops = doc["op_counts"]
    tab = _table("Nodes by op type", [("op", {}), ("before", _RIGHT), ("after", _RIGHT)])
    for op in sorted(set(ops["before"]) | set(ops["after"])):
        tab.add_row(op, str(ops["before"].get(op, 0)), str(ops["after"].get(op, 0)))
    return tab
