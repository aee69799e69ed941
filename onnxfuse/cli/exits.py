"""Exit codes, and the one place that turns an exception into one line on stderr and its exit code.

Exit codes: 0 success; 1 the optimized model failed verification (or ``--require-verify`` and verification
was skipped), no model written (a ``--report`` file is, with the verification result); 2 usage error, an input
model that cannot be read or is invalid, an output that cannot be written, or stdout/stderr that cannot be written
(a full disk, a closed pipe: the files already committed stay, complete and verified); 3 an internal error (a bug in
onnxfuse: one line, ``ONNXFUSE_DEBUG=1`` for the traceback); 4 ``--drop-culprits`` wrote the verified model
with the rewrites that broke verification left unfused; 130 interrupted (Ctrl-C, SIGINT), 143 terminated
(SIGTERM), 129 hung up (SIGHUP): no partly written or temporary file left.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar, cast

import click

from onnxfuse.errors import (
    EXIT_INTERNAL,
    InputError,
    OnnxFuseError,
    debug_requested,
    internal_error_line,
    interrupted_exit,
)
from onnxfuse.report import escape

F = TypeVar("F", bound=Callable[..., Any])

EXIT_CODES_HELP = """\b
Exit codes:
  0    success
  1    the optimized model failed verification, or --require-verify and
       verification was skipped or partial (no model written; a --report file is,
       with the verification result)
  2    usage error, an input model that cannot be read or is invalid,
       an OUTPUT that cannot be written, or stdout/stderr that cannot
       be written (a model already written stays: it was verified)
  3    internal error, a bug in onnxfuse (one line; ONNXFUSE_DEBUG=1
       shows the traceback)
  4    --drop-culprits: verification failed, and the model with the
       rewrites that broke it left unfused was verified and written
       (a warning names them)
  130  interrupted (Ctrl-C); no partly written file is left
  143  terminated (SIGTERM: CI runners, timeout); the same"""

READ_ONLY_EXIT_CODES_HELP = """\b
Exit codes:
  0    success
  2    usage error, or a model that cannot be read or is invalid
  3    internal error, a bug in onnxfuse (ONNXFUSE_DEBUG=1: traceback)
  130  interrupted (Ctrl-C)
  143  terminated (SIGTERM)"""

#: Exit code of ``optimize --drop-culprits`` when it wrote the verified remainder: the rewrites that broke
#: verification (named in warnings) were left unfused. Distinct from 0 so that a CI step can tell.
EXIT_CULPRITS_LEFT_UNFUSED = 4

#: Exit code after SIGINT (Ctrl-C): 128 + signal number 2, the shell convention. Not 1, which means "verification
#: failed". SIGTERM exits 143 and SIGHUP 129 (errors.Interrupted.exit_code).
EXIT_INTERRUPTED = 130


def say(message: str) -> None:
    """Write ``message`` and a newline to stderr; when stderr cannot be written (a full disk, ``/dev/full``, a
    closed pipe) nothing is said and the streams are silenced (:func:`silence_streams`), so that the exit code
    stays the one chosen, never Python's 1 for an exception escaping or 120 for a failed flush at exit."""
    try:
        click.echo(message, err=True)
    except (OSError, ValueError):  # ValueError: the stream was closed
        silence_streams()


def silence_streams() -> None:
    """Point file descriptors 1 and 2 at the null device: what is still buffered for stdout or stderr is then
    flushed there at exit instead of failing again (which would make Python exit 120). For after a write to them
    failed; the command's result is told by its exit code alone."""
    try:
        sys.stderr.fileno()  # a stream in memory (click's test runner) has no descriptor: nothing to silence
        null = os.open(os.devnull, os.O_WRONLY)
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is an OSError and a ValueError
        return
    for fd in (1, 2):
        try:
            os.dup2(null, fd)
        except OSError:
            pass
    os.close(null)


def fail_cleanly(fn: F) -> F:
    """Turn an OnnxFuseError into a one-line ``error: ...`` on stderr and its exit code, and Ctrl-C into one line
    and exit code 130, SIGTERM 143, SIGHUP 129 (click's own handling would exit 1, the code for a failed
    verification), and any other exception (a bug) into one line and exit code 3 (``errors.EXIT_INTERNAL``; with
    ``ONNXFUSE_DEBUG=1`` it is re-raised with its traceback); click's own exceptions pass through to click. Files
    are written whole or not at all (temporary file, then rename), so an interrupt leaves no partly written file."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM/SIGHUP (errors.Interrupted, from __main__.run)
            message, code = interrupted_exit(exc)
            say(message)
            sys.exit(code)
        except OnnxFuseError as exc:
            say(f"error: {escape.text(exc)}")  # one line: a name in it adds none
            sys.exit(exc.exit_code)
        except OSError as exc:  # the file system refused (a name too long, a permission): not a bug of onnxfuse
            # no file name: a write to stdout or stderr failed (a full disk, a closed pipe), exit 2 as for a file
            where = f"{escape.text(exc.filename)}: " if exc.filename else "cannot write to stdout or stderr: "
            say(f"error: {where}{exc.strerror or escape.text(exc)}")
            sys.exit(InputError.exit_code)
        except UnicodeDecodeError:  # protobuf hands invalid UTF-8 in a string field to Python as it is
            say("error: the model holds a name or string that is not valid UTF-8")
            sys.exit(InputError.exit_code)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as exc:
            if debug_requested():
                raise
            say(internal_error_line(exc))
            sys.exit(EXIT_INTERNAL)

    return cast(F, wrapper)
