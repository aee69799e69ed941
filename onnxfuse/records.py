"""What the passes record, as plain data (no pass, no onnx-graphsurgeon): every reason a pass gives for leaving a
pattern unfused with what would let it be fused (:class:`Reason`, one row per reason), the :class:`Skip` and
:class:`Fusion` records the passes return, and the kind of each rewrite (:class:`RewriteKind`). Every report format
reads them from here (``onnxfuse.report.remedies``), without importing any pass.

A new refusal code is one row of :class:`Reason`: its ``NAME = ("kebab-case-code", "what would let the pattern be
fused")``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class RewriteKind(str, Enum):
    """What a pass's rewrites do (``Pass.kind``, ``Fusion.kind``); compares equal to its value.

    ``canonicalize``: puts an exported graph into the shape the fusions match, removing nodes (constant folding,
    redundant ops, Pad into Conv); these passes run first, as their own stage (``onnxfuse.passes.CANONICALIZE``).
    ``fold``: folds constants that follow a Conv or Gemm (BatchNormalization, Mul/Add/Sub/Div by a constant) into
    its weights; the node stays a plain Conv or Gemm. ``fuse``: merges a chain into one node (FusedConv, FusedGemm,
    MatMul + Add into Gemm), or lists the chains left unfused.
    """

    CANONICALIZE = "canonicalize"
    FOLD = "fold"
    FUSE = "fuse"

    def __str__(self) -> str:
        return self.value


#: Names of the canonicalization passes (``RewriteKind.CANONICALIZE``; the stage ``onnxfuse.passes.CANONICALIZE``
#: runs before the others). The report counts their rewrites as removed nodes, not as fused ones.
CANONICALIZE_NAMES: frozenset[str] = frozenset({"constant_fold", "remove_redundant", "pad_conv",
                                                "prelu_leaky_relu", "resize_nearest", "float16_body",
                                                "layout_wrapper", "if_constant"})


class Reason(str, Enum):
    """Named reasons for declining a pattern (the ``reason`` of a ``Skip``).

    The value is the kebab-case code that reports, JSON and tests show; it compares equal to that string.
    :attr:`remedy` says what option, target or export change would let the pattern be fused ("none: ..." when
    nothing would). Each pass lists the reasons it can give in ``Pass.reasons``; ``onnxfuse passes`` prints them.
    """

    remedy: str

    def __new__(cls, code: str, remedy: str) -> Reason:
        member = str.__new__(cls, code)
        member._value_ = code
        member.remedy = remedy
        return member

    NOT_PRIVATE = (
        "intermediate-has-other-consumers",
        "none: another node reads the intermediate tensor, so fusing would compute it twice")
    GRAPH_OUTPUT = (
        "intermediate-is-graph-output",
        "none while the intermediate tensor is a graph output (remove that output from the model to allow it)")
    WEIGHTS_NOT_CONSTANT = (
        "weights-not-constant",
        "export the weights as initializers or Constant nodes (e.g. with constant folding on)")
    PARAMS_NOT_CONSTANT = (
        "parameters-not-constant",
        "export the parameters as initializers or Constant nodes (e.g. with constant folding on)")
    INITIALIZER_IS_INPUT = (
        "initializer-is-graph-input",
        "--constant-initializer-inputs (only if nobody feeds those inputs at run time)")
    TRAINING_MODE = (
        "batchnorm-training-mode",
        "export the model in inference mode (BatchNormalization training_mode=0)")
    PARAM_SHAPE = ("parameter-shape-mismatch", "none: the parameter does not have one value per output channel")
    NOT_PER_CHANNEL = ("constant-not-per-channel", "none: the constant varies along more than the channel axis")
    CONV_IS_DIVISOR = ("conv-output-is-divisor", "none: the conv output is the divisor, which no fold can express")
    ZERO_DIVISOR = ("zero-in-divisor", "none: the divisor holds a zero")
    ACTIVATION_UNSUPPORTED = (
        "activation-not-supported-by-target",
        "a target whose FusedConv or FusedGemm accepts the activation")
    NO_CONTRIB_OPS = (
        "target-allows-no-contrib-ops",
        "a target with FusedConv or FusedGemm (onnx emits standard ONNX ops only)")
    DTYPE_NO_KERNEL = ("dtype-has-no-fusedconv-kernel", "no target: onnxruntime has FusedConv kernels for float32 only")
    DTYPE_NOT_FOLDABLE = ("dtype-not-foldable", "none: onnxfuse folds floating-point weights only")
    CLIP_BOUNDS_NOT_CONSTANT = ("clip-bounds-not-constant", "export Clip's min and max as constants")
    RESIDUAL_SHAPE = ("residual-shape-mismatch", "none: FusedConv's Z input must have exactly the conv output's shape")
    QDQ = ("quantized-conv", "none: quantized convs are left to onnxruntime's QDQ fusions")
    QDQ_GEMM = ("quantized-gemm", "none: quantized Gemm and MatMul patterns are left to onnxruntime's QDQ fusions")
    FOLD_NOT_FINITE = ("fold-not-finite", "none: the folded weights would overflow the dtype")
    MATMUL_NOT_2D = ("matmul-input-not-2d", "none: Gemm takes 2-D inputs only")
    NOT_PER_FEATURE = ("constant-not-per-feature", "none: the constant varies along more than the feature axis")
    GEMM_IS_DIVISOR = ("gemm-output-is-divisor", "none: the Gemm output is the divisor, which no fold can express")
    GEMM_TRANS_A = ("gemm-input-transposed", "none: with transA=1 the BatchNormalization channels are Gemm's rows")
    FLATTEN_REORDERS = (
        "flatten-reorders-features",
        "none: the Flatten or Reshape before the Gemm does not keep one sample's features per row")
    DTYPE_NO_FUSED_GEMM = (
        "dtype-has-no-fusedgemm-kernel",
        "no target: onnxruntime has FusedGemm kernels for float32 only")
    BN_SPATIAL = (
        "batchnorm-spatial-0",
        "none: BatchNormalization with spatial=0 has statistics per element, not per channel")
    CONSTANT_NOT_FOLDED = (
        "constant-not-folded",
        "let constant_fold fold the constant (do not --skip it); its own row says why it did not")
    NO_FUSEDCONV_FORM = ("op-has-no-fusedconv-form", "none: onnxruntime's FusedConv has no form for this op")
    CHAIN_BROKEN = ("chain-broken-by-op", "none: no pass removes the op in between")
    # canonicalization (onnxfuse.passes.CANONICALIZE)
    FOLD_GROWS = ("fold-grows-model", "none: the folded constant would grow the model past onnxfuse's limit")
    FOLD_SIZE_UNKNOWN = (
        "fold-size-unknown",
        "none: the size of the folded constant cannot be known without computing it")
    RANDOM_OP = ("random-op", "none: the op draws new values on every run")
    QDQ_NODE = ("quantize-dequantize-node", "none: left for onnxruntime's QDQ fusions")
    EVALUATION_FAILED = ("evaluation-failed", "none: onnxruntime could not evaluate the node")
    DROPOUT_TRAINING = ("dropout-training-mode", "export the model in inference mode (Dropout training_mode false)")
    DROPOUT_MASK = ("dropout-mask-used", "none while another node reads the Dropout mask")
    PAD_MODE = ("pad-mode-not-constant", "none: only a constant-mode Pad folds into the Conv's pads")
    PAD_VALUE = ("pad-value-not-zero", "none: Conv pads with zeros")
    PAD_AXES = ("pad-on-batch-or-channel", "none: Conv pads the spatial axes only")
    PAD_NEGATIVE = ("negative-pads", "none: negative pads crop, which Conv's pads cannot")
    PAD_AXES_INVALID = (
        "pad-axes-invalid",
        "fix the model: the Pad's axes or pads do not fit its input (onnxruntime refuses it)")
    AUTO_PAD = ("conv-auto-pad-set", "export the Conv with explicit pads (auto_pad NOTSET)")
    SLOWER_AT_ORT_LEVEL = (
        "slower-than-unfused-at-ort-level",
        "--ort-level extended (or basic, disable) if your onnxruntime sessions run below ORT_ENABLE_ALL; at all, "
        "onnxruntime's NCHWc layout runs the unfused chain faster")
    NEEDS_NEWER_ORT = (
        "form-needs-newer-onnxruntime",
        "deploy on the onnxruntime release the detail names (or newer) and give it as --ort-version")
    CONV_PADS_NONZERO = (
        "conv-pads-not-zero",
        "none: the Conv pads its input with zeros, which the scale and offset before it would not have touched")
    PRELU_NOT_UNIFORM = (
        "prelu-slope-not-uniform",
        "none: a PRelu slope with more than one value (per channel) has no LeakyRelu form")
    PRELU_SLOPE_SHAPE = (
        "prelu-slope-shape",
        "none: the slope must broadcast to X without growing it, and X's rank must be known")
    PRELU_DTYPE = ("prelu-dtype-not-float32", "none: onnxruntime's CPU PRelu and LeakyRelu kernels are float32 only")
    RESIZE_MODE = ("resize-mode-not-nearest", "none: only a nearest Resize has an exact asymmetric form")
    RESIZE_COORDINATES = (
        "resize-coordinate-mode",
        "none: this coordinate_transformation_mode maps to other pixels than asymmetric/floor")
    RESIZE_NEAREST_MODE = (
        "resize-nearest-mode",
        "none: nearest_mode floor or ceil after half_pixel picks other pixels than asymmetric/floor")
    RESIZE_SCALE = ("resize-scale-not-integer", "none: only whole-number upscales map pixels as asymmetric/floor does")
    RESIZE_SIZES = (
        "resize-sizes-not-multiple",
        "export the Resize with scales (or with static input extents); none if sizes are no whole multiple")
    RESIZE_EXTENT = ("resize-extent-too-large", "none: float32 coordinates are not exact for so large an extent")
    F16_TARGET = ("target-not-cpu", "--target cpu, where onnxruntime has no float16 Conv kernel to keep")
    F16_KERNEL = (
        "float16-kernel-exists",
        "none: onnxruntime's CPU provider on this machine runs the op in float16 itself")
    F16_OP = ("float16-op-not-handled", "none: onnxfuse cannot carry this op's float16 meaning into float32")
    F16_SUBGRAPH = ("float16-graph-has-subgraphs", "none: float16 models with If/Loop/Scan bodies keep float16")
    F16_OUTPUT = ("float16-output-not-computed", "none: a float16 graph output that no node computes stays float16")
    MADE_BY_ORT_ITSELF = (
        "form-made-by-onnxruntime-itself",
        "none needed: onnxruntime fuses the chain itself at load at this --ort-level (no fewer kernels with the "
        "fused form), which would only need a newer onnxruntime than the input model does")
    # passes from outside the package (onnxfuse.passes.plugin): a plugin's own conditions, named in its detail
    PLUGIN_DECLINED = (
        "declined-by-plugin",
        "none from onnxfuse: the detail says which condition of the plugin pass the pattern fails")
    BROKE_VERIFICATION = (
        "rewrite-broke-verification",
        "none: this rewrite moved an output beyond verification's tolerance (a bug in the pass the detail names, "
        "onnxfuse's or a plugin's: please report it to its authors with the model); the culprit search left it "
        "unfused and verified the rest (--drop-culprits writes that)")
    SLOWER_WHEN_MEASURED = (
        "slower-when-measured",
        "none needed: --tune timed this group of rewrites in your onnxruntime (release, --ort-level, --threads, CPU "
        "provider, your input sizes) and the model ran faster without it (the report's tune section gives the "
        "ratio and its interval); without --tune the rule-based form is written")
    SHARED_WEIGHT_GROWTH = (
        "fold-copies-shared-weight",
        "--materialize-weights MIB lets the model grow by a folded copy of a weight other nodes also read (the "
        "first 1 MiB of such copies in all is free); or export one weight per node")
    LAYOUT_SHAPE = (
        "layout-wrapper-shape-unknown",
        "--input-shape (or a static Reshape shape / Squeeze axes in the export): the wrapper's axis mapping needs "
        "the rank and extents it moves")
    LAYOUT_SPLIT = (
        "layout-wrapper-splits-channels",
        "none: the Reshape or Squeeze merges or removes the conv's channel axis, so no per-channel constant maps "
        "across it")
    BN_AXIS_NOT_FEATURE = (
        "batchnorm-axis-not-matmul-feature",
        "none: the BatchNormalization normalizes another axis than the MatMul's output columns (or a Reshape "
        "between them has shapes that are not known: --fix-input-shape)")
    IN_FUNCTION = (
        "inside-model-function",
        "none: onnxfuse leaves the bodies of model-local functions (ModelProto.functions) as they are; an exporter "
        "option that inlines them (or onnx.inliner.inline_local_functions) puts the pattern in the main graph")

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


@dataclass(frozen=True)
class Skip:
    """A pattern that was found but is not rewritten.

    Attributes:
        reason: why (a :class:`Reason`).
        detail: one human sentence, naming the target or dtype where that is the cause.
        nodes: ``(name, op_type, first output name)`` of the matched nodes, Conv first.
        output: name of the tensor a fused node would have written.
        pass_name: the pass that found the pattern (filled in by the driver, ``onnxfuse.passes.driver``).
    """

    reason: Reason
    detail: str
    nodes: tuple[tuple[str, str, str], ...]
    output: str
    pass_name: str = ""


@dataclass(frozen=True)
class Fusion:
    """One applied rewrite, as the report shows it: a fusion, a fold or a canonicalization (:attr:`kind`).

    Attributes:
        pass_name: the pass that made it.
        node: name of the node that now computes the chain ("" when a canonicalization left none: a folded
            constant, a removed no-op).
        op: that node's op type after the rewrite (``Conv``, ``ConvTranspose``, ``FusedConv``, ``Gemm`` or
            ``FusedGemm``; "" as for ``node``).
        replaced: ``(name, op_type, first output name)`` of every original node, Conv first.
        activation: FusedConv/FusedGemm ``activation`` (None for folds, canonicalizations and plain FusedConv).
        output: name of the tensor the fused node writes.
        kind: the pass's :class:`RewriteKind`; the JSON report's ``fusions[].kind`` (``fold`` or ``fuse``: a
            fold that a later fusion extended is part of a fusion) comes from it. Canonicalizations are no fusion
            row (the report tells them apart by pass name, :data:`CANONICALIZE_NAMES`).
        site: the rewrite's key, set by the driver (``onnxfuse.passes.driver.site_key``): the graph's name, the
            pass and the names of the nodes it matched, in order; the same in a run of the passes that leaves
            other sites out, so the culprit search (:mod:`onnxfuse.verification.search`) can name one to leave
            unfused (``Context.excluded``). Not in the JSON report.
    """

    pass_name: str
    node: str
    op: str
    replaced: tuple[tuple[str, str, str], ...]
    activation: str | None
    output: str
    kind: RewriteKind
    site: tuple[str, ...] = ()
