"""Each form onnxfuse emits, timed in isolation against the unfused original, at every onnxruntime level.

A form is one Conv and what onnxfuse merges into it: FusedConv with each activation, FusedConv with the residual
input Z (with and without an activation), and the folds (BatchNormalization, per-channel Add, per-channel Mul).
For each form, kernel size (1x1, 3x3) and shape (channels x pixels) the script builds a small float32 graph with
``onnx.helper`` and random weights (``numpy``, seed 0), lets onnxfuse rewrite it with ``--target cpu`` and no
speed rules (``Options(ort_level=None)``), and times three onnxruntime CPU sessions in one process at each level
(disable, basic, extended, all) and thread count: the original (A), the original again (B, the control) and the
rewritten form (F). Runs rotate A, B, F / B, F, A / F, A, B so that machine noise hits all three alike.

Per cell: ratio = the median over rounds of F / A (the runs of one round share the machine's state, which
matters on a shared machine); control = the median over rounds of B / A; noise = the larger of |control - 1| and
the half-width of the 95% bootstrap interval of the ratio (rounds resampled). The verdict is "slower" when
ratio - 1 > noise, "faster" when 1 - ratio > noise, else "same"; and always "same" when onnxruntime, at that
level, turns both models into the same nodes (op types, domains and attributes of the graph it saves), since
the two sessions then run the same kernels. A "slower" cell is timed again and stays
"slower" only when the second timing agrees (two independent runs, so one burst of load on a shared machine
does not make a rule).

The summary table gives, per form and level, how many cells were faster / same / slower and the worst ratio;
the last lines print the ``CPU_SLOWER_AT`` data that ``onnxfuse/ort/providers.py`` holds (a form is slower at a level
when any of its cells is). Raw numbers go to ``benchmarks/results/forms.json``.

    python benchmarks/bench_forms.py                        # default grid, about 10 minutes on 2 cores
    python benchmarks/bench_forms.py --shapes 64x56 --kernels 3 --forms "FusedConv(Z)" --threads 1
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from onnxfuse import pipeline  # noqa: E402
from onnxfuse.ort.levels import ORT_LEVELS  # noqa: E402
from onnxfuse.ort.providers import REWRITE_FORMS  # noqa: E402
from onnxfuse.ort.sessions import session  # noqa: E402

OPSET = 17

#: form name -> what follows the Conv: ("act", op, attrs) | ("z", activation or None, attrs) | ("fold", op).
#: Clip is Clip(0, 6) (ReLU6); the Z input is the conv's own input x.
FORMS: dict[str, tuple] = {
    "FusedConv(Relu)": ("act", "Relu", {}),
    "FusedConv(Tanh)": ("act", "Tanh", {}),
    "FusedConv(Sigmoid)": ("act", "Sigmoid", {}),
    "FusedConv(LeakyRelu)": ("act", "LeakyRelu", {"alpha": 0.2}),
    "FusedConv(Clip)": ("act", "Clip", {}),
    "FusedConv(HardSigmoid)": ("act", "HardSigmoid", {"alpha": 0.2, "beta": 0.5}),
    "FusedConv(HardSwish)": ("act", "HardSwish", {}),
    "FusedConv(Z)": ("z", None, {}),
    "FusedConv(Z, Relu)": ("z", "Relu", {}),
    "FusedConv(Z, LeakyRelu)": ("z", "LeakyRelu", {"alpha": 0.2}),
    "FusedConv(Z, Tanh)": ("z", "Tanh", {}),
    "FusedConv(Z, Sigmoid)": ("z", "Sigmoid", {}),
    "FusedConv(Z, Clip)": ("z", "Clip", {}),
    "FusedConv(Z, HardSigmoid)": ("z", "HardSigmoid", {"alpha": 0.2, "beta": 0.5}),
    "FusedConv(Z, HardSwish)": ("z", "HardSwish", {}),
    "fold BatchNormalization": ("fold", "BatchNormalization"),
    "fold Add": ("fold", "Add"),
    "fold Mul": ("fold", "Mul"),
    # the rewrites of issue 31 (canonicalizations whose output onnxruntime then fuses or keeps in its blocked
    # layout), named as providers.REWRITE_FORMS names them: each graph is built by build_rewrite, and onnxfuse's
    # output must hold that pass's rewrite
    **{form: ("rewrite", pass_name) for pass_name, form in REWRITE_FORMS.items()},
}


def build_rewrite(form: str, channels: int, pixels: int, kernel: int, seed: int = 0) -> onnx.ModelProto:
    """The graphs of the ``rewrite`` forms, each around a Conv(C -> C, k x k, same padding, bias) on
    x [1, C, P, P] (float32 unless said):

    * PRelu -> LeakyRelu: Conv -> PRelu(slope [C, 1, 1], every element 0.25);
    * Resize(asymmetric, floor): Conv -> Resize(nearest, half_pixel, round_prefer_floor, scales 2 on H and W) ->
      Conv (the Resize between two convs, as in an FPN or a U-Net decoder);
    * float32 body between float16 Casts: the same Conv -> Clip(0, 6) in float16 (weights, input and output);
    * op moved before a layout wrapper: x [1, P, P, C] (NHWC) -> Transpose -> Conv -> Transpose -> Add(bias [C]) ->
      Relu, a TensorFlow export's conv.
    """
    rng = np.random.default_rng(seed)
    c, k = channels, kernel
    f16 = form == "float32 body between float16 Casts"
    dtype, elem = (np.float16, TensorProto.FLOAT16) if f16 else (np.float32, TensorProto.FLOAT)
    inits = []

    def const(name, values):
        values = np.asarray(values, dtype=dtype if values.dtype.kind == "f" else values.dtype)
        kind = {np.dtype(np.float16): TensorProto.FLOAT16, np.dtype(np.float32): TensorProto.FLOAT,
                np.dtype(np.int64): TensorProto.INT64}[values.dtype]
        inits.append(helper.make_tensor(name, kind, list(values.shape), values.ravel().tolist()))
        return name

    def conv(x, out, tag):
        w = const(f"W{tag}", rng.standard_normal((c, c, k, k)) / np.sqrt(c * k * k))
        b = const(f"B{tag}", rng.standard_normal(c) * 0.1)
        return helper.make_node("Conv", [x, w, b], [out], name=f"conv{tag}", pads=[k // 2] * 4, kernel_shape=[k, k])

    shape_in = shape_out = [1, c, pixels, pixels]
    if form == "PRelu -> LeakyRelu":
        nodes = [conv("x", "c0", 0), helper.make_node("PRelu", ["c0", const("slope", np.full((c, 1, 1), 0.25))],
                                                      ["y"], name="prelu")]
    elif form == "Resize(asymmetric, floor)":
        nodes = [conv("x", "c0", 0),
                 helper.make_node("Resize", ["c0", "", const("scales", np.array([1, 1, 2, 2], np.float32))], ["up"],
                                  name="resize", mode="nearest", coordinate_transformation_mode="half_pixel",
                                  nearest_mode="round_prefer_floor"),
                 conv("up", "y", 1)]
        shape_out = [1, c, 2 * pixels, 2 * pixels]
    elif f16:
        nodes = [conv("x", "c0", 0), helper.make_node("Clip", ["c0", const("lo", np.array(0.0)),
                                                              const("hi", np.array(6.0))], ["y"], name="clip")]
    else:
        shape_in = shape_out = [1, pixels, pixels, c]
        nodes = [helper.make_node("Transpose", ["x"], ["nchw"], name="to_nchw", perm=[0, 3, 1, 2]), conv("nchw", "c0", 0),
                 helper.make_node("Transpose", ["c0"], ["nhwc"], name="to_nhwc", perm=[0, 2, 3, 1]),
                 helper.make_node("Add", ["nhwc", const("bias", rng.standard_normal(c) * 0.1)], ["biased"], name="add"),
                 helper.make_node("Relu", ["biased"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, form, [helper.make_tensor_value_info("x", elem, shape_in)],
                              [helper.make_tensor_value_info("y", elem, shape_out)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def build(form: str, channels: int, pixels: int, kernel: int, seed: int = 0) -> onnx.ModelProto:
    """x [1, C, P, P] -> Conv(C -> C, k x k, same padding, bias) -> the form's nodes. Z is x itself (a residual
    block's skip connection). float32, opset 17. The ``rewrite`` forms: :func:`build_rewrite`."""
    if FORMS[form][0] == "rewrite":
        return build_rewrite(form, channels, pixels, kernel, seed)
    rng = np.random.default_rng(seed)
    c, k = channels, kernel
    inits = [
        helper.make_tensor("W", TensorProto.FLOAT, [c, c, k, k],
                           (rng.standard_normal((c, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32).ravel()),
        helper.make_tensor("B", TensorProto.FLOAT, [c], rng.standard_normal(c).astype(np.float32) * 0.1),
    ]
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["conv"], name="conv", pads=[k // 2] * 4,
                              kernel_shape=[k, k])]
    kind = FORMS[form]
    last = "conv"

    def add(op, inputs, **attrs):
        nonlocal last
        out = f"{op.lower()}{len(nodes)}"
        nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        last = out

    def const(name, values):
        inits.append(helper.make_tensor(name, TensorProto.FLOAT, list(values.shape), values.ravel()))
        return name

    if kind[0] == "act":
        op, attrs = kind[1], kind[2]
        if op == "Clip":
            add(op, [last, const("lo", np.array(0.0, np.float32)), const("hi", np.array(6.0, np.float32))])
        else:
            add(op, [last], **attrs)
    elif kind[0] == "z":
        add("Add", [last, "x"])
        if kind[1] == "Clip":
            add("Clip", [last, const("lo", np.array(0.0, np.float32)), const("hi", np.array(6.0, np.float32))])
        elif kind[1]:
            add(kind[1], [last], **kind[2])
    elif kind[1] == "BatchNormalization":
        add("BatchNormalization", [last, const("s", rng.uniform(0.5, 1.5, c).astype(np.float32)),
                                   const("b", rng.standard_normal(c).astype(np.float32)),
                                   const("m", rng.standard_normal(c).astype(np.float32)),
                                   const("v", rng.uniform(0.5, 1.5, c).astype(np.float32))])
    else:
        add(kind[1], [last, const("p", rng.uniform(0.5, 1.5, (1, c, 1, 1)).astype(np.float32))])
    shape = [1, c, pixels, pixels]
    graph = helper.make_graph(nodes, form, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(last, TensorProto.FLOAT, shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def rewrite(model: onnx.ModelProto, tmp: Path) -> onnx.ModelProto:
    """onnxfuse's output for ``model`` (target cpu, no speed rules); it must be one node, or, for a ``rewrite``
    form, hold that pass's rewrite."""
    path = tmp / "form.onnx"
    onnx.save(model, str(path))
    result = pipeline.analyse(path, pipeline.Options(target="cpu", ort_level=None))
    out = result.model
    kind = FORMS[model.graph.name]
    if kind[0] == "rewrite":
        if not any(f.pass_name == kind[1] for f in result.fusions):
            raise SystemExit(f"{model.graph.name}: {kind[1]} did not rewrite the graph "
                             f"({[(s.pass_name, str(s.reason)) for s in result.skips]})")
        return out
    if len(out.graph.node) != 1:
        raise SystemExit(f"{model.graph.name}: onnxfuse left {[n.op_type for n in out.graph.node]}, not one node")
    return out


def signature(path: str) -> list[tuple]:
    """Op type, domain and attributes of every node of the graph onnxruntime saved (names and inputs aside)."""
    graph = onnx.load(path).graph
    return [(n.domain, n.op_type, sorted((a.name, str(a)) for a in n.attribute)) for n in graph.node]


def time_cell(original: bytes, fused: bytes, feeds: dict, level: str, threads: int, seconds: float,
              min_runs: int, rng: np.random.Generator, tmp: Path) -> dict:
    """Time original (A), original (B, control) and fused (F) at ``level``; see the module docstring."""
    saved = {k: str(tmp / f"{k}.ort.onnx") for k in "AF"}
    sess = {"A": session(original, level, threads, saved["A"]), "B": session(original, level, threads),
            "F": session(fused, level, threads, saved["F"])}
    same_graph = signature(saved["A"]) == signature(saved["F"])
    for s in sess.values():
        for _ in range(3):
            s.run(None, feeds)
    start = time.perf_counter()
    sess["A"].run(None, feeds)
    one = max(time.perf_counter() - start, 1e-5)
    runs = int(min(max(min_runs, seconds / (3 * one)), 400))
    times = {k: [] for k in sess}
    orders = ("ABF", "BFA", "FAB")
    for i in range(runs):
        for key in orders[i % 3]:
            t0 = time.perf_counter()
            sess[key].run(None, feeds)
            times[key].append(time.perf_counter() - t0)
    t = {k: np.asarray(v) for k, v in times.items()}
    med = {k: float(np.median(v)) for k, v in t.items()}
    paired_f, paired_b = t["F"] / t["A"], t["B"] / t["A"]  # runs of one round share the machine's state
    ratio, control = float(np.median(paired_f)), float(np.median(paired_b))
    idx = rng.integers(0, runs, size=(1000, runs))
    lo, hi = np.percentile(np.median(paired_f[idx], axis=1), [2.5, 97.5])
    noise = max(abs(control - 1.0), (hi - lo) / 2)
    verdict = "slower" if ratio - 1 > noise else "faster" if 1 - ratio > noise else "same"
    if same_graph:
        verdict = "same"  # onnxruntime runs the same nodes for both: any difference is noise
    return {"same_graph_after_ort": same_graph, "runs": runs, "original_ms": med["A"] * 1e3, "fused_ms": med["F"] * 1e3, "ratio": ratio,
            "control": control, "noise": noise, "verdict": verdict}


def summary(cells: list[dict], forms: list[str], levels: list[str]) -> str:
    """Markdown: per form and level, faster / same / slower cell counts, the ratio range and the worst case."""
    lines = ["| form | " + " | ".join(levels) + " |", "|---|" + "---|" * len(levels)]
    for form in forms:
        row = [form]
        for level in levels:
            mine = [c for c in cells if c["form"] == form and c["level"] == level]
            if not mine:
                row.append("")
                continue
            n = {v: sum(c["verdict"] == v for c in mine) for v in ("faster", "same", "slower")}
            ratios = [c["ratio"] for c in mine]
            text = f"{n['faster']}/{n['same']}/{n['slower']} ({min(ratios):.2f}-{max(ratios):.2f})"
            if n["slower"]:
                worst = max((c for c in mine if c["verdict"] == "slower"), key=lambda c: c["ratio"])
                text = (f"**{text}** worst {worst['ratio']:.3f} ±{worst['noise']:.3f} at {worst['channels']}ch "
                        f"{worst['pixels']}px {worst['kernel']}x{worst['kernel']} {worst['threads']}t")
            row.append(text)
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--forms", nargs="+", default=list(FORMS), choices=list(FORMS), metavar="FORM")
    parser.add_argument("--shapes", nargs="+", default=["32x112", "64x56", "256x14"],
                        metavar="CxP", help="channels x pixels (square), e.g. 64x56")
    parser.add_argument("--kernels", nargs="+", type=int, default=[1, 3])
    parser.add_argument("--levels", nargs="+", default=list(ORT_LEVELS), choices=list(ORT_LEVELS))
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--seconds", type=float, default=0.5, help="time budget per cell (runs = budget / run)")
    parser.add_argument("--min-runs", type=int, default=21)
    parser.add_argument("--json", default=str(REPO / "benchmarks" / "results" / "forms.json"))
    args = parser.parse_args()
    import tempfile

    rng = np.random.default_rng(0)
    cells = []
    with tempfile.TemporaryDirectory(prefix="bench-forms-") as tmp:
        for form in args.forms:
            for shape in args.shapes:
                channels, pixels = (int(v) for v in shape.split("x"))
                for kernel in args.kernels:
                    model = build(form, channels, pixels, kernel)
                    original, fused = model.SerializeToString(), rewrite(model, Path(tmp)).SerializeToString()
                    x = model.graph.input[0].type.tensor_type
                    feeds = {"x": np.random.default_rng(1).standard_normal([d.dim_value for d in x.shape.dim])
                             .astype(np.float16 if x.elem_type == TensorProto.FLOAT16 else np.float32)}
                    for threads in args.threads:
                        for level in args.levels:
                            cell = time_cell(original, fused, feeds, level, threads, args.seconds, args.min_runs,
                                             rng, Path(tmp))
                            if cell["verdict"] == "slower":
                                again = time_cell(original, fused, feeds, level, threads, args.seconds,
                                                  args.min_runs, rng, Path(tmp))
                                cell["confirm"] = again
                                if again["verdict"] != "slower":
                                    cell["verdict"] = "same"
                            cell.update(form=form, channels=channels, pixels=pixels, kernel=kernel,
                                        threads=threads, level=level)
                            cells.append(cell)
                            print(f"{form:24s} {channels:4d}ch {pixels:4d}px {kernel}x{kernel} {threads}t "
                                  f"{level:8s} ratio {cell['ratio']:.3f} control {cell['control']:.3f} "
                                  f"noise {cell['noise']:.3f} {cell['verdict']}"
                                  f"{' (same graph after onnxruntime)' if cell['same_graph_after_ort'] else ''}",
                                  file=sys.stderr, flush=True)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"args": vars(args), "cells": cells}, indent=1) + "\n")
    print("Cells faster/same/slower (ratio range fused / original); slower cells were confirmed by a second "
          "timing.\n")
    print(summary(cells, args.forms, args.levels))
    slower = {f: sorted({c["level"] for c in cells if c["form"] == f and c["verdict"] == "slower"},
                        key=ORT_LEVELS.index) for f in args.forms}
    print("CPU_SLOWER_AT = {" + ", ".join(f'"{f}": {{{", ".join(repr(x) for x in v)}}}'
                                          for f, v in slower.items() if v) + "}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
