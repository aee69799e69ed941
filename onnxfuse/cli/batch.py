"""``onnxfuse batch INPUTS -o OUTDIR``: optimize, verify and report many models, each in a worker process of its
own (or a Ray task), into one folder with a summary; shards, merging and a baseline gate for CI."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from onnxfuse.cli.args.conflicts import BATCH_CONFLICTS, check_conflicts
from onnxfuse.cli.args.optimization import DEFAULT_ORT_LEVEL, optimization_options_except
from onnxfuse.cli.args.plugins import plugin_option
from onnxfuse.cli.args.report_output import bandwidth_option, check_bandwidth
from onnxfuse.cli.args.verification import verify_options_except
from onnxfuse.cli.console import log, verbosity, verbosity_options
from onnxfuse.cli.exits import fail_cleanly
from onnxfuse.errors import InputError

if TYPE_CHECKING:
    from onnxfuse.batch import ModelOptions

BATCH_EXIT_CODES_HELP = """\b
Exit codes (the first that applies):
  2    usage or data error (one line, nothing run or written)
  1    a model failed verification (mismatch) or a verification it was
       asked for did not finish (unverified: skipped or partial; rows
       that --no-verify left unverified do not count), or --baseline
       found a regression
  2    a model failed otherwise (unreadable or refused, crashed, timed
       out, over --max-memory): its row says why
  4    --drop-culprits wrote a verified remainder for a model whose
       verification failed (remainder): the rewrites that broke it were
       left unfused
  0    every model was optimized and verified (or taken from the cache)
  130  interrupted (Ctrl-C), 143 terminated (SIGTERM); OUTDIR holds only
       complete files"""


#: ``optimize``'s options that differ from model to model: a manifest row gives them (its field), the command line
#: does not (click answers "No such option"); ``input_data`` batch refuses altogether (``batch.REFUSED_OPTIONS``).
PER_MODEL_OPTIONS = {"input_shape": "input_shapes", "input_value": "input_values", "input_range": "input_ranges",
                     "input_data": None}


@click.command(epilog=BATCH_EXIT_CODES_HELP)
@click.argument("inputs", nargs=-1, metavar="INPUTS...")  # none: an error below, after the --ray check
@click.option("-o", "--outdir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Folder for the optimized models (models/), their reports (reports/) and the summary "
                   "(summary.json, summary.md, index.html; a --shard's carry its name: summary.shard-K-of-N.json).")
@click.option("-j", "--jobs", type=click.IntRange(1), help="Worker processes (default: as many as the cores and the "
              "available memory allow).")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="Fail a model that takes longer (its worker is killed).")
@click.option("--max-memory", metavar="SIZE", help="Cap each worker's memory, e.g. 2G (address space, "
              "RLIMIT_AS; with --ray, the memory each task declares).")
@click.option("--shard", metavar="K/N", help="Process only the K-th of N stable shares of the models (CI matrices).")
@click.option("--merge", is_flag=True, help="INPUTS are the summary files of all the shards of one run (or of whole "
              "runs of different models): check they form one complete set, join them into one summary "
              "in OUTDIR.")
@click.option("--baseline", type=click.Path(dir_okay=False, path_type=Path), metavar="OLD.json",
              help="Compare with an earlier summary.json: exit 1 if a model lost a fusion or its traffic grew.")
@click.option("--ray", "ray_address", is_flag=False, flag_value="", default=None, metavar="[ADDRESS]",
              help="Run the models as Ray tasks (pip install 'onnxfuse[ray]'): --ray starts or finds a local "
                   "cluster, --ray=ADDRESS joins one (write the = sign).")
@optimization_options_except(*PER_MODEL_OPTIONS)
@plugin_option
@click.option("--no-verify", is_flag=True, help="Skip the onnxruntime comparison for every model (each row is then "
              "unverified, as asked: not an exit 1 by itself).")
@click.option("--layers", is_flag=True,
              help="When a model fails verification, also compare it with the original tensor by tensor (its "
                   "report's verification.layers), as optimize --layers.")
@click.option("--drop-culprits", is_flag=True,
              help="When a model fails verification, write the verified remainder with the rewrites that broke it "
                   "left unfused (row status remainder, exit 4) instead of nothing.")
@verify_options_except(*PER_MODEL_OPTIONS)
@bandwidth_option
@verbosity_options
@click.pass_context
@fail_cleanly
def batch(ctx: click.Context, inputs: tuple[str, ...], outdir: Path, jobs: int | None, timeout: float | None,
          max_memory: str | None, shard: str | None, merge: bool, baseline: Path | None, ray_address: str | None,
          target: str, only: tuple[str, ...], skip: tuple[str, ...], ort_level: str | None, ort_version: str | None,
          constant_initializer_inputs: bool, materialize_weights: float, no_verify: bool, layers: bool,
          drop_culprits: bool, input_sets: int, rtol: float | None, atol: float | None,
          verify_timeout: float | None, verify_budget: float | None, bandwidth: float | None,
          plugins: tuple[str, ...] = ()) -> None:
    """Optimize, verify and report every model of INPUTS into OUTDIR, each in a worker process of its own.

    INPUTS are .onnx files, folders (searched recursively) and manifests (.json or .csv: per-model input
    shapes, input values and ranges, fixed input shapes, target and ort level: JSON {"models": [{"path",
    "input_shapes", "input_values", "input_ranges", "fix_input_shapes", "target", "ort_level"}]} or CSV with
    those columns). The other options are optimize's, for every model. A second run does only what is missing
    or changed.

    \b
    Examples:
      onnxfuse batch models/ -o out/ -j 2 --timeout 600 --max-memory 4G
      onnxfuse batch zoo.json -o out/ --shard 2/4
      onnxfuse batch --merge shard*/summary.shard-*.json -o out/
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
    check_conflicts(ctx, BATCH_CONFLICTS)
    old = b.load_summary(baseline, "--baseline") if baseline is not None else None
    limit = b.parse_size(max_memory) if max_memory else None
    versions = b.library_versions()
    start = time.monotonic()
    if merge:
        sources = [Path(p) for p in inputs]
        summary = b.merge([b.load_summary(p, "--merge") for p in sources], sources, outdir)
        outdir.mkdir(parents=True, exist_ok=True)
    else:
        if plugins:  # a broken plugin: one error line before any model runs
            from onnxfuse.passes.plugin import resolve

            resolve(plugins)
        check_bandwidth(bandwidth)
        defaults = b.ModelOptions(target=target, ort_level=ort_level or DEFAULT_ORT_LEVEL, verify=not no_verify,
                                  plugins=tuple(plugins), drop_culprits=drop_culprits, only=tuple(only),
                                  skip=tuple(skip), ort_version=ort_version,
                                  constant_initializer_inputs=constant_initializer_inputs,
                                  materialize_weights=materialize_weights, bandwidth=bandwidth, compare_layers=layers,
                                  input_sets=input_sets, rtol=rtol, atol=atol, verify_timeout=verify_timeout,
                                  verify_budget=verify_budget)
        b.run_options(defaults.to_dict())  # each value checked as optimize checks it: one error before any model
        summary = _run(ctx, inputs, outdir, defaults, jobs, timeout, limit, shard, ray_address, versions, start)
    gate = b.compare_summaries(old, summary) if old is not None else None
    written = b.write_summary(outdir, summary, gate)
    if verbosity(ctx) >= 0:
        _print_summary(summary, gate)
    log.info("wrote %s", ", ".join(str(p) for p in written))
    c = summary["counts"]
    # unverified by request (--no-verify, as optimize --no-verify exits 0) is said on its row, not an exit 1
    from onnxfuse.batch import NOT_VERIFIED_REASON

    asked = [r for r in summary["models"] if r["status"] == "unverified" and r["reason"] != NOT_VERIFIED_REASON]
    if c["mismatch"] or asked or (gate is not None and gate["regressed"]):
        sys.exit(1)
    if any(c[s] for s in ("error", "crashed", "timeout", "memory")):
        sys.exit(2)
    if c.get("remainder"):
        sys.exit(4)


def _run(ctx: click.Context, inputs: tuple[str, ...], outdir: Path, defaults: ModelOptions, jobs: int | None,
         timeout: float | None, limit: int | None, shard: str | None, ray_address: str | None,
         versions: dict[str, str], start: float) -> dict[str, Any]:
    """Plan the models of INPUTS (the cached ones are not run again), run the rest in local worker processes or
    as Ray tasks (``ray_address`` not None; "" a local cluster), and return the summary."""
    import time

    from onnxfuse import batch as b

    out = b.Outdir(outdir)
    out.path.mkdir(parents=True, exist_ok=True)
    out.prepare()
    planned = b.plan(list(inputs), out, defaults, b.parse_shard(shard) if shard else None, versions)
    workers = min(jobs or b.default_jobs(limit), max(1, len(planned.jobs)))
    log.info("%d models: %d from the cache, %d refused unread, %d to run%s", len(planned.entries),
             len(planned.cached), len(planned.refused), len(planned.jobs), "" if not planned.jobs else
             " on Ray" if ray_address is not None else f" in {workers} worker(s)")
    with _batch_progress(ctx, len(planned.entries), len(planned.cached) + len(planned.refused)) as on_result:
        if not planned.jobs:
            rows = []
        elif ray_address is not None:
            rows = b.run_ray(planned.jobs, out, ray_address or None, timeout, limit, on_result=on_result)
        else:
            rows = b.run_local(planned.jobs, out, workers, timeout, limit, on_result=on_result)
    return b.summarize(planned.cached + planned.refused + rows, versions=versions,
                       shard=b.parse_shard(shard) if shard else None,
                       engine="ray" if ray_address is not None else "local",
                       wall_s=time.monotonic() - start, workers=None if ray_address is not None else workers)


def _print_summary(summary: dict[str, Any], gate: dict[str, Any] | None) -> None:
    """The counts per status, every model that is not ok, and the baseline's regressions (stdout); names and
    reasons through :func:`onnxfuse.report.escape.text` (no control character reaches the terminal)."""
    from onnxfuse.report.batch_html import headline, sizes_note
    from onnxfuse.report.escape import text

    click.echo(headline(summary) + f" ({summary['wall_s']:.1f} s)")
    if (note := sizes_note(summary)) is not None:
        click.echo(note)
    from onnxfuse.batch import NOT_VERIFIED_REASON

    unverified = [r for r in summary["models"] if r["status"] == "unverified" and r["reason"] == NOT_VERIFIED_REASON]
    if unverified:  # one line for what --no-verify asked for, not one per model
        click.echo(f"  {len(unverified)} model{'s' if len(unverified) > 1 else ''} unverified: {NOT_VERIFIED_REASON}")
    for r in summary["models"]:
        if r["status"] != "ok" and r not in unverified:
            click.echo(f"  {text(r['name'])}: {r['status']}: {text(r['reason'])}")
    if gate is not None:
        for name, m in gate["models"].items():
            click.echo(f"  regression: {text(name)}: " + "; ".join(text(x) for x in m["lines"]))
        for name in gate["added"]:
            click.echo(f"  added since the baseline: {text(name)}")
        for name in gate["removed"]:
            click.echo(f"  removed since the baseline: {text(name)}")


@contextlib.contextmanager
def _batch_progress(ctx: click.Context, total: int, done: int) -> Iterator[Callable[[dict[str, Any]], None]]:
    """A progress bar on stderr (counts per status, ETA) when stderr is a terminal and not --quiet; yields the
    callback that each finished model's row is given to."""
    counts: dict[str, int] = {}

    def count(row: dict[str, Any]) -> None:
        counts[row["status"]] = counts.get(row["status"], 0) + 1

    if not (sys.stderr.isatty() and verbosity(ctx) >= 0):
        yield count
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("batch"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[counts]}"),
                  TimeRemainingColumn(), console=Console(stderr=True)) as progress:
        task = progress.add_task("batch", total=total, completed=done, counts="")

        def update(row: dict[str, Any]) -> None:
            count(row)
            progress.update(task, advance=1, counts=" ".join(f"{s} {n}" for s, n in sorted(counts.items())))

        yield update
