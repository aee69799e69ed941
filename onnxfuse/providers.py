"""What each execution-provider target lets onnxfuse emit, as data.

Facts from onnxruntime 1.32 (``onnxruntime/contrib_ops/cpu/fused_conv.cc``, ``contrib_ops/cuda/fused_conv.cc``,
``core/graph/contrib_ops/contrib_defs.cc``), measured or read as recorded in ``shared/docs/fusedconv.md``:

* CPU: FusedConv kernel for float32 only; activations Relu, Tanh, Sigmoid, LeakyRelu([alpha]),
  Clip([min, max]), HardSigmoid([alpha, beta]), HardSwish, or none; Z (residual input) supported.
* CUDA: float32 only; ``activation`` is required and only Relu is accepted by every supported release
  (Tanh only after the 2024 cuDNN-frontend rewrite, so it is left out); Z supported.
* Both: the intersection, i.e. float32 FusedConv with activation Relu.
* ``onnx``: standard ONNX only (folds into Conv, never a contrib op), for TensorRT/OpenVINO and other runtimes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Number of ``activation_params`` the CPU kernel demands for each activation (fused_conv.cc / MLAS activation).
ACTIVATION_PARAM_COUNTS = {
    "Relu": 0,
    "Tanh": 0,
    "Sigmoid": 0,
    "HardSwish": 0,
    "LeakyRelu": 1,
    "Clip": 2,
    "HardSigmoid": 2,
}


@dataclass(frozen=True)
class Target:
    """Rules for one target.

    Attributes:
        name: the ``--target`` value.
        fused_conv: whether ``com.microsoft::FusedConv`` may be emitted at all.
        activations: FusedConv ``activation`` values every provider of the target accepts.
        plain_fused_conv: whether a FusedConv without an activation (Conv + residual Z only) may be emitted.
        dtypes: Conv dtypes for which every provider of the target has a FusedConv kernel.
        providers: onnxruntime execution providers the target stands for (for messages and docs).
    """

    name: str
    fused_conv: bool
    activations: frozenset[str]
    plain_fused_conv: bool
    dtypes: frozenset[np.dtype]
    providers: tuple[str, ...]


_F32 = frozenset({np.dtype(np.float32)})

TARGETS: dict[str, Target] = {
    "cpu+cuda": Target("cpu+cuda", True, frozenset({"Relu"}), False, _F32,
                       ("CPUExecutionProvider", "CUDAExecutionProvider")),
    "cpu": Target("cpu", True, frozenset(ACTIVATION_PARAM_COUNTS), True, _F32, ("CPUExecutionProvider",)),
    "cuda": Target("cuda", True, frozenset({"Relu"}), False, _F32, ("CUDAExecutionProvider",)),
    "onnx": Target("onnx", False, frozenset(), False, frozenset(), ()),
}

DEFAULT_TARGET = "cpu+cuda"


def get_target(name: str) -> Target:
    """The :class:`Target` called ``name``.

    Raises:
        KeyError: no such target.
    """
    return TARGETS[name]
