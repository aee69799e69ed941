"""Options that contradict each other, or that do nothing without another: one usage error naming both, before
any work (``error: --no-verify and --require-verify contradict each other: ...``, ``error: --profile-timeout needs
--profile: ...``; exit 2 as every usage error, ``cli/exits.py``).

An option counts as given when it is on the command line or in the environment (click's ``ParameterSource``), so
a default never conflicts: ``--input-sets 1`` with ``--no-verify`` is refused, the default 1 is not.
"""

from __future__ import annotations

from collections.abc import Iterable

import click
from click.core import ParameterSource

from onnxfuse.errors import InputError

#: ``(option, option, why)``: parameter names of two options that contradict each other (or, in ``*_NEEDS``, of an
#: option and the one it needs).
Rule = tuple[str, str, str]

_NO_VERIFY_WHY = "--no-verify runs no verification"

#: ``onnxfuse optimize``: what needs the verification that ``--no-verify`` turns off.
OPTIMIZE_CONFLICTS: tuple[Rule, ...] = (
    ("no_verify", "require_verify", f"--require-verify exits 1 whenever verification did not run, and "
                                    f"{_NO_VERIFY_WHY}"),
    ("no_verify", "drop_culprits", f"--drop-culprits ships what verified after a failed verification, and "
                                   f"{_NO_VERIFY_WHY}"),
    ("no_verify", "layers", f"--layers compares tensors when verification fails, and {_NO_VERIFY_WHY}"),
    ("no_verify", "tune", "--tune times the rewrites in onnxruntime sessions, and --no-verify makes no onnxruntime "
                          "session at all"),
    *((("no_verify", name, f"{flag} says how verification runs, and {_NO_VERIFY_WHY}"))
      for name, flag in (("input_sets", "--input-sets"), ("rtol", "--rtol"), ("atol", "--atol"),
                         ("verify_timeout", "--verify-timeout"), ("verify_budget", "--verify-budget"),
                         ("input_value", "--input-value"),
                         ("input_range", "--input-range"))),
)

#: ``onnxfuse report``: options that do nothing without another (``(option, what it needs, why)``).
REPORT_NEEDS: tuple[Rule, ...] = (
    ("profile_timeout", "profile", "it limits the profiler's runs, which only --profile makes"),
)

#: ``onnxfuse optimize``: options that do nothing without another (``(option, what it needs, why)``).
OPTIMIZE_NEEDS: tuple[Rule, ...] = (
    ("tune_budget", "tune", "it bounds the timings, which only --tune makes"),
    ("threads", "tune", "it sets the threads of the sessions --tune times"),
)

#: ``onnxfuse batch``: what needs verification (as for ``optimize``: the options batch has), and ``--merge`` joins
#: summaries already made, so no option of a run applies to it.
BATCH_CONFLICTS: tuple[Rule, ...] = (
    *(rule for rule in OPTIMIZE_CONFLICTS if rule[1] in ("drop_culprits", "layers", "input_sets", "rtol", "atol",
                                                          "verify_timeout", "verify_budget")),
    *(("merge", name, f"--merge joins summaries already made: {flag} applies to a run of models")
      for name, flag in (("shard", "--shard"), ("ray_address", "--ray"), ("jobs", "--jobs"),
                         ("timeout", "--timeout"), ("max_memory", "--max-memory"), ("target", "--target"),
                         ("ort_level", "--ort-level"), ("no_verify", "--no-verify"),
                         ("drop_culprits", "--drop-culprits"), ("plugins", "--plugin"))),
)


def given(ctx: click.Context, name: str) -> bool:
    """True when the option with parameter name ``name`` was given on the command line or in the environment."""
    return ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)


def option_name(ctx: click.Context, name: str) -> str:
    """How ``--help`` spells the option with parameter name ``name`` (its longest flag: ``--jobs``, not ``-j``)."""
    for param in ctx.command.params:
        if param.name == name and param.opts:
            return max(param.opts, key=len)
    return name


def check_conflicts(ctx: click.Context, rules: Iterable[Rule]) -> None:
    """Refuse the first pair of ``rules`` whose options were both given.

    Raises:
        InputError: one line naming both options and why they cannot go together (exit 2).
    """
    for a, b, why in rules:
        if given(ctx, a) and given(ctx, b):
            raise InputError(f"{option_name(ctx, a)} and {option_name(ctx, b)} contradict each other: {why}")


def check_needs(ctx: click.Context, rules: Iterable[Rule]) -> None:
    """Refuse the first option of ``rules`` given without the option it needs.

    Raises:
        InputError: one line naming both options and why the first needs the second (exit 2).
    """
    for a, b, why in rules:
        if given(ctx, a) and not given(ctx, b):
            raise InputError(f"{option_name(ctx, a)} needs {option_name(ctx, b)}: {why}")


def check_passes(only: Iterable[str], skip: Iterable[str]) -> None:
    """Refuse a pass named by both ``--only`` and ``--skip`` (which of the two wins would be a guess).

    Raises:
        InputError: one line naming the options and the passes.
    """
    both = sorted(set(only) & set(skip))
    if both:
        raise InputError(f"--only and --skip contradict each other: both name {', '.join(both)}")
