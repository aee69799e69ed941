"""The report as terminal tables (``--format text``, the default): rich tables without colour codes. Draws the one
document of ``onnxfuse.report.present.document`` (``onnxfuse.report.document``) and reads nothing else; never
prints to the terminal itself.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

from onnxfuse.report import escape
from onnxfuse.report.document import Bars, Bytes, Cell, Column, Document, Num, Section, Sentence, Span

if TYPE_CHECKING:
    from rich.console import Console

    from onnxfuse.report.schema import SupportsToDict

_RIGHT: dict[str, Any] = {"justify": "right", "overflow": "fold"}
_FOLD: dict[str, Any] = {"overflow": "fold"}


def to_text(report: SupportsToDict, show_all: bool = False, width: int = 110) -> str:
    """Terminal tables of ``report`` (a ``report.model.Report``): :func:`draw` of its document."""
    from onnxfuse.report.present import document

    return draw(document(report, show_all=show_all, chart=False), width)


def draw(doc: Document, width: int = 110) -> str:
    """Terminal tables (rich, no colour codes), ``width`` columns wide, without the document's wide columns
    (``Column.wide``). Every string from the model is escaped (:func:`onnxfuse.report.escape.text`) and rich reads
    no markup (``[red]`` in a name is text)."""
    from rich.console import Console  # imported here: only the text format needs it, and it costs start-up time

    buf = io.StringIO()
    console = Console(file=buf, width=width, color_system=None, force_terminal=False, highlight=False, markup=False,
                      emoji=False)
    console.print(f"{doc.title}: {escape.text(doc.subject)}")
    for f in doc.fields:
        console.print(f"{f.label}: {_line(f.value)}")
    console.print()
    for line in doc.headline:
        console.print(_line(line))
    for section in doc.sections:
        _section(console, section)
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n"


def _span(s: Span) -> str:
    return escape.text(s.text)


def _line(spans: Sentence) -> str:
    return "".join(_span(s) for s in spans)


def _cell(c: Cell) -> str:
    if isinstance(c, tuple):
        return _line(c)
    if isinstance(c, Bytes):
        return escape.text(c.text + c.suffix)
    if isinstance(c, Num):
        return c.text
    if isinstance(c, Bars):
        return " / ".join(f"{100 * f:.0f}%" for f in c.fractions)
    return _span(c)


def _section(console: Console, section: Section) -> None:
    console.print()
    columns = [(i, c) for i, c in enumerate(section.columns) if not c.wide]
    if section.lead or not columns:
        console.print(section.title)
        for note in section.lead:
            console.print(_line(note.sentence))
    if columns:
        console.print(_table("" if section.lead else section.title, [c for _, c in columns],
                             [[_cell(row[i]) for i, _ in columns] for row in section.rows]))
    if section.hidden:
        console.print(f"... {section.hidden} {section.hidden_note}")
    for note in section.notes:
        console.print(_line(note.sentence))


def _table(title: str, columns: list[Column], rows: list[list[str]]):
    from rich import box
    from rich.table import Table

    t = Table(title=title or None, box=box.SIMPLE, title_justify="left", pad_edge=False)
    for c in columns:
        t.add_column(c.title, **(_RIGHT if c.numeric else _FOLD))
    for row in rows:
        t.add_row(*row)
    return t
