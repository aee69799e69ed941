#!/usr/bin/env python3
"""Profile one ``onnxfuse optimize`` run with py-spy and print where the time went.

py-spy samples the process from outside (no tracing hooks), so tight Python loops are not slowed down the way a
setprofile-based profiler slows them, and the percentages match the unprofiled wall time. The summary lists the
functions with the largest inclusive share (time with the function anywhere on the stack) and the largest self
share (time in the function's own code, the innermost frame).

    python benchmarks/profile_onnxfuse.py MODEL.onnx [onnxfuse optimize options ...] [--top 25] [--rate 500]
    python benchmarks/profile_onnxfuse.py benchmarks/out/resnet400.onnx --no-verify

Needs py-spy (benchmarks/requirements.txt) and permission to ptrace the child (root, or ptrace_scope 0).
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

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
    ap.add_argument("--hide", default=r"^_run_|^<module> \(onnxfuse/__main__|\(click/|\(<frozen ",
                    help="regex of frames left out of the inclusive list (default: runpy, click, importlib)")
    args, rest = ap.parse_known_args(argv)
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
