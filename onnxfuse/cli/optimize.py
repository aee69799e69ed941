"""``onnxfuse optimize INPUT OUTPUT``: fuse, verify in onnxruntime, write the model (and reports) atomically."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import click

from onnxfuse.cli import files
from onnxfuse.cli.args.conflicts import OPTIMIZE_CONFLICTS, OPTIMIZE_NEEDS, check_conflicts, check_needs, check_passes
from onnxfuse.cli.args.model_inputs import (
    fix_input_shape_option,
    parse_fix_input_shapes,
    parse_input_feeds,
    parse_input_shapes,
)
from onnxfuse.cli.args.optimization import optimization_options, to_options, tune_options
from onnxfuse.cli.args.plugins import plugin_option
from onnxfuse.cli.args.report_output import bandwidth_option, check_bandwidth, report_file_options, report_files
from onnxfuse.cli.args.verification import check_verify_values, to_verify_options, verify_options
from onnxfuse.cli.console import diagnostics, log, progress, verbosity, verbosity_options, warn_unverified
from onnxfuse.cli.exits import EXIT_CODES_HELP, EXIT_CULPRITS_LEFT_UNFUSED, fail_cleanly
from onnxfuse.errors import InputError, VerificationError

if TYPE_CHECKING:
    from onnxfuse import pipeline
    from onnxfuse.report import model as report_model


@click.command(epilog=EXIT_CODES_HELP)
@click.argument("input_path", metavar="INPUT", type=click.Path(dir_okay=True, path_type=Path))
@click.argument("output_arg", metavar="OUTPUT", type=click.Path())
@optimization_options
@tune_options
@plugin_option
@fix_input_shape_option
@click.option("--no-verify", is_flag=True, help="Skip the onnxruntime comparison (the report says so).")
@click.option("--require-verify", is_flag=True, help="Exit 1 when verification is skipped or partial (strict CI).")
@click.option("--layers", is_flag=True,
              help="When verification fails, also compare the failing model with INPUT tensor by tensor and print "
                   "the first tensors that diverge, with the node that writes each (as verify --layers).")
@click.option("--drop-culprits", is_flag=True,
              help="When verification fails, write the model with the rewrites that broke it left unfused, once "
                   "that model verifies (a warning names them; exit 4). Default: exit 1, nothing written, the "
                   "culprits named.")
@verify_options
@report_file_options
@bandwidth_option
@click.option("--in-place", "--overwrite", "overwrite", is_flag=True,
              help="Allow OUTPUT to be INPUT itself: the input model is replaced (atomically, after verification). "
                   "Any other existing OUTPUT is always replaced, as a build step's output is; --overwrite is the "
                   "old name of this flag.")
@verbosity_options
@click.pass_context
@fail_cleanly
def optimize(ctx: click.Context, input_path: Path, output_arg: str, target: str, only: tuple[str, ...],
             skip: tuple[str, ...], input_shape: tuple[str, ...], ort_level: str | None, ort_version: str | None,
             constant_initializer_inputs: bool, materialize_weights: float, no_verify: bool, require_verify: bool,
             layers: bool, drop_culprits: bool, input_data: str | None,
             input_value: tuple[str, ...], input_range: tuple[str, ...], input_sets: int, rtol: float | None,
             atol: float | None, verify_timeout: float | None, verify_budget: float | None,
             report_paths: tuple[Path, ...],
             report_format: str | None, bandwidth: float | None, overwrite: bool,
             plugins: tuple[str, ...] = (), fix_input_shape: tuple[str, ...] = (), tune: bool = False,
             tune_budget: float = 60.0, threads: int = 1) -> None:
    """Fuse INPUT and write the verified result to OUTPUT (atomically; INPUT is never modified).

    \b
    Examples:
      onnxfuse optimize resnet.onnx resnet.fused.onnx
      onnxfuse optimize det.onnx det.fused.onnx --target cpu \\
          --input-shape x=1x3x640x640
      onnxfuse optimize m.onnx m.fused.onnx --report traffic.json \\
          --require-verify
      onnxfuse optimize m.onnx m.fused.onnx --target cpu --tune
    """
    check_conflicts(ctx, OPTIMIZE_CONFLICTS)
    check_needs(ctx, OPTIMIZE_NEEDS)
    check_passes(only, skip)
    parse_fix_input_shapes(fix_input_shape)
    parse_input_shapes(input_shape)  # a malformed --input-shape is a usage error: answered before the libraries load
    from onnxfuse import tune as tuning

    output_path = Path(output_arg)
    reports = _check_outputs(input_path, output_path, output_arg, report_paths, report_format, bandwidth, overwrite)
    # one make_options call, as the API and batch make it; --input-data's real inputs fix the report's shapes too;
    # --no-verify runs no onnxruntime session at all (verify=False: no comparison with onnxruntime's graphs)
    options = to_options(target, only, skip, input_shape, constant_initializer_inputs, ort_level, ort_version,
                         materialize_weights, plugins=plugins, fix_input_shapes=parse_fix_input_shapes(fix_input_shape),
                         input_data=input_data, bandwidth=bandwidth, drop_culprits=drop_culprits,
                         compare_layers=layers, verify=not no_verify,
                         tune=tune, tune_budget=tune_budget, threads=threads)
    if no_verify:  # the verification options are still checked, without importing verification
        check_verify_values(rtol, atol, verify_timeout, verify_budget)
        parse_input_feeds(input_data, input_value, input_range)
        checked = None
    else:
        checked = to_verify_options(options.input_shapes, input_data, input_value, input_range, input_sets, rtol,
                                    atol, verify_timeout, verify_budget)
    log.debug("optimizing %s for target %s", input_path, target)
    with progress(ctx, f"optimizing {input_path}"):
        result = tuning.optimize(input_path, options, checked)
    diagnostics(result.report)
    report_texts = _render_reports(result, input_path, output_path, reports, require_verify)
    _write_results(ctx, result, output_path, reports, report_texts, overwrite)
    if result.report.verification.culprits:  # --drop-culprits: the verified remainder was written
        for c in result.report.verification.culprits:
            log.warning("left unfused because it broke verification: %s", culprit_line(c))
        ctx.exit(EXIT_CULPRITS_LEFT_UNFUSED)


def culprit_line(c: dict) -> str:
    """One culprit of ``Verification.culprits``: the pass, its original nodes and what it moved."""
    moved = "; ".join(f"output {m['output']}: max abs error {_num(m['max_abs_error'])}, tolerance "
                      f"{_num(m['tolerance'])}" for m in c["moved"]) or (c.get("reason") or "")
    nodes = ", ".join(f"{n} ({op})" for n, op in zip(c["nodes"], c["ops"], strict=True))
    return f"{c['pass']} of {nodes} ({moved})"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _check_outputs(input_path: Path, output_path: Path, output_arg: str, report_paths: tuple[Path, ...],
                   report_format: str | None, bandwidth: float | None, overwrite: bool) -> list[tuple[Path, str]]:
    """Refuse, before the expensive work, an OUTPUT or a ``--report`` that cannot or must not be written; return
    the report files with their formats.

    Raises:
        InputError: OUTPUT is a directory, INPUT itself without ``--in-place``, or in a folder that cannot be
            written; a report file that is INPUT, OUTPUT or the name of OUTPUT's external data, or that cannot be
            written; a bandwidth that is not finite.
    """
    from onnxfuse.model import io as model_io

    if output_path.is_dir() or output_arg.endswith(("/", os.sep)):
        raise InputError(f"{output_path}: OUTPUT is a directory; give a file name")
    check_bandwidth(bandwidth)
    if model_io.same_file(input_path, output_path) and not overwrite:
        raise InputError(f"{output_path}: OUTPUT is the same file as INPUT; pass --in-place to replace the input")
    files.check_folder(output_path, "OUTPUT")
    reports = report_files(report_paths, report_format)
    for report_path, _ in reports:
        files.check_folder(report_path, "--report")
        for other, what in ((input_path, "INPUT"), (output_path, "OUTPUT")):
            if model_io.same_file(report_path, other):
                raise InputError(f"--report {report_path}: is the same file as {what}; choose another name")
        if files.names_a_data_file_of(report_path, output_path):
            raise InputError(f"--report {report_path}: has the name of an external data file of OUTPUT (written or "
                             "removed with it when the model has external data or is over 2 GB); choose another name")
    return reports


def _render_reports(result: pipeline.Result, input_path: Path, output_path: Path, reports: list[tuple[Path, str]],
                    require_verify: bool) -> list[tuple[Path, str]]:
    """Each report file with its text. When verification failed (or was skipped and ``--require-verify`` was
    given) the reports are written, saying why, and no model is.

    Raises:
        InputError: OUTPUT or a report file is an external data file of INPUT.
        VerificationError: the model is refused (exit 1).
    """
    from onnxfuse.model import io as model_io
    from onnxfuse.report import formats, present

    verification = result.report.verification
    if any(model_io.same_file(output_path, f) for f in result.loaded.data_files):
        raise InputError(f"{output_path}: OUTPUT is an external data file of INPUT; choose another name")
    unverified = verification.status in ("skipped", "partial") and require_verify  # partial: not verified
    refused = verification.status == "failed" or unverified
    report_texts = []
    for report_path, fmt in reports:
        files.check_not_data_file(report_path, "--report", result.loaded)
        report_texts.append((report_path, formats.render(result.report, fmt, show_all=present.show_every_row(False))))
        if refused:  # the report says why no model is written
            files.write_text(report_path, report_texts[-1][1])
    if not unverified:
        warn_unverified(verification, reason_shown=verbosity(click.get_current_context()) >= 0)
    if verification.status == "failed":
        failed = verification.failed_outputs
        for o in failed:
            log.error("  %s", o.describe(verification.floor_multiple))
        if verification.layers is not None:
            from onnxfuse.verification.layers import text_lines

            for line in text_lines(verification.layers):
                log.error("  %s", line)
        for c in verification.culprits:
            log.error("  broke verification: %s", culprit_line(c))
        search = verification.culprit_search
        if search is not None:
            log.error("  culprit search: %d of %d sites, %d verifications, %.1f s%s", len(verification.culprits),
                      search["sites"], search["verifications"], search["seconds"],
                      "" if search["complete"] else f"; incomplete: {search['note']}")
        why = f"{len(failed)} of {len(verification.outputs)} outputs differ, above" if failed else verification.reason
        remedy = ("; without the culprit(s) the rest verifies: --drop-culprits writes it (exit 4)"
                  if (verification.remainder or {}).get("status") == "passed" else "")
        raise VerificationError(f"{input_path}: the optimized model does not match the original ({why}); "
                                f"{output_path} was not written{remedy}")
    if unverified:
        raise VerificationError(f"{input_path}: verification was {verification.status} ({verification.reason}) "
                                f"and --require-verify was given; {output_path} was not written")
    return report_texts


def _write_results(ctx: click.Context, result: pipeline.Result, output_path: Path, reports: list[tuple[Path, str]],
                   report_texts: list[tuple[Path, str]], overwrite: bool) -> None:
    """Write the model, then the reports; print the summary (not with -q) and the hints.

    Raises:
        InputError: a report cannot be written (the message names the model, which was).
    """
    from onnxfuse.model import io as model_io
    from onnxfuse.report import present

    report, verification = result.report, result.report.verification
    # the input's data files are never replaced; with --in-place those only the replaced input referenced are
    # removed after the commit, those another model in the folder references are kept (model_io.save_model)
    written = model_io.save_model(result.model, output_path, external_data=result.loaded.external_data,
                                  protected=result.loaded.data_files,
                                  never_replace=None if overwrite else result.loaded.file_id,
                                  in_place=overwrite and result.loaded.path is not None
                                  and model_io.same_file(output_path, result.loaded.path))
    files.chart_note(report, [fmt for _, fmt in reports])
    for report_path, report_text in report_texts:  # after the model: a model not written leaves no report either
        try:
            files.write_text(report_path, report_text)
        except InputError as exc:
            raise InputError(f"{exc}; {', '.join(str(p) for p in written)} was written") from None
        written.append(report_path)
    if verbosity(ctx) >= 0:  # the results; -q prints nothing on success
        try:
            if verification.status == "skipped":
                click.echo("NOT VERIFIED: the model was written without being compared with the original (why: the "
                           "verification line below)")
            for line in present.summary_lines(report, hints=False):
                click.echo(line)
        except OSError as exc:  # stdout on a full disk or a closed pipe: exit 2, and the model stays (verified)
            raise InputError(f"cannot write the summary to stdout ({exc.strerror or exc}); "
                             f"{', '.join(str(p) for p in written)} was written") from None
    _hints(report)
    if not result.changed:
        log.info("no pattern was fused: %s is the input model with onnxfuse metadata added", output_path)
    log.info("wrote %s", ", ".join(str(p) for p in written))


def _hints(report: report_model.Report) -> None:
    """What the user could do to get a fuller result (stderr, INFO)."""
    from onnxfuse.report import present

    hint = present.unknown_shapes_hint(report)
    if hint:
        log.info("%s", hint)
    from onnxfuse.report.remedies import remedy

    refused = [u for u in report.unfused if u["reason"] == "activation-not-supported-by-target"]
    cpu = sum(1 for u in refused if "--target cpu" in remedy(u, report.target).split(" or "))
    if cpu and report.target == "cpu+cuda":
        log.info("hint: %d pattern(s) left unfused because target cpu+cuda needs a kernel on both providers "
                 "(CUDA's FusedConv has Relu only); for a model that runs on CPU only, --target cpu accepts %d of "
                 "them", len(refused), cpu)
