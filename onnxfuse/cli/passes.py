"""``onnxfuse passes``: the passes in the order they run, and the reasons each can decline a pattern."""

from __future__ import annotations

import click

from onnxfuse.cli.console import verbosity_options


@click.command()
@verbosity_options
def passes() -> None:
    """List the passes in the order they run, and the reasons a pass can decline a pattern."""
    from onnxfuse.passes import ALL_PASSES

    for p in ALL_PASSES:
        click.echo(f"{p.name:<16} {p.summary}")
        click.echo(f"{'':<16} declines: {', '.join(r.value for r in p.reasons)}")
