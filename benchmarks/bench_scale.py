#!/usr/bin/env python3
"""How onnxfuse's time grows with the node count (issue 35): time per node of ``onnxfuse optimize`` on node-heavy
synthetic graphs (``make_transformer.py``: written-out LayerNorm and GELU, attention, Transpose-wrapped separable
Conv1d; about 58 nodes a block) of about 2k, 20k and 50k nodes, beside onnxruntime's own offline optimizer on the
same files.

The models are made by ``make_transformer.py`` in child processes, so that this script stays small (Linux starts a
child's max RSS at its parent's peak). Every command is its own process, spawned with ``os.posix_spawn`` and reaped with ``os.wait4``: wall time from
just before the spawn to just after the reap, CPU time (user + system) and max RSS from that child's rusage.
Runs are interleaved (run 1 of every command on every model, then run 2, ...) so that a noisy neighbour slows
every command alike; the table gives medians of ``--runs`` runs. "per node" is the CPU time less the start-up
(the median of the same command on a 1-block model) divided by the node count: the figure that should stay flat.

Commands
    noverify         ``onnxfuse optimize IN OUT --no-verify`` (symbolic batch: the report counts expressions)
    noverify-shapes  ``onnxfuse optimize IN OUT --no-verify --input-shape input=1x16x32 --report OUT.json``
                     (every dim given: the numeric report)
    ort-offline      an onnxruntime InferenceSession at ORT_ENABLE_EXTENDED with ``optimized_model_filepath``

    python benchmarks/bench_scale.py --runs 3                      # from the repository root
    python benchmarks/bench_scale.py --runs 1 --blocks 1 40 400    # quicker
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

ORT_OFFLINE = ("import sys, onnxruntime as ort\n"
               "so = ort.SessionOptions()\n"
               "so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED\n"
               "so.optimized_model_filepath = sys.argv[2]\n"
               "ort.InferenceSession(sys.argv[1], so, providers=['CPUExecutionProvider'])\n")


def commands(model: Path, out: Path) -> dict[str, list[str]]:
    py = sys.executable
    fuse = [py, "-m", "onnxfuse", "optimize", str(model), str(out), "--no-verify", "-q"]
    return {"noverify": fuse,
            "noverify-shapes": [*fuse, "--input-shape", "input=1x16x32", "--report", str(out) + ".json"],
            "ort-offline": [py, "-c", ORT_OFFLINE, str(model), str(out)]}


def measure(argv: list[str]) -> dict[str, float]:
    """Wall seconds, CPU seconds (user + system) and max RSS in MiB of one process running ``argv``.

    Raises:
        RuntimeError: the process exited non-zero.
    """
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.perf_counter()
    pid = os.posix_spawn(argv[0], argv, env)
    _, status, usage = os.wait4(pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {os.waitstatus_to_exitcode(status)}")
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "rss_mib": usage.ru_maxrss / 1024}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--blocks", type=int, nargs="+", default=[1, 40, 400, 900])
    ap.add_argument("--json", default=str(REPO / "benchmarks" / "results" / "bench-scale.json"))
    args = ap.parse_args(argv)
    blocks = sorted(set(args.blocks) | {1})
    work = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    models, nodes = {}, {}
    for n in blocks:  # made by a child process: a child's max RSS starts at its parent's, so keep this one small
        models[n] = work / f"tfm{n}.onnx"
        made = subprocess.run([sys.executable, str(REPO / "benchmarks" / "make_transformer.py"), "--blocks", str(n),
                               "-o", str(models[n])], check=True, capture_output=True, text=True)
        nodes[n] = int(made.stderr.split(": ")[-1].split()[0])
    results: dict[str, dict[int, list[dict]]] = {}
    for run in range(args.runs):
        for n in blocks:
            for name, cmd in commands(models[n], work / f"out{n}.onnx").items():
                results.setdefault(name, {}).setdefault(n, []).append(measure(cmd))
        print(f"run {run + 1} of {args.runs} done", file=sys.stderr)
    table = []
    for name, by_n in results.items():
        base = statistics.median(r["cpu_s"] for r in by_n[1])
        for n in blocks:
            rows = by_n[n]
            med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
            per_node = (med["cpu_s"] - base) / nodes[n] * 1e3 if n > 1 else None
            table.append({"command": name, "blocks": n, "nodes": nodes[n], **med, "cpu_ms_per_node": per_node})
    print("| command | nodes | wall s | CPU s | max RSS MiB | CPU ms per node (less start-up) |")
    print("|---|---:|---:|---:|---:|---:|")
    for row in table:
        per = "" if row["cpu_ms_per_node"] is None else f"{row['cpu_ms_per_node']:.3f}"
        print(f"| {row['command']} | {row['nodes']} | {row['wall_s']:.2f} | {row['cpu_s']:.2f} | "
              f"{row['rss_mib']:.0f} | {per} |")
    for name in results:
        pers = [r["cpu_ms_per_node"] for r in table if r["command"] == name and r["cpu_ms_per_node"]]
        if pers:
            sized = [nodes[n] for n in blocks if n > 1]
            print(f"{name}: time per node max/min = {max(pers) / min(pers):.2f}x across "
                  f"{min(sized)}-{max(sized)} nodes", file=sys.stderr)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"runs": args.runs, "load": os.getloadavg(), "rows": table}, indent=2)
                               + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
