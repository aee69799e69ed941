"""onnxfuse: offline operator fusion for ONNX models, with a memory-traffic report and numerical verification.

Public API: :func:`onnxfuse.pipeline.optimize`, :func:`onnxfuse.pipeline.analyse` and the report types in
:mod:`onnxfuse.report`. The library never prints; the ``onnxfuse`` command (``onnxfuse.cli``) does.
"""

__version__ = "0.1.0"
