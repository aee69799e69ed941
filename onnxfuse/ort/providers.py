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

Speed rules (:data:`CPU_SLOWER_AT`): onnxruntime optimizes the graph again when a session loads, at the
session's graph optimization level (``ORT_ENABLE_ALL`` by default: NCHWc layout, its own Conv + Add/activation
fusions). An emitted form that runs slower than the unfused original at a level is not emitted for that level.
The rules come from ``benchmarks/bench_forms.py``, which times each form in isolation (BENCHMARKS.md, "Emitted
forms"); they are never derived from a particular model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

import numpy as np

from onnxfuse.ort.levels import DEFAULT_ORT_LEVEL, ORT_LEVELS

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


def form_name(activation: str | None, residual: bool) -> str:
    """The name of a FusedConv form in :data:`CPU_SLOWER_AT` and in BENCHMARKS.md: ``FusedConv(Relu)``,
    ``FusedConv(Z)`` (residual input, no activation), ``FusedConv(Z, LeakyRelu)``."""
    parts = (["Z"] if residual else []) + ([activation] if activation else [])
    return f"FusedConv({', '.join(parts)})"


#: Emitted forms measured slower than the unfused original on the CPU execution provider, and the onnxruntime
#: levels at which they are (a form not listed was faster or the same within noise at every level). Source:
#: ``python benchmarks/bench_forms.py`` (BENCHMARKS.md, "Emitted forms, isolated"); a form counts as slower at a
#: level when it lost beyond the run's measured noise, confirmed by a second timing, for some shape at 1 or 2
#: threads. Every FusedConv with a Z input loses at ``all`` for one reason: onnxruntime's NCHWc transformer
#: (``core/optimizer/nchwc_transformer.cc``, run at ORT_ENABLE_ALL) converts a Conv, and fuses the Add and the
#: activation after it into the NCHWc Conv itself, but leaves a FusedConv with a fourth (Z) input in NCHW; the
#: graph onnxruntime saves at that level shows it (``FusedConv`` instead of ``nchwc::Conv``).
CPU_SLOWER_AT: Mapping[str, frozenset[str]] = MappingProxyType({
    form_name(activation, residual=True): frozenset({"all"})
    for activation in (None, *ACTIVATION_PARAM_COUNTS)
})


#: What the canonicalizations of issue 31 emit, by pass, as :data:`CPU_SLOWER_AT` and BENCHMARKS.md name the form
#: (``onnxfuse.passes._checks.speed_rule`` looks each up before its pass rewrites). ``benchmarks/bench_forms.py``
#: times each around a Conv at every level, 1 and 2 threads (BENCHMARKS.md, "Emitted forms, isolated": the rewrites
#: of issue 31): none was slower at any level, so none is in :data:`CPU_SLOWER_AT` today.
REWRITE_FORMS: Mapping[str, str] = MappingProxyType({
    "prelu_leaky_relu": "PRelu -> LeakyRelu",
    "resize_nearest": "Resize(asymmetric, floor)",
    "float16_body": "float32 body between float16 Casts",
    "layout_wrapper": "op moved before a layout wrapper",
})


#: onnxruntime releases (major, minor) on which ``benchmarks/probe_ort_releases.py`` loaded and ran every form
#: onnxfuse can emit (the newest patch of each minor release pip serves for Python 3.11), oldest first. Results:
#: ``benchmarks/results/ort_releases.json``; table: ``benchmarks/results/ort_releases.md``.
PROBED_ORT_RELEASES: tuple[tuple[int, int], ...] = tuple((1, minor) for minor in range(15, 33))

#: Emitted form (:func:`form_name`, ``FusedGemm(activation)``) -> the oldest onnxruntime release that loads it and
#: computes what the unfused graph computes on the CPU execution provider, where that is newer than the oldest
#: probed release (a form not listed runs on every release in :data:`PROBED_ORT_RELEASES`). Source: the probe
#: above (1.15 to 1.29 refuse the HardSwish activation at session creation with
#: ``GetFusedActivationAttr(...).IsOK() was false``; 1.30 is the first that loads and matches it).
FORM_MIN_ORT: Mapping[str, tuple[int, int]] = MappingProxyType({
    form_name("HardSwish", residual=False): (1, 30),
    form_name("HardSwish", residual=True): (1, 30),
})


def gemm_form_name(activation: str) -> str:
    """The name of a FusedGemm form in :data:`FORM_MIN_ORT`: ``FusedGemm(Relu)``."""
    return f"FusedGemm({activation})"


def form_min_release(form: str) -> tuple[int, int]:
    """The oldest onnxruntime release (major, minor) that runs ``form`` (:data:`FORM_MIN_ORT`; the oldest probed
    release for a form every probed release runs)."""
    return FORM_MIN_ORT.get(form, PROBED_ORT_RELEASES[0])


def parse_release(text: str) -> tuple[int, int]:
    """``"1.20"`` or ``"1.20.1"`` -> ``(1, 20)``: an onnxruntime release as (major, minor); the patch number does
    not change which forms load.

    Raises:
        ValueError: not two or three dot-separated numbers.
    """
    parts = text.strip().split(".")
    if len(parts) not in (2, 3) or not all(p.isdigit() for p in parts):
        raise ValueError(f"{text!r} is not a release number like 1.20 or 1.20.1")
    return int(parts[0]), int(parts[1])


def release_text(release: tuple[int, int]) -> str:
    """``(1, 20)`` -> ``"1.20"``."""
    return f"{release[0]}.{release[1]}"


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
        slower_at: form name (:func:`form_name`) -> onnxruntime levels at which that form runs slower than the
            unfused original on this target's providers.
        ort_level: the graph optimization level the user's sessions run at (one of :data:`ORT_LEVELS`), or None
            to ignore the speed rules (used by ``benchmarks/bench_forms.py`` to measure every form).
        ort_version: the onnxruntime release (major, minor) the model will run on (``--ort-version``); a form
            that needs a newer one (:data:`FORM_MIN_ORT`) is not emitted. None: no release rule.
    """

    name: str
    fused_conv: bool
    activations: frozenset[str]
    plain_fused_conv: bool
    dtypes: frozenset[np.dtype]
    providers: tuple[str, ...]
    fused_gemm: frozenset[str] = frozenset()
    fused_gemm_dtypes: frozenset[np.dtype] = frozenset()
    slower_at: Mapping[str, frozenset[str]] = field(default_factory=dict, hash=False)
    ort_level: str | None = DEFAULT_ORT_LEVEL
    ort_version: tuple[int, int] | None = None

    def needs_newer(self, form: str) -> tuple[int, int] | None:
        """The release ``form`` needs when :attr:`ort_version` is older than that (it would not load there), else
        None."""
        needed = form_min_release(form)
        return needed if self.ort_version is not None and self.ort_version < needed else None

    def slower(self, form: str) -> bool:
        """True when ``form`` runs slower than the unfused original at :attr:`ort_level` (never when the level is
        None)."""
        return self.ort_level is not None and self.ort_level in self.slower_at.get(form, frozenset())


_F32 = frozenset({np.dtype(np.float32)})

TARGETS: dict[str, Target] = {
    "cpu+cuda": Target("cpu+cuda", True, frozenset({"Relu"}), False, _F32,
                       ("CPUExecutionProvider", "CUDAExecutionProvider"), slower_at=CPU_SLOWER_AT),
    "cpu": Target("cpu", True, frozenset(ACTIVATION_PARAM_COUNTS), True, _F32, ("CPUExecutionProvider",),
                  fused_gemm=frozenset(FUSED_GEMM_ACTIVATIONS), fused_gemm_dtypes=_F32, slower_at=CPU_SLOWER_AT),
    "cuda": Target("cuda", True, frozenset({"Relu"}), False, _F32, ("CUDAExecutionProvider",)),
    "onnx": Target("onnx", False, frozenset(), False, frozenset(), ()),
}

DEFAULT_TARGET = "cpu+cuda"


def get_target(name: str, ort_level: str | None = DEFAULT_ORT_LEVEL,
               ort_version: tuple[int, int] | None = None) -> Target:
    """The :class:`Target` called ``name``, for sessions that run at ``ort_level`` (None: ignore speed rules) on
    onnxruntime release ``ort_version`` (None: no release rule).

    The ``cuda`` target has no speed rules: the forms were timed on the CPU provider only.

    Raises:
        KeyError: no such target, or ``ort_level`` is not one of :data:`ORT_LEVELS`.
    """
    if ort_level is not None and ort_level not in ORT_LEVELS:
        raise KeyError(f"no onnxruntime level {ort_level!r}; levels: {', '.join(ORT_LEVELS)}")
    return replace(TARGETS[name], ort_level=ort_level, ort_version=ort_version)
