"""``onnxfuse bench``: onnxruntime inference latency of the original model (A) and the optimized one (B), per
graph optimization level, with a confidence interval for their ratio.

Method (times in seconds unless a name ends in ``_ms``):

- Rounds. Per level one CPU session of A and one of B are created (creation timed) and warmed up. Each timed round
  runs A, B, B, A (ABBA: a drift of the machine's speed that is linear over the round cancels); the round's times
  are ``tA = (a1 + a2) / 2`` and ``tB = (b1 + b2) / 2``, its ratio ``tB / tA`` (both sides share the machine's
  state of that round, so load that slows a whole round cancels in the ratio).
- Ratio: the median of the per-round ratios. Columns: ``original ms`` is the median of ``tA``, ``optimized ms``
  is ``original ms * ratio``, the optimized model's time the paired rounds give; so the two columns and the ratio
  always agree (the median of ``tB`` alone is in the JSON as ``optimized_median_ms``; under load it can disagree
  with the ratio, which is why it is not the column).
- Interval: the distribution-free interval of the median (the sign test's; :func:`order_ranks`), exact whatever
  the noise's distribution: bursts of load, skew and outliers need no model.
- Verdict, with an equivalence margin ``m`` (default 2%): ``faster`` when the whole interval lies below
  ``1 - m``, ``slower`` when it lies above ``1 + m``, ``same`` when it lies within ``[1 - m, 1 + m]``, else
  ``inconclusive`` (the interval is printed); also ``inconclusive`` when there are too few rounds for an interval.
- Stopping (:func:`measure`): at least ``runs`` rounds; the verdict is looked at after ``runs`` rounds and each
  time their count doubles, and rounds go on until it is not ``inconclusive``, the time budget (seconds of timed
  rounds per level) is spent, or :data:`MAX_ROUNDS` rounds are done. Each look's interval has confidence
  ``1 - 0.001 / L`` (L looks at most, :func:`look_confidence`), so a model exactly as fast as the original is
  called faster or slower with probability at most 0.1% (:data:`CONFIDENCE`), however many looks it took.
- Same kernels. Each session writes the graph onnxruntime runs at that level (``optimized_model_filepath``). When
  both graphs hold the same multiset of kernels (:func:`kernels`: nodes by domain, op type and input count; names,
  order and weights aside), onnxruntime runs the same kernels for both files: the verdict is ``same``,
  rounds stop at the minimum, and the measured interval only shows the noise of timing two sessions.
"""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from onnxfuse.ort.levels import ORT_LEVELS

if TYPE_CHECKING:
    from onnxfuse.ort.sessions import InputSpec, TimeBound

#: Family-wise confidence of the verdict: over all the looks of :func:`measure`, a model exactly as fast as the
#: original is called faster or slower with probability at most 1 - this (Bonferroni over the looks).
CONFIDENCE = 0.999
#: Rounds stop here even when the time budget is not spent.
MAX_ROUNDS = 1000
VERDICTS = ("faster", "slower", "same", "inconclusive")


#: Default of :attr:`BenchOptions.timeout` (``bench --timeout``), seconds: 10 minutes for the whole bench. The
#: timed rounds of one level stop after ``max_time`` (20 s) once ``runs`` are done; this bounds the rest (a model
#: whose one run takes minutes, ``runs`` 16 x 4 runs of it per level).
DEFAULT_TIMEOUT_S = 600.0


@dataclass
class BenchOptions:
    """How to benchmark.

    Attributes:
        runs: paired rounds per level at least (each round runs original, optimized, optimized, original); an
            interval needs 14 or more (:func:`order_ranks` at :func:`look_confidence`).
        max_time: seconds of timed rounds per level after which no further round starts once ``runs`` are done.
        margin: equivalence margin of the verdict, a fraction (0.02: ratios within 2% of 1 are the same).
        warmup: untimed runs per session before timing.
        threads: onnxruntime intra-op threads (1 gives the steadiest numbers).
        levels: graph optimization levels, from :data:`onnxfuse.ort.levels.ORT_LEVELS`.
        input_shapes: graph input name -> dims for symbolic dims.
        input_data: optional ``.npz`` of real inputs.
        input_values / input_ranges: fill values and ranges per input (:class:`onnxfuse.ort.sessions.InputSpec`).
        profile: also run both models with onnxruntime's profiler (``onnxfuse.ort.profile``) at each level and
            report per kernel, per op and per fusion.
        profile_runs: profiled runs per model and level (their median time per kernel).
        fusions: level -> the ``fusions[]`` rows of the report of the model optimized for that level (None when
            OPTIMIZED was given): the profile's per-fusion rows follow them.
        timeout: seconds for every run of the bench together (first runs, warm-up, timed rounds, profiles, at
            every level; ``bench --timeout``, :data:`DEFAULT_TIMEOUT_S`); None: no limit. A run in progress is
            stopped when it runs out (``onnxfuse.ort.sessions.TimeBound``); session loads are not interrupted.
    """

    runs: int = 16
    max_time: float = 20.0
    margin: float = 0.02
    warmup: int = 3
    threads: int = 1
    levels: tuple[str, ...] = ORT_LEVELS
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    input_data: str | None = None
    input_values: dict[str, float] = field(default_factory=dict)
    input_ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    profile: bool = False
    profile_runs: int = 10
    fusions: dict[str, list[dict]] | None = None
    timeout: float | None = DEFAULT_TIMEOUT_S


def order_ranks(n: int, confidence: float = CONFIDENCE) -> int | None:
    """The rank k (1-based) of the distribution-free confidence interval ``[r_(k), r_(n+1-k)]`` of the median of
    ``n`` sorted values r (the sign test's interval): the largest k with P(Binomial(n, 1/2) <= k - 1) <=
    (1 - confidence) / 2. It covers the true median with probability >= ``confidence`` whatever the distribution
    of independent draws: r_(k) lies above the median only when at most k - 1 draws fall below it, each doing so
    with probability 1/2 (and symmetrically for r_(n+1-k)). None when ``n`` is too small for any k (at 99%:
    n < 8). Exact integer arithmetic: any n."""
    tail = Fraction(1 - confidence) / 2 * 2 ** n
    total, comb, k = 0, 1, 0  # comb = C(n, k)
    while k < n and total + comb <= tail:
        total += comb
        comb = comb * (n - k) // (k + 1)
        k += 1
    return k or None


def compare(original_s, optimized_s, margin: float = 0.02, confidence: float = CONFIDENCE) -> dict[str, Any]:
    """The ratio, its interval and the verdict from paired per-round times.

    Args:
        original_s, optimized_s: per-round times in seconds, 1-D, equal length, positive; element i of both comes
            from round i.
        margin: equivalence margin, a fraction of 1.
        confidence: of the interval (:func:`measure` passes :func:`look_confidence`).

    Returns:
        ``ratio``: the median of the per-round ratios optimized / original (the geometric mean of the two middle
        ones for an even count); ``ci_low`` / ``ci_high``: its ``confidence`` interval from
        :func:`order_ranks` (both the smallest and largest ratio when there are too few rounds for one);
        ``original_ms``: the median of the original's per-round times in milliseconds; ``optimized_ms``:
        ``original_ms * ratio``, the optimized model's time the paired rounds give (so the two columns and the
        ratio agree exactly); ``optimized_median_ms``: the median of the optimized model's own per-round times;
        ``rounds``; ``verdict``, one of :data:`VERDICTS` (``inconclusive`` when there are too few rounds).

    Raises:
        ValueError: the arrays are empty, differ in length, or hold a time that is not positive.
    """
    a, b = np.asarray(original_s, dtype=np.float64), np.asarray(optimized_s, dtype=np.float64)
    if a.ndim != 1 or a.shape != b.shape or a.size == 0 or not (np.all(a > 0) and np.all(b > 0)):
        raise ValueError("compare needs two equal-length, non-empty 1-D arrays of positive times")
    n = a.size
    logs = np.sort(np.log(b) - np.log(a))
    ratio = float(np.exp((logs[(n - 1) // 2] + logs[n // 2]) / 2))
    k = order_ranks(n, confidence)
    lo, hi = (float(np.exp(logs[(k or 1) - 1])), float(np.exp(logs[n - (k or 1)])))
    if k is None:
        verdict = "inconclusive"
    elif hi < 1 - margin:
        verdict = "faster"
    elif lo > 1 + margin:
        verdict = "slower"
    elif lo >= 1 - margin and hi <= 1 + margin:
        verdict = "same"
    else:
        verdict = "inconclusive"
    original_ms = float(np.median(a) * 1e3)
    return {"ratio": ratio, "ci_low": lo, "ci_high": hi, "confidence": confidence, "verdict": verdict, "rounds": int(n),
            "original_ms": original_ms, "optimized_ms": original_ms * ratio,
            "optimized_median_ms": float(np.median(b) * 1e3)}


class BenchTimeout(RuntimeError):
    """The bench did not finish within :attr:`BenchOptions.timeout` seconds (the message says so)."""


def measure(run_a: Callable[[], Any], run_b: Callable[[], Any], min_rounds: int, max_time: float,
            margin: float = 0.02, *, stop_at_min: bool = False, clock: Callable[[], float] = time.perf_counter,
            max_rounds: int = MAX_ROUNDS) -> dict[str, Any]:
    """Time ``run_a`` (the original) against ``run_b`` (the optimized model) in ABBA rounds until the verdict is
    decided, ``max_time`` seconds of rounds are spent or ``max_rounds`` are done, never fewer than ``min_rounds``.

    Args:
        run_a, run_b: one inference each; their return values are ignored.
        min_rounds: rounds always run (at least 1).
        max_time: seconds, by ``clock``, from the first timed run after which no further round starts once
            ``min_rounds`` are done.
        stop_at_min: stop at ``min_rounds`` whatever the interval (the verdict is known otherwise: same kernels).
        clock: seconds, monotonic (tests pass a fake one that the fake runs advance).

    Returns:
        :func:`compare`'s dict plus ``stopped``: ``decided``, ``budget``, ``max_rounds`` or ``min_rounds``.
    """
    def timed(run: Callable[[], Any]) -> float:
        start = clock()
        run()
        return clock() - start

    min_rounds, max_rounds = max(1, min_rounds), max(1, min_rounds, max_rounds)
    confidence = look_confidence(min_rounds, max_rounds)
    t_a: list[float] = []
    t_b: list[float] = []
    start = clock()
    next_look = min_rounds
    while True:
        a1, b1, b2, a2 = timed(run_a), timed(run_b), timed(run_b), timed(run_a)
        t_a.append((a1 + a2) / 2)
        t_b.append((b1 + b2) / 2)
        n = len(t_a)
        if n < min_rounds:
            continue
        if stop_at_min:
            return {**compare(t_a, t_b, margin, confidence), "stopped": "min_rounds"}
        over = clock() - start >= max_time
        if n >= next_look or over or n >= max_rounds:
            result = compare(t_a, t_b, margin, confidence)
            if result["verdict"] != "inconclusive":
                return {**result, "stopped": "decided"}
            if over or n >= max_rounds:
                return {**result, "stopped": "budget" if over else "max_rounds"}
            next_look = 2 * n


def look_confidence(min_rounds: int, max_rounds: int = MAX_ROUNDS, family: float = CONFIDENCE) -> float:
    """The confidence of each interval :func:`measure` computes: ``1 - (1 - family) / L``, L the most looks it can
    take (at ``min_rounds``, each doubling up to ``max_rounds``, and one where the budget ends), so that all its
    looks together call a difference that is not there with probability at most ``1 - family``."""
    looks, n = 1, max(1, min_rounds)
    while 2 * n < max_rounds:
        looks, n = looks + 1, 2 * n
    return 1 - (1 - family) / (looks + 1)


#: A kernel as :func:`kernels` counts it: (domain, op type, number of non-empty inputs).
Kernel = tuple[str, str, int]


def kernels(path: str) -> Counter[Kernel]:
    """The multiset of nodes of an ONNX file, each as (domain, op type, number of non-empty inputs): the kernels
    onnxruntime runs for that graph, names, order and weights aside.

    Attributes are not compared: onnxruntime's own fusions spell out defaults (``auto_pad="NOTSET"``,
    ``group=1`` on the FusedConv it writes) that onnxfuse leaves implicit, and two graphs that compute the same
    function (what onnxfuse's verification checks) with the same op types differ at most in such spelling.
    """
    model = onnx.load(path, load_external_data=False)
    return Counter((n.domain or "ai.onnx", n.op_type, sum(1 for i in n.input if i)) for n in model.graph.node)


def invented_inputs(sess, input_shapes: dict[str, tuple[int, ...]], given: dict | None) -> list[str]:
    """Inputs of ``sess`` with a dim that is not a number, that neither ``input_shapes`` nor ``given`` sets
    (directly or through a named dim they fix): their sizes are onnxfuse's defaults, not the model's real ones."""
    from onnxfuse.model.proto import is_placeholder_dim

    given = given or {}
    bound: set[str] = set()
    for inp in sess.get_inputs():
        dims = input_shapes.get(inp.name) or (given[inp.name].shape if inp.name in given else None)
        if dims is not None:
            bound.update(d for d in inp.shape if isinstance(d, str) and not is_placeholder_dim(d))
    return [inp.name for inp in sess.get_inputs()
            if inp.name not in input_shapes and inp.name not in given
            and any(not (isinstance(d, int) and d > 0) and d not in bound for d in inp.shape)]


def bench(original: str, optimized: str | dict[str, str], opts: BenchOptions) -> dict[str, Any]:
    """Time the original model against the optimized one at each level of ``opts.levels`` (method: the module
    docstring).

    ``optimized`` is one model file, or a dict level -> file (a model optimized for each level's session).

    Returns a JSON-ready dict: ``original``, ``threads``, ``runs`` (minimum rounds), ``max_time_s``, ``margin``
    (a fraction), ``confidence`` (family-wise, :data:`CONFIDENCE`), ``warmup``, ``input_shapes`` (name -> the dims
    fed), ``invented_shapes`` (inputs whose symbolic dims got default sizes, see :func:`invented_inputs`) and
    ``levels``, a list of ``{"level", "original": {...}, "optimized": {...}, "ratio", "ci_low", "ci_high",
    "ci_confidence", "rounds", "stopped", "verdict", "interval_verdict", "same_kernels", "kernels"}``. Each side
    has ``ms`` (the columns of :func:`compare`: ``optimized.ms == original.ms * ratio``), ``session_ms``
    (session creation time) and ``nodes_after_ort`` (node count of the graph onnxruntime runs at that level,
    None when onnxruntime wrote none); the optimized side also ``median_ms`` (the median of its own per-round
    times). ``ci_confidence`` is the confidence of that one interval, ``stopped`` as in :func:`measure`,
    ``interval_verdict`` :func:`compare`'s verdict; ``verdict`` is ``same`` when ``same_kernels``, else
    ``interval_verdict``; ``kernels`` is the node count when the kernels are the same, else None.

    Raises:
        BenchTimeout: ``opts.timeout`` ran out.
        RuntimeError: onnxruntime cannot load or run one of the models (the message says which).
    """
    from onnxfuse.ort.sessions import RunTimeout, TimeBound

    try:
        with TimeBound(opts.timeout) as bound:
            return _bench(original, optimized, opts, bound)
    except RunTimeout:
        raise BenchTimeout(f"the bench did not finish within {opts.timeout:g} s (--timeout SECONDS, 0: no limit); "
                           "nothing was measured") from None


def _bench(original: str, optimized: str | dict[str, str], opts: BenchOptions, bound: TimeBound) -> dict[str, Any]:
    """:func:`bench`'s work, every run through ``bound``."""
    from onnxfuse.ort.sessions import InputSpec, check_names, load_npz, make_inputs, session

    spec = InputSpec(shapes=dict(opts.input_shapes), data=load_npz(opts.input_data) if opts.input_data else {},
                     values=dict(opts.input_values), ranges=dict(opts.input_ranges))
    per_level = optimized if isinstance(optimized, dict) else dict.fromkeys(opts.levels, optimized)
    results = []
    profiles: dict[str, dict] = {}
    feeds, invented = None, []
    with tempfile.TemporaryDirectory(prefix="onnxfuse-bench-") as tmp:
        for path in {original, *per_level.values()}:  # onnxruntime's one-time set-up must not count as session time
            try:
                session(path, "disable", opts.threads)
            except Exception:
                pass
        for level in opts.levels:
            models = {"original": original, "optimized": per_level[level]}
            sessions, sides, graphs = _load_sessions(models, level, opts.threads, Path(tmp))
            if feeds is None:
                check_names(sessions["original"], spec)
                try:
                    feeds = make_inputs(sessions["original"], spec, seed=0)
                except ValueError as exc:  # an input type onnxfuse cannot generate (optional, sequence)
                    raise RuntimeError(f"{exc}; give it with --input-data") from None
                invented = invented_inputs(sessions["original"], spec.shapes, spec.data)
            _first_runs(sessions, feeds, spec, opts.warmup, bound)
            same = graphs["original"] is not None and graphs["original"] == graphs["optimized"]
            m = measure(partial(bound.run, sessions["original"], feeds),
                        partial(bound.run, sessions["optimized"], feeds),
                        opts.runs, opts.max_time, opts.margin, stop_at_min=same)
            sides["original"]["ms"], sides["optimized"]["ms"] = m["original_ms"], m["optimized_ms"]
            sides["optimized"]["median_ms"] = m["optimized_median_ms"]
            if opts.profile:
                profiles[level] = _profile(models, feeds, level, opts, bound)
            results.append({"level": level, **sides, "ratio": m["ratio"], "ci_low": m["ci_low"],
                            "ci_high": m["ci_high"], "ci_confidence": m["confidence"], "rounds": m["rounds"],
                            "stopped": m["stopped"], "interval_verdict": m["verdict"],
                            "verdict": "same" if same else m["verdict"], "same_kernels": same,
                            "kernels": sides["original"]["nodes_after_ort"] if same else None,
                            **({"profile": profiles[level]} if level in profiles else {})})
    return {"original": original, "threads": opts.threads, "runs": opts.runs, "max_time_s": opts.max_time,
            "margin": opts.margin, "confidence": CONFIDENCE, "warmup": opts.warmup,
            "input_shapes": {k: list(v.shape) for k, v in (feeds or {}).items()}, "invented_shapes": invented,
            "levels": results}


def _load_sessions(models: dict[str, str], level: str, threads: int, tmp: Path
                   ) -> tuple[dict[str, Any], dict[str, dict[str, Any]], dict[str, Counter[Kernel] | None]]:
    """An onnxruntime session per side of ``models`` (side -> file) at ``level``, each writing the graph it runs
    into ``tmp``: the sessions, each side's ``session_ms`` and ``nodes_after_ort``, and its kernels
    (:func:`kernels`; None when onnxruntime wrote no graph).

    Raises:
        RuntimeError: onnxruntime cannot load a model (the message says which).
    """
    from onnxfuse.ort.sessions import session, short

    sessions: dict[str, Any] = {}
    sides: dict[str, dict[str, Any]] = {}
    graphs: dict[str, Counter[Kernel] | None] = {}
    for key, path in models.items():
        saved = str(tmp / f"{key}.{level}.onnx")
        start = time.perf_counter()
        try:
            sessions[key] = session(path, level, threads, saved)
        except Exception as exc:
            raise RuntimeError(f"onnxruntime cannot load the {key} model at level {level}: "
                               f"{short(exc)}") from None
        graph = graphs[key] = kernels(saved) if Path(saved).exists() else None
        sides[key] = {"session_ms": (time.perf_counter() - start) * 1e3,
                      "nodes_after_ort": None if graph is None else graph.total()}
    return sessions, sides, graphs


def _first_runs(sessions: dict[str, Any], feeds: dict[str, Any], spec: InputSpec, warmup: int,
                bound: TimeBound) -> None:
    """Run each session once (a run that fails says why, before any timing), then ``warmup`` untimed runs.

    Raises:
        RuntimeError: onnxruntime cannot run a model on ``feeds`` (the message says which, and the shapes fed).
    """
    from onnxfuse.ort.sessions import RunTimeout, random_inputs_hint, short

    for key, sess in sessions.items():
        try:
            bound.run(sess, feeds)  # a first run that fails says why, before any timing
        except RunTimeout:
            raise
        except Exception as exc:
            shapes = {k: list(v.shape) for k, v in feeds.items()}
            raise RuntimeError(f"onnxruntime cannot run the {key} model on inputs {shapes}: "
                               f"{short(exc)}{random_inputs_hint(sess, spec)}") from None
        for _ in range(warmup):
            bound.run(sess, feeds)


def _profile(models: dict[str, str], feeds: dict, level: str, opts: BenchOptions, bound: TimeBound
             ) -> dict[str, Any]:
    """Both models under onnxruntime's profiler at ``level`` (``ort_profile.profile``): per side ``kernels``
    (every kernel: ms, bytes), ``by_op``, totals; ``by_fusion`` when the fusions are known."""
    from onnxfuse.ort import profile as ort_profile
    from onnxfuse.ort.sessions import RunTimeout

    out: dict[str, Any] = {"runs": opts.profile_runs}
    measured = {}
    for key, path in models.items():
        try:
            kernels_ = ort_profile.profile(path, feeds, level=level, threads=opts.threads, runs=opts.profile_runs,
                                           warmup=1, deadline=bound.deadline)
        except ort_profile.ProfileTimeout:
            raise RunTimeout("the profile ran out of time") from None
        measured[key] = kernels_
        out[key] = {"kernels": [k.to_dict() for k in kernels_], "by_op": ort_profile.by_op(kernels_),
                    "total_ms": sum(k.ms for k in kernels_), "total_bytes": sum(k.total_bytes for k in kernels_)}
    if opts.fusions is not None and level in opts.fusions:
        out["by_fusion"] = ort_profile.by_fusion(measured["optimized"], opts.fusions[level])
    return out


def profile_text(result: dict[str, Any], top: int = 12) -> str:
    """The ``--profile`` tables: per level, the kernels' total time and bytes of both models, then per op (the
    ``top`` slowest of the original) and per fusion (the ``top`` slowest), side by side."""
    import io

    from rich import box
    from rich.console import Console
    from rich.table import Table

    from onnxfuse.report import escape
    from onnxfuse.report.present import human_bytes

    buf = io.StringIO()
    console = Console(file=buf, width=120, color_system=None, highlight=False, markup=False, emoji=False)
    for r in result["levels"]:
        prof = r.get("profile")
        if not prof:
            continue
        o, p = prof["original"], prof["optimized"]
        console.print(f"profile at level {r['level']} (onnxruntime's profiler, median of {prof['runs']} runs): "
                      f"original {len(o['kernels'])} kernels, {o['total_ms']:.3f} ms, "
                      f"{human_bytes(o['total_bytes'])} read+written; optimized {len(p['kernels'])} kernels, "
                      f"{p['total_ms']:.3f} ms, {human_bytes(p['total_bytes'])}")
        table = Table(box=box.SIMPLE, title=f"per op at {r['level']} (original / optimized)", title_justify="left")
        for col in ("op", "kernels", "ms", "bytes"):
            table.add_column(col, justify="left" if col == "op" else "right")
        for op in list(dict.fromkeys([*o["by_op"], *p["by_op"]]))[:top]:
            a, b = o["by_op"].get(op), p["by_op"].get(op)

            def cell(row, key, fmt):
                return "-" if row is None else fmt(row[key])

            def total(row):
                return row["output_bytes"] + row["activation_bytes"] + row["parameter_bytes"]

            table.add_row(escape.text(op), f"{cell(a, 'kernels', str)} / {cell(b, 'kernels', str)}",
                          f"{cell(a, 'ms', lambda v: f'{v:.3f}')} / {cell(b, 'ms', lambda v: f'{v:.3f}')}",
                          f"{'-' if a is None else human_bytes(total(a))} / "
                          f"{'-' if b is None else human_bytes(total(b))}")
        console.print(table)
        rows = sorted((f for f in prof.get("by_fusion", []) if f["ms"] is not None), key=lambda f: -f["ms"])
        if rows:
            table = Table(box=box.SIMPLE, title=f"per fusion at {r['level']}: the kernel that computes it",
                          title_justify="left")
            for col in ("node", "replaced", "kernel", "ms", "bytes measured", "saved (counted)"):
                table.add_column(col, justify="left" if col in ("node", "replaced", "kernel") else "right")
            for f in rows[:top]:
                table.add_row(escape.text(f["node"]), f["replaced"], escape.text(f"{f['kernel']} ({f['kernel_op']})"),
                              f"{f['ms']:.3f}", human_bytes(f["total_bytes"]), human_bytes(f["counted_saved_bytes"]))
            console.print(table)
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n"


def to_text(result: dict[str, Any]) -> str:
    """A table of the result (rich, no colour codes) with a plain verdict per level."""
    import io

    from rich import box
    from rich.console import Console
    from rich.table import Table

    from onnxfuse.report import escape

    buf = io.StringIO()
    console = Console(file=buf, width=120, color_system=None, highlight=False, markup=False, emoji=False)
    margin = result["margin"] * 100
    table = Table(title=f"onnxruntime CPU latency, {result['threads']} intra-op thread(s), paired rounds of "
                        "original, optimized, optimized, original; ratio = optimized ms / original ms",
                  box=box.SIMPLE, title_justify="left")
    for col in ("level", "original ms", "optimized ms", "ratio", "interval", "rounds", "verdict", "session ms",
                "nodes run"):
        table.add_column(col, justify="left" if col in ("level", "verdict") else "right")
    for r in result["levels"]:
        o, p = r["original"], r["optimized"]
        verdict = "same kernels" if r["same_kernels"] else r["verdict"]
        table.add_row(r["level"], f"{o['ms']:.3f}", f"{p['ms']:.3f}", f"{r['ratio']:.3f}",
                      f"{r['ci_low']:.3f}-{r['ci_high']:.3f}", str(r["rounds"]), verdict,
                      f"{o['session_ms']:.0f} / {p['session_ms']:.0f}",
                      f"{o['nodes_after_ort']} / {p['nodes_after_ort']}")
    shapes = ", ".join(f"{escape.text(k)}={'x'.join(str(d) for d in v) or 'scalar'}"
                       for k, v in result["input_shapes"].items())
    invented = ", ".join(escape.text(k) for k in result["invented_shapes"])
    console.print(f"input shapes: {shapes}" + (f" (invented for {invented}: give "
                                                "--input-shape)" if result["invented_shapes"] else ""))
    console.print(table)
    for r in result["levels"]:
        if r["same_kernels"]:
            console.print(f"{r['level']}: onnxruntime runs the same {r['kernels']} kernels for both files; the "
                          f"interval {r['ci_low']:.3f}-{r['ci_high']:.3f} is timing noise")
    console.print(f"ratio: median of optimized / original per round; original ms: median per round; optimized "
                  f"ms: original ms x ratio. interval: distribution-free (sign test), wide enough that all looks "
                  f"together call a difference that is not there with probability <= "
                  f"{1 - result['confidence']:.1%}. verdict: same when the interval lies within 1 +-{margin:g}%, "
                  f"faster / slower when it lies wholly beyond, else inconclusive (more rounds: --runs, "
                  f"--max-time). session ms: session creation, original / optimized; nodes run: nodes in the graph "
                  f"onnxruntime runs at that level, original / optimized")
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n"


#: ``report --profile``'s paired timing: the rounds and seconds of :func:`measure` at the report's one level
#: (fewer than ``onnxfuse bench``'s defaults, 16 rounds and 20 s: a report also analyses; the verdict says
#: ``inconclusive`` where they do not suffice, as bench does).
PROFILE_ROUNDS, PROFILE_MAX_TIME_S = 16, 10.0


def report_profile(original: str | bytes, optimized: onnx.ModelProto, fusions: list[dict], level: str,
                   input_shapes: dict[str, tuple[int, ...]], threads: int = 1, runs: int = PROFILE_ROUNDS,
                   max_time: float = PROFILE_MAX_TIME_S, margin: float = 0.02,
                   timeout: float | None = None) -> dict[str, Any]:
    """The report's ``profile`` section (``onnxfuse report --profile``, ``onnxfuse.profile``): the original (a path
    or serialized bytes) and ``optimized`` under onnxruntime's profiler at ``level``
    (``onnxfuse.ort.profile.profile_models``: per op, per fusion and the bytes it records), plus ``timing``: the
    latency of the two models from :func:`bench`'s paired ABBA rounds at that level (``ratio`` optimized /
    original, its distribution-free interval ``ci_low`` / ``ci_high`` at ``ci_confidence``, ``verdict`` as bench's,
    ``inconclusive`` when the rounds do not decide, ``same`` when onnxruntime runs the same kernels for both,
    ``original_ms`` / ``optimized_ms`` as bench's columns, ``rounds``, ``stopped``, ``margin``). The profiler's
    own per-kernel sums are no latency (one run each, profiling on) and carry no interval: the figure to quote
    is ``timing``'s. Both at the same inputs: ``input_shapes``, symbolic dims at the representative sizes.
    ``timeout``: seconds for the profiler's runs (``profile_models``; None: no limit).

    Raises:
        RuntimeError: onnxruntime cannot load or run one of the models (the message says which).
        onnxfuse.ort.profile.ProfileTimeout: the profiler's runs did not end within ``timeout``.
        whatever onnxruntime's profiler raises for a model it cannot run (the caller reports it).
    """
    from onnxfuse.ort import profile as ort_profile
    from onnxfuse.ort import sessions as runtime

    out = ort_profile.profile_models(original, optimized, fusions, level, input_shapes, threads=threads,
                                     timeout=timeout)
    with runtime.loadable(optimized, as_file=True) as source:
        timed = bench(original, dict.fromkeys((level,), source),  # type: ignore[arg-type]
                      BenchOptions(runs=runs, max_time=max_time, margin=margin, threads=threads, levels=(level,),
                                   input_shapes=dict(input_shapes)))
    [lv] = timed["levels"]
    out["timing"] = {"original_ms": lv["original"]["ms"], "optimized_ms": lv["optimized"]["ms"],
                     "ratio": lv["ratio"], "ci_low": lv["ci_low"], "ci_high": lv["ci_high"],
                     "ci_confidence": lv["ci_confidence"], "rounds": lv["rounds"], "stopped": lv["stopped"],
                     "verdict": lv["verdict"], "same_kernels": lv["same_kernels"], "margin": margin}
    return out
