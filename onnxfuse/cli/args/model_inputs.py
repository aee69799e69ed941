"""The model-input options: ``--input-shape`` (concrete sizes for symbolic dims), ``--fix-input-shape`` (sizes
written into the output model), ``--input-data`` (real inputs),
``--input-value`` and ``--input-range`` (how generated inputs are filled)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import click

from onnxfuse.errors import InputError

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def input_shape_option(fn: F) -> F:
    """``--input-shape NAME=DIMS`` (repeatable); :func:`parse_input_shapes` reads the values."""
    return click.option("--input-shape", multiple=True, metavar="NAME=DIMS",
                        help="Concrete shape for a graph input with symbolic dims, e.g. x=1x3x640x640 (also "
                             "x:1,3,640,640 and x:[1,3,640,640], as onnxsim, onnxslim and Polygraphy write it; "
                             "repeatable).")(fn)


def fix_input_shape_option(fn: F) -> F:
    """``--fix-input-shape NAME=DIMS`` (repeatable, the spellings of ``--input-shape``); :func:`parse_fix_input_shapes`
    reads the values."""
    return click.option("--fix-input-shape", multiple=True, metavar="NAME=DIMS",
                        help="Write this shape into the output's graph input (a static model: onnxsim's "
                             "--overwrite-input-shape), fold what becomes constant (Shape of a static tensor) and "
                             "verify at exactly this size; spelled as --input-shape (repeatable).")(fn)


def parse_fix_input_shapes(values: Iterable[str]) -> dict[str, tuple[int, ...]]:
    """``--fix-input-shape`` values as graph input name -> dims (as :func:`parse_input_shapes`).

    Raises:
        InputError: a malformed value, or one input named twice.
    """
    from onnxfuse.model.shape_text import parse_input_shape

    def parse(text: str) -> tuple[str, tuple[int, ...]]:
        try:
            return parse_input_shape(text)
        except InputError as exc:
            raise InputError(str(exc).replace("--input-shape", "--fix-input-shape", 1)) from None

    return _pairs(values, parse, "--fix-input-shape")


def input_data_option(help: str) -> Callable[[F], F]:
    """``--input-data FILE.npz`` (an existing file), with the help text of the command that reads it."""
    return click.option("--input-data", type=click.Path(exists=True, dir_okay=False), metavar="FILE.npz",
                        help=help)


def input_value_options(fn: F) -> F:
    """--input-value and --input-range, for every command that runs onnxruntime."""
    fn = click.option("--input-range", multiple=True, metavar="NAME=LOW,HIGH",
                      help="Seeded uniform values in [LOW, HIGH) for a float input, integers in [LOW, HIGH] for an "
                           "integer one (repeatable).")(fn)
    return click.option("--input-value", multiple=True, metavar="NAME=V",
                        help="Feed this value to an input (a scalar, or a fill value for the input's shape), e.g. "
                             "sr=16000 (repeatable).")(fn)


def parse_input_shapes(values: Iterable[str]) -> dict[str, tuple[int, ...]]:
    """``--input-shape`` values as graph input name -> dims (``onnxfuse.model.shape_text``, which loads no
    heavy library: a malformed value is a usage error answered before onnx and numpy load).

    Raises:
        InputError: a malformed value, or one input named twice.
    """
    from onnxfuse.model.shape_text import parse_input_shape

    return _pairs(values, parse_input_shape, "--input-shape")


@dataclass
class InputFeeds:
    """What onnxruntime is fed: ``data``, the path of an ``.npz`` of real inputs (a regular file); ``values``,
    input name -> fill value; ``ranges``, input name -> ``(low, high)`` (``onnxfuse.ort.sessions.InputSpec``)."""

    data: str | None = None
    values: dict[str, float] = field(default_factory=dict)
    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)


def parse_input_feeds(input_data: str | None, input_value: Iterable[str], input_range: Iterable[str]) -> InputFeeds:
    """``--input-data``, ``--input-value`` and ``--input-range`` checked and parsed, in that order.

    Raises:
        InputError: ``--input-data`` is no regular file (``/dev/zero`` would be read forever), a malformed value
            or range, or one input named twice.
    """
    from onnxfuse.ort.sessions import parse_input_range, parse_input_value

    if input_data is not None:
        from onnxfuse import pipeline

        pipeline.check_regular_file(input_data, "--input-data")
    return InputFeeds(input_data, _pairs(input_value, parse_input_value, "--input-value"),
                      _pairs(input_range, parse_input_range, "--input-range"))


def _pairs(values: Iterable[str], parse: Callable[[str], tuple[str, T]], option: str) -> dict[str, T]:
    out: dict[str, T] = {}
    for text in values:
        name, value = parse(text)
        if name in out:
            raise InputError(f"{option} {name} is given twice")
        out[name] = value
    return out
