"""The ``onnxfuse`` command group: ``--version``, -v/-q, and one command per module of this package (optimize,
report, bench, verify, passes, batch). A command parses its options (the groups in :mod:`onnxfuse.cli.args`),
calls the library, renders, and chooses the exit code (:mod:`onnxfuse.cli.exits`). Nothing else.

Results (the optimize summary, a report, bench tables, the pass list) go to stdout; everything else (errors,
warnings, hints, "wrote FILE", progress, ``-v`` detail) goes to stderr through the ``onnxfuse`` logger
(:mod:`onnxfuse.cli.console`).

The library (onnx, numpy, onnx-graphsurgeon, onnxruntime, sympy) is imported in the command bodies, not at import
time: click parses the command line before it calls a command, so --help, --version and usage errors (an unknown
option, a missing argument, a value outside a choice, a malformed --input-shape) answer without loading it.
"""

from __future__ import annotations

import click

from onnxfuse.cli.batch import batch
from onnxfuse.cli.bench import bench
from onnxfuse.cli.console import configure_logging, unconfigure_logging, verbosity, verbosity_options
from onnxfuse.cli.exits import EXIT_CODES_HELP
from onnxfuse.cli.optimize import optimize
from onnxfuse.cli.passes import passes
from onnxfuse.cli.report import report
from onnxfuse.cli.verify import verify_command
from onnxfuse.cli.version import version_option


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
             epilog=EXIT_CODES_HELP)
@version_option
@verbosity_options
@click.pass_context
def main(ctx: click.Context) -> None:
    """Fuse Conv, BatchNormalization, bias/scale and activations in ONNX models, verify the result in
    onnxruntime, and report the memory traffic saved.

    \b
    Examples:
      onnxfuse optimize model.onnx model.fused.onnx
      onnxfuse optimize det.onnx det.fused.onnx --target cpu \\
          --input-shape x=1x3x640x640 --report r.json
      onnxfuse report model.onnx --format markdown
      onnxfuse passes
    """
    ctx.ensure_object(dict)
    configure_logging(verbosity(ctx))
    ctx.call_on_close(unconfigure_logging)


for _command in (optimize, report, bench, verify_command, passes, batch):
    main.add_command(_command)


if __name__ == "__main__":  # pragma: no cover
    main()
