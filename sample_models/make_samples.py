"""Make the small sample models in this folder, deterministically (fixed seed, fixed producer, no timestamps).

    python sample_models/make_samples.py            # (re)write the .onnx files next to this script
    python sample_models/make_samples.py --check    # exit 1 if a committed file differs from what this makes

Models (float32, NCHW, opset 17 unless noted):
    resnet_block.onnx          Conv->BN->Relu, Conv->BN, residual Add, Relu: what a ResNet basic block exports as
    conv_<activation>.onnx     one Conv then each activation that FusedConv takes (HardSwish: opset 14 op)
    refuse_two_consumers.onnx  a Conv whose output feeds a Relu and a second node: fusion must be refused
    refuse_graph_output.onnx   a Conv whose output is also a graph output: fusion must be refused
    mlp_head.onnx              a small conv backbone (Conv->BN->Relu x2, GlobalAveragePool) and a classifier head
                               BN -> Flatten -> Gemm -> BN -> Relu -> Gemm (weights [out, in], transB=1, as
                               torch.nn.Linear exports): the Gemm folds and FusedGemm

silero_vad_16k_op15.onnx in this folder is not made here: it is a third-party model (see README.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
OPSET = 17
CHANNELS, SIZE = 8, 16


class _Builder:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits = [], []

    def const(self, name: str, array: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def conv(self, name: str, x: str, c_in: int, c_out: int, bias: bool = True) -> str:
        w = self.const(f"{name}.weight", self.rng.standard_normal((c_out, c_in, 3, 3)).astype(np.float32) * 0.2)
        inputs = [x, w]
        if bias:
            inputs.append(self.const(f"{name}.bias", self.rng.standard_normal(c_out).astype(np.float32) * 0.1))
        self.nodes.append(helper.make_node("Conv", inputs, [f"{name}_out"], name=name, pads=[1, 1, 1, 1]))
        return f"{name}_out"

    def bn(self, name: str, x: str, c: int) -> str:
        r = self.rng
        params = [r.uniform(0.5, 1.5, c), r.standard_normal(c) * 0.1, r.standard_normal(c) * 0.1,
                  r.uniform(0.5, 1.5, c)]
        names = [self.const(f"{name}.{p}", v.astype(np.float32))
                 for p, v in zip(("scale", "bias", "mean", "var"), params)]
        self.nodes.append(helper.make_node("BatchNormalization", [x, *names], [f"{name}_out"], name=name))
        return f"{name}_out"

    def op(self, op: str, name: str, inputs: list[str], **attrs) -> str:
        self.nodes.append(helper.make_node(op, inputs, [f"{name}_out"], name=name, **attrs))
        return f"{name}_out"

    def model(self, name: str, outputs: list[str], opset: int = OPSET) -> onnx.ModelProto:
        shape = [1, CHANNELS, SIZE, SIZE]
        graph = helper.make_graph(
            self.nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
            [helper.make_tensor_value_info(o, TensorProto.FLOAT, shape) for o in outputs], self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                                  producer_name="onnxfuse sample_models", producer_version="1")
        model.ir_version = 8
        onnx.checker.check_model(model, full_check=True)
        return model


def resnet_block() -> onnx.ModelProto:
    b = _Builder(1)
    y = b.op("Relu", "relu1", [b.bn("bn1", b.conv("conv1", "x", CHANNELS, CHANNELS, bias=False), CHANNELS)])
    y = b.bn("bn2", b.conv("conv2", y, CHANNELS, CHANNELS, bias=False), CHANNELS)
    y = b.op("Relu", "relu2", [b.op("Add", "add", [y, "x"])])
    return b.model("resnet_block", [y])


#: activation -> (ONNX attributes, extra inputs given as constants, opset)
ACTIVATIONS = {
    "relu": ("Relu", {}, [], OPSET),
    "tanh": ("Tanh", {}, [], OPSET),
    "sigmoid": ("Sigmoid", {}, [], OPSET),
    "leakyrelu": ("LeakyRelu", {"alpha": 0.1}, [], OPSET),
    "clip": ("Clip", {}, [0.0, 6.0], OPSET),
    "hardsigmoid": ("HardSigmoid", {"alpha": 0.2, "beta": 0.5}, [], OPSET),
    "hardswish": ("HardSwish", {}, [], 14),
}


def conv_activation(key: str) -> onnx.ModelProto:
    op, attrs, bounds, opset = ACTIVATIONS[key]
    b = _Builder(2)
    y = b.conv("conv", "x", CHANNELS, CHANNELS)
    extra = [b.const(f"clip.{i}", np.array(v, np.float32)) for i, v in enumerate(bounds)]
    return b.model(f"conv_{key}", [b.op(op, "act", [y, *extra], **attrs)], opset)


def refuse_two_consumers() -> onnx.ModelProto:
    b = _Builder(3)
    y = b.conv("conv", "x", CHANNELS, CHANNELS)
    return b.model("refuse_two_consumers", [b.op("Relu", "relu", [y]), b.op("Sigmoid", "other", [y])])


def refuse_graph_output() -> onnx.ModelProto:
    b = _Builder(4)
    y = b.conv("conv", "x", CHANNELS, CHANNELS)
    return b.model("refuse_graph_output", [y, b.op("Relu", "relu", [y])])


def mlp_head() -> onnx.ModelProto:
    b = _Builder(5)
    hidden, classes = 32, 10
    y = b.op("Relu", "relu1", [b.bn("bn1", b.conv("conv1", "x", CHANNELS, CHANNELS, bias=False), CHANNELS)])
    y = b.op("Relu", "relu2", [b.bn("bn2", b.conv("conv2", y, CHANNELS, 2 * CHANNELS, bias=False), 2 * CHANNELS)])
    y = b.op("Flatten", "flatten", [b.bn("head.bn0", b.op("GlobalAveragePool", "pool", [y]), 2 * CHANNELS)])
    for name, c_in, c_out in (("head.fc1", 2 * CHANNELS, hidden), ("head.fc2", hidden, classes)):
        w = b.const(f"{name}.weight", b.rng.standard_normal((c_out, c_in)).astype(np.float32) * 0.3)
        bias = b.const(f"{name}.bias", b.rng.standard_normal(c_out).astype(np.float32) * 0.1)
        y = b.op("Gemm", name, [y, w, bias], transB=1)
        if name == "head.fc1":
            y = b.op("Relu", "head.relu", [b.bn("head.bn1", y, hidden)])
    graph = helper.make_graph(
        b.nodes, "mlp_head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, CHANNELS, SIZE, SIZE])],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, [1, classes])], b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="onnxfuse sample_models", producer_version="1")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def all_models() -> dict[str, onnx.ModelProto]:
    """File name -> model, for every sample."""
    models = {"resnet_block.onnx": resnet_block()}
    models.update({f"conv_{k}.onnx": conv_activation(k) for k in ACTIVATIONS})
    models["refuse_two_consumers.onnx"] = refuse_two_consumers()
    models["refuse_graph_output.onnx"] = refuse_graph_output()
    models["mlp_head.onnx"] = mlp_head()
    return models


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for name, model in all_models().items():
        data = model.SerializeToString(deterministic=True)
        path = HERE / name
        if check:
            if not path.exists() or path.read_bytes() != data:
                stale.append(name)
        else:
            path.write_bytes(data)
    if stale:
        print("out of date: " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
