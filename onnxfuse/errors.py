"""Exception types that the CLI maps to documented exit codes.

Exit codes (also in README.md and ``onnxfuse --help``):

* ``0``: success.
* ``1``: :class:`VerificationError`: the optimized model did not match the original in onnxruntime
  (or ``--require-verify`` was given and verification was skipped); no output file is written.
* ``2``: :class:`InputError`: a usage error, an input model that cannot be read or is invalid, or an output
  that cannot be written (missing or read-only folder, disk full).
* ``3``: any other exception: a bug in onnxfuse. The CLI prints one line (:func:`internal_error_line`) instead
  of a traceback; with the environment variable ``ONNXFUSE_DEBUG=1`` it re-raises, traceback and all.
* ``130``, ``143``, ``129``: interrupted by SIGINT (Ctrl-C), SIGTERM or SIGHUP (128 + the signal number, the
  shell convention); no temporary or partly written file is left (:class:`Interrupted`).
"""

from __future__ import annotations

import os

#: Exit code of an unexpected exception (a bug in onnxfuse), kept apart from 1 ("the optimized model does not
#: match") and 2 (bad input), so that a script never reads a crash as a verdict on the model.
EXIT_INTERNAL = 3

#: Environment variable that, set to ``1``, makes the CLI re-raise an unexpected exception with its traceback.
DEBUG_ENV = "ONNXFUSE_DEBUG"


class OnnxFuseError(Exception):
    """Base class of the errors that onnxfuse reports to the user without a traceback."""

    exit_code = 2


class InputError(OnnxFuseError):
    """An input model or option that onnxfuse cannot use (exit code 2).

    The message is one line that names the file (where there is one) and the cause.
    """

    exit_code = 2


class VerificationError(OnnxFuseError):
    """The optimized model failed verification against the original, or verification was required and
    skipped (exit code 1).

    Attributes:
        result: the ``onnxfuse.Result`` whose model failed (its ``report.verification`` says which outputs
            differ and by how much), or None where there is no optimized model (``onnxfuse.verify``).
        verification: the ``onnxfuse.verification.result.Verification`` itself.
    """

    exit_code = 1

    def __init__(self, message: str, result=None, verification=None):
        super().__init__(message)
        self.result = result
        self.verification = verification if verification is not None else (
            result.report.verification if result is not None else None)


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised in the main thread by the handler that :func:`onnxfuse.__main__.run` installs, so
    that, as for Ctrl-C's KeyboardInterrupt, every ``finally`` and ``with`` block on the way out removes its
    temporary files (the verification copy of the model in TMPDIR, the temporary folder beside OUTPUT).

    A subclass of KeyboardInterrupt: code that lets Ctrl-C through (``except Exception``) lets these through too.

    Attributes:
        signum: the signal number (``signal.SIGTERM`` 15, ``signal.SIGHUP`` 1).
        exit_code: ``128 + signum`` (143 for SIGTERM, 129 for SIGHUP).
    """

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
        self.exit_code = 128 + signum


def interrupted_exit(exc: KeyboardInterrupt, working: bool = True) -> tuple[str, int]:
    """The one ``error:`` line and the exit code for an interrupt: Ctrl-C (a plain KeyboardInterrupt) exits 130,
    :class:`Interrupted` ``128 + signum``. ``working`` False (the libraries were still loading: nothing could have
    been written) leaves out "no partly written file was left"."""
    tail = "; no partly written file was left" if working else ""
    if isinstance(exc, Interrupted):
        import signal

        try:
            name = signal.Signals(exc.signum).name
        except ValueError:
            name = f"signal {exc.signum}"
        return f"error: stopped by {name}{tail}", exc.exit_code
    return f"error: interrupted{tail}", 130


def one_line(exc: BaseException, limit: int = 300) -> str:
    """``exc``'s message on one line (whitespace runs collapsed), cut to ``limit`` characters with "..."."""
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def debug_requested() -> bool:
    """True when ``ONNXFUSE_DEBUG=1`` is set: unexpected exceptions keep their traceback."""
    return os.environ.get(DEBUG_ENV, "").strip() == "1"


def internal_error_line(exc: BaseException) -> str:
    """The one line the CLI prints for an unexpected exception (exit code :data:`EXIT_INTERNAL`): its type and
    message, and how to get the traceback."""
    return (f"error: internal error in onnxfuse ({type(exc).__name__}: {one_line(exc)}); rerun with "
            f"{DEBUG_ENV}=1 for the traceback, and please report it")
