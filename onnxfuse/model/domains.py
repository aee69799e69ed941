"""ONNX operator domains (ONNX IR.md, "Operator Sets"): the default one and onnxruntime's contrib ops."""

from __future__ import annotations

#: onnxruntime's contrib operator domain (FusedConv, FusedGemm: onnxruntime/core/graph/contrib_ops).
MS_DOMAIN = "com.microsoft"

#: The names of the default ONNX domain as they appear in models (``""`` and ``"ai.onnx"``) and as
#: onnx-graphsurgeon reports an empty one (None).
DEFAULT_DOMAINS = ("", "ai.onnx", None)


def is_default_domain(domain: str | None) -> bool:
    """True when ``domain`` (a ``NodeProto.domain``, ``OperatorSetIdProto.domain`` or graphsurgeon
    ``Node.domain``) names the default ONNX domain."""
    return domain in DEFAULT_DOMAINS
