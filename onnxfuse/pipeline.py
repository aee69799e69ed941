"""load -> passes to a fixpoint -> (verify) -> Report. The library entry points; nothing here prints (progress goes
to ``logging.getLogger(__name__)`` at DEBUG; the CLI shows it with -v).

:func:`analyse` is what ``onnxfuse report`` runs; :func:`optimize` is what ``onnxfuse optimize`` runs (the CLI
writes the model it returns).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import sys
import tempfile
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import onnx

from onnxfuse import passes as passes_mod
from onnxfuse._version import __version__
from onnxfuse.analysis import shapes, symbolic, traffic
from onnxfuse.errors import InputError, one_line
from onnxfuse.ir import constants, convert
from onnxfuse.model import domains, indices, proto
from onnxfuse.model import io as model_io
from onnxfuse.ort.levels import DEFAULT_ORT_LEVEL, ORT_LEVELS
from onnxfuse.ort.providers import (
    DEFAULT_TARGET,
    PROBED_ORT_RELEASES,
    TARGETS,
    form_min_release,
    form_name,
    gemm_form_name,
    get_target,
    parse_release,
    release_text,
)
from onnxfuse.passes import Context, Pass
from onnxfuse.passes.driver import run_passes
from onnxfuse.records import Fusion, Reason, Skip
from onnxfuse.report import model as rep

log = logging.getLogger(__name__)

#: ``metadata_props`` keys that onnxfuse writes into the optimized model. ``onnxfuse.min_onnxruntime``: the oldest
#: onnxruntime release that loads every FusedConv/FusedGemm form in the model (``providers.FORM_MIN_ORT``; the
#: oldest probed release when every form loads in all of them, or none is there).
META_VERSION, META_TARGET, META_PASSES = "onnxfuse.version", "onnxfuse.target", "onnxfuse.passes"
META_MIN_ORT = "onnxfuse.min_onnxruntime"

#: Default of :attr:`Options.tune_budget_s` (``--tune-budget``): seconds for all the groups that ``--tune`` times
#: together (:mod:`onnxfuse.tune`; each group timed runs its minimum rounds even past it).
DEFAULT_TUNE_BUDGET_S = 60.0


@dataclass
class Options:
    """What to do to a model.

    Attributes:
        target: a key of ``providers.TARGETS``.
        only / skip: pass names to run exclusively / to leave out.
        input_shapes: graph input name -> concrete dims, used for the traffic report and for verification.
        constant_initializer_inputs: treat initializers that are also graph inputs as constants (the user
            promises that nobody feeds them).
        input_data: path of an ``.npz`` of real inputs (``--input-data``): its array shapes fix the input shapes
            of the report too, and must agree with ``input_shapes``.
        ort_level: the onnxruntime graph optimization level the user's sessions run at (``levels.ORT_LEVELS``;
            default ``all``, onnxruntime's default). A form that runs slower than the unfused original at this
            level is not emitted (``providers.CPU_SLOWER_AT``). None ignores the speed rules (for
            ``benchmarks/bench_forms.py``, which times every form).
        expressions: count bytes as expressions in the model's symbolic dims (the report's ``*_expr`` fields;
            sympy and onnxruntime's symbolic shape inference) even when the input shapes fix every symbolic dim.
            False (the default, for every command and the API): with input shapes that fix every dim (given, or
            a static model) bytes are counted at those shapes only, from ``onnx.shape_inference`` with the shapes
            applied: the same numbers, sizes and fusions without the symbolic work (issue 35's decision); the
            report's symbols are then empty and each ``*_expr`` is the number. Where those shapes leave a tensor
            unsized, or no input shapes are given, the expressions are computed anyway.
        compare_with_onnxruntime: have onnxruntime optimize the original and the result at ``ort_level`` and
            report which fusions it makes itself at load and what is saved beyond it (``ort_graph``; two
            session loads). False leaves the report's ``onnxruntime`` section out.
        ort_version: the onnxruntime release the model will run on (``--ort-version``, ``"1.20"``); forms that
            release cannot load are not emitted (``providers.FORM_MIN_ORT``). None: the installed onnxruntime.
        materialize_weights_bytes: how many bytes the model may grow by where conv/Gemm weights computed from
            compact constants (int8 x scale, ConstantOfShape) are stored as plain floats (``--materialize-weights``);
            0 keeps them compact, the folds then working on their computation (``passes._fold.compact_scale``).
        plugins: passes from outside the package besides the installed ones (``--plugin``): ``"module:Name"``, or
            (the API) a ``Pass`` subclass or instance (``onnxfuse.passes.plugin.load``).
        fix_input_shapes: graph input name -> dims written into the output's graph inputs (``--fix-input-shape``;
            ``onnxfuse.analysis.fix_inputs``): the passes see the static shapes, and analysis and verification use
            these sizes (with ``input_shapes``, which must agree).
        find_culprits: when verification fails, search the rewrite sites for those that broke it
            (:mod:`onnxfuse.culprits`, within the verification's timeout); the verification names them.
        drop_culprits: ship the verified remainder (``--drop-culprits``): when the search found the culprits
            and the model with them left unfused passes verification, that verification (``passed``, the
            culprits named) is the result's, not ``failed``. Either way, once the remainder verified, the result's
            model and report are the remainder's.
        compare_layers: when verification fails, also compare the failing model with the original tensor by
            tensor (``--layers``, :mod:`onnxfuse.verification.layers`) into ``verification.layers``.
        bandwidth_gb_per_s: also estimate the memory time at this bandwidth (10^9 bytes per second,
            ``--bandwidth``; the report's ``bandwidth``, ``report.model.bandwidth_section``); None: no estimate.
        tune: time each group of rewrites (one pass, one emitted form) in the installed onnxruntime at
            ``ort_level`` with ``threads`` on the CPU provider, and leave a group unfused when the model runs faster
            without it (``--tune``, :mod:`onnxfuse.tune`, which :func:`optimize` needs as its ``tuner``; the
            report's ``tune`` section). False (default): the rule-based, deterministic choice.
        tune_budget_s: seconds ``tune`` may spend on all the groups together (``--tune-budget``: passes run again,
            session loads, timed rounds; each group timed runs its minimum rounds even past it).
        threads: onnxruntime intra-op threads of the sessions ``tune`` times (``--threads``; your sessions' count).
    """

    target: str = DEFAULT_TARGET
    only: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    constant_initializer_inputs: bool = False
    input_data: str | None = None
    ort_level: str | None = DEFAULT_ORT_LEVEL
    expressions: bool = False
    compare_with_onnxruntime: bool = True
    ort_version: str | None = None
    materialize_weights_bytes: int = 0
    plugins: tuple = ()
    fix_input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    find_culprits: bool = True
    drop_culprits: bool = False
    compare_layers: bool = False
    bandwidth_gb_per_s: float | None = None
    tune: bool = False
    tune_budget_s: float = DEFAULT_TUNE_BUDGET_S
    threads: int = 1


#: ``Options`` fields that no command or API argument sets, each refused by name there (click's "No such option",
#: Python's "unexpected keyword argument"): knobs of the library itself, for its tests and benchmarks.
#: ``expressions``: the symbolic report even where the input shapes fix every dim
#: (``tests/test_symbolic_real_models.py``); ``find_culprits``: the culprit search after a failed verification,
#: always on for the commands. (``compare_with_onnxruntime`` is set by ``verify``: :func:`make_options`.)
#: ``tests/test_options_record.py`` checks that every other field is reachable from ``optimize`` on the command
#: line, in the API and in ``batch``, or refused there by name.
LIBRARY_ONLY_OPTIONS = ("expressions", "find_culprits")


def make_options(*, target: str = DEFAULT_TARGET, only=(), skip=(), input_shapes: dict[str, tuple[int, ...]] | None
                 = None, constant_initializer_inputs: bool = False, ort_level: str | None = None,
                 ort_version: str | None = None, materialize_weights: float = 0.0,
                 input_data: str | os.PathLike | None = None, bandwidth: float | None = None, plugins=(),
                 fix_input_shapes: dict[str, tuple[int, ...]] | None = None, drop_culprits: bool = False,
                 compare_layers: bool = False, verify: bool = True, tune: bool = False,
                 tune_budget: float = DEFAULT_TUNE_BUDGET_S, threads: int = 1) -> Options:
    """The one way :class:`Options` are built from what a user gave (the CLI's ``cli/args/optimization.py`` and
    ``cli/optimize.py``, the API's ``optimize`` / ``analyse``, ``batch``'s workers): every option checked the same
    way, so that a new option is declared here once. ``input_shapes`` / ``fix_input_shapes``: input name ->
    positive dims (already parsed); ``ort_level`` None: the default level; ``materialize_weights``: MiB (2**20
    bytes) the model may grow by (``--materialize-weights``); ``bandwidth``: GB/s (10^9 bytes per second) for the
    memory-time estimate (``--bandwidth``; None: none); ``plugins``: ``--plugin`` specs, ``Pass`` classes or
    instances; ``drop_culprits`` / ``compare_layers``: ``--drop-culprits`` / ``--layers``; ``verify`` False
    (``--no-verify``): no comparison with onnxruntime's own graphs either (``compare_with_onnxruntime``), so that
    such a run makes no onnxruntime session; ``tune``, ``tune_budget`` (seconds), ``threads``:
    :attr:`Options.tune`, :attr:`Options.tune_budget_s`, :attr:`Options.threads`. The fields no user sets are
    :data:`LIBRARY_ONLY_OPTIONS`.

    Raises:
        InputError: ``only``, ``skip`` or ``plugins`` is a string, or ``only`` and ``skip`` together leave no pass;
            ``ort_version`` is not a string; ``materialize_weights`` is negative or not finite; ``bandwidth`` is
            not a positive finite number; ``tune`` is not a bool, ``tune_budget`` not a positive finite number of
            seconds, ``threads`` not an integer >= 1.
    """
    _check_tune(tune, tune_budget, threads)
    if bandwidth is not None and (isinstance(bandwidth, bool) or not isinstance(bandwidth, (int, float))
                                  or not math.isfinite(bandwidth) or bandwidth <= 0):
        raise InputError(f"--bandwidth must be a positive, finite number of GB/s, got {bandwidth!r}")
    if isinstance(only, str) or isinstance(skip, str):
        raise InputError("only/skip take a sequence of pass names, not a string")
    if isinstance(plugins, (str, type, Pass)):
        raise InputError("--plugin takes a sequence of plugins (\"module:Name\", a Pass class or instance), "
                         f"not one: [{plugins!r}]")
    only, skip = tuple(only), tuple(skip)
    if only and set(only) <= set(skip):
        raise InputError("--only and --skip leave no pass to run")
    if ort_version is not None and not isinstance(ort_version, str):
        raise InputError(f"ort_version: expected a release as a string such as '1.20', got {ort_version!r}")
    try:
        mib = float(materialize_weights)
    except (TypeError, ValueError):
        raise InputError(f"--materialize-weights: expected a number of MiB, got {materialize_weights!r}") from None
    if not math.isfinite(mib) or mib < 0:
        raise InputError("--materialize-weights must be a finite number of MiB, 0 or more")
    return Options(target=target, only=only, skip=skip, input_shapes=dict(input_shapes or {}),
                   constant_initializer_inputs=bool(constant_initializer_inputs),
                   input_data=None if input_data is None else os.fspath(input_data),
                   ort_level=ort_level or DEFAULT_ORT_LEVEL, ort_version=ort_version,
                   materialize_weights_bytes=int(mib * 2**20),
                   bandwidth_gb_per_s=None if bandwidth is None else float(bandwidth), plugins=tuple(plugins),
                   fix_input_shapes=dict(fix_input_shapes or {}), drop_culprits=bool(drop_culprits),
                   compare_layers=bool(compare_layers), compare_with_onnxruntime=bool(verify), tune=tune,
                   tune_budget_s=float(tune_budget), threads=threads)


def _check_tune(tune: bool, budget: float, threads: int) -> None:
    """The checks of :func:`make_options` for ``--tune``, ``--tune-budget`` and ``--threads``.

    Raises:
        InputError: as :func:`make_options` says.
    """
    if not isinstance(tune, bool):
        raise InputError(f"--tune is a flag (True or False), got {tune!r}")
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not math.isfinite(budget) or budget <= 0:
        raise InputError(f"--tune-budget must be a positive, finite number of seconds, got {budget!r}")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise InputError(f"--threads must be an integer >= 1, got {threads!r}")


@dataclass
class Result:
    """The outcome of :func:`analyse` / :func:`optimize`.

    Attributes:
        model: the optimized ModelProto (the input's own proto, with metadata added, when nothing changed).
        fusions / skips: the raw pass results, in the order they happened.
        changed: True when at least one pass rewrote the graph, or input shapes were fixed
            (``Options.fix_input_shapes``).
        report: everything the report renderers show.
        loaded: the input as loaded.
    """

    model: onnx.ModelProto
    fusions: list[Fusion]
    skips: list[Skip]
    changed: bool
    report: rep.Report
    loaded: model_io.LoadedModel

    @property
    def verification(self):
        """The ``onnxfuse.verification.result.Verification`` of :func:`optimize` (``report.verification``)."""
        return self.report.verification

    def save(self, path: str | os.PathLike) -> list[Path]:
        """Write :attr:`model` to ``path`` as ``onnxfuse optimize`` does: atomically, external data kept external
        when the input had it (and for models over 2 GiB, which ``onnx.save`` cannot write inline), the input's
        own data files never replaced (``model_io.save_model``). Returns the files written (the model first).

        Raises:
            InputError: ``path`` is not a path, is the input model or one of its external data files, cannot be
                written (a folder, a missing or read-only folder, a name too long, disk full), or its data file
                would replace the input's.
        """
        if not isinstance(path, (str, os.PathLike)) or isinstance(path, bytes):
            raise InputError(f"save: expected a path, got {type(path).__name__}")
        try:
            for other, what in ((self.loaded.path, "the input model"),
                                *((f, "an external data file of the input") for f in self.loaded.data_files)):
                if other is not None and model_io.same_file(path, other):
                    raise InputError(f"{path}: is {what}; save to another path")
            return model_io.save_model(self.model, path, external_data=self.loaded.external_data,
                                       protected=self.loaded.data_files, never_replace=self.loaded.file_id)
        except OSError as exc:
            raise InputError(f"{path}: cannot write the model ({exc.strerror or exc})") from None


def _check_options(options: Options) -> tuple[Pass, ...]:
    if options.target not in TARGETS:
        raise InputError(f"--target {options.target!r}: choose one of {', '.join(TARGETS)}")
    if options.ort_level is not None and options.ort_level not in ORT_LEVELS:
        raise InputError(f"--ort-level {options.ort_level!r}: choose one of {', '.join(ORT_LEVELS)}")
    deployment_release(options)
    from onnxfuse.passes import plugin

    plugins = plugin.resolve(options.plugins)  # PluginError (exit 2) names a plugin that cannot be loaded
    try:
        return passes_mod.select(tuple(options.only), tuple(options.skip), plugins)
    except KeyError as exc:
        raise InputError(str(exc.args[0])) from None


def deployment_release(options: Options) -> tuple[int, int]:
    """The onnxruntime release (major, minor) the model is for: ``options.ort_version``, else the installed one.

    Raises:
        InputError: ``ort_version`` is not a release number, or older than the oldest release whose forms were
            probed (``providers.PROBED_ORT_RELEASES``) for a target with contrib ops: onnxfuse cannot say what such
            a release loads.
    """
    from onnxfuse.ort.optimized_graph import installed_version

    text = options.ort_version or installed_version()
    try:
        release = parse_release(text.split("+")[0])
    except ValueError as exc:
        raise InputError(f"--ort-version: {exc}") from None
    oldest, newest = PROBED_ORT_RELEASES[0], PROBED_ORT_RELEASES[-1]
    if release < oldest and options.target != "onnx":  # target onnx emits no onnxruntime-specific form
        raise InputError(f"--ort-version {text}: onnxfuse knows which forms onnxruntime loads from "
                         f"{release_text(oldest)} to {release_text(newest)} (probed); for an older release use "
                         "--target onnx (standard ONNX only)")
    return release


def emitted_forms(model: onnx.ModelProto) -> Counter:
    """FusedConv / FusedGemm form name (``providers.form_name``, ``gemm_form_name``) -> node count, over every
    graph of ``model``."""
    forms: Counter = Counter()
    for node, act in _fused_nodes(model):
        if node.op_type == "FusedGemm":
            forms[gemm_form_name(act or "")] += 1
        else:
            forms[form_name(act, len(node.input) > 3 and bool(node.input[3]))] += 1
    return forms


def _set_metadata(model: onnx.ModelProto, target: str, selected: tuple[Pass, ...], min_release: str) -> None:
    values = {META_VERSION: __version__, META_TARGET: target, META_PASSES: ",".join(p.name for p in selected),
              META_MIN_ORT: min_release}
    for prop in model.metadata_props:
        if prop.key in values:
            prop.value = values.pop(prop.key)
    for key, value in values.items():
        model.metadata_props.add(key=key, value=value)


def analyse(path: str | os.PathLike | None, options: Options, loaded: model_io.LoadedModel | None = None,
            verify_options=None, verifying: bool = False, tuner: Tuner | None = None) -> Result:
    """Load the model at ``path`` (or take ``loaded``), run the passes in memory and build the report (no file).

    ``verify_options`` (for :func:`optimize`): when the passes rewrote the model, verify it
    (:func:`_verify_and_compare`) before onnxruntime's graphs are made, and put the result in
    ``report.verification``; None: no verification. ``verifying``: see :func:`_verify_and_compare_graphs`.
    ``tuner``: what times the groups of rewrites with ``options.tune`` (:func:`_rewrite`).

    Raises:
        InputError: unreadable or invalid model (:func:`onnxfuse.model.io.load_model`, and a Conv whose
            attributes, weight or bias contradict each other or its input: :func:`onnxfuse.model.io.check_convs`),
            unknown target or pass name, bad ``input_shapes``, an ``input_data`` that is not a regular file.
    """
    selected = _check_options(options)
    if options.input_data:
        check_regular_file(options.input_data, "--input-data")
    loaded, model = _model_of(path, loaded, lazy=verify_options is None and not _compares(options))
    if verify_options is not None and not verify_options.index_inputs:  # float ids: drawn as valid indices
        verify_options.index_inputs = indices.float_index_inputs(model)
    options, fixed = _fix_inputs(model, options, loaded)
    # the load's strict shape check already made the skeleton and inferred it (model.io.checked_shapes)
    skel, inferred = loaded.shape_inference or (proto.skeleton(model), None)
    loaded.shape_inference = None
    input_shapes = _input_shapes(model, options)
    # the model's own (symbolic) shapes: what the passes may rely on
    info, elem_types = shapes.infer(skel) if inferred is None else shapes.inferred_info(inferred)
    del inferred
    model_io.check_convs(model, info, loaded.label)
    sym, mismatches = _count_shapes(skel, info, input_shapes, options.expressions)
    own_sym, loader = _own_symbolic(sym, skel, info, not sym.at_input_shapes)
    del skel  # weight-free, but its messages take a few MiB at the peak that comes later
    before_sizes = traffic.Sizes(sym.shapes, {**elem_types, **sym.elem_types}, sym.reasons).with_model(model)
    before_rows = traffic.node_traffic(model, before_sizes)
    written_before = _tensor_names(model)
    missing = _missing_shapes(model, input_shapes)
    before_ops = _op_counts(model.graph)

    overridable = frozenset() if options.constant_initializer_inputs else loaded.overridable
    blocker = convert.rewrite_blocker(model)
    rewriter = _Rewriter(options, overridable, dict(info), own_sym, loader, selected, loaded.label)
    with _spilling(loaded, model):
        out, fusions, skips, tuned = _rewrite(rewriter, model, blocker, loaded, input_shapes, verify_options, tuner)
    forms, min_release = _finish_model(out, options, selected)
    if fusions:
        # Let the input's protobuf go once the result exists (peak memory: it is as large as the model).
        del model
        loaded.model = None

    verified, runtime = _verify_and_compare_graphs(loaded, out, input_shapes, options, verify_options,
                                                   bool(fusions) or fixed, verifying)
    if verified is not None and verified.status == "failed":
        verified, failure = _after_failure(loaded, out, options, verify_options, rewriter, fusions, verified)
        if failure is not None:  # the culprits left unfused, the rest verified: the report is of that
            out, fusions, skips = failure
            forms, min_release = _finish_model(out, options, selected)
            if runtime is not None and options.ort_level is not None:
                from onnxfuse.ort import optimized_graph as ort_graph

                runtime = ort_graph.runtime_graphs(b"" if runtime.available else loaded.ort_source(), out,
                                                   options.ort_level, original_of=runtime)  # no 2nd original session
    after_sizes = _after_sizes(before_sizes, out, fusions, written_before, _dim_values(info, sym.shapes))
    after_rows = traffic.node_traffic(out, after_sizes)
    release = deployment_release(options)
    mismatches = [*mismatches, *_release_warnings(release, forms, min_release)]
    warnings = ([f"the model was not rewritten: {blocker}"] if blocker is not None else []) + loaded.warnings \
        + _target_warnings(out, options.target) + mismatches + _precision(fusions)
    report = rep.build(  # everything gathered: the report is built once, with nothing written into it afterwards
        loaded=loaded, target=options.target, passes=[p.name for p in selected], input_shapes=input_shapes,
        missing=missing, symbols=sym, before_rows=before_rows, after_rows=after_rows,
        before_ops=before_ops, after_ops=_op_counts(out.graph), fusions=fusions, skips=skips,
        after_index=traffic.ModelIndex(out), after_sizes=after_sizes, runtime=runtime,
        bandwidth_gb_per_s=options.bandwidth_gb_per_s,
        deployment=rep.deployment_section(release, forms, min_release), optimized_bytes=_serialized_bytes(out),
        warnings=warnings, verification=verified, tune=tuned,
    )
    return Result(out, fusions, skips, bool(fusions) or fixed, report, loaded)


class Tuner(Protocol):
    """What times the groups of rewrites for ``Options.tune`` (``onnxfuse.tune.decide``, above this layer: the
    timer is the bench's). Called once, after the passes' first run, with that run's ``out`` and ``fusions``;
    ``fresh()`` gives a new copy of the model the passes ran on (to run them again with ``rewriter.run(fresh(),
    excluded)``). Returns the sites to leave unfused, each with its ``(reason, sentence)`` (``Context.excluded``),
    and the report's ``tune`` section."""

    def __call__(self, rewriter: _Rewriter, fresh: Callable[[], onnx.ModelProto], out: onnx.ModelProto,
                 fusions: list[Fusion], input_shapes: dict[str, tuple[int, ...]], options: Options, verify_options: Any
                 ) -> tuple[dict[tuple[str, ...], tuple[Reason, str]], dict[str, Any]]: ...


def _rewrite(rewriter: _Rewriter, model: onnx.ModelProto, blocker: str | None, loaded: model_io.LoadedModel,
             input_shapes: dict[str, tuple[int, ...]], verify_options: Any, tuner: Tuner | None
             ) -> tuple[onnx.ModelProto, list[Fusion], list[Skip], dict[str, Any] | None]:
    """The passes over ``model`` (:meth:`_Rewriter.run`; none when ``blocker`` says why the model cannot be
    rewritten): ``(out, fusions, skips, the report's tune section or None)``. With ``Options.tune``, ``tuner``
    times the groups of rewrites and the passes run once more with the groups it drops left unfused; the rewriter
    keeps them left out for any later run (the culprit search's).

    Raises:
        TypeError: ``Options.tune`` without a ``tuner`` (``onnxfuse.tune.optimize`` passes one).
        InputError, PluginError: as :meth:`_Rewriter.run`.
    """
    options = rewriter.options
    if options.tune and tuner is None:
        raise TypeError("Options.tune: run onnxfuse.tune.optimize (or onnxfuse.optimize(tune=True)), which times "
                        "the rewrites")
    if blocker is not None:
        return model, [], [], None
    fresh = _fresh_copies(model, loaded) if options.tune else None
    out, fusions, skips = rewriter.run(model)
    log.debug("passes done: %d fusions, %d patterns declined", len(fusions), len(skips))
    if fresh is None or tuner is None:
        return out, fusions, skips, None
    excluded, section = tuner(rewriter, fresh, out, fusions, input_shapes, options, verify_options)
    if excluded:
        rewriter.left_out = dict(excluded)
        out, fusions, skips = rewriter.run(fresh())
    return out, fusions, skips, section


def _fresh_copies(model: onnx.ModelProto, loaded: model_io.LoadedModel) -> Callable[[], onnx.ModelProto]:
    """A function that returns a new copy of ``model`` as it is now (before the passes rewrite it in place; its
    inputs fixed by ``--fix-input-shape`` where given): from its serialized bytes, or, for a model protobuf cannot
    serialize (over 2 GiB), the input read again (``culprits.fresh_original``)."""
    try:
        data = model.SerializeToString()
    except ValueError:  # over protobuf's 2 GiB limit
        from onnxfuse import culprits

        return lambda: culprits.fresh_original(loaded)
    return lambda: onnx.load_model_from_string(data)


def _fix_inputs(model: onnx.ModelProto, options: Options, loaded: model_io.LoadedModel) -> tuple[Options, bool]:
    """``options.fix_input_shapes`` written into ``model`` (loaded's own copy, which the passes rewrite; the
    original stays what ``loaded.ort_source()`` gives to verification), with the inputs whose named dims they bind
    (silero's ``state [2, batch, 128]`` with ``input=1x512``); returns ``options`` with those sizes in
    ``input_shapes`` (``onnxfuse.analysis.fix_inputs``) and whether any were given (``(options, False)``, nothing
    changed, when none were).

    Raises:
        InputError: as ``fix_inputs.fix_input_shapes`` and ``fix_inputs.merged_shapes``.
    """
    if not options.fix_input_shapes:
        return options, False
    from onnxfuse.analysis import fix_inputs

    given = dict(options.fix_input_shapes)
    options = replace(options, input_shapes=fix_inputs.merged_shapes(dict(options.input_shapes), given))
    fix_inputs.fix_input_shapes(model, {**shapes.complete_input_shapes(model, given), **given})
    loaded.shape_inference = None  # inferred for the old inputs
    return options, True


def _plugin_checked(make, fusions: list[Fusion], selected: tuple[Pass, ...]) -> onnx.ModelProto:
    """``make()`` (the export of the rewritten graph); when a plugin pass rewrote it, an export that fails or a
    model that is invalid (``onnxfuse.passes.plugin.check_output``) is a ``PluginError`` naming those plugins.

    Raises:
        PluginError: as said.
    """
    from onnxfuse.passes import plugin

    plugins = {p.name: p for p in selected if isinstance(p, plugin.PluginPass)}
    rewrote = [plugins[n] for n in dict.fromkeys(f.pass_name for f in fusions) if n in plugins]
    if not rewrote:
        return make()
    try:
        out = make()
    except Exception as exc:
        raise plugin.PluginError(f"{', '.join(str(p.origin) for p in rewrote)}: the graph after its rewrites "
                                 f"cannot be exported ({type(exc).__name__}: {one_line(exc, 200)})") from None
    plugin.check_output(out, fusions, selected)
    return out


def _own_symbolic(sym: symbolic.SymbolicShapes, skel: onnx.ModelProto, info: dict, own: bool):
    """``(the model's own symbolic shapes, None)`` when ``sym`` (the counts' shapes) is them (``own``: not
    counted at the input shapes, ``SymbolicShapes.at_input_shapes``), else ``(None, a loader that computes
    them)``: the passes read them through ``Context.own_symbolic``, so they decide the same whether the counts
    were made as expressions or at concrete input shapes."""
    if own:
        return sym, None
    return None, lambda: symbolic.infer(skel, info)


def _tensor_names(model: onnx.ModelProto) -> frozenset[str]:
    """Every tensor name of ``model``'s graphs: node outputs, graph inputs and initializers."""
    names: set[str] = set()
    for graph, _ in proto.proto_graphs(model.graph):
        names.update(o for n in graph.node for o in n.output if o)
        names.update(v.name for v in graph.input)
        names.update(t.name for t in graph.initializer)
    return frozenset(names)


def _dim_values(info: dict, counted: dict[str, tuple | None]) -> dict[str, Any]:
    """Named dim (a ``dim_param`` of onnx shape inference, as the passes see shapes: ``Context.shape``) -> its
    value in the shapes the report counts (``counted``: an expression in the input symbols, or a number at the
    input shapes), paired position by position over the tensors both know; a name paired with two different
    values is left out. The sizes of the tensors a pass inserted are read from the shapes it recorded in
    those names (``traffic.Sizes.with_model``)."""
    out: dict[str, Any] = {}
    clash: set[str] = set()
    for name, entry in info.items():
        shape, got = entry[0], counted.get(name)
        if shape is None or got is None or len(shape) != len(got):
            continue
        for d, value in zip(shape, got):
            if isinstance(d, str) and value is not None and d not in clash:
                if d in out and out[d] != value:
                    clash.add(d)
                    del out[d]
                elif d not in out:
                    out[d] = value
    return out


def _precision(fusions: list[Fusion]) -> list[str]:
    """The report's warning, where float16_body rewrote the model, that its body runs in float32 and why the figure
    against the graph as exported grows (each tensor of the body counted at 4 bytes an element, where the export's
    float16 tensor has 2; traffic.md), while the figure against onnxruntime compares like with like: onnxruntime's
    CPU provider, without float16 kernels for those ops, runs them in float32 too, behind Casts it inserts at load
    (``core/optimizer/insert_cast_transformer.cc``; ``passes/float16_body.py``)."""
    if not any(f.pass_name == "float16_body" for f in fusions):
        return []
    return ["precision: the body runs in float32 between Casts at the float16 graph inputs and outputs "
            "(float16_body: onnxruntime's CPU provider has no float16 kernel for its ops and would run them in "
            "float32 behind Casts of its own); so the figure against the graph as exported counts every body "
            "tensor at 4 bytes an element where the export's float16 has 2, and can grow, and the weights are "
            "stored as float32, twice their bytes; the figure against onnxruntime compares float32 with float32"]


def _after_sizes(before: traffic.Sizes, out: onnx.ModelProto, fusions: list[Fusion], written_before: frozenset[str],
                 dims: dict[str, Any]) -> traffic.Sizes:
    """The sizes of ``out``'s tensors: the original's (``before``) with ``out``'s constants, and the tensors the
    passes inserted (not in ``written_before``) as they recorded them (``dims``: :func:`_dim_values`;
    ``traffic.Sizes.with_model``). For an ``out`` whose body float16_body made float32 (one of ``fusions`` is
    its): every float16 tensor but the graph inputs and outputs is float32 now (4 bytes an element, not 2), and
    each Cast at an input or output writes a tensor of its input's shape."""
    sizes = before.with_model(out, written_before, dims)
    if not any(f.pass_name == "float16_body" for f in fusions):
        return sizes
    ends = {v.name for v in (*out.graph.input, *out.graph.output)}
    f16, f32 = onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT
    elem = {k: (f32 if v == f16 and k not in ends else v) for k, v in sizes.elem_types.items()}
    shapes = dict(sizes.shapes)
    for node in out.graph.node:
        if node.op_type == "Cast" and node.input and node.output and node.output[0] not in shapes:
            if node.input[0] in shapes:
                shapes[node.output[0]] = shapes[node.input[0]]
            elem[node.output[0]] = f32
        elif node.op_type == "Cast" and node.output and node.output[0] in ends and node.input:
            shapes.setdefault(node.input[0], shapes.get(node.output[0]))
            elem[node.input[0]] = f32
    return traffic.Sizes(shapes, elem, sizes.reasons)


def _raising_forms(model: onnx.ModelProto, graph: Any, options: Options) -> frozenset[str]:
    """Outputs of the fused nodes of ``graph`` (the passes' first result) whose form needs a newer onnxruntime
    than the input ``model`` does (``onnxfuse.passes.portable``); empty without an onnxruntime level or without
    the comparison with onnxruntime (``compare_with_onnxruntime``), which :func:`_keep_portable` needs."""
    from onnxfuse.passes import portable

    if options.ort_level is None or not options.compare_with_onnxruntime:
        return frozenset()
    return frozenset(portable.raising_outputs(graph, portable.input_min_release(emitted_forms(model))))


def _keep_portable(fused: onnx.ModelProto, portable: onnx.ModelProto, options: Options) -> bool:
    """True when the output with the forms that need a newer onnxruntime (``fused``) leaves onnxruntime, at
    ``options.ort_level`` on the CPU execution provider, no fewer kernels to run than the output without them
    (``portable``): those forms buy nothing there ("never stricter for nothing", issue 31). False when onnxruntime
    cannot load either (verification then says why)."""
    from onnxfuse.ort import optimized_graph as ort_graph

    level = options.ort_level or DEFAULT_ORT_LEVEL
    with_forms, without = ort_graph.kernels_at(fused, level), ort_graph.kernels_at(portable, level)
    log.debug("onnxruntime at %s runs %s kernels with the newer forms, %s without", level, with_forms, without)
    return with_forms is not None and without is not None and with_forms >= without


def _after_failure(loaded: model_io.LoadedModel, out: onnx.ModelProto, options: Options, verify_options,
                   rewriter: _Rewriter, fusions: list[Fusion], verified):
    """What :func:`analyse` does when the verification of ``out`` failed: the layer-by-layer comparison
    (``options.compare_layers``) and the culprit search (``options.find_culprits``, :mod:`onnxfuse.culprits`).
    Returns the verification to report and, when the culprits were found and the model without them verified,
    that remainder's ``(model, fusions, skips)`` (else None).

    Raises:
        InputError: as :func:`optimize`.
    """
    layers = None
    if options.compare_layers:
        from onnxfuse.verification.layers import compare_layers

        layers = compare_layers(loaded.ort_source(), out, verify_options).to_dict()  # the model that failed
    remainder = None
    if options.find_culprits:
        from onnxfuse import culprits

        found = culprits.search(loaded, rewriter, fusions, verified, verify_options, options.drop_culprits)
        verified, remainder = found.verification, found.remainder
    if layers is not None:
        verified.layers = layers
    return verified, remainder


@dataclass
class _Rewriter:
    """What :func:`analyse` runs the passes with, kept to run them again (the culprit search,
    :mod:`onnxfuse.culprits`) with some sites left unfused.

    ``own_shapes``: the model's own symbolic shapes, or None and ``loader``, which computes them on a pass's first
    need (:func:`_own_symbolic`; once for every run)."""

    options: Options
    overridable: frozenset[str]
    info: dict
    own_shapes: symbolic.SymbolicShapes | None
    loader: Callable[[], symbolic.SymbolicShapes] | None
    selected: tuple[Pass, ...]
    label: str
    _computed: list[symbolic.SymbolicShapes] = field(default_factory=list)
    #: sites every run leaves unfused besides its own ``excluded`` (the groups ``--tune`` dropped), as
    #: ``Context.excluded`` has them
    left_out: dict[tuple[str, ...], str | tuple[Reason, str]] = field(default_factory=dict)

    def _shared_symbolic(self) -> symbolic.SymbolicShapes:
        if not self._computed and self.loader is not None:
            self._computed.append(self.loader())
        return self._computed[0]

    def _passes_on(self, graph: Any, portable: frozenset[str], excluded: dict[tuple[str, ...], Any]
                   ) -> tuple[list[Fusion], list[Skip]]:
        o = self.options
        ctx = Context(get_target(o.target, o.ort_level, deployment_release(o)), self.overridable, dict(self.info),
                      namer=constants.Namer(graph), symbolic=self.own_shapes,
                      symbolic_loader=None if self.loader is None else self._shared_symbolic,
                      materialize_bytes=o.materialize_weights_bytes, portable=portable, excluded=dict(excluded))
        return run_passes(graph, self.selected, ctx)

    def run(self, model: onnx.ModelProto, excluded: dict[tuple[str, ...], Any] | None = None
            ) -> tuple[onnx.ModelProto, list[Fusion], list[Skip]]:
        """The passes over ``model`` (rewritten in place when they change it; it must not be used afterwards):
        the output model (``model`` itself when nothing changed), the fusions and the skips. ``excluded``: sites
        left unfused (``Context.excluded``), besides :attr:`left_out`. Where forms that need a newer onnxruntime
        than ``model`` were made, the passes run again with those chains kept portable and the portable output
        wins unless the fused one leaves onnxruntime fewer kernels (:func:`_keep_portable`, issue 31).

        Raises:
            InputError: the graph cannot be converted or exported.
            PluginError: a plugin pass's rewrites leave a graph that cannot be exported or is invalid
                (:func:`_plugin_checked`).
        """
        excluded = {**self.left_out, **(excluded or {})}
        try:
            graph = convert.to_graph(model)
            fusions, skips = self._passes_on(graph, frozenset(), excluded)
            raising = _raising_forms(model, graph, self.options)
            if raising:  # again, keeping those chains portable (the input model is not changed until export)
                fused_out = _plugin_checked(lambda: convert.to_model(graph, model), fusions, self.selected)
                graph = convert.to_graph(model)
                portable = self._passes_on(graph, raising, excluded)
                portable_out = convert.to_model(graph, model)  # exported once: weighed, and kept if it wins
                if not _keep_portable(fused_out, portable_out, self.options):
                    return fused_out, fusions, skips
                fusions, skips = portable
                return _plugin_checked(lambda: portable_out, fusions, self.selected), fusions, skips
            out = _plugin_checked(lambda: convert.to_model(graph, model, reuse_original=True), fusions,
                                  self.selected) if fusions else model
            return out, fusions, skips
        except InputError as exc:
            raise type(exc)(f"{self.label}: {exc}") from None


def _finish_model(out: onnx.ModelProto, options: Options, selected: tuple[Pass, ...]) -> tuple[Counter, tuple]:
    """The FusedConv/FusedGemm forms of ``out`` and the oldest onnxruntime release that loads them all; sets
    onnxfuse's metadata in ``out``."""
    forms = emitted_forms(out)
    min_release = max((form_min_release(f) for f in forms), default=PROBED_ORT_RELEASES[0])
    _set_metadata(out, options.target, selected, release_text(min_release))
    return forms, min_release


def _spilling(loaded: model_io.LoadedModel, model: onnx.ModelProto):
    """For a model whose weights stay on disk (``model_io.has_lazy``): :func:`onnxfuse.ir.constants.spilling`
    into a new temporary folder (``tempfile``, so ``TMPDIR``) that lives as long as ``loaded`` (the result's
    model reads its folded weights there until it is written); else a block that changes nothing."""
    if not model_io.has_lazy(model):
        return contextlib.nullcontext()
    folder = Path(tempfile.mkdtemp(prefix="onnxfuse-folded-"))
    weakref.finalize(loaded, shutil.rmtree, folder, True)
    return constants.spilling(folder)


def _compares(options: Options) -> bool:
    """True when :func:`analyse` may hand the model to onnxruntime without verification: the comparison with its
    graphs (``compare_with_onnxruntime`` at an ``ort_level``) or ``--tune``'s timed sessions. A run that hands no
    model to onnxruntime (neither this nor verification) keeps the large external weights on disk
    (``model_io.load_model`` with ``lazy``)."""
    return (options.compare_with_onnxruntime and options.ort_level is not None) or options.tune


def _model_of(path: str | os.PathLike | None, loaded: model_io.LoadedModel | None, lazy: bool = False
              ) -> tuple[model_io.LoadedModel, onnx.ModelProto]:
    """``loaded`` (else the model at ``path``, loaded, its large external weights left on disk with ``lazy``:
    :func:`onnxfuse.model.io.load_model`) and its model.

    Raises:
        TypeError: neither is given, or ``loaded``'s model was released by an earlier :func:`analyse`.
        InputError: as :func:`onnxfuse.model.io.load_model`.
    """
    if loaded is None:
        if path is None:
            raise TypeError("analyse: give a path or a loaded model")
        loaded = model_io.load_model(path, lazy=lazy)
    model = loaded.model
    if model is None:
        raise TypeError(f"analyse: {loaded.label}'s model was released by an earlier run; load it again")
    log.debug("loaded %s: %d nodes in the main graph", loaded.label, len(model.graph.node))
    return loaded, model


def _input_shapes(model: onnx.ModelProto, options: Options) -> dict[str, tuple[int, ...]]:
    """The concrete input shapes the report counts: ``options.input_shapes``, those of ``options.input_data``,
    and the ones their named dims complete (:func:`onnxfuse.analysis.shapes.complete_input_shapes`); {} when
    none is given."""
    given = dict(options.input_shapes)
    if options.input_data:
        inits = {t.name for t in model.graph.initializer}
        given = shapes.merge_input_data_shapes(given, shapes.npz_shapes(options.input_data),
                                               {vi.name for vi in model.graph.input} - inits, options.input_data)
    return shapes.complete_input_shapes(model, given) if given else {}


def _release_warnings(release: tuple[int, int], forms: Counter, min_release: tuple[int, int]) -> list[str]:
    """The report's warnings about ``--ort-version`` (``release``): the model holds forms (``forms``, of
    :func:`emitted_forms`) that need ``min_release`` above it, or it is newer than every release probed."""
    warnings = []
    if min_release > release:
        warnings.append(f"the model needs onnxruntime {release_text(min_release)} or newer for forms it "
                        f"already held ({', '.join(sorted(f for f in forms if form_min_release(f) > release))}), "
                        f"above --ort-version {release_text(release)}; onnxfuse does not unfuse them")
    if release > PROBED_ORT_RELEASES[-1]:
        warnings.append(f"onnxruntime {release_text(release)} is newer than the newest release probed "
                        f"({release_text(PROBED_ORT_RELEASES[-1])}): onnxfuse assumes it loads every form "
                        f"{release_text(PROBED_ORT_RELEASES[-1])} loads")
    return warnings


def _verify_and_compare_graphs(loaded: model_io.LoadedModel, out: onnx.ModelProto, input_shapes: dict,
                               options: Options, verify_options, fusions: bool, verifying: bool = False):
    """:func:`analyse`'s work in onnxruntime once the passes have run: ``(verification or None, runtime graphs
    or None)``. ``fusions``: the model was rewritten (or its inputs fixed). With ``verify_options`` and ``fusions``,
    the verification of ``out`` and the comparison share
    their sessions' work (:func:`_verify_and_compare`); with ``fusions`` and a comparison asked for
    (``options.ort_level``, ``options.compare_with_onnxruntime``) but no verification,
    :func:`onnxfuse.ort.optimized_graph.runtime_graphs` alone. ``verifying`` (:func:`optimize`): a verification
    that does not run is still a result, so that the report is complete when built (``skipped`` by the user
    without ``verify_options``, ``unchanged`` when nothing was rewritten); else None.

    Raises:
        InputError: as :func:`optimize`.
    """
    from onnxfuse.ort import optimized_graph as ort_graph
    from onnxfuse.verification.result import Verification

    level = options.ort_level if fusions and options.compare_with_onnxruntime else None
    if fusions and verify_options is not None:
        return _verify_and_compare(loaded, out, input_shapes, verify_options, level)
    not_run = None if not verifying else Verification.skipped_by_user() if verify_options is None \
        else Verification.unchanged()
    if level is None and not fusions and options.compare_with_onnxruntime and options.ort_level is not None:
        # nothing rewritten: 0 B saved beyond onnxruntime, said as such (the report's onnxruntime section), with
        # no session made; None (unknown) stays for a comparison not asked for (--no-verify)
        return not_run, ort_graph.RuntimeGraphs.nothing_rewritten(options.ort_level)
    if level is None:
        return not_run, None
    log.debug("asking onnxruntime which of these fusions it makes itself at level %s", level)
    return not_run, ort_graph.runtime_graphs(loaded.ort_source(), out, level)


def _verify_and_compare(loaded: model_io.LoadedModel, out: onnx.ModelProto, input_shapes: dict, verify_options,
                        level: str | None):
    """:func:`optimize`'s verification of ``out`` against the original, then, at ``level`` (None: not wanted),
    :func:`onnxfuse.ort.optimized_graph.runtime_graphs`: ``(verification, runtime graphs or None)``. The two share
    what they can, for the same verdict and the same report:

    * one budget (:class:`onnxfuse.verification.run.Budget`: ``verify_options.work`` CPU seconds with the
      wall-clock safety stop ``verify_options.timeout``): verification first, the comparison's sessions with
      what is left (when it is spent, the comparison's ``reason`` says so and the verdict stands);
    * one onnxruntime session per model and level: the original is given to both by its path (a caller's
      ModelProto written once to a temporary file, external data beside it when over 2 GB, instead of a
      serialized copy in memory for each), and one temporary file of ``out``
      (:func:`onnxfuse.ort.sessions.loadable` with ``as_file``) serves verification's session of it and the
      comparison's;
    * at level ``all``, the noise-floor session, when verification makes one, is the session of the original at
      ``ORT_ENABLE_ALL`` that ``runtime_graphs`` would make again: it writes onnxruntime's graph
      (:data:`onnxfuse.ort.optimized_graph.SAVE_CONFIG`) and ``runtime_graphs`` reads it, so one session of the
      original at that level is made, not two; at level ``disable``, verification's sessions of the original and
      of ``out`` (both at ``ORT_DISABLE_ALL``) write the graphs the comparison reads.

    Raises:
        InputError: as :func:`optimize`.
    """
    import contextlib
    import tempfile

    from onnxfuse.ort import optimized_graph as ort_graph
    from onnxfuse.ort import sessions as ort_sessions
    from onnxfuse.verification import run as verify_run
    from onnxfuse.verification import verify

    # the shapes analyse() used: the given ones plus those their named dims complete
    verify_options.input_shapes = {k: tuple(v) for k, v in input_shapes.items()}
    _check_input_sizes(verify_options.input_shapes)
    with contextlib.ExitStack() as stack:
        original = _original_source(loaded, stack)
        written = stack.enter_context(ort_sessions.loadable(out, as_file=True)) if level is not None else None
        candidate_file = written if isinstance(written, str) else None  # bytes: no temporary file could be written
        floor_graph = disable_graphs = None
        if level in ("all", "disable"):
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="onnxfuse-ort-"))
            floor_graph = ort_graph.graph_path(folder) if level == "all" else None
            if level == "disable":  # a folder each: both write their weights to the same side file name
                for side in ("original", "candidate"):
                    os.mkdir(os.path.join(folder, side))
                disable_graphs = (ort_graph.graph_path(os.path.join(folder, "original")),
                                  ort_graph.graph_path(os.path.join(folder, "candidate")))
        stack.enter_context(verify_run.budget(verify_options.timeout, verify_options.work))
        log.debug("verifying the optimized model against the original in onnxruntime")
        verification = verify.verify_models(original, out, verify_options, floor_graph, candidate_file, disable_graphs)
        if level is None:
            return verification, None
        log.debug("asking onnxruntime which of these fusions it makes itself at level %s", level)
        original_graph = ort_graph.read_graph(floor_graph or (disable_graphs[0] if disable_graphs else ""))
        return verification, ort_graph.runtime_graphs(
            original, candidate_file or out, level, original_graph, check=verify_run.check_budget,
            optimized_graph=ort_graph.read_graph(disable_graphs[1]) if disable_graphs else None)


def _original_source(loaded: model_io.LoadedModel, stack) -> str | bytes:
    """What verification's and the comparison's sessions load the original from: its file's path; for a caller's
    ModelProto (the API), one temporary file of it for every session (:func:`onnxfuse.ort.sessions.loadable`
    with ``as_file``; external data beside it over 2 GB), entered into ``stack``; its serialized bytes only where
    no temporary file can be written."""
    if loaded.path is not None or loaded.proto is None:
        return loaded.ort_source()
    from onnxfuse.ort import sessions as ort_sessions

    return stack.enter_context(ort_sessions.loadable(loaded.proto, as_file=True))


def optimize(path: str | os.PathLike | None, options: Options, verify_options=None,
             loaded: model_io.LoadedModel | None = None, tuner: Tuner | None = None) -> Result:
    """:func:`analyse` with verification of the optimized model against the original in onnxruntime, unless
    ``verify_options`` is None or nothing was rewritten (status ``unchanged``); the verification result goes
    into ``result.report.verification``. It is made before the report's comparison with onnxruntime's own graphs,
    which reuses its sessions' work (:func:`_verify_and_compare`). ``tuner``: see :func:`_rewrite` (``--tune``:
    the groups it leaves unfused are left out before verification, which checks the output as any other).

    An input that onnxruntime (CPU provider, optimizations disabled) cannot load is refused: verification's own
    session of the original is that load, so it costs nothing more. Without verification (``verify_options``
    None, or nothing rewritten) no session is made; the checks of :func:`analyse` still apply (onnx.checker
    with full_check, unique node names, :func:`onnxfuse.model.io.check_convs`), which find what onnxruntime's
    load or first run finds in Conv attributes, weights and biases, node names and shapes, but not every defect
    it could (an operator it has no kernel for is found by onnxruntime only).

    Raises:
        InputError: as :func:`analyse`; onnxruntime cannot load the original; given input shapes whose random
            inputs numpy cannot even size (more bytes than a pointer can count).
    """
    if verify_options is not None and verify_options.input_data and not options.input_data:
        options = replace(options, input_data=verify_options.input_data)  # real inputs fix the report's shapes
    # verifies a rewritten model; without verify_options the report says skipped, with nothing rewritten unchanged
    if verify_options is None:
        return analyse(path, options, loaded, verify_options, verifying=True, tuner=tuner)
    from onnxfuse.verification import verify  # not imported by a run that verifies nothing

    with verify.reusing():  # the culprit search and the remainder reuse the verification's runs of the original
        result = analyse(path, options, loaded, verify_options, verifying=True, tuner=tuner)
    if result.changed:
        reason = result.report.verification.reason or ""
        if result.report.verification.status == "skipped" and reason.startswith(verify.ORIGINAL_UNLOADABLE):
            raise InputError(f"{result.loaded.label}: {reason}; onnxfuse does not rewrite a model onnxruntime "
                             "cannot load")
    return result


#: Bytes of one element of the widest input dtype onnxfuse generates (float64, int64).
_WIDEST_ITEMSIZE = 8


def _check_input_sizes(input_shapes: dict[str, tuple[int, ...]]) -> None:
    """Refuse input shapes whose arrays numpy cannot size (``ValueError: array is too big`` rather than the
    MemoryError of a merely large one), with the message verification gives for a MemoryError."""
    if any(math.prod(dims) * _WIDEST_ITEMSIZE > sys.maxsize for dims in input_shapes.values()):
        raise InputError(f"random inputs of shapes {input_shapes} do not fit in memory; give smaller "
                         "--input-shape values")


def check_regular_file(path: str | os.PathLike, option: str) -> None:
    """Refuse a ``path`` that is not a regular file (a device such as /dev/zero, a FIFO): reading it to the end
    would never finish, or fill the memory.

    Raises:
        InputError: naming ``option`` and the path.
    """
    if not os.path.isfile(path):
        raise InputError(f"{option} {path}: is not a regular file")


def _count_shapes(skel: onnx.ModelProto, info: dict, input_shapes: dict[str, tuple[int, ...]], expressions: bool
                  ) -> tuple[symbolic.SymbolicShapes, list[str]]:
    """The shapes the report counts, and warnings where two shape inferences disagree.

    With ``expressions`` (or without input shapes): every dim as an expression in the input dims
    (:func:`symbolic.infer`), cross-checked at ``input_shapes`` against ``onnx.shape_inference`` with the shapes
    applied. Without: the shapes ``onnx.shape_inference`` gives with ``input_shapes`` applied, when they size
    every tensor (:func:`symbolic.static_shapes`), else as with ``expressions``. ``skel`` is not modified.

    Raises:
        InputError: ``input_shapes`` names an input the model lacks, or contradicts its rank or fixed dims.
    """
    if not input_shapes:
        return symbolic.infer(skel, info), []
    fixed = onnx.ModelProto()
    fixed.CopyFrom(skel)
    shapes.apply_input_shapes(fixed, input_shapes)  # rejects unknown names, wrong ranks and fixed dims
    if not expressions:
        static = symbolic.static_shapes(*symbolic.derived_shapes(fixed), symbolic.symbol_table(fixed))
        if static is not None:  # the numbers at input_shapes: no symbols (naming them needs sympy), no expressions
            return replace(static, at_input_shapes=True), []
    sym = symbolic.infer(skel, info)  # every dim as an expression in the input dims: what the report counts
    return sym, _cross_check(sym, shapes.infer(fixed)[0], sym.table.values(input_shapes))


def _cross_check(sym: symbolic.SymbolicShapes, concrete: dict, values: dict) -> list[str]:
    """Warnings for tensors whose symbolic shape, evaluated at the given input shapes, differs from what
    ``onnx.shape_inference`` finds on the model with those shapes fixed (an independent second opinion; the
    report counts the symbolic one). Empty when they agree wherever both know the shape."""
    cache: dict = {}
    bad = []
    for name, (shape, _) in concrete.items():
        got = sym.shapes.get(name)
        if shape is None or got is None or len(got) != len(shape) or not all(isinstance(d, int) for d in shape):
            continue
        dims = []
        for d in got:
            if d not in cache:
                cache[d] = symbolic.evaluate(d, values) if d is not None else None
            dims.append(cache[d])
        if None not in dims and tuple(dims) != tuple(shape):
            bad.append(f"{name} {'x'.join(map(str, dims))} (onnx: {'x'.join(map(str, shape))})")
    if not bad:
        return []
    return [f"symbolic shapes at the given input shapes disagree with onnx shape inference for {len(bad)} "
            f"tensor(s), e.g. {'; '.join(bad[:3])}; the counts follow onnxruntime's symbolic inference"]


def _serialized_bytes(model: onnx.ModelProto) -> int | None:
    """Bytes of ``model`` serialized with its weights inline (``model_io.inline_bytes``, which sizes a model over
    protobuf's 2 GiB limit too, weights still on disk included), or None when protobuf cannot size it."""
    try:
        return model_io.inline_bytes(model)
    except Exception:  # a part over protobuf's limit that it refuses to size: the size is unknown
        return None


def _fused_nodes(model: onnx.ModelProto):
    """``(node, activation or None)`` for every ``com.microsoft`` FusedConv and FusedGemm node of every graph of
    ``model``."""
    for graph, _ in proto.proto_graphs(model.graph):
        for node in graph.node:
            if node.domain == domains.MS_DOMAIN and node.op_type in ("FusedConv", "FusedGemm"):
                yield node, next((a.s.decode() for a in node.attribute if a.name == "activation"), None)


def _target_warnings(model: onnx.ModelProto, target_name: str) -> list[str]:
    """FusedConv and FusedGemm nodes in ``model`` (already in the input, or made for another target) that
    ``target_name`` cannot run."""
    target = get_target(target_name)
    bad: Counter = Counter()
    for node, act in _fused_nodes(model):
        if node.op_type == "FusedConv":
            runs = target.fused_conv and (target.plain_fused_conv if act is None else act in target.activations)
        else:
            runs = act in target.fused_gemm
        if not runs:
            bad[(node.op_type, act or "no activation")] += 1
    return [f"the model holds {n} {op} node(s) with {act} that target {target_name} cannot run "
            "(they were in the input; onnxfuse does not unfuse)" for (op, act), n in sorted(bad.items())]


def _op_counts(graph: onnx.GraphProto) -> dict[str, int]:
    counts = Counter(node.op_type if domains.is_default_domain(node.domain) else f"{node.domain}::{node.op_type}"
                     for gr, _ in proto.proto_graphs(graph) for node in gr.node)
    return dict(sorted(counts.items()))


def _missing_shapes(model: onnx.ModelProto, given: dict[str, tuple[int, ...]]) -> list[dict]:
    """Graph inputs (not initializers) with a dim that is not a number and that ``given`` does not set."""
    inits = {t.name for t in model.graph.initializer}
    missing = []
    for vi in model.graph.input:
        if vi.name in inits or vi.name in given or not vi.type.HasField("tensor_type"):
            continue
        dims = vi.type.tensor_type.shape.dim
        if not vi.type.tensor_type.HasField("shape") or any(not d.HasField("dim_value") for d in dims):
            missing.append({"input": vi.name,
                            "shape": [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                                      for d in dims]})
    return missing
