"""``onnxfuse --version``: the versions of onnxfuse and of the libraries that decide its output, read from the
installed distributions' metadata (none of the libraries is imported)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from onnxfuse._version import __version__

F = TypeVar("F", bound=Callable[..., Any])

#: Distributions whose versions ``--version`` shows: the onnxruntime build decides which fused forms and
#: activations are emitted (providers.py), onnx and onnx-graphsurgeon read and write the model. The first of each
#: group that is installed is shown (onnxruntime-gpu is the CUDA build of onnxruntime).
VERSION_DISTRIBUTIONS = (("onnxruntime", "onnxruntime-gpu"), ("onnx",), ("onnx-graphsurgeon",))


def version_lines() -> list[str]:
    """``onnxfuse VERSION`` and one ``NAME VERSION`` line per :data:`VERSION_DISTRIBUTIONS` group (``NAME not
    installed`` when none of the group is), from the installed distributions' metadata (``importlib.metadata``):
    none of the libraries is imported."""
    from importlib import metadata

    lines = [f"onnxfuse {__version__}"]
    for names in VERSION_DISTRIBUTIONS:
        for name in names:
            try:
                lines.append(f"{name} {metadata.version(name)}")
                break
            except metadata.PackageNotFoundError:
                continue
        else:
            lines.append(f"{names[0]} not installed")
    return lines


def _print_version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    click.echo("\n".join(version_lines()))
    ctx.exit()


def version_option(fn: F) -> F:
    """``--version``: print :func:`version_lines` and exit, before any command runs (an eager option)."""
    return click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
                        help="Show the versions of onnxfuse and of the libraries that decide its output, and "
                             "exit.")(fn)
