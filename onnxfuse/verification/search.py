"""The culprit search: when a rewritten model fails verification, which of its rewrite sites broke it?

A *site* is one recorded rewrite (``records.Fusion.site``: the graph, the pass and the names of the original
nodes it consumed, a key that stays the same when other sites are left out). The caller gives the sites in the
order they were applied and a ``build(excluded)`` that runs the passes again with those sites left unfused; this
module only searches, judging every candidate against one run of the original
(:func:`onnxfuse.verification.verify.reference`, its floor sessions made once and kept,
:func:`onnxfuse.verification.verify.judge`), with the rule of :mod:`onnxfuse.verification.rule`.

The search (the "reduce a failing model" idea of delta debugging, Zeller and Hildebrandt, "Simplifying and
Isolating Failure-Inducing Input", IEEE TSE 28(2), 2002, applied to onnxfuse's own rewrites):

1. bisection over the sites in the order applied: with the culprits found so far left out, the shortest prefix
   of the other sites whose application fails; its last site is a culprit (the prefix one shorter passes). It is
   left out, and the step repeats until the model with every culprit left out passes: ``log2(sites) + 1``
   verifications per culprit;
2. then each culprit alone: one that the others' leaving out already makes pass is dropped (two sites that only
   fail together keep just the one that is needed).

Applying no site at all is the original, which passes by definition; it is never run. Every verification of the
search shares one budget (``VerifyOptions.work`` CPU seconds, ``--verify-budget``, with the wall-clock safety stop
``VerifyOptions.timeout``, ``--verify-timeout``; :class:`onnxfuse.verification.run.Budget`): when it runs out the
search stops, ``complete`` False, with the culprits found so far.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from onnxfuse.ort import sessions as runtime
from onnxfuse.verification import verify as verify_mod
from onnxfuse.verification.models import Model
from onnxfuse.verification.options import VerifyOptions
from onnxfuse.verification.result import Status, Verification
from onnxfuse.verification.run import BUDGET, Budget

#: A site's key (``records.Fusion.site``).
Site = tuple[str, ...]


@dataclass
class Culprit:
    """One site whose rewrite broke verification.

    Attributes:
        site: its key (``records.Fusion.site``).
        moved: what applying it moved, from the verification that failed with it applied and passed without it:
            one ``(output name, max abs error, tolerance or None)`` per failed output; empty when the candidate
            failed as a whole (onnxruntime could not load or run it).
        reason: that verification's ``reason``.
    """

    site: Site
    moved: list[tuple[str, float, float | None]] = field(default_factory=list)
    reason: str | None = None

    def moved_text(self) -> str:
        """``output y: max abs error 0.31, tolerance 2.4e-06`` for each output it moved (or the reason)."""
        if not self.moved:
            return self.reason or "the candidate failed"
        return "; ".join(f"output {name}: max abs error {err:.3g}" + ("" if tol is None else f", tolerance {tol:.3g}")
                         for name, err, tol in self.moved)


@dataclass
class Search:
    """What the culprit search found and what it cost.

    Attributes:
        culprits: the culprit sites, in the order applied.
        sites: how many sites the search was over.
        verifications: candidates verified (each one onnxruntime session of the candidate, plus the pass run
            that built it).
        sessions: onnxruntime sessions made in all (the original's, its floor sessions, the candidates').
        seconds: wall time of the search, the pass runs included.
        complete: False when the time budget ran out first (``culprits`` are those found by then) or a
            candidate could not be judged (``note`` says why).
        note: why the search is not complete; None when it is.
    """

    culprits: list[Culprit]
    sites: int
    verifications: int = 0
    sessions: int = 0
    seconds: float = 0.0
    complete: bool = True
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON form (report.schema.json, ``verification.culprit_search``), without the culprits themselves."""
        return {"sites": self.sites, "verifications": self.verifications, "sessions": self.sessions,
                "seconds": round(self.seconds, 3), "complete": self.complete, "note": self.note}


class _Judge:
    """Verifies candidates against one run of the original, counting the verifications and sessions."""

    def __init__(self, original: Model, options: VerifyOptions):
        self.original, self.options = original, options
        kept = verify_mod.kept_runs(original, options)  # the failed verification's runs of the original, if kept
        self.cache: dict = {} if kept is None else kept["cache"]
        self.ref: Any = None if kept is None else kept.get("ref")
        self.verifications = 0
        self.inherited = self._original_sessions()  # made before the search: not counted in its sessions

    def _original_sessions(self) -> int:
        return sum(1 for v in self.cache.values() if not isinstance(v, str)) + (self.ref is not None)

    def __call__(self, candidate: Model) -> Verification:
        if self.ref is None:
            ref = verify_mod.reference(self.original, self.options)
            if isinstance(ref, Verification):
                raise _Unjudged(f"the original cannot be run: {ref.reason}")
            self.ref = ref
        self.verifications += 1
        return verify_mod.judge(self.original, self.ref, candidate, self.options, cache=self.cache)

    @property
    def sessions(self) -> int:
        """Sessions the search made: one per candidate, and those of the original not kept from before it."""
        return self.verifications + self._original_sessions() - self.inherited


class _Unjudged(Exception):
    """A candidate the search cannot judge (the original cannot be run, verification was skipped)."""


def _moved(v: Verification) -> list[tuple[str, float, float | None]]:
    return [(o.name, o.max_abs_error, o.tolerance) for o in v.failed_outputs]


def find_culprits(original: Model, sites: Sequence[Site], build: Callable[[frozenset[Site]], Model],
                  options: VerifyOptions, failed: Verification | None = None) -> Search:
    """The smallest set of ``sites`` found whose leaving out makes the rebuilt model pass verification (see the
    module docstring for the search and its cost).

    Args:
        original: the model before the passes (a path, serialized bytes or a ModelProto; not modified).
        sites: every site of the failing model, in the order applied.
        build: the passes run again on ``original`` with the given sites left unfused; returns the model.
        options: how to verify (inputs, rule; ``timeout``: the budget of the whole search, None: no limit).
        failed: the verification of the model with every site applied, when the caller has it (its failed
            outputs are what the last culprit moved when it is the only one).

    Returns:
        The :class:`Search`; ``complete`` False when the budget ran out or a candidate could not be judged.

    Raises:
        InputError: as :func:`onnxfuse.verification.verify.reference`.
    """
    start = time.monotonic()
    judge = _Judge(original, options)
    search = Search([], len(sites))
    limits = Budget(options.timeout, options.work)
    token = BUDGET.set(limits)
    results: dict[frozenset[Site], Verification] = {}
    if failed is not None:
        results[frozenset()] = failed

    def check(excluded: frozenset[Site]) -> Verification:
        if excluded not in results:
            v = judge(build(excluded))
            if v.status not in (Status.PASSED, Status.FAILED, Status.PARTIAL):
                raise _Unjudged(f"a candidate could not be judged: {v.reason}")
            results[excluded] = v
        return results[excluded]

    culprits: list[Site] = []
    moved: dict[Site, Verification] = {}
    try:
        while True:
            found = frozenset(culprits)
            if culprits and check(found).status != Status.FAILED:
                break
            rest = [s for s in sites if s not in found]
            if not rest:  # every site is left out and it still fails: not a rewrite of these sites
                raise _Unjudged("the model fails with every recorded site left out")
            lo, hi = 0, len(rest)  # applying rest[:lo] passes (nothing applied: the original), rest[:hi] fails
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if check(found | frozenset(rest[mid:])).status == Status.FAILED:
                    hi = mid
                else:
                    lo = mid
            culprit = rest[hi - 1]
            culprits.append(culprit)
            moved[culprit] = check(found | frozenset(rest[hi:]))
        # each culprit alone: drop one that leaving out the others already makes pass
        for site in list(culprits):
            others = frozenset(c for c in culprits if c != site)
            if len(culprits) > 1 and check(others).status != Status.FAILED:
                culprits.remove(site)
    except runtime.WorkSpent:
        runtime.trim_heap()
        search.complete = False
        search.note = (f"work: the search did not finish within {limits.work:g} CPU s (--verify-budget); "
                       f"{len(culprits)} culprit(s) found by then")
    except runtime.RunTimeout:
        runtime.trim_heap()
        search.complete = False
        search.note = (f"time: the search did not finish within {limits.timeout:g} s of wall time "
                       f"(--verify-timeout); {len(culprits)} culprit(s) found by then")
    except _Unjudged as exc:
        search.complete, search.note = False, str(exc)
    finally:
        BUDGET.reset(token)
    order = {s: i for i, s in enumerate(sites)}
    search.culprits = [Culprit(s, _moved(moved[s]), moved[s].reason) for s in sorted(culprits, key=order.__getitem__)]
    search.verifications, search.sessions = judge.verifications, judge.sessions
    search.seconds = time.monotonic() - start
    return search

