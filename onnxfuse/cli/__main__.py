"""``python -m onnxfuse.cli``: the same command as ``onnxfuse`` and ``python -m onnxfuse``."""

from onnxfuse.__main__ import run

run()
