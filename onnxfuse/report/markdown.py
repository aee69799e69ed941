"""The report as GitHub-flavoured Markdown (``--format markdown``): pull-request comments and CI job summaries.
Draws the one document of ``onnxfuse.report.present.document`` (``onnxfuse.report.document``) and reads nothing
else; never prints.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from onnxfuse.report import escape
from onnxfuse.report.document import Bars, Bytes, Cell, Code, Document, Name, Num, Prose, Section, Sentence, Span

if TYPE_CHECKING:
    from onnxfuse.report.schema import SupportsToDict


def _md_row(cells: list[str]) -> str:
    """A Markdown table row: a backslash before each ``|`` that has none (one :func:`onnxfuse.report.escape.markdown`
    escaped already stays as it is), so that no cell is split."""
    return "| " + " | ".join(re.sub(r"\\.|\|", lambda m: "\\|" if m.group(0) == "|" else m.group(0), str(c))
                             for c in cells) + " |"


def to_markdown(report: SupportsToDict, show_all: bool = False) -> str:
    """GitHub-flavoured Markdown of ``report`` (a ``report.model.Report``): :func:`draw` of its document."""
    from onnxfuse.report.present import document

    return draw(document(report, show_all=show_all, chart=False))


def draw(doc: Document) -> str:
    """GitHub-flavoured Markdown for a pull-request comment or a CI job summary. Text from the model is escaped
    (:func:`onnxfuse.report.escape.markdown`, :func:`onnxfuse.report.escape.markdown_code`): no name adds a line,
    splits a table cell or reads as formatting or HTML."""
    out = [f"### {doc.title}: {escape.markdown_code(doc.subject)}", "",
           " · ".join(f"{f.label}: {_line(f.value)}" for f in doc.fields), ""]
    if doc.headline:
        first, *rest = doc.headline
        out += [_line(first), ""] + [f"- {_line(line)}" for line in rest] + ([""] if rest else [])
    for section in doc.sections:
        out += _section(section)
    return "\n".join(out).rstrip("\n") + "\n"


def _span(s: Span) -> str:
    if isinstance(s, Prose):
        return s.text
    if isinstance(s, Code):
        return escape.markdown_code(s.text)
    if isinstance(s, Name):
        return escape.markdown(s.text) if s.text.strip() else s.text
    return f"**{escape.markdown(s.text)}**"  # a Status


def _line(spans: Sentence) -> str:
    return "".join(_span(s) for s in spans)


def _cell(c: Cell) -> str:
    if isinstance(c, tuple):
        return _line(c)
    if isinstance(c, Bytes):
        text = c.text if c.expr is None else escape.markdown_code(c.expr) + c.text[len(c.expr):]
        return text + escape.markdown(c.suffix)
    if isinstance(c, Num):
        return c.text
    if isinstance(c, Bars):
        return " / ".join(f"{100 * f:.0f}%" for f in c.fractions)
    return _span(c)


def _section(section: Section) -> list[str]:
    out = [f"#### {section.title}", ""]
    for note in section.lead:
        out += [("> **Warning:** " if note.warning else "") + _line(note.sentence), ""]
    if section.columns:
        out += [_md_row([c.title for c in section.columns]), _md_row(["---"] * len(section.columns))]
        out += [_md_row([_cell(c) for c in row]) for row in section.rows]
        out.append("")
    if section.hidden:
        out += [f"_{section.hidden} {section.hidden_note}._", ""]
    for note in section.notes:
        out += [("> **Warning:** " if note.warning else "") + _line(note.sentence), ""]
    return out
