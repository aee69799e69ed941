"""Issue 33, part 5: a floating-point input that the model turns into indices (character or token ids fed as
floats, then ``Cast`` -> ``Gather``) gets random verification values that are valid, varied indices, not normal
floats that ``Cast`` makes 0 almost everywhere (``onnxfuse.model.indices``, ``InputSpec.index_highs``)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from onnxfuse import pipeline
from onnxfuse.model import indices
from onnxfuse.ort import sessions
from onnxfuse.verification.options import VerifyOptions
from tests.builders import GraphBuilder

VOCAB = 50


def char_ids_model(op: str = "Gather", through: tuple[str, ...] = ()) -> onnx.ModelProto:
    """ids float [1, 6] -> (through...) -> Cast(int64) -> Gather(table [VOCAB, 8]) -> Conv1d-free tail:
    Reshape [1, 8, 6] -> Conv(k=1) -> BatchNormalization -> Relu (the fold that verification checks)."""
    b = GraphBuilder(seed=4)
    x = b.input("ids", [1, 6])
    t = x
    for o in through:
        t = b.op(o, [t])
    idx = b.op("Cast", [t], to=TensorProto.INT64)
    if op == "Gather":
        emb = b.op("Gather", [b.const(b.rand(VOCAB, 8)), idx], axis=0)  # [1, 6, 8]
    else:
        emb = b.op("OneHot", [idx, b.const(np.array([VOCAB], np.int64)), b.const(np.array([0, 1], np.float32))])
        emb = b.op("MatMul", [emb, b.const(b.rand(VOCAB, 8))])
    y = b.op("Transpose", [emb], perm=[0, 2, 1])  # [1, 8, 6]
    y = b.op("Relu", [b.bn(b.conv(y, 8, 4, 1, rank=1, pads=[0, 0]), 4)])
    return b.build(y, opset=13)


@pytest.mark.parametrize("op,through", [("Gather", ()), ("Gather", ("Floor",)), ("OneHot", ())])
def test_float_ids_are_found_with_the_table_size(op, through):
    assert indices.float_index_inputs(char_ids_model(op, through)) == {"ids": VOCAB}


def test_a_float_input_not_used_as_indices_is_left_alone():
    b = GraphBuilder()
    x = b.input("x", [1, 3, 6, 6])
    assert indices.float_index_inputs(b.build(b.op("Relu", [b.conv(x, 3, 4)]))) == {}


def test_make_inputs_draws_whole_numbers_in_the_bound():
    model = char_ids_model()
    sess = sessions.session(model.SerializeToString())
    spec = sessions.InputSpec(index_highs={"ids": VOCAB})
    values = np.concatenate([sessions.make_inputs(sess, spec, seed)["ids"].ravel() for seed in range(4)])
    assert values.dtype == np.float32 and np.all(values == np.round(values))
    assert values.min() >= 0 and values.max() < VOCAB and len(set(values.tolist())) > 6


def test_verification_feeds_valid_varied_ids(tmp_path, monkeypatch):
    model = char_ids_model()
    src = tmp_path / "m.onnx"
    onnx.save(model, src)
    fed = []
    real = sessions.make_inputs
    monkeypatch.setattr(sessions, "make_inputs", lambda *a, **k: fed.append(real(*a, **k)) or fed[-1])
    result = pipeline.optimize(src, pipeline.Options(target="cpu", compare_with_onnxruntime=False),
                               VerifyOptions(input_sets=2))
    assert result.fusions and str(result.report.verification.status) == "passed"
    ids = np.concatenate([f["ids"].ravel() for f in fed])
    assert ids.min() >= 0 and ids.max() < VOCAB and len(set(ids.tolist())) > 3  # not every id 0
