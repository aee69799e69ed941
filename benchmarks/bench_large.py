#!/usr/bin/env python3
"""Time ``onnxfuse optimize IN OUT --no-verify`` on a large model, each run a fresh process, and report its wall
time, CPU time (user + system, from ``os.wait4``) and peak RSS (``ru_maxrss``); with ``--src DIR`` more than once,
the checkouts' runs are interleaved round by round (same load for each). The output and its data file are removed
after every run, so that at most one output is on disk at a time.

Examples (from the repository root; the models are made by make_large.py and make_resnet.py)::

    python benchmarks/bench_large.py benchmarks/out/large.onnx --rounds 1
    python benchmarks/bench_large.py benchmarks/out/resnet_big.onnx --src . --src ../main --rounds 1

Prints one line per run and a JSON list at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def run_once(src: Path, model: Path, out: Path, extra: list[str]) -> dict:
    """One run of the onnxfuse checkout at ``src`` in a fresh process: its figures (seconds, bytes)."""
    env = dict(os.environ, PYTHONPATH=str(src.resolve()))
    cmd = [sys.executable, "-m", "onnxfuse", "optimize", str(model), str(out), "--no-verify", "-q", *extra]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=src, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    written = [p for p in out.parent.iterdir() if p.name == out.name or p.name.startswith(out.name + ".")]
    row = {"src": str(src), "model": model.name, "exit": os.waitstatus_to_exitcode(status), "wall_s": round(wall, 2),
           "cpu_s": round(usage.ru_utime + usage.ru_stime, 2), "user_s": round(usage.ru_utime, 2),
           "sys_s": round(usage.ru_stime, 2), "max_rss_mib": usage.ru_maxrss // 1024,
           "out_bytes": sum(p.stat().st_size for p in written),
           "out_disk_bytes": sum(p.stat().st_blocks * 512 for p in written), "load_1min": os.getloadavg()[0]}
    if row["exit"]:
        row["error"] = err.strip().splitlines()[-1:] or ""
    for p in written:
        p.unlink()
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("--src", type=Path, action="append", help="onnxfuse checkout to run (repeatable; default .)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", type=Path, help="output path (default: MODEL's folder, <stem>.bench.onnx)")
    args, extra = ap.parse_known_args(argv)
    model = args.model.resolve()
    out = (args.out or model.with_name(model.stem + ".bench.onnx")).resolve()
    rows = []
    for _ in range(args.rounds):
        for src in args.src or [Path(".")]:
            row = run_once(src, model, out, extra)
            print(row, file=sys.stderr)
            rows.append(row)
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
