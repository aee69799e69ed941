"""The one document every report format draws (``present.document`` builds it; ``report.text``,
``report.markdown`` and ``report.html`` draw it and read nothing else). Frozen plain data; imports nothing of
onnxfuse, so a renderer that imports only this module and ``report.escape`` cannot read the report's data.

Text is semantic, so that each format escapes it its own way (``onnxfuse.report.escape``):

* :class:`Prose`: onnxfuse's own words (no escaping needed in text and Markdown; HTML-escaped).
* :class:`Name`: text taken from the model or from onnxruntime's messages (node and tensor names, reasons,
  paths): escaped for every format (:func:`escape.text`, :func:`escape.markdown`, :func:`escape.html_text`).
* :class:`Code`: an identifier or a byte expression: a code span in Markdown, ``<code>`` in HTML.
* :class:`Status`: a verdict (``passed``, ``failed``...): a badge in HTML.

A table cell is one span, a :class:`Sentence` of spans, a :class:`Bytes` figure (number and expression), a
:class:`Num` or a :class:`Bars` (relative sizes, drawn as bars in HTML).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeAlias


@dataclass(frozen=True)
class Prose:
    """onnxfuse's own words."""

    text: str


@dataclass(frozen=True)
class Name:
    """Text from the model or from onnxruntime: escaped in every format."""

    text: str


@dataclass(frozen=True)
class Code:
    """An identifier or an expression: a code span."""

    text: str


@dataclass(frozen=True)
class Status:
    """A verdict (``passed``, ``failed``, ``skipped``, ``not run``...)."""

    text: str


Span: TypeAlias = Prose | Name | Code | Status

#: A line of text: spans drawn one after the other.
Sentence: TypeAlias = tuple[Span, ...]


@dataclass(frozen=True)
class Bytes:
    """A byte figure: ``text`` as people read it (``1.2 MiB``, ``~3.1e+04*N bytes``, ``4864*N B``, ``unknown``);
    ``expr`` the part of ``text`` that is an expression (a code span in Markdown; None for a number or unknown);
    ``exact`` the exact expression where ``text`` shortens it (else None); ``number`` the bytes (None when only an
    expression is known); ``sort`` the value tables sort by; ``why`` why it is unknown; ``suffix`` text after it
    (a percentage); ``anchor`` an id for the cell (HTML)."""

    text: str
    number: int | None
    sort: float
    expr: str | None = None
    exact: str | None = None
    why: str | None = None
    suffix: str = ""
    anchor: str | None = None


@dataclass(frozen=True)
class Num:
    """A plain number (counts, milliseconds, errors): ``text`` as shown, ``value`` to sort by."""

    text: str
    value: float | None


@dataclass(frozen=True)
class Bars:
    """Relative sizes (0 to 1) of one row's figures side by side (original, optimized)."""

    fractions: tuple[float, ...]


Cell: TypeAlias = Prose | Name | Code | Status | tuple[Span, ...] | Bytes | Num | Bars


@dataclass(frozen=True)
class Column:
    """A table column: ``numeric`` aligns right and sorts by number; ``wide``: a detail column that a view of
    fixed width (the terminal's text) leaves out."""

    title: str
    numeric: bool = False
    wide: bool = False


@dataclass(frozen=True)
class Note:
    """A paragraph of a section, with an id where a page links or tests it."""

    sentence: Sentence
    id: str | None = None
    warning: bool = False


@dataclass(frozen=True)
class Section:
    """One part of the report: ``id`` (the page's anchor), ``title``, ``lead`` paragraphs, a table (``columns``,
    ``rows``; none when ``columns`` is empty), how many rows the table leaves out (``hidden``) and the sentence
    saying so (``hidden_note``), then ``notes``. ``sortable``: the page's table sorts by a click on a header."""

    id: str
    title: str
    lead: tuple[Note, ...] = ()
    columns: tuple[Column, ...] = ()
    rows: tuple[tuple[Cell, ...], ...] = ()
    hidden: int = 0
    hidden_note: str = ""
    notes: tuple[Note, ...] = ()
    sortable: bool = False


@dataclass(frozen=True)
class Field:
    """A header field: ``label: value``."""

    label: str
    value: Sentence
    id: str | None = None


@dataclass(frozen=True)
class Layer:
    """One bar of the traffic chart: ``kind`` (``node``, ``fused``, ``unfused``, ``removed``, ``new``), its original
    nodes as (op, name), bytes before and after (None: unknown; drawn at zero), the hover texts of both, the
    fused node (``op name``) and the reason of a pattern left unfused."""

    kind: str
    nodes: tuple[tuple[str, str], ...]
    before: int | None
    after: int | None
    before_text: str
    after_text: str
    into: str | None
    reason: str | None


@dataclass(frozen=True)
class TotalsBar:
    """The totals bar: bytes before and after against the graph as exported, the bytes saved beyond onnxruntime
    (None when not known), and the labels of each bar."""

    before: int
    after: int
    beyond: int | None
    beyond_text: str | None
    after_text: str
    before_text: str
    saved_text: str


@dataclass(frozen=True)
class Chart:
    """The page's figures: the traffic per layer (``layers``), the totals bar (None when a total is unknown), the
    caption of the per-layer chart and its notes (the sizes it is drawn at)."""

    layers: tuple[Layer, ...]
    totals: TotalsBar | None
    caption: str
    notes: tuple[Note, ...] = ()


@dataclass(frozen=True)
class Document:
    """The whole report as every format shows it: ``title`` and ``subject`` (the model), header ``fields``, the
    ``headline`` (the runtime figure first), the ``sections`` in order, the page's ``chart``, and ``data``: the
    JSON form, which the page embeds as it is (never read by a renderer)."""

    title: str
    subject: str
    fields: tuple[Field, ...]
    headline: tuple[Sentence, ...]
    sections: tuple[Section, ...]
    chart: Chart | None = None
    data: Any = field(default=None, compare=False, repr=False)

    def section(self, section_id: str) -> Section | None:
        """The section with this id, or None."""
        return next((s for s in self.sections if s.id == section_id), None)
