"""The ``onnxfuse`` command: parse options, call the library, render, choose the exit code. Nothing else.

Exit codes: 0 success; 1 the optimized model failed verification (or ``--require-verify`` and verification
was skipped), no model written (a ``--report`` file is, with the verification result); 2 usage error, an input
model that cannot be read or is invalid, or an output that cannot be written; 3 an internal error (a bug in
onnxfuse: one line, ``ONNXFUSE_DEBUG=1`` for the traceback); 130 interrupted (Ctrl-C, SIGINT), 143 terminated
(SIGTERM), 129 hung up (SIGHUP): no partly written or temporary file left.

Results (the optimize summary, a report, bench tables, the pass list) go to stdout; everything else (errors,
warnings, hints, "wrote FILE", progress, ``-v`` detail) goes to stderr. Diagnostics go through :mod:`logging`: the
library's modules log to ``logging.getLogger(__name__)`` (children of the ``onnxfuse`` logger) and this module
gives the ``onnxfuse`` logger one stderr handler whose level follows ``-q`` (errors only: nothing on success),
the default (INFO) and ``-v`` (DEBUG).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from onnxfuse._version import __version__
from onnxfuse.errors import (
    EXIT_INTERNAL,
    InputError,
    OnnxFuseError,
    VerificationError,
    debug_requested,
    internal_error_line,
    interrupted_exit,
)
from onnxfuse.ort.levels import ORT_LEVELS
from onnxfuse.report import escape

if TYPE_CHECKING:
    from onnxfuse import pipeline
    from onnxfuse.model import io as model_io
    from onnxfuse.report import build as rep

# The library (onnx, numpy, onnx-graphsurgeon, onnxruntime, sympy) is imported in the command bodies, not here:
# click parses the command line before it calls a command, so --help, --version and usage errors (an unknown
# option, a missing argument, a value outside a choice) answer without loading it. The choices that --help shows
# are therefore spelled out here; tests/test_startup.py checks them against the library's own lists.

#: providers.TARGETS (its keys, in order) and providers.DEFAULT_TARGET.
TARGET_NAMES = ("cpu+cuda", "cpu", "cuda", "onnx")
DEFAULT_TARGET = "cpu+cuda"
#: providers.DEFAULT_ORT_LEVEL.
DEFAULT_ORT_LEVEL = "all"
#: report.FORMATS.
REPORT_FORMATS = ("text", "json", "markdown", "html")
#: verification.DEFAULT_TIMEOUT_S.
DEFAULT_TIMEOUT_S = 300.0

EXIT_CODES_HELP = """\b
Exit codes:
  0    success
  1    the optimized model failed verification, or --require-verify and
       verification was skipped (no model written; a --report file is,
       with the verification result)
  2    usage error, an input model that cannot be read or is invalid,
       or an OUTPUT that cannot be written
  3    internal error, a bug in onnxfuse (one line; ONNXFUSE_DEBUG=1
       shows the traceback)
  130  interrupted (Ctrl-C); no partly written file is left
  143  terminated (SIGTERM: CI runners, timeout); the same"""

READ_ONLY_EXIT_CODES_HELP = """\b
Exit codes:
  0    success
  2    usage error, or a model that cannot be read or is invalid
  3    internal error, a bug in onnxfuse (ONNXFUSE_DEBUG=1: traceback)
  130  interrupted (Ctrl-C)
  143  terminated (SIGTERM)"""

#: Exit code after SIGINT (Ctrl-C): 128 + signal number 2, the shell convention. Not 1, which means "verification
#: failed". SIGTERM exits 143 and SIGHUP 129 (errors.Interrupted.exit_code).
EXIT_INTERRUPTED = 130

#: The package's root logger: the CLI's own messages, and the parent of every library module's logger.
log = logging.getLogger("onnxfuse")


class _StderrHandler(logging.Handler):
    """Writes each record to the current ``sys.stderr`` through click (looked up at each record, so that click's
    test runner captures it), a ``warning: `` prefix on warnings, no other decoration. The message is escaped
    (:func:`onnxfuse.report.escape.text`): names and paths in it cannot add a line or send an escape sequence."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = escape.text(self.format(record))
            if record.levelno == logging.WARNING:
                message = f"warning: {message}"
            click.echo(message, err=True)
        except Exception:
            self.handleError(record)


def _configure_logging(verbosity: int) -> None:
    """One stderr handler on the ``onnxfuse`` logger: -q (verbosity < 0) ERROR, default INFO, -v DEBUG.
    Replaces the handler of an earlier call (-v/-q after the command name configure it again)."""
    _unconfigure_logging()
    log.addHandler(_StderrHandler())
    log.setLevel(logging.ERROR if verbosity < 0 else logging.INFO if verbosity == 0 else logging.DEBUG)


def _unconfigure_logging() -> None:
    """Remove the CLI's handler and level, so that a process that runs the CLI in-process (tests, scripts) keeps
    its own logging set-up afterwards."""
    for handler in [h for h in log.handlers if isinstance(h, _StderrHandler)]:
        log.removeHandler(handler)
    log.setLevel(logging.NOTSET)


def _fail_cleanly(fn):
    """Turn an OnnxFuseError into a one-line ``error: ...`` on stderr and its exit code, and Ctrl-C into one line
    and exit code 130, SIGTERM 143, SIGHUP 129 (click's own handling would exit 1, the code for a failed
    verification), and any other exception (a bug) into one line and exit code 3 (``errors.EXIT_INTERNAL``; with
    ``ONNXFUSE_DEBUG=1`` it is re-raised with its traceback); click's own exceptions pass through to click. Files
    are written whole or not at all (temporary file, then rename), so an interrupt leaves no partly written file."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM/SIGHUP (errors.Interrupted, from __main__.run)
            message, code = interrupted_exit(exc)
            click.echo(message, err=True)
            sys.exit(code)
        except OnnxFuseError as exc:
            click.echo(f"error: {escape.text(exc)}", err=True)  # one line: a name in it adds none
            sys.exit(exc.exit_code)
        except OSError as exc:  # the file system refused (a name too long, a permission): not a bug of onnxfuse
            where = f"{escape.text(exc.filename)}: " if exc.filename else ""
            click.echo(f"error: {where}{exc.strerror or escape.text(exc)}", err=True)
            sys.exit(InputError.exit_code)
        except UnicodeDecodeError:  # protobuf hands invalid UTF-8 in a string field to Python as it is
            click.echo("error: the model holds a name or string that is not valid UTF-8", err=True)
            sys.exit(InputError.exit_code)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as exc:
            if debug_requested():
                raise
            click.echo(internal_error_line(exc), err=True)
            sys.exit(EXIT_INTERNAL)

    return wrapper


def _shapes(values: tuple[str, ...]) -> dict[str, tuple[int, ...]]:
    from onnxfuse.model.shape_text import parse_input_shape

    return _pairs(values, parse_input_shape, "--input-shape")


def _pairs(values: tuple[str, ...], parse, option: str) -> dict:
    out = {}
    for text in values:
        name, value = parse(text)
        if name in out:
            raise InputError(f"{option} {name} is given twice")
        out[name] = value
    return out


def input_value_options(fn):
    """--input-value and --input-range, for every command that runs onnxruntime."""
    fn = click.option("--input-range", multiple=True, metavar="NAME=LOW,HIGH",
                      help="Seeded uniform values in [LOW, HIGH) for a float input, integers in [LOW, HIGH] for an "
                           "integer one (repeatable).")(fn)
    return click.option("--input-value", multiple=True, metavar="NAME=V",
                        help="Feed this value to an input (a scalar, or a fill value for the input's shape), e.g. "
                             "sr=16000 (repeatable).")(fn)


def verify_options(fn):
    """The options of ``optimize`` and ``verify`` that say how to compare."""
    decorators = [
        click.option("--input-data", type=click.Path(exists=True, dir_okay=False), metavar="FILE.npz",
                     help="Real inputs for verification: an .npz with one array per graph input name."),
        input_value_options,
        click.option("--input-sets", type=click.IntRange(1), default=1, show_default=True,
                     help="Seeded random input sets to compare on (each costs one more onnxruntime run per model)."),
        click.option("--rtol", type=click.FloatRange(min=0),
                     help="Use elementwise |got - ref| <= atol + rtol * |ref| instead of the noise-floor rule "
                          "(a missing one is 0)."),
        click.option("--atol", type=click.FloatRange(min=0),
                     help="Absolute tolerance of that elementwise rule (see --rtol)."),
        click.option("--verify-timeout", type=click.FloatRange(min=0), metavar="SECONDS",
                     help="Time for every onnxruntime run of the verification together; when it runs out "
                          f"verification is skipped (reason: time), never hangs. 0: no limit. [default: "
                          f"{DEFAULT_TIMEOUT_S:g}]"),
    ]
    for deco in reversed(decorators):
        fn = deco(fn)
    return fn


def _verify_options(input_shapes, input_data, input_value, input_range, input_sets, rtol, atol, verify_timeout=None):
    from onnxfuse.ort.sessions import parse_input_range, parse_input_value
    from onnxfuse.verification.options import VerifyOptions, timeout_seconds

    for name, value in (("--rtol", rtol), ("--atol", atol), ("--verify-timeout", verify_timeout)):
        if value is not None and not math.isfinite(value):
            raise InputError(f"{name} must be a finite number")
    if input_data is not None:
        from onnxfuse import pipeline

        pipeline.check_regular_file(input_data, "--input-data")  # /dev/zero would be read forever
    return VerifyOptions(input_shapes, input_data, _pairs(input_value, parse_input_value, "--input-value"),
                         _pairs(input_range, parse_input_range, "--input-range"), input_sets, rtol, atol,
                         timeout=timeout_seconds(verify_timeout))


def _warn_unverified(verification, strict_option: bool = True) -> None:
    """What verification did not check, as ``warning:`` lines on stderr (Verification.unchecked)."""
    for line in verification.unchecked(strict_option):
        log.warning("%s", line)


def _options(target, only, skip, input_shape, constant_initializer_inputs, ort_level,
             ort_version=None) -> pipeline.Options:
    from onnxfuse import pipeline

    if only and set(only) <= set(skip):
        raise InputError("--only and --skip leave no pass to run")
    return pipeline.Options(target=target, only=tuple(only), skip=tuple(skip), input_shapes=_shapes(input_shape),
                            constant_initializer_inputs=constant_initializer_inputs,
                            ort_level=ort_level or DEFAULT_ORT_LEVEL, ort_version=ort_version)


def _verbosity(ctx: click.Context) -> int:
    return ctx.find_root().obj.get("verbosity", 0)


def _set_verbosity(ctx: click.Context, param: click.Parameter, value) -> None:
    root = ctx.find_root()
    root.ensure_object(dict)
    if param.name == "quiet" and value:
        root.obj["verbosity"] = -1
    elif param.name == "verbose" and value and root.obj.get("verbosity", 0) >= 0:
        root.obj["verbosity"] = root.obj.get("verbosity", 0) + value
    _configure_logging(root.obj.get("verbosity", 0))


def verbosity_options(fn):
    """-v/--verbose and -q/--quiet, accepted before or after the command name."""
    fn = click.option("-q", "--quiet", is_flag=True, expose_value=False, callback=_set_verbosity,
                      help="Print nothing on success, only errors (report and bench still print their "
                           "results).")(fn)
    return click.option("-v", "--verbose", count=True, expose_value=False, callback=_set_verbosity,
                        help="More diagnostics on stderr (pass statistics, every pattern left unfused).")(fn)


@contextlib.contextmanager
def _progress(ctx: click.Context, message: str):
    """A spinner on stderr while ``message`` runs, only when stderr is a terminal and not --quiet."""
    if sys.stderr.isatty() and _verbosity(ctx) >= 0:
        from rich.console import Console
        from rich.text import Text

        with Console(stderr=True).status(Text(escape.text(message))):  # Text: no markup read in a file name
            yield
    else:
        yield


class _PassChoice(click.Choice):
    """``click.Choice`` over ``onnxfuse.passes.PASS_NAMES``, looked up (which imports the passes and
    onnx-graphsurgeon) only when a value is checked: --only and --skip show the metavar PASS in --help."""

    def __init__(self) -> None:
        super().__init__(())

    @property
    def choices(self) -> tuple[str, ...]:
        from onnxfuse.passes import PASS_NAMES

        return tuple(PASS_NAMES)

    @choices.setter
    def choices(self, value) -> None:
        pass  # click.Choice.__init__ assigns the (empty) sequence given above; the names come from the property


def pass_options(fn):
    """Options shared by ``optimize``, ``report`` and ``bench``."""
    decorators = [
        click.option("--target", type=click.Choice(TARGET_NAMES), default=DEFAULT_TARGET, show_default=True,
                     help="What the output must run on: cpu+cuda (float32 FusedConv with Relu only), cpu (every "
                          "activation the CPU kernel has), cuda, or onnx (folds only, no contrib ops)."),
        click.option("--only", multiple=True, type=_PassChoice(), metavar="PASS",
                     help="Run only this pass (repeatable). See: onnxfuse passes."),
        click.option("--skip", multiple=True, type=_PassChoice(), metavar="PASS",
                     help="Do not run this pass (repeatable)."),
        click.option("--input-shape", multiple=True, metavar="NAME=DIMS",
                     help="Concrete shape for a graph input with symbolic dims, e.g. x=1x3x640x640 (also x:1,3,640,640 "
                          "and x:[1,3,640,640], as onnxsim, onnxslim and Polygraphy write it; repeatable)."),
        click.option("--ort-level", type=click.Choice(list(ORT_LEVELS)), default=None,
                     help="The onnxruntime graph optimization level your sessions run at (default: all, "
                          "onnxruntime's own default). Forms measured slower than the unfused original at that "
                          "level are left unfused (today: FusedConv with a residual input at all, where "
                          "onnxruntime's NCHWc convs run the unfused chain faster)."),
        click.option("--ort-version", metavar="X.Y",
                     help="The onnxruntime release the model will run on (default: the installed one). Forms "
                          "that release cannot load are left unfused; the summary and the model's metadata say "
                          "which release the output needs."),
        click.option("--constant-initializer-inputs", is_flag=True,
                     help="Treat initializers that are also graph inputs (IR < 4 style) as constants, so they "
                          "can be folded. Only if nobody feeds those inputs at run time."),
    ]
    for deco in reversed(decorators):
        fn = deco(fn)
    return fn


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


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
             epilog=EXIT_CODES_HELP)
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Show the versions of onnxfuse and of the libraries that decide its output, and exit.")
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
    _configure_logging(_verbosity(ctx))
    ctx.call_on_close(_unconfigure_logging)


@main.command(epilog=EXIT_CODES_HELP)
@click.argument("input_path", metavar="INPUT", type=click.Path(dir_okay=True, path_type=Path))
@click.argument("output_arg", metavar="OUTPUT", type=click.Path())
@pass_options
@click.option("--no-verify", is_flag=True, help="Skip the onnxruntime comparison (the report says so).")
@click.option("--require-verify", is_flag=True, help="Exit 1 when verification is skipped (strict CI).")
@verify_options
@click.option("--report", "report_paths", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the full report here (.json, .md, .txt or .html; repeatable, one file per format "
                   "from its extension: --report r.json --report r.md).")
@click.option("--report-format", type=click.Choice(REPORT_FORMATS),
              help="Format of a single --report (default: from its extension).")
@click.option("--bandwidth", type=click.FloatRange(min=0, min_open=True), metavar="GB/S",
              help="Add an estimated memory time at this bandwidth (10^9 bytes/s).")
@click.option("--in-place", "--overwrite", "overwrite", is_flag=True,
              help="Allow OUTPUT to be INPUT itself: the input model is replaced (atomically, after verification). "
                   "Any other existing OUTPUT is always replaced, as a build step's output is; --overwrite is the "
                   "old name of this flag.")
@click.option("--materialize-weights", type=click.FloatRange(min=0), default=0, metavar="MIB",
              help="Let the output grow by up to this many MiB (2^20 bytes) to store conv/Gemm weights that the model "
                   "computes from compact constants (int8 x scale, ConstantOfShape) as plain floats. Default 0: "
                   "they stay compact and folds go into their scale; onnxruntime computes them at load.")
@verbosity_options
@click.pass_context
@_fail_cleanly
def optimize(ctx, input_path, output_arg, target, only, skip, input_shape, ort_level, ort_version,
             constant_initializer_inputs, no_verify, require_verify, input_data, input_value, input_range, input_sets,
             rtol, atol, verify_timeout, report_paths, report_format, bandwidth, overwrite, materialize_weights):
    """Fuse INPUT and write the verified result to OUTPUT (atomically; INPUT is never modified).

    \b
    Examples:
      onnxfuse optimize resnet.onnx resnet.fused.onnx
      onnxfuse optimize det.onnx det.fused.onnx --target cpu \\
          --input-shape x=1x3x640x640
      onnxfuse optimize m.onnx m.fused.onnx --report traffic.json \\
          --require-verify
    """
    _shapes(input_shape)  # a malformed --input-shape is a usage error: answered before the libraries load
    from onnxfuse import pipeline
    from onnxfuse.model import io as model_io
    from onnxfuse.report import build as rep

    output_path = Path(output_arg)
    if output_path.is_dir() or output_arg.endswith(("/", os.sep)):
        raise InputError(f"{output_path}: OUTPUT is a directory; give a file name")
    if bandwidth is not None and not math.isfinite(bandwidth):
        raise InputError("--bandwidth must be a finite number")
    if model_io.same_file(input_path, output_path) and not overwrite:
        raise InputError(f"{output_path}: OUTPUT is the same file as INPUT; pass --in-place to replace the input")
    _check_folder(output_path, "OUTPUT")
    reports = _report_files(report_paths, report_format)
    for report_path, _ in reports:
        _check_folder(report_path, "--report")
        for other, what in ((input_path, "INPUT"), (output_path, "OUTPUT")):
            if model_io.same_file(report_path, other):
                raise InputError(f"--report {report_path}: is the same file as {what}; choose another name")
        if _names_a_data_file_of(report_path, output_path):
            raise InputError(f"--report {report_path}: has the name of an external data file of OUTPUT (written or "
                             "removed with it when the model has external data or is over 2 GB); choose another name")
    options = _options(target, only, skip, input_shape, constant_initializer_inputs, ort_level, ort_version)
    options.input_data = input_data  # real inputs fix the report's shapes too
    if not math.isfinite(materialize_weights):
        raise InputError("--materialize-weights must be a finite number of MiB")
    options.materialize_weights_bytes = int(materialize_weights * 2**20)
    # the summary shows numbers only: with input shapes that fix every dim, no symbolic expressions are needed
    options.expressions = bool(reports)
    options.compare_with_onnxruntime = not no_verify  # --no-verify runs no onnxruntime session at all
    checked = _verify_options(options.input_shapes, input_data, input_value, input_range, input_sets, rtol, atol,
                              verify_timeout)
    verify_options = None if no_verify else checked
    log.debug("optimizing %s for target %s", input_path, target)
    with _progress(ctx, f"optimizing {input_path}"):
        result = pipeline.optimize(input_path, options, verify_options)
    report = result.report
    if bandwidth:
        report.set_bandwidth(bandwidth)
    _diagnostics(report)
    verification = report.verification
    if any(model_io.same_file(output_path, f) for f in result.loaded.data_files):
        raise InputError(f"{output_path}: OUTPUT is an external data file of INPUT; choose another name")
    refused = verification.status == "failed" or (verification.status == "skipped" and require_verify)
    report_texts = []
    for report_path, fmt in reports:
        _check_not_data_file(report_path, "--report", result.loaded)
        report_texts.append((report_path, rep.render(report, fmt, show_all=True)))
        if refused:  # the report says why no model is written
            _write_text(report_path, report_texts[-1][1])
    if not (verification.status == "skipped" and require_verify):
        _warn_unverified(verification)
    if verification.status == "failed":
        failed = verification.failed_outputs
        for o in failed:
            log.error("  %s", o.describe(verification.floor_multiple))
        why = f"{len(failed)} of {len(verification.outputs)} outputs differ, above" if failed else verification.reason
        raise VerificationError(f"{input_path}: the optimized model does not match the original ({why}); "
                                f"{output_path} was not written")
    if verification.status == "skipped" and require_verify:
        raise VerificationError(f"{input_path}: verification was skipped ({verification.reason}) and "
                                f"--require-verify was given; {output_path} was not written")
    # the input's data files are never replaced or removed, also with --in-place: another copy of the model (or
    # another model of the same export) may read them
    written = model_io.save_model(result.model, output_path, external_data=result.loaded.external_data,
                                  protected=result.loaded.data_files)
    _chart_note(report, [fmt for _, fmt in reports])
    for report_path, report_text in report_texts:  # after the model: a model not written leaves no report either
        try:
            _write_text(report_path, report_text)
        except InputError as exc:
            raise InputError(f"{exc}; {', '.join(str(p) for p in written)} was written") from None
        written.append(report_path)
    if _verbosity(ctx) >= 0:  # the results; -q prints nothing on success
        if verification.status == "skipped":
            click.echo(f"NOT VERIFIED: {verification.reason}")
        for line in rep.summary_lines(report, hints=False):
            click.echo(line)
    _hints(report)
    if not result.changed:
        log.info("no pattern was fused: %s is the input model with onnxfuse metadata added", output_path)
    log.info("wrote %s", ", ".join(str(p) for p in written))


def _chart_note(report, formats) -> None:
    """Say on stderr (INFO) at which sizes an HTML report's chart is drawn when the model's dims are symbolic and
    have no value (``report_html.chart_sizes``)."""
    if "html" not in formats:
        return
    from onnxfuse.report.html import chart_sizes

    sizes = chart_sizes(report.to_dict())
    if sizes is not None:
        at = ", ".join(f"{k}={v}" for k, v in sizes[0].items())
        log.info("the HTML report's chart draws each layer at %s (%s); give --input-shape for your sizes", at,
                 sizes[1])


def _report_files(paths: tuple[Path, ...], report_format: str | None, option: str = "--report",
                  format_option: str = "--report-format") -> list[tuple[Path, str]]:
    """``(path, format)`` for each report file (``optimize --report``, ``report -o``): the format from
    ``format_option`` (one file only) or from the file's extension.

    Raises:
        InputError: an extension without a format, ``--report-format`` with several reports, or one file twice.
    """
    from onnxfuse.report import build as rep

    if report_format is not None and len(paths) > 1:
        raise InputError(f"{format_option} applies to a single {option}; with several, each format comes from "
                         "its file's extension")
    out = []
    for path in paths:
        fmt = report_format or rep.format_for_path(str(path))
        if fmt is None:
            raise InputError(f"{option} {path}: give a {', '.join(rep.REPORT_EXTENSIONS)} name, or {format_option}")
        if any(os.path.abspath(path) == os.path.abspath(p) for p, _ in out):
            raise InputError(f"{option} {path}: given twice")
        out.append((path, fmt))
    return out


def _names_a_data_file_of(path: Path, output: Path) -> bool:
    """True when ``path`` has the name of an external data file that ``model_io.save_model`` may write or remove
    beside ``output`` (through a symlinked output, beside the file it points to): ``<name>.data``, or
    ``model_io.data_file_name``'s ``<name, shortened from its end to fit NAME_MAX>.<16 hex digits>.data``."""
    import re

    target = _resolve(output, "OUTPUT") if output.is_symlink() else Path(os.path.abspath(output))
    if _resolve(Path(os.path.abspath(path)).parent, "--report") != _resolve(target.parent, "OUTPUT"):
        return False
    if path.name == target.name + ".data":
        return True
    found = re.fullmatch(r"(.+)\.[0-9a-f]{16}\.data", path.name)
    return found is not None and target.name.startswith(found.group(1))


def _resolve(path: Path, what: str) -> Path:
    """``path.resolve()``; a symbolic link that loops is an input error (Python raises RuntimeError or OSError)."""
    try:
        return path.resolve()
    except (RuntimeError, OSError) as exc:
        raise InputError(f"{what} {path}: cannot follow the symbolic link ({exc})") from None


def _check_not_data_file(path: Path, what: str, loaded: model_io.LoadedModel) -> None:
    """Refuse to write a report over one of the input model's external data files (its weights)."""
    from onnxfuse.model import io as model_io

    if any(model_io.same_file(path, f) for f in loaded.data_files):
        raise InputError(f"{what} {path}: is an external data file of the input model; choose another name")


def _check_folder(path: Path, what: str) -> None:
    """Fail before the expensive work when ``path`` cannot be written, or names something that is not a
    regular file (replacing /dev/null or a FIFO with a file would be destructive)."""
    import os

    if path.exists() and not path.is_file():
        raise InputError(f"{what} {path}: exists and is not a regular file; onnxfuse will not replace it")
    folder = _resolve(path, what).parent
    if not folder.is_dir():
        raise InputError(f"{what} {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise InputError(f"{what} {path}: the folder {folder} is not writable")


def _diagnostics(report: rep.Report) -> None:
    """Warnings on stderr; with -v also the pass statistics and every pattern left unfused."""
    for warning in report.warnings or []:
        log.warning("%s", warning)
    for s in report.pass_stats:
        skipped = ", ".join(f"{k} {v}" for k, v in s["skipped"].items()) or "none skipped"
        log.debug("pass %s: %s rewrites; %s", s["name"], s["applied"], skipped)
    for u in report.unfused:
        chain = " -> ".join(n["op"] for n in u["nodes"])
        log.debug("unfused %s (%s): %s: %s", u["nodes"][0]["name"] or u["nodes"][0]["output"], chain, u["reason"],
                  u["detail"])


def _hints(report: rep.Report) -> None:
    """What the user could do to get a fuller result (stderr, INFO)."""
    from onnxfuse.report import build as rep

    hint = rep.unknown_shapes_hint(report)
    if hint:
        log.info("%s", hint)
    refused = sum(1 for u in report.unfused if u["reason"] == "activation-not-supported-by-target")
    if refused and report.target == "cpu+cuda":
        log.info("hint: %d pattern(s) left unfused because target cpu+cuda needs a kernel on both providers "
                 "(CUDA's FusedConv has Relu only); for a model that runs on CPU only, --target cpu fuses those "
                 "the CPU kernel accepts", refused)


def _write_text(path: Path, text: str) -> None:
    """Write a report file atomically (same contract as the model), with the usual umask permissions."""
    import os
    import tempfile

    _check_folder(path, "report")
    folder = path.resolve().parent
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:64]}.", suffix=".tmp", dir=folder)  # any legal name
    except OSError as exc:  # /proc, /sys: the folder passes os.access but takes no new file
        raise InputError(f"{path}: cannot write the report ({exc.strerror or exc})") from None
    replaced = False
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
        replaced = True
    except OSError as exc:
        raise InputError(f"{path}: cannot write the report ({exc.strerror or exc})") from None
    finally:  # also on Ctrl-C
        if not replaced:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


REPORT_EXIT_CODES_HELP = """\b
Exit codes:
  0  success (with --baseline: no regression)
  1  with --baseline: a fusion was lost or the optimized traffic grew
  2  usage error, or a model or baseline that cannot be read or is invalid
  3  internal error, a bug in onnxfuse (ONNXFUSE_DEBUG=1: traceback)"""


@main.command(epilog=REPORT_EXIT_CODES_HELP)
@click.argument("model_path", metavar="MODEL", type=click.Path(path_type=Path))
@pass_options
@click.option("--input-data", type=click.Path(exists=True, dir_okay=False), metavar="FILE.npz",
              help="Real inputs: their array shapes fix the input shapes of the report.")
@click.option("--format", "fmt", type=click.Choice(REPORT_FORMATS),
              help="Output format (default: from the -o extension, else text); html is one "
                   "self-contained page with charts.")
@click.option("-o", "--output", "outputs", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Write the report to this file instead of stdout (.json, .md, .txt or .html; repeatable, each "
                   "format from its extension: -o r.json -o r.md).")
@click.option("--all", "show_all", is_flag=True,
              help="Show every row (text and Markdown show the top 20; JSON and HTML always show all).")
@click.option("--bandwidth", type=click.FloatRange(min=0, min_open=True), metavar="GB/S",
              help="Add an estimated memory time at this bandwidth (10^9 bytes/s).")
@click.option("--baseline", type=click.Path(dir_okay=False, path_type=Path), metavar="OLD.json",
              help="Compare with an earlier JSON report: print what changed, exit 1 if a fusion was lost or the "
                   "optimized traffic grew.")
@click.option("--profile", is_flag=True,
              help="Also run the original and the optimized model under onnxruntime's profiler at --ort-level "
                   "(one thread): measured time and bytes per op and per fusion beside the counted ones.")
@verbosity_options
@click.pass_context
@_fail_cleanly
def report(ctx, model_path, target, only, skip, input_shape, ort_level, ort_version, constant_initializer_inputs,
           input_data, fmt, outputs, show_all, bandwidth, baseline, profile):
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
    _shapes(input_shape)  # a malformed --input-shape is a usage error: answered before the libraries load
    from onnxfuse import pipeline
    from onnxfuse.model import io as model_io
    from onnxfuse.report import build as rep

    if baseline is not None:
        from onnxfuse.report import baseline as baseline_mod  # it imports sympy: only --baseline needs it

    files = _report_files(outputs, fmt, "-o", "--format") if outputs else []
    for path, _ in files:
        _check_folder(path, "--output")
        if model_io.same_file(path, model_path):
            raise InputError(f"-o {path}: is the same file as the model; choose another name")
    output = files[0][0] if files else None
    fmt = files[0][1] if files else (fmt or "text")
    if bandwidth is not None and not math.isfinite(bandwidth):
        raise InputError("--bandwidth must be a finite number")
    old = baseline_mod.load(baseline) if baseline is not None else None
    options = _options(target, only, skip, input_shape, constant_initializer_inputs, ort_level, ort_version)
    options.input_data = input_data
    with _progress(ctx, f"analysing {model_path}"):
        result = pipeline.analyse(model_path, options)
    if bandwidth:
        result.report.set_bandwidth(bandwidth)
    if profile and result.changed:
        from onnxfuse.errors import one_line
        from onnxfuse.ort import profile as ort_profile

        with _progress(ctx, "running both models under onnxruntime's profiler"):
            try:
                result.report.profile = ort_profile.profile_models(
                    result.loaded.ort_source(), result.model, result.report.to_dict()["fusions"], options.ort_level,
                    {k: tuple(v) for k, v in result.report.input_shapes.items()})
            except Exception as exc:  # onnxruntime cannot run a model on generated inputs: the report says so
                result.report.warnings = [*(result.report.warnings or []),
                                          f"--profile: onnxruntime could not run the models ({one_line(exc)})"]
    _diagnostics(result.report)
    for path, _ in files:
        _check_not_data_file(path, "-o", result.loaded)
    for path, path_fmt in files:
        _write_text(path, rep.render(result.report, path_fmt, show_all, width=_text_width(path)))
    if files:
        _chart_note(result.report, [f for _, f in files])
        log.info("wrote %s", ", ".join(str(p) for p, _ in files))
    elif old is None:
        click.echo(rep.render(result.report, fmt, show_all, width=_text_width(None)), nl=False)
    if old is not None:
        differences = baseline_mod.option_differences(old, result.report.to_dict())
        if differences:
            raise InputError(f"--baseline {baseline}: made with other options ({'; '.join(differences)}); a change "
                             "of options is no regression of the model: make both reports with the same options")
        comparison = baseline_mod.compare(old, result.report.to_dict())
        if fmt == "json" and output is None:
            import json

            click.echo(json.dumps(comparison.to_dict(), indent=2, sort_keys=True))
        else:
            bullet, safe = ("- ", escape.markdown) if fmt == "markdown" else ("", escape.text)
            lines = [f"compared with {safe(baseline)}:", *comparison.lines(fmt)]
            click.echo("\n".join(f"{bullet}{line}" for line in lines))
        if comparison.regressed:
            sys.exit(1)


@main.command(epilog=READ_ONLY_EXIT_CODES_HELP)
@click.argument("original", type=click.Path(path_type=Path))
@click.argument("optimized", required=False, type=click.Path(path_type=Path))
@pass_options
@click.option("--runs", type=click.IntRange(1), default=16, show_default=True,
              help="Paired rounds per level at least (each runs original, optimized, optimized, original); a "
                   "verdict needs 14 or more.")
@click.option("--max-time", type=click.FloatRange(0), default=20.0, show_default=True, metavar="SECONDS",
              help="Per level: after --runs rounds, rounds go on until the verdict is decided or this much time "
                   "of timed rounds is spent (0: exactly --runs rounds).")
@click.option("--margin", type=click.FloatRange(0, 50, max_open=True), default=2.0, show_default=True,
              metavar="PERCENT", help="Equivalence margin: 'same' needs the ratio's interval within 1 +- this.")
@click.option("--warmup", type=click.IntRange(0), default=3, show_default=True, help="Untimed runs first.")
@click.option("--threads", type=click.IntRange(1), default=1, show_default=True, help="onnxruntime intra-op threads.")
@click.option("--level", "levels", multiple=True, type=click.Choice(list(ORT_LEVELS)),
              help="Graph optimization level to time (repeatable; default all four).")
@click.option("--input-data", type=click.Path(exists=True, dir_okay=False), metavar="FILE.npz",
              help="Real inputs: an .npz with one array per graph input name.")
@input_value_options
@click.option("--profile", is_flag=True,
              help="Also run both models under onnxruntime's profiler at each level: time and bytes per kernel, "
                   "per op and per fusion (JSON: every kernel).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@verbosity_options
@click.pass_context
@_fail_cleanly
def bench(ctx, original, optimized, target, only, skip, input_shape, ort_level, ort_version,
          constant_initializer_inputs, runs, max_time, margin, warmup, threads, levels, input_data, input_value,
          input_range, profile, fmt):
    """Time onnxruntime inference of ORIGINAL and OPTIMIZED (optimized in memory from ORIGINAL with the same
    options as `optimize` when not given) at each graph optimization level, in paired rounds; say faster, slower,
    same or inconclusive from the ratio's interval, and when onnxruntime runs the same kernels for both.

    \b
    Examples:
      onnxfuse bench model.onnx
      onnxfuse bench det.onnx det.fused.onnx --input-shape x=1x3x640x640 \\
          --runs 50 --format json
    """
    _shapes(input_shape)  # a malformed --input-shape is a usage error: answered before the libraries load
    import tempfile

    from onnxfuse import bench as bench_mod
    from onnxfuse import pipeline
    from onnxfuse.model import io as model_io

    if optimized is not None:
        ignored = [f"--{name.replace('_', '-')}" for name in ("target", "only", "skip", "ort_level", "ort_version",
                                                               "constant_initializer_inputs")
                   if ctx.get_parameter_source(name) != click.core.ParameterSource.DEFAULT]
        if ignored:
            raise InputError(f"{', '.join(ignored)} only shape{'' if len(ignored) > 1 else 's'} the in-memory "
                             "optimization, which does not run when OPTIMIZED is given; drop "
                             f"{'them' if len(ignored) > 1 else 'it'} or OPTIMIZED")
    options = _options(target, only, skip, input_shape, constant_initializer_inputs, ort_level, ort_version)
    levels = tuple(levels) or ORT_LEVELS
    bench_options = bench_mod.BenchOptions(runs=runs, max_time=max_time, margin=margin / 100, warmup=warmup,
                                           threads=threads, levels=levels, input_shapes=options.input_shapes,
                                           input_data=input_data, profile=profile)
    options.compare_with_onnxruntime = False  # bench measures onnxruntime itself
    checked = _verify_options({}, input_data, input_value, input_range, 1, None, None)
    bench_options.input_values, bench_options.input_ranges = checked.input_values, checked.input_ranges
    with tempfile.TemporaryDirectory(prefix="onnxfuse-bench-") as tmp:
        loaded = model_io.load_model(original)  # a bad ORIGINAL is an input error (exit 2), not an onnxruntime failure
        if optimized is None:
            # One model per timed level, optimized for that level's sessions (unless --ort-level says which).
            targets = {level: ort_level or level for level in levels}
            paths, changed, fusions = {}, {}, {}
            for wanted in dict.fromkeys(targets.values()):
                options.ort_level = wanted
                with _progress(ctx, f"optimizing {original} in memory for onnxruntime level {wanted}"):
                    result = pipeline.analyse(original, options, loaded if len(paths) == 0 else None)
                paths[wanted] = Path(tmp) / f"optimized.{wanted}.onnx"
                changed[wanted] = result.changed
                fusions[wanted] = result.report.to_dict()["fusions"]
                model_io.save_model(result.model, paths[wanted], external_data=result.loaded.external_data)
            if not any(changed.values()):
                log.warning("nothing was fused (target %s): the optimized model is the original; nothing to time",
                            target)
                if fmt == "json":
                    import json

                    click.echo(json.dumps({"original": str(original), "optimized": None, "nothing_fused": True,
                                           "levels": []}, indent=2, sort_keys=True))
                return
            optimized_for = {level: str(paths[targets[level]]) for level in levels}
            bench_options.fusions = {level: fusions[targets[level]] for level in levels}
        else:
            other = model_io.load_model(optimized)
            if _same_graph(loaded.model, other.model):
                log.warning("OPTIMIZED has the same graph as ORIGINAL: timing the model against itself")
            optimized_for = str(optimized)
            targets = dict.fromkeys(levels)
        with _progress(ctx, "timing onnxruntime sessions"):
            try:
                data = bench_mod.bench(str(original), optimized_for, bench_options)
            except RuntimeError as exc:
                raise InputError(str(exc)) from None
    data["optimized"] = str(optimized) if optimized is not None else "(optimized in memory)"
    for row in data["levels"]:
        row["optimized_for_ort_level"] = targets[row["level"]]
    if data["invented_shapes"]:
        used = ", ".join(f"{k}={'x'.join(map(str, data['input_shapes'][k]))}" for k in data["invented_shapes"])
        log.warning("no shape given for %s; timed with invented sizes (%s), not the model's real ones: pass "
                    "--input-shape", ", ".join(data["invented_shapes"]), used)
    if fmt == "json":
        import json

        click.echo(json.dumps({**data, "nothing_fused": False}, indent=2, sort_keys=True))
    else:
        click.echo(bench_mod.to_text(data), nl=False)
        if profile:
            click.echo(bench_mod.profile_text(data), nl=False)


def _same_graph(a, b) -> bool:
    """True when two ModelProtos have byte-identical main graphs (metadata aside)."""
    return a.graph.SerializeToString(deterministic=True) == b.graph.SerializeToString(deterministic=True)


VERIFY_EXIT_CODES_HELP = """\b
Exit codes:
  0  passed
  1  failed: an output differs beyond tolerance, the outputs' names,
     order or dtypes differ, or onnxruntime cannot run CANDIDATE
  2  usage error, a model that cannot be read or is invalid, or
     verification skipped (onnxruntime cannot run ORIGINAL on the
     inputs, or --verify-timeout ran out)
  3  internal error, a bug in onnxfuse (ONNXFUSE_DEBUG=1: traceback)"""


@main.command("verify", epilog=VERIFY_EXIT_CODES_HELP)
@click.argument("original", type=click.Path(path_type=Path))
@click.argument("candidate", type=click.Path(path_type=Path))
@click.option("--input-shape", multiple=True, metavar="NAME=DIMS",
              help="Concrete shape for a graph input with symbolic dims, e.g. x=1x3x640x640 (also x:1,3,640,640 "
                          "and x:[1,3,640,640], as onnxsim, onnxslim and Polygraphy write it; repeatable).")
@verify_options
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@verbosity_options
@click.pass_context
@_fail_cleanly
def verify_command(ctx, original, candidate, input_shape, input_data, input_value, input_range, input_sets, rtol,
                   atol, verify_timeout, fmt):
    """Check that CANDIDATE computes what ORIGINAL does, in onnxruntime (any pair of models: onnxfuse's output,
    another optimizer's, a hand-edited graph). Both run with graph optimizations disabled on the same inputs; an
    output passes when it differs by no more than onnxruntime's own noise (how much its optimization levels change
    the original's outputs) and a rounding floor allow; --rtol/--atol replace that rule with fixed tolerances.

    \b
    Examples:
      onnxfuse verify model.onnx model.fused.onnx
      onnxfuse verify vad.onnx vad.slim.onnx --input-value sr=16000 \\
          --input-shape input=1x512
    """
    _shapes(input_shape)  # a malformed --input-shape is a usage error: answered before the libraries load
    from onnxfuse.model import io as model_io
    from onnxfuse.verification import verify as verify_mod

    opts = _verify_options(_shapes(input_shape), input_data, input_value, input_range, input_sets, rtol, atol,
                           verify_timeout)
    for path in (original, candidate):
        model_io.load_model(path)  # unreadable or invalid: an input error (exit 2)
    with _progress(ctx, "running both models in onnxruntime"):
        result = verify_mod.verify_models(original, candidate, opts)
    if fmt == "json":
        import json

        click.echo(json.dumps(result.to_dict(), indent=2, sort_keys=True))
    else:
        click.echo(_verification_text(result), nl=False)
    _warn_unverified(result, strict_option=False)
    if result.status == "skipped":
        raise InputError(f"verification skipped: {result.reason}")
    if result.status == "failed":
        raise VerificationError(f"{candidate} does not match {original}")


def _verification_text(result) -> str:
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


@main.command()
def passes():
    """List the passes in the order they run, and the reasons a pass can decline a pattern."""
    from onnxfuse.passes import ALL_PASSES

    for p in ALL_PASSES:
        click.echo(f"{p.name:<16} {p.summary}")
        click.echo(f"{'':<16} declines: {', '.join(r.value for r in p.reasons)}")


def _text_width(output: Path | None) -> int:
    """Columns for text reports: the terminal's when stdout is one, else 120."""
    import shutil

    if output is None and sys.stdout.isatty():
        return max(80, shutil.get_terminal_size((120, 24)).columns)
    return 120


BATCH_EXIT_CODES_HELP = """\b
Exit codes:
  0    every model was optimized and verified (or taken from the cache)
  1    a model failed verification, or --baseline found a regression
  2    usage error, or a model failed otherwise (unreadable or refused,
       crashed, timed out, over --max-memory): its row says why
  130  interrupted (Ctrl-C); OUTDIR holds only complete files"""


@main.command(epilog=BATCH_EXIT_CODES_HELP)
@click.argument("inputs", nargs=-1, metavar="INPUTS...")  # none: an error below, after the --ray check
@click.option("-o", "--outdir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Folder for the optimized models (models/), their reports (reports/) and the summary "
                   "(summary.json, summary.md, index.html).")
@click.option("-j", "--jobs", type=click.IntRange(1), help="Worker processes (default: as many as the cores and the "
              "available memory allow).")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="Fail a model that takes longer (its worker is killed).")
@click.option("--max-memory", metavar="SIZE", help="Cap each worker's memory, e.g. 2G (address space, "
              "RLIMIT_AS; with --ray, the memory each task declares).")
@click.option("--shard", metavar="K/N", help="Process only the K-th of N stable shares of the models (CI matrices).")
@click.option("--merge", is_flag=True, help="INPUTS are summary.json files of shards: join them into one summary "
              "in OUTDIR.")
@click.option("--baseline", type=click.Path(dir_okay=False, path_type=Path), metavar="OLD.json",
              help="Compare with an earlier summary.json: exit 1 if a model lost a fusion or its traffic grew.")
@click.option("--ray", "ray_address", is_flag=False, flag_value="", default=None, metavar="[ADDRESS]",
              help="Run the models as Ray tasks (pip install 'onnxfuse[ray]'): --ray starts or finds a local "
                   "cluster, --ray=ADDRESS joins one (write the = sign).")
@click.option("--target", type=click.Choice(TARGET_NAMES), default=DEFAULT_TARGET, show_default=True,
              help="Default target of every model (a manifest can set it per model).")
@click.option("--ort-level", type=click.Choice(list(ORT_LEVELS)), default=DEFAULT_ORT_LEVEL, show_default=True,
              help="Default onnxruntime level of every model (a manifest can set it per model).")
@click.option("--no-verify", is_flag=True, help="Skip the onnxruntime comparison for every model.")
@verbosity_options
@click.pass_context
@_fail_cleanly
def batch(ctx, inputs, outdir, jobs, timeout, max_memory, shard, merge, baseline, ray_address, target, ort_level,
          no_verify):
    """Optimize, verify and report every model of INPUTS into OUTDIR, each in a worker process of its own.

    INPUTS are .onnx files, folders (searched recursively) and manifests (.json or .csv: per-model input
    shapes, input values, target and ort level: JSON {"models": [{"path", "input_shapes", "input_values",
    "target", "ort_level"}]} or CSV with those columns). A second run does only what
    is missing or changed.

    \b
    Examples:
      onnxfuse batch models/ -o out/ -j 2 --timeout 600 --max-memory 4G
      onnxfuse batch zoo.json -o out/ --shard 2/4
      onnxfuse batch --merge shard*/summary.json -o out/
      onnxfuse batch models/ -o out/ --baseline last/summary.json
      onnxfuse batch models/ -o out/ --ray=ray://head:10001
    """
    import time

    from onnxfuse import batch as b

    if outdir.exists() and not outdir.is_dir():
        raise InputError(f"{outdir}: OUTDIR exists and is not a folder")
    if ray_address and Path(ray_address).exists():  # click read an input as the address: --ray takes "=ADDRESS"
        raise InputError(f"--ray {ray_address}: is a file or folder, not a Ray address; write --ray=ADDRESS, and put "
                         "a bare --ray after INPUTS")
    if not inputs:
        raise InputError("give at least one model, folder or manifest (INPUTS), or summaries with --merge")
    if merge and (shard or ray_address is not None):
        raise InputError("--merge joins summaries already made: --shard and --ray do not apply to it")
    old = b.load_summary(baseline, "--baseline") if baseline is not None else None
    limit = b.parse_size(max_memory) if max_memory else None
    versions = b.library_versions()
    start = time.monotonic()
    if merge:
        summary = b.merge([b.load_summary(p, "--merge") for p in inputs])
        outdir.mkdir(parents=True, exist_ok=True)
    else:
        out = b.Outdir(outdir)
        out.path.mkdir(parents=True, exist_ok=True)
        out.prepare()
        defaults = b.ModelOptions(target=target, ort_level=ort_level, verify=not no_verify)
        planned = b.plan(list(inputs), out, defaults, b.parse_shard(shard) if shard else None, versions)
        workers = min(jobs or b.default_jobs(limit), max(1, len(planned.jobs)))
        log.info("%d models: %d from the cache, %d to run%s", len(planned.entries), len(planned.cached),
                 len(planned.jobs), "" if not planned.jobs else
                 " on Ray" if ray_address is not None else f" in {workers} worker(s)")
        with _batch_progress(ctx, len(planned.entries), len(planned.cached)) as on_result:
            if not planned.jobs:
                rows = []
            elif ray_address is not None:
                rows = b.run_ray(planned.jobs, out, ray_address or None, timeout, limit, on_result=on_result)
            else:
                rows = b.run_local(planned.jobs, out, workers, timeout, limit, on_result=on_result)
        summary = b.summarize(planned.cached + rows, versions=versions, shard=b.parse_shard(shard) if shard else None,
                              engine="ray" if ray_address is not None else "local",
                              wall_s=time.monotonic() - start, workers=None if ray_address is not None else workers)
    gate = b.compare_summaries(old, summary) if old is not None else None
    written = b.write_summary(outdir, summary, gate)
    c = summary["counts"]
    if _verbosity(ctx) >= 0:
        click.echo(f"{summary['totals']['models']} models: " + ", ".join(f"{n} {s}" for s, n in c.items() if n)
                   + f" ({summary['cached']} from the cache) in {summary['wall_s']:.1f} s")
        for r in summary["models"]:
            if r["status"] != "ok":
                click.echo(f"  {r['name']}: {r['status']}: {r['reason']}")
        if gate is not None:
            for name, m in gate["models"].items():
                click.echo(f"  regression: {name}: " + "; ".join(m["lines"]))
            for name in gate["added"]:
                click.echo(f"  added since the baseline: {name}")
            for name in gate["removed"]:
                click.echo(f"  removed since the baseline: {name}")
    log.info("wrote %s", ", ".join(str(p) for p in written))
    if c["mismatch"] or (gate is not None and gate["regressed"]):
        sys.exit(1)
    if any(c[s] for s in ("error", "crashed", "timeout", "memory")):
        sys.exit(2)


@contextlib.contextmanager
def _batch_progress(ctx: click.Context, total: int, done: int):
    """A progress bar on stderr (counts per status, ETA) when stderr is a terminal and not --quiet; yields the
    callback that each finished model's row is given to."""
    counts: dict[str, int] = {}

    def count(row: dict) -> None:
        counts[row["status"]] = counts.get(row["status"], 0) + 1

    if not (sys.stderr.isatty() and _verbosity(ctx) >= 0):
        yield count
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("batch"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[counts]}"),
                  TimeRemainingColumn(), console=Console(stderr=True)) as progress:
        task = progress.add_task("batch", total=total, completed=done, counts="")

        def update(row: dict) -> None:
            count(row)
            progress.update(task, advance=1, counts=" ".join(f"{s} {n}" for s, n in sorted(counts.items())))

        yield update


if __name__ == "__main__":  # pragma: no cover
    main()
