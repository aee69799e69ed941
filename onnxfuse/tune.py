"""``--tune``: decide by measurement where the speed rules cannot (issue 31, item 2).

The default choice of what to emit is rule-based and deterministic (``onnxfuse.ort.providers.CPU_SLOWER_AT``, from
``benchmarks/bench_forms.py``). ``--tune`` times instead, in the user's own onnxruntime (the installed release, at
``--ort-level``, ``--threads`` intra-op threads, CPU execution provider) on the user's input sizes
(``--input-shape``, else the representative sizes the report uses: batch 1, 224 for the other symbolic dims):

- A **group** is the rewrites of one pass that emit one form (:func:`groups`, :func:`form_of`): every
  FusedConv(HardSwish) of conv_hardswish, every BatchNormalization fold of conv_batchnorm, every PRelu ->
  LeakyRelu. So the number of timings stays small whatever the model's size. The passes that only remove work
  onnxruntime removes too (:data:`UNTUNED`: constant folding, no-ops, constant Ifs) are not timed.
- Its **alternative** is the model with that group's rewrite sites left out: the passes run again on the input
  with ``Context.excluded`` (the culprit search's machinery, :mod:`onnxfuse.culprits`), over the groups already
  dropped (greedy, in the passes' order: each group is timed against the model as it stands).
- **Timing** (:class:`OrtTimer`): ``onnxfuse bench``'s paired ABBA rounds and its distribution-free interval of
  the median ratio (:func:`onnxfuse.bench.measure`, margin 0), ratio = time without the group / time with it.
  At least :data:`MIN_ROUNDS` rounds per group; the budget (``--tune-budget`` seconds for all of --tune's work:
  the passes run again, the session loads and the rounds; what is left is shared by the groups not yet timed)
  bounds the rest, and a group reached with none left is not timed.
- **Verdict** (:func:`verdict`): ``dropped`` only when the whole interval lies below 1.0 (the model is faster
  without the group); ``kept`` when it lies wholly above 1.0; otherwise ``inconclusive``, and the rule's choice
  (the group fused) stays. A dropped group's sites are left unfused with the reason ``slower-when-measured``; the
  output is then verified like any output.

The report's ``tune`` section records each group: pass, form, sites, ratio with its interval, verdict, and the
release, level and threads it was timed at. Timings depend on the machine and its load: a test injects a timer
(``timer``) rather than asserting one.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import onnx

from onnxfuse.ort.levels import DEFAULT_ORT_LEVEL
from onnxfuse.ort.providers import REWRITE_FORMS, form_name, gemm_form_name
from onnxfuse.records import Fusion, Reason, RewriteKind

if TYPE_CHECKING:
    from onnxfuse import pipeline
    from onnxfuse.model.io import LoadedModel
    from onnxfuse.ort.sessions import InputSpec

log = logging.getLogger(__name__)

#: A site's key (``records.Fusion.site``).
Site = tuple[str, ...]

#: Paired rounds every timed group runs at least: the fewest for which :func:`onnxfuse.bench.measure` has an
#: interval at its per-look confidence (``bench.order_ranks``).
MIN_ROUNDS = 14
#: Untimed runs of each session before its rounds.
WARMUP = 2
#: Passes whose rewrites are not timed: they remove work (a constant computed at load, an Identity, a constant If)
#: that onnxruntime removes itself at ``basic`` and that the fusions after them build on.
UNTUNED = frozenset({"constant_fold", "remove_redundant", "if_constant"})
VERDICTS = ("kept", "dropped", "inconclusive")
#: The execution provider of the timed sessions (``onnxfuse.ort.sessions.session``).
PROVIDER = "CPUExecutionProvider"


@dataclass(frozen=True)
class Group:
    """The rewrites of one pass that emit one form: ``pass_name``, ``form`` (:func:`form_of`) and their ``sites``
    (``Fusion.site``), in the order made."""

    pass_name: str
    form: str
    sites: tuple[Site, ...]


#: ``timer(group, fused, alternative, seconds)``: times ``alternative`` (``group`` left out) against ``fused``
#: (the model as it stands) for about ``seconds`` of rounds; returns ``ratio`` (alternative / fused), ``ci_low``,
#: ``ci_high``, ``ci_confidence``, ``rounds``, ``same_kernels`` and ``input_shapes`` (name -> dims fed).
#: Raises RuntimeError when onnxruntime cannot load or run one of them.
Timer = Callable[[Group, onnx.ModelProto, onnx.ModelProto, float], dict[str, Any]]


def form_of(fusion: Fusion) -> str:
    """What a rewrite emits, as the tune section names it: the FusedConv / FusedGemm form
    (``providers.form_name``, ``gemm_form_name``: ``FusedConv(Z, Relu)``), ``fold BatchNormalization`` for a fold,
    the form of issue 31's canonicalizations (``providers.REWRITE_FORMS``: ``PRelu -> LeakyRelu``, ``float32 body
    between float16 Casts``), else ``Pad + Conv -> Conv`` (the ops it replaced -> the op it wrote, ``nothing`` when
    it removed them)."""
    ops = list(dict.fromkeys(op for _, op, _ in fusion.replaced))
    if fusion.op == "FusedConv":
        return form_name(fusion.activation, fusion.pass_name == "conv_residual")
    if fusion.op == "FusedGemm":
        return gemm_form_name(fusion.activation or "")
    if fusion.pass_name in REWRITE_FORMS:  # issue 31's canonicalizations, named as their speed rules name them
        return REWRITE_FORMS[fusion.pass_name]
    if fusion.kind is RewriteKind.FOLD:
        folded = [op for op in ops if op not in ("Conv", "ConvTranspose", "Gemm", "MatMul")]
        return f"fold {' + '.join(folded or ops)}"
    return f"{' + '.join(ops)} -> {fusion.op or 'nothing'}"


def groups(fusions: list[Fusion]) -> list[Group]:
    """The groups of ``fusions`` (the passes' first run), in the order their first rewrite was made; fusions without
    a site and those of :data:`UNTUNED` passes are in none."""
    found: dict[tuple[str, str], list[Site]] = {}
    for f in fusions:
        if f.site and f.pass_name not in UNTUNED:
            found.setdefault((f.pass_name, form_of(f)), []).append(f.site)
    return [Group(p, form, tuple(dict.fromkeys(sites))) for (p, form), sites in found.items()]


def verdict(ci_low: float | None, ci_high: float | None) -> str:
    """``dropped`` when the interval of the ratio (time without the group / time with it) lies wholly below 1.0,
    ``kept`` when wholly above, else (or not timed: None) ``inconclusive``."""
    if ci_low is None or ci_high is None:
        return "inconclusive"
    return "dropped" if ci_high < 1.0 else "kept" if ci_low > 1.0 else "inconclusive"


class OrtTimer:
    """The default :data:`Timer`: onnxruntime CPU sessions of both models at ``level`` with ``threads`` intra-op
    threads, fed the same seeded inputs (``spec``; symbolic dims not given at the representative sizes,
    ``onnxfuse.ort.sessions.make_inputs``), timed in :func:`onnxfuse.bench.measure`'s ABBA rounds with margin 0.
    When onnxruntime's optimized graphs of both hold the same kernels (``bench.kernels``) only the minimum rounds
    run (the verdict then is the noise's, and ``same_kernels`` says so). The session of the model as it stands is
    kept while that model is (``fused`` is the same object)."""

    def __init__(self, level: str, threads: int, spec: InputSpec, min_rounds: int = MIN_ROUNDS):
        import tempfile

        self.level, self.threads, self.spec, self.min_rounds = level, threads, spec, min_rounds
        self._tmp = tempfile.TemporaryDirectory(prefix="onnxfuse-tune-")
        self._fused: tuple[int, Any, Any, Any] | None = None  # id(model), session, kernels, feeds
        self._count = 0

    def close(self) -> None:
        """Remove the temporary folder of the graphs onnxruntime wrote."""
        self._fused = None
        self._tmp.cleanup()

    def _load(self, model: onnx.ModelProto, what: str) -> tuple[Any, Any]:
        """A session of ``model`` at the level and the kernels of the graph onnxruntime runs for it.

        Raises:
            RuntimeError: onnxruntime cannot load it.
        """
        from onnxfuse import bench
        from onnxfuse.ort import sessions

        self._count += 1
        saved = os.path.join(self._tmp.name, f"{self._count}.onnx")
        with sessions.loadable(model, as_file=True) as source:
            try:
                sess = sessions.session(source, self.level, self.threads, saved)
            except Exception as exc:  # onnxruntime raises its own types
                raise RuntimeError(f"onnxruntime cannot load the {what} model: {sessions.short(exc)}") from None
        return sess, bench.kernels(saved) if os.path.exists(saved) else None

    def __call__(self, group: Group, fused: onnx.ModelProto, alternative: onnx.ModelProto, seconds: float
                 ) -> dict[str, Any]:
        """See :data:`Timer`."""
        from onnxfuse import bench
        from onnxfuse.ort import sessions

        if self._fused is None or self._fused[0] != id(fused):
            sess, graph = self._load(fused, "fused")
            try:
                feeds = sessions.make_inputs(sess, self.spec, seed=0)
            except ValueError as exc:  # an input type onnxfuse cannot generate (optional, sequence)
                raise RuntimeError(f"{exc}; give it with --input-data") from None
            self._fused = (id(fused), sess, graph, feeds)
        _, sess_a, graph_a, feeds = self._fused
        sess_b, graph_b = self._load(alternative, f"{group.pass_name} left out")
        try:
            for sess in (sess_a, sess_b):
                for _ in range(1 + WARMUP):
                    sess.run(None, feeds)
        except Exception as exc:
            raise RuntimeError(f"onnxruntime cannot run the models on the inputs: {sessions.short(exc)}") from None
        same = graph_a is not None and graph_a == graph_b
        m = bench.measure(partial(sess_a.run, None, feeds), partial(sess_b.run, None, feeds), self.min_rounds,
                          max(seconds, 0.0), margin=0.0, stop_at_min=same)
        return {"ratio": m["ratio"], "ci_low": m["ci_low"], "ci_high": m["ci_high"],
                "ci_confidence": m["confidence"], "rounds": m["rounds"], "same_kernels": same,
                "input_shapes": {k: list(v.shape) for k, v in feeds.items()}}


def _spec(input_shapes: dict[str, tuple[int, ...]], options: pipeline.Options, verify_options: Any) -> InputSpec:
    """What to feed: the report's input shapes, the ``--input-data`` arrays and the verification's
    ``--input-value`` / ``--input-range`` (a sampling rate stays 16000, not noise)."""
    from onnxfuse.ort.sessions import InputSpec, load_npz

    data = options.input_data or getattr(verify_options, "input_data", None)
    return InputSpec(shapes=dict(input_shapes), data=load_npz(data) if data else {},
                     values=dict(getattr(verify_options, "input_values", None) or {}),
                     ranges=dict(getattr(verify_options, "input_ranges", None) or {}),
                     index_highs=dict(getattr(verify_options, "index_inputs", None) or {}))


def detail(group: Group, row: dict[str, Any], section: dict[str, Any]) -> str:
    """The sentence of a dropped group's ``slower-when-measured`` skips."""
    return (f"--tune left the {row['sites']} {group.form} rewrite(s) of {group.pass_name} unfused: without them the "
            f"model ran {row['ratio']:.3f}x the time with them ({100 * row['ci_confidence']:.4g}% interval "
            f"{row['ci_low']:.3f}-{row['ci_high']:.3f}, {row['rounds']} paired rounds, onnxruntime "
            f"{section['onnxruntime']} at level {section['level']}, {section['threads']} thread(s))")


def decide(rewriter: pipeline._Rewriter, fresh: Callable[[], onnx.ModelProto], out: onnx.ModelProto,
           fusions: list[Fusion], input_shapes: dict[str, tuple[int, ...]], options: pipeline.Options,
           verify_options: Any = None, timer: Timer | None = None,
           clock: Callable[[], float] = time.monotonic) -> tuple[dict[Site, tuple[Reason, str]], dict[str, Any]]:
    """``pipeline.Tuner``: time each group of ``fusions`` (the passes' first run, whose output is ``out``) against
    the model with it left out, as the module docstring says. Returns the sites of the dropped groups, each with
    its ``(Reason.SLOWER_WHEN_MEASURED, sentence)``, and the report's ``tune`` section. ``timer``: None times in
    onnxruntime (:class:`OrtTimer`); tests pass a fake one. ``clock``: seconds, for the budget.

    Raises:
        InputError, PluginError: as ``rewriter.run`` (the passes run again).
    """
    from onnxfuse.ort.optimized_graph import installed_version

    level = options.ort_level or DEFAULT_ORT_LEVEL
    own = timer is None
    timing: Timer = OrtTimer(level, options.threads, _spec(input_shapes, options, verify_options)) \
        if timer is None else timer
    section: dict[str, Any] = {"onnxruntime": installed_version(), "level": level, "threads": options.threads,
                               "provider": PROVIDER, "budget_s": options.tune_budget_s, "seconds": 0.0,
                               "input_shapes": {k: list(v) for k, v in input_shapes.items()}, "groups": []}
    start = clock()
    todo = groups(fusions)
    dropped: dict[Site, tuple[Reason, str]] = {}
    current = out
    try:
        for i, group in enumerate(todo):
            left = options.tune_budget_s - (clock() - start)
            row, alternative = _time_group(rewriter, fresh, group, current, dropped, timing, left / (len(todo) - i))
            section["groups"].append(row)
            if "input_shapes" in row:
                section["input_shapes"] = row.pop("input_shapes")
            if row["verdict"] == "dropped" and alternative is not None:
                current = alternative
                dropped.update((s, (Reason.SLOWER_WHEN_MEASURED, detail(group, row, section))) for s in group.sites)
            log.debug("tune: %s %s x%d: %s", group.pass_name, group.form, len(group.sites), row["verdict"])
    finally:
        if own and isinstance(timing, OrtTimer):
            timing.close()
    section["seconds"] = clock() - start
    return dropped, section


def _time_group(rewriter: pipeline._Rewriter, fresh: Callable[[], onnx.ModelProto], group: Group,
                current: onnx.ModelProto, dropped: dict[Site, tuple[Reason, str]], timing: Timer, seconds: float
                ) -> tuple[dict[str, Any], onnx.ModelProto | None]:
    """One group's row of the tune section and its alternative model (None when it was not built or timed).
    ``seconds``: its share of the budget left; none left: not timed (``inconclusive``, the note says why)."""
    row: dict[str, Any] = {"pass": group.pass_name, "form": group.form, "sites": len(group.sites), "ratio": None,
                           "ci_low": None, "ci_high": None, "ci_confidence": None, "rounds": 0,
                           "verdict": "inconclusive", "note": None}
    if seconds <= 0:
        row["note"] = "not timed: the --tune-budget was spent; the rule's choice is kept"
        return row, None
    excluded = {**dropped, **{s: (Reason.SLOWER_WHEN_MEASURED, "left out while --tune times it") for s in group.sites}}
    alternative = rewriter.run(fresh(), excluded)[0]
    try:
        t = timing(group, current, alternative, seconds)
    except RuntimeError as exc:
        row["note"] = f"not timed: {exc}; the rule's choice is kept"
        return row, None
    row.update(ratio=t["ratio"], ci_low=t["ci_low"], ci_high=t["ci_high"], ci_confidence=t["ci_confidence"],
               rounds=t["rounds"], verdict=verdict(t["ci_low"], t["ci_high"]))
    if t.get("same_kernels"):
        row["note"] = "onnxruntime runs the same kernels with and without the group at this level"
    if "input_shapes" in t:
        row["input_shapes"] = t["input_shapes"]
    return row, alternative


def optimize(path: str | os.PathLike | None, options: pipeline.Options, verify_options: Any = None,
             loaded: LoadedModel | None = None, timer: Timer | None = None) -> pipeline.Result:
    """``pipeline.optimize`` with ``options.tune`` honoured: the groups timed by :func:`decide` (``timer`` None:
    onnxruntime, :class:`OrtTimer`), the dropped ones left unfused, then the output verified as any other. Without
    ``options.tune``, ``pipeline.optimize`` itself.

    Raises:
        InputError, VerificationError: as ``pipeline.optimize``.
    """
    from onnxfuse import pipeline

    tuner = partial(decide, timer=timer) if options.tune else None
    return pipeline.optimize(path, options, verify_options, loaded, tuner=tuner)
