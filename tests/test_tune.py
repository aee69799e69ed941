"""``--tune`` (issue 31, item 2; :mod:`onnxfuse.tune`): each group of rewrites (one pass, one emitted form) timed
against the model with it left out, dropped only when the whole interval of the ratio lies below 1.0.

The decisions are tested with a fake timer injected through ``timer`` (no real timing is asserted: timings depend
on the processor and its load); one test runs the real onnxruntime timer on a tiny model and checks only that every
group is recorded and the output verifies.
"""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import onnx
import pytest
from click.testing import CliRunner

import onnxfuse
from onnxfuse import pipeline, tune
from onnxfuse.cli.main import main
from onnxfuse.errors import InputError
from onnxfuse.records import Reason
from onnxfuse.report import present
from onnxfuse.verification.options import VerifyOptions
from tests.builders import GraphBuilder
from tests.conftest import REPO, assert_same_outputs

SCHEMA = json.loads((REPO / "onnxfuse" / "report.schema.json").read_text())


def mixed_model() -> onnx.ModelProto:
    """x [1, 4, 8, 8] -> 2 x (Conv -> BatchNormalization -> LeakyRelu) -> Conv -> HardSwish -> Conv -> Relu:
    groups conv_batchnorm (fold), conv_activation FusedConv(LeakyRelu), FusedConv(HardSwish), FusedConv(Relu)."""
    b = GraphBuilder(seed=3)
    y = b.input("x", [1, 4, 8, 8])
    for _ in range(2):
        y = b.op("LeakyRelu", [b.bn(b.conv(y, 4, 4), 4)], alpha=0.1)
    y = b.op("HardSwish", [b.conv(y, 4, 4)])
    y = b.op("Relu", [b.conv(y, 4, 4)])
    return b.build(b.op("Identity", [y], name="y"))


def fake_timer(intervals: dict[str, tuple[float, float, float]], calls: list | None = None) -> tune.Timer:
    """A timer that answers each group by its form: ``(ratio, ci_low, ci_high)`` of time without / with it."""
    def timer(group, fused, alternative, seconds):
        if calls is not None:
            calls.append((group, fused, alternative, seconds))
        ratio, low, high = intervals.get(group.form, (1.0, 0.95, 1.05))
        return {"ratio": ratio, "ci_low": low, "ci_high": high, "ci_confidence": 0.999, "rounds": 20,
                "same_kernels": False, "input_shapes": {"x": [1, 4, 8, 8]}}

    return timer


def tuned(model: onnx.ModelProto, timer, level: str = "disable", **options) -> pipeline.Result:
    opts = pipeline.make_options(target="cpu", ort_level=level, tune=True, **options)
    return tune.optimize(None, opts, VerifyOptions(), loaded=_loaded(model), timer=timer)


def _loaded(model: onnx.ModelProto):
    from onnxfuse.model import io as model_io

    return model_io.load_proto(model)


def test_verdict_needs_the_whole_interval_on_one_side_of_one():
    assert tune.verdict(0.7, 0.99) == "dropped"
    assert tune.verdict(1.01, 1.3) == "kept"
    assert tune.verdict(0.9, 1.1) == "inconclusive" and tune.verdict(0.8, 1.0) == "inconclusive"
    assert tune.verdict(None, None) == "inconclusive"


def test_groups_are_one_pass_and_one_form_each():
    first = pipeline.optimize(None, pipeline.Options(target="cpu", ort_level="disable"), loaded=_loaded(mixed_model()))
    found = {(g.pass_name, g.form): len(g.sites) for g in tune.groups(first.fusions)}
    assert found == {("conv_batchnorm", "fold BatchNormalization"): 2,
                     ("conv_activation", "FusedConv(LeakyRelu)"): 2,
                     ("conv_activation", "FusedConv(HardSwish)"): 1,
                     ("conv_activation", "FusedConv(Relu)"): 1}
    sites = [s for g in tune.groups(first.fusions) for s in g.sites]
    assert sorted(sites) == sorted(f.site for f in first.fusions if f.pass_name not in tune.UNTUNED)
    assert any(f.pass_name == "remove_redundant" for f in first.fusions)  # the Identity: not timed


def test_fake_timer_keeps_drops_and_says_inconclusive():
    """The fake says: without FusedConv(HardSwish) faster (dropped), without the BN folds slower (kept), the rest
    undecided (inconclusive, fused as the rules say)."""
    model = mixed_model()
    calls: list = []
    timer = fake_timer({"FusedConv(HardSwish)": (0.8, 0.7, 0.9), "fold BatchNormalization": (1.3, 1.2, 1.4)}, calls)
    result = tuned(model, timer)
    section = result.report.to_dict()["tune"]
    verdicts = {(g["pass"], g["form"]): g["verdict"] for g in section["groups"]}
    assert verdicts == {("conv_batchnorm", "fold BatchNormalization"): "kept",
                        ("conv_activation", "FusedConv(LeakyRelu)"): "inconclusive",
                        ("conv_activation", "FusedConv(HardSwish)"): "dropped",
                        ("conv_activation", "FusedConv(Relu)"): "inconclusive"}
    assert section["level"] == "disable" and section["threads"] == 1 and section["provider"] == "CPUExecutionProvider"
    assert section["onnxruntime"] and section["input_shapes"] == {"x": [1, 4, 8, 8]}
    acts = [f.activation for f in result.fusions if f.op == "FusedConv"]
    assert "HardSwish" not in acts and acts.count("LeakyRelu") == 2 and "Relu" in acts
    assert any(n.op_type == "HardSwish" for n in result.model.graph.node)
    assert result.verification.status == "passed"
    assert_same_outputs(model, result.model)
    # each group timed against the model as it stands: the group after the dropped one against its alternative
    dropped_at = next(i for i, c in enumerate(calls) if c[0].form == "FusedConv(HardSwish)")
    assert calls[dropped_at + 1][1] is calls[dropped_at][2]
    jsonschema.validate(json.loads(result.report.to_json()), SCHEMA, cls=jsonschema.Draft202012Validator)
    line = present.tune_line(result.report.to_dict())
    assert line is not None and "4 groups, 1 dropped" in line and "1 kept" in line and "2 inconclusive" in line
    section = next(s for s in present.document(result.report, show_all=True).sections if s.id == "tune")
    rows = [[getattr(c, "text", "") for c in row] for row in section.rows]
    assert len(rows) == 4 and any(r[1] == "FusedConv(HardSwish)" and r[2] == "1" and r[6] == "dropped" for r in rows)


def test_skip_slower_when_measured():
    """A dropped group's sites are left unfused with their own reason, its remedy from records.py, and the
    sentence names the ratio, the interval and where it was measured."""
    model = mixed_model()
    result = tuned(model, fake_timer({"FusedConv(LeakyRelu)": (0.9, 0.85, 0.95)}))
    left = [s for s in result.skips if s.reason == Reason.SLOWER_WHEN_MEASURED]
    assert len(left) == 2 and all(s.pass_name == "conv_activation" for s in left)
    assert all("0.900x" in s.detail and "0.850-0.950" in s.detail and "level disable" in s.detail for s in left)
    rows = [u for u in result.report.to_dict()["unfused"] if u["reason"] == "slower-when-measured"]
    assert len(rows) == 2
    assert "--tune" in Reason.SLOWER_WHEN_MEASURED.remedy
    assert sum(n.op_type == "LeakyRelu" for n in result.model.graph.node) == 2
    assert result.verification.status == "passed"
    assert_same_outputs(model, result.model)


def test_budget_spent_leaves_groups_untimed_and_fused():
    """No budget left for a group: not timed, inconclusive, the rule's choice kept (a fake clock spends it)."""
    model = mixed_model()
    now = [0.0]

    def slow_timer(group, fused, alternative, seconds):
        now[0] += 100.0  # the first group takes the whole budget
        return fake_timer({})(group, fused, alternative, seconds)

    opts = pipeline.make_options(target="cpu", ort_level="disable", tune=True, tune_budget=5)
    tuner = lambda *a: tune.decide(*a, timer=slow_timer, clock=lambda: now[0])  # noqa: E731
    result = pipeline.optimize(None, opts, VerifyOptions(), loaded=_loaded(model), tuner=tuner)
    groups = result.report.to_dict()["tune"]["groups"]
    assert groups[0]["rounds"] == 20 and all(g["rounds"] == 0 and g["ratio"] is None for g in groups[1:])
    assert all(g["verdict"] == "inconclusive" and "budget" in g["note"] for g in groups[1:])
    assert not any(s.reason == Reason.SLOWER_WHEN_MEASURED for s in result.skips)


def test_real_timer_records_every_group_and_the_output_verifies():
    """onnxruntime's own timing on a tiny model: whatever it decides (not asserted), every group is recorded and
    the output verifies against the original."""
    model = mixed_model()
    result = onnxfuse.optimize(model, target="cpu", tune=True, tune_budget=2, ort_level="all")
    first = pipeline.optimize(None, pipeline.Options(target="cpu"), loaded=_loaded(model))
    recorded = {(g["pass"], g["form"], g["sites"]) for g in result.report.to_dict()["tune"]["groups"]}
    assert recorded == {(g.pass_name, g.form, len(g.sites)) for g in tune.groups(first.fusions)}
    assert all(g["verdict"] in tune.VERDICTS for g in result.report.to_dict()["tune"]["groups"])
    assert result.verification.status == "passed"
    assert_same_outputs(model, result.model)


def test_no_tune_section_without_tune_and_options_checked():
    model = mixed_model()
    plain = onnxfuse.optimize(model, target="cpu", ort_level="disable")
    assert "tune" not in plain.report.to_dict() and present.tune_line(plain.report.to_dict()) is None
    for bad in ({"tune_budget": 0}, {"tune_budget": float("inf")}, {"threads": 0}, {"threads": 1.5},
                {"tune": "yes"}):
        with pytest.raises(InputError):
            pipeline.make_options(**bad)
    with pytest.raises(InputError, match="tune_budget"):
        onnxfuse.optimize(model, tune=True, tune_budget=-1)
    with pytest.raises(TypeError, match="tune"):  # pipeline alone has no timer: tune.optimize passes one
        pipeline.optimize(None, pipeline.make_options(tune=True), loaded=_loaded(model))


def test_cli_tune_writes_the_section_and_refuses_a_bad_budget(tmp_path):
    src, out, report = tmp_path / "m.onnx", tmp_path / "o.onnx", tmp_path / "r.json"
    onnx.save(mixed_model(), src)
    bad = CliRunner().invoke(main, ["optimize", str(src), str(out), "--tune", "--tune-budget", "0"])
    assert bad.exit_code == 2 and not out.exists()
    ok = CliRunner().invoke(main, ["optimize", str(src), str(out), "--target", "cpu", "--tune", "--tune-budget",
                                   "2", "--threads", "1", "--report", str(report)])
    assert ok.exit_code == 0, ok.output
    doc = json.loads(report.read_text())
    jsonschema.validate(doc, SCHEMA, cls=jsonschema.Draft202012Validator)
    assert doc["tune"]["groups"] and doc["verification"]["status"] == "passed"
    assert "tuned by measurement (--tune" in ok.output


def test_every_rewrite_form_has_a_measured_speed_rule_and_names_its_group():
    """Each canonicalization of issue 31 has its form in the speed rules' data (``providers.REWRITE_FORMS``),
    timed by ``benchmarks/bench_forms.py`` at every level, and --tune's group of it carries that name."""
    import importlib.util

    from onnxfuse.ort.providers import REWRITE_FORMS

    spec = importlib.util.spec_from_file_location("bench_forms", REPO / "benchmarks" / "bench_forms.py")
    assert spec is not None and spec.loader is not None
    bench_forms = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_forms)
    for pass_name, form in REWRITE_FORMS.items():
        assert bench_forms.FORMS[form] == ("rewrite", pass_name)
    b = GraphBuilder()
    model = b.build(b.op("PRelu", [b.conv(b.input("x", [1, 3, 8, 8]), 3, 4), b.const(np.full((4, 1, 1), 0.5,
                                                                                          np.float32))]))
    first = pipeline.optimize(None, pipeline.Options(target="cpu", ort_level="disable"), loaded=_loaded(model))
    assert ("prelu_leaky_relu", "PRelu -> LeakyRelu") in {(g.pass_name, g.form) for g in tune.groups(first.fusions)}



def test_culprit_search_after_tune_keeps_the_dropped_groups_left_out(monkeypatch):
    """A wrong rewrite injected into one LeakyRelu site (as tests/test_culprits.py does) with --tune dropping the
    HardSwish group: the culprit search's remainder (--drop-culprits) leaves both out, each with its own reason."""
    from tests.test_culprits import Mutant, inject

    model = mixed_model()
    first = pipeline.optimize(None, pipeline.Options(target="cpu", ort_level="disable"), loaded=_loaded(model))
    site = next(f.site for f in first.fusions if f.activation == "LeakyRelu")
    inject(monkeypatch, Mutant("activation_alpha", "conv_activation", site=site))
    opts = pipeline.make_options(target="cpu", ort_level="disable", tune=True)
    opts.drop_culprits = True
    result = tune.optimize(None, opts, VerifyOptions(), loaded=_loaded(model),
                           timer=fake_timer({"FusedConv(HardSwish)": (0.8, 0.7, 0.9)}))
    assert result.verification.status == "passed" and len(result.verification.culprits) == 1
    reasons = {s.reason for s in result.skips}
    assert {Reason.SLOWER_WHEN_MEASURED, Reason.BROKE_VERIFICATION} <= reasons
    assert "HardSwish" not in [f.activation for f in result.fusions]
    assert_same_outputs(model, result.model)
