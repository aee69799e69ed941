"""The memory-traffic report: data (``Report``) and its renderers (text, JSON, Markdown). Never prints.

The JSON form is documented field by field in ``onnxfuse/report.schema.json`` (``schema_version`` 1); bytes are
exact integers there, while text and Markdown show KiB/MiB/GiB (powers of 1024).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from onnxfuse._version import __version__
from onnxfuse.passes import CANONICALIZE_NAMES, Fusion, Skip
from onnxfuse.traffic import ModelIndex, NodeTraffic, Sizes, chain_bytes, fused_estimate, totals

SCHEMA_VERSION = 1

#: Rows shown per table in text and Markdown unless ``show_all`` (largest byte figures first).
DEFAULT_TOP_ROWS = 20


@dataclass
class Report:
    """Everything ``onnxfuse report`` and ``optimize --report`` show; ``to_dict()`` is the JSON form.

    Attributes (byte figures are integers for the input shapes used):
        model: ``path`` (or ``<ModelProto>``), ``sha256``, ``file_bytes``, ``external_data``.
        target: the ``--target``; passes: the pass names that ran, in order.
        totals: ``before`` / ``after`` (``read_bytes``, ``written_bytes``, ``total_bytes``, ``nodes``,
            ``unknown_nodes``), ``saved_bytes``, ``saved_percent``.
        fusions: one dict per fused node (``node``, ``op``, ``replaced``, ``activation``, ``saved_bytes``...).
        unfused: one dict per pattern left unfused (``nodes``, ``reason``, ``detail``, ``bytes``).
        verification: an ``onnxfuse.verification.Verification`` (None for ``analyse``).
        The rest is documented field by field in ``onnxfuse/report.schema.json``.
    """

    model: dict[str, Any]
    target: str
    passes: list[str]
    input_shapes: dict[str, list[int]]
    unknown_shapes: list[dict]
    totals: dict[str, Any]
    op_counts: dict[str, dict[str, int]]
    fusions: list[dict]
    unfused: list[dict]
    pass_stats: list[dict]
    unknown_nodes: list[dict]
    subgraph_nodes: int
    nodes: dict[str, list[dict]]
    shapes_measured: bool = False
    warnings: list[str] | None = None
    verification: Any = None
    bandwidth: dict | None = None
    onnxfuse_version: str = __version__

    @property
    def saved_bytes(self) -> int | None:
        """Bytes of memory traffic the rewrites removed (before - after), for the shapes used; None if unknown."""
        return self.totals["saved_bytes"]

    @property
    def before_bytes(self) -> int | None:
        """Bytes read plus written by every node of the input model (nodes of unknown size left out)."""
        return self.totals["before"]["total_bytes"]

    @property
    def after_bytes(self) -> int | None:
        """Bytes read plus written by every node of the optimized model (nodes of unknown size left out)."""
        return self.totals["after"]["total_bytes"]

    def to_json(self) -> str:
        """The JSON form (see ``report.schema.json``): sorted keys, 2-space indent, trailing newline."""
        return to_json(self)

    def to_markdown(self, show_all: bool = False) -> str:
        """Markdown for pull-request comments and CI job summaries (top rows unless ``show_all``)."""
        return to_markdown(self, show_all)

    def to_text(self, show_all: bool = False, width: int = 120) -> str:
        """Terminal tables without colour codes, ``width`` columns wide (top rows unless ``show_all``)."""
        return to_text(self, show_all, width)

    def set_bandwidth(self, gb_per_s: float) -> None:
        """Add the estimated memory time at ``gb_per_s`` (10^9 bytes per second): bytes / bandwidth."""
        before = self.totals["before"]["total_bytes"]
        after = self.totals["after"]["total_bytes"]
        self.bandwidth = {"gb_per_s": gb_per_s, "before_ms": before / (gb_per_s * 1e9) * 1e3,
                          "after_ms": after / (gb_per_s * 1e9) * 1e3, "estimate": True}

    def verification_dict(self) -> dict[str, Any]:
        """The ``verification`` object of the JSON form (``skipped`` when nothing verified, as in ``report``)."""
        if self.verification is None:
            return {"status": "skipped", "reason": "onnxfuse report does not verify"}
        return self.verification.to_dict()

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready dict described by ``report.schema.json``."""
        verification = self.verification_dict()
        return {
            "schema_version": SCHEMA_VERSION,
            "onnxfuse_version": self.onnxfuse_version,
            "model": self.model,
            "target": self.target,
            "passes": self.passes,
            "input_shapes": self.input_shapes,
            "unknown_shapes": self.unknown_shapes,
            "totals": self.totals,
            "op_counts": self.op_counts,
            "fusions": self.fusions,
            "unfused": self.unfused,
            "pass_stats": self.pass_stats,
            "unknown_nodes": self.unknown_nodes,
            "nodes": self.nodes,
            "subgraph_nodes": self.subgraph_nodes,
            "shapes_measured": self.shapes_measured,
            "warnings": list(self.warnings or []),
            "verification": verification,
            "bandwidth": self.bandwidth,
        }


def _shape_of(info: dict, elems: dict, name: str) -> tuple[list | None, str | None]:
    shape = info.get(name, (None, None))[0]
    elem = elems.get(name)
    dtype = dtype_name(elem) if elem else None
    return (list(shape) if shape is not None else None), dtype


def dtype_name(elem_type: int) -> str:
    """numpy-style name of an ONNX dtype (``float32``, ``float16``, ``int64``; ``bfloat16`` where numpy has none)."""
    try:
        return str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)))
    except (KeyError, TypeError, ValueError):
        return onnx.helper.tensor_dtype_to_string(elem_type).replace("TensorProto.", "").lower()


def _side(rows: list[NodeTraffic]) -> dict[str, int]:
    t = totals(rows)
    return {"read_bytes": t.read_bytes, "written_bytes": t.written_bytes, "total_bytes": t.total_bytes,
            "nodes": t.nodes, "unknown_nodes": t.unknown_nodes}


def _node_row(r: NodeTraffic) -> dict:
    return {"name": r.name, "op": r.op, "output": r.key, "read_bytes": r.read_bytes,
            "written_bytes": r.written_bytes, "subgraph": r.subgraph}


def removed_outputs(f: Fusion) -> list[str]:
    """First-output names (in the input model) of the nodes a canonicalization rewrite ``f`` deleted: every
    replaced node except the one that still computes the result (``f.node``; empty when none does)."""
    return [key for name, op, key in f.replaced if not (f.node and name == f.node and op == f.op)]


def build(*, loaded, target: str, passes: list[str], input_shapes: dict, missing: list[dict], measured: bool,
          before_rows: list[NodeTraffic], after_rows: list[NodeTraffic], before_ops: dict, after_ops: dict,
          fusions: list[Fusion], skips: list[Skip], after_index: ModelIndex, after_sizes: Sizes,
          size_info: dict, size_elems: dict) -> Report:
    """Assemble a :class:`Report` from the pipeline's pieces (see ``pipeline.analyse``).

    Fusions that built on each other (a BN fold, then the activation) become one row per final node, listing
    every original node; its ``saved_bytes`` = traffic of the original nodes - traffic of the final node.
    An unfused pattern's ``bytes`` = traffic of its nodes - what one fused node would move
    (``traffic.fused_estimate``). Either is None when a size is unknown.
    """
    before = {r.key: r for r in before_rows}
    after = {r.key: r for r in after_rows}
    # lineage: current first-output name of a node -> the original nodes it now computes
    lineage: dict[str, dict] = {}
    for f in fusions:
        if f.pass_name in CANONICALIZE_NAMES:
            continue  # canonicalization removes nodes; it is reported per pass below, not as a fused node
        originals, passes_used, activation = [], [], None
        for name, op, key in f.replaced:
            prev = lineage.pop(key, None)
            if prev:
                originals.extend(prev["replaced"])
                passes_used.extend(prev["passes"])
                activation = prev["activation"] or activation
            else:
                originals.append({"name": name, "op": op, "output": key})
        passes_used.append(f.pass_name)
        lineage[f.output] = {"replaced": originals, "passes": passes_used, "activation": f.activation or activation,
                             "node": f.node, "op": f.op}
    fusion_rows = []
    for key, entry in lineage.items():
        before_b = chain_bytes(before, [o["output"] for o in entry["replaced"]])
        row = after.get(key)
        after_b = row.total_bytes if row is not None else None
        shape, dtype = _shape_of(size_info, size_elems, key)
        fusion_rows.append({
            "node": entry["node"] or key, "op": entry["op"], "replaced": entry["replaced"],
            "activation": entry["activation"], "passes": entry["passes"], "output": key, "shape": shape,
            "dtype": dtype, "bytes_before": before_b, "bytes_after": after_b,
            "saved_bytes": None if before_b is None or after_b is None else before_b - after_b,
        })
    unfused_rows = []
    for s in skips:
        if s.pass_name in CANONICALIZE_NAMES:
            continue  # not a fusion pattern: counted per pass (pass_stats); conv_unfused lists broken conv chains
        keys = [k for _, _, k in s.nodes]
        chain = chain_bytes(after, keys)
        fused = fused_estimate(after_index, keys, s.output, after_sizes)
        unfused_rows.append({
            "pass": s.pass_name, "nodes": [{"name": n, "op": op, "output": k} for n, op, k in s.nodes],
            "reason": str(s.reason), "detail": s.detail, "output": s.output,
            "bytes": None if chain is None or fused is None else chain - fused,
        })
    before_t, after_t = _side(before_rows), _side(after_rows)
    saved = before_t["total_bytes"] - after_t["total_bytes"]
    stats = []
    for name in passes:
        applied = sum(1 for f in fusions if f.pass_name == name)
        reasons: dict[str, int] = {}
        for s in skips:
            if s.pass_name == name:
                reasons[str(s.reason)] = reasons.get(str(s.reason), 0) + 1
        row = {"name": name, "applied": applied, "skipped": dict(sorted(reasons.items()))}
        if name in CANONICALIZE_NAMES:
            keys = [k for f in fusions if f.pass_name == name for k in removed_outputs(f)]
            row["removed_nodes"] = len(keys)
            row["removed_bytes"] = chain_bytes(before, keys) if keys else 0
        stats.append(row)
    return Report(
        model={"path": loaded.label, "sha256": loaded.sha256, "file_bytes": loaded.file_bytes,
               "external_data": loaded.external_data},
        target=target, passes=list(passes), input_shapes={k: list(v) for k, v in input_shapes.items()},
        unknown_shapes=missing,
        totals={"before": before_t, "after": after_t, "saved_bytes": saved,
                "saved_percent": round(100.0 * saved / before_t["total_bytes"], 2) if before_t["total_bytes"]
                else 0.0},
        op_counts={"before": before_ops, "after": after_ops},
        fusions=fusion_rows, unfused=unfused_rows, pass_stats=stats,
        unknown_nodes=[{"node": r.name, "op": r.op, "output": r.key, "tensors": list(r.unknown)}
                       for r in after_rows if r.total_bytes is None],
        subgraph_nodes=sum(1 for r in before_rows if r.subgraph),
        nodes={"before": [_node_row(r) for r in before_rows], "after": [_node_row(r) for r in after_rows]},
        shapes_measured=measured,
    )


# ---------------------------------------------------------------------------------------------------------------
# Renderers


def human_bytes(n: int | None) -> str:
    """``n`` bytes as B/KiB/MiB/GiB (powers of 1024) with one decimal; "?" for None."""
    if n is None:
        return "?"
    sign, v = ("-" if n < 0 else ""), float(abs(n))
    for unit in ("B", "KiB", "MiB", "GiB"):
        if v < 1024 or unit == "GiB":
            return f"{sign}{v:.0f} {unit}" if unit == "B" else f"{sign}{v:.1f} {unit}"
        v /= 1024
    return f"{sign}{v:.1f} TiB"  # pragma: no cover


def to_json(report: Report) -> str:
    """The report as JSON (sorted keys, 2-space indent, trailing newline): stable for diffs in CI."""
    return json.dumps(report.to_dict(), indent=2, sort_keys=True) + "\n"


def _top(rows: list[dict], key: str, show_all: bool) -> tuple[list[dict], int]:
    ordered = sorted(rows, key=lambda r: -(r.get(key) or 0))
    if show_all or len(ordered) <= DEFAULT_TOP_ROWS:
        return ordered, 0
    return ordered[:DEFAULT_TOP_ROWS], len(ordered) - DEFAULT_TOP_ROWS


def _chain(nodes: list[dict]) -> str:
    return " -> ".join(n["op"] for n in nodes)


def _verification_line(report: Report) -> str:
    v = report.verification_dict()
    line = f"verification: {v['status']}"
    if v.get("summary"):
        line += f" ({v['summary']})"
    elif v.get("reason"):
        line += f" ({v['reason']})"
    elif v.get("max_abs_error") is not None:
        line += f" (max abs error {v['max_abs_error']:.3g}, max rel error {v['max_rel_error']:.3g})"
    return line


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def summary_lines(report: Report, hints: bool = True) -> list[str]:
    """The short summary ``optimize`` prints: totals, fusion count, unfused count, verification, and (when
    ``hints``) :func:`unknown_shapes_hint`."""
    t = report.totals
    before, after = t["before"], t["after"]
    scope = ""
    if before["unknown_nodes"] or after["unknown_nodes"]:
        scope = (f" (only the {before['nodes'] - before['unknown_nodes']} of {before['nodes']} nodes whose "
                 "sizes are known)")
    rewrites = sum(s["applied"] for s in report.pass_stats)
    lines = [
        f"traffic{scope}: {human_bytes(before['total_bytes'])} -> {human_bytes(after['total_bytes'])} "
        f"(saved {human_bytes(t['saved_bytes'])}, {t['saved_percent']:.1f}%)",
        f"fusions: {_plural(len(report.fusions), 'fused node')} from {_plural(rewrites, 'rewrite')}, "
        f"{_plural(len(report.unfused), 'pattern')} left unfused (target {report.target})",
        _verification_line(report),
    ]
    if report.bandwidth:
        b = report.bandwidth
        lines.append(f"estimated memory time at {b['gb_per_s']:g} GB/s (bytes / bandwidth, an estimate): "
                     f"{b['before_ms']:.3f} ms -> {b['after_ms']:.3f} ms")
    hint = unknown_shapes_hint(report) if hints else None
    if hint:
        lines.append(hint)
    return lines


def unknown_shapes_hint(report: Report) -> str | None:
    """``unknown shapes: give --input-shape for ...`` naming each graph input whose symbolic dims left sizes
    unknown, or None when there is none."""
    if not report.unknown_shapes:
        return None
    return "unknown shapes: give --input-shape for " + ", ".join(
        f"{u['input']} {u['shape']}" for u in report.unknown_shapes)


def _label(node: dict) -> str:
    """A node's name, or its output tensor's name when the model left the node unnamed."""
    return node["name"] or node["output"]


def to_text(report: Report, show_all: bool = False, width: int = 110) -> str:
    """Terminal tables (rich, no colour codes), ``width`` columns wide, the largest rows first."""
    from rich import box  # imported here: only the text format needs it, and it costs start-up time
    from rich.console import Console
    from rich.table import Table
    buf = io.StringIO()
    console = Console(file=buf, width=width, color_system=None, force_terminal=False, highlight=False)
    m = report.model
    console.print(f"onnxfuse {report.onnxfuse_version} memory-traffic report")
    console.print(f"model: {m['path']}  sha256 {m['sha256'][:16]}...  {human_bytes(m['file_bytes'])}")
    shapes = ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in report.input_shapes.items()) or "from the model"
    console.print(f"target: {report.target}   input shapes: {shapes}")
    for line in summary_lines(report) + [f"warning: {w}" for w in report.warnings or []]:
        console.print(line)
    if report.shapes_measured:
        console.print("note: some tensor sizes were measured in one onnxruntime run on random inputs "
                      "(onnx shape inference could not resolve them)")
    if report.subgraph_nodes:
        console.print(f"note: {report.subgraph_nodes} nodes inside If/Loop/Scan bodies are counted once each")

    def table(title: str, columns: list[tuple[str, dict]]) -> Table:
        t = Table(title=title, box=box.SIMPLE, title_justify="left", pad_edge=False)
        for name, opts in columns:
            t.add_column(name, **opts)
        return t

    right, fold = {"justify": "right", "no_wrap": True}, {"overflow": "fold"}
    t = report.totals
    tab = table("Totals (bytes moved to and from device memory)",
                [("", {}), ("read", right), ("written", right), ("total", right), ("nodes", right),
                 ("unknown nodes", right)])
    for side in ("before", "after"):
        s = t[side]
        tab.add_row(side, human_bytes(s["read_bytes"]), human_bytes(s["written_bytes"]),
                    human_bytes(s["total_bytes"]), str(s["nodes"]), str(s["unknown_nodes"]))
    tab.add_row("saved", "", "", f"{human_bytes(t['saved_bytes'])} ({t['saved_percent']:.1f}%)", "", "")
    console.print()
    console.print(tab)
    rows, hidden = _top(report.fusions, "saved_bytes", show_all)
    tab = table(f"Fusions applied ({len(report.fusions)})",
                [("node", fold), ("replaced", fold), ("activation", {"no_wrap": True}), ("output", fold),
                 ("saved", right)])
    for r in rows:
        tab.add_row(r["node"], _chain(r["replaced"]), r["activation"] or "",
                    f"{'x'.join(map(str, r['shape'] or ['?']))} {r['dtype'] or '?'}", human_bytes(r["saved_bytes"]))
    console.print(tab)
    if hidden:
        console.print(f"... {hidden} more fusions (use --all to show every row)")
    rows, hidden = _top(report.unfused, "bytes", show_all)
    tab = table(f"Left unfused ({len(report.unfused)})",
                [("nodes", fold), ("reason", {"no_wrap": True}), ("detail", fold), ("would save", right)])
    for r in rows:
        tab.add_row(f"{_label(r['nodes'][0])}: {_chain(r['nodes'])}", r["reason"], r["detail"],
                    human_bytes(r["bytes"]))
    console.print()
    console.print(tab)
    if hidden:
        console.print(f"... {hidden} more patterns (use --all to show every row)")
    tab = table("Passes", [("pass", {}), ("rewrites", right), ("nodes removed", right), ("skipped by reason", fold)])
    for s in report.pass_stats:
        removed = (f"{s['removed_nodes']} ({human_bytes(s['removed_bytes'])})" if "removed_nodes" in s else "")
        tab.add_row(s["name"], str(s["applied"]), removed,
                    ", ".join(f"{k} {v}" for k, v in s["skipped"].items()) or "-")
    console.print()
    console.print(tab)
    ops = report.op_counts
    tab = table("Nodes by op type", [("op", {}), ("before", right), ("after", right)])
    for op in sorted(set(ops["before"]) | set(ops["after"])):
        tab.add_row(op, str(ops["before"].get(op, 0)), str(ops["after"].get(op, 0)))
    console.print()
    console.print(tab)
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n"


def _md_row(cells: list[str]) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def to_markdown(report: Report, show_all: bool = False) -> str:
    """GitHub-flavoured Markdown for a pull-request comment or a CI job summary."""
    t = report.totals
    m = report.model
    out = [f"### onnxfuse memory-traffic report: `{m['path']}`", "",
           f"onnxfuse {report.onnxfuse_version} · target `{report.target}` · sha256 `{m['sha256'][:16]}` · "
           + _verification_line(report), ""]
    out += [f"> **Warning:** {w}" for w in report.warnings or []] + ([""] if report.warnings else [])
    if report.unknown_shapes:
        out += ["> Unknown shapes: give `--input-shape` for " + ", ".join(
            f"`{u['input']}` {u['shape']}" for u in report.unknown_shapes), ""]
    out += [_md_row(["", "read", "written", "total", "nodes"]), _md_row(["---"] * 5)]
    for side in ("before", "after"):
        s = t[side]
        out.append(_md_row([side, human_bytes(s["read_bytes"]), human_bytes(s["written_bytes"]),
                            human_bytes(s["total_bytes"]), s["nodes"]]))
    out += ["", f"**Saved {human_bytes(t['saved_bytes'])} ({t['saved_percent']:.1f}%)** of memory traffic "
                f"with {len(report.fusions)} fusions; {len(report.unfused)} patterns left unfused.", ""]
    if report.bandwidth:
        b = report.bandwidth
        out += [f"Estimated memory time at {b['gb_per_s']:g} GB/s (estimate): {b['before_ms']:.3f} ms -> "
                f"{b['after_ms']:.3f} ms", ""]
    rows, hidden = _top(report.fusions, "saved_bytes", show_all)
    out += [f"#### Fusions applied ({len(report.fusions)})", "",
            _md_row(["node", "replaced", "activation", "saved"]), _md_row(["---"] * 4)]
    out += [_md_row([f"`{r['node']}`", _chain(r["replaced"]), r["activation"] or "", human_bytes(r["saved_bytes"])])
            for r in rows]
    if hidden:
        out.append(f"\n_{hidden} more rows not shown._")
    rows, hidden = _top(report.unfused, "bytes", show_all)
    out += ["", f"#### Left unfused ({len(report.unfused)})", "",
            _md_row(["nodes", "reason", "detail", "would save"]), _md_row(["---"] * 4)]
    out += [_md_row([f"`{_label(r['nodes'][0])}` {_chain(r['nodes'])}", f"`{r['reason']}`", r["detail"],
                     human_bytes(r["bytes"])]) for r in rows]
    if hidden:
        out.append(f"\n_{hidden} more rows not shown._")
    return "\n".join(out) + "\n"


def render(report: Report, fmt: str, show_all: bool = False, width: int = 120) -> str:
    """Render ``report`` as ``fmt`` (``text``, ``json`` or ``markdown``).

    Raises:
        ValueError: unknown format.
    """
    if fmt == "json":
        return to_json(report)
    if fmt == "markdown":
        return to_markdown(report, show_all)
    if fmt == "text":
        return to_text(report, show_all, width)
    raise ValueError(f"unknown report format {fmt!r}")


def format_for_path(path: str) -> str | None:
    """Report format implied by a file extension (.json, .md/.markdown, .txt), or None."""
    lower = path.lower()
    for ext, fmt in ((".json", "json"), (".md", "markdown"), (".markdown", "markdown"), (".txt", "text")):
        if lower.endswith(ext):
            return fmt
    return None
