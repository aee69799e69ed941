#!/usr/bin/env python3
"""Make a synthetic ResNet-like ONNX model of N Conv-BN-Relu blocks, for benchmarking onnxfuse and its peers.

Every block is ``Conv(3x3, C->C, pad 1) -> BatchNormalization -> Relu``; with ``--residual-every K`` (default 2)
every K-th block adds the input of its group of K blocks before its Relu, as a ResNet basic block does
(``Conv -> BN -> Add(skip) -> Relu``). The model has one float32 input ``input`` of shape 1 x C x H x W and one
output ``output``, opset 17 (IR 8), and weights drawn from ``numpy.random.default_rng(--seed)``, so the same
arguments always give the same bytes. Weights are He-scaled and the residual branches damped so that
activations stay finite and moderate through hundreds of blocks (mean |output| about 0.8 after 50 blocks and
about 37 after 400), so onnxruntime can run and verify the model.

Examples (from the repository root; ``benchmarks/out/`` is git-ignored, ``mkdir -p benchmarks/out`` first)::

    python benchmarks/make_resnet.py --blocks 50 -o benchmarks/out/resnet50.onnx
    python benchmarks/make_resnet.py --blocks 400 -o benchmarks/out/resnet400.onnx
    # > 2 GB model, weights in an external data file (about 2.3 GB on disk; slow to make, see BENCHMARKS.md):
    python benchmarks/make_resnet.py --blocks 60 --channels 1024 --hw 7 --external -o benchmarks/out/resnet_big.onnx

Sizes: one 3x3 Conv of C channels has 36 * C * C bytes of float32 weights (C=64: 147 KB, so 50 blocks make a
7.5 MB file and 400 blocks a 59 MB file; C=1024: 37.7 MB, so 60 blocks make 2.26 GB).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8


def build(blocks: int, channels: int = 64, hw: int = 56, seed: int = 0, residual_every: int = 2) -> onnx.ModelProto:
    if blocks < 1:
        raise ValueError("--blocks must be >= 1")
    rng = np.random.default_rng(seed)
    c = channels
    fan_in = c * 9
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    x = "input"
    group_input = x
    for i in range(blocks):
        p = f"b{i}"
        w = (rng.standard_normal((c, c, 3, 3), dtype=np.float32) * np.float32(np.sqrt(2.0 / fan_in)))
        b = (rng.standard_normal(c, dtype=np.float32) * np.float32(0.01))
        residual = residual_every > 0 and (i + 1) % residual_every == 0
        # Damp the residual branch (small gamma) so that the sum grows slowly over hundreds of blocks.
        gamma = rng.uniform(0.1, 0.3, c).astype(np.float32) if residual else rng.uniform(0.5, 0.9, c).astype(np.float32)
        beta = (rng.standard_normal(c, dtype=np.float32) * np.float32(0.05))
        mean = (rng.standard_normal(c, dtype=np.float32) * np.float32(0.05))
        var = rng.uniform(0.5, 1.5, c).astype(np.float32)
        for name, arr in ((f"{p}.conv.w", w), (f"{p}.conv.b", b), (f"{p}.bn.scale", gamma), (f"{p}.bn.bias", beta),
                          (f"{p}.bn.mean", mean), (f"{p}.bn.var", var)):
            inits.append(numpy_helper.from_array(arr, name))
        nodes.append(helper.make_node("Conv", [x, f"{p}.conv.w", f"{p}.conv.b"], [f"{p}.conv"], name=f"{p}.Conv",
                                      kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1]))
        nodes.append(helper.make_node("BatchNormalization",
                                      [f"{p}.conv", f"{p}.bn.scale", f"{p}.bn.bias", f"{p}.bn.mean", f"{p}.bn.var"],
                                      [f"{p}.bn"], name=f"{p}.BatchNormalization", epsilon=1e-5))
        pre = f"{p}.bn"
        if residual:
            nodes.append(helper.make_node("Add", [pre, group_input], [f"{p}.add"], name=f"{p}.Add"))
            pre = f"{p}.add"
        out = "output" if i == blocks - 1 else f"{p}.relu"
        nodes.append(helper.make_node("Relu", [pre], [out], name=f"{p}.Relu"))
        x = out
        if residual:
            group_input = x
    shape = [1, c, hw, hw]
    graph = helper.make_graph(
        nodes, f"resnet{blocks}_c{c}",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, shape)],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="onnxfuse-benchmarks-make_resnet", producer_version="1")
    model.ir_version = IR_VERSION
    return model


def save(model: onnx.ModelProto, path: str, external: bool) -> None:
    path = os.path.abspath(path)
    if external:
        location = os.path.basename(path) + ".data"
        data_path = os.path.join(os.path.dirname(path), location)
        if os.path.exists(data_path):
            os.remove(data_path)  # onnx appends to an existing data file
        onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                        location=location, size_threshold=1024)
    else:
        onnx.save_model(model, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, default=50, help="number of Conv-BN-Relu blocks (default 50)")
    ap.add_argument("--channels", type=int, default=64, help="channels of every Conv (default 64)")
    ap.add_argument("--hw", type=int, default=56, help="input height and width (default 56)")
    ap.add_argument("--seed", type=int, default=0, help="weights seed (default 0)")
    ap.add_argument("--residual-every", type=int, default=2,
                    help="add a skip connection every K blocks; 0 for a plain chain (default 2)")
    ap.add_argument("--external", action="store_true",
                    help="store weights in OUTPUT.data beside OUTPUT (required when the model is over 2 GB)")
    ap.add_argument("-o", "--output", required=True, help="output .onnx path")
    args = ap.parse_args(argv)

    weight_bytes = args.blocks * (36 * args.channels * args.channels + 5 * 4 * args.channels)
    if weight_bytes >= 2 ** 31 - 2 ** 24 and not args.external:
        ap.error(f"the model would hold {weight_bytes / 1e9:.2f} GB of weights; protobuf cannot serialize "
                 "more than 2 GB in one file, so pass --external")
    model = build(args.blocks, args.channels, args.hw, args.seed, args.residual_every)
    save(model, args.output, args.external)
    size = os.path.getsize(args.output)
    if args.external:
        size += os.path.getsize(args.output + ".data")
    print(f"{args.output}: {args.blocks} blocks, {args.channels} channels, {args.hw}x{args.hw}, "
          f"{len(model.graph.node)} nodes, {size / 1e6:.1f} MB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
