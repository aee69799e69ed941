"""How verification runs models in onnxruntime: one budget for every run, sessions without spinning threads,
outputs kept as copies, the candidate's run and the optional second input set.

Sessions, inputs and the stopping of a run come from :mod:`onnxfuse.ort.sessions`; this module adds the budget
(:class:`Budget`: ``VerifyOptions.work`` in CPU seconds, ``VerifyOptions.timeout`` in wall-clock seconds) that
every session and run of one verification shares.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from onnxfuse.ort import sessions as runtime
from onnxfuse.verification.models import Model

#: Feeds of one input set: graph input name -> array.
Feeds = dict[str, np.ndarray]

#: The outputs of one model on every input set: one list of arrays (in the model's output order) per set.
Outputs = list[list[np.ndarray]]

#: Names and onnxruntime type strings (``tensor(float)``) of a session's inputs or outputs, in order.
Signature = list[tuple[str, str]]


#: The clocks a :class:`Budget` reads, module attributes so that a test can replace them (a fake, slowed clock):
#: the work clock is this process's CPU time, every thread of it together (onnxruntime's pool included), in
#: seconds; the wall clock is :func:`time.monotonic`.
WORK_CLOCK: Callable[[], float] = time.process_time
WALL_CLOCK: Callable[[], float] = time.monotonic

#: Seconds between two looks at the clocks while an onnxruntime run is in progress (the watcher thread of
#: :func:`onnxfuse.ort.sessions.run_watched`): a run stops at most this long, plus one node, after a limit.
WATCH_INTERVAL_S = 0.02


class Budget:
    """One verification's limits (``VerifyOptions.work`` and ``VerifyOptions.timeout``; None: no limit), shared by
    every session and run of it, and by the comparison with onnxruntime's own graphs that ``pipeline.optimize``
    makes in the same budget.

    * **work**: CPU seconds of this process (:data:`WORK_CLOCK`, every thread) from the budget's start: what the
      runs and session builds cost, whatever else the machine runs, so the verdict does not depend on its load.
      When spent: :class:`onnxfuse.ort.sessions.WorkSpent` (the result is ``skipped``, cause ``work``).
    * **timeout**: wall-clock seconds (:data:`WALL_CLOCK`), a safety stop for what uses no CPU (a run that
      waits) or more wall time than any load explains. When spent: :class:`onnxfuse.ort.sessions.RunTimeout`
      (cause ``time``).

    Both are checked before each session is made (onnxruntime cannot stop a session being built, only a run)
    and, during a run, every :data:`WATCH_INTERVAL_S` seconds by a watcher thread (the run then stops before its
    next node).
    """

    def __init__(self, timeout: float | None, work: float | None = None):
        self.timeout = timeout
        self.work = work
        self.work_clock, self.wall_clock = WORK_CLOCK, WALL_CLOCK
        self.work_start, self.wall_start = self.work_clock(), self.wall_clock()

    def work_used(self) -> float:
        """CPU seconds used since the budget started."""
        return self.work_clock() - self.work_start

    def spent(self) -> runtime.RunTimeout | None:
        """The exception to raise when a limit is spent (the work limit first: it is the deterministic one), else
        None."""
        if self.work is not None and self.work_used() >= self.work:
            return runtime.WorkSpent(f"{self.work:g} CPU s of work used")
        if self.timeout is not None and self.wall_clock() - self.wall_start >= self.timeout:
            return runtime.RunTimeout(f"stopped after {self.timeout:g} s")
        return None

    def check(self) -> None:
        """Raises what :meth:`spent` returns (nothing when neither limit is spent).

        Raises:
            runtime.WorkSpent / runtime.RunTimeout: as said.
        """
        exc = self.spent()
        if exc is not None:
            raise exc

    def unlimited(self) -> bool:
        """True when neither limit is set."""
        return self.timeout is None and self.work is None


#: The budget of the verification in progress in this thread (verify_models sets it; None: no limit).
BUDGET: contextvars.ContextVar[Budget | None] = contextvars.ContextVar("onnxfuse_verify_budget", default=None)


@contextlib.contextmanager
def budget(timeout: float | None, work: float | None) -> Iterator[Budget]:
    """The budget in force: the one already set by a caller (``pipeline.optimize`` sets one for the verification
    and the comparison together), else a new one of ``timeout`` / ``work`` set for the body."""
    outer = BUDGET.get()
    if outer is not None:
        yield outer
        return
    made = Budget(timeout, work)
    token = BUDGET.set(made)
    try:
        yield made
    finally:
        BUDGET.reset(token)


def check_budget() -> None:
    """:meth:`Budget.check` of the budget in force (nothing without one): for a caller about to build a session.

    Raises:
        runtime.WorkSpent / runtime.RunTimeout: a limit is spent.
    """
    current = BUDGET.get()
    if current is not None:
        current.check()


def run_all(sess: Any, feeds_list: list[Feeds]) -> Outputs:
    """``sess``'s outputs on each input set, as copies that own their memory.

    Copies: the arrays onnxruntime returns wrap its own output buffers (their base is a PyCapsule), which keep
    the session's memory arena, activations and all, alive after the session is freed.

    A sequence or map output (a list or dict, not an array) is kept as an empty float32 array: verification does
    not compare those, so it counts as an output with nothing compared (the verdict is then ``partial``).

    Raises:
        runtime.WorkSpent / runtime.RunTimeout: the budget in force (:data:`BUDGET`) ran out before or during a
            run.
    """
    current = BUDGET.get()
    watch = None if current is None or current.unlimited() else current.spent
    return [[np.array(a) if isinstance(a, np.ndarray) else np.zeros((0,), np.float32)
             for a in runtime.run_watched(sess, feeds, watch, WATCH_INTERVAL_S)]
            for feeds in feeds_list]


def session(src: str | bytes, level: str = "disable", save_to: str | None = None) -> Any:
    """runtime.session without spinning threads, its heap trimmed while it is built (``trim``), once the budget
    allows (runtime.WorkSpent / runtime.RunTimeout when it does not). ``save_to``: also write the graph
    onnxruntime optimized there, as :mod:`onnxfuse.ort.optimized_graph` has it written
    (:data:`onnxfuse.ort.optimized_graph.SAVE_CONFIG`)."""
    check_budget()
    if save_to:
        from onnxfuse.ort.optimized_graph import SAVE_CONFIG

        return runtime.session(src, level, spinning=False, save_to=save_to, config=SAVE_CONFIG, trim=True)
    return runtime.session(src, level, spinning=False, trim=True)


def signature(values: Iterable[Any]) -> Signature:
    """(name, type) of each of a session's ``get_inputs()`` or ``get_outputs()``."""
    return [(v.name, v.type) for v in values]


def signature_text(sig: Signature) -> str:
    """``[name: type, ...]``."""
    return "[" + ", ".join(f"{n}: {t}" for n, t in sig) + "]"


def second_set(sess: Any, spec: runtime.InputSpec, invented: list[str], seed: int
               ) -> tuple[tuple[Feeds, list[np.ndarray]] | None, str | None]:
    """The second default input set (seed ``seed``, sizes :data:`onnxfuse.ort.sessions.SECOND_DIMS` for the
    symbolic dims that nobody gave) and the original's outputs on it, when some input has ``invented`` sizes;
    else (None, None). When onnxruntime cannot run the original on it (a model that only runs at batch 1, or at
    one size), (None, a note that says so): verification goes on with the first set alone.

    Raises:
        runtime.RunTimeout: the budget ran out.
    """
    if not invented:
        return None, None
    try:
        feeds = runtime.make_inputs(sess, spec, seed, sizes=runtime.SECOND_DIMS)
        return (feeds, run_all(sess, [feeds])[0]), None
    except runtime.RunTimeout:
        raise
    except Exception as exc:  # MemoryError too: a second set too large is no reason to stop
        batch, other = runtime.SECOND_DIMS
        return None, (f"the second input set (batch {batch}, other symbolic dims {other}) was not run: onnxruntime "
                      f"cannot run the original on it ({runtime.short(exc)}); compared on the first only")


def run_candidate(candidate: Model, feeds_list: list[Feeds], ref_inputs: Signature, ref_outputs: Signature,
                  save_to: str | None = None) -> Outputs | str:
    """The candidate's outputs on every input set, or why it fails: onnxruntime cannot load or run it, or its
    outputs (names, order, dtypes) or inputs are not the original's. ``save_to``: as in :func:`session`.

    Raises:
        runtime.RunTimeout: the budget ran out.
    """
    with runtime.loadable(candidate, as_file=True) as src:
        try:
            cand_sess = session(src, "disable", save_to)
        except runtime.RunTimeout:
            raise
        except Exception as exc:
            return f"onnxruntime cannot load the candidate model: {runtime.short(exc)}"
        cand_outputs = signature(cand_sess.get_outputs())
        if cand_outputs != ref_outputs:
            return (f"the candidate's outputs {signature_text(cand_outputs)} are not the original's "
                    f"{signature_text(ref_outputs)} (names, order and dtypes must match)")
        extra = sorted(set(signature(cand_sess.get_inputs())) - set(ref_inputs))
        if extra:
            return (f"the candidate has input(s) {signature_text(extra)} that the original has not "
                    f"(original: {signature_text(ref_inputs)})")
        names = {i.name for i in cand_sess.get_inputs()}
        try:
            return run_all(cand_sess, [{k: v for k, v in f.items() if k in names} for f in feeds_list])
        except runtime.RunTimeout:
            raise
        except Exception as exc:
            return f"onnxruntime cannot run the candidate model: {runtime.short(exc)}"
