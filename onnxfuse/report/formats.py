"""The report's formats and the dispatch to their renderers: :data:`FORMATS` (the CLI's ``--format`` and
``--report-format`` choices), :data:`REPORT_EXTENSIONS` (a file name's format), :func:`render`. Cheap to import:
each renderer is imported when its format is asked for (the text one needs rich, the HTML one plotly).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from onnxfuse.report.schema import SupportsToDict

#: Formats ``render`` accepts (the CLI's ``--format`` and ``--report-format`` choices).
FORMATS = ("text", "json", "markdown", "html")

#: Report file extension -> format, for ``report -o FILE`` and ``optimize --report FILE``. Add a renderer's
#: extensions here.
REPORT_EXTENSIONS = {".json": "json", ".md": "markdown", ".markdown": "markdown", ".txt": "text", ".html": "html",
                     ".htm": "html"}


def render(report: SupportsToDict, fmt: str, show_all: bool = False, width: int = 120) -> str:
    """Render ``report`` (a ``report.model.Report``) as ``fmt`` (``text``, ``json``, ``markdown`` or ``html``;
    HTML and JSON always have every row; ``width`` columns for text).

    Raises:
        ValueError: unknown format.
    """
    if fmt == "json":
        from onnxfuse.report.model import to_json

        return to_json(report)
    if fmt not in FORMATS:
        raise ValueError(f"unknown report format {fmt!r}")
    from onnxfuse.report.present import document

    # one document, drawn by each format's renderer; only the page has figures
    doc = document(report, show_all=show_all or fmt == "html", chart=fmt == "html")
    if fmt == "markdown":
        from onnxfuse.report.markdown import draw as markdown

        return markdown(doc)
    if fmt == "text":
        from onnxfuse.report.text import draw as text

        return text(doc, width)
    from onnxfuse.report.html import draw as html

    return html(doc)


def format_for_path(path: str) -> str | None:
    """Report format implied by a file extension (:data:`REPORT_EXTENSIONS`), or None."""
    lower = path.lower()
    for ext, fmt in REPORT_EXTENSIONS.items():
        if lower.endswith(ext):
            return fmt
    return None
