"""``onnxfuse passes``: the passes in the order they run (plugins among them, with where each came from), and the
reasons each can decline a pattern."""

from __future__ import annotations

import click

from onnxfuse.cli.args.plugins import plugin_option
from onnxfuse.cli.console import verbosity_options
from onnxfuse.cli.exits import fail_cleanly


@click.command()
@plugin_option
@verbosity_options
@fail_cleanly
def passes(plugins: tuple[str, ...] = ()) -> None:
    """List the passes in the order they run, and the reasons a pass can decline a pattern.

    Plugins (installed ones, entry point group onnxfuse.passes, and those of --plugin) are listed where they run,
    with their origin.
    """
    from onnxfuse.passes import ordered
    from onnxfuse.passes.plugin import BUILT_IN, origin, resolve

    for p in ordered(resolve(plugins)):
        where = origin(p)
        click.echo(f"{p.name:<16} {p.summary}" + ("" if where is BUILT_IN else f" [{where}]"))
        click.echo(f"{'':<16} declines: {', '.join(r.value for r in p.reasons)}")
