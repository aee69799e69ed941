"""The whole model's growth from folds into shared weights: a fold never edits a tensor in place
(``_fold.set_weights``, ``_gemm.set_gemm_weights``), so a Conv or Gemm whose weight other nodes also read gets a new,
folded copy while the original stays for them. One weight read by N convs, each with its own
BatchNormalization, then grew the model by N - 1 copies of it, without limit (a 9.9 MB model became 1.89 GB).

Such copies spend a budget of the whole model: :attr:`onnxfuse.passes.base.Context.shared_copy_bytes` (1 MiB,
``base.SHARED_COPY_GROWTH_BYTES``), then what ``--materialize-weights`` allows
(:attr:`~onnxfuse.passes.base.Context.materialize_bytes`). A fold whose copies do not fit is declined with
:attr:`onnxfuse.records.Reason.SHARED_WEIGHT_GROWTH`. The fold that makes the last reader of a weight its own adds
nothing: the original leaves the model with it.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from onnxfuse.passes._checks import skip
from onnxfuse.passes.base import Context
from onnxfuse.records import Reason, Skip


def _shared(tensor: gs.Tensor, node: gs.Node, ctx: Context) -> bool:
    """True when ``tensor`` stays in the model after ``node`` stops reading it: another node reads it, or it is a
    graph output."""
    graph_outputs = ctx.graph.outputs if ctx.graph is not None else []
    return any(reader is not node for reader in tensor.outputs) or any(tensor is o for o in graph_outputs)


def copy_bytes(node: gs.Node, ctx: Context, new: dict[int, np.ndarray | None]) -> int:
    """Bytes the model grows by when ``node``'s inputs at the slots of ``new`` (1: the weight, 2: the bias) are
    replaced by new arrays ``new[slot]`` (None: that input is left as it is): the sizes of those whose old tensor
    other nodes still read."""
    grown = 0
    for slot, array in new.items():
        if array is None or slot >= len(node.inputs) or not node.inputs[slot].name:
            continue
        if _shared(node.inputs[slot], node, ctx):
            grown += int(np.asarray(array).nbytes)
    return grown


def check(node: gs.Node, ctx: Context, new: dict[int, np.ndarray | None], nodes: list[gs.Node],
          output: gs.Tensor) -> Skip | None:
    """A :attr:`Reason.SHARED_WEIGHT_GROWTH` Skip when the copies :func:`copy_bytes` counts exceed what the whole
    model may still grow by (``ctx.shared_copy_bytes + ctx.materialize_bytes``); None when they fit."""
    grown = copy_bytes(node, ctx, new)
    left = ctx.shared_copy_bytes + ctx.materialize_bytes
    if grown and grown > left:
        return skip(Reason.SHARED_WEIGHT_GROWTH,
                    f"{node.inputs[1].name} is also read by other nodes: the fold would add a copy of "
                    f"{grown} bytes, and the model may grow by {left} bytes more (pass --materialize-weights)",
                    nodes, output)
    return None


def spend(node: gs.Node, ctx: Context, new: dict[int, np.ndarray | None]) -> None:
    """Spend the growth of replacing ``node``'s inputs by ``new`` (as :func:`copy_bytes`): from
    ``ctx.shared_copy_bytes`` first, then ``ctx.materialize_bytes``. Call before the inputs are replaced."""
    grown = copy_bytes(node, ctx, new)
    free = min(grown, ctx.shared_copy_bytes)
    ctx.shared_copy_bytes -= free
    ctx.materialize_bytes = max(0, ctx.materialize_bytes - (grown - free))
