"""Compare a traffic report with an earlier one (``onnxfuse report MODEL --baseline OLD.json``): the CI gate an
export pipeline runs when it upgrades its exporter (torch, paddle2onnx). Never prints.

Both sides are JSON reports (``Report.to_dict()``, ``schema_version`` 3, or 2 for a baseline). Fusions and
unfused patterns are matched by what they are, not by node names (exporters rename nodes): a fusion is its op,
activation and the chain of original op types; an unfused pattern is its chain and reason. The gate fails when

* a kind of fusion occurs fewer times than before (a fusion was lost) and no new fusion covers its chain and more
  (a BN fold that became part of a FusedConv is *extended*, not lost), or
* the optimized traffic (``totals.after.total_bytes_expr``) grew: the difference new - old, an expression in the
  symbols, is positive at the input shapes the new report used (if any) or at any of the sample sizes
  :data:`SAMPLE_SIZES` (every symbol set to that size). Symbols are matched by name; a symbol only one side has
  takes the same sample size.

Counting more nodes as unknown than before is reported but does not fail the gate on its own.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

import sympy

from onnxfuse.analysis import expressions
from onnxfuse.errors import InputError
from onnxfuse.model.files import read_option_file

#: Sizes every symbol takes when the two optimized-traffic expressions are compared (batch 1, a small and a
#: large image side, ...). A difference that is positive at any of them is a regression.
SAMPLE_SIZES = (1, 8, 64, 224, 640, 2048)

SCHEMA_VERSION = 3
#: Versions a baseline may have: 3 only added fields to 2 (``fusions[].kind``, ``profile.timing``).
READABLE_VERSIONS = (2, 3)


#: Largest baseline file read, in bytes (128 MiB). The JSON report of a model of 100,000 nodes is about 60 MiB.
MAX_BASELINE_BYTES = 128 * 2**20


def load(path: str | Path) -> dict:
    """Read a JSON report written by ``onnxfuse report --format json``, as untrusted input.

    The file must be a regular file of at most :data:`MAX_BASELINE_BYTES`
    (:func:`onnxfuse.model.files.read_option_file`),
    valid against ``onnxfuse/report.schema.json`` (every field's type), and its total byte expressions must be in
    the grammar of :func:`onnxfuse.analysis.expressions.parse`; nothing in it is evaluated.

    Raises:
        InputError: one line: unreadable, not a regular file, too large, not JSON (or nested too deeply), not an
            onnxfuse report, a ``schema_version`` other than 2 or 3, or a field that does not match the schema.
    """
    data = read_option_file(path, "--baseline", MAX_BASELINE_BYTES)
    try:
        doc = json.loads(data.decode("utf-8"))
    except ValueError as exc:  # not UTF-8, not JSON, or an integer past Python's digit limit (sys.int_info)
        raise InputError(f"--baseline {path}: not a JSON report ({_printable(str(exc))})") from None
    except RecursionError:
        raise InputError(f"--baseline {path}: not a JSON report (nested too deeply)") from None
    if not isinstance(doc, dict) or "totals" not in doc or "fusions" not in doc:
        raise InputError(f"--baseline {path}: not an onnxfuse JSON report (write one with --format json)")
    if doc.get("schema_version") not in READABLE_VERSIONS:
        version = doc.get("schema_version")
        shown = version if isinstance(version, int) and not isinstance(version, bool) else "of another kind"
        raise InputError(f"--baseline {path}: schema_version {shown}, this onnxfuse reads "
                         f"{SCHEMA_VERSION}; write the baseline again with this version")
    _check_schema(doc, path)
    for key, text in (("totals.saved_bytes_expr", doc["totals"]["saved_bytes_expr"]),
                      ("totals.after.total_bytes_expr", doc["totals"]["after"]["total_bytes_expr"])):
        if text is not None:
            try:
                expressions.parse(text)
            except expressions.ExpressionError as exc:
                raise InputError(f"--baseline {path}: {key} is not a byte expression ({exc})") from None
    return doc


def _printable(text: str, limit: int = 120) -> str:
    """``text`` with every character outside printable ASCII shown as ``?``, cut to ``limit`` characters: a
    message part taken from an untrusted file reaches a terminal or CI log safely."""
    text = re.sub(r"[^\x20-\x7e]", "?", text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_schema(doc: dict, path: str | Path) -> None:
    """Validate ``doc`` against the report's JSON schema (jsonschema, Draft 2020-12); an InputError names the
    first failing field's place and the rule it breaks, never the file's own text."""
    import jsonschema
    from jsonschema.exceptions import best_match

    schema = json.loads(files("onnxfuse").joinpath("report.schema.json").read_text(encoding="utf-8"))
    try:
        error = best_match(jsonschema.Draft202012Validator(schema).iter_errors(doc))
    except RecursionError:
        raise InputError(f"--baseline {path}: not an onnxfuse JSON report (nested too deeply)") from None
    if error is None:
        return
    where = ".".join(str(p) for p in error.absolute_path) or "the top level"
    rule = f"{error.validator} {error.validator_value}" if error.validator in ("type", "enum", "const") \
        else str(error.validator)
    raise InputError(f"--baseline {path}: not a valid onnxfuse JSON report (at {_printable(where)}: "
                     f"{_printable(rule)})")


def _fusion_kind(row: dict) -> str:
    chain = " -> ".join(n["op"] for n in row["replaced"])
    return f"{row['op']}({row['activation']}) from {chain}" if row["activation"] else f"{row['op']} from {chain}"


def _chain_of(kind: str) -> str:
    return kind.split(" from ", 1)[1]


def _match_extended(lost: Counter, gained: Counter) -> dict[str, int]:
    """Move from ``lost`` and ``gained`` (in place) the fusions whose chain a gained fusion extends (its chain
    starts with the lost one's): ``"old -> new"`` -> count."""
    extended: dict[str, int] = {}
    for old in sorted(lost):
        for new in sorted(gained):
            n = min(lost[old], gained[new])
            if n and _chain_of(new).startswith(_chain_of(old) + " -> "):
                extended[f"{old} -> {new}"] = n
                lost[old] -= n
                gained[new] -= n
    lost += Counter()  # drop zero counts
    gained += Counter()
    return extended


def _unfused_kind(row: dict) -> str:
    return f"{' -> '.join(n['op'] for n in row['nodes'])}: {row['reason']}"


def _expr(text: str | None) -> sympy.Expr | None:
    """The expression of a report's ``*_expr`` string, read without ``eval``
    (:func:`onnxfuse.analysis.expressions.parse`);
    None for None or text outside the grammar (the comparison then says nothing about growth)."""
    if text is None:
        return None
    try:
        return expressions.parse(text)
    except expressions.ExpressionError:
        return None


@dataclass
class Comparison:
    """What changed between a baseline report (old) and a new one.

    Attributes:
        gained / lost: fusion kind -> how many more / fewer times it occurs.
        extended: ``"old kind -> new kind"`` -> count: fusions now part of a longer one (not a loss).
        lost_where: lost fusion kind -> where the baseline had it and the new report has no fusion of that kind
            at the same output tensor: ``"node (output tensor)"`` strings, at most :data:`WHERE_LIMIT` (exporters
            may rename nodes; the output tensor usually keeps its name).
        lost_candidates: lost fusion kind -> how many such places there are, where they outnumber the fusions
            lost (the tensors were renamed, so which of them lost it is unknown: the lines say "one of").
        new_unfused: unfused kind -> ``{"count": more occurrences, "detail": one detail sentence}``.
        saved_before / saved_after: ``totals.saved_bytes_expr`` of the old and the new report.
        after_before / after_after: ``totals.after.total_bytes_expr`` (optimized traffic) of old and new.
        growth_expr: new - old optimized traffic, exact (None when it did not grow anywhere).
        worse_at: where the optimized traffic grew, ``"symbol=value, ...: +N MiB"`` strings (empty: it did
            not): at the new report's input shapes when it has them, else at the stated representative size
            (``present.representative_values``: batch 1, 224 for the other dims) when it grew
            there, else at the first of :data:`SAMPLE_SIZES` where it did.
        unknown_before / unknown_after: unknown node counts of the optimized models.
        symbols: the two reports' ``symbols``, to show long expressions by their leading terms in :meth:`lines`.
        beyond_before / beyond_after: the figure each report leads with, the bytes saved beyond what onnxruntime
            makes itself at load (``onnxruntime.saved_bytes_beyond_expr``; None when a report has no comparison).
            Shown first and compared, not gated: an onnxruntime that fuses more itself lowers it with no loss in
            the exported model.
    """

    gained: dict[str, int] = field(default_factory=dict)
    lost: dict[str, int] = field(default_factory=dict)
    extended: dict[str, int] = field(default_factory=dict)
    lost_where: dict[str, list[str]] = field(default_factory=dict)
    lost_candidates: dict[str, int] = field(default_factory=dict)
    new_unfused: dict[str, dict] = field(default_factory=dict)
    saved_before: str = "0"
    saved_after: str = "0"
    after_before: str = "0"
    after_after: str = "0"
    growth_expr: str | None = None
    worse_at: list[str] = field(default_factory=list)
    unknown_before: int = 0
    unknown_after: int = 0
    symbols: dict[str, dict] = field(default_factory=dict)
    beyond_before: str | None = None
    beyond_after: str | None = None

    @property
    def regressed(self) -> bool:
        """True when a fusion was lost or the optimized traffic grew: the gate fails (exit 1)."""
        return bool(self.lost or self.worse_at)

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {"regressed": self.regressed, "fusions_gained": self.gained, "fusions_lost": self.lost,
                "fusions_lost_where": self.lost_where, "fusions_lost_candidates": self.lost_candidates,
                "fusions_extended": self.extended,
                "new_unfused": self.new_unfused, "saved_bytes_expr": {"baseline": self.saved_before,
                                                                       "new": self.saved_after},
                "optimized_bytes_expr": {"baseline": self.after_before, "new": self.after_after},
                "saved_bytes_beyond_onnxruntime_expr": {"baseline": self.beyond_before, "new": self.beyond_after},
                "optimized_traffic_growth_expr": self.growth_expr,
                "optimized_traffic_grew_at": self.worse_at,
                "unknown_nodes": {"baseline": self.unknown_before, "new": self.unknown_after}}

    def lines(self, fmt: str = "text") -> list[str]:
        """What changed, one fact per line, for people: ``fmt`` ``text`` (names escaped for a terminal,
        :func:`onnxfuse.report.escape.text`) or ``markdown`` (list items' text: names escaped with
        :func:`onnxfuse.report.escape.markdown`, byte expressions in code spans so that ``*`` stays a product)."""
        from onnxfuse.report import escape

        md = fmt == "markdown"
        name = escape.markdown if md else escape.text
        code = escape.markdown_code if md else escape.text

        def expr(text: str | None) -> str:
            return code(self._short(text))

        out = [f"fusion gained: {name(kind)} (x{n})" for kind, n in sorted(self.gained.items())]
        out += [f"fusion extended: {name(kind)} (x{n})" for kind, n in sorted(self.extended.items())]
        for kind, n in sorted(self.lost.items()):
            where = self.lost_where.get(kind, [])
            places = self.lost_candidates.get(kind, n)
            more = places - len(where)
            listed = ", ".join(code(w) for w in where) + (f" and {more} more" if more > 0 else "")
            at = "" if not where else (f" at one of {places} places: {listed}" if kind in self.lost_candidates
                                       else f" at {listed}")
            out.append(f"fusion lost: {name(kind)} (x{n}){at}")
        out += [f"new unfused pattern: {name(kind)} (x{v['count']}): {name(v['detail'])}" for kind, v in
                sorted(self.new_unfused.items())]
        if self.beyond_before is not None or self.beyond_after is not None:
            beyond = "not compared" if self.beyond_after is None else expr(self.beyond_after)
            was = "not compared" if self.beyond_before is None else expr(self.beyond_before)
            out.append("saved beyond onnxruntime: " + beyond + (" (unchanged)" if self.beyond_before ==
                                                               self.beyond_after else f" (was {was})"))
        same = self.saved_before == self.saved_after
        out.append(f"saved bytes vs the graph as exported: {expr(self.saved_after)}"
                   + (" (unchanged)" if same else f" (was {expr(self.saved_before)})"))
        if self.after_before != self.after_after:
            out.append(f"optimized traffic: {expr(self.after_after)} (was {expr(self.after_before)})")
        if self.worse_at:
            out.append(f"optimized traffic grew by {expr(self.growth_expr)}")
        out += [f"optimized traffic grew at {name(w)}" for w in self.worse_at]
        if self.unknown_after != self.unknown_before:
            out.append(f"nodes of unknown size: {self.unknown_after} (was {self.unknown_before})")
        out.append("result: " + ("REGRESSION (a fusion was lost or the optimized traffic grew)" if self.regressed
                                 else "no regression"))
        return out

    def _short(self, expr: str | None) -> str:
        """A byte expression for people: by its leading terms when long (``present.short_expression``), else as
        written; the JSON of the comparison keeps it exact."""
        from onnxfuse.report import present

        doc = {"symbols": self.symbols}
        if expr is None:
            return str(expr)
        return present.short_expression(expr, doc) or present.named(expr, doc)


#: Where a lost fusion was, at most this many places per kind.
WHERE_LIMIT = 3


def option_differences(old: dict, new: dict) -> list[str]:
    """The options that differ between the baseline and the new report (``target``, ``--ort-level``,
    ``--ort-version``, input shapes, passes), as ``"target cpu, now onnx"`` phrases: reports made with other
    options are not comparable (the gate would report a change of options as a regression)."""
    out = []

    def pick(doc: dict, *keys: str) -> Any:
        value: Any = doc
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        return value

    for label, keys in (("--target", ("target",)), ("--ort-level", ("onnxruntime", "level")),
                        ("--ort-version", ("deployment", "ort_version")), ("--input-shape", ("input_shapes",)),
                        ("passes", ("passes",))):
        a, b = pick(old, *keys), pick(new, *keys)
        if a is not None and b is not None and a != b:
            if label == "passes" and isinstance(a, list) and isinstance(b, list):
                out.append(_passes_text(a, b))
            else:
                out.append(f"{label} {_option_text(a)}, now {_option_text(b)}")
    return out


def _passes_text(old: list, new: list) -> str:
    """The passes that differ, by name (``passes: now also minmax_clip (an installed plugin, --skip minmax_clip
    leaves it out)``), rather than both lists; the order alone when the same passes run in another order."""
    added, removed = [p for p in new if p not in old], [p for p in old if p not in new]
    parts = ([f"now also {_option_text(added)} (a plugin installed or given since: --skip leaves it out)"]
             if added else []) + ([f"no longer {_option_text(removed)}"] if removed else [])
    return "passes: " + ("; ".join(parts) if parts else f"the same passes in another order, now {_option_text(new)}")


def _option_text(value) -> str:
    if isinstance(value, dict):
        return " ".join(f"{k}={'x'.join(map(str, v))}" for k, v in sorted(value.items())) or "none"
    if isinstance(value, list):
        return ",".join(map(str, value)) or "none"
    return str(value)


def _beyond(doc: dict) -> str | None:
    """The figure a report leads with, the bytes saved beyond what onnxruntime makes itself at load, as a
    ``saved_bytes_beyond_expr``; "0" when nothing was fused, None when not compared (an older report, or onnxruntime
    could not load a model)."""
    rt = doc.get("onnxruntime") or {}
    if not doc.get("fusions"):
        return "0"
    return rt.get("saved_bytes_beyond_expr") if rt.get("status") == "compared" else None


def compare(old: dict, new: dict) -> Comparison:
    """Compare report dicts ``old`` (the baseline) and ``new`` (see the module docstring for the rules)."""
    from onnxfuse.analysis.symbolic import make_symbol
    from onnxfuse.report import present

    old_f = Counter(_fusion_kind(r) for r in old["fusions"])
    new_f = Counter(_fusion_kind(r) for r in new["fusions"])
    old_u = Counter(_unfused_kind(r) for r in old["unfused"])
    new_u = Counter(_unfused_kind(r) for r in new["unfused"])
    details = {_unfused_kind(r): r["detail"] for r in new["unfused"]}
    gained, lost = new_f - old_f, old_f - new_f
    extended = _match_extended(lost, gained)
    where: dict[str, list[str]] = {}
    # a place is where the baseline had the lost kind and the new report has no fusion of that kind at the same
    # output tensor: the places the kind is still fused are not where it was lost
    kept = {(_fusion_kind(r), r.get("output")) for r in new["fusions"]}
    places = [(kind, r) for r in old["fusions"] if (kind := _fusion_kind(r)) in lost and r.get("output")
              and (kind, r["output"]) not in kept]
    for kind, r in places:
        where.setdefault(kind, [])
        if len(where[kind]) < WHERE_LIMIT:
            where[kind].append(f"{r.get('node') or r['output']} ({r['output']})")
    candidates = Counter(kind for kind, _ in places)
    symbols = {**old.get("symbols", {}), **new.get("symbols", {})}
    c = Comparison(
        gained=dict(gained), lost=dict(lost), extended=extended, lost_where=where,
        lost_candidates={k: n for k, n in candidates.items() if n > lost[k]},
        new_unfused={k: {"count": n, "detail": details[k]} for k, n in (new_u - old_u).items()},
        saved_before=old["totals"]["saved_bytes_expr"], saved_after=new["totals"]["saved_bytes_expr"],
        after_before=old["totals"]["after"]["total_bytes_expr"], after_after=new["totals"]["after"]["total_bytes_expr"],
        unknown_before=old["totals"]["after"]["unknown_nodes"], unknown_after=new["totals"]["after"]["unknown_nodes"],
        symbols=symbols,
        beyond_before=_beyond(old), beyond_after=_beyond(new),
    )
    a_old, a_new = _expr(c.after_before), _expr(c.after_after)
    if a_old is None or a_new is None:
        return c
    diff = sympy.expand(a_new - a_old) if a_new != a_old else sympy.Integer(0)
    if diff == 0:
        return c
    free = sorted(diff.free_symbols, key=str)
    given = {make_symbol(k): sympy.Integer(v) for k, v in new.get("symbol_values", {}).items()}
    sizes = present.representative_values({"symbols": {s.name: symbols.get(s.name, {"axis": None}) for s in free}})
    representative = {s: sympy.Integer(sizes[s.name]) for s in free}
    points = [given] if given and all(s in given for s in free) else [representative]
    points += [{s: sympy.Integer(size) for s in free} for size in SAMPLE_SIZES]
    for point in points:  # the first stated size where it grew is enough to say so
        value = diff.xreplace(point)
        if value.is_number and value > 0:
            names = present.display_names({"symbols": symbols})  # the dims by their one name, as elsewhere
            at = ", ".join(f"{names.get(s.name, s.name)}={v}" for s, v in point.items()) or "every size"
            c.worse_at.append(f"{at}: +{present.human_bytes(int(value))}")
            c.growth_expr = str(diff)
            break
    return c
