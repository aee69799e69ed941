"""Never stricter for nothing: the fused nodes whose form needs a newer onnxruntime than the input model did.

A FusedConv form can need a newer onnxruntime release than the model it came from (``providers.FORM_MIN_ORT``:
FusedConv(HardSwish) loads from 1.30 on). At the user's graph optimization level onnxruntime may fuse that chain
itself at load (at ``all`` its NCHWc Conv absorbs a HardSwish whose reader is another blocked Conv,
``core/optimizer/nchwc_transformer.cc``): the form then buys nothing and only makes the output refuse to load on
older releases. The pipeline (``pipeline._keep_portable``) decides by onnxruntime's own optimized graphs at that
level: it runs the passes again with the outputs :func:`raising_outputs` names in ``Context.portable``, where
``fusedconv.target_check`` refuses such a form (``form-made-by-onnxruntime-itself``) and the chain keeps its input
form, and keeps that portable result unless the fused one leaves onnxruntime fewer kernels to run.

The decision is for the whole model, not per chain: once one fused node gains, the model needs the newer release
anyway, and the other fused nodes of that form raise it no further.
"""

from __future__ import annotations

from collections.abc import Iterable

import onnx_graphsurgeon as gs

from onnxfuse.ir import edit
from onnxfuse.model import domains
from onnxfuse.ort.providers import PROBED_ORT_RELEASES, form_min_release, form_name


def input_min_release(forms: Iterable[str]) -> tuple[int, int]:
    """The oldest onnxruntime release that loads the forms ``forms`` (``pipeline.emitted_forms`` of the input model)
    already hold: ``providers.form_min_release`` of the most demanding, the oldest probed release for none."""
    return max((form_min_release(f) for f in forms), default=PROBED_ORT_RELEASES[0])


def raising_outputs(graph: gs.Graph, base: tuple[int, int]) -> dict[str, str]:
    """Output tensor name -> form (``providers.form_name``) of every FusedConv in ``graph`` and its subgraphs whose
    form needs an onnxruntime release newer than ``base``."""
    found: dict[str, str] = {}
    for sub in edit.all_graphs(graph):
        for node in sub.nodes:
            if node.op != "FusedConv" or node.domain != domains.MS_DOMAIN or not node.outputs:
                continue
            act = node.attrs.get("activation")
            act = act.decode() if isinstance(act, bytes) else act
            form = form_name(act, len(node.inputs) > 3 and bool(node.inputs[3].name))
            if form_min_release(form) > base:
                found[node.outputs[0].name] = form
    return found
