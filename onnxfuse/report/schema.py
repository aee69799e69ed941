"""The shape of the report's dict (``Report.to_dict()``, the JSON form that ``onnxfuse/report.schema.json``
documents field by field): the constants both the data module and the presentation read, and typed shapes of its
top-level fields for mypy. Plain data: imports nothing of onnxfuse.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, TypeAlias, TypedDict

#: What the presentation and the renderers read: a report dict (:class:`ReportDict`), an escaped copy of one, or the
#: part of one a function needs (``{"symbols": ...}``).
Doc: TypeAlias = Mapping[str, Any]

#: ``schema_version`` of the JSON form.
SCHEMA_VERSION = 3

#: The verification reason of a report that ``onnxfuse report`` (or the API's ``analyse``) made: nothing was run.
REPORT_DOES_NOT_VERIFY = "onnxfuse report does not verify"


class SideTotals(TypedDict):
    """``totals.before`` / ``totals.after``: bytes for the input shapes used (None: unknown) and as expressions."""

    read_bytes: int | None
    read_bytes_expr: str | None
    written_bytes: int | None
    written_bytes_expr: str | None
    total_bytes: int | None
    total_bytes_expr: str | None
    nodes: int
    unknown_nodes: int


class BatchOne(TypedDict):
    """``totals.at_batch_1``: the totals at batch 1 where the batch is the only symbolic dim."""

    symbol: str
    before_total_bytes: int | None
    after_total_bytes: int | None
    saved_bytes: int | None


class Totals(TypedDict):
    """``totals``: both sides, the bytes saved (before - after) and the share saved, in percent."""

    before: SideTotals
    after: SideTotals
    saved_bytes: int | None
    saved_bytes_expr: str | None
    saved_percent: float | None
    saved_percent_as_dims_grow: float | None
    at_batch_1: BatchOne | None


class Bandwidth(TypedDict):
    """``bandwidth``: the estimated memory time (milliseconds) at ``gb_per_s`` (10^9 bytes per second)."""

    gb_per_s: float
    before_ms: float | None
    after_ms: float | None
    at: str | None
    estimate: bool


class _ReportRequired(TypedDict):
    schema_version: int
    onnxfuse_version: str
    model: dict[str, Any]
    target: str
    passes: list[str]
    input_shapes: dict[str, list[int]]
    unknown_shapes: list[dict[str, Any]]
    symbols: dict[str, dict[str, Any]]
    symbol_values: dict[str, int]
    shape_assumptions: list[str]
    totals: Totals
    op_counts: dict[str, dict[str, int]]
    fusions: list[dict[str, Any]]
    unfused: list[dict[str, Any]]
    pass_stats: list[dict[str, Any]]
    unknown_nodes: list[dict[str, Any]]
    nodes: dict[str, list[dict[str, Any]]]
    subgraph_nodes: int
    warnings: list[str]
    verification: dict[str, Any]
    bandwidth: Bandwidth | None


class ReportDict(_ReportRequired, total=False):
    """The whole JSON form; ``onnxruntime``, ``deployment``, ``profile`` and ``tune`` are present only when
    computed."""

    onnxruntime: dict[str, Any]
    deployment: dict[str, Any]
    profile: dict[str, Any]
    tune: dict[str, Any]


class SupportsToDict(Protocol):
    """What the renderers and the summary read a report through: its JSON-ready dict."""

    def to_dict(self) -> ReportDict: ...
