"""Seeded fuzzing of ``onnxfuse optimize`` (issue #20): byte-level and protobuf-level mutations of the sample
models. Every mutant must end in exit 0 with a written model that onnx.checker accepts, or exit 2 with one
``error:`` line and no traceback; never a crash, a hang or another exit code.

Deterministic: each case is a (sample, mutation, seed) triple and its mutant is made from ``random.Random(seed)``
alone, so a failure names the case that reproduces it (``pytest tests/test_fuzz.py -k <id>``). Bounded: a fixed
number of small mutants, run in-process through click's CliRunner.
"""

from __future__ import annotations

import random
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

from onnxfuse.cli.main import main
from tests.conftest import REPO

SAMPLES = REPO / "sample_models"

#: The small samples, mutated in turn (the Silero VAD model takes a second or more per run: three cases only).
MODELS = ["resnet_block", "mlp_head", "conv_clip", "conv_hardswish", "conv_leakyrelu", "refuse_two_consumers"]

#: Values that break a rule of the spec in some way: zero, negative, huge, the wrong kind.
_BAD_INTS = [0, -1, -7, 2, 3, 2**31, 2**62]


def _nodes(model: onnx.ModelProto, rng: random.Random, op: str | None = None) -> onnx.NodeProto:
    nodes = [n for n in model.graph.node if op is None or n.op_type == op] or list(model.graph.node)
    return rng.choice(nodes)


def _real_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def conv_attribute(model: onnx.ModelProto, rng: random.Random) -> None:
    """A Conv's kernel_shape, pads, strides, dilations or group set to a bad value or length."""
    node = _nodes(model, rng, "Conv")
    name = rng.choice(["kernel_shape", "pads", "strides", "dilations", "group"])
    for a in [a for a in node.attribute if a.name == name]:
        node.attribute.remove(a)
    if name == "group":
        node.attribute.append(helper.make_attribute(name, rng.choice(_BAD_INTS)))
    else:
        node.attribute.append(helper.make_attribute(name, [rng.choice(_BAD_INTS) for _ in range(rng.randint(1, 5))]))


def attribute_value(model: onnx.ModelProto, rng: random.Random) -> None:
    """Any node's attribute given another value of another type (an axis out of range, a NaN alpha, a string)."""
    node = _nodes(model, rng)
    value = rng.choice([float("nan"), -1.0, 1e30, rng.choice(_BAD_INTS), "x", [1, 2, 3]])
    name = rng.choice([a.name for a in node.attribute] + ["axis", "alpha", "epsilon", "bogus"])
    for a in [a for a in node.attribute if a.name == name]:
        node.attribute.remove(a)
    node.attribute.append(helper.make_attribute(name, value))


def input_dim(model: onnx.ModelProto, rng: random.Random) -> None:
    """A dim of a graph input set to 0, a negative or huge number, an empty or odd dim_param, or dropped."""
    shape = rng.choice(_real_inputs(model)).type.tensor_type.shape
    if not shape.dim:
        return
    dim = rng.choice(shape.dim)
    choice = rng.randrange(4)
    if choice == 0:
        dim.dim_value = rng.choice([0, -3, 2**40])
    elif choice == 1:
        dim.dim_param = rng.choice(["", " ", "N", "a-b", "\x1b[2J"])
    elif choice == 2:
        shape.dim.remove(dim)
    else:
        shape.dim.add().dim_value = 1


def dtype(model: onnx.ModelProto, rng: random.Random) -> None:
    """The element type of a graph input, output or initializer changed, also to an undefined one."""
    new = rng.choice([TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT64, TensorProto.BOOL,
                      TensorProto.STRING, 0, 99])
    kind = rng.randrange(3)
    if kind == 2 and model.graph.initializer:
        rng.choice(model.graph.initializer).data_type = new
    else:
        values = _real_inputs(model) if kind == 0 else list(model.graph.output)
        rng.choice(values).type.tensor_type.elem_type = new


def remove_input(model: onnx.ModelProto, rng: random.Random) -> None:
    """A graph input, an initializer or one input of a node removed (its consumers left dangling)."""
    kind = rng.randrange(3)
    if kind == 0:
        model.graph.input.remove(rng.choice(_real_inputs(model)))
    elif kind == 1 and model.graph.initializer:
        model.graph.initializer.remove(rng.choice(model.graph.initializer))
    else:
        node = _nodes(model, rng)
        if node.input:
            del node.input[rng.randrange(len(node.input))]


def duplicate_name(model: onnx.ModelProto, rng: random.Random) -> None:
    """Two nodes, two initializers or a node and an input given the same name or output name."""
    nodes = list(model.graph.node)
    a, b = rng.choice(nodes), rng.choice(nodes)
    kind = rng.randrange(3)
    if kind == 0:
        a.output[0] = b.output[0] if a is not b else model.graph.input[0].name
    elif kind == 1:
        a.name = b.name
    elif len(model.graph.initializer) > 1:
        model.graph.initializer[0].name = model.graph.initializer[1].name


def op_type(model: onnx.ModelProto, rng: random.Random) -> None:
    """A node's op type, domain or the model's opset version replaced."""
    kind = rng.randrange(3)
    if kind == 0:
        _nodes(model, rng).op_type = rng.choice(["Conv", "Relu", "BatchNormalization", "Gemm", "NoSuchOp", ""])
    elif kind == 1:
        _nodes(model, rng).domain = rng.choice(["com.microsoft", "ai.onnx.ml", "nowhere"])
    else:
        model.opset_import[0].version = rng.choice([1, 6, 99, 0])


def flip_bytes(data: bytes, rng: random.Random) -> bytes:
    """1 to 8 random bytes of the file replaced by random values."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        out[rng.randrange(len(out))] = rng.randrange(256)
    return bytes(out)


def truncate(data: bytes, rng: random.Random) -> bytes:
    """The file cut at a random point."""
    return data[: rng.randrange(len(data))]


def splice(data: bytes, rng: random.Random) -> bytes:
    """A random slice of the file copied over another place (protobuf fields repeated or cut mid-field)."""
    start, length = rng.randrange(len(data)), rng.randint(1, 64)
    at = rng.randrange(len(data))
    return data[:at] + data[start:start + length] + data[at:]


PROTO_MUTATIONS = [conv_attribute, attribute_value, input_dim, dtype, remove_input, duplicate_name, op_type]
BYTE_MUTATIONS = [flip_bytes, truncate, splice]


#: Seeds per mutation.
SEEDS = 7


def _cases() -> list[tuple[str, str, int]]:
    """(model, mutation, seed) for every mutation x SEEDS seeds, the small models taken in turn (70 cases), and
    one case of each byte mutation on the Silero VAD model (If/Loop bodies, 1.3 MB)."""
    cases, i = [], 0
    for mutation in PROTO_MUTATIONS + BYTE_MUTATIONS:
        for seed in range(SEEDS):
            cases.append((MODELS[i % len(MODELS)], mutation.__name__, seed))
            i += 1
    return cases + [("silero_vad_16k_op15", m.__name__, 0) for m in BYTE_MUTATIONS]


def mutant(model_name: str, mutation: str, seed: int) -> bytes:
    """The bytes of the mutant: deterministic in its three arguments."""
    rng = random.Random(f"{model_name}/{mutation}/{seed}")
    data = (SAMPLES / f"{model_name}.onnx").read_bytes()
    fn = globals()[mutation]
    if fn in BYTE_MUTATIONS:
        return fn(data, rng)
    model = onnx.load_from_string(data)
    fn(model, rng)
    return model.SerializeToString()


@pytest.mark.parametrize(("model_name", "mutation", "seed"), [
    pytest.param(*c, id=f"{c[0]}-{c[1]}-{c[2]}") for c in _cases()])
def test_a_mutant_is_optimized_or_refused_in_one_line(tmp_path: Path, model_name: str, mutation: str, seed: int):
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    src.write_bytes(mutant(model_name, mutation, seed))
    result = CliRunner().invoke(main, ["optimize", str(src), str(out), "--target", "cpu"])
    detail = f"exit {result.exit_code}\n{result.output}"
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        import traceback

        detail += "".join(traceback.format_exception(result.exception))
    assert result.exit_code in (0, 2), detail
    assert "Traceback" not in result.output, detail
    if result.exit_code == 0:
        onnx.checker.check_model(onnx.load(str(out)), full_check=True)
    else:
        assert result.stdout == "" and not out.exists(), detail
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), detail
    assert sorted(p.name for p in tmp_path.iterdir()) == (["m.onnx", "o.onnx"] if result.exit_code == 0
                                                          else ["m.onnx"]), detail
