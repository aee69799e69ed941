"""``onnxfuse batch`` against hostile inputs (issue 36, the batch half; issue 30's batch items): the cache never
serves an output not made from the current input; damaged or poisoned cache records, summaries, baselines and
manifests are misses or one-line exit-2 errors; FIFOs, devices and files outside the model's folder are refused
unread; names reach Markdown, HTML and the terminal escaped, links percent-encoded, no absolute path in a reason;
a model given twice is one row; a skipped verification is never ``ok``; shards merge only as one complete set,
with working links; workers die with the driver and leave no temporary files.

Each test fails on the code before its fix. Worker processes import onnxfuse once each (seconds): the tests that
run models use few, small sample models.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import unquote

import jsonschema
import onnx
import pytest
from click.testing import CliRunner

from onnxfuse import batch as b
from onnxfuse.cli.main import main
from onnxfuse.report.escape import url_path
from tests.conftest import REPO

SAMPLES = REPO / "sample_models"


def _batch(args, env=None):
    result = CliRunner().invoke(main, ["batch", *map(str, args)], env=env)
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def _one_line_error(result, code: int = 2) -> str:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.output
    return errors[0]


def _copy(name: str, to: Path) -> Path:
    to.parent.mkdir(parents=True, exist_ok=True)
    to.write_bytes((SAMPLES / f"{name}.onnx").read_bytes())
    return to


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """One batch of two sample models: (zoo, OUTDIR, summary)."""
    tmp = tmp_path_factory.mktemp("hostile")
    zoo = tmp / "zoo"
    for name in ("conv_relu", "mlp_head"):
        _copy(name, zoo / f"{name}.onnx")
    out = tmp / "out"
    result = _batch([zoo, "-o", out, "-j", "2"])
    assert result.exit_code == 0, result.output
    return zoo, out, json.loads((out / "summary.json").read_text())


# ------------------------------------------------------------------------------------------------ the cache

def test_the_cache_never_serves_another_revisions_output(tmp_path):
    """A -> B -> A under one name: the third run must not serve B's output (the stale record of A named the same
    file, which B's run had replaced)."""
    zoo, out = tmp_path / "zoo", tmp_path / "out"
    model = _copy("conv_relu", zoo / "m.onnx")
    assert _batch([zoo, "-o", out]).exit_code == 0
    first = (out / "models/m.onnx").read_bytes()
    model.write_bytes((SAMPLES / "conv_tanh.onnx").read_bytes())
    assert _batch([zoo, "-o", out]).exit_code == 0
    assert (out / "models/m.onnx").read_bytes() != first
    _copy("conv_relu", model)
    result = _batch([zoo, "-o", out])
    assert result.exit_code == 0, result.output
    row = json.loads((out / "summary.json").read_text())["models"][0]
    assert row["cached"] is False and row["status"] == "ok"
    assert (out / "models/m.onnx").read_bytes() == first  # A's output again, made from A
    # and a fourth run, nothing changed, is a hit
    assert json.loads((out / "summary.json").read_text())["models"][0]["cached"] is False
    _batch([zoo, "-o", out])
    assert json.loads((out / "summary.json").read_text())["models"][0]["cached"] is True


def _poisons(record: dict) -> dict[str, bytes | None]:
    row = record["row"]
    return {
        "not json": b"{not json",
        "nan": json.dumps({**record, "row": {**row, "saved_bytes": math.nan}}).encode(),
        "infinity": json.dumps({**record, "row": {**row, "time_s": math.inf}}).encode(),
        "wrong type": json.dumps({**record, "row": {**row, "fusions": "many"}}).encode(),
        "row is a list": json.dumps({**record, "row": [row]}).encode(),
        "foreign key": json.dumps({**record, "key": "0" * 64}).encode(),
        "foreign kind": json.dumps({**record, "kind": "something-else"}).encode(),
        "old format (the row alone)": json.dumps(row).encode(),
        "a file outside OUTDIR": json.dumps({**record, "files": {**record["files"], "../../etc/passwd": "0"}}).encode(),
        "a link that is not batch's": json.dumps({**record, "row": {**row, "report_html": "javascript:x"},
                                                  "files": {**record["files"], "javascript:x": "0" * 64}}).encode(),
        "a changed digest": json.dumps({**record, "files": {k: "0" * 64 for k in record["files"]}}).encode(),
        "a fifo": None,
    }


@pytest.mark.parametrize("poison", list(_poisons({"row": {}, "files": {}})))
def test_a_damaged_or_poisoned_cache_record_is_a_miss(ran, tmp_path, poison):
    _, out, summary = ran
    key = summary["models"][0]["key"]
    record_path = out / b.STATE_DIR / "cache" / f"{key}.json"
    record = json.loads(record_path.read_text())
    assert b.Outdir(out).cached(key) is not None
    copy = tmp_path / "out"
    (copy / b.STATE_DIR / "cache").mkdir(parents=True)
    for rel in record["files"]:
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        (copy / rel).write_bytes((out / rel).read_bytes())
    data = _poisons(record)[poison]
    target = copy / b.STATE_DIR / "cache" / f"{key}.json"
    if data is None:
        os.mkfifo(target)
    else:
        target.write_bytes(data)
    assert b.Outdir(copy).cached(key) is None


def test_a_poisoned_cache_record_makes_the_model_run_again_exit_0(tmp_path):
    zoo, out = tmp_path / "zoo", tmp_path / "out"
    _copy("conv_relu", zoo / "m.onnx")
    assert _batch([zoo, "-o", out]).exit_code == 0
    (record,) = (out / b.STATE_DIR / "cache").iterdir()
    doc = json.loads(record.read_text())
    doc["row"]["saved_bytes"] = math.nan
    record.write_text(json.dumps(doc))
    result = _batch([zoo, "-o", out])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["models"][0]["cached"] is False
    jsonschema.validate(summary, b.schema())


# ------------------------------------------------------------------------------------------------ files

def _with_external_data(folder: Path) -> Path:
    """conv_relu with its weights in ``w.data`` beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    model = onnx.load(str(SAMPLES / "conv_relu.onnx"))
    onnx.save_model(model, str(folder / "m.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="w.data", size_threshold=0)
    return folder / "m.onnx"


@pytest.mark.parametrize("kind", ["fifo", "dev-zero-link"])
def test_external_data_that_is_no_regular_file_is_refused_without_hanging(tmp_path, kind):
    model = _with_external_data(tmp_path / "zoo")
    data = model.parent / "w.data"
    data.unlink()
    if kind == "fifo":
        os.mkfifo(data)
    else:
        data.symlink_to("/dev/zero")
    proc = subprocess.run([sys.executable, "-m", "onnxfuse", "batch", str(model.parent), "-o", str(tmp_path / "out")],
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    row = json.loads((tmp_path / "out" / "summary.json").read_text())["models"][0]
    assert row["status"] == "error" and "not a regular file" in row["reason"] and "w.data" in row["reason"]


@pytest.mark.parametrize("location", ["../outside.data", "/dev/zero", "sub/../../outside.data"])
def test_batch_never_opens_a_file_outside_the_model_folder(tmp_path, location):
    model = _with_external_data(tmp_path / "zoo")
    proto = onnx.load(str(model), load_external_data=False)
    for t in proto.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = location
    onnx.save_model(proto, str(model))
    outside = tmp_path / "outside.data"
    outside.write_bytes((model.parent / "w.data").read_bytes())
    opened: list[str] = []

    def audit(event, args):
        if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
            opened.append(os.fsdecode(args[0]))

    sys.addaudithook(audit)  # an audit hook cannot be removed: it only records
    entries = b.collect([model.parent], b.ModelOptions())
    start = len(opened)
    planned = b.plan([str(model.parent)], b.Outdir(tmp_path / "out"), b.ModelOptions(), None, b.library_versions())
    seen = opened[start:]
    assert entries and not planned.jobs and len(planned.refused) == 1
    assert "not a file inside the model's folder" in planned.refused[0]["reason"]
    assert not any(Path(p).resolve() in (outside.resolve(), Path("/dev/zero")) for p in seen), seen


# ------------------------------------------------------------------------------------------------ names

HOSTILE = ["javascript:alert(1)", "a#b%41?c=d", "esc\x1b[2Jclear", "line\n| injected | row |", "tick`|`pipe"]


def test_names_reach_markdown_html_and_the_terminal_escaped_and_links_encoded(tmp_path):
    zoo, out = tmp_path / "zoo", tmp_path / "out"
    for name in HOSTILE:
        _copy("conv_relu", zoo / f"{name}.onnx")
    (zoo / "broken.onnx").write_bytes(b"not a model")
    result = _batch([zoo, "-o", out, "-j", "2"])
    assert result.exit_code == 2, result.output  # broken.onnx is an error row
    assert "\x1b" not in result.output
    md = (out / "summary.md").read_text()
    html = (out / "index.html").read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert "\x1b" not in md and "\x1b" not in html
    table = [line for line in md.splitlines() if line.startswith("|")]
    assert len(table) == 2 + len(HOSTILE) + 1  # header, rule, one line per model: no injected row
    assert all(line.endswith("|") for line in table)
    assert 'href="javascript:' not in html and "](javascript:" not in md
    for row in summary["models"]:
        if row["status"] == "ok":
            link = url_path(row["report_html"])
            assert f"]({link})" in md and f'href="{link}"' in html.replace("&amp;", "&")
            assert (out / unquote(link)).is_file()  # the link leads to the report, # % ? included
    broken = next(r for r in summary["models"] if r["name"] == "broken")
    assert broken["status"] == "error"
    assert "broken.onnx" in broken["reason"]
    for text in (json.dumps(summary), md, html):  # artifacts (the terminal may name the OUTDIR it was given)
        assert str(tmp_path) not in text and str(REPO) not in text


def test_a_model_given_twice_is_one_row(tmp_path):
    zoo = tmp_path / "zoo"
    model = _copy("conv_relu", zoo / "m.onnx")
    link = zoo / "link.onnx"
    entries = b.collect([model, zoo, str(model)], b.ModelOptions())
    assert [e.name for e in entries] == ["m"]
    link.symlink_to(model)
    assert len(b.collect([zoo, model], b.ModelOptions())) == 1


# ------------------------------------------------------------------------------------------------ data errors

@pytest.mark.parametrize("manifest, message", [
    ('{"models": [{"path": 5}]}', "path must be a string"),
    ('{"models": [{"path": ["m.onnx"]}]}', "path must be a string"),
    ('{"models": [{"path": "m.onnx", "target": ["cpu"]}]}', "target must be a string"),
    ('{"models": [{"path": "m.onnx", "ort_level": {"x": 1}}]}', "ort_level must be a string"),
    ('{"models": [{"path": "m.onnx", "input_shapes": {"x": [1, true, 16, 16]}}]}', "positive integers"),
    ('{"models": [{"path": "m.onnx", "input_values": {"sr": NaN}}]}', "not JSON"),
    ("path,target\nm.onnx,cpu,extra\n", "unknown field"),
])
def test_a_manifest_field_of_the_wrong_type_is_a_one_line_error(tmp_path, manifest, message):
    _copy("conv_relu", tmp_path / "m.onnx")
    path = tmp_path / ("zoo.csv" if manifest.startswith("path,") else "zoo.json")
    path.write_text(manifest)
    assert message in _one_line_error(_batch([path, "-o", tmp_path / "out"]))


def test_a_summary_with_nan_merged_or_as_baseline_is_a_one_line_error(ran, tmp_path):
    zoo, out, _ = ran
    text = (out / "summary.json").read_text().replace('"wall_s": ', '"wall_s": NaN, "x": ', 1)
    bad = tmp_path / "nan.json"
    bad.write_text(text)
    assert "not JSON" in _one_line_error(_batch(["--merge", bad, "-o", tmp_path / "merged"]))
    assert "not JSON" in _one_line_error(_batch([zoo, "-o", out, "--baseline", bad]))


@pytest.mark.parametrize("change", [
    {"symbols": {"N": 5}},
    {"symbols": {"N": {"input": "x", "axis": "zero", "dim_param": None}}},
    {"after_bytes_expr": "__import__('os').system('true')"},
    {"saved_bytes_expr": "N**"},
    {"symbol_values": {"N": -1}},
])
def test_a_baseline_with_odd_symbols_or_expressions_is_a_one_line_error(ran, tmp_path, change):
    zoo, out, summary = ran
    old = json.loads(json.dumps(summary))
    old["models"][0].update(change)
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    assert "not a valid onnxfuse batch summary" in _one_line_error(_batch([zoo, "-o", out, "--baseline", path]))


# ------------------------------------------------------------------------------------------------ shards, merge

def test_shards_in_separate_folders_merge_with_working_links_and_in_one_folder_keep_their_summaries(ran, tmp_path):
    zoo, _, _ = ran
    for k in (1, 2):
        assert _batch([zoo, "-o", tmp_path / f"s{k}", "--shard", f"{k}/2"]).exit_code == 0
        assert _batch([zoo, "-o", tmp_path / "one", "--shard", f"{k}/2"]).exit_code == 0
    one = tmp_path / "one"
    both = [json.loads((one / f"summary.shard-{k}-of-2.json").read_text()) for k in (1, 2)]
    assert sorted(r["name"] for s in both for r in s["models"]) == ["conv_relu", "mlp_head"]
    assert not (one / "summary.json").exists()
    parts = [tmp_path / f"s{k}" / f"summary.shard-{k}-of-2.json" for k in (1, 2)]
    merged_dir = tmp_path / "merged"
    assert _batch(["--merge", *parts, "-o", merged_dir]).exit_code == 0
    merged = json.loads((merged_dir / "summary.json").read_text())
    assert [r["name"] for r in merged["models"]] == ["conv_relu", "mlp_head"]
    html = (merged_dir / "index.html").read_text()
    for r in merged["models"]:
        assert (merged_dir / r["report_html"]).is_file() and (merged_dir / r["output"]).is_file()
        assert f'href="{url_path(r["report_html"])}"' in html
    # the shards of one folder merge into it
    assert _batch(["--merge", *(one / f"summary.shard-{k}-of-2.json" for k in (1, 2)), "-o", one]).exit_code == 0
    for r in json.loads((one / "summary.json").read_text())["models"]:
        assert r["report_html"] == f"reports/{r['name']}.html" and (one / r["report_html"]).is_file()


def test_a_merge_checks_its_shards_form_one_complete_set(ran, tmp_path):
    _, _, summary = ran
    shard = {**summary, "shard": "1/3", "models": [r for r in summary["models"] if b.in_shard(r["name"], (1, 3))]}
    one = tmp_path / "one.json"
    one.write_text(json.dumps(shard))
    line = _one_line_error(_batch(["--merge", one, "-o", tmp_path / "m"]))
    assert "shards 2/3, 3/3 missing" in line
    assert "given twice" in _one_line_error(_batch(["--merge", one, one, "-o", tmp_path / "m"]))
    whole = tmp_path / "whole.json"
    whole.write_text(json.dumps(summary))
    assert "not a shard" in _one_line_error(_batch(["--merge", one, whole, "-o", tmp_path / "m"]))
    assert "in two of the summaries" in _one_line_error(_batch(["--merge", whole, whole, "-o", tmp_path / "m"]))
    (tmp_path / "odd.json").write_text(json.dumps({**shard, "shard": "4/3"}))
    assert "is not K/N" in _one_line_error(_batch(["--merge", one, tmp_path / "odd.json", "-o", tmp_path / "m"]))
    row = summary["models"][0]
    k = 2 if b.in_shard(row["name"], (1, 2)) else 1  # the shard the row does not belong to
    (tmp_path / "w1.json").write_text(json.dumps({**summary, "shard": f"{k}/2", "models": [row]}))
    (tmp_path / "w2.json").write_text(json.dumps({**summary, "shard": f"{3 - k}/2", "models": []}))
    line = _one_line_error(_batch(["--merge", tmp_path / "w1.json", tmp_path / "w2.json", "-o", tmp_path / "m"]))
    assert f"is not in shard {k}/2" in line


def test_a_merged_page_never_links_where_a_summary_says(ran, tmp_path):
    _, _, summary = ran
    evil = json.loads(json.dumps(summary))
    evil["models"][0]["report_html"] = "javascript:alert(1)"
    evil["models"][1]["report_html"] = "../../../etc/passwd"
    evil["engine"] = "local\x1b]0;title\x07"
    evil["versions"]["onnx"] = "1.0\x1b[2J"
    path = tmp_path / "evil.json"
    path.write_text(json.dumps(evil))
    assert _batch(["--merge", path, "-o", tmp_path / "m"]).exit_code == 0
    merged = json.loads((tmp_path / "m" / "summary.json").read_text())
    assert [r["report_html"] for r in merged["models"]] == [None, None]
    page = (tmp_path / "m" / "index.html").read_text()
    assert "javascript:" not in page.split("<script")[0] and "\x1b" not in page and "\x07" not in page
    assert "\x1b" not in (tmp_path / "m" / "summary.md").read_text()


# ------------------------------------------------------------------------------------------------ verification

@pytest.mark.parametrize("verification, status", [
    ({"status": "passed", "reason": None, "cause": None}, "ok"),
    ({"status": "unchanged", "reason": None, "cause": None}, "ok"),
    ({"status": "skipped", "reason": "--no-verify", "cause": "user"}, "unverified"),  # not verified: never ok
    ({"status": "partial", "reason": "output y: NaN on both sides", "cause": None}, "unverified"),
    ({"status": "skipped", "reason": "onnxruntime cannot run the original: x", "cause": "load"}, "unverified"),
    ({"status": "skipped", "reason": "onnxruntime: std::bad_alloc", "cause": "load"}, "memory"),
    ({"status": "skipped", "reason": "MemoryError: Unable to allocate 4 GiB", "cause": "inputs"}, "memory"),
    ({"status": "failed", "reason": "max abs diff 3", "cause": None}, "mismatch"),
])
def test_a_skipped_or_failed_verification_is_never_an_ok_row(verification, status):
    assert b._status_of(verification)[0] == status


def test_an_unverified_row_exits_1_and_shows_in_every_summary(ran, tmp_path):
    _, _, summary = ran
    doc = json.loads(json.dumps(summary))
    doc["models"][0].update(status="unverified", verification="skipped", reason="verification was skipped: x")
    path = tmp_path / "s.json"
    path.write_text(json.dumps(doc))
    result = _batch(["--merge", path, "-o", tmp_path / "m"])
    assert result.exit_code == 1, result.output
    merged = json.loads((tmp_path / "m" / "summary.json").read_text())
    assert merged["counts"]["unverified"] == 1 and merged["counts"]["ok"] == 1
    md = (tmp_path / "m" / "summary.md").read_text()
    assert "| verification |" in md and "| unverified | skipped |" in md
    assert "<th" in (html := (tmp_path / "m" / "index.html").read_text()) and ">verification</th>" in html


def test_symbolic_dims_give_figures_at_the_representative_sizes_never_0_b(tmp_path):
    zoo, out = tmp_path / "zoo", tmp_path / "out"
    zoo.mkdir()
    model = onnx.load(str(SAMPLES / "conv_relu.onnx"))
    for v in (*model.graph.input, *model.graph.output):
        v.type.tensor_type.shape.dim[0].dim_param = "batch"
        v.type.tensor_type.shape.dim[2].dim_param = "height"
    onnx.save(model, str(zoo / "sym.onnx"))
    result = _batch([zoo, "-o", out])
    summary = json.loads((out / "summary.json").read_text())
    row = summary["models"][0]
    assert row["representative_sizes"] and sorted(row["representative_sizes"].values()) == [1, 224], row
    assert row["saved_bytes"] and row["saved_bytes"] > 0 and summary["totals"]["saved_bytes"] == row["saved_bytes"]
    md = (out / "summary.md").read_text()
    assert "representative sizes: batch 1, 224 for the other dims" in md
    assert row["saved_bytes_beyond"] is not None  # onnxruntime makes this one fusion itself: a true 0 B
    assert f"| {b._human(row['saved_bytes'])} |" in md and "unknown" not in md
    assert "representative sizes" in result.output


# ------------------------------------------------------------------------------------------------ faults

def _children(pid: int) -> list[int]:
    """The process ids whose parent is ``pid`` (``/proc/PID/stat`` field 4, Linux proc(5))."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if int((p / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(p.name))
            except (OSError, IndexError, ValueError):
                pass
    return out


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process tree from /proc")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_workers_die_with_the_driver_and_leave_no_temporary_files(tmp_path, sig):
    zoo, out, tmp = tmp_path / "zoo", tmp_path / "out", tmp_path / "tmp"
    tmp.mkdir()
    for name in ("conv_relu", "conv_tanh"):
        _copy(name, zoo / f"{name}.onnx")
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp),
           b.TEST_HOOK_ENV: json.dumps({f"{n}.onnx": "tempfile-sleep:120" for n in ("conv_relu", "conv_tanh")})}
    proc = subprocess.Popen([sys.executable, "-m", "onnxfuse", "batch", str(zoo), "-o", str(out), "-j", "2"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    staging = out / b.STATE_DIR / "staging"
    deadline = time.monotonic() + 120

    def hook_folders() -> list[Path]:
        return [p for p in (*tmp.rglob("onnxfuse-hook-*"), *staging.rglob("onnxfuse-hook-*")) if p.is_dir()]

    while time.monotonic() < deadline and len(hook_folders()) < 2:  # both workers mid-model, with temp folders
        time.sleep(0.2)
    assert len(hook_folders()) == 2, proc.poll()
    workers = [p for p in _children(proc.pid) if _alive(p)]
    assert len(workers) >= 2
    os.kill(proc.pid, sig)  # the driver only, as a CI runner's kill or the OOM killer would
    proc.communicate(timeout=60)
    assert proc.returncode == (-signal.SIGKILL if sig == signal.SIGKILL else 128 + signal.SIGTERM)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(_alive(p) for p in workers):
        time.sleep(0.2)
    assert not any(_alive(p) for p in workers)
    assert not list(tmp.iterdir())  # nothing in the TMPDIR the driver was given
    if sig == signal.SIGTERM:
        assert not staging.exists()
    else:  # a SIGKILLed driver cannot clean up: the next run removes what it left
        assert hook_folders()
        _batch([zoo, "-o", out, "--no-verify"], env={b.TEST_HOOK_ENV: "{}"})
        assert not staging.exists() and not hook_folders()


def test_a_negative_saving_is_a_valid_row():
    """A model can move more bytes after onnxfuse (a float16 model's float32 body on --target cpu): its summary
    row is still valid, so that the summary batch wrote is always one its own --baseline and --merge read."""
    import jsonschema

    rows = jsonschema.Draft202012Validator(b.schema()["properties"]["models"]["items"])
    errors = [e.message for e in rows.iter_errors({"saved_bytes": -11783540, "saved_bytes_beyond": -5})
              if "minimum" in e.message or "less than" in e.message]
    assert errors == []


def test_a_no_verify_baseline_still_gates_and_an_older_ok_row_of_an_unverified_model_is_no_cache_hit(ran, tmp_path):
    """--no-verify rows are unverified, never ok: a --no-verify baseline still gates fusions and traffic
    (b.compare_summaries compares every row whose model was written), a row that is no longer written regresses,
    and a cache record an older onnxfuse wrote with an unverified model as ok is a miss (the model runs again)."""
    _, out, summary = ran
    old = json.loads(json.dumps(summary))
    for r in old["models"]:
        r.update(status="unverified", verification="skipped", reason="not verified: --no-verify")
    new = json.loads(json.dumps(old))
    assert b.compare_summaries(old, new)["regressed"] is False
    lost = json.loads(json.dumps(new))
    row = lost["models"][0]
    row["fusion_kinds"] = {}
    assert b.compare_summaries(old, lost)["models"][row["name"]]["regressed"]
    gone = json.loads(json.dumps(new))
    gone["models"][0].update(status="error", reason="x")
    assert b.compare_summaries(old, gone)["models"][gone["models"][0]["name"]]["lines"][0].startswith(
        "status: error (was unverified)")
    # a cache record holding an ok row of a model that was not verified (an older rule) is not served
    outdir = b.Outdir(out)
    good = summary["models"][0]
    assert outdir.cached(good["key"]) is not None
    record_path = outdir.cache / f"{good['key']}.json"
    record = json.loads(record_path.read_text())
    record["row"]["verification"] = "skipped"
    record_path.write_text(json.dumps(record))
    try:
        assert outdir.cached(good["key"]) is None
    finally:
        record["row"]["verification"] = good["verification"]
        record_path.write_text(json.dumps(record))
