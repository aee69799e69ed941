"""The passes, in the order they run (repeated to a fixpoint by ``onnxfuse.pipeline``).

To add a fusion: one module here (its docstring: before => after, the math, "Skipped when:"), one test module
``tests/passes/test_<name>.py`` with a test named after each of its ``reasons``, one line in :data:`DEFAULT_PASSES`.
The contract is in :mod:`onnxfuse.passes.base`; shared checks in ``_checks.py``, shared fold math in ``_fold.py``.
"""

from __future__ import annotations

from onnxfuse.passes.base import Context, Fusion, Match, Pass, Reason, Skip
from onnxfuse.passes.batchnorm_gemm import BatchNormGemm
from onnxfuse.passes.conv_activation import ConvActivation
from onnxfuse.passes.conv_affine import ConvAffine
from onnxfuse.passes.conv_batchnorm import ConvBatchNorm
from onnxfuse.passes.conv_hardswish import ConvHardSwish
from onnxfuse.passes.conv_residual import ConvResidual
from onnxfuse.passes.gemm_activation import GemmActivation
from onnxfuse.passes.gemm_affine import GemmAffine
from onnxfuse.passes.gemm_batchnorm import GemmBatchNorm
from onnxfuse.passes.matmul_add import MatMulAdd

DEFAULT_PASSES: tuple[Pass, ...] = (
    # Folds first: they keep the node a plain Conv, so the fusions below see the conv with its BN/affine
    # constants already folded in (Conv -> BN -> Relu needs the BN gone before Relu can be fused).
    ConvBatchNorm(),
    ConvAffine(),
    # Residual before the activation pass: Conv -> Add -> Relu must become one FusedConv with Z; the activation
    # pass never sees it (Relu's producer is the Add), and it later adds an activation to a plain FusedConv.
    ConvResidual(),
    # The written-out HardSwish reads the conv output twice; it must be claimed whole before conv_activation
    # would see Conv -> HardSigmoid and refuse it as shared.
    ConvHardSwish(),
    ConvActivation(),
    # Fully connected layers. MatMul + bias Add becomes a Gemm first, so the folds below see it. Folds of what
    # follows a Gemm run before batchnorm_gemm, so Gemm -> BN -> Gemm folds the BN forward (into the Gemm before
    # it), and all folds run before gemm_activation (Gemm -> BN -> Relu needs the BN gone first).
    MatMulAdd(),
    GemmBatchNorm(),
    GemmAffine(),
    BatchNormGemm(),
    GemmActivation(),
)

PASS_NAMES: tuple[str, ...] = tuple(p.name for p in DEFAULT_PASSES)


def select(only: tuple[str, ...] = (), skip: tuple[str, ...] = ()) -> tuple[Pass, ...]:
    """The passes of :data:`DEFAULT_PASSES` named in ``only`` (all when empty) minus those in ``skip``, in the
    default order.

    Raises:
        KeyError: a name that is no pass (the message lists the valid names).
    """
    for name in (*only, *skip):
        if name not in PASS_NAMES:
            raise KeyError(f"no pass named {name!r}; passes: {', '.join(PASS_NAMES)}")
    return tuple(p for p in DEFAULT_PASSES if (not only or p.name in only) and p.name not in skip)


__all__ = ["DEFAULT_PASSES", "PASS_NAMES", "Context", "Fusion", "Match", "Pass", "Reason", "Skip", "select"]
