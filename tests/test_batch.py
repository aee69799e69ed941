"""``onnxfuse batch`` on the local pool: every output written, a second run does nothing, a crash, a timeout and
a memory limit fail only their model, workers are reused and recycled, shards are stable, shard summaries merge,
the baseline gate, manifests, and Ctrl-C leaves only complete files.

Failures are injected through the batch's test hook (``onnxfuse.batch.TEST_HOOK_ENV``): a model's task
``os._exit()``s, sleeps or allocates before it starts. Each worker imports onnxfuse once (a few seconds on this
machine), so the tests run few, small sample models.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import onnx
import pytest
from click.testing import CliRunner

from onnxfuse import batch as b
from onnxfuse.cli.main import main
from tests.conftest import REPO

SAMPLES = REPO / "sample_models"
MODELS = ("conv_relu", "mlp_head", "resnet_block")


def _zoo(tmp: Path, names=MODELS) -> Path:
    """A folder of sample models, one in a subfolder (folders are searched recursively)."""
    zoo = tmp / "zoo"
    (zoo / "sub").mkdir(parents=True)
    for i, name in enumerate(names):
        (zoo / ("sub" if i == 0 else "") / f"{name}.onnx").write_bytes((SAMPLES / f"{name}.onnx").read_bytes())
    return zoo


def _batch(args, env=None):
    result = CliRunner().invoke(main, ["batch", *map(str, args)], env=env)
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def _files(folder: Path) -> dict[str, float]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """One batch of three sample models with -j 2: (zoo, OUTDIR, the CLI result)."""
    tmp = tmp_path_factory.mktemp("batch")
    zoo = _zoo(tmp)
    out = tmp / "out"
    result = _batch([zoo, "-o", out, "-j", "2"])
    return zoo, out, result


def test_batch_writes_every_output_report_and_summary(first_run):
    zoo, out, result = first_run
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    jsonschema.validate(summary, b.schema())
    names = [r["name"] for r in summary["models"]]
    assert names == sorted(["sub/conv_relu", "mlp_head", "resnet_block"])
    assert summary["counts"]["ok"] == 3 and summary["workers"] == 2
    for r in summary["models"]:
        assert r["status"] == "ok" and r["verification"] == "passed", r
        onnx.checker.check_model(onnx.load(str(out / r["output"])))
        report = json.loads((out / r["report_json"]).read_text())
        assert report["model"]["path"].endswith(f"{r['name']}.onnx")
        assert r["fusions"] == len(report["fusions"]) >= 1
        assert r["saved_bytes"] == report["totals"]["saved_bytes"] > 0
        assert r["saved_bytes_beyond"] == report["onnxruntime"]["saved_bytes_beyond"]
        assert (out / r["report_html"]).read_text().startswith("<!DOCTYPE html>")
        assert r["time_s"] > 0 and r["peak_memory_bytes"] > 10 * 2**20
    md = (out / "summary.md").read_text()
    assert all(f"`{n}`" in md for n in names)
    assert not (out / b.STATE_DIR / "staging").exists()
    # the inputs are untouched and the outputs are not collected as inputs next time
    assert sorted(p.name for p in zoo.rglob("*")) == sorted(["sub", *(f"{n}.onnx" for n in MODELS)])


def test_second_run_does_no_work_and_a_changed_option_reruns_only_that_model(first_run, tmp_path):
    zoo, out, _ = first_run
    before = _files(out)
    result = _batch([zoo, "-o", out, "-j", "2"])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["cached"] == 3 and all(r["cached"] for r in summary["models"])
    after = _files(out)
    assert {k: v for k, v in after.items() if not k.startswith("summary") and k != "index.html"} == \
        {k: v for k, v in before.items() if not k.startswith("summary") and k != "index.html"}
    # a manifest that changes one model's ort level: that model only runs again
    manifest = tmp_path / "zoo.json"
    manifest.write_text(json.dumps({"models": [
        {"path": str(zoo / "mlp_head.onnx")}, {"path": str(zoo / "resnet_block.onnx"), "ort_level": "extended"}]}))
    out2 = tmp_path / "out2"
    _batch([manifest, "-o", out2, "-j", "1"])
    again = _batch([manifest, "-o", out2, "-j", "1"])
    assert json.loads((out2 / "summary.json").read_text())["cached"] == 2, again.output
    manifest.write_text(json.dumps({"models": [
        {"path": str(zoo / "mlp_head.onnx")}, {"path": str(zoo / "resnet_block.onnx"), "ort_level": "basic"}]}))
    changed = _batch([manifest, "-o", out2, "-j", "1"])
    rows = {r["name"]: r for r in json.loads((out2 / "summary.json").read_text())["models"]}
    assert rows["mlp_head"]["cached"] and not rows["resnet_block"]["cached"], changed.output
    assert rows["resnet_block"]["options"]["ort_level"] == "basic"


def test_crash_timeout_and_memory_limit_fail_only_their_model(tmp_path):
    zoo = _zoo(tmp_path, ("conv_relu", "mlp_head", "conv_tanh", "conv_sigmoid"))
    (zoo / "broken.onnx").write_bytes(b"not a model")
    hooks = {"mlp_head.onnx": "crash", "conv_tanh.onnx": "sleep:60", "conv_sigmoid.onnx": "allocate:3000000000"}
    out = tmp_path / "out"
    result = _batch([zoo, "-o", out, "-j", "2", "--timeout", "10", "--max-memory", "1500M"],
                    env={b.TEST_HOOK_ENV: json.dumps(hooks)})
    assert result.exit_code == 2, result.output
    rows = {r["name"]: r for r in json.loads((out / "summary.json").read_text())["models"]}
    assert rows["sub/conv_relu"]["status"] == "ok"
    assert rows["mlp_head"]["status"] == "crashed" and "exited with status 3" in rows["mlp_head"]["reason"]
    assert rows["conv_tanh"]["status"] == "timeout" and "--timeout 10" in rows["conv_tanh"]["reason"]
    assert rows["conv_sigmoid"]["status"] == "memory" and "MemoryError" in rows["conv_sigmoid"]["reason"]
    assert rows["broken"]["status"] == "error" and "\n" not in rows["broken"]["reason"]
    assert "mlp_head: crashed" in result.output
    for name in ("mlp_head", "conv_tanh", "conv_sigmoid"):
        assert not (out / b.model_file(name)).exists()
    # crashes, timeouts and memory failures are not cached: the next run (without the hooks) does them, and only
    # them; the broken model's error is cached (the same input gives the same error)
    again = _batch([zoo, "-o", out, "-j", "2"])
    summary = json.loads((out / "summary.json").read_text())
    assert again.exit_code == 2, again.output
    assert summary["counts"]["ok"] == 4 and summary["counts"]["error"] == 1 and summary["cached"] == 2


def test_workers_are_reused_and_recycled(tmp_path):
    zoo = _zoo(tmp_path, ("conv_relu", "mlp_head"))
    entries = b.collect([zoo], b.ModelOptions())
    versions = b.library_versions()
    jobs = [b.make_job(e, b.cache_key(e, versions)) for e in entries]
    out = b.Outdir(tmp_path / "reused")
    out.prepare()
    rows = b.run_local(jobs, out, workers=1)
    assert len({r["worker_pid"] for r in rows}) == 1 and all(r["status"] == "ok" for r in rows)
    out = b.Outdir(tmp_path / "recycled")
    out.prepare()
    rows = b.run_local(jobs, out, workers=1, recycle_bytes=1)  # any resident memory is too much: a fresh worker
    assert len({r["worker_pid"] for r in rows}) == 2 and all(r["status"] == "ok" for r in rows)


def test_shards_are_stable_disjoint_and_complete():
    names = [f"family{i // 7}/model_{i}" for i in range(200)]
    shards = [[n for n in names if b.in_shard(n, (k, 4))] for k in range(1, 5)]
    assert sorted(n for s in shards for n in s) == sorted(names)
    assert all(15 < len(s) < 85 for s in shards)
    more = names + [f"new/model_{i}" for i in range(50)]  # adding models moves none of the others
    for k in range(1, 5):
        assert [n for n in more if b.in_shard(n, (k, 4)) and n in names] == shards[k - 1]
    for bad in ("0/2", "3/2", "a/b", "2"):
        with pytest.raises(b.InputError, match="--shard"):
            b.parse_shard(bad)


def test_shard_runs_merge_into_the_full_summary(first_run, tmp_path):
    zoo, out, _ = first_run
    parts = []
    for k in (1, 2):
        result = _batch([zoo, "-o", out, "--shard", f"{k}/2"])  # everything is cached: no work, the summary only
        assert result.exit_code == 0, result.output
        shard = tmp_path / f"shard{k}.json"
        shard.write_text((out / f"summary.shard-{k}-of-2.json").read_text())
        parts.append(json.loads(shard.read_text()))
    assert sorted(r["name"] for p in parts for r in p["models"]) == sorted(["sub/conv_relu", "mlp_head",
                                                                            "resnet_block"])
    merged_dir = tmp_path / "merged"
    result = _batch(["--merge", tmp_path / "shard1.json", tmp_path / "shard2.json", "-o", merged_dir])
    assert result.exit_code == 0, result.output
    merged = json.loads((merged_dir / "summary.json").read_text())
    jsonschema.validate(merged, b.schema())
    assert [r["name"] for r in merged["models"]] == sorted(r["name"] for p in parts for r in p["models"])
    assert merged["counts"]["ok"] == 3 and merged["shard"] is None
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 1}')
    result = _batch(["--merge", bad, "-o", merged_dir])
    assert result.exit_code == 2 and "not a valid onnxfuse batch summary" in result.output


def test_baseline_gate_fails_on_a_lost_fusion_or_grown_traffic_and_reports_added_and_removed(first_run, tmp_path):
    zoo, out, _ = first_run
    _batch([zoo, "-o", out])  # all cached; leaves the full summary
    current = json.loads((out / "summary.json").read_text())
    same = tmp_path / "same.json"
    same.write_text(json.dumps(current))
    result = _batch([zoo, "-o", out, "--baseline", same])
    assert result.exit_code == 0 and "regression" not in result.output, result.output

    old = json.loads(json.dumps(current))
    rows = {r["name"]: r for r in old["models"]}
    rows["mlp_head"]["fusion_kinds"]["FusedConv(Sigmoid) from Conv -> Sigmoid"] = 1
    grown = rows["resnet_block"]
    grown["after_bytes_expr"] = str(int(grown["after_bytes_expr"]) - 1000)
    removed = json.loads(json.dumps(grown))
    removed["name"] = "gone/model"
    old["models"] = [r for r in old["models"] if r["name"] != "sub/conv_relu"] + [removed]
    baseline = tmp_path / "old.json"
    baseline.write_text(json.dumps(old))
    result = _batch([zoo, "-o", out, "--baseline", baseline])
    assert result.exit_code == 1, result.output
    assert "regression: mlp_head: fusion lost: FusedConv(Sigmoid) from Conv -> Sigmoid (x1)" \
        in result.output
    assert "regression: resnet_block: " in result.output and "optimized traffic grew" in result.output
    assert "added since the baseline: sub/conv_relu" in result.output
    assert "removed since the baseline: gone/model" in result.output
    assert "REGRESSION" in (out / "summary.md").read_text()


@pytest.mark.parametrize(("text", "message"), [
    ('{"models": [{"path": "m.onnx", "colour": "red"}]}', "unknown field"),
    ('{"models": [{"path": "m.onnx", "target": "tpu"}]}', "unknown target"),
    ('{"models": [{"path": "missing.onnx"}]}', "does not exist"),
    ("[1, 2]", "expected"),
    ("{", "not JSON"),
])
def test_bad_manifest_is_a_one_line_error(tmp_path, text, message):
    (tmp_path / "m.onnx").write_bytes((SAMPLES / "conv_relu.onnx").read_bytes())
    manifest = tmp_path / "zoo.json"
    manifest.write_text(text)
    result = _batch([manifest, "-o", tmp_path / "out"])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


def test_csv_manifest_gives_per_model_options(tmp_path):
    (tmp_path / "m.onnx").write_bytes((SAMPLES / "conv_relu.onnx").read_bytes())
    manifest = tmp_path / "zoo.csv"
    manifest.write_text("path,input_shapes,input_values,target,ort_level\nm.onnx,x=1x3x8x8,,cpu,basic\n")
    (entry,) = b.collect([manifest], b.ModelOptions())
    assert entry.path == tmp_path / "m.onnx" and entry.name == "m"
    assert entry.options.to_dict() == {"target": "cpu", "ort_level": "basic", "input_shapes": {"x": [1, 3, 8, 8]},
                                       "input_values": {}, "verify": True}


def test_ctrl_c_leaves_only_complete_files(tmp_path):
    zoo = _zoo(tmp_path, ("conv_relu", "mlp_head", "conv_tanh"))
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO),
           b.TEST_HOOK_ENV: json.dumps({"conv_relu.onnx": "sleep:120", "conv_tanh.onnx": "sleep:120"})}
    proc = subprocess.Popen([sys.executable, "-m", "onnxfuse", "batch", str(zoo), "-o", str(out), "-j", "2"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    staging = out / b.STATE_DIR / "staging"
    cache = out / b.STATE_DIR / "cache"
    # jobs go in name order: conv_tanh (sleeps), mlp_head, sub/conv_relu (sleeps). Wait until mlp_head is committed
    # (its cache record is written last) and the two sleeping models are in their workers (staging folders exist)
    def stages() -> list[Path]:  # this run's staging folder holds one folder per model in a worker (and the
        # workers' temporary folders, tmp-*)
        runs = list(staging.iterdir()) if staging.is_dir() else []
        return [p for run in runs if run.is_dir() for p in run.iterdir() if not p.name.startswith("tmp-")]

    while time.monotonic() < deadline and not (cache.is_dir() and any(cache.iterdir()) and len(stages()) == 2):
        time.sleep(0.2)
    assert len(stages()) == 2
    assert proc.poll() is None, proc.communicate()
    os.killpg(proc.pid, signal.SIGINT)  # what the terminal sends on Ctrl-C: the whole foreground process group
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert [f for f in files if not f.startswith(b.STATE_DIR)] == [
        "models/mlp_head.onnx", "reports/mlp_head.html", "reports/mlp_head.json"]
    assert len([f for f in files if f.startswith(f"{b.STATE_DIR}/cache/")]) == 1
    assert not staging.exists()
    onnx.checker.check_model(onnx.load(str(out / "models/mlp_head.onnx")))


def test_ray_option_swallowing_an_input_no_input_or_merge_with_shard_is_a_one_line_error(tmp_path):
    zoo = _zoo(tmp_path, ("conv_relu",))
    result = _batch(["--ray", zoo, "-o", tmp_path / "out"])
    assert result.exit_code == 2 and "not a Ray address; write --ray=ADDRESS" in result.output
    result = _batch(["-o", tmp_path / "out"])
    assert result.exit_code == 2 and "give at least one model" in result.output
    result = _batch(["--merge", "--shard", "1/2", tmp_path / "summary.json", "-o", tmp_path / "out"])
    assert result.exit_code == 2 and "--merge and --shard contradict each other" in result.output


def test_sizes_and_default_jobs():
    assert b.parse_size("512M") == 512 * 2**20 and b.parse_size("2G") == 2 * 2**30
    assert b.parse_size("1.5GiB") == 3 * 2**29 and b.parse_size("1000") == 1000
    for bad in ("", "G", "-1G", "lots"):
        with pytest.raises(b.InputError, match="--max-memory"):
            b.parse_size(bad)
    cores = len(os.sched_getaffinity(0))
    assert b.default_jobs(max_memory=1) == cores  # memory does not bind: every core
    assert b.default_jobs(max_memory=2**50) == 1  # a petabyte a worker: memory binds, still one worker


def test_the_summary_carries_no_absolute_path(first_run):
    """summary.json, summary.md and index.html are CI artifacts: no path of this machine in them."""
    zoo, out, _ = first_run
    for name in ("summary.json", "summary.md", "index.html"):
        text = (out / name).read_text(encoding="utf-8")
        assert str(zoo) not in text and str(out) not in text, name
