"""Which onnxruntime releases load and compute every form onnxfuse can emit: the facts behind ``--ort-version``.

For each onnxruntime release that pip serves for this Python (the newest patch of each minor release, from the
oldest still installable to the newest), this script makes a throwaway venv, installs that release into it, and in
that venv loads and runs every emitted form (each FusedConv activation with and without the residual input Z, each
FusedGemm activation, float32 and float16) next to the unfused graph it replaces, both with graph optimizations
disabled, on the CPU execution provider. A form is ``ok`` when it loads and matches the unfused graph within
rtol = atol = 1e-4, ``load`` when the session cannot be created, ``run`` when it fails at run time, ``mismatch``
when its outputs differ.

Results: ``benchmarks/results/ort_releases.json`` (every release and form, with the error text) and
``benchmarks/results/ort_releases.md`` (the table for the docs). ``onnxfuse/ort/providers.py`` carries the minimum
release of each form as data (``FORM_MIN_ORT``); ``tests/test_providers.py`` checks it against the JSON.

Run from the repository root (needs network access to PyPI, a few minutes per release the first time; venvs are
kept in ``benchmarks/out/ort-venvs`` and reused):

    python benchmarks/probe_ort_releases.py                 # every minor release pip serves
    python benchmarks/probe_ort_releases.py --releases 1.20.1 1.32.0
    python benchmarks/probe_ort_releases.py --releases 1.20.1 --check-model original.onnx optimized.onnx \\
        --input-shape x=1x3x48x320                          # a written model in an older release
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import venv
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from onnxfuse.ort.providers import ACTIVATION_PARAM_COUNTS, FUSED_GEMM_ACTIVATIONS, form_name  # noqa: E402

OUT = ROOT / "benchmarks" / "out"
RESULTS = ROOT / "benchmarks" / "results"

#: FusedConv activation -> (ONNX op to build the unfused reference, its attributes, activation_params).
CONV_ACTIVATIONS = {
    "Relu": ({}, []),
    "Tanh": ({}, []),
    "Sigmoid": ({}, []),
    "HardSwish": ({}, []),
    "LeakyRelu": ({"alpha": 0.1}, [0.1]),
    "Clip": (None, [0.0, 6.0]),  # Clip's bounds are inputs from opset 11
    "HardSigmoid": ({"alpha": 0.2, "beta": 0.5}, [0.2, 0.5]),
}
assert set(CONV_ACTIVATIONS) == set(ACTIVATION_PARAM_COUNTS)

GEMM_PARAMS = {"LeakyRelu": {"alpha": 0.1}, "HardSigmoid": {"alpha": 0.2, "beta": 0.5}, "Elu": {"alpha": 1.0},
               "Celu": {"alpha": 1.0}, "ThresholdedRelu": {"alpha": 0.5},
               "Selu": {"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875}}

OPSET, IR = 14, 7  # HardSwish is opset 14; old enough for every release probed (onnxruntime 1.15 reads IR <= 9)


def _activation_nodes(act: str, src: str, dst: str, dtype: int) -> tuple[list, list]:
    attrs, _ = CONV_ACTIVATIONS.get(act, (GEMM_PARAMS.get(act, {}), None))
    if act == "Clip":
        lo = numpy_helper.from_array(np.array(0.0, helper.tensor_dtype_to_np_dtype(dtype)), "clip_lo")
        hi = numpy_helper.from_array(np.array(6.0, helper.tensor_dtype_to_np_dtype(dtype)), "clip_hi")
        return [helper.make_node("Clip", [src, "clip_lo", "clip_hi"], [dst])], [lo, hi]
    return [helper.make_node(act, [src], [dst], **(attrs or {}))], []


def _model(nodes, inputs, output, inits, contrib: bool) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "probe", inputs, [output], inits)
    opsets = [helper.make_opsetid("", OPSET)] + ([helper.make_opsetid("com.microsoft", 1)] if contrib else [])
    return helper.make_model(graph, opset_imports=opsets, ir_version=IR)


def _float32(model: onnx.ModelProto) -> onnx.ModelProto:
    """The reference in float32 (same values): onnxruntime has no float16 kernel for some activations, and the
    reference is the exact computation the fused form must match."""
    for t in model.graph.initializer:
        if t.data_type == TensorProto.FLOAT16:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32), t.name))
    for vi in [*model.graph.input, *model.graph.output]:
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT16:
            vi.type.tensor_type.elem_type = TensorProto.FLOAT
    return model


def conv_pair(act: str | None, residual: bool, dtype: int) -> tuple[onnx.ModelProto, onnx.ModelProto, dict]:
    """(FusedConv model, unfused reference, inputs) for one form: a 3x3 conv of 4 -> 8 channels on 1x4x9x9."""
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 4, 3, 3)).astype(np_dtype), "w")
    b = numpy_helper.from_array(rng.standard_normal(8).astype(np_dtype), "b")
    x = helper.make_tensor_value_info("x", dtype, [1, 4, 9, 9])
    z = helper.make_tensor_value_info("z", dtype, [1, 8, 9, 9])
    y = helper.make_tensor_value_info("y", dtype, [1, 8, 9, 9])
    inputs = [x, z] if residual else [x]
    feeds = {"x": rng.standard_normal((1, 4, 9, 9)).astype(np_dtype)}
    if residual:
        feeds["z"] = rng.standard_normal((1, 8, 9, 9)).astype(np_dtype)
    conv = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    fused_attrs = dict(conv)
    if act is not None:
        fused_attrs["activation"] = act
        params = CONV_ACTIVATIONS[act][1]
        if params:
            fused_attrs["activation_params"] = params
    fused = helper.make_node("FusedConv", ["x", "w", "b"] + (["z"] if residual else []), ["y"], domain="com.microsoft",
                             **fused_attrs)
    ref_nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], **conv)]
    last, extra = "c", []
    if residual:
        ref_nodes.append(helper.make_node("Add", ["c", "z"], ["s"]))
        last = "s"
    if act is not None:
        nodes, extra = _activation_nodes(act, last, "y", dtype)
        ref_nodes += nodes
    else:
        ref_nodes.append(helper.make_node("Identity", [last], ["y"]))
    return (_model([fused], inputs, y, [w, b], True),
            _float32(_model(ref_nodes, inputs, y, [w, b, *extra], False)), feeds)


def gemm_pair(act: str, dtype: int) -> tuple[onnx.ModelProto, onnx.ModelProto, dict]:
    """(FusedGemm model, Gemm + activation reference, inputs) for one activation: 2x16 @ 16x8 + 8."""
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np_dtype), "w")
    b = numpy_helper.from_array(rng.standard_normal(8).astype(np_dtype), "b")
    x = helper.make_tensor_value_info("x", dtype, [2, 16])
    y = helper.make_tensor_value_info("y", dtype, [2, 8])
    attrs = {"activation": act}
    for (onnx_attr, gemm_attr, default) in FUSED_GEMM_ACTIVATIONS[act]:
        attrs[gemm_attr] = GEMM_PARAMS.get(act, {}).get(onnx_attr, default)
    fused = helper.make_node("FusedGemm", ["x", "w", "b"], ["y"], domain="com.microsoft", **attrs)
    ref = [helper.make_node("Gemm", ["x", "w", "b"], ["g"])]
    nodes, extra = _activation_nodes(act, "g", "y", dtype)
    feeds = {"x": rng.standard_normal((2, 16)).astype(np_dtype)}
    return _model([fused], [x], y, [w, b], True), _float32(_model(ref + nodes, [x], y, [w, b, *extra], False)), feeds


def build_probes(folder: Path) -> list[str]:
    """Write every probe pair into ``folder`` (``<form>.fused.onnx``, ``<form>.ref.onnx``, ``<form>.npz``) and
    return the form names (``FusedConv(Z, Relu) float32``...)."""
    folder.mkdir(parents=True, exist_ok=True)
    forms = []
    for dtype in (TensorProto.FLOAT, TensorProto.FLOAT16):
        suffix = helper.tensor_dtype_to_np_dtype(dtype).name
        for act in (None, *CONV_ACTIVATIONS):
            for residual in (False, True):
                forms.append((f"{form_name(act, residual)} {suffix}", conv_pair(act, residual, dtype)))
        for act in FUSED_GEMM_ACTIVATIONS:
            forms.append((f"FusedGemm({act}) {suffix}", gemm_pair(act, dtype)))
    names = []
    for name, (fused, ref, feeds) in forms:
        stem = re.sub(r"\W+", "_", name)
        onnx.save(fused, str(folder / f"{stem}.fused.onnx"))
        onnx.save(ref, str(folder / f"{stem}.ref.onnx"))
        np.savez(folder / f"{stem}.npz", **feeds)
        names.append(name)
    (folder / "forms.json").write_text(json.dumps({n: re.sub(r"\W+", "_", n) for n in names}, indent=1))
    return names


#: Runs inside each release's venv: only onnxruntime and numpy are there.
RUNNER = r'''
import json, sys
from pathlib import Path
import numpy as np
import onnxruntime as ort

folder = Path(sys.argv[1])
out = {"onnxruntime": ort.__version__, "forms": {}}
for name, stem in json.loads((folder / "forms.json").read_text()).items():
    feeds = dict(np.load(folder / f"{stem}.npz"))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 4
    try:
        fused = ort.InferenceSession(str(folder / f"{stem}.fused.onnx"), so, providers=["CPUExecutionProvider"])
    except Exception as exc:
        out["forms"][name] = {"status": "load", "error": " ".join(str(exc).split())[:300]}
        continue
    try:
        got = fused.run(None, feeds)[0]
    except Exception as exc:
        out["forms"][name] = {"status": "run", "error": " ".join(str(exc).split())[:300]}
        continue
    try:
        ref = ort.InferenceSession(str(folder / f"{stem}.ref.onnx"), so, providers=["CPUExecutionProvider"])
        want = ref.run(None, {k: v.astype(np.float32) for k, v in feeds.items()})[0]
    except Exception as exc:
        out["forms"][name] = {"status": "no-reference", "error": " ".join(str(exc).split())[:300]}
        continue
    err = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))))
    tol = 1e-4 if got.dtype == np.float32 else 1e-2
    ok = np.allclose(got, want, rtol=tol, atol=tol)
    out["forms"][name] = {"status": "ok" if ok else "mismatch", "max_abs_error": err}
print(json.dumps(out))
'''


#: Runs inside a release's venv: loads an original and an optimized model, feeds both the same seeded inputs
#: (symbolic dims at the sizes given on the command line, else 1), compares every output.
MODEL_RUNNER = r'''
import json, sys
import numpy as np
import onnxruntime as ort

original, optimized, shapes = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
so = ort.SessionOptions()
so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
so.log_severity_level = 4
out = {"onnxruntime": ort.__version__}
try:
    b = ort.InferenceSession(optimized, so, providers=["CPUExecutionProvider"])
except Exception as exc:
    out.update(status="load", error=" ".join(str(exc).split())[:300])
    print(json.dumps(out)); sys.exit()
a = ort.InferenceSession(original, so, providers=["CPUExecutionProvider"])
rng = np.random.default_rng(0)
feeds = {}
for i in a.get_inputs():
    shape = shapes.get(i.name) or [d if isinstance(d, int) else 1 for d in i.shape]
    dtype = {"tensor(float)": np.float32, "tensor(int64)": np.int64}.get(i.type, np.float32)
    feeds[i.name] = rng.standard_normal(shape).astype(dtype)
want, got = a.run(None, feeds), b.run(None, feeds)
err = max(float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)))) for x, y in zip(want, got))
scale = max(float(np.max(np.abs(x))) for x in want)
out.update(status="ok" if err <= 1e-4 * max(1.0, scale) else "mismatch", max_abs_error=err, output_scale=scale)
print(json.dumps(out))
'''


def check_models(original: str, optimized: str, releases: list[str], shapes: dict) -> list[dict]:
    """Load ``optimized`` and ``original`` in each release's venv (made by :func:`probe` when missing) and compare
    their outputs on the same seeded inputs, graph optimizations disabled."""
    forms_dir = OUT / "ort-probe-forms"
    results = []
    for release in releases:
        if not (OUT / "ort-venvs" / release / "bin" / "python").exists():
            probe(release, forms_dir)
        python = OUT / "ort-venvs" / release / "bin" / "python"
        proc = subprocess.run([str(python), "-c", MODEL_RUNNER, original, optimized, json.dumps(shapes)],
                              capture_output=True, text=True)
        results.append(json.loads(proc.stdout) if proc.returncode == 0 else
                       {"onnxruntime": release, "status": "error", "error": proc.stderr.strip()[-300:]})
    return results


def newest_patches() -> list[str]:
    """The newest patch release of each onnxruntime minor release that pip serves for this Python, oldest
    first (``pip index versions``)."""
    text = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "onnxruntime"], capture_output=True,
                          text=True, check=True).stdout
    versions = re.search(r"Available versions: (.*)", text).group(1).split(", ")
    newest: dict[tuple[int, int], tuple[int, ...]] = {}
    for v in versions:
        parts = tuple(int(p) for p in v.split("."))
        key = parts[:2]
        newest[key] = max(newest.get(key, parts), parts)
    return [".".join(map(str, newest[k])) for k in sorted(newest)]


def probe(release: str, forms_dir: Path) -> dict:
    """Install ``release`` into its own venv (reused when present) and run :data:`RUNNER` there."""
    env_dir = OUT / "ort-venvs" / release
    python = env_dir / "bin" / "python"
    if not python.exists():
        venv.create(env_dir, with_pip=True)
        numpy = "numpy<2" if tuple(map(int, release.split(".")[:2])) < (1, 19) else "numpy"
        subprocess.run([str(python), "-m", "pip", "install", "-q", f"onnxruntime=={release}", numpy], check=True)
    proc = subprocess.run([str(python), "-c", RUNNER, str(forms_dir)], capture_output=True, text=True)
    if proc.returncode != 0:
        return {"onnxruntime": release, "error": proc.stderr.strip()[-500:], "forms": {}}
    return json.loads(proc.stdout)


def markdown(results: list[dict]) -> str:
    """One row per form, one column per release: ok, load, run or mismatch."""
    forms = list(results[0]["forms"]) if results else []
    head = "| form | " + " | ".join(r["onnxruntime"] for r in results) + " |"
    rows = [head, "|---|" + "---|" * len(results)]
    for form in forms:
        rows.append(f"| {form} | " + " | ".join(r["forms"].get(form, {}).get("status", "?") for r in results) + " |")
    return "\n".join(rows) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--releases", nargs="*", help="releases to probe (default: newest patch of every minor)")
    parser.add_argument("--check-model", nargs=2, metavar=("ORIGINAL", "OPTIMIZED"),
                        help="instead of the forms: load OPTIMIZED and ORIGINAL in each release and compare outputs")
    parser.add_argument("--input-shape", action="append", default=[], metavar="NAME=DIMS",
                        help="with --check-model: sizes of an input's symbolic dims, e.g. x=1x3x48x320")
    args = parser.parse_args()
    releases = args.releases or newest_patches()
    if args.check_model:
        shapes = {k: [int(d) for d in v.split("x")] for k, v in (t.split("=") for t in args.input_shape)}
        for r in check_models(*args.check_model, releases, shapes):
            print(json.dumps(r), flush=True)
        return
    forms_dir = OUT / "ort-probe-forms"
    build_probes(forms_dir)
    results = []
    for release in releases:
        result = probe(release, forms_dir)
        bad = {k: v["status"] for k, v in result["forms"].items() if v["status"] != "ok"}
        print(f"onnxruntime {release}: {len(result['forms']) - len(bad)} ok, not ok: {bad or result.get('error')}",
              flush=True)
        results.append(result)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "ort_releases.json").write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    (RESULTS / "ort_releases.md").write_text(markdown(results))


if __name__ == "__main__":
    main()
