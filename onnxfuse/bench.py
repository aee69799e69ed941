"""``onnxfuse bench``: onnxruntime inference latency of the original and the optimized model, per graph
optimization level, measured fairly on a noisy machine.

Method: for each level, both sessions are created (session creation timed), warmed up, then run alternately
(original, optimized, then optimized, original, ...) so that machine noise hits both equally. Latency is the
median of the timed runs; the spread is the interquartile range relative to the median. A ratio whose distance
from 1 is smaller than the larger of the two spreads is reported as within noise.
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


@dataclass
class BenchOptions:
    """How to benchmark.

    Attributes:
        runs: timed runs per model and level.
        warmup: untimed runs per model and level before timing.
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


def _stats(times_s: list[float]) -> dict[str, float]:
    ms = np.asarray(times_s) * 1e3
    p25, med, p75 = np.percentile(ms, [25, 50, 75])
    return {"median_ms": float(med), "p25_ms": float(p25), "p75_ms": float(p75),
            "spread": float((p75 - p25) / med) if med else 0.0}


def _node_count(path: str) -> int:
    model = onnx.load(path, load_external_data=False)
    return len(model.graph.node)


def bench(original: str, optimized: str, opts: BenchOptions) -> dict[str, Any]:
    """Time both model files at each level of ``opts.levels``.

    Returns a JSON-ready dict: ``original``, ``optimized``, ``threads``, ``runs``, ``warmup``, ``input_shapes``
    and ``levels``, a list of ``{"level", "original": {...}, "optimized": {...}, "ratio", "within_noise"}``
    where each side has ``median_ms``, ``p25_ms``, ``p75_ms``, ``spread`` (IQR / median), ``session_ms``
    (session creation time) and ``nodes_after_ort`` (node count of the graph onnxruntime runs at that level),
    and ``ratio`` = optimized median / original median.

    Raises:
        RuntimeError: onnxruntime cannot load or run one of the models (the message says which).
    """
    from onnxfuse.runtime import InputSpec, check_names, load_npz, make_inputs, random_inputs_hint, session, short

    spec = InputSpec(shapes=dict(opts.input_shapes), data=load_npz(opts.input_data) if opts.input_data else {},
                     values=dict(opts.input_values), ranges=dict(opts.input_ranges))
    models = {"original": original, "optimized": optimized}
    results = []
    with tempfile.TemporaryDirectory(prefix="onnxfuse-bench-") as tmp:
        feeds = None
        for path in models.values():  # onnxruntime's one-time initialisation must not count as session time
            try:
                session(path, "disable", opts.threads)
            except Exception:
                pass
        for level in opts.levels:
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
            times: dict[str, list[float]] = {"original": [], "optimized": []}
            for key, sess in sessions.items():
                try:
                    sess.run(None, feeds)  # a first run that fails says why, before any timing
                except Exception as exc:
                    shapes = {k: list(v.shape) for k, v in feeds.items()}
                    raise RuntimeError(f"onnxruntime cannot run the {key} model on inputs {shapes}: "
                                       f"{short(exc)}{random_inputs_hint(sess, spec)}") from None
                for _ in range(opts.warmup):
                    sess.run(None, feeds)
            for i in range(opts.runs):
                order = ("original", "optimized") if i % 2 == 0 else ("optimized", "original")
                for key in order:
                    start = time.perf_counter()
                    sessions[key].run(None, feeds)
                    times[key].append(time.perf_counter() - start)
            for key in models:
                sides[key].update(_stats(times[key]))
            ratio = sides["optimized"]["median_ms"] / sides["original"]["median_ms"]
            noise = max(sides["original"]["spread"], sides["optimized"]["spread"])
            results.append({"level": level, "original": sides["original"], "optimized": sides["optimized"],
                            "ratio": ratio, "within_noise": abs(ratio - 1.0) <= noise})
    return {"original": original, "optimized": optimized, "threads": opts.threads, "runs": opts.runs,
            "warmup": opts.warmup, "input_shapes": {k: list(v) for k, v in opts.input_shapes.items()},
            "levels": results}


def to_text(result: dict[str, Any]) -> str:
    """A table of the result (rich, no colour codes) with a plain verdict per level."""
    import io

    from rich import box
    from rich.console import Console
    from rich.table import Table

    buf = io.StringIO()
    console = Console(file=buf, width=120, color_system=None, highlight=False)
    table = Table(title=f"onnxruntime CPU latency, {result['threads']} intra-op thread(s), median of "
                        f"{result['runs']} alternating runs; ratio = optimized / original, spread = IQR / median",
                  box=box.SIMPLE, title_justify="left")
    for col in ("level", "original ms", "optimized ms", "ratio", "spread", "verdict", "session ms",
                "nodes run"):
        table.add_column(col, justify="left" if col in ("level", "verdict") else "right")
    for r in result["levels"]:
        o, p = r["original"], r["optimized"]
        verdict = "within noise" if r["within_noise"] else ("faster" if r["ratio"] < 1 else "slower")
        table.add_row(r["level"], f"{o['median_ms']:.3f}", f"{p['median_ms']:.3f}", f"{r['ratio']:.3f}",
                      f"{max(o['spread'], p['spread']) * 100:.1f}%", verdict,
                      f"{o['session_ms']:.0f} / {p['session_ms']:.0f}",
                      f"{o['nodes_after_ort']} / {p['nodes_after_ort']}")
    console.print(table)
    console.print("session ms: session creation time, original / optimized; nodes run: nodes in the graph "
                  "onnxruntime runs at that level, original / optimized")
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n"
