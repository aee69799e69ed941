"""The options that say what to optimize for: ``--target``, ``--only``/``--skip``, ``--input-shape``,
``--ort-level``, ``--ort-version`` and ``--constant-initializer-inputs`` (and ``optimize``'s ``--tune``,
``--tune-budget``, ``--threads``), read into ``pipeline.Options``."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import click

from onnxfuse.cli.args.model_inputs import input_shape_option, parse_input_shapes
from onnxfuse.ort.levels import DEFAULT_ORT_LEVEL as DEFAULT_ORT_LEVEL  # re-exported: cli/report.py, cli/batch.py
from onnxfuse.ort.levels import ORT_LEVELS

if TYPE_CHECKING:
    from onnxfuse import pipeline

F = TypeVar("F", bound=Callable[..., Any])

#: providers.TARGETS (its keys, in order) and providers.DEFAULT_TARGET.
TARGET_NAMES = ("cpu+cuda", "cpu", "cuda", "onnx")
DEFAULT_TARGET = "cpu+cuda"


class PassChoice(click.Choice):
    """``click.Choice`` over ``onnxfuse.passes.PASS_NAMES``, looked up (which imports the passes and
    onnx-graphsurgeon) only when a value is checked: --only and --skip show the metavar PASS in --help."""

    def __init__(self) -> None:
        super().__init__(())

    @property
    def choices(self) -> tuple[str, ...]:
        from onnxfuse.passes import PASS_NAMES

        return tuple(PASS_NAMES)

    @choices.setter
    def choices(self, value: Sequence[str]) -> None:
        pass  # click.Choice.__init__ assigns the (empty) sequence given above; the names come from the property

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """A built-in pass name as click.Choice checks it; any other name is kept for the library, which knows the
        plugins' names too (``passes.select`` refuses a name that is no pass, listing them: exit code 2)."""
        from onnxfuse.passes import PASS_NAMES

        if isinstance(value, str) and value not in PASS_NAMES:
            return value
        return super().convert(value, param, ctx)


def target_option(help: str) -> Callable[[F], F]:
    """``--target``, one of :data:`TARGET_NAMES` (default :data:`DEFAULT_TARGET`), with the command's help."""
    return click.option("--target", type=click.Choice(TARGET_NAMES), default=DEFAULT_TARGET, show_default=True,
                        help=help)


def ort_level_option(help: str, default: str | None) -> Callable[[F], F]:
    """``--ort-level``, one of :data:`ORT_LEVELS`, with the command's help; a default is shown in --help."""
    return click.option("--ort-level", type=click.Choice(list(ORT_LEVELS)), default=default,
                        show_default=default is not None, help=help)


def _optimization_decorators() -> list[Callable[[F], F]]:
    """The group's options, in the order ``--help`` shows them (each a click decorator)."""
    return [
        target_option("What the output must run on: cpu+cuda (float32 FusedConv with Relu only), cpu (every "
                      "activation the CPU kernel has), cuda, or onnx (folds only, no contrib ops)."),
        click.option("--only", multiple=True, type=PassChoice(), metavar="PASS",
                     help="Run only this pass (repeatable). See: onnxfuse passes."),
        click.option("--skip", multiple=True, type=PassChoice(), metavar="PASS",
                     help="Do not run this pass (repeatable)."),
        input_shape_option,
        ort_level_option("The onnxruntime graph optimization level your sessions run at (default: all, "
                         "onnxruntime's own default). Forms measured slower than the unfused original at that "
                         "level are left unfused (today: FusedConv with a residual input at all, where "
                         "onnxruntime's NCHWc convs run the unfused chain faster).", default=None),
        click.option("--ort-version", metavar="X.Y",
                     help="The onnxruntime release the model will run on (default: the installed one). Forms "
                          "that release cannot load are left unfused; the summary and the model's metadata say "
                          "which release the output needs."),
        click.option("--constant-initializer-inputs", is_flag=True,
                     help="Treat initializers that are also graph inputs (IR version 4 or later; before IR 4 they "
                          "are constants anyway, as in onnxruntime) as constants, so they can be folded. Only if "
                          "nobody feeds those inputs at run time."),
        click.option("--materialize-weights", type=click.FloatRange(min=0), default=0, metavar="MIB",
                     help="Let the output grow by up to this many MiB (2^20 bytes) to store conv/Gemm weights that "
                          "the model computes from compact constants (int8 x scale, ConstantOfShape) as plain "
                          "floats. Default 0: they stay compact and folds go into their scale; onnxruntime "
                          "computes them at load. Folds that give a node its own copy of a weight other nodes "
                          "share spend it too, after a free 1 MiB for the whole model (fold-copies-shared-weight)."),
    ]


def optimization_options(fn: F) -> F:
    """Options shared by ``optimize``, ``report`` and ``bench``; :func:`to_options` reads them."""
    for deco in reversed(_optimization_decorators()):
        fn = deco(fn)
    return fn


#: ``pipeline.DEFAULT_TUNE_BUDGET_S`` (not imported here: --help loads no library).
DEFAULT_TUNE_BUDGET_S = 60.0


def tune_options(fn: F) -> F:
    """``--tune``, ``--tune-budget`` and ``--threads`` (``optimize`` only; ``batch`` and ``bench`` have no such
    option): :func:`to_options` reads them into ``pipeline.Options.tune``, ``tune_budget_s`` and ``threads``."""
    decorators = [
        click.option("--tune", is_flag=True,
                     help="Decide by measurement: time each group of rewrites (one pass, one emitted form, e.g. "
                          "every FusedConv(HardSwish)) in the installed onnxruntime at --ort-level with --threads "
                          "(CPU provider) on --input-shape (else batch 1, 224), against the model with that group "
                          "left unfused, and leave it unfused where the model is faster without it (the whole "
                          "interval below 1.0; reason slower-when-measured). The report records every group. "
                          "Default: the rule-based, deterministic choice."),
        click.option("--tune-budget", type=click.FloatRange(min=0, min_open=True), default=DEFAULT_TUNE_BUDGET_S,
                     show_default=True, metavar="SECONDS",
                     help="Seconds --tune may spend on all its groups together (passes run again, sessions, timed "
                          "rounds; each group timed runs at least 14 paired rounds; a group left without time keeps "
                          "the rule's choice)."),
        click.option("--threads", type=click.IntRange(1), default=1, show_default=True,
                     help="onnxruntime intra-op threads of the sessions --tune times (your sessions' count)."),
    ]
    for deco in reversed(decorators):
        fn = deco(fn)
    return fn


def optimization_options_except(*names: str) -> Callable[[F], F]:
    """:func:`optimization_options` without the options whose parameter names are among ``names`` (``batch``,
    whose ``input_shape`` is per model, in a manifest); the rest exactly as declared there."""
    declared = optimization_option_names()

    def apply(fn: F) -> F:
        for name, deco in reversed(list(zip(declared, _optimization_decorators(), strict=True))):
            if name not in names:
                fn = deco(fn)
        return fn

    return apply




def optimization_option_names() -> tuple[str, ...]:
    """The parameter names :func:`optimization_options` declares, read from the declaration itself (so that a
    command that must refuse them, ``bench`` with OPTIMIZED, never misses a new one)."""
    @optimization_options
    def declared() -> None:  # pragma: no cover - never called, only decorated
        pass

    return tuple(reversed([p.name for p in getattr(declared, "__click_params__", []) if p.name]))  # as declared


def to_options(target: str, only: Iterable[str], skip: Iterable[str], input_shape: Iterable[str],
               constant_initializer_inputs: bool, ort_level: str | None, ort_version: str | None = None,
               materialize_weights: float = 0.0, **more: Any) -> pipeline.Options:
    """The values of :func:`optimization_options` as ``pipeline.Options``, built by ``pipeline.make_options`` as
    the API and batch build them (``ort_level`` None: the default). ``more``: the command's other options, as
    ``make_options`` keywords (``plugins``, ``fix_input_shapes``, ``input_data``, ``bandwidth``,
    ``drop_culprits``, ``compare_layers``, ``verify``; ``tune``, ``tune_budget``, ``threads`` from
    :func:`tune_options`, for ``optimize``), parsed.

    Raises:
        InputError: ``--only`` and ``--skip`` leave no pass, a malformed ``--input-shape``, or another value
            ``make_options`` refuses.
    """
    from onnxfuse import pipeline

    return pipeline.make_options(target=target, only=only, skip=skip, input_shapes=parse_input_shapes(input_shape),
                                 constant_initializer_inputs=constant_initializer_inputs, ort_level=ort_level,
                                 ort_version=ort_version, materialize_weights=materialize_weights, **more)
