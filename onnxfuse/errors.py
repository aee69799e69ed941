"""Exception types that the CLI maps to documented exit codes.

Exit codes (also in README.md and ``onnxfuse --help``):

* ``0``: success.
* ``1``: :class:`VerificationError`: the optimized model did not match the original in onnxruntime
  (or ``--require-verify`` was given and verification was skipped); no output file is written.
* ``2``: :class:`InputError`: a usage error, an input model that cannot be read or is invalid, or an output
  that cannot be written (missing or read-only folder, disk full).
* ``3``: any other exception: a bug in onnxfuse. The CLI prints one line (:func:`internal_error_line`) instead
  of a traceback; with the environment variable ``ONNXFUSE_DEBUG=1`` it re-raises, traceback and all.
* ``130``: interrupted (Ctrl-C, SIGINT).
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
        verification: the ``onnxfuse.verification.Verification`` itself.
    """

    exit_code = 1

    def __init__(self, message: str, result=None, verification=None):
        super().__init__(message)
        self.result = result
        self.verification = verification if verification is not None else (
            result.report.verification if result is not None else None)


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
