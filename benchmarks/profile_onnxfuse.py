#!/usr/bin/env python3
"""Profile one ``onnxfuse optimize`` run with py-spy and print where the time went.

py-spy samples the process from outside (no tracing hooks), so tight Python loops are not slowed down the way a
setprofile-based profiler slows them, and the percentages match the unprofiled wall time. The summary lists the
functions with the largest inclusive share (time with the function anywhere on the stack) and the largest self
share (time in the function's own code, the innermost frame).

    python benchmarks/profile_onnxfuse.py MODEL.onnx [onnxfuse optimize options ...] [--top 25] [--rate 500]
    python benchmarks/profile_onnxfuse.py benchmarks/out/resnet400.onnx --no-verify

Needs py-spy (benchmarks/requirements.txt) and permission to ptrace the child (root, or ptrace_scope 0).

``--stages N`` instead runs the command N times, each in a fresh process, and prints the CPU time
(``time.process_time``: user + system of the process, so unlike wall time it hardly depends on what else the
machine runs) of each pipeline stage in the run with the median total (imports, load, shape inference, symbolic
shape inference, traffic, graphsurgeon import, passes, export, report, verification, save) and the median max
RSS. ``--src DIR`` runs the onnxfuse found in DIR (another checkout, or a ``git archive`` of an older commit)
instead of this one:

    python benchmarks/profile_onnxfuse.py benchmarks/out/resnet400.onnx --no-verify --stages 5
    mkdir -p benchmarks/out/old && git archive 1ca2625 | tar -x -C benchmarks/out/old
    python benchmarks/profile_onnxfuse.py benchmarks/out/resnet400.onnx --no-verify --stages 5 --src benchmarks/out/old
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# The stage timer: runs `onnxfuse optimize ARGS` in this process with each stage function wrapped, and prints the
# CPU seconds per stage as JSON on the last line. Functions missing in older code are left out.
STAGES = r"""
import functools, json, sys, time
T0 = time.process_time()
from onnxfuse.cli import main as cli
marks = {}
import importlib
def wrap(modname, name, label):
    try:
        mod = importlib.import_module(modname)
        f = getattr(mod, name)
    except (ImportError, AttributeError):
        return
    @functools.wraps(f)
    def timed(*a, **k):
        t = time.process_time()
        try:
            return f(*a, **k)
        finally:
            marks[label] = marks.get(label, 0.0) + time.process_time() - t
    setattr(mod, name, timed)
for spec in sys.argv[1].split(","):
    modname, name, label = spec.split(":")
    wrap(modname, name, label)
marks["imports"] = time.process_time() - T0  # the command imports these stage modules too (lazily)
sys.argv = ["onnxfuse", "optimize", *sys.argv[2:]]
try:
    cli.main(standalone_mode=False)
except SystemExit:
    pass
marks["total"] = time.process_time() - T0
import resource
print(json.dumps({**marks, "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""
STAGE_FUNCS = ("onnxfuse.model.io:load_model:load,onnxfuse.model.proto:skeleton:shapes,onnxfuse.analysis.shapes:infer:shapes,"
               "onnxfuse.analysis.shapes:measure:shapes,onnxfuse.analysis.traffic:node_traffic:traffic,onnxfuse.ir.convert:to_graph:import,"
               "onnxfuse.passes.driver:run_passes:passes,onnxfuse.ir.convert:to_model:export,onnxfuse.report.model:build:report,"
               "onnxfuse.verification.verify:verify_models:verification,onnxfuse.analysis.symbolic:infer:symbolic,"
               "onnxfuse.model.io:save_model:save")


def stages(model: str, rest: list[str], runs: int, src: Path) -> int:
    """Median CPU seconds per stage over ``runs`` fresh processes (see the module docstring)."""
    samples: list[dict] = []
    tmp = Path(tempfile.mkdtemp(prefix="onnxfuse-stages-"))
    env = {**os.environ, "PYTHONPATH": str(src)}
    for _ in range(runs):
        r = subprocess.run([sys.executable, "-c", STAGES, STAGE_FUNCS, str(Path(model).resolve()),
                            str(tmp / "out.onnx"), *rest], cwd=tmp, env=env, capture_output=True, text=True)
        try:
            samples.append(json.loads(r.stdout.strip().splitlines()[-1]))
        except (ValueError, IndexError):
            print(f"run failed (exit {r.returncode}): {r.stderr.strip()[-300:]}", file=sys.stderr)
            return 1
    shutil.rmtree(tmp, ignore_errors=True)
    rss = sorted(s.pop("maxrss_mib", 0.0) for s in samples)[len(samples) // 2]
    labels = list(dict.fromkeys(k for s in samples for k in s))
    median = sorted(samples, key=lambda s: s["total"])[len(samples) // 2]  # the run with the median total
    median = {k: median.get(k, 0.0) for k in labels}
    other = median["total"] - sum(v for k, v in median.items() if k != "total")
    totals = ", ".join(f"{s['total']:.2f}" for s in samples)
    print(f"CPU seconds per stage in the run with the median total of {runs} runs (totals {totals}; {src}):")
    for k in [*(k for k in labels if k != "total"), "other", "total"]:
        v = other if k == "other" else median[k]
        print(f"  {k:<13} {v:6.3f}  {100 * v / median['total']:5.1f}%")
    print(f"max RSS (median): {rss:.0f} MiB")
    return 0


FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def parse(raw: str) -> tuple[int, collections.Counter, collections.Counter]:
    """Collapsed stacks ('f1 (file:line);f2 (...) COUNT') -> total, inclusive and self sample counts by function."""
    incl: collections.Counter = collections.Counter()
    self_: collections.Counter = collections.Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        names = []
        for fr in stack.split(";"):
            m = FRAME.match(fr)
            names.append(f"{m['func']} ({m['file']})" if m else fr)
        for name in set(names):
            incl[name] += n
        self_[names[-1]] += n
    return total, incl, self_


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--rate", type=int, default=500, help="samples per second (default 500)")
    ap.add_argument("--raw", default=None, help="also keep py-spy's collapsed stacks here")
    ap.add_argument("--stages", type=int, default=0, metavar="N",
                    help="instead of py-spy: CPU time per pipeline stage (the run with the median total of N)")
    ap.add_argument("--src", default=str(REPO), help="checkout whose onnxfuse runs (default this one)")
    ap.add_argument("--hide", default=r"^_run_|^<module> \(onnxfuse/__main__|\(click/|\(<frozen ",
                    help="regex of frames left out of the inclusive list (default: runpy, click, importlib)")
    args, rest = ap.parse_known_args(argv)
    if args.stages:
        return stages(args.model, rest, args.stages, Path(args.src).resolve())
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        print("py-spy is not installed (pip install -r benchmarks/requirements.txt)", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="onnxfuse-prof-"))
    raw = Path(args.raw) if args.raw else tmp / "stacks.txt"
    cmd = [spy, "record", "-r", str(args.rate), "-f", "raw", "-o", str(raw), "--",
           sys.executable, "-m", "onnxfuse", "optimize", args.model, str(tmp / "out.onnx"), *rest]
    print("$ " + " ".join(cmd), file=sys.stderr)
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL)
    if r.returncode != 0 or not raw.exists():
        print(f"py-spy failed (exit {r.returncode})", file=sys.stderr)
        return 1
    total, incl, self_ = parse(raw.read_text())
    print(f"{total} samples at {args.rate} Hz (~{total / args.rate:.2f} s of CPU-visible wall time)")
    hide = re.compile(args.hide) if args.hide else None
    for title, counter in (("inclusive", incl), ("self", self_)):
        print(f"\ntop {args.top} by {title} time:")
        rows = [(k, v) for k, v in counter.most_common() if not (hide and title == "inclusive" and hide.search(k))]
        for name, n in rows[:args.top]:
            print(f"  {100 * n / total:5.1f}%  {name}")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
