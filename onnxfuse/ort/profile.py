"""Measured, per kernel: onnxruntime's profiler on the original and the optimized model (``bench --profile``).

onnxruntime's profiler (``SessionOptions.enable_profiling``; ``onnxruntime/core/common/profiler.cc``) writes one
Chrome-trace JSON event per kernel run: category ``Node``, name ``<node name>_kernel_time``, ``dur`` in
microseconds, and in ``args`` the op (``op_name``), the execution provider, and the bytes the kernel handled as
onnxruntime counts them: ``output_size`` (bytes written), ``activation_size`` (bytes of non-constant inputs read)
and ``parameter_size`` (bytes of initializers read). This module runs a session with profiling on, reads those
events back and sums them per kernel (median time over the runs), per op, and per fusion of onnxfuse's report (the
kernel that computes a fusion's output tensor). These are the ground truth the counted report is checked against;
where they disagree, see docs/reference.md "What the figures are measured against".
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from collections import defaultdict
from dataclasses import asdict, dataclass

import onnx


@dataclass
class KernelTime:
    """One kernel of onnxruntime's optimized graph, measured.

    Attributes:
        node: the node's name in onnxruntime's optimized graph.
        op: its op type (``op_name``), e.g. ``Conv``, ``FusedConv``.
        provider: the execution provider that ran it.
        ms: median time per run, in milliseconds.
        runs: how many runs it was timed in.
        output_bytes / activation_bytes / parameter_bytes: bytes written, non-constant bytes read and initializer
            bytes read per run, as onnxruntime's profiler records them.
        outputs: the tensors the node writes (and, through an NCHWc ``ReorderOutput`` after it, the tensor that
            reorder writes), from onnxruntime's optimized graph; used to find the fusion a kernel computes.
    """

    node: str
    op: str
    provider: str
    ms: float
    runs: int
    output_bytes: int
    activation_bytes: int
    parameter_bytes: int
    outputs: tuple[str, ...] = ()

    @property
    def total_bytes(self) -> int:
        """Bytes read and written per run (activations, parameters, outputs)."""
        return self.output_bytes + self.activation_bytes + self.parameter_bytes

    def to_dict(self) -> dict:
        """JSON-ready form (``outputs`` as a list, ``total_bytes`` included)."""
        return {**asdict(self), "outputs": list(self.outputs), "total_bytes": self.total_bytes}


def kernel_events(trace: list[dict]) -> list[dict]:
    """The per-kernel events of a profile trace: category ``Node`` and a name ending in ``_kernel_time``."""
    return [e for e in trace if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time")]


def summarize(trace: list[dict], graph: onnx.ModelProto | None = None) -> list[KernelTime]:
    """Per-kernel records from a profile ``trace`` (the parsed JSON), in first-run order. ``graph``:
    onnxruntime's optimized graph of the same session, for each kernel's output tensors.

    Times: the median of the kernel's durations over the runs in the trace (microseconds -> ms). Bytes: from the
    kernel's last event (the same every run for fixed input shapes).
    """
    durations: dict[str, list[float]] = defaultdict(list)
    last: dict[str, dict] = {}
    for event in kernel_events(trace):
        name = event["name"][: -len("_kernel_time")]
        durations[name].append(float(event.get("dur", 0)) / 1000.0)
        last[name] = event
    outputs = _outputs_by_node(graph) if graph is not None else {}
    out = []
    for name, times in durations.items():
        args = last[name].get("args", {})
        out.append(KernelTime(node=name, op=str(args.get("op_name", "")), provider=str(args.get("provider", "")),
                              ms=statistics.median(times), runs=len(times),
                              output_bytes=_int(args.get("output_size")),
                              activation_bytes=_int(args.get("activation_size")),
                              parameter_bytes=_int(args.get("parameter_size")),
                              outputs=outputs.get(name, ())))
    return out


def _int(value) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _outputs_by_node(model: onnx.ModelProto) -> dict[str, tuple[str, ...]]:
    """Node name -> the tensors it writes, plus those of an NCHWc ``ReorderOutput`` that reads them (onnxruntime's
    NCHWc layout writes a conv's result in its own layout and reorders it back into the tensor the graph names)."""
    readers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in model.graph.node:
        for name in node.input:
            readers[name].append(node)
    out = {}
    for node in model.graph.node:
        names = list(node.output)
        for tensor in node.output:
            names += [o for r in readers.get(tensor, []) if r.op_type == "ReorderOutput" for o in r.output]
        out[node.name] = tuple(n for n in names if n)
    return out


#: Default time budget of ``report --profile`` in seconds (``--profile-timeout``): every session and run of both
#: models together. A model whose one run takes minutes would otherwise hold the report for 12 of them.
DEFAULT_PROFILE_TIMEOUT_S = 120.0


class ProfileTimeout(Exception):
    """The profile's time budget ran out (:func:`profile_models`' ``timeout``); nothing was measured."""


def _left(deadline: float | None) -> float | None:
    """Seconds left until ``deadline`` (``time.monotonic``; None: no limit).

    Raises:
        ProfileTimeout: none are left.
    """
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise ProfileTimeout("no time left")
    return left


def profile(source: str | bytes, feeds: dict, level: str = "all", threads: int | None = 1, runs: int = 10,
            warmup: int = 2, deadline: float | None = None) -> list[KernelTime]:
    """Run ``source`` (a model path or serialized bytes) ``runs`` times on ``feeds`` in onnxruntime at ``level``
    with ``threads`` intra-op threads and the profiler on, after ``warmup`` runs that are not counted (onnxruntime
    profiles every run of a session, so the warm-up runs are dropped from the trace by count); return
    :func:`summarize`. ``deadline`` (``time.monotonic()`` seconds; None: no limit): each run is stopped when it
    is reached (onnxruntime's ``RunOptions.terminate``, ``sessions.run``).

    Raises:
        ProfileTimeout: the deadline was reached.
        whatever onnxruntime raises for a model it cannot load or run.
    """
    from onnxfuse.ort import sessions as runtime

    with tempfile.TemporaryDirectory(prefix="onnxfuse-profile-") as folder:
        graph_path = os.path.join(folder, "optimized.onnx")
        sess = runtime.session(source, level=level, threads=threads, save_to=graph_path,
                               profile_prefix=os.path.join(folder, "profile"), config={
                                   "session.optimized_model_external_initializers_file_name": "weights.bin",
                                   "session.optimized_model_external_initializers_min_size_in_bytes": "0"})
        for _ in range(warmup + runs):
            try:
                runtime.run(sess, feeds, timeout=_left(deadline))
            except runtime.RunTimeout:
                raise ProfileTimeout("a run was stopped") from None
        trace_path = sess.end_profiling()
        with open(trace_path, encoding="utf-8") as fh:
            trace = json.load(fh)
        graph = onnx.load_model(graph_path, load_external_data=False)
    events = kernel_events(trace)
    per_run = len(events) // (warmup + runs) if events else 0
    return summarize(events[per_run * warmup:], graph)


def by_op(kernels: list[KernelTime]) -> dict[str, dict]:
    """op -> ``{"kernels", "ms", "output_bytes", "activation_bytes", "parameter_bytes"}`` summed over its
    kernels, largest time first."""
    rows: dict[str, dict] = {}
    for k in kernels:
        row = rows.setdefault(k.op, {"kernels": 0, "ms": 0.0, "output_bytes": 0, "activation_bytes": 0,
                                     "parameter_bytes": 0})
        row["kernels"] += 1
        row["ms"] += k.ms
        row["output_bytes"] += k.output_bytes
        row["activation_bytes"] += k.activation_bytes
        row["parameter_bytes"] += k.parameter_bytes
    return dict(sorted(rows.items(), key=lambda kv: -kv[1]["ms"]))


def by_fusion(kernels: list[KernelTime], fusions: list[dict]) -> list[dict]:
    """One row per fusion of a report (``fusions[]`` of ``Report.to_dict()``): the kernel of the optimized model
    that writes the fusion's output tensor, its measured time and bytes, and the original nodes it replaced.
    A fusion whose output no kernel writes under that name (onnxruntime renamed it) has ``kernel`` None."""
    writer: dict[str, KernelTime] = {}
    for k in kernels:  # the first kernel to write a name: a conv before the NCHWc reorder that copies its result
        for name in k.outputs:
            writer.setdefault(name, k)
    rows = []
    for f in fusions:
        w = writer.get(f["output"])
        rows.append({"node": f["node"], "op": f["op"], "activation": f["activation"],
                     "replaced": " -> ".join(r["op"] for r in f["replaced"]), "output": f["output"],
                     "kernel": None if w is None else w.node, "kernel_op": None if w is None else w.op,
                     "ms": None if w is None else w.ms, "total_bytes": None if w is None else w.total_bytes,
                     "counted_saved_bytes": f.get("saved_bytes")})
    return rows


def profile_models(original: str | bytes, optimized: onnx.ModelProto, fusions: list[dict], level: str,
                   input_shapes: dict[str, tuple[int, ...]], threads: int | None = 1, runs: int = 5,
                   timeout: float | None = DEFAULT_PROFILE_TIMEOUT_S) -> dict:
    """The report's ``profile`` section: ``original`` (a path or serialized bytes) and ``optimized`` run under
    onnxruntime's profiler at ``level`` on the same seeded inputs (``input_shapes`` where given; symbolic dims
    otherwise at ``analysis.shapes.REPRESENTATIVE_BATCH`` / ``REPRESENTATIVE_SIZE``), per side ``by_op``, ``kernels``
    (count), ``total_ms`` and ``total_bytes``, and ``by_fusion`` for the report's ``fusions`` rows. ``timeout``:
    seconds for all of it (both models' runs; None: no limit); a session's load is not interrupted, its runs are.

    Raises:
        ProfileTimeout: ``timeout`` ran out before both models were measured.
        whatever onnxruntime raises for a model it cannot load or run (the caller reports it).
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    from onnxfuse.analysis.shapes import REPRESENTATIVE_BATCH, REPRESENTATIVE_SIZE
    from onnxfuse.ort import sessions as runtime

    sess = runtime.session(original, "disable")
    feeds = runtime.make_inputs(sess, dict(input_shapes), seed=0, sizes=(REPRESENTATIVE_BATCH, REPRESENTATIVE_SIZE))
    del sess
    out: dict = {"level": level, "threads": threads, "runs": runs,
                 "input_shapes": {k: list(v.shape) for k, v in feeds.items()}}
    measured = {}
    with runtime.loadable(optimized, as_file=True) as source:
        for key, model in (("original", original), ("optimized", source)):
            kernels = profile(model, feeds, level=level, threads=threads, runs=runs, warmup=1, deadline=deadline)
            measured[key] = kernels
            out[key] = {"kernels": len(kernels), "by_op": by_op(kernels), "total_ms": sum(k.ms for k in kernels),
                        "total_bytes": sum(k.total_bytes for k in kernels)}
    out["by_fusion"] = by_fusion(measured["optimized"], fusions)
    return out
