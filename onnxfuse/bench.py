"""``onnxfuse bench``: onnxruntime inference latency of the original and the optimized model, per graph
optimization level, measured fairly on a noisy machine, with a same-run control.

Method: for each level three CPU sessions are created (creation timed): the original (A), the original again (B,
the control) and the optimized model (F). After warm-up they run in rotating order (A, B, F / B, F, A / F, A, B),
so that machine noise hits all three alike. Per round the ratios F / A and B / A are taken (the runs of one round
share the machine's state); ``ratio`` is the median of F / A, ``control`` the median of B / A. ``noise`` is the
larger of ``|control - 1|`` and the half-width of the 95% bootstrap interval of ``ratio`` (rounds resampled,
seeded). The verdict is ``faster`` when ``1 - ratio > noise``, ``slower`` when ``ratio - 1 > noise``, else
``same`` (within noise): a difference is called only beyond what timing the original against itself shows.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

LEVELS = ("disable", "basic", "extended", "all")

#: Bootstrap resamples for the interval of the ratio.
BOOTSTRAP = 1000


@dataclass
class BenchOptions:
    """How to benchmark.

    Attributes:
        runs: timed rounds per level (each round runs the original twice and the optimized model once).
        warmup: untimed runs per session before timing.
        threads: onnxruntime intra-op threads (1 gives the steadiest numbers).
        levels: graph optimization levels, from :data:`LEVELS`.
        input_shapes: graph input name -> dims for symbolic dims.
        input_data: optional ``.npz`` of real inputs.
        input_values / input_ranges: fill values and ranges per input (:class:`onnxfuse.runtime.InputSpec`).
    """

    runs: int = 20
    warmup: int = 3
    threads: int = 1
    levels: tuple[str, ...] = LEVELS
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    input_data: str | None = None
    input_values: dict[str, float] = field(default_factory=dict)
    input_ranges: dict[str, tuple[float, float]] = field(default_factory=dict)


def _stats(times_s: np.ndarray) -> dict[str, float]:
    ms = np.asarray(times_s) * 1e3
    p25, med, p75 = np.percentile(ms, [25, 50, 75])
    return {"median_ms": float(med), "p25_ms": float(p25), "p75_ms": float(p75),
            "spread": float((p75 - p25) / med) if med else 0.0}


def _node_count(path: str) -> int:
    model = onnx.load(path, load_external_data=False)
    return len(model.graph.node)


def compare(original_s: np.ndarray, control_s: np.ndarray, optimized_s: np.ndarray, seed: int = 0
            ) -> dict[str, Any]:
    """The verdict from per-round times in seconds (arrays of equal length, round i of each taken together).

    Returns ``ratio`` (median of optimized / original per round), ``control`` (median of control / original),
    ``noise`` (max of ``|control - 1|`` and the 95% bootstrap half-width of ``ratio``) and ``verdict``
    (``faster``, ``same`` or ``slower``).
    """
    f, b = np.asarray(optimized_s) / np.asarray(original_s), np.asarray(control_s) / np.asarray(original_s)
    ratio, control = float(np.median(f)), float(np.median(b))
    idx = np.random.default_rng(seed).integers(0, len(f), size=(BOOTSTRAP, len(f)))
    lo, hi = np.percentile(np.median(f[idx], axis=1), [2.5, 97.5])
    noise = max(abs(control - 1.0), float(hi - lo) / 2)
    verdict = "slower" if ratio - 1 > noise else "faster" if 1 - ratio > noise else "same"
    return {"ratio": ratio, "control": control, "noise": noise, "verdict": verdict}


def invented_inputs(sess, input_shapes: dict[str, tuple[int, ...]], given: dict | None) -> list[str]:
    """Inputs of ``sess`` with a dim that is not a number, that neither ``input_shapes`` nor ``given`` sets
    (directly or through a named dim they fix): their sizes are onnxfuse's defaults, not the model's real ones."""
    from onnxfuse.shapes import is_placeholder_dim

    given = given or {}
    bound = set()
    for inp in sess.get_inputs():
        dims = input_shapes.get(inp.name) or (given[inp.name].shape if inp.name in given else None)
        if dims is not None:
            bound.update(d for d in inp.shape if isinstance(d, str) and not is_placeholder_dim(d))
    return [inp.name for inp in sess.get_inputs()
            if inp.name not in input_shapes and inp.name not in given
            and any(not (isinstance(d, int) and d > 0) and d not in bound for d in inp.shape)]


def bench(original: str, optimized: str | dict[str, str], opts: BenchOptions) -> dict[str, Any]:
    """Time the original model against itself and against the optimized one at each level of ``opts.levels``.

    ``optimized`` is one model file, or a dict level -> file (a model optimized for each level's session).

    Returns a JSON-ready dict: ``original``, ``threads``, ``runs``, ``warmup``, ``input_shapes`` (name -> the
    dims fed), ``invented_shapes`` (inputs whose symbolic dims got default sizes, see :func:`invented_inputs`)
    and ``levels``, a list of ``{"level", "original": {...}, "control": {...}, "optimized": {...}, "ratio",
    "control_ratio", "noise", "verdict", "within_noise"}``. Each side has ``median_ms``, ``p25_ms``, ``p75_ms``,
    ``spread`` (IQR / median), ``session_ms`` (session creation time) and ``nodes_after_ort`` (node count of
    the graph onnxruntime runs at that level); ``ratio``, ``control_ratio``, ``noise`` and ``verdict`` are as
    in :func:`compare`; ``within_noise`` is ``verdict == "same"``.

    Raises:
        RuntimeError: onnxruntime cannot load or run one of the models (the message says which).
    """
    from onnxfuse.runtime import InputSpec, check_names, load_npz, make_inputs, random_inputs_hint, session, short

    spec = InputSpec(shapes=dict(opts.input_shapes), data=load_npz(opts.input_data) if opts.input_data else {},
                     values=dict(opts.input_values), ranges=dict(opts.input_ranges))
    per_level = optimized if isinstance(optimized, dict) else dict.fromkeys(opts.levels, optimized)
    results = []
    feeds, invented = None, []
    with tempfile.TemporaryDirectory(prefix="onnxfuse-bench-") as tmp:
        for path in {original, *per_level.values()}:  # onnxruntime's one-time set-up must not count as session time
            try:
                session(path, "disable", opts.threads)
            except Exception:
                pass
        for level in opts.levels:
            models = {"original": original, "control": original, "optimized": per_level[level]}
            sessions, sides = {}, {}
            for key, path in models.items():
                saved = str(Path(tmp) / f"{key}.{level}.onnx")
                start = time.perf_counter()
                try:
                    sessions[key] = session(path, level, opts.threads, saved)
                except Exception as exc:
                    raise RuntimeError(f"onnxruntime cannot load the {key} model at level {level}: "
                                       f"{short(exc)}") from None
                sides[key] = {"session_ms": (time.perf_counter() - start) * 1e3,
                              "nodes_after_ort": _node_count(saved) if Path(saved).exists() else None}
            if feeds is None:
                check_names(sessions["original"], spec)
                feeds = make_inputs(sessions["original"], spec, seed=0)
                invented = invented_inputs(sessions["original"], spec.shapes, spec.data)
            for key, sess in sessions.items():
                try:
                    sess.run(None, feeds)  # a first run that fails says why, before any timing
                except Exception as exc:
                    shapes = {k: list(v.shape) for k, v in feeds.items()}
                    raise RuntimeError(f"onnxruntime cannot run the {key} model on inputs {shapes}: "
                                       f"{short(exc)}{random_inputs_hint(sess, spec)}") from None
                for _ in range(opts.warmup):
                    sess.run(None, feeds)
            times: dict[str, list[float]] = {key: [] for key in models}
            orders = (("original", "control", "optimized"), ("control", "optimized", "original"),
                      ("optimized", "original", "control"))
            for i in range(opts.runs):
                for key in orders[i % 3]:
                    start = time.perf_counter()
                    sessions[key].run(None, feeds)
                    times[key].append(time.perf_counter() - start)
            for key in models:
                sides[key].update(_stats(np.asarray(times[key])))
            verdict = compare(*(np.asarray(times[k]) for k in ("original", "control", "optimized")))
            results.append({"level": level, **{k: sides[k] for k in models}, "ratio": verdict["ratio"],
                            "control_ratio": verdict["control"], "noise": verdict["noise"],
                            "verdict": verdict["verdict"], "within_noise": verdict["verdict"] == "same"})
    return {"original": original, "threads": opts.threads, "runs": opts.runs, "warmup": opts.warmup,
            "input_shapes": {k: list(v.shape) for k, v in (feeds or {}).items()}, "invented_shapes": invented,
            "levels": results}


def to_text(result: dict[str, Any]) -> str:
    """A table of the result (rich, no colour codes) with a plain verdict per level."""
    import io

    from rich import box
    from rich.console import Console
    from rich.table import Table

    from onnxfuse import escape

    buf = io.StringIO()
    console = Console(file=buf, width=120, color_system=None, highlight=False, markup=False, emoji=False)
    table = Table(title=f"onnxruntime CPU latency, {result['threads']} intra-op thread(s), {result['runs']} "
                        "rotating rounds of original / control (the original again) / optimized; ratio = median "
                        "of optimized / original per round", box=box.SIMPLE, title_justify="left")
    for col in ("level", "original ms", "optimized ms", "ratio", "control", "noise", "verdict", "session ms",
                "nodes run"):
        table.add_column(col, justify="left" if col in ("level", "verdict") else "right")
    for r in result["levels"]:
        o, p = r["original"], r["optimized"]
        verdict = {"same": "same within noise"}.get(r["verdict"], r["verdict"])
        table.add_row(r["level"], f"{o['median_ms']:.3f}", f"{p['median_ms']:.3f}", f"{r['ratio']:.3f}",
                      f"{r['control_ratio']:.3f}", f"±{r['noise'] * 100:.1f}%", verdict,
                      f"{o['session_ms']:.0f} / {p['session_ms']:.0f}",
                      f"{o['nodes_after_ort']} / {p['nodes_after_ort']}")
    shapes = ", ".join(f"{escape.text(k)}={'x'.join(str(d) for d in v) or 'scalar'}"
                       for k, v in result["input_shapes"].items())
    invented = ", ".join(escape.text(k) for k in result["invented_shapes"])
    console.print(f"input shapes: {shapes}" + (f" (invented for {invented}: give "
                                                "--input-shape)" if result["invented_shapes"] else ""))
    console.print(table)
    console.print("control: median of original / original per round; noise: the larger of |control - 1| and "
                  "the 95% interval of the ratio; a ratio within noise of 1 is the same. session ms: session "
                  "creation, original / optimized; nodes run: nodes in the graph onnxruntime runs at that "
                  "level, original / optimized")
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n"
