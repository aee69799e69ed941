#!/usr/bin/env python3
"""Make a synthetic node-heavy ONNX model of N blocks of the kinds tf2onnx and PyTorch exports are made of, for
benchmarking how onnxfuse's time grows with the node count (issue 35).

Each block (about 50 nodes) holds what real exports of transformers and speech models spell out op by op:

- LayerNorm written out: ReduceMean, Sub, Pow, ReduceMean, Add(eps), Sqrt, Div, Mul(gamma), Add(beta);
- attention: three MatMul + Add projections, Reshape / Transpose into heads, MatMul, Div(sqrt d), Softmax, MatMul,
  Transpose / Reshape back, an output MatMul + Add and the residual Add;
- GELU written out: Div(sqrt 2), Erf, Add(1), Mul(x), Mul(0.5), between two MatMul + Add;
- a Transpose-wrapped Conv1d (Transpose to channels-first, Unsqueeze to 2-D, depthwise Conv, pointwise Conv,
  BatchNormalization, Relu, Squeeze, Transpose back), as TensorFlow and audio exports write a separable conv.

One float32 input ``input`` of shape ``[batch, seq, hidden]`` (``batch`` symbolic unless ``--static``), one output,
opset 17 (IR 8), weights from ``numpy.random.default_rng(--seed)`` scaled so that activations stay finite: the
same arguments always give the same bytes.

    mkdir -p benchmarks/out
    python benchmarks/make_transformer.py --blocks 40 -o benchmarks/out/tfm40.onnx      # about 2,000 nodes
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8


class _Builder:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.n = 0

    def const(self, name: str, arr: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(arr, name))
        return name

    def weight(self, name: str, shape: tuple[int, ...], scale: float) -> str:
        return self.const(name, (self.rng.standard_normal(shape) * scale).astype(np.float32))

    def op(self, op: str, inputs: list[str], **attrs: object) -> str:
        self.n += 1
        out = f"t{self.n}"
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"{op}_{self.n}", **attrs))
        return out


def _layernorm(b: _Builder, x: str, p: str, hidden: int) -> str:
    mean = b.op("ReduceMean", [x], axes=[-1], keepdims=1)
    d = b.op("Sub", [x, mean])
    sq = b.op("Pow", [d, b.const(f"{p}.two", np.array(2.0, np.float32))])
    var = b.op("ReduceMean", [sq], axes=[-1], keepdims=1)
    std = b.op("Sqrt", [b.op("Add", [var, b.const(f"{p}.eps", np.array(1e-5, np.float32))])])
    y = b.op("Div", [d, std])
    y = b.op("Mul", [y, b.const(f"{p}.gamma", np.ones(hidden, np.float32))])
    return b.op("Add", [y, b.const(f"{p}.beta", np.zeros(hidden, np.float32))])


def _linear(b: _Builder, x: str, p: str, n_in: int, n_out: int) -> str:
    y = b.op("MatMul", [x, b.weight(f"{p}.w", (n_in, n_out), 1.0 / np.sqrt(n_in))])
    return b.op("Add", [y, b.weight(f"{p}.b", (n_out,), 0.01)])


def _attention(b: _Builder, x: str, p: str, hidden: int, heads: int) -> str:
    dh = hidden // heads
    split = b.const(f"{p}.split_shape", np.array([0, 0, heads, dh], np.int64))
    merge = b.const(f"{p}.merge_shape", np.array([0, 0, hidden], np.int64))

    def heads_of(t: str, perm: list[int]) -> str:
        return b.op("Transpose", [b.op("Reshape", [t, split])], perm=perm)

    q = heads_of(_linear(b, x, f"{p}.q", hidden, hidden), [0, 2, 1, 3])
    k = heads_of(_linear(b, x, f"{p}.k", hidden, hidden), [0, 2, 3, 1])
    v = heads_of(_linear(b, x, f"{p}.v", hidden, hidden), [0, 2, 1, 3])
    s = b.op("Div", [b.op("MatMul", [q, k]), b.const(f"{p}.sqrt_d", np.array(np.sqrt(dh), np.float32))])
    a = b.op("MatMul", [b.op("Softmax", [s], axis=-1), v])
    a = b.op("Reshape", [b.op("Transpose", [a], perm=[0, 2, 1, 3]), merge])
    return b.op("Add", [x, _linear(b, a, f"{p}.o", hidden, hidden)])


def _gelu_mlp(b: _Builder, x: str, p: str, hidden: int) -> str:
    h = _linear(b, x, f"{p}.fc1", hidden, 2 * hidden)
    e = b.op("Erf", [b.op("Div", [h, b.const(f"{p}.sqrt2", np.array(np.sqrt(2.0), np.float32))])])
    g = b.op("Mul", [b.op("Mul", [h, b.op("Add", [e, b.const(f"{p}.one", np.array(1.0, np.float32))])]),
                     b.const(f"{p}.half", np.array(0.5, np.float32))])
    return b.op("Add", [x, _linear(b, g, f"{p}.fc2", 2 * hidden, hidden)])


def _separable_conv1d(b: _Builder, x: str, p: str, hidden: int) -> str:
    t = b.op("Unsqueeze", [b.op("Transpose", [x], perm=[0, 2, 1]), b.const(f"{p}.axis", np.array([2], np.int64))])
    dw = b.op("Conv", [t, b.weight(f"{p}.dw", (hidden, 1, 1, 3), 0.5)], group=hidden, kernel_shape=[1, 3],
              pads=[0, 1, 0, 1])
    pw = b.op("Conv", [dw, b.weight(f"{p}.pw", (hidden, hidden, 1, 1), 1.0 / np.sqrt(hidden))], kernel_shape=[1, 1])
    bn = b.op("BatchNormalization", [pw, b.const(f"{p}.bn.scale", np.ones(hidden, np.float32)),
                                     b.weight(f"{p}.bn.bias", (hidden,), 0.01),
                                     b.weight(f"{p}.bn.mean", (hidden,), 0.01),
                                     b.const(f"{p}.bn.var", np.ones(hidden, np.float32))], epsilon=1e-5)
    r = b.op("Relu", [bn])
    y = b.op("Transpose", [b.op("Squeeze", [r, b.const(f"{p}.axis2", np.array([2], np.int64))])], perm=[0, 2, 1])
    return b.op("Add", [x, y])


def build(blocks: int, seq: int = 16, hidden: int = 32, heads: int = 4, seed: int = 0,
          static: bool = False) -> onnx.ModelProto:
    """A model of ``blocks`` blocks (about 50 nodes each); input ``[batch, seq, hidden]`` float32 (``batch`` is 1
    when ``static``), output of the same shape. Raises ValueError for ``blocks < 1``."""
    if blocks < 1:
        raise ValueError("--blocks must be >= 1")
    b = _Builder(seed)
    x = "input"
    for i in range(blocks):
        p = f"b{i}"
        x = _attention(b, _layernorm(b, x, f"{p}.ln1", hidden), f"{p}.att", hidden, heads)
        x = _gelu_mlp(b, _layernorm(b, x, f"{p}.ln2", hidden), f"{p}.mlp", hidden)
        x = _separable_conv1d(b, x, f"{p}.conv", hidden)
    b.nodes.append(helper.make_node("Identity", [x], ["output"], name="output_identity"))
    batch: int | str = 1 if static else "batch"
    graph = helper.make_graph(
        b.nodes, f"transformer{blocks}",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, seq, hidden])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [batch, seq, hidden])],
        initializer=b.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="make_transformer")
    model.ir_version = IR_VERSION
    return model


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, required=True)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--static", action="store_true", help="batch fixed to 1 (no symbolic dim)")
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args(argv)
    model = build(args.blocks, args.seq, args.hidden, seed=args.seed, static=args.static)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, args.output)
    print(f"{args.output}: {len(model.graph.node)} nodes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
