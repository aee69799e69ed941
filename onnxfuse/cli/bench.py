"""``onnxfuse bench ORIGINAL [OPTIMIZED]``: time onnxruntime inference of both models in paired rounds at each
graph optimization level, and say faster, slower, same or inconclusive."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from onnxfuse.cli.args.model_inputs import input_data_option, input_value_options, parse_input_feeds, parse_input_shapes
from onnxfuse.cli.args.optimization import optimization_option_names, optimization_options, to_options
from onnxfuse.cli.console import log, progress, verbosity_options
from onnxfuse.cli.exits import READ_ONLY_EXIT_CODES_HELP, fail_cleanly
from onnxfuse.errors import InputError
from onnxfuse.ort.levels import ORT_LEVELS

if TYPE_CHECKING:
    from onnxfuse import pipeline
    from onnxfuse.model import io as model_io

#: The options of :func:`optimization_options` that shape only the in-memory optimization (all but
#: ``--input-shape``, which also sets the sizes timed), read from that one declaration.
OPTIMIZATION_ONLY = tuple(name for name in optimization_option_names() if name != "input_shape")


@click.command(epilog=READ_ONLY_EXIT_CODES_HELP)
@click.argument("original", type=click.Path(path_type=Path))
@click.argument("optimized", required=False, type=click.Path(path_type=Path))
@optimization_options
@click.option("--runs", type=click.IntRange(1), default=16, show_default=True,
              help="Paired rounds per level at least (each runs original, optimized, optimized, original); a "
                   "verdict needs 14 or more.")
@click.option("--max-time", type=click.FloatRange(0), default=20.0, show_default=True, metavar="SECONDS",
              help="Per level: after --runs rounds, rounds go on until the verdict is decided or this much time "
                   "of timed rounds is spent (0: exactly --runs rounds).")
@click.option("--margin", type=click.FloatRange(0, 50, max_open=True), default=2.0, show_default=True,
              metavar="PERCENT", help="Equivalence margin: 'same' needs the ratio's interval within 1 +- this.")
@click.option("--warmup", type=click.IntRange(0), default=3, show_default=True, help="Untimed runs first.")
@click.option("--timeout", type=click.FloatRange(min=0), default=600.0, show_default=True, metavar="SECONDS",
              help="Time for every run of the bench together, at every level (0: no limit); when it runs out, a "
                   "run in progress is stopped and bench exits 2 with nothing measured.")
@click.option("--threads", type=click.IntRange(1), default=1, show_default=True, help="onnxruntime intra-op threads.")
@click.option("--level", "levels", multiple=True, type=click.Choice(list(ORT_LEVELS)),
              help="Graph optimization level to time (repeatable; default all four).")
@input_data_option("Real inputs: an .npz with one array per graph input name.")
@input_value_options
@click.option("--profile", is_flag=True,
              help="Also run both models under onnxruntime's profiler at each level: time and bytes per kernel, "
                   "per op and per fusion (JSON: every kernel).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@verbosity_options
@click.pass_context
@fail_cleanly
def bench(ctx: click.Context, original: Path, optimized: Path | None, target: str, only: tuple[str, ...],
          skip: tuple[str, ...], input_shape: tuple[str, ...], ort_level: str | None, ort_version: str | None,
          constant_initializer_inputs: bool, materialize_weights: float, runs: int, max_time: float, margin: float,
          warmup: int, timeout: float, threads: int,
          levels: tuple[str, ...], input_data: str | None, input_value: tuple[str, ...], input_range: tuple[str, ...],
          profile: bool, fmt: str) -> None:
    """Time onnxruntime inference of ORIGINAL and OPTIMIZED (optimized in memory from ORIGINAL with the same
    options as `optimize` when not given) at each graph optimization level, in paired rounds; say faster, slower,
    same or inconclusive from the ratio's interval, and when onnxruntime runs the same kernels for both.

    \b
    Examples:
      onnxfuse bench model.onnx
      onnxfuse bench det.onnx det.fused.onnx --input-shape x=1x3x640x640 \\
          --runs 50 --format json
    """
    parse_input_shapes(input_shape)  # a malformed --input-shape is a usage error: answered before the libraries load
    import tempfile

    from onnxfuse import bench as bench_mod
    from onnxfuse.model import io as model_io

    if optimized is not None:
        _refuse_optimization_options(ctx)
    options = to_options(target, only, skip, input_shape, constant_initializer_inputs, ort_level, ort_version,
                         materialize_weights, verify=False)  # bench measures onnxruntime itself: no comparison
    levels = tuple(levels) or ORT_LEVELS
    bench_options = bench_mod.BenchOptions(runs=runs, max_time=max_time, margin=margin / 100, warmup=warmup,
                                           threads=threads, levels=levels, input_shapes=options.input_shapes,
                                           input_data=input_data, profile=profile, timeout=timeout or None)
    feeds = parse_input_feeds(input_data, input_value, input_range)
    bench_options.input_values, bench_options.input_ranges = feeds.values, feeds.ranges
    with tempfile.TemporaryDirectory(prefix="onnxfuse-bench-") as tmp:
        loaded = model_io.load_model(original)  # a bad ORIGINAL is an input error (exit 2), not an onnxruntime failure
        optimized_for: str | dict[str, str]
        targets: Mapping[str, str | None]
        if optimized is None:
            # One model per timed level, optimized for that level's sessions (unless --ort-level says which).
            targets = per_level = {level: ort_level or level for level in levels}
            made = _optimize_per_level(ctx, original, loaded, options, per_level, Path(tmp))
            if made is None:
                _nothing_fused(original, target, fmt)
                return
            optimized_for, bench_options.fusions = made
        else:
            if _same_graph(loaded, model_io.load_model(optimized)):
                log.warning("OPTIMIZED has the same graph as ORIGINAL: timing the model against itself")
            optimized_for = str(optimized)
            targets = dict.fromkeys(levels)
        with progress(ctx, "timing onnxruntime sessions"):
            try:
                data = bench_mod.bench(str(original), optimized_for, bench_options)
            except RuntimeError as exc:
                raise InputError(str(exc)) from None
    data["optimized"] = str(optimized) if optimized is not None else "(optimized in memory)"
    for row in data["levels"]:
        row["optimized_for_ort_level"] = targets[row["level"]]
    _print(data, fmt, profile)


def _refuse_optimization_options(ctx: click.Context) -> None:
    """Raises: InputError: an option of :data:`OPTIMIZATION_ONLY` was given with OPTIMIZED."""
    ignored = [f"--{name.replace('_', '-')}" for name in OPTIMIZATION_ONLY
               if ctx.get_parameter_source(name) != click.core.ParameterSource.DEFAULT]
    if ignored:
        raise InputError(f"{', '.join(ignored)} only shape{'' if len(ignored) > 1 else 's'} the in-memory "
                         "optimization, which does not run when OPTIMIZED is given; drop "
                         f"{'them' if len(ignored) > 1 else 'it'} or OPTIMIZED")


def _optimize_per_level(ctx: click.Context, original: Path, loaded: model_io.LoadedModel, options: pipeline.Options,
                        targets: dict[str, str], tmp: Path
                        ) -> tuple[dict[str, str], dict[str, list[dict[str, Any]]]] | None:
    """Optimize ORIGINAL in memory once per onnxruntime level that ``targets`` (timed level -> level optimized
    for) names, each model saved in ``tmp``: per timed level the model's path and its report's ``fusions``, or
    None when nothing was fused at any level."""
    from onnxfuse import pipeline
    from onnxfuse.model import io as model_io

    paths: dict[str, Path] = {}
    changed: dict[str, bool] = {}
    fusions: dict[str, list[dict[str, Any]]] = {}
    for wanted in dict.fromkeys(targets.values()):
        options.ort_level = wanted
        with progress(ctx, f"optimizing {original} in memory for onnxruntime level {wanted}"):
            result = pipeline.analyse(original, options, loaded if len(paths) == 0 else None)
        paths[wanted] = tmp / f"optimized.{wanted}.onnx"
        changed[wanted] = result.changed
        fusions[wanted] = result.report.to_dict()["fusions"]
        model_io.save_model(result.model, paths[wanted], external_data=result.loaded.external_data)
    if not any(changed.values()):
        return None
    return ({level: str(paths[wanted]) for level, wanted in targets.items()},
            {level: fusions[wanted] for level, wanted in targets.items()})


def _nothing_fused(original: Path, target: str, fmt: str) -> None:
    """Say that there is nothing to time (and, with ``--format json``, print the empty result)."""
    log.warning("nothing was fused (target %s): the optimized model is the original; nothing to time", target)
    if fmt == "json":
        import json

        click.echo(json.dumps({"original": str(original), "optimized": None, "nothing_fused": True,
                               "levels": []}, indent=2, sort_keys=True))


def _print(data: dict[str, Any], fmt: str, profile: bool) -> None:
    """The timing result on stdout (text or JSON), after a warning when input sizes were invented."""
    from onnxfuse import bench as bench_mod

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


def _same_graph(first: model_io.LoadedModel, second: model_io.LoadedModel) -> bool:
    """True when two models just loaded have byte-identical main graphs (metadata aside)."""
    a, b = first.model, second.model
    assert a is not None and b is not None  # load_model fills it; only pipeline.analyse clears it
    return a.graph.SerializeToString(deterministic=True) == b.graph.SerializeToString(deterministic=True)
