"""onnxfuse: offline operator fusion for ONNX models, with a memory-traffic report and numerical verification.

Public API (the library never prints; the ``onnxfuse`` command in ``onnxfuse.cli.main`` does)::

    onnxfuse.optimize(model, target="cpu+cuda", input_shapes=None, verify=True, ...) -> Result
    onnxfuse.analyse(model, ...) -> Report
    onnxfuse.verify(original, candidate, ...) -> Verification
    onnxfuse.profile(result, ort_level=None) -> Report   (the report with measured time and bytes)

``model`` is an ``onnx.ModelProto`` or a path. Errors: :class:`InputError` (bad model or option; the CLI's exit
code 2) and :class:`VerificationError` (the optimized model does not match; exit code 1), both
:class:`OnnxFuseError`. See :mod:`onnxfuse.api`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from onnxfuse._version import __version__
from onnxfuse.errors import InputError, OnnxFuseError, VerificationError

if TYPE_CHECKING:
    from onnxfuse.api import analyse, optimize, profile, verify

__all__ = [
    "InputError", "OnnxFuseError", "Report", "Result", "Verification", "VerificationError", "__version__",
    "analyse", "optimize", "profile", "verify",
]


def __getattr__(name: str):
    # The API functions and the result types are imported (onnx, onnx-graphsurgeon, numpy) only when asked for:
    # `import onnxfuse` stays cheap, and the command's entry point (onnxfuse.__main__.run) can turn a Ctrl-C
    # while the libraries load into its one-line exit 130.
    if name in ("analyse", "optimize", "profile", "verify"):
        from onnxfuse import api

        return getattr(api, name)
    if name == "Result":
        from onnxfuse.pipeline import Result

        return Result
    if name == "Report":
        from onnxfuse.report.model import Report

        return Report
    if name == "Verification":
        from onnxfuse.verification.result import Verification

        return Verification
    raise AttributeError(f"module 'onnxfuse' has no attribute {name!r}")
