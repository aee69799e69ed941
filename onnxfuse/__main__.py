"""``python -m onnxfuse``: the same as the ``onnxfuse`` command."""
from onnxfuse.cli import main

main()
