"""``onnxfuse verify ORIGINAL CANDIDATE``: check in onnxruntime that any two models compute the same."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from onnxfuse.cli.args.model_inputs import input_shape_option, parse_input_shapes
from onnxfuse.cli.args.verification import to_verify_options, verify_options
from onnxfuse.cli.console import progress, verbosity_options, warn_unverified
from onnxfuse.cli.exits import fail_cleanly
from onnxfuse.errors import InputError, VerificationError
from onnxfuse.report import escape

if TYPE_CHECKING:
    from onnxfuse.verification.result import Verification

VERIFY_EXIT_CODES_HELP = """\b
Exit codes:
  0  passed
  1  failed: an output differs beyond tolerance, the outputs' names,
     order or dtypes differ, or onnxruntime cannot run CANDIDATE
  2  usage error, a model that cannot be read or is invalid, or
     verification skipped (onnxruntime cannot run ORIGINAL on the
     inputs, or --verify-budget or --verify-timeout ran out)
  3  internal error, a bug in onnxfuse (ONNXFUSE_DEBUG=1: traceback)"""


@click.command("verify", epilog=VERIFY_EXIT_CODES_HELP)
@click.argument("original", type=click.Path(path_type=Path))
@click.argument("candidate", type=click.Path(path_type=Path))
@input_shape_option
@verify_options
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--layers", is_flag=True,
              help="Also compare every tensor that exists under the same name in both models (each exposed as an "
                   "output, judged by the same rule) and print the first that diverge, in ORIGINAL's topological "
                   "order, with the node that writes each. Costs one more verification.")
@verbosity_options
@click.pass_context
@fail_cleanly
def verify_command(ctx: click.Context, original: Path, candidate: Path, input_shape: tuple[str, ...],
                   input_data: str | None, input_value: tuple[str, ...], input_range: tuple[str, ...],
                   input_sets: int, rtol: float | None, atol: float | None, verify_timeout: float | None,
                   fmt: str, layers: bool, verify_budget: float | None = None) -> None:
    """Check that CANDIDATE computes what ORIGINAL does, in onnxruntime (any pair of models: onnxfuse's output,
    another optimizer's, a hand-edited graph). Both run with graph optimizations disabled on the same inputs; an
    output passes when it differs by no more than onnxruntime's own noise (how much its optimization levels change
    the original's outputs) and a rounding floor allow; --rtol/--atol replace that rule with fixed tolerances.

    \b
    Examples:
      onnxfuse verify model.onnx model.fused.onnx
      onnxfuse verify vad.onnx vad.slim.onnx --input-value sr=16000 \\
          --input-shape input=1x512
      onnxfuse verify model.onnx other-optimizer.onnx --layers
    """
    shapes = parse_input_shapes(input_shape)  # a malformed one is a usage error: answered before the libraries load
    from onnxfuse.model import io as model_io
    from onnxfuse.verification import verify as verify_mod

    opts = to_verify_options(shapes, input_data, input_value, input_range, input_sets, rtol, atol, verify_timeout,
                             verify_budget)
    for path in (original, candidate):
        model_io.load_model(path)  # unreadable or invalid: an input error (exit 2)
    with progress(ctx, "running both models in onnxruntime"):
        result = verify_mod.verify_models(original, candidate, opts)
    by_layer = None
    if layers:
        from onnxfuse.verification.layers import compare_layers

        with progress(ctx, "running both models with every shared tensor exposed"):
            by_layer = compare_layers(original, candidate, opts)
    if fmt == "json":
        import json

        doc = result.to_dict()
        if by_layer is not None:
            doc["layers"] = by_layer.to_dict()
        click.echo(json.dumps(doc, indent=2, sort_keys=True))
    else:
        click.echo(verification_text(result), nl=False)
        if by_layer is not None:
            click.echo("\n".join(escape.text(line) for line in by_layer.lines()))
    warn_unverified(result, strict_option=False, reason_shown=True)
    if result.status == "skipped":  # the reason is in the result printed above (text or JSON)
        raise InputError("verification skipped: the models were not compared (why: the result's verification "
                         "line, or its reason in JSON)")
    if result.status == "failed":
        raise VerificationError(f"{candidate} does not match {original}")


def verification_text(result: Verification) -> str:
    """The verdict and a table of every output: error, scale, onnxruntime's noise floor, tolerance."""
    failed = result.failed_outputs
    detail = f"{len(failed)} of {len(result.outputs)} outputs beyond tolerance" if failed else result.summary
    lines = [f"verification: {result.status}" + (f" ({detail})" if detail else "")]
    if result.status == "skipped":
        lines[0] = "NOT VERIFIED: " + lines[0]
    if result.outputs:
        if result.rule == "noise-floor":
            lines.append(f"rule: max abs error <= {result.floor_multiple:g} x max(onnxruntime noise floor, rounding "
                         "floor, min floor), per output and per small-valued slice; integer/bool outputs: at most "
                         f"{result.floor_multiple:g}x as many elements differ as onnxruntime's own optimizations "
                         "change; NaN/inf at the same places")
        else:
            lines.append("rule: |candidate - original| <= atol + rtol * |original| elementwise (--rtol/--atol)")
        if result.floor_note:
            lines.append(f"noise floor {result.floor_note}")
        rows = [("output", "dtype", "max abs error", "scale", "error/scale", "noise floor", "rounding floor",
                 "min floor", "tolerance", "result")]
        for o in result.outputs:
            tol = f"{o.tolerance:.3g}" if o.tolerance is not None else f"atol {o.atol:g} rtol {o.rtol:g}"
            rows.append((escape.text(o.name), escape.text(o.dtype), f"{o.max_abs_error:.3g}", f"{o.scale:.3g}",
                         f"{o.max_rel_error:.2g}",
                         "-" if o.floor is None else f"{o.floor:.3g}",
                         "-" if o.rounding_floor is None else f"{o.rounding_floor:.3g}", f"{o.min_floor:.3g}", tol,
                         "passed" if o.passed else "not compared" if o.not_compared else "FAILED"))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        lines += [f"  {o.describe(result.floor_multiple)}" for o in failed]
    return "\n".join(escape.text(line) for line in lines) + "\n"  # the verdict's reason, describe(): names

