"""The options that say how to compare the optimized model with the original: real or generated inputs, how
many input sets, fixed tolerances, a work budget and a wall-clock safety stop, read into
``verification.options.VerifyOptions``."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from onnxfuse.cli.args.model_inputs import input_data_option, input_value_options, parse_input_feeds
from onnxfuse.errors import InputError

if TYPE_CHECKING:
    from onnxfuse.verification.options import VerifyOptions

F = TypeVar("F", bound=Callable[..., Any])

#: verification.options.DEFAULT_TIMEOUT_S and DEFAULT_WORK_S (spelled out here: ``--help`` imports no library).
DEFAULT_TIMEOUT_S = 1800.0
DEFAULT_WORK_S = 600.0


def _verify_decorators() -> list[Callable[[F], F]]:
    """The group's options, in the order ``--help`` shows them (each a click decorator)."""
    return [
        input_data_option("Real inputs for verification: an .npz with one array per graph input name."),
        input_value_options,
        click.option("--input-sets", type=click.IntRange(1), default=1, show_default=True,
                     help="Seeded random input sets to compare on (each costs one more onnxruntime run per model)."),
        click.option("--rtol", type=click.FloatRange(min=0),
                     help="Use elementwise |got - ref| <= atol + rtol * |ref| instead of the noise-floor rule "
                          "(a missing one is 0)."),
        click.option("--atol", type=click.FloatRange(min=0),
                     help="Absolute tolerance of that elementwise rule (see --rtol)."),
        click.option("--verify-budget", type=click.FloatRange(min=0), metavar="CPU-SECONDS",
                     help="Work for the verification and the comparison with onnxruntime's graphs together, in "
                          "CPU seconds of this process (not wall time: the verdict is the same however loaded the "
                          "machine is); when spent verification is skipped (reason: work). 0: no limit. "
                          f"[default: {DEFAULT_WORK_S:g}]"),
        click.option("--verify-timeout", type=click.FloatRange(min=0), metavar="SECONDS",
                     help="Wall-clock safety stop beside --verify-budget, for runs that wait rather than work; "
                          "when it is reached verification is skipped (reason: time), never hangs. 0: no limit. "
                          f"[default: {DEFAULT_TIMEOUT_S:g}]"),
    ]


def verify_options(fn: F) -> F:
    """The options of ``optimize`` and ``verify`` that say how to compare; :func:`to_verify_options` reads them."""
    for deco in reversed(_verify_decorators()):
        fn = deco(fn)
    return fn


def verify_options_except(*names: str) -> Callable[[F], F]:
    """:func:`verify_options` without the options whose parameter names are ``names`` (``batch``, whose inputs are
    per model, in a manifest); the rest exactly as declared there."""
    def apply(fn: F) -> F:
        for deco in reversed(_verify_decorators()):
            probe = deco(lambda: None)
            declared = {p.name for p in getattr(probe, "__click_params__", [])}
            if not declared & set(names):
                fn = deco(fn)
        return fn

    return apply


def to_verify_options(input_shapes: dict[str, tuple[int, ...]], input_data: str | None,
                      input_value: Iterable[str], input_range: Iterable[str], input_sets: int, rtol: float | None,
                      atol: float | None, verify_timeout: float | None, verify_budget: float | None = None
                      ) -> VerifyOptions:
    """The values of :func:`verify_options` (and the parsed ``--input-shape``) as ``VerifyOptions``, built by
    ``verification.options.make_verify_options`` as the API and batch build them.

    Raises:
        InputError: a tolerance, time or budget that is not finite, or a bad input feed
            (:func:`parse_input_feeds`).
    """
    check_verify_values(rtol, atol, verify_timeout, verify_budget)
    feeds = parse_input_feeds(input_data, input_value, input_range)
    from onnxfuse.verification.options import make_verify_options

    return make_verify_options(input_shapes=input_shapes, input_data=feeds.data, input_values=feeds.values,
                               input_ranges=feeds.ranges, input_sets=input_sets, rtol=rtol, atol=atol,
                               verify_timeout=verify_timeout, verify_budget=verify_budget)


def check_verify_values(rtol: float | None, atol: float | None, verify_timeout: float | None,
                        verify_budget: float | None) -> None:
    """Refuse a tolerance, time or budget that is not finite (click's ranges let ``inf`` and ``nan`` through), as
    :func:`to_verify_options` does, without importing verification (a ``--no-verify`` run checks them too).

    Raises:
        InputError: naming the option.
    """
    for name, value in (("--rtol", rtol), ("--atol", atol), ("--verify-timeout", verify_timeout),
                        ("--verify-budget", verify_budget)):
        if value is not None and not math.isfinite(value):
            raise InputError(f"{name} must be a finite number")
