"""Verification's entry point: :func:`verify_models` runs the original and the candidate in onnxruntime on the
same inputs and judges each output by the rule of :mod:`onnxfuse.verification.rule`.

The other modules of this package: :mod:`~onnxfuse.verification.options` (what to verify and how),
:mod:`~onnxfuse.verification.result` (the ``Verification`` it returns), :mod:`~onnxfuse.verification.run` (the
onnxruntime runs and their time budget), :mod:`~onnxfuse.verification.compare` (one output over every input set),
:mod:`~onnxfuse.verification.floors` (the floors measured when the verdict depends on them) and
:mod:`~onnxfuse.verification.models` (what verification reads from or changes in a model's graph).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from onnxfuse.errors import InputError
from onnxfuse.ort import sessions as runtime
from onnxfuse.verification.compare import Accumulator, accumulate, finish
from onnxfuse.verification.floors import measure_floors
from onnxfuse.verification.models import Model, graph_only, random_ops
from onnxfuse.verification.options import VerifyOptions
from onnxfuse.verification.result import Cause, Status, Verification, partial_reason
from onnxfuse.verification.run import (
    Budget,
    Feeds,
    Outputs,
    Signature,
    budget,
    run_all,
    run_candidate,
    second_set,
    session,
    signature,
)

#: How the reason of a ``skipped`` verification starts when onnxruntime cannot load the original (an invalid
#: input: ``pipeline.optimize`` refuses it).
ORIGINAL_UNLOADABLE = "onnxruntime cannot load the original"


def verify_models(original: Model, candidate: Model, options: VerifyOptions | None = None,
                  floor_graph_to: str | None = None, candidate_file: str | None = None,
                  disable_graphs_to: tuple[str, str] | None = None) -> Verification:
    """:func:`_verify_models` within the budget of ``options`` (:class:`onnxfuse.verification.run.Budget`:
    ``options.work`` CPU seconds, DEFAULT_WORK_S, and the wall-clock safety stop ``options.timeout``,
    DEFAULT_TIMEOUT_S), or within the budget a caller already set (``pipeline.optimize``: one for the
    verification and the comparison with onnxruntime's graphs). When the work is spent the result is ``skipped``
    with ``cause`` ``work``; when the safety stop is reached, ``cause`` ``time``; either way whatever was compared
    so far concludes nothing. See :func:`onnxfuse.ort.sessions.run_watched` for how a run is stopped
    (onnxruntime's ``RunOptions.terminate``, in this process). Raises as :func:`_verify_models`.

    ``floor_graph_to``: a file path; when the noise floor is measured, its session (the original at
    ``ORT_ENABLE_ALL``) also writes there the graph onnxruntime optimized, with its weights in a side file
    (:data:`onnxfuse.ort.optimized_graph.SAVE_CONFIG`): the graph
    :func:`onnxfuse.ort.optimized_graph.runtime_graphs` needs at level ``all``. Nothing is written when no floor
    session is made. The session computes the same outputs either way.

    ``candidate_file``: a file that holds ``candidate`` serialized (:func:`onnxfuse.ort.sessions.loadable` with
    ``as_file``), which its session loads instead of a temporary copy of its own; ``candidate`` itself is still
    what is inspected.

    ``disable_graphs_to``: two file paths; the sessions of the original and of the candidate (both at
    ``ORT_DISABLE_ALL``) also write there the graphs onnxruntime made of them, as ``floor_graph_to``: the graphs
    ``runtime_graphs`` needs at level ``disable`` (a session not made writes nothing)."""
    opts = options or VerifyOptions()
    random = random_ops(graph_only(candidate))
    if random:
        return Verification(Status.SKIPPED, f"the model draws random numbers ({', '.join(random)}): its outputs "
                            "differ from run to run, so no comparison is evidence of a correct rewrite",
                            cause=Cause.RANDOM)
    with budget(opts.timeout, opts.work) as limits:
        try:
            return _verify_models(original, candidate, opts, floor_graph_to, candidate_file, disable_graphs_to)
        except runtime.RunTimeout as exc:
            runtime.trim_heap()
            return spent_result(exc, limits)


def spent_result(exc: runtime.RunTimeout, limits: Budget) -> Verification:
    """The ``skipped`` result of a verification stopped by ``exc`` (raised by ``limits``): cause ``work`` for
    :class:`onnxfuse.ort.sessions.WorkSpent`, ``time`` for the wall-clock safety stop."""
    if isinstance(exc, runtime.WorkSpent):
        return Verification(Status.SKIPPED, f"work: verification did not finish within {limits.work:g} CPU "
                            "seconds (--verify-budget; counted in this process's CPU time, not wall time, so the "
                            "same on a loaded machine); nothing was concluded", cause=Cause.WORK)
    return Verification(Status.SKIPPED, f"time: verification did not finish within {limits.timeout:g} s of wall "
                        "time (--verify-timeout, the safety stop beside the --verify-budget work budget); nothing "
                        "was concluded", cause=Cause.TIME)


@dataclass
class _Reference:
    """The original's side of a verification: the input sets and the original's outputs on them.

    Attributes:
        seeds / feeds_list / refs: one per input set (the second default set last, when it ran).
        used_shapes: the shapes of the first input sets' inputs.
        inputs / outputs: the original's signature, which the candidate's must match.
        empty_hint: what to pass when the generated inputs leave nothing to compare.
        invented / random_integers / input_note / second_ran: see :class:`Verification`.
    """

    seeds: list[int]
    feeds_list: list[Feeds]
    refs: Outputs
    used_shapes: dict[str, list[int]]
    inputs: Signature
    outputs: Signature
    empty_hint: str
    invented: list[str]
    random_integers: list[str]
    input_note: str | None
    second_ran: bool

    def verification(self, status: Status, reason: str | None, cause: Cause | None = None) -> Verification:
        """A result on these input sets, with what they were (seeds, shapes, invented sizes, random integers)."""
        second_shapes = {k: list(v.shape) for k, v in self.feeds_list[-1].items()} if self.second_ran else {}
        return Verification(status, reason, seeds=self.seeds, input_shapes=self.used_shapes, cause=cause,
                            invented=self.invented, second_input_shapes=second_shapes, input_note=self.input_note,
                            random_integers=self.random_integers)


def _verify_models(original: Model, candidate: Model, options: VerifyOptions | None = None,
                   floor_graph_to: str | None = None, candidate_file: str | None = None,
                   disable_graphs_to: tuple[str, str] | None = None) -> Verification:
    """Compare ``candidate`` with ``original`` (each a model path, serialized model bytes or a ModelProto, left
    unmodified) in onnxruntime by the rule of :mod:`onnxfuse.verification.rule`.

    Cost: one onnxruntime session per model at ``ORT_DISABLE_ALL``, plus one of the original at
    ``ORT_ENABLE_ALL`` for the noise floor (not created when every output is bit-identical, within
    FLOOR_MULTIPLE x its one-ulp minimum floor, or rtol/atol are given), and, only when an output would otherwise
    fail, one of the original with its weights moved by one ulp (the rounding floor). They are created one after
    the other and each is freed (its heap pages handed back, :func:`onnxfuse.ort.sessions.trim_heap`) before the
    next, so at most one session is held at a time; the outputs kept are copies, which do not hold a session's
    memory arena. Each runs ``options.input_sets`` input sets, without busy-waiting threads (``spinning=False``
    of :func:`onnxfuse.ort.sessions.session`). A candidate given as a ModelProto is loaded from a temporary file
    (``as_file`` of :func:`onnxfuse.ort.sessions.loadable`), not from a second, serialized copy in memory.

    Returns ``partial`` when every output compared passed but one had nothing to compare on any input set
    (NaN/inf or empty on both sides; :attr:`OutputDiff.not_compared`), with a reason that names it and what to
    pass; ``skipped`` (with the reason) when onnxruntime cannot load or run the *original*; ``failed`` when
    the candidate's output names, order or dtypes or its inputs differ, onnxruntime cannot load or run it while it
    can the original, or an output differs beyond tolerance.

    Raises:
        InputError: unreadable ``input_data``; an input name that the model does not have; a value that does not
            fit its input's dtype; ``input_data`` that onnxruntime cannot run the original on; inputs too large
            for memory.
    """
    opts = options or VerifyOptions()
    kept = kept_runs(original, opts)
    ref = None if kept is None else kept.get("ref")
    if ref is None:
        spec = runtime.InputSpec(shapes=dict(opts.input_shapes), values=dict(opts.input_values),
                                 ranges=dict(opts.input_ranges), index_highs=dict(opts.index_inputs),
                                 data=runtime.load_npz(opts.input_data) if opts.input_data else {})
        ref = _run_original(original, spec, opts, disable_graphs_to[0] if disable_graphs_to else None)
        if isinstance(ref, Verification):
            return ref
        if kept is not None:
            kept["ref"] = ref
    return judge(original, ref, candidate, opts, floor_graph_to, candidate_file,
                 None if kept is None else kept["cache"], disable_graphs_to[1] if disable_graphs_to else None)


#: The original's runs kept by :func:`reusing` (None: outside it): key -> {"ref": _Reference, "cache": floors}.
_KEPT: contextvars.ContextVar[dict | None] = contextvars.ContextVar("onnxfuse_verify_kept", default=None)


@contextlib.contextmanager
def reusing() -> Iterator[None]:
    """Within the body, the verifications of one original file with one ``VerifyOptions`` object share the
    original's runs (:func:`kept_runs`): its session at ``ORT_DISABLE_ALL`` with the input sets and its outputs,
    and its floor sessions (:func:`onnxfuse.verification.floors.measure_floors`' cache), so that ``optimize``'s
    verification, the culprit search's candidates and the remainder's verification make one session of the
    original per level, not one each. Same inputs, same outputs, same verdicts."""
    token = _KEPT.set({})
    try:
        yield
    finally:
        _KEPT.reset(token)


def kept_runs(original: Model, opts: VerifyOptions) -> dict | None:
    """The original's runs kept for ``original`` (a file: its real path, modification time and size) verified
    with ``opts`` (the same object) within :func:`reusing`: a dict with ``"cache"`` (the floors' runs) and,
    once made, ``"ref"`` (the :class:`_Reference`); None outside :func:`reusing` or for an original given as
    bytes or a ModelProto (nothing identifies it cheaply)."""
    store = _KEPT.get()
    if store is None or not isinstance(original, (str, os.PathLike)):
        return None
    try:
        st = os.stat(original)
    except OSError:
        return None
    key = (os.path.realpath(original), st.st_mtime_ns, st.st_size, id(opts))
    return store.setdefault(key, {"cache": {}})


def judge(original: Model, ref: _Reference, candidate: Model, opts: VerifyOptions, floor_graph_to: str | None = None,
          candidate_file: str | None = None, cache: dict | None = None, candidate_graph_to: str | None = None
          ) -> Verification:
    """The candidate's side of :func:`_verify_models`: run ``candidate`` on ``ref``'s input sets and judge each
    output against the original's. ``cache``: the original's floor runs kept between calls on the same ``ref``
    (:func:`onnxfuse.verification.floors.measure_floors`). ``candidate_graph_to``: the candidate's session also
    writes onnxruntime's graph of it there (``disable_graphs_to`` of :func:`verify_models`). Within the budget in
    force (:data:`onnxfuse.verification.run.BUDGET`).

    Raises:
        runtime.RunTimeout: the budget ran out.
    """
    runtime.trim_heap()
    gots = run_candidate(candidate_file or candidate, ref.feeds_list, ref.inputs, ref.outputs, candidate_graph_to)
    runtime.trim_heap()
    if isinstance(gots, str):
        return ref.verification(Status.FAILED, gots)
    accs = [Accumulator(name, ref.refs[0][i].dtype, list(ref.refs[0][i].shape))
            for i, (name, _) in enumerate(ref.outputs)]
    for r_set, g_set in zip(ref.refs, gots, strict=True):
        for acc, r, g in zip(accs, r_set, g_set, strict=True):
            accumulate(acc, r, g, opts)
    nothing = _nothing_compared(ref, accs)
    if nothing is not None:
        return nothing
    floor_note = measure_floors(original, ref.feeds_list, ref.refs, accs, opts, floor_graph_to, cache)
    outputs = [finish(a, opts) for a in accs]
    failed = [o for o in outputs if not o.passed and not o.not_compared]
    missing = [o for o in outputs if o.not_compared]
    # an output with nothing compared on any input set is no evidence: the verdict is partial, never passed
    status = Status.FAILED if failed else Status.PARTIAL if missing else Status.PASSED
    reason = "; ".join(o.describe(opts.floor_multiple) for o in failed) or (partial_reason(missing) if missing
                                                                              else None)
    return replace(ref.verification(status, reason), outputs=outputs,
                   rule="rtol-atol" if opts.explicit_tolerance else "noise-floor",
                   floor_multiple=opts.floor_multiple, floor_note=floor_note)


def reference(original: Model, opts: VerifyOptions) -> _Reference | Verification:
    """The input sets of ``opts`` and the original's outputs on them (:func:`_run_original`), for several
    :func:`judge` calls; or the ``skipped`` result. Within the budget that is set (:data:`BUDGET`).

    Raises:
        InputError: as :func:`_verify_models`.
        runtime.RunTimeout: the budget ran out.
    """
    spec = runtime.InputSpec(shapes=dict(opts.input_shapes), values=dict(opts.input_values),
                             ranges=dict(opts.input_ranges),
                             data=runtime.load_npz(opts.input_data) if opts.input_data else {})
    return _run_original(original, spec, opts)


def _run_original(original: Model, spec: runtime.InputSpec, opts: VerifyOptions, save_to: str | None = None
                  ) -> _Reference | Verification:
    """The input sets and the original's outputs on them (its session freed on return), or the ``skipped``
    result when onnxruntime cannot load the original or run it on the generated inputs. ``save_to``: the
    session also writes onnxruntime's graph of the original there (:func:`onnxfuse.verification.run.session`).

    Raises:
        InputError: as :func:`_verify_models`.
        runtime.RunTimeout: the budget ran out.
    """
    with runtime.loadable(original) as src:
        try:
            ref_sess = session(src, "disable", save_to)
        except runtime.RunTimeout:
            raise
        except Exception as exc:
            return Verification(Status.SKIPPED, f"{ORIGINAL_UNLOADABLE}: {runtime.short(exc)}", cause=Cause.LOAD)
        runtime.check_names(ref_sess, spec)
        all_given = set(spec.data) >= {i.name for i in ref_sess.get_inputs()}
        seeds = [0] if all_given else list(range(max(1, opts.input_sets)))
        invented = runtime.invented_inputs(ref_sess, spec)
        random_integers = [i.name for i in ref_sess.get_inputs() if i.name not in spec.fixed()
                           and i.type in runtime.EXACT_INPUT_TYPES]
        feeds_list = _first_feeds(ref_sess, spec, seeds, opts)
        if isinstance(feeds_list, Verification):
            return feeds_list
        used_shapes = {k: list(v.shape) for k, v in feeds_list[-1].items()}
        ref_inputs, ref_outputs = signature(ref_sess.get_inputs()), signature(ref_sess.get_outputs())
        empty_hint = runtime.random_inputs_hint(ref_sess, spec)
        try:
            refs = run_all(ref_sess, feeds_list)
        except runtime.RunTimeout:
            raise
        except Exception as exc:
            if spec.data:
                raise InputError(f"--input-data {opts.input_data}: onnxruntime cannot run the original on it: "
                                 f"{runtime.short(exc)}") from None
            return Verification(Status.SKIPPED, f"onnxruntime cannot run the original on inputs {used_shapes}: "
                                f"{runtime.short(exc)}{empty_hint}", seeds=seeds, input_shapes=used_shapes,
                                cause=Cause.INPUTS, invented=invented)
        second, input_note = second_set(ref_sess, spec, invented, len(seeds))
        second_ran = second is not None
        if second is not None:
            feeds_list.append(second[0])
            refs.append(second[1])
            seeds.append(len(seeds))
        del ref_sess, second
    return _Reference(seeds, feeds_list, refs, used_shapes, ref_inputs, ref_outputs, empty_hint, invented,
                      random_integers, input_note, second_ran)


def _first_feeds(sess: Any, spec: runtime.InputSpec, seeds: list[int], opts: VerifyOptions
                 ) -> list[Feeds] | Verification:
    """One input set per seed (given, or random by :func:`onnxfuse.ort.sessions.make_inputs`), or the ``skipped``
    result when they cannot be made for the original's inputs.

    Raises:
        InputError: the inputs do not fit in memory.
    """
    try:
        return [runtime.make_inputs(sess, spec, seed) for seed in seeds]
    except ValueError as exc:
        return Verification(Status.SKIPPED, str(exc), cause=Cause.INPUTS)
    except MemoryError:
        raise InputError(f"random inputs of shapes {opts.input_shapes} do not fit in memory; give smaller "
                         "--input-shape values") from None


def _nothing_compared(ref: _Reference, accs: list[Accumulator]) -> Verification | None:
    """The ``skipped`` result when the original's outputs leave nothing to compare (every output empty, or NaN/inf
    everywhere on both sides): no evidence either way; None otherwise."""
    if all(a.shape_ok and a.compared == 0 for a in accs):
        # Nothing to compare is no evidence: a Loop that ran 0 times, a branch that returned an empty tensor.
        return ref.verification(Status.SKIPPED, "every output of the original is empty on the generated inputs "
                                f"{ref.used_shapes}, so nothing was compared{ref.empty_hint}", cause=Cause.INPUTS)
    if all(a.shape_ok and a.finite == 0 and a.nonfinite == 0 for a in accs):
        # NaN against NaN everywhere (all-NaN --input-data, say) matches, but proves nothing about the rewrite
        return ref.verification(Status.SKIPPED, "every output value of the original is NaN or inf on the inputs "
                                f"{ref.used_shapes} (and the optimized model's too), so no number was compared; "
                                "give finite inputs (--input-data, --input-range)", cause=Cause.INPUTS)
    return None
