"""The passes, in the order they run: the canonicalization stage (:data:`CANONICALIZE`), then the fusion passes
(:data:`DEFAULT_PASSES`); :mod:`onnxfuse.passes.driver` repeats each stage to a fixpoint.

To add a pass (CONTRIBUTING.md, "Add a fusion"): one module here (its docstring: before => after, the math,
"Skipped when:"), one test module ``tests/passes/test_<name>.py`` with a test named after each of its ``reasons``,
its import and its place in one of the tuples below (a canonicalization pass: also its name in
``records.CANONICALIZE_NAMES``); a new refusal code is one row in ``onnxfuse/records.py`` with its remedy. The
contract is in :mod:`onnxfuse.passes.base`; shared checks in ``_checks.py``, shared fold math in ``_fold.py``.
"""

from __future__ import annotations

from onnxfuse.passes.affine_conv import AffineConv
from onnxfuse.passes.base import Context, Match, Pass
from onnxfuse.passes.batchnorm_gemm import BatchNormGemm
from onnxfuse.passes.constant_fold import ConstantFold
from onnxfuse.passes.conv_activation import ConvActivation
from onnxfuse.passes.conv_affine import ConvAffine
from onnxfuse.passes.conv_batchnorm import ConvBatchNorm
from onnxfuse.passes.conv_hardswish import ConvHardSwish
from onnxfuse.passes.conv_residual import ConvResidual
from onnxfuse.passes.conv_unfused import ConvUnfused
from onnxfuse.passes.float16_body import Float16Body
from onnxfuse.passes.gemm_activation import GemmActivation
from onnxfuse.passes.gemm_affine import GemmAffine
from onnxfuse.passes.gemm_batchnorm import GemmBatchNorm
from onnxfuse.passes.if_constant import IfConstant
from onnxfuse.passes.layout_wrapper import LayoutWrapper
from onnxfuse.passes.matmul_add import MatMulAdd
from onnxfuse.passes.matmul_batchnorm import MatMulBatchNorm
from onnxfuse.passes.pad_conv import PadConv
from onnxfuse.passes.prelu_leaky_relu import PReluLeakyRelu
from onnxfuse.passes.remove_redundant import RemoveRedundant
from onnxfuse.passes.resize_nearest import ResizeNearest
from onnxfuse.records import RewriteKind

#: Canonicalization: put exported graphs into the shape the fusion passes match, before any of them runs (the passes
#: of kind ``RewriteKind.CANONICALIZE``, named in ``onnxfuse.records.CANONICALIZE_NAMES`` for the report).
CANONICALIZE: tuple[Pass, ...] = (
    # First: a float16 body becomes float32 (target cpu), so that every pass below sees float32 weights.
    Float16Body(),
    # Constants first: a bias computed as Reshape(Constant, Constant) becomes the plain constant conv_affine
    # folds, and a Transpose/Cast of a constant disappears before remove_redundant looks at it.
    ConstantFold(),
    # An If whose condition constant_fold made (or found) constant: the branch it takes joins the graph.
    IfConstant(),
    # Identity/Dropout/Cast/Transpose pairs between a Conv and its activation break the chains matched below.
    RemoveRedundant(),
    # After remove_redundant: an Identity between Pad and Conv would hide the pair.
    PadConv(),
    # A PRelu with one slope value is LeakyRelu, which conv_activation and onnxruntime fuse into the Conv.
    PReluLeakyRelu(),
    # Exact for integer scales: the mapping onnxruntime's blocked layout keeps the Resize in.
    ResizeNearest(),
    # Last: a per-channel affine or activation after a Transpose/Squeeze/Unsqueeze/Reshape of a Conv's output
    # moves before it (TensorFlow NHWC, Conv1d written as Conv2d), where conv_affine and conv_activation see it;
    # the Transpose pairs it leaves adjacent cancel in remove_redundant's next round.
    LayoutWrapper(),
)

DEFAULT_PASSES: tuple[Pass, ...] = (
    # Folds first: they keep the node a plain Conv, so the fusions below see the conv with its BN/affine
    # constants already folded in (Conv -> BN -> Relu needs the BN gone before Relu can be fused).
    ConvBatchNorm(),
    ConvAffine(),
    # A scale/offset before a Conv with zero pads: after conv_affine, which folds it into the Conv before it
    AffineConv(),
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
    # A BN over a MatMul's output columns (through Reshape/Transpose) first: it leaves MatMul + Add for matmul_add.
    MatMulBatchNorm(),
    MatMulAdd(),
    GemmBatchNorm(),
    GemmAffine(),
    BatchNormGemm(),
    GemmActivation(),
    # Last, and never rewrites: names every Conv chain left that no pass above explains.
    ConvUnfused(),
)

#: Every pass in the order it runs.
ALL_PASSES: tuple[Pass, ...] = CANONICALIZE + DEFAULT_PASSES
PASS_NAMES: tuple[str, ...] = tuple(p.name for p in ALL_PASSES)


def select(only: tuple[str, ...] = (), skip: tuple[str, ...] = (), plugins: tuple[Pass, ...] = ()
           ) -> tuple[Pass, ...]:
    """The passes of :func:`ordered` (the built-in ones and ``plugins``) named in ``only`` (all when empty) minus
    those in ``skip``, in that order.

    Raises:
        KeyError: a name that is no pass (the message lists the valid names).
    """
    passes = ordered(plugins)
    names = tuple(p.name for p in passes)
    for name in (*only, *skip):
        if name not in names:
            raise KeyError(f"no pass named {name!r}; passes: {', '.join(names)}")
    return tuple(p for p in passes if (not only or p.name in only) and p.name not in skip)


def ordered(plugins: tuple[Pass, ...] = ()) -> tuple[Pass, ...]:
    """:data:`ALL_PASSES` with ``plugins`` (``onnxfuse.passes.plugin``) in their places: a canonicalization plugin
    after :data:`CANONICALIZE`, the others after the built-in folds and fusions, before ``conv_unfused`` (which
    names the chains left and must see what the plugins fused), each group in the order given."""
    canon = tuple(p for p in plugins if p.kind is RewriteKind.CANONICALIZE)
    other = tuple(p for p in plugins if p.kind is not RewriteKind.CANONICALIZE)
    last = tuple(p for p in DEFAULT_PASSES if isinstance(p, ConvUnfused))
    return (*CANONICALIZE, *canon, *(p for p in DEFAULT_PASSES if p not in last), *other, *last)


__all__ = ["ALL_PASSES", "CANONICALIZE", "DEFAULT_PASSES", "PASS_NAMES", "Context", "Match", "Pass", "ordered",
           "select"]
