"""``--input-shape`` text: the spellings of onnxfuse and of its peers, parsed without importing onnx or numpy (a
usage error answers before any heavy import).

Accepted, for a graph input ``x`` (the name may itself hold ``:``, as TensorFlow's ``input:0`` does: the last
``=`` or, without one, the last ``:`` separates it):

* ``x=1x3x640x640``: onnxfuse's own;
* ``x:1,3,640,640``: onnxsim's ``--overwrite-input-shape`` and onnxslim's ``--input-shapes``;
* ``x:[1,3,640,640]``: Polygraphy's ``--input-shapes``;
* ``x=`` or ``x:[]``: a scalar.
"""

from __future__ import annotations

import re

from onnxfuse.errors import InputError

#: Largest dim accepted (onnx stores dims as int64; anything near that is a typo).
MAX_DIM = 2**31 - 1

EXAMPLES = "NAME=1x3x640x640, NAME:1,3,640,640 or NAME:[1,3,640,640]"


def parse_input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """Parse one ``--input-shape`` value (see the module docstring for the spellings) into ``(name, dims)``.

    Raises:
        InputError: one line naming the value: no name, dims that are not integers, or a dim outside
            1..:data:`MAX_DIM`.
    """
    if "=" in text:
        name, _, dims = text.rpartition("=")
    else:
        name, _, dims = text.rpartition(":")
    if not name:
        raise InputError(f"--input-shape {text!r}: expected a graph input name and its dims, e.g. {EXAMPLES}")
    dims = dims.strip()
    if dims[:1] in "[(" and dims[-1:] in "])" and dims:
        dims = dims[1:-1].strip()
    parts = [p.strip() for p in re.split(r"[x,]", dims)] if dims else []
    if not all(re.fullmatch(r"[0-9]+", p) for p in parts):
        raise InputError(f"--input-shape {text!r}: dims must be integers separated by 'x' or ',', e.g. {EXAMPLES}")
    shape = tuple(int(p) for p in parts)
    if any(d <= 0 or d > MAX_DIM for d in shape):
        raise InputError(f"--input-shape {text!r}: dims must be between 1 and {MAX_DIM}")
    return name, shape
