"""``onnxfuse report MODEL``: the memory-traffic analysis of what ``optimize`` would do, written to stdout or files,
optionally compared with an earlier report (``--baseline``) or measured under onnxruntime's profiler."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from onnxfuse.cli import files
from onnxfuse.cli.args.conflicts import REPORT_NEEDS, check_needs, check_passes
from onnxfuse.cli.args.model_inputs import (
    fix_input_shape_option,
    input_data_option,
    parse_fix_input_shapes,
    parse_input_shapes,
)
from onnxfuse.cli.args.optimization import DEFAULT_ORT_LEVEL, optimization_options, to_options
from onnxfuse.cli.args.plugins import plugin_option
from onnxfuse.cli.args.report_output import bandwidth_option, check_bandwidth, report_files, report_output_options
from onnxfuse.cli.console import diagnostics, log, progress, verbosity_options
from onnxfuse.cli.exits import fail_cleanly
from onnxfuse.errors import InputError
from onnxfuse.report import escape

if TYPE_CHECKING:
    from onnxfuse import pipeline
    from onnxfuse.report.model import Report

REPORT_EXIT_CODES_HELP = """\b
Exit codes:
  0  success (with --baseline: no regression)
  1  with --baseline: a fusion was lost or the optimized traffic grew
  2  usage error, or a model or baseline that cannot be read or is invalid
  3  internal error, a bug in onnxfuse (ONNXFUSE_DEBUG=1: traceback)"""


@click.command(epilog=REPORT_EXIT_CODES_HELP)
@click.argument("model_path", metavar="MODEL", type=click.Path(path_type=Path))
@optimization_options
@plugin_option
@fix_input_shape_option
@input_data_option("Real inputs: their array shapes fix the input shapes of the report.")
@report_output_options
@click.option("--all", "show_all", is_flag=True,
              help="Show every row on the terminal (text and Markdown printed there show the top 20 per table; report "
                   "files, JSON and HTML always have every row).")
@bandwidth_option
@click.option("--baseline", type=click.Path(dir_okay=False, path_type=Path), metavar="OLD.json",
              help="Compare with an earlier JSON report: print what changed, exit 1 if a fusion was lost or the "
                   "optimized traffic grew.")
@click.option("--profile", is_flag=True,
              help="Also run the original and the optimized model under onnxruntime's profiler at --ort-level "
                   "(one thread): measured time and bytes per op and per fusion beside the counted ones.")
@click.option("--profile-timeout", type=click.FloatRange(min=0), default=120.0, show_default=True,
              metavar="SECONDS", help="Time for --profile's runs of both models together (0: no limit); when it "
                                      "runs out the report says so and has no profile.")
@verbosity_options
@click.pass_context
@fail_cleanly
def report(ctx: click.Context, model_path: Path, target: str, only: tuple[str, ...], skip: tuple[str, ...],
           input_shape: tuple[str, ...], ort_level: str | None, ort_version: str | None,
           constant_initializer_inputs: bool, materialize_weights: float, input_data: str | None, fmt: str | None,
           outputs: tuple[Path, ...], show_all: bool, bandwidth: float | None, baseline: Path | None, profile: bool,
           profile_timeout: float, plugins: tuple[str, ...] = (), fix_input_shape: tuple[str, ...] = ()) -> None:
    """Print the memory-traffic analysis of what `optimize` would do to MODEL (writes no model).

    Bytes are expressions in the model's symbolic input dims; --input-shape also gives the numbers at one size.

    \b
    Examples:
      onnxfuse report model.onnx
      onnxfuse report det.onnx --target cpu --input-shape x=1x3x640x640 \\
          -o traffic.json
      onnxfuse report model.onnx --format markdown >> "$GITHUB_STEP_SUMMARY"
      onnxfuse report model.onnx --baseline main.json -o new.json
      onnxfuse report model.onnx -o report.html
    """
    check_needs(ctx, REPORT_NEEDS)
    check_passes(only, skip)
    parse_fix_input_shapes(fix_input_shape)
    parse_input_shapes(input_shape)  # a malformed --input-shape is a usage error: answered before the libraries load
    from onnxfuse import pipeline
    from onnxfuse.model import io as model_io
    from onnxfuse.report import formats, present

    if baseline is not None:
        from onnxfuse.report import baseline as baseline_mod  # it imports sympy: only --baseline needs it

    found = report_files(outputs, fmt, "-o", "--format") if outputs else []
    for path, _ in found:
        files.check_folder(path, "--output")
        if model_io.same_file(path, model_path):
            raise InputError(f"-o {path}: is the same file as the model; choose another name")
    output = found[0][0] if found else None
    fmt = found[0][1] if found else (fmt or "text")
    check_bandwidth(bandwidth)
    old = baseline_mod.load(baseline) if baseline is not None else None
    options = to_options(target, only, skip, input_shape, constant_initializer_inputs, ort_level, ort_version,
                         materialize_weights, plugins=plugins, fix_input_shapes=parse_fix_input_shapes(fix_input_shape),
                         input_data=input_data, bandwidth=bandwidth)
    with progress(ctx, f"analysing {model_path}"):
        result = pipeline.analyse(model_path, options)
    report = result.report
    if profile and result.changed:  # a new report with the profile (or a warning), made by the library
        report = _profile(ctx, result, ort_level or DEFAULT_ORT_LEVEL, profile_timeout or None)
    diagnostics(report)
    for path, _ in found:
        files.check_not_data_file(path, "-o", result.loaded)
    new = dict(report.to_dict()) if old is not None else None  # the gate reads both as plain JSON dicts
    if old is not None and new is not None and baseline is not None:
        _check_same_options(baseline, old, new)  # before any -o file is written: exit 2 writes nothing
    for path, path_fmt in found:
        files.write_text(path, formats.render(report, path_fmt, present.show_every_row(False, show_all),
                                              width=files.text_width(path)))
    if found:
        files.chart_note(report, [f for _, f in found])
        log.info("wrote %s", ", ".join(str(p) for p, _ in found))
    elif old is None:
        click.echo(formats.render(report, fmt, present.show_every_row(True, show_all),
                                  width=files.text_width(None)), nl=False)
    if old is not None and new is not None and baseline is not None:
        _compare(baseline, old, new, fmt, output)


def _profile(ctx: click.Context, result: pipeline.Result, ort_level: str, timeout: float | None) -> Report:
    """``--profile``: the report with the original and the optimized model measured under onnxruntime's profiler
    (``api.profile``, as the API gives it); a model onnxruntime cannot run on generated inputs, or runs that do not
    end within ``timeout`` seconds (``--profile-timeout``; None: no limit), give the report with a warning instead
    (``report.model.with_warning``). ``ort_level``: the level both run at. ``result`` is not changed."""
    from onnxfuse import api
    from onnxfuse.errors import one_line
    from onnxfuse.ort import profile as ort_profile
    from onnxfuse.report.model import with_warning

    with progress(ctx, "running both models under onnxruntime's profiler, then timing them in paired rounds"):
        try:
            return api.profile(result, ort_level=ort_level, timeout=timeout)
        except ort_profile.ProfileTimeout:
            return with_warning(result.report, f"--profile: the runs did not finish within {timeout:g} s "
                                               "(--profile-timeout); no profile")
        except Exception as exc:  # onnxruntime cannot run a model on generated inputs: the report says so
            return with_warning(result.report, f"--profile: onnxruntime could not run the models ({one_line(exc)})")


def _check_same_options(baseline: Path, old: dict[str, Any], new: dict[str, Any]) -> None:
    """``--baseline``: the earlier report must have been made with the same options as this one.

    Raises:
        InputError: the baseline was made with other options.
    """
    from onnxfuse.report import baseline as baseline_mod

    differences = baseline_mod.option_differences(old, new)
    if differences:
        raise InputError(f"--baseline {baseline}: made with other options ({'; '.join(differences)}); a change "
                         "of options is no regression of the model: make both reports with the same options")


def _compare(baseline: Path, old: dict[str, Any], new: dict[str, Any], fmt: str, output: Path | None) -> None:
    """``--baseline``: print what changed since the earlier report (``old``; ``new`` is this one's dict); exit 1
    on a regression."""
    from onnxfuse.report import baseline as baseline_mod

    comparison = baseline_mod.compare(old, new)
    if fmt == "json" and output is None:
        import json

        click.echo(json.dumps(comparison.to_dict(), indent=2, sort_keys=True))
    else:
        bullet, safe = ("- ", escape.markdown) if fmt == "markdown" else ("", escape.text)
        lines = [f"compared with {safe(baseline)}:", *comparison.lines(fmt)]
        click.echo("\n".join(f"{bullet}{line}" for line in lines))
    if comparison.regressed:
        sys.exit(1)
