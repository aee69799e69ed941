#!/usr/bin/env python3
"""The verified command at scale (issue 35, item 4): ``onnxfuse optimize`` by default (verified, with the
comparison with onnxruntime's graphs) against ``--no-verify`` on the same models, with and without another process
loading the CPU, and the verdict of every verified run (the same in every run: the budget is counted in CPU
seconds, ``--verify-budget``, not wall time).

Every command is its own process (as ``bench_scale.measure``: wall time, CPU time user + system, max RSS from the
child's rusage). Runs are interleaved (run 1 of both commands, then run 2, ...); with ``--load`` each round runs
once idle and once beside ``--loaders`` processes ``python -c 'while 1: pass'``, started by this script before
the loaded half of the round and killed after it (never left running). ``--root`` runs another checkout's
onnxfuse (main, to compare). The table gives medians per (model, command, load) and the
verdicts seen (status and cause of ``verification`` and ``onnxruntime`` in the ``--report`` JSON).

    python benchmarks/make_resnet.py --blocks 400 -o benchmarks/out/r400.onnx      # from the repository root
    python benchmarks/make_resnet.py --blocks 1600 -o benchmarks/out/r1600.onnx
    python benchmarks/bench_verify_scale.py benchmarks/out/r400.onnx benchmarks/out/r1600.onnx --runs 3 --load
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

LOADER = "while 1: pass"


def measure(argv: list[str], root: Path) -> dict[str, float]:
    """Wall seconds, CPU seconds (user + system) and max RSS in MiB of one process running ``argv`` in ``root``
    (the checkout whose onnxfuse runs: ``python -m`` imports it from there), as ``bench_scale.measure``.

    Raises:
        RuntimeError: the process exited non-zero.
    """
    env = {**os.environ, "PYTHONPATH": str(root)}
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=root, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}")
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "rss_mib": usage.ru_maxrss / 1024}


def commands(model: Path, out: Path, extra: list[str]) -> dict[str, list[str]]:
    fuse = [sys.executable, "-m", "onnxfuse", "optimize", str(model), str(out), "-q", *extra]
    return {"verified": [*fuse, "--report", str(out) + ".json"], "no-verify": [*fuse, "--no-verify"]}


def verdict(report: Path) -> str:
    """``status/cause`` of the report's verification and ``status`` of its onnxruntime comparison."""
    doc = json.loads(report.read_text())
    v, o = doc["verification"], doc.get("onnxruntime") or {}
    return f"{v['status']}{'/' + v['cause'] if v.get('cause') else ''}, comparison {o.get('status', '-')}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", type=Path)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--load", action="store_true", help="also run every round beside CPU-bound processes")
    ap.add_argument("--loaders", type=int, default=1, help="how many CPU-bound processes load the machine")
    ap.add_argument("--root", type=Path, default=REPO, help="the checkout whose onnxfuse runs (default: this one)")
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more options for both commands")
    ap.add_argument("--json", type=Path, help="write the raw runs here")
    args = ap.parse_args(argv)
    loads = ["idle", "loaded"] if args.load else ["idle"]
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-verify-") as tmp:
        for run in range(args.runs):
            for load in loads:
                loaders = [subprocess.Popen([sys.executable, "-c", LOADER])
                           for _ in range(args.loaders if load == "loaded" else 0)]
                try:
                    for model in args.models:
                        out = Path(tmp) / f"{model.stem}.out.onnx"
                        for name, argv_ in commands(model.resolve(), out, args.extra).items():
                            m = measure(argv_, args.root)
                            m.update(model=model.name, command=name, load=load, run=run)
                            if name == "verified":
                                m["verdict"] = verdict(Path(str(out) + ".json"))
                            rows.append(m)
                            print(json.dumps(m), file=sys.stderr, flush=True)
                finally:
                    for loader in loaders:
                        os.kill(loader.pid, signal.SIGTERM)
                        loader.wait()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    print("| model | command | load | wall s | CPU s | max RSS MiB | verdicts |")
    print("|---|---|---|---|---|---|---|")
    keys = dict.fromkeys((r["model"], r["command"], r["load"]) for r in rows)
    for model, command, load in keys:
        sel = [r for r in rows if (r["model"], r["command"], r["load"]) == (model, command, load)]
        verdicts = sorted({r.get("verdict", "-") for r in sel})
        print(f"| {model} | {command} | {load} | {statistics.median(r['wall_s'] for r in sel):.1f} | "
              f"{statistics.median(r['cpu_s'] for r in sel):.1f} | "
              f"{statistics.median(r['rss_mib'] for r in sel):.0f} | {'; '.join(verdicts)} ({len(sel)} runs) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
