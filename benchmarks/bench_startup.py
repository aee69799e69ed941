#!/usr/bin/env python3
"""The onnxfuse command's fixed start-up cost: wall time and import time of short commands, per checkout.

For each checkout given (default: this one), each command below runs ``--runs`` times (default 5) as
``python -X importtime -m onnxfuse ARGS`` from the checkout's root (so that checkout's package is the one
imported; PYTHONPATH is set to it too). Runs are interleaved (run 1 of every command in every checkout, then
run 2, ...) so that a noisy neighbour slows every column alike, after one untimed run of each (which writes the
bytecode caches). The table gives the median and the range.

    wall     ``time.perf_counter()`` around the whole process, from spawn to exit (interpreter start-up, imports,
             the command); measured with ``-X importtime`` on, which adds a little to every import.
    imports  the sum of the cumulative times of the top-level entries in ``-X importtime``'s report: every module
             the process imported, wherever the import happened (start-up, or lazily inside a command).
    heavy    which of onnx, ml_dtypes, numpy, onnxruntime, onnx_graphsurgeon, sympy were imported.

Commands
    --version                                        answers from package metadata
    optimize --bogus                                 a usage error (exit 2)
    optimize --no-verify MODEL OUT                   the smallest real run (MODEL: sample_models/resnet_block.onnx
                                                     of the checkout, OUT in a temporary folder)

Usage (from the repository root)::

    python benchmarks/bench_startup.py                      # this checkout
    python benchmarks/bench_startup.py --checkout ../main --checkout .   # before/after, same run
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEAVY = ("onnx", "ml_dtypes", "numpy", "onnxruntime", "onnx_graphsurgeon", "sympy")


def commands(out_dir: Path) -> list[tuple[str, list[str], int]]:
    """(label, arguments, expected exit code) of each command timed."""
    return [
        ("--version", ["--version"], 0),
        ("optimize --bogus", ["optimize", "--bogus"], 2),
        ("optimize --no-verify resnet_block", ["optimize", "--no-verify", "sample_models/resnet_block.onnx",
                                               str(out_dir / "out.onnx")], 0),
    ]


def run_once(python: str, checkout: Path, args: list[str], code: int) -> tuple[float, float, set[str]]:
    """One run: (wall seconds, import seconds, the :data:`HEAVY` packages imported)."""
    env = dict(os.environ, PYTHONPATH=str(checkout))
    start = time.perf_counter()
    proc = subprocess.run([python, "-X", "importtime", "-m", "onnxfuse", *args], cwd=checkout, env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != code:
        sys.exit(f"{checkout}: onnxfuse {' '.join(args)} exited {proc.returncode}, expected {code}:\n"
                 f"{proc.stderr[-2000:]}")
    imports, heavy = 0.0, set()
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line[len("import time:"):].split("|")
        if name.strip().split(".")[0] in HEAVY:
            heavy.add(name.strip().split(".")[0])
        if not name.startswith("  "):  # top level (a nested entry is counted in its top-level one)
            imports += int(cumulative) / 1e6
    return wall, imports, heavy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", action="append", type=Path,
                        help="repository root to time (repeatable; default: this one)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--python", default=sys.executable, help="interpreter with onnxfuse's dependencies")
    opts = parser.parse_args()
    checkouts = [c.resolve() for c in (opts.checkout or [Path(__file__).resolve().parents[1]])]
    with tempfile.TemporaryDirectory(prefix="onnxfuse-bench-startup-") as tmp:
        cmds = commands(Path(tmp))
        walls = {(c, label): [] for c in checkouts for label, _, _ in cmds}
        imports = {key: [] for key in walls}
        heavy = {key: set() for key in walls}
        for _label, args, code in cmds:  # untimed: writes each checkout's bytecode caches
            for checkout in checkouts:
                run_once(opts.python, checkout, args, code)
        for _ in range(opts.runs):
            for label, args, code in cmds:
                for checkout in checkouts:
                    wall, imp, mods = run_once(opts.python, checkout, args, code)
                    walls[checkout, label].append(wall)
                    imports[checkout, label].append(imp)
                    heavy[checkout, label] |= mods
    load = os.getloadavg()
    print(f"median of {opts.runs} interleaved runs, python {sys.version.split()[0]}, load average "
          f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f} at the end, {os.cpu_count()} CPUs\n")
    print("| command | checkout | wall s (min-max) | imports s (min-max) | heavy modules imported |")
    print("|---|---|---|---|---|")
    for label, _, _ in cmds:
        for checkout in checkouts:
            w, i = walls[checkout, label], imports[checkout, label]
            print(f"| {label} | {checkout.name} | {statistics.median(w):.3f} ({min(w):.3f}-{max(w):.3f}) | "
                  f"{statistics.median(i):.3f} ({min(i):.3f}-{max(i):.3f}) | "
                  f"{', '.join(sorted(heavy[checkout, label])) or 'none'} |")


if __name__ == "__main__":
    main()
