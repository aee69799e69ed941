"""The zoo benchmark: `onnxfuse bench` (paired rounds, the median ratio and its interval) on every shared model,
every sample model and one synthetic model per rewrite of issue 31, at onnxruntime levels `all` and `extended`, with
1 intra-op thread and with all cores; --target cpu (the target whose forms the rewrites feed).

Synthetic models (built here, float32 unless named; weights seeded):

* ``prelu_uniform``: 6 x (Conv 3x3 48ch 56x56 -> PRelu with one slope value), which prelu_leaky_relu makes LeakyRelu;
* ``resize_nearest``: a decoder, 3 x (Conv 1x1 -> Relu -> Resize nearest x2 with half_pixel / round_prefer_floor), which
  resize_nearest makes asymmetric / floor;
* ``float16_block``: a float16 MobileNetV2-style chain, 6 x (Conv 1x1 -> Clip(0, 6) -> depthwise Conv 3x3 -> Clip),
  which float16_body runs in float32;
* ``hardswish_heads``: a stem and 4 heads Conv -> HardSwish whose outputs are graph outputs (onnxruntime does not
  fuse a HardSwish whose output is a graph output; FusedConv(HardSwish) is kept there);
* ``nhwc_convs``: a TensorFlow-style NHWC chain, 4 x (Transpose(NHWC->NCHW) -> Conv 3x3 32ch -> Transpose(NCHW->NHWC)
  -> Mul(s[C]) -> Add(o[C]) -> Relu, the constants on the last axis), which layout_wrapper moves before the
  Transposes (conv_affine folds them, the Transpose pairs between convs cancel);
* ``conv1d_audio``: an audio encoder's Conv1d written as Conv2d, 4 x (Unsqueeze -> Conv 1x3 64ch -> Squeeze ->
  Mul(s[C, 1]) -> Add(o[C, 1]) -> Relu) over 1x64x2000, which layout_wrapper moves before the Squeeze.

Writes a Markdown table (ratio, interval, verdict per model, level and thread count) and the geometric mean of the
ratios per level and thread count to stdout, and the raw JSON to benchmarks/results/zoo.json (model names only, no
paths). The machine should be otherwise idle: every figure is a ratio of paired rounds, but a loaded machine widens
the intervals.

    python benchmarks/bench_zoo.py [--runs 20] [--max-time 20] [--models prelu_uniform timm_efficientnet_b0]
                                   [--threads 1 16] [--levels all extended]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[1]
MODELS = Path(os.environ.get("ONNXFUSE_MODELS_DIR", REPO.parent / "shared" / "models"))
SAMPLES = REPO / "sample_models"
#: Input shapes of the shared models (../shared/models/README.md): bench_tools.py's table.
sys.path.insert(0, str(REPO / "benchmarks"))
from bench_tools import INPUT_SHAPES as SHARED_SHAPES  # noqa: E402


class _Graph:
    """A few lines per synthetic model (seeded weights)."""

    def __init__(self, dtype=np.float32):
        self.rng = np.random.default_rng(0)
        self.dtype = np.dtype(dtype)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.n = 0

    def const(self, array) -> str:
        self.n += 1
        name = f"c{self.n}"
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def op(self, op: str, inputs: list[str], **attrs) -> str:
        self.n += 1
        out = f"{op.lower()}{self.n}"
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def conv(self, x: str, c_in: int, c_out: int, k: int = 3, group: int = 1) -> str:
        w = (self.rng.standard_normal((c_out, c_in // group, k, k)) * (1.0 / math.sqrt(c_in // group * k * k)))
        b = self.rng.standard_normal(c_out) * 0.1
        return self.op("Conv", [x, self.const(w.astype(self.dtype)), self.const(b.astype(self.dtype))],
                       pads=[k // 2] * 4, group=group)

    def model(self, x_shape: list[int], outputs: list[str], opset: int = 17) -> onnx.ModelProto:
        elem = TensorProto.FLOAT16 if self.dtype == np.float16 else TensorProto.FLOAT
        graph = helper.make_graph(self.nodes, "zoo", [helper.make_tensor_value_info("x", elem, x_shape)],
                                  [helper.make_tensor_value_info(o, elem, None) for o in outputs], self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="bench_zoo")
        model.ir_version = 8
        inferred = onnx.shape_inference.infer_shapes(model)
        del model.graph.output[:]
        model.graph.output.extend(inferred.graph.output)
        return model


def prelu_uniform() -> onnx.ModelProto:
    g = _Graph()
    y = "x"
    for i in range(6):
        y = g.op("PRelu", [g.conv(y, 3 if i == 0 else 48, 48), g.const(np.full((48, 1, 1), 0.1, np.float32))])
    return g.model([1, 3, 56, 56], [y])


def resize_nearest() -> onnx.ModelProto:
    g = _Graph()
    y, c = "x", 64
    for _ in range(3):
        y = g.op("Relu", [g.conv(y, c, c // 2, k=1)])  # 1x1: the reorders around a Resize are a large share
        c //= 2
        y = g.op("Resize", [y, "", g.const(np.array([1, 1, 2, 2], np.float32))], mode="nearest")
    return g.model([1, 64, 40, 40], [g.conv(y, c, 8)])


def float16_block() -> onnx.ModelProto:
    g = _Graph(np.float16)
    lo, hi = g.const(np.float16(0)), g.const(np.float16(6))
    y = g.op("Clip", [g.conv("x", 3, 32), lo, hi])
    for _ in range(6):
        y = g.op("Clip", [g.conv(y, 32, 96, k=1), lo, hi])
        y = g.op("Clip", [g.conv(y, 96, 96, group=96), lo, hi])
        y = g.conv(y, 96, 32, k=1)
    return g.model([1, 3, 112, 112], [y])


def hardswish_heads() -> onnx.ModelProto:
    g = _Graph()
    stem = g.op("Relu", [g.conv("x", 3, 32)])
    heads = [g.op("HardSwish", [g.conv(stem, 32, 32)]) for _ in range(4)]
    return g.model([1, 3, 96, 96], heads, opset=14)


def nhwc_convs() -> onnx.ModelProto:
    g = _Graph()
    y, c = "x", 3
    for _ in range(4):
        t = g.op("Transpose", [y], perm=[0, 3, 1, 2])
        y = g.op("Transpose", [g.conv(t, c, 32)], perm=[0, 2, 3, 1])
        c = 32
        y = g.op("Mul", [y, g.const(g.rng.uniform(0.5, 1.5, c).astype(np.float32))])
        y = g.op("Relu", [g.op("Add", [y, g.const((g.rng.standard_normal(c) * 0.1).astype(np.float32))])])
    return g.model([1, 56, 56, 3], [y])


def conv1d_audio() -> onnx.ModelProto:
    g = _Graph()
    y, axes = "x", g.const(np.array([2], np.int64))
    for _ in range(4):
        w = g.rng.standard_normal((64, 64, 1, 3)) / math.sqrt(64 * 3)
        conv = g.op("Conv", [g.op("Unsqueeze", [y, axes]), g.const(w.astype(np.float32)),
                             g.const((g.rng.standard_normal(64) * 0.1).astype(np.float32))], pads=[0, 1, 0, 1])
        y = g.op("Mul", [g.op("Squeeze", [conv, axes]), g.const(g.rng.uniform(0.5, 1.5, (64, 1)).astype(np.float32))])
        y = g.op("Relu", [g.op("Add", [y, g.const((g.rng.standard_normal((64, 1)) * 0.1).astype(np.float32))])])
    return g.model([1, 64, 2000], [y])


#: Synthetic model name -> (builder, input shapes).
SYNTHETIC = {
    "prelu_uniform": (prelu_uniform, ["x=1x3x56x56"]),
    "resize_nearest": (resize_nearest, ["x=1x64x40x40"]),
    "float16_block": (float16_block, ["x=1x3x112x112"]),
    "hardswish_heads": (hardswish_heads, ["x=1x3x96x96"]),
    "nhwc_convs": (nhwc_convs, ["x=1x56x56x3"]),
    "conv1d_audio": (conv1d_audio, ["x=1x64x2000"]),
}


def zoo(tmp: Path) -> dict[str, tuple[Path, list[str], list[str]]]:
    """Model name -> (file, --input-shape values, extra bench arguments), shared models first (those present)."""
    models: dict[str, tuple[Path, list[str], list[str]]] = {}
    for name, shapes in SHARED_SHAPES.items():
        path = MODELS / f"{name}.onnx"
        if not path.is_file():
            print(f"{name}: not in {MODELS.name}/, left out", file=sys.stderr)
            continue
        extra: list[str] = []
        if name == "silero_vad_16k_op15":  # sr is an int64 sample rate, not a random number
            npz = tmp / "silero_inputs.npz"
            rng = np.random.default_rng(0)
            np.savez(npz, input=rng.standard_normal((1, 512)).astype(np.float32),
                     state=np.zeros((2, 1, 128), np.float32), sr=np.array(16000, np.int64))
            extra = ["--input-data", str(npz)]
        models[name] = (path, shapes, extra)
    for path in sorted(SAMPLES.glob("*.onnx")):
        models[f"sample/{path.stem}"] = (path, [], [])
    for name, (build, shapes) in SYNTHETIC.items():
        path = tmp / f"{name}.onnx"
        onnx.save(build(), str(path))
        models[f"synthetic/{name}"] = (path, shapes, [])
    return models


def bench_one(path: Path, shapes: list[str], extra: list[str], level: str, threads: int, args) -> dict:
    """One `onnxfuse bench` run at one level and thread count (the optimized model made in memory with
    --ort-level that level), as its JSON's level row, or ``{"error": ...}`` / ``{"nothing_fused": True}``."""
    cmd = [sys.executable, "-m", "onnxfuse", "bench", str(path), "--target", "cpu", "--ort-level", level,
           "--level", level, "--threads", str(threads), "--runs", str(args.runs), "--max-time", str(args.max_time),
           "--format", "json", *extra]
    for s in shapes:
        cmd += ["--input-shape", s]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    if out.returncode != 0 or not out.stdout.strip():
        return {"error": (out.stderr.strip().splitlines() or ["failed"])[-1]}
    data = json.loads(out.stdout)
    if data.get("nothing_fused") or not data.get("levels"):
        return {"nothing_fused": True}
    return data["levels"][0]


def table(results: list[dict]) -> str:
    """Markdown: one row per model, ``ratio (interval) verdict`` per level and thread count, and the geometric
    means of the ratios (models where nothing was rewritten count as 1.0, errors are left out)."""
    columns = sorted({(r["level"], r["threads"]) for r in results}, key=lambda c: (c[0] != "all", c[1]))
    head = [f"{level}, {threads} thread{'s' if threads > 1 else ''}" for level, threads in columns]
    lines = ["| model | " + " | ".join(head) + " |", "|---|" + "---|" * len(columns)]
    by = {(r["model"], r["level"], r["threads"]): r for r in results}
    for model in dict.fromkeys(r["model"] for r in results):
        cells = []
        for level, threads in columns:
            r = by.get((model, level, threads), {})
            if "ratio" in r:
                cells.append(f"{r['ratio']:.3f} ({r['ci_low']:.3f}-{r['ci_high']:.3f}) {r['verdict']}")
            else:
                cells.append("nothing rewritten" if r.get("nothing_fused") else f"error: {r.get('error', '-')}")
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    means = []
    for level, threads in columns:
        ratios = [r["ratio"] if "ratio" in r else 1.0 for r in results
                  if (r["level"], r["threads"]) == (level, threads) and "error" not in r]
        means.append(f"{math.exp(sum(math.log(x) for x in ratios) / len(ratios)):.3f}" if ratios else "-")
    lines.append("| **geometric mean** | " + " | ".join(means) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20, help="paired rounds per model, level and thread count")
    parser.add_argument("--max-time", type=float, default=20.0, help="seconds of rounds after --runs, per bench")
    parser.add_argument("--models", nargs="+", help="names as in the table (default: all)")
    parser.add_argument("--levels", nargs="+", default=["all", "extended"])
    parser.add_argument("--threads", nargs="+", type=int, default=[1, os.cpu_count() or 1])
    parser.add_argument("--json", default=str(REPO / "benchmarks" / "results" / "zoo.json"))
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-zoo-") as folder:
        models = zoo(Path(folder))
        for name in args.models or list(models):
            if name not in models:
                parser.error(f"no model {name!r}; models: {', '.join(models)}")
            path, shapes, extra = models[name]
            for level in args.levels:
                for threads in dict.fromkeys(args.threads):
                    row = bench_one(path, shapes, extra, level, threads, args)
                    results.append({"model": name, "level": level, "threads": threads, **row})
                    shown = (f"{row['ratio']:.3f} ({row['ci_low']:.3f}-{row['ci_high']:.3f}) {row['verdict']}"
                             if "ratio" in row else row.get("error", "nothing rewritten"))
                    print(f"{name} {level} {threads}t: {shown}", file=sys.stderr, flush=True)
    print(table(results))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=2, sort_keys=True, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
