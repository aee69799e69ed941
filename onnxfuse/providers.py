"""What each execution-provider target lets onnxfuse emit, as data.

Facts from onnxruntime 1.32 (``onnxruntime/contrib_ops/cpu/fused_conv.cc``, ``contrib_ops/cuda/fused_conv.cc``,
``core/graph/contrib_ops/contrib_defs.cc``), measured or read as recorded in ``shared/docs/fusedconv.md``:

* CPU: FusedConv kernel for float32 only; activations Relu, Tanh, Sigmoid, LeakyRelu([alpha]),
  Clip([min, max]), HardSigmoid([alpha, beta]), HardSwish, or none; Z (residual input) supported.
* CUDA: float32 only; ``activation`` is required and only Relu is accepted by every supported release
  (Tanh only after the 2024 cuDNN-frontend rewrite, so it is left out); Z supported.
* Both: the intersection, i.e. float32 FusedConv with activation Relu.
* ``onnx``: standard ONNX only (folds into Conv, never a contrib op), for TensorRT/OpenVINO and other runtimes.

``com.microsoft::FusedGemm`` (Gemm + activation; ``shared/docs/fusedgemm.md``): the CPU kernel
(``contrib_ops/cpu/fused_gemm.cc``) is registered for float32 only and builds its activation with
``functors::ElementWiseRangedTransform<float>::Create`` (``core/providers/cpu/activation/activations.cc``), which
knows Celu, Elu, HardSigmoid, LeakyRelu, Softplus, Relu, Sigmoid, Softsign, Tanh, ThresholdedRelu, Selu (and the
contrib ParametricSoftplus, ScaledTanh), reading ``activation_alpha``/``activation_beta``/``activation_gamma``
without defaults. Not Clip, HardSwish or Affine ("unknown kernel type"). No CUDA kernel was checked, so only target
``cpu`` emits it.
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


#: FusedGemm ``activation`` -> the ONNX attributes of that activation op that the kernel needs, as
#: ``(ONNX attribute, FusedGemm attribute, ONNX default)`` (defaults from ONNX Operators.md, written explicitly
#: because the kernel has none). Each was run against Gemm + the activation op in onnxruntime 1.32 (tests).
FUSED_GEMM_ACTIVATIONS: dict[str, tuple[tuple[str, str, float], ...]] = {
    "Relu": (),
    "Tanh": (),
    "Sigmoid": (),
    "Softsign": (),
    "Softplus": (),
    "LeakyRelu": (("alpha", "activation_alpha", 0.01),),
    "HardSigmoid": (("alpha", "activation_alpha", 0.2), ("beta", "activation_beta", 0.5)),
    "Elu": (("alpha", "activation_alpha", 1.0),),
    "Celu": (("alpha", "activation_alpha", 1.0),),
    "ThresholdedRelu": (("alpha", "activation_alpha", 1.0),),
    "Selu": (("alpha", "activation_alpha", 1.67326319217681884765625),
             ("gamma", "activation_gamma", 1.05070102214813232421875)),
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
        fused_gemm: FusedGemm ``activation`` values every provider of the target accepts (empty: no FusedGemm).
        fused_gemm_dtypes: Gemm dtypes for which every provider of the target has a FusedGemm kernel.
    """

    name: str
    fused_conv: bool
    activations: frozenset[str]
    plain_fused_conv: bool
    dtypes: frozenset[np.dtype]
    providers: tuple[str, ...]
    fused_gemm: frozenset[str] = frozenset()
    fused_gemm_dtypes: frozenset[np.dtype] = frozenset()


_F32 = frozenset({np.dtype(np.float32)})

TARGETS: dict[str, Target] = {
    "cpu+cuda": Target("cpu+cuda", True, frozenset({"Relu"}), False, _F32,
                       ("CPUExecutionProvider", "CUDAExecutionProvider")),
    "cpu": Target("cpu", True, frozenset(ACTIVATION_PARAM_COUNTS), True, _F32, ("CPUExecutionProvider",),
                  fused_gemm=frozenset(FUSED_GEMM_ACTIVATIONS), fused_gemm_dtypes=_F32),
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
