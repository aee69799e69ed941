"""What the commands say on stderr: the ``onnxfuse`` logger's handler, -v/-q, the progress spinner, and the
diagnostics of a report or a verification.

Diagnostics go through :mod:`logging`: the library's modules log to ``logging.getLogger(__name__)`` (children of
the ``onnxfuse`` logger) and this module gives the ``onnxfuse`` logger one stderr handler whose level follows
``-q`` (errors only: nothing on success), the default (INFO) and ``-v`` (DEBUG).
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import click

from onnxfuse.report import escape

if TYPE_CHECKING:
    from onnxfuse.report import model as report_model
    from onnxfuse.verification.result import Verification

F = TypeVar("F", bound=Callable[..., Any])

#: The package's root logger: the CLI's own messages, and the parent of every library module's logger.
log = logging.getLogger("onnxfuse")


class StderrHandler(logging.Handler):
    """Writes each record to the current ``sys.stderr`` through click (looked up at each record, so that click's
    test runner captures it), a ``warning: `` prefix on warnings, no other decoration. The message is escaped
    (:func:`onnxfuse.report.escape.text`): names and paths in it cannot add a line or send an escape sequence."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = escape.text(self.format(record))
            if record.levelno == logging.WARNING:
                message = f"warning: {message}"
            click.echo(message, err=True)
        except Exception:
            self.handleError(record)


def configure_logging(verbosity: int) -> None:
    """One stderr handler on the ``onnxfuse`` logger: -q (verbosity < 0) ERROR, default INFO, -v DEBUG.
    Replaces the handler of an earlier call (-v/-q after the command name configure it again)."""
    unconfigure_logging()
    log.addHandler(StderrHandler())
    log.setLevel(logging.ERROR if verbosity < 0 else logging.INFO if verbosity == 0 else logging.DEBUG)


def unconfigure_logging() -> None:
    """Remove the CLI's handler and level, so that a process that runs the CLI in-process (tests, scripts) keeps
    its own logging set-up afterwards."""
    for handler in [h for h in log.handlers if isinstance(h, StderrHandler)]:
        log.removeHandler(handler)
    log.setLevel(logging.NOTSET)


def verbosity(ctx: click.Context) -> int:
    """-1 with -q, 0 by default, the number of -v otherwise (kept in the root context's ``obj``)."""
    root_obj: dict[str, int] = ctx.find_root().obj
    return root_obj.get("verbosity", 0)


def _set_verbosity(ctx: click.Context, param: click.Parameter, value: int | bool) -> None:
    root = ctx.find_root()
    root.ensure_object(dict)
    if param.name == "quiet" and value:
        root.obj["verbosity"] = -1
    elif param.name == "verbose" and value and root.obj.get("verbosity", 0) >= 0:
        root.obj["verbosity"] = root.obj.get("verbosity", 0) + value
    configure_logging(root.obj.get("verbosity", 0))


def verbosity_options(fn: F) -> F:
    """-v/--verbose and -q/--quiet, accepted before or after the command name."""
    fn = click.option("-q", "--quiet", is_flag=True, expose_value=False, callback=_set_verbosity,
                      help="Print nothing on success, only errors (report and bench still print their "
                           "results).")(fn)
    return click.option("-v", "--verbose", count=True, expose_value=False, callback=_set_verbosity,
                        help="More diagnostics on stderr (pass statistics, every pattern left unfused).")(fn)


@contextlib.contextmanager
def progress(ctx: click.Context, message: str) -> Iterator[None]:
    """A spinner on stderr while ``message`` runs, only when stderr is a terminal and not --quiet."""
    if sys.stderr.isatty() and verbosity(ctx) >= 0:
        from rich.console import Console
        from rich.text import Text

        with Console(stderr=True).status(Text(escape.text(message))):  # Text: no markup read in a file name
            yield
    else:
        yield


def diagnostics(report: report_model.Report) -> None:
    """Warnings on stderr; with -v also the pass statistics and every pattern left unfused."""
    for warning in report.warnings or []:
        log.warning("%s", warning)
    for s in report.pass_stats:
        skipped = ", ".join(f"{k} {v}" for k, v in s["skipped"].items()) or "none skipped"
        log.debug("pass %s: %s rewrites; %s", s["name"], s["applied"], skipped)
    for u in report.unfused:
        chain = " -> ".join(n["op"] for n in u["nodes"])
        log.debug("unfused %s (%s): %s: %s", u["nodes"][0]["name"] or u["nodes"][0]["output"], chain, u["reason"],
                  u["detail"])


def warn_unverified(verification: Verification, strict_option: bool = True, reason_shown: bool = False) -> None:
    """What verification did not check, as ``warning:`` lines on stderr (Verification.unchecked; ``reason_shown``:
    stdout gives the reason of a skip, which the warning then does not repeat)."""
    for line in verification.unchecked(strict_option, reason_shown):
        log.warning("%s", line)
