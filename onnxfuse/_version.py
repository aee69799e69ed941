"""The onnxfuse version: the one place it is written (pyproject.toml reads it from here, as setuptools'
``dynamic`` version). A plain assignment, not ``importlib.metadata``: that scans the installed distributions,
which costs more than the rest of this package's start-up checks."""

__version__ = "0.1.0"
