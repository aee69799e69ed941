"""``onnxfuse batch --ray``: the same per-model task on a local Ray cluster started inside the test
(``ray.init(num_cpus=2)``), a worker killed mid-task and retried, a task that always dies, a task past its timeout.

Without Ray installed this module skips with one line, unless ``CI`` is set: then it fails, since ``.ci/run``
installs the ``ray`` extra.
"""

from __future__ import annotations

import json
import os

import jsonschema
import pytest
from click.testing import CliRunner

from onnxfuse import batch as b
from onnxfuse.cli.main import main
from tests.conftest import REPO

try:
    import ray
except ImportError:
    ray = None
    if not os.environ.get("CI"):
        pytest.skip("Ray tests skipped: pip install -e '.[ray]'", allow_module_level=True)

SAMPLES = REPO / "sample_models"


@pytest.fixture(scope="module")
def cluster():
    """A local Ray cluster of 2 CPUs for this module."""
    if ray is None:
        pytest.fail("Ray is required when CI is set (.ci/run installs onnxfuse[ray])", pytrace=False)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                                                  os.environ.get("PYTHONPATH")]))}})
    yield
    ray.shutdown()


def _zoo(tmp_path, names):
    zoo = tmp_path / "zoo"
    zoo.mkdir()
    for name in names:
        (zoo / f"{name}.onnx").write_bytes((SAMPLES / f"{name}.onnx").read_bytes())
    return zoo


def test_ray_batch_retries_a_killed_worker_and_writes_what_the_local_pool_writes(cluster, tmp_path):
    zoo = _zoo(tmp_path, ("conv_relu", "mlp_head"))
    marker = tmp_path / "killed-once"
    hooks = {"mlp_head.onnx": f"crash-once:{marker}"}
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["batch", str(zoo), "-o", str(out), "--ray"],
                                env={b.TEST_HOOK_ENV: json.dumps(hooks)})
    assert result.exit_code == 0, result.output
    assert marker.exists()  # the first attempt's worker died (os._exit) before the retry succeeded
    summary = json.loads((out / "summary.json").read_text())
    jsonschema.validate(summary, b.schema())
    assert summary["engine"] == "ray" and summary["counts"]["ok"] == 2
    for r in summary["models"]:
        assert r["status"] == "ok" and r["fusions"] >= 1
        assert (out / r["output"]).is_file() and (out / r["report_json"]).is_file()
        assert (out / r["report_html"]).is_file()
    assert not any(p.name.endswith(".tmp") for p in out.rglob("*"))
    # the same models on the local pool: the same rows but for times, memory and worker
    local = tmp_path / "local"
    assert CliRunner().invoke(main, ["batch", str(zoo), "-o", str(local), "-j", "1"]).exit_code == 0
    volatile = {"time_s", "peak_memory_bytes", "worker_pid"}
    rows = [{k: v for k, v in r.items() if k not in volatile} for r in summary["models"]]
    local_rows = [{k: v for k, v in r.items() if k not in volatile}
                  for r in json.loads((local / "summary.json").read_text())["models"]]
    assert rows == local_rows
    # a second run does no work
    again = CliRunner().invoke(main, ["batch", str(zoo), "-o", str(out), "--ray"])
    assert again.exit_code == 0 and json.loads((out / "summary.json").read_text())["cached"] == 2


def test_ray_task_that_always_dies_or_times_out_fails_that_model_only(cluster, tmp_path):
    zoo = _zoo(tmp_path, ("conv_relu", "mlp_head", "conv_tanh"))
    hooks = {"mlp_head.onnx": "crash", "conv_tanh.onnx": "sleep:120"}
    entries = b.collect([zoo], b.ModelOptions())
    versions = b.library_versions()
    jobs = [b.make_job(e, b.cache_key(e, versions), hooks) for e in entries]
    out = b.Outdir(tmp_path / "out")
    out.prepare()
    rows = {r["name"]: r for r in b.run_ray(jobs, out, timeout=15, max_retries=1)}
    assert rows["conv_relu"]["status"] == "ok"
    assert rows["mlp_head"]["status"] == "crashed" and "after 1 retries" in rows["mlp_head"]["reason"]
    assert rows["conv_tanh"]["status"] == "timeout" and "--timeout 15" in rows["conv_tanh"]["reason"]
    assert (out.path / b.model_file("conv_relu")).is_file()
    assert not (out.path / b.model_file("mlp_head")).exists() and not (out.path / b.model_file("conv_tanh")).exists()
