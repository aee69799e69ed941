"""``--plugin MODULE:NAME``: a pass from outside the package (``onnxfuse.passes.plugin``), read into
``pipeline.Options.plugins``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def plugin_option(fn: F) -> F:
    """``--plugin MODULE:NAME`` (repeatable), as the parameter ``plugins`` (a tuple of strings); the library loads
    and checks them (``onnxfuse.passes.plugin.resolve``: a broken one is a one-line error, exit code 2)."""
    return click.option("--plugin", "plugins", multiple=True, metavar="MODULE:NAME",
                        help="Also run this pass from a module on the Python path, a subclass of "
                             "onnxfuse.passes.plugin.Pass (repeatable; installed plugins, entry point group "
                             "onnxfuse.passes, run without it). Its output is verified like a built-in pass's.")(fn)
