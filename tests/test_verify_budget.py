"""Verification's budget (issue 35, item 4): counted in work (this process's CPU seconds, ``--verify-budget``), so
the verdict does not depend on the machine's load; the wall-clock ``--verify-timeout`` is a safety stop reported
apart (cause ``time``); one budget for verification and the comparison with onnxruntime's graphs; one onnxruntime
session per model and optimization level in a run.

A loaded machine is simulated, never made: sessions and runs that sleep (wall time, no CPU time) and a wall clock
that runs fast (:data:`onnxfuse.verification.run.WALL_CLOCK`); the work is counted by a fake clock
(:data:`onnxfuse.verification.run.WORK_CLOCK`) where a test needs it to run out at a known point.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import onnx
import onnxruntime as ort
import pytest

from onnxfuse import pipeline
from onnxfuse.errors import InputError
from onnxfuse.ort import sessions as runtime
from onnxfuse.ort.levels import GRAPH_OPTIMIZATION_LEVELS
from onnxfuse.verification import run as verify_run
from onnxfuse.verification import verify
from onnxfuse.verification.options import DEFAULT_WORK_S, VerifyOptions, work_seconds
from tests.test_verify import conv_model, deep_net, invoke, loop_forever_model, save

#: How long each simulated session build and run of the "loaded machine" waits, in seconds of wall time.
SLOW_S = 0.05
#: How many times faster than real time the "loaded machine"'s wall clock runs.
WALL_SPEEDUP = 1000.0


@pytest.fixture
def slowed(monkeypatch):
    """A machine that looks loaded: every session build and run waits SLOW_S (sleeping: wall time, no CPU time)
    and the wall clock runs WALL_SPEEDUP x faster, so a wall-clock budget of seconds is spent at once."""
    real_session, real_run = runtime.session, runtime.run_watched

    def session(*args, **kwargs):
        time.sleep(SLOW_S)
        return real_session(*args, **kwargs)

    def run_watched(*args, **kwargs):
        time.sleep(SLOW_S)
        return real_run(*args, **kwargs)

    monkeypatch.setattr(runtime, "session", session)
    monkeypatch.setattr(runtime, "run_watched", run_watched)
    start = time.monotonic()
    monkeypatch.setattr(verify_run, "WALL_CLOCK", lambda: start + (time.monotonic() - start) * WALL_SPEEDUP)


def _verdict(v) -> dict:
    """What a verification concludes (everything in its dict that is not a measured time)."""
    return v.to_dict()


def test_the_verdict_is_the_same_when_the_machine_is_slowed(request):
    candidate = conv_model(bias_shift=1e-7)
    quiet = verify.verify_models(conv_model(), candidate, VerifyOptions(work=DEFAULT_WORK_S, timeout=None))
    assert quiet.status == "passed"
    request.getfixturevalue("slowed")
    loaded = verify.verify_models(conv_model(), candidate, VerifyOptions(work=DEFAULT_WORK_S, timeout=None))
    assert _verdict(loaded) == _verdict(quiet)


def test_a_wall_clock_budget_alone_would_change_the_verdict_when_slowed(slowed):
    """The simulation does slow the wall clock enough to matter: the same verification with only a wall-clock
    limit (the old rule) is stopped, and says it was the safety stop."""
    v = verify.verify_models(conv_model(), conv_model(bias_shift=1e-7), VerifyOptions(work=None, timeout=5))
    assert v.status == "skipped" and v.cause == "time"
    assert "--verify-timeout" in v.reason and "wall time" in v.reason


class _WorkCounter:
    """A fake CPU clock: one unit of work per session built, nothing else (the work of a run is not counted)."""

    def __init__(self, monkeypatch):
        self.used = 0.0
        real = runtime.session

        def session(*args, **kwargs):
            self.used += 1.0
            return real(*args, **kwargs)

        monkeypatch.setattr(runtime, "session", session)
        monkeypatch.setattr(verify_run, "WORK_CLOCK", lambda: self.used)


def test_a_spent_work_budget_is_skipped_for_work_and_the_same_when_slowed(monkeypatch, request):
    _WorkCounter(monkeypatch)
    opts = VerifyOptions(work=1.5, timeout=None)  # the original's session fits, then the work is spent
    first = verify.verify_models(conv_model(), conv_model(bias_shift=1e-7), opts)
    assert first.status == "skipped" and first.cause == "work"
    assert "--verify-budget" in first.reason and "CPU" in first.reason
    assert first.hint == "give it more work with --verify-budget CPU-SECONDS"
    request.getfixturevalue("slowed")
    again = verify.verify_models(conv_model(), conv_model(bias_shift=1e-7), opts)
    assert _verdict(again) == _verdict(first)


def test_a_loop_that_never_ends_spends_the_work_budget(tmp_path):
    """Real CPU time: a Loop of 10^12 iterations works until the budget is spent, then stops (not a hang)."""
    path = save(tmp_path, loop_forever_model())
    out, report = tmp_path / "o.onnx", tmp_path / "r.json"
    result = invoke("optimize", path, out, "--target", "cpu", "--verify-budget", "0.5", "--report", report)
    assert result.exit_code == 0, result.output
    v = json.loads(report.read_text())["verification"]
    assert v["status"] == "skipped" and v["cause"] == "work" and v["reason"].startswith("work")
    warning = next(line for line in result.stderr.splitlines() if line.startswith("warning: NOT VERIFIED"))
    assert "--verify-budget" in warning


@pytest.mark.parametrize("value", [-1, float("nan"), float("inf"), True, "10"])
def test_work_seconds_refuses_what_is_not_a_number_of_cpu_seconds(value):
    with pytest.raises(InputError, match="verify budget"):
        work_seconds(value)


def test_work_seconds_default_and_no_limit():
    assert work_seconds(None) == DEFAULT_WORK_S and work_seconds(0) is None and work_seconds(2) == 2.0
    assert VerifyOptions().work == DEFAULT_WORK_S


@pytest.mark.parametrize(("extra", "message"), [
    ([], "--verify-budget must be a finite number"),
    (["--no-verify"], "--no-verify and --verify-budget contradict each other"),  # cli/args/conflicts.py
])
def test_the_command_refuses_a_budget_that_is_not_finite(tmp_path, extra, message):
    result = invoke("optimize", "sample_models/resnet_block.onnx", tmp_path / "o.onnx", "--verify-budget", "inf",
                    *extra)
    assert result.exit_code == 2 and message in result.output
    assert not (tmp_path / "o.onnx").exists()


def test_a_negative_budget_is_a_usage_error(tmp_path):
    result = invoke("optimize", "sample_models/resnet_block.onnx", tmp_path / "o.onnx", "--verify-budget", "-1")
    assert result.exit_code == 2 and "--verify-budget" in result.output


def test_the_api_takes_the_budget_and_refuses_a_negative_one():
    import onnxfuse

    with pytest.raises(InputError, match="verify budget"):
        onnxfuse.verify(conv_model(), conv_model(), verify_budget=-1)
    assert onnxfuse.verify(conv_model(), conv_model(bias_shift=1e-7), verify_budget=0).status == "passed"


def test_the_help_names_the_budget_and_its_default():
    text = " ".join(invoke("optimize", "--help").output.split())
    assert "--verify-budget" in text and f"[default: {DEFAULT_WORK_S:g}]" in text
    assert "safety stop" in text


def test_verification_and_the_comparison_share_one_budget(monkeypatch, tmp_path):
    """Verification's two sessions fit the budget; the comparison's first session spends it: the verdict stands
    and the comparison says why it is missing."""
    path = tmp_path / "block.onnx"
    onnx.save(deep_net(blocks=1, gain=1.0), path)  # no noise-floor session needed
    counter = _WorkCounter(monkeypatch)
    result = pipeline.optimize(path, pipeline.Options(), VerifyOptions(work=2.5, timeout=None))
    assert result.report.verification.status == "passed"
    assert counter.used == 3  # original, candidate, then the original at ORT_ENABLE_ALL: no fourth
    doc = result.report.to_dict()["onnxruntime"]
    assert doc["status"] != "compared" and "budget" in json.dumps(doc) and "--verify-budget" in json.dumps(doc)


def test_without_a_budget_spent_the_comparison_is_made(monkeypatch, tmp_path):
    path = tmp_path / "block.onnx"
    onnx.save(deep_net(blocks=1, gain=1.0), path)
    counter = _WorkCounter(monkeypatch)
    result = pipeline.optimize(path, pipeline.Options(), VerifyOptions(work=4.5, timeout=None))
    assert counter.used == 4 and result.report.to_dict()["onnxruntime"]["status"] == "compared"


# --- one session per model and level ---------------------------------------------------------------------------

_LEVEL_NAMES = {getattr(ort.GraphOptimizationLevel, v): k for k, v in GRAPH_OPTIMIZATION_LEVELS.items()}


@pytest.fixture
def sessions(monkeypatch):
    """(digest of the model, level) of every onnxruntime InferenceSession built, and what it was built from
    (``path`` or ``bytes``): onnxruntime's own constructor is patched, so every session of onnxfuse counts."""
    made: list[tuple[str, str, str]] = []
    real = ort.InferenceSession

    def counting(model, sess_options=None, *args, **kwargs):
        data = model if isinstance(model, bytes) else Path(model).read_bytes()
        level = _LEVEL_NAMES[sess_options.graph_optimization_level]
        made.append((hashlib.sha256(data).hexdigest()[:12], level, "bytes" if isinstance(model, bytes) else "path"))
        return real(model, sess_options, *args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", counting)
    return made


def _per_model_and_level(made) -> dict:
    counts: dict = {}
    for digest, level, _ in made:
        counts[(digest, level)] = counts.get((digest, level), 0) + 1
    return counts


@pytest.mark.parametrize("blocks, gain", [(20, 100.0), (1, 1.0)])  # with and without the noise-floor session
def test_one_session_per_model_and_level(sessions, tmp_path, blocks, gain):
    path = tmp_path / "net.onnx"
    onnx.save(deep_net(blocks=blocks, gain=gain), path)
    result = pipeline.optimize(path, pipeline.Options(), VerifyOptions())
    assert result.report.verification.status == "passed"
    assert result.report.to_dict()["onnxruntime"]["status"] == "compared"
    counts = _per_model_and_level(sessions)
    assert set(counts.values()) == {1}, counts
    assert sorted(level for _, level in counts) == ["all", "all", "disable", "disable"]


def test_a_caller_proto_is_loaded_from_one_file_not_from_bytes(sessions):
    """The API's ModelProto: verification's and the comparison's sessions of the original load one temporary file
    (its path), not a serialized copy each."""
    import onnxfuse

    result = onnxfuse.optimize(deep_net(blocks=20), target="cpu")
    assert result.verification.status == "passed"
    assert {how for _, _, how in sessions} == {"path"}
    assert set(_per_model_and_level(sessions).values()) == {1}


def test_the_comparison_after_the_culprit_search_reuses_the_original_side(monkeypatch):
    """runtime_graphs given an earlier result for the same original and level makes no session of the original."""
    from onnxfuse.ort import optimized_graph as ort_graph

    model = deep_net(blocks=2, gain=1.0)
    first = ort_graph.runtime_graphs(model.SerializeToString(), model, "all")
    assert first.available
    built = []
    real = ort_graph._optimized_graph
    monkeypatch.setattr(ort_graph, "_optimized_graph", lambda src, level: built.append(level) or real(src, level))
    again = ort_graph.runtime_graphs(b"", model, "all", original_of=first)
    assert built == ["all"]  # the optimized model's only
    assert again.original_ops == first.original_ops and again.original_tensors == first.original_tensors
    assert again.optimized_ops == first.optimized_ops


def test_the_culprit_search_and_the_remainder_reuse_the_original_sessions(sessions, monkeypatch, tmp_path):
    """A failed verification, its culprit search and the remainder's verification: the original's session at
    ORT_DISABLE_ALL (the reference, which also writes the graph of the comparison at level ``disable``) and its
    noise-floor session are made once for all of them, not once each."""
    from tests.test_culprits import Mutant, chain_model, inject, pick_site

    path = tmp_path / "chain.onnx"
    onnx.save(chain_model(), path)
    options = pipeline.Options(target="cpu", ort_level="disable", drop_culprits=True)
    correct = pipeline.optimize(path, options, VerifyOptions())
    pass_name, site = pick_site(correct.fusions, "drop_bias", correct.model)
    inject(monkeypatch, Mutant("drop_bias", pass_name, site=site))
    sessions.clear()
    result = pipeline.optimize(path, options, VerifyOptions())
    v = result.verification
    assert v.status == "passed" and len(v.culprits) == 1 and v.remainder["status"] == "passed"
    original = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    of_original = {level: n for (digest, level), n in _per_model_and_level(sessions).items() if digest == original}
    assert of_original == {"disable": 1, "all": 1}, of_original  # the reference and the noise floor, once each
    assert v.culprit_search["sessions"] == v.culprit_search["verifications"]  # the original's were kept


@pytest.mark.parametrize("level", ["disable", "extended"])
def test_one_session_per_model_and_level_at_other_comparison_levels(sessions, tmp_path, level):
    """At level ``disable`` verification's own sessions write the comparison's graphs; at ``extended`` the
    comparison makes its two sessions and verification its own (other levels)."""
    path = tmp_path / "net.onnx"
    onnx.save(deep_net(blocks=20), path)
    result = pipeline.optimize(path, pipeline.Options(ort_level=level), VerifyOptions())
    assert result.report.verification.status == "passed"
    doc = result.report.to_dict()["onnxruntime"]
    assert doc["status"] == "compared"
    assert set(_per_model_and_level(sessions).values()) == {1}, _per_model_and_level(sessions)
    assert doc == pipeline.analyse(path, pipeline.Options(ort_level=level)).report.to_dict()["onnxruntime"]


def test_a_run_is_stopped_by_the_watcher_with_the_exception_it_names():
    """run_watched: a Loop of 10^12 iterations stops once ``spent`` says so, raising what it returned."""
    sess = runtime.session(loop_forever_model().SerializeToString(), spinning=False)
    feeds = runtime.make_inputs(sess, {}, 0)
    calls = []

    def spent():
        calls.append(1)
        return runtime.WorkSpent("spent") if len(calls) > 3 else None

    with pytest.raises(runtime.WorkSpent):
        runtime.run_watched(sess, feeds, spent, 0.01)
    assert len(calls) == 4  # before the run, then from the watcher until it fired


def test_the_work_limit_is_named_first_when_both_are_spent(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(verify_run, "WORK_CLOCK", lambda: now[0])
    monkeypatch.setattr(verify_run, "WALL_CLOCK", lambda: now[0])
    budget = verify_run.Budget(timeout=1, work=1)
    assert budget.spent() is None
    now[0] = 10.0  # both limits passed
    assert isinstance(budget.spent(), runtime.WorkSpent)
    wall_only = verify_run.Budget(timeout=1, work=None)
    now[0] = 20.0
    assert type(wall_only.spent()) is runtime.RunTimeout  # the safety stop, not the work budget
    assert verify_run.Budget(timeout=None, work=None).unlimited()
