#!/usr/bin/env python3
"""Check that two revisions of onnxfuse write byte-identical models: ``onnxfuse optimize --no-verify`` on every
shared model, every sample model and the synthetic ResNets, for every target, once with each revision; prints one
line per output and exits 1 when any output differs (or one revision fails where the other does not). With
``--reports`` the JSON, text and Markdown reports of each run are compared too (written beside the model, at the
default 110-column width of the text report); with ``--verify`` the command verifies and the reports hold its
verdict and measured errors.

    python benchmarks/check_determinism.py --base main            # main against this working tree
    python benchmarks/check_determinism.py --base 1ca2625 --head HEAD --targets cpu+cuda cpu
    python benchmarks/check_determinism.py --base main --reports --no-synthetic

A revision is exported with ``git archive`` into a temporary folder and run from there (PYTHONPATH); the working
tree itself is ``--head WORKTREE`` (the default). Both run with the same Python, so the onnxfuse version written
into the models' metadata is the same.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from bench_tools import INPUT_SHAPES, SYNTHETIC, make_synthetic  # noqa: E402

TARGETS = ("cpu+cuda", "cpu", "cuda", "onnx")


def source_tree(rev: str, tmp: Path) -> Path:
    if rev == "WORKTREE":
        return REPO
    dest = tmp / rev.replace("/", "_")
    dest.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


REPORT_SUFFIXES = (".json", ".txt", ".md")


def run(src: Path, model: Path, target: str, out: Path, python: str, reports: bool = False,
        verify: bool = False) -> str:
    """The SHA-256 of the written model (and, with ``reports``, of each report file, joined by ``/``), or the
    command's exit status and last message line when it fails. ``verify`` runs the default, verified command."""
    argv = [python, "-m", "onnxfuse", "optimize", str(model), str(out), "--target", target]
    if not verify:
        argv.append("--no-verify")
    for shape in INPUT_SHAPES.get(model.stem, []):
        argv += ["--input-shape", shape]
    report_files = [out.with_suffix(suffix) for suffix in REPORT_SUFFIXES] if reports else []
    for path in report_files:
        argv += ["--report", str(path)]
    # The same working folder for both revisions: reports name a model under it by its relative path
    r = subprocess.run(argv, cwd=out.parent, env={**os.environ, "PYTHONPATH": str(src)}, capture_output=True,
                       text=True)
    if r.returncode != 0:
        return f"exit {r.returncode}: {(r.stderr or r.stdout).strip().splitlines()[-1:]}"
    digests = []
    for path in [out, *report_files]:
        digests.append(hashlib.sha256(path.read_bytes()).hexdigest()[:16])
        path.unlink()
    return "/".join(digests)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="main", help="git revision to compare against (default main)")
    ap.add_argument("--head", default="WORKTREE", help="git revision, or WORKTREE (default) for this checkout")
    ap.add_argument("--targets", nargs="+", default=list(TARGETS), choices=TARGETS)
    ap.add_argument("--models-dir", default=os.environ.get("ONNXFUSE_MODELS_DIR", str(REPO.parent / "shared" / "models")))
    ap.add_argument("--workdir", default=None, help="where the synthetic ResNets are made and kept (default temporary)")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--reports", action="store_true", help="compare the JSON, text and Markdown reports too")
    ap.add_argument("--verify", action="store_true", help="run the verified command (its reports hold the verdict)")
    ap.add_argument("--no-synthetic", action="store_true", help="leave out the synthetic ResNets (minutes each)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="onnxfuse-determinism-") as tmp_name:
        tmp = Path(tmp_name)
        work = Path(args.workdir) if args.workdir else tmp / "models"
        work.mkdir(parents=True, exist_ok=True)
        models = sorted(Path(args.models_dir).glob("*.onnx")) + sorted((REPO / "sample_models").glob("*.onnx"))
        if not args.no_synthetic:
            models += [make_synthetic(args.python, name, margs, work) for name, margs in SYNTHETIC.items()]
        trees = {rev: source_tree(rev, tmp) for rev in (args.base, args.head)}
        differ = 0
        for model in models:
            for target in args.targets:
                got = {rev: run(src, model, target, tmp / "out.onnx", args.python, args.reports, args.verify)
                       for rev, src in trees.items()}
                same = len(set(got.values())) == 1  # an error message counts: both must fail alike
                differ += not same
                print(f"{'same   ' if same else 'DIFFERS'} {model.stem:28s} {target:9s} "
                      + "  ".join(f"{rev}={v}" for rev, v in got.items()), flush=True)
        print(f"{differ} of {len(models) * len(args.targets)} outputs differ")
        return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
