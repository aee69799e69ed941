#!/usr/bin/env python3
"""Make a synthetic model of about 10 GB with external data, sparse on disk, for the large-file benchmark
(BENCHMARKS.md, "Large files").

The graph is ``x [1, D, 1, 1] -> Conv(1x1, D->D) -> BatchNormalization -> Relu -> Flatten`` followed by
``--matmuls`` blocks of ``MatMul([D, D]) -> Add(bias [D]) -> Relu``; float32, opset 17 (IR 8). The Conv weight
(``D*D*4`` bytes) is folded by ``conv_batchnorm``, so a pass reads and rewrites it; each MatMul + Add becomes a
Gemm (``matmul_add``), whose weight is unchanged; the other weights are only carried from input to output.

Every tensor is an external reference into ``OUTPUT.data``; the large weights are zeros and are never written:
the data file is extended with ``ftruncate`` (a hole), so that ``--dim 16384 --matmuls 9`` (10 GiB of weights,
10.7 GB) takes a few MB of disk on a file system with sparse files. The small tensors (biases, BatchNormalization
parameters) are drawn from ``numpy.random.default_rng(--seed)``: the same arguments give the same bytes.

Example (from the repository root; ``benchmarks/out/`` is git-ignored)::

    mkdir -p benchmarks/out
    python benchmarks/make_large.py -o benchmarks/out/large.onnx
    /usr/bin/time -v python -m onnxfuse optimize benchmarks/out/large.onnx benchmarks/out/large.fused.onnx --no-verify

``--dim 64 --matmuls 3`` makes a small model of the same kind (its weights can be given random values with
``--dense``, to run it in onnxruntime).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper

OPSET = 17
IR_VERSION = 8
_ALIGN = 4096


class _DataFile:
    """The external data file, written tensor by tensor at aligned offsets; zeros are left as holes."""

    def __init__(self, path: str, location: str):
        self.location = location
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self.end = 0

    def tensor(self, name: str, shape: tuple[int, ...], values: np.ndarray | None) -> TensorProto:
        """A float32 external TensorProto of ``shape``; ``values`` None: zeros, not written (a hole)."""
        length = int(np.prod(shape)) * 4
        offset = -(-self.end // _ALIGN) * _ALIGN
        if values is not None:
            data = np.ascontiguousarray(values, dtype="<f4").tobytes()
            assert len(data) == length
            os.pwrite(self.fd, data, offset)
        self.end = offset + length
        t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(shape))
        t.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.location), ("offset", str(offset)), ("length", str(length))):
            entry = t.external_data.add()
            entry.key, entry.value = key, value
        return t

    def close(self) -> None:
        os.ftruncate(self.fd, self.end)
        os.close(self.fd)


def build(path: str, dim: int, matmuls: int, seed: int = 0, dense: bool = False) -> onnx.ModelProto:
    """Write ``path``'s data file and return the model (see the module docstring); ``dense``: random large
    weights, written (for small ``dim`` only)."""
    rng = np.random.default_rng(seed)
    location = os.path.basename(path) + ".data"
    data = _DataFile(os.path.join(os.path.dirname(os.path.abspath(path)), location), location)
    d = dim

    def small(n: int, low: float, high: float) -> np.ndarray:
        return rng.uniform(low, high, n).astype(np.float32)

    def large(shape: tuple[int, ...]) -> np.ndarray | None:
        return (rng.standard_normal(shape, dtype=np.float32) / np.float32(np.sqrt(d))) if dense else None

    inits = [data.tensor("conv.w", (d, d, 1, 1), large((d, d, 1, 1))), data.tensor("conv.b", (d,), small(d, -.1, .1)),
             data.tensor("bn.scale", (d,), small(d, .5, 1.5)), data.tensor("bn.bias", (d,), small(d, -.1, .1)),
             data.tensor("bn.mean", (d,), small(d, -.1, .1)), data.tensor("bn.var", (d,), small(d, .5, 1.5))]
    nodes = [helper.make_node("Conv", ["x", "conv.w", "conv.b"], ["conv"], name="Conv", kernel_shape=[1, 1]),
             helper.make_node("BatchNormalization", ["conv", "bn.scale", "bn.bias", "bn.mean", "bn.var"], ["bn"],
                              name="BatchNormalization", epsilon=1e-5),
             helper.make_node("Relu", ["bn"], ["relu"], name="Relu"),
             helper.make_node("Flatten", ["relu"], ["h0"], name="Flatten", axis=1)]
    x = "h0"
    for i in range(matmuls):
        inits += [data.tensor(f"mm{i}.w", (d, d), large((d, d))), data.tensor(f"mm{i}.b", (d,), small(d, -.1, .1))]
        out = "y" if i == matmuls - 1 else f"h{i + 1}"
        nodes += [helper.make_node("MatMul", [x, f"mm{i}.w"], [f"mm{i}"], name=f"MatMul{i}"),
                  helper.make_node("Add", [f"mm{i}", f"mm{i}.b"], [f"add{i}"], name=f"Add{i}"),
                  helper.make_node("Relu", [f"add{i}"], [out], name=f"Relu{i}")]
        x = out
    data.close()
    graph = helper.make_graph(nodes, f"large_d{d}_m{matmuls}",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, d, 1, 1])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, d])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="onnxfuse-benchmarks-make_large", producer_version="1")
    model.ir_version = IR_VERSION
    return model


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dim", type=int, default=16384, help="D: every large weight is D x D float32 (default 16384: "
                    "1 GiB each)")
    ap.add_argument("--matmuls", type=int, default=9, help="MatMul + Add blocks after the Conv (default 9)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the small tensors (default 0)")
    ap.add_argument("--dense", action="store_true", help="random large weights, written to disk (small --dim only)")
    ap.add_argument("-o", "--output", required=True, help="output .onnx path (its data file: OUTPUT.data)")
    args = ap.parse_args(argv)
    model = build(args.output, args.dim, args.matmuls, args.seed, args.dense)
    onnx.save_model(model, args.output)
    size = os.path.getsize(args.output) + os.path.getsize(args.output + ".data")
    disk = (os.stat(args.output).st_blocks + os.stat(args.output + ".data").st_blocks) * 512
    print(f"{args.output}: {len(model.graph.node)} nodes, {size / 1e9:.2f} GB ({size} bytes), "
          f"{disk / 1e6:.1f} MB on disk, largest tensor {args.dim * args.dim * 4} bytes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
