"""The installed onnxfuse version, read once from the package metadata (pyproject.toml's ``version``)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("onnxfuse")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"
