"""One options record (issue 30, item 2): ``pipeline.Options`` and ``VerifyOptions`` are built by one function each
(``pipeline.make_options``, ``verification.options.make_verify_options``) for ``onnxfuse optimize``, the API's
``optimize`` and ``onnxfuse batch``; every field is reachable from each of them, or refused there by name.

The tables below name, for every field, how each surface sets it and the value it must arrive with. A field added
to either record without a row here fails :func:`test_every_field_has_a_row`: declare it once, reach it
everywhere (or add it to the documented refused lists, which the tests exercise too).
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from click.testing import CliRunner

import onnxfuse
from onnxfuse import batch as b
from onnxfuse import pipeline
from onnxfuse.cli import batch as cli_batch
from onnxfuse.cli.main import main
from onnxfuse.verification import options as verify_mod
from tests.conftest import REPO

SAMPLE = REPO / "sample_models" / "resnet_block.onnx"

#: Options field -> (``optimize`` arguments, API keywords, how batch sets it, the value it arrives with). Batch:
#: ``("cli", args)`` (a command-line option for every model), ``("manifest", row)`` (a manifest field per model) or
#: ``("refused", args or row, the name its error gives)``.
OPTIONS = {
    "target": (["--target", "cpu"], {"target": "cpu"}, ("cli", ["--target", "cpu"]), "cpu"),
    "only": (["--only", "conv_batchnorm"], {"only": ["conv_batchnorm"]}, ("cli", ["--only", "conv_batchnorm"]),
             ("conv_batchnorm",)),
    "skip": (["--skip", "conv_relu"], {"skip": ["conv_relu"]}, ("cli", ["--skip", "conv_relu"]), ("conv_relu",)),
    "input_shapes": (["--input-shape", "x=2x8x16x16"], {"input_shapes": {"x": (2, 8, 16, 16)}},
                     ("manifest", {"input_shapes": {"x": [2, 8, 16, 16]}}), {"x": (2, 8, 16, 16)}),
    "constant_initializer_inputs": (["--constant-initializer-inputs"], {"constant_initializer_inputs": True},
                                    ("cli", ["--constant-initializer-inputs"]), True),
    "input_data": (["--input-data", "{npz}"], {"input_data": "{npz}"},
                   ("refused", {"input_data": "inputs.npz"}, "input_data"), "{npz}"),
    "ort_level": (["--ort-level", "extended"], {"ort_level": "extended"}, ("cli", ["--ort-level", "extended"]),
                  "extended"),
    "compare_with_onnxruntime": (["--no-verify"], {"verify": False}, ("cli", ["--no-verify"]), False),
    "ort_version": (["--ort-version", "1.20"], {"ort_version": "1.20"}, ("cli", ["--ort-version", "1.20"]), "1.20"),
    "materialize_weights_bytes": (["--materialize-weights", "1.5"], {"materialize_weights": 1.5},
                                  ("cli", ["--materialize-weights", "1.5"]), int(1.5 * 2**20)),
    "plugins": (["--plugin", "my_passes:MyPass"], {"plugins": ["my_passes:MyPass"]},
                ("cli", ["--plugin", "my_passes:MyPass"]), ("my_passes:MyPass",)),
    "fix_input_shapes": (["--fix-input-shape", "x=1x8x16x16"], {"fix_input_shapes": {"x": (1, 8, 16, 16)}},
                         ("manifest", {"fix_input_shapes": {"x": [1, 8, 16, 16]}}), {"x": (1, 8, 16, 16)}),
    "drop_culprits": (["--drop-culprits"], {"drop_culprits": True}, ("cli", ["--drop-culprits"]), True),
    "compare_layers": (["--layers"], {"compare_layers": True}, ("cli", ["--layers"]), True),
    "bandwidth_gb_per_s": (["--bandwidth", "12.5"], {"bandwidth": 12.5}, ("cli", ["--bandwidth", "12.5"]), 12.5),
    "tune": (["--tune"], {"tune": True}, ("refused", {"tune": True}, "tune"), True),
    "tune_budget_s": (["--tune", "--tune-budget", "7"], {"tune_budget": 7},
                      ("refused", {"tune_budget": 7}, "tune_budget"), 7.0),
    "threads": (["--tune", "--threads", "2"], {"threads": 2}, ("refused", {"threads": 2}, "threads"), 2),
}

#: VerifyOptions field -> the same four.
VERIFY = {
    "input_shapes": OPTIONS["input_shapes"],
    "input_data": OPTIONS["input_data"],
    "input_values": (["--input-value", "x=0.5"], {"input_values": {"x": 0.5}},
                     ("manifest", {"input_values": {"x": 0.5}}), {"x": 0.5}),
    "input_ranges": (["--input-range", "x=0,2"], {"input_ranges": {"x": (0, 2)}},
                     ("manifest", {"input_ranges": {"x": [0, 2]}}), {"x": (0.0, 2.0)}),
    "input_sets": (["--input-sets", "3"], {"input_sets": 3}, ("cli", ["--input-sets", "3"]), 3),
    "rtol": (["--rtol", "0.01"], {"rtol": 0.01}, ("cli", ["--rtol", "0.01"]), 0.01),
    "atol": (["--atol", "0.02"], {"atol": 0.02}, ("cli", ["--atol", "0.02"]), 0.02),
    "timeout": (["--verify-timeout", "7"], {"verify_timeout": 7}, ("cli", ["--verify-timeout", "7"]), 7.0),
    "work": (["--verify-budget", "9"], {"verify_budget": 9}, ("cli", ["--verify-budget", "9"]), 9.0),
}


class _Captured(Exception):
    pass


@pytest.fixture
def captured(monkeypatch):
    """What ``pipeline.optimize`` is called with (the command and the API call it), instead of running it."""
    calls: list = []

    def fake(path, options, verify_options=None, loaded=None, **_):
        calls.append((options, verify_options))
        raise _Captured

    monkeypatch.setattr(pipeline, "optimize", fake)
    return calls


@pytest.fixture
def npz(tmp_path):
    path = tmp_path / "inputs.npz"
    np.savez(path, x=np.zeros((1, 8, 16, 16), np.float32))
    return str(path)


def _fill(value, npz: str):
    return json.loads(json.dumps(value).replace("{npz}", npz)) if "{npz}" in json.dumps(value) else value


def _cli_optimize(args, captured, tmp_path):
    result = CliRunner().invoke(main, ["optimize", str(SAMPLE), str(tmp_path / "o.onnx"), *args])
    assert captured, result.output
    return captured.pop()


def _api_optimize(kwargs, captured):
    with pytest.raises(_Captured):
        onnxfuse.optimize(str(SAMPLE), **kwargs)
    return captured.pop()


def _batch_options(how, monkeypatch, tmp_path):
    """The (Options, VerifyOptions) a batch worker builds for a model, from the command line or a manifest row."""
    kind, value = how[0], how[1]
    if kind == "manifest":
        manifest = tmp_path / "zoo.json"
        manifest.write_text(json.dumps({"models": [{"path": str(SAMPLE), **value}]}))
        [entry] = b.collect([manifest], b.ModelOptions())
        return b.run_options(b.make_job(entry, "k")["options"])
    seen: list = []

    def fake_run(ctx, inputs, outdir, defaults, *rest):
        seen.append(defaults)
        raise _Captured

    monkeypatch.setattr(cli_batch, "_run", fake_run)
    monkeypatch.setattr("onnxfuse.passes.plugin.resolve", lambda plugins: ())  # no module my_passes here
    result = CliRunner().invoke(main, ["batch", str(SAMPLE), "-o", str(tmp_path / "out"), *value])
    assert seen, result.output
    return b.run_options(seen[0].to_dict())


def test_every_field_has_a_row():
    """A new field of either record needs a row above (or a place in the documented library-only lists)."""
    assert {f.name for f in dataclasses.fields(pipeline.Options)} == set(OPTIONS) | set(pipeline.LIBRARY_ONLY_OPTIONS)
    assert ({f.name for f in dataclasses.fields(verify_mod.VerifyOptions)}
            == set(VERIFY) | set(verify_mod.LIBRARY_ONLY_VERIFY_OPTIONS))
    assert set(b.REFUSED_OPTIONS) == {v[2][2] for v in {**OPTIONS, **VERIFY}.values() if v[2][0] == "refused"}


@pytest.mark.parametrize("record, field", [("options", f) for f in OPTIONS] + [("verify", f) for f in VERIFY])
def test_every_field_is_reachable_from_the_command_the_api_and_batch(record, field, captured, monkeypatch,
                                                                      tmp_path, npz):
    cli_args, api_kwargs, batch_how, expected = (_fill(v, npz) for v in (OPTIONS if record == "options"
                                                                         else VERIFY)[field])
    pick = 0 if record == "options" else 1

    def value(pair):
        rec = pair[pick]
        if rec is None:  # --no-verify / verify=False: no verification options at all
            return None
        got = getattr(rec, field)
        return tuple(got) if isinstance(got, list) else got

    def normal(x):
        return {k: tuple(v) for k, v in x.items()} if isinstance(x, dict) and all(
            isinstance(v, (list, tuple)) for v in x.values()) else tuple(x) if isinstance(x, list) else x

    assert value(_cli_optimize(cli_args, captured, tmp_path)) == normal(expected), "onnxfuse optimize"
    assert value(_api_optimize(api_kwargs, captured)) == normal(expected), "onnxfuse.optimize"
    if batch_how[0] == "refused":
        manifest = tmp_path / "zoo.json"
        manifest.write_text(json.dumps({"models": [{"path": str(SAMPLE), **batch_how[1]}]}))
        with pytest.raises(onnxfuse.InputError, match=batch_how[2]):
            b.collect([manifest], b.ModelOptions())
        flag = "--" + batch_how[2].replace("_", "-")
        result = CliRunner().invoke(main, ["batch", str(SAMPLE), "-o", str(tmp_path / "out"), flag, npz])
        assert result.exit_code == 2 and f"No such option '{flag}'" in result.output
    else:
        assert value(_batch_options(batch_how, monkeypatch, tmp_path)) == normal(expected), "onnxfuse batch"


def test_the_three_build_the_same_record_from_their_defaults(captured, monkeypatch, tmp_path):
    """Nothing given: the command, the API and a batch worker build equal records (one builder, one default)."""
    cli = _cli_optimize([], captured, tmp_path)
    api = _api_optimize({}, captured)
    batch = _batch_options(("cli", []), monkeypatch, tmp_path)
    assert cli[0] == api[0] == batch[0] == pipeline.make_options()
    assert cli[1] == api[1] == batch[1] == verify_mod.make_verify_options()


@pytest.mark.parametrize("name", [*pipeline.LIBRARY_ONLY_OPTIONS, *verify_mod.LIBRARY_ONLY_VERIFY_OPTIONS])
def test_library_only_fields_are_refused_by_name_everywhere(name, tmp_path):
    flag = "--" + name.replace("_", "-")
    for args in (["optimize", str(SAMPLE), str(tmp_path / "o.onnx"), flag],
                 ["batch", str(SAMPLE), "-o", str(tmp_path / "out"), flag]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2 and f"No such option '{flag}'" in result.output, args
    with pytest.raises(TypeError, match=name):
        onnxfuse.optimize(str(SAMPLE), **{name: True})
    manifest = tmp_path / "zoo.json"
    manifest.write_text(json.dumps({"models": [{"path": str(SAMPLE), name: True}]}))
    with pytest.raises(onnxfuse.InputError, match=f"unknown field.*{name}"):
        b.collect([manifest], b.ModelOptions())


@pytest.mark.parametrize("flag, field", [(f"--{k.replace('_', '-')}", v) for k, v in cli_batch.PER_MODEL_OPTIONS.items()
                                         if v is not None])
def test_batch_takes_the_per_model_options_in_a_manifest_only(flag, field, tmp_path):
    """``--input-shape``, ``--input-value`` and ``--input-range`` differ from model to model: a manifest field,
    not a command-line option of batch (click names the option it does not know)."""
    assert field in b.MANIFEST_FIELDS
    result = CliRunner().invoke(main, ["batch", str(SAMPLE), "-o", str(tmp_path / "out"), flag, "x=1"])
    assert result.exit_code == 2 and f"No such option '{flag}'" in result.output


def test_bench_refuses_every_optimization_option_by_name_from_the_declared_group():
    """cli/bench.py reads the options it refuses with OPTIMIZED from the declaration of the group itself."""
    from onnxfuse.cli.args.optimization import optimization_option_names
    from onnxfuse.cli.bench import OPTIMIZATION_ONLY

    names = optimization_option_names()
    assert set(OPTIMIZATION_ONLY) == set(names) - {"input_shape"} and "materialize_weights" in names


def test_a_csv_manifest_gives_the_per_model_fields_as_json_does(tmp_path):
    """The manifest's per-model fields in CSV (``x=0,1`` in a quoted cell for a range) are the JSON ones."""
    csv_path, json_path = tmp_path / "zoo.csv", tmp_path / "zoo.json"
    csv_path.write_text("path,input_shapes,fix_input_shapes,input_values,input_ranges\n"
                        f'{SAMPLE},x=2x8x16x16,x=1x8x16x16,x=0.5,"x=0,2"\n')
    json_path.write_text(json.dumps({"models": [{"path": str(SAMPLE), "input_shapes": {"x": [2, 8, 16, 16]},
                                                 "fix_input_shapes": {"x": [1, 8, 16, 16]}, "input_values": {"x": 0.5},
                                                 "input_ranges": {"x": [0, 2]}}]}))
    [from_csv], [from_json] = (b.collect([p], b.ModelOptions()) for p in (csv_path, json_path))
    assert b.run_options(from_csv.options.to_dict()) == b.run_options(from_json.options.to_dict())
    with pytest.raises(onnxfuse.InputError, match="input_ranges"):
        json_path.write_text(json.dumps({"models": [{"path": str(SAMPLE), "input_ranges": {"x": [2, 0]}}]}))
        b.collect([json_path], b.ModelOptions())
