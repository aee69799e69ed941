"""Exception types that the CLI maps to documented exit codes.

Exit codes (also in README.md and ``onnxfuse --help``):

* ``0``: success.
* ``1``: :class:`VerificationError`: the optimized model did not match the original in onnxruntime
  (or ``--require-verify`` was given and verification was skipped); no output file is written.
* ``2``: :class:`InputError`: a usage error, an input model that cannot be read or is invalid, or an output
  that cannot be written (missing or read-only folder, disk full).

Anything else is a bug in onnxfuse and keeps its traceback.
"""

from __future__ import annotations


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
