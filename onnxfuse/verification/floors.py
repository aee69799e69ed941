"""The floors a deviation is judged against, measured only when the verdict depends on them: onnxruntime's noise
floor (the original at ORT_ENABLE_ALL) and the rounding floor (the original with its weights moved by one ulp);
see the rule in :mod:`onnxfuse.verification.rule`."""

from __future__ import annotations

from onnxfuse.ort import sessions as runtime
from onnxfuse.verification.compare import Accumulator, add_floor, over
from onnxfuse.verification.models import Model, proto, weights_moved_by_one_ulp
from onnxfuse.verification.options import VerifyOptions
from onnxfuse.verification.rule import exact
from onnxfuse.verification.run import Feeds, Outputs, run_all, session


def measure_floors(original: Model, feeds_list: list[Feeds], refs: Outputs, accs: list[Accumulator],
                   opts: VerifyOptions, floor_graph_to: str | None = None,
                   cache: dict[str, Outputs | str] | None = None) -> str | None:
    """Measure the floors that the verdict of ``accs`` (every input set compared) depends on, into ``accs``;
    the report's ``floor_note``: why a floor was not measured (None when both needed were).
    ``floor_graph_to``: as in :func:`onnxfuse.verification.verify.verify_models`. ``cache``: the original's floor
    runs kept from an earlier call on the same original and inputs (``"floor"``, ``"rounding"``: its outputs, or
    the note of why they could not be made), filled in here, so that several candidates judged against one
    original (the culprit search, :mod:`onnxfuse.verification.search`) make each floor session once.

    No floor is measured under explicit rtol/atol, with no floating-point output, when every floating-point
    output is bit-identical to the original's, or when every output is within ``floor_multiple`` x its one-ulp
    minimum floor already (the verdict cannot depend on onnxruntime's floor, so its ORT_ENABLE_ALL session, the
    costliest: weights pre-packed, is not made); an integer output that differs needs the floors all the same.
    The rounding floor is measured only when an output is over the noise floor.

    Raises:
        runtime.RunTimeout: the budget ran out.
    """
    ints_differ = any(exact(a.dtype) and a.shape_ok and a.differing for a in accs)
    if opts.explicit_tolerance:
        return "not measured: --rtol/--atol replace the noise-floor rule"
    if all(exact(a.dtype) for a in accs) and not ints_differ:
        return "not measured: no floating-point output"
    if all((a.max_abs == 0 and a.nonfinite == 0 and a.shape_ok) or exact(a.dtype) for a in accs) \
            and not ints_differ:
        return "not measured: every floating-point output is bit-identical to the original's"
    if not any(over(a, opts) for a in accs):
        return (f"not measured: every floating-point output is within {opts.floor_multiple:g}x its "
                "one-ulp minimum floor")
    floor_note = measure_floor(original, feeds_list, refs, accs, floor_graph_to, cache)
    if any(over(a, opts) for a in accs):
        note = measure_rounding_floor(original, feeds_list, refs, accs, cache)
        floor_note = "; ".join(n for n in (floor_note, note) if n) or None
    return floor_note


def measure_floor(original: Model, feeds_list: list[Feeds], refs: Outputs, accs: list[Accumulator],
                  save_to: str | None = None, cache: dict[str, Outputs | str] | None = None) -> str | None:
    """Set each output's ``floor`` (and its slices', and an integer output's ``floor_differing``) from one
    ORT_ENABLE_ALL session of the original; a note when that session cannot be made or run (the floor then
    stays None and min_floor alone applies). ``save_to``: as ``floor_graph_to`` of
    :func:`onnxfuse.verification.verify.verify_models`. ``cache``: as in :func:`measure_floors`.

    Raises:
        runtime.RunTimeout: the budget ran out.
    """
    cached = None if cache is None or save_to else cache.get("floor")
    if isinstance(cached, str):
        return cached
    if cached is None:
        with runtime.loadable(original) as src:
            try:
                cached = run_all(session(src, "all", save_to), feeds_list)
            except runtime.RunTimeout:
                raise
            except Exception as exc:
                note = f"not measured: onnxruntime cannot run the original at ORT_ENABLE_ALL: {runtime.short(exc)}"
                if cache is not None:
                    cache["floor"] = note
                return note
        if cache is not None:
            cache["floor"] = cached
    _add_floors(accs, refs, cached, "floor")
    return None


def measure_rounding_floor(original: Model, feeds_list: list[Feeds], refs: Outputs, accs: list[Accumulator],
                           cache: dict[str, Outputs | str] | None = None) -> str | None:
    """Set each output's ``rounding_floor`` (and its slices', and an integer output's floors, see
    :func:`onnxfuse.verification.compare.add_floor`) from one ORT_DISABLE_ALL session of the original with
    :func:`onnxfuse.verification.models.weights_moved_by_one_ulp`; a note when that cannot be done. ``cache``: as
    in :func:`measure_floors`.

    Raises:
        runtime.RunTimeout: the budget ran out.
    """
    cached = None if cache is None else cache.get("rounding")
    if isinstance(cached, str):
        return cached
    if cached is not None:
        _add_floors(accs, refs, cached, "rounding")
        return None
    try:
        model = proto(original)
        # a model proto() read from a path or bytes is this function's own: moved in place, not copied first
        moved = weights_moved_by_one_ulp(model, in_place=model is not original)
        del model
        with runtime.loadable(moved, as_file=True) as src:
            if isinstance(src, str):  # written: the proto (its weights twice, read and moved) can go now
                del moved
            outs = run_all(session(src), feeds_list)
    except runtime.RunTimeout:
        raise
    except Exception as exc:
        note = f"rounding floor not measured: {runtime.short(exc)}"
        if cache is not None:
            cache["rounding"] = note
        return note
    if cache is not None:
        cache["rounding"] = outs
    _add_floors(accs, refs, outs, "rounding")
    return None


def _add_floors(accs: list[Accumulator], refs: Outputs, alts: Outputs, kind: str) -> None:
    """Hand the session's memory back, then set the ``kind`` floor (``"floor"`` or ``"rounding"``) of each output
    from its runs on every input set (:func:`onnxfuse.verification.compare.add_floor`)."""
    runtime.trim_heap()
    for ref, alt in zip(refs, alts, strict=True):
        for acc, r, a in zip(accs, ref, alt, strict=True):
            add_floor(acc, r, a, kind)
