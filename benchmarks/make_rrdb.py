#!/usr/bin/env python3
"""Make a synthetic ESRGAN-style model of RRDB blocks (residual-in-residual dense blocks), float32, opset 17.

Structure (ESRGAN, Wang et al. 2018, "RRDBNet"): ``Conv(3 -> F)``, then ``--blocks`` RRDB blocks, then
``Conv(F -> 3)``. An RRDB block is three dense blocks and ``out = 0.2 * rdb3 + x``. A dense block (RDB) is five
3x3 convs over dense concatenations with growth G::

    x1 = LeakyRelu(Conv(x)); x2 = LeakyRelu(Conv(Concat(x, x1))); ...; x4 = LeakyRelu(Conv(Concat(x, x1..x3)))
    x5 = Conv(Concat(x, x1..x4));  rdb = Mul(x5, 0.2) -> Add(x)

So every dense block ends in ``Conv -> Mul(0.2) -> Add(x)``: onnxfuse folds the Mul into the conv and is left
with ``Conv -> Add(x)``, the FusedConv(Z) form without an activation. LeakyRelu alpha 0.2. Weights from
``numpy.random.default_rng(--seed)``, scaled 0.1 / sqrt(fan-in) so activations stay moderate.

    python benchmarks/make_rrdb.py -o rrdb.onnx              # F=64, G=32, 1 block (3 dense blocks), input 1x3x64x64
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper


def make_rrdb(features: int = 64, growth: int = 32, blocks: int = 1, size: int = 64, seed: int = 0
              ) -> onnx.ModelProto:
    """The model described in the module docstring; input ``input`` [1, 3, size, size], output ``output``."""
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []

    def name(prefix: str) -> str:
        return f"{prefix}_{len(nodes)}"

    def conv(x: str, c_in: int, c_out: int) -> str:
        w, b, y = name("w"), name("b"), name("conv")
        inits.append(helper.make_tensor(w, TensorProto.FLOAT, [c_out, c_in, 3, 3], (
            rng.standard_normal((c_out, c_in, 3, 3)) * 0.1 / np.sqrt(c_in * 9)).astype(np.float32).ravel()))
        inits.append(helper.make_tensor(b, TensorProto.FLOAT, [c_out],
                                        (rng.standard_normal(c_out) * 0.01).astype(np.float32)))
        nodes.append(helper.make_node("Conv", [x, w, b], [y], name=y, pads=[1, 1, 1, 1], kernel_shape=[3, 3]))
        return y

    def op(kind: str, inputs: list[str], **attrs) -> str:
        y = name(kind.lower())
        nodes.append(helper.make_node(kind, inputs, [y], name=y, **attrs))
        return y

    inits.append(helper.make_tensor("scale", TensorProto.FLOAT, [], [0.2]))

    def scaled_residual(y: str, x: str) -> str:
        return op("Add", [op("Mul", [y, "scale"]), x])

    def rdb(x: str) -> str:
        feats = [x]
        for i in range(4):
            cat = feats[0] if len(feats) == 1 else op("Concat", feats, axis=1)
            feats.append(op("LeakyRelu", [conv(cat, features + i * growth, growth)], alpha=0.2))
        return scaled_residual(conv(op("Concat", feats, axis=1), features + 4 * growth, features), x)

    y = conv("input", 3, features)
    for _ in range(blocks):
        x = y
        for _ in range(3):
            y = rdb(y)
        y = scaled_residual(y, x)
    out = conv(y, features, 3)
    nodes[-1].output[0] = "output"
    del out
    graph = helper.make_graph(
        nodes, "rrdb", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 3, size, size])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-o", "--output", required=True)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--growth", type=int, default=32)
    parser.add_argument("--blocks", type=int, default=1)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    onnx.save(make_rrdb(args.features, args.growth, args.blocks, args.size, args.seed), args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
