"""numpy <-> ONNX element types (``TensorProto.DataType``, ONNX IR.md "Tensor Element Types"), through onnx's
own tables (``onnx.helper.tensor_dtype_to_np_dtype``, ``np_dtype_to_tensor_dtype``). Types numpy lacks
(bfloat16, the float8 and 4-bit types) map to onnx's ``ml_dtypes`` types.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx


def np_dtype(elem_type: int) -> np.dtype:
    """The numpy dtype of ONNX ``elem_type``.

    Raises:
        KeyError: ``elem_type`` is no ONNX tensor type onnx knows (``UNDEFINED`` included).
    """
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))


def np_dtype_or_none(elem_type: int) -> np.dtype | None:
    """:func:`np_dtype`, or None where it fails."""
    try:
        return np_dtype(elem_type)
    except (KeyError, TypeError, ValueError):
        return None


def onnx_dtype(dtype: Any) -> int:
    """The ONNX ``TensorProto.DataType`` of numpy ``dtype`` (anything ``np.dtype`` accepts).

    Raises:
        KeyError: no ONNX type has this dtype; TypeError: ``dtype`` is no numpy dtype.
    """
    return onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def onnx_dtype_or_none(dtype: Any) -> int | None:
    """:func:`onnx_dtype`, or None where it fails."""
    try:
        return onnx_dtype(dtype)
    except (KeyError, TypeError, ValueError):
        return None
