"""The options that say where a report goes and in which format: ``optimize --report/--report-format``,
``report -o/--format``, and ``--bandwidth`` (an estimated memory time in the report)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import click

from onnxfuse.errors import InputError

F = TypeVar("F", bound=Callable[..., Any])

#: report.FORMATS.
REPORT_FORMATS = ("text", "json", "markdown", "html")


def report_file_options(fn: F) -> F:
    """``optimize``'s ``--report`` (repeatable) and ``--report-format``; :func:`report_files` reads them."""
    fn = click.option("--report-format", type=click.Choice(REPORT_FORMATS),
                      help="Format of a single --report (default: from its extension).")(fn)
    return click.option("--report", "report_paths", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
                        help="Also write the full report here (.json, .md, .txt or .html; repeatable, one file per "
                             "format from its extension: --report r.json --report r.md).")(fn)


def report_output_options(fn: F) -> F:
    """``report``'s ``--format`` and ``-o/--output`` (repeatable); :func:`report_files` reads them."""
    fn = click.option("-o", "--output", "outputs", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
                      help="Write the report to this file instead of stdout (.json, .md, .txt or .html; repeatable, "
                           "each format from its extension: -o r.json -o r.md).")(fn)
    return click.option("--format", "fmt", type=click.Choice(REPORT_FORMATS),
                        help="Output format (default: from the -o extension, else text); html is one "
                             "self-contained page with charts.")(fn)


def bandwidth_option(fn: F) -> F:
    """``--bandwidth GB/S``; :func:`check_bandwidth` refuses what click lets through."""
    return click.option("--bandwidth", type=click.FloatRange(min=0, min_open=True), metavar="GB/S",
                        help="Add an estimated memory time at this bandwidth (10^9 bytes/s).")(fn)


def check_bandwidth(bandwidth: float | None) -> None:
    """Raises: InputError: ``--bandwidth`` is not finite (click's range lets ``inf`` through)."""
    if bandwidth is not None and not math.isfinite(bandwidth):
        raise InputError("--bandwidth must be a finite number")


def report_files(paths: Iterable[Path], report_format: str | None, option: str = "--report",
                 format_option: str = "--report-format") -> list[tuple[Path, str]]:
    """``(path, format)`` for each report file (``optimize --report``, ``report -o``): the format from
    ``format_option`` (one file only) or from the file's extension.

    Raises:
        InputError: an extension without a format, ``--report-format`` with several reports, or one file twice.
    """
    from onnxfuse.report import formats

    paths = tuple(paths)
    if report_format is not None and len(paths) > 1:
        raise InputError(f"{format_option} applies to a single {option}; with several, each format comes from "
                         "its file's extension")
    out: list[tuple[Path, str]] = []
    for path in paths:
        fmt = report_format or formats.format_for_path(str(path))
        if fmt is None:
            raise InputError(f"{option} {path}: give a {', '.join(formats.REPORT_EXTENSIONS)} name, or {format_option}")
        if any(os.path.abspath(path) == os.path.abspath(p) for p, _ in out):
            raise InputError(f"{option} {path}: given twice")
        out.append((path, fmt))
    return out
