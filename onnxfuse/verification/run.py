"""How verification runs models in onnxruntime: one time budget for every run, sessions without spinning threads,
outputs kept as copies, the candidate's run and the optional second input set.

Sessions, inputs and the stopping of a run come from :mod:`onnxfuse.ort.sessions`; this module adds the budget
(``VerifyOptions.timeout``) that every session and run of one verification shares.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Iterable
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


class Budget:
    """What is left of ``VerifyOptions.timeout`` (None: no limit), from :func:`time.monotonic`."""

    def __init__(self, timeout: float | None):
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout

    def left(self) -> float | None:
        """Seconds left (None: no limit).

        Raises:
            runtime.RunTimeout: none left (checked before each session is made: onnxruntime cannot stop a
                session being created, only a run).
        """
        if self.deadline is None:
            return None
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise runtime.RunTimeout("no time left")
        return left


#: The budget of the verification in progress in this thread (verify_models sets it; None: no limit).
BUDGET: contextvars.ContextVar[Budget | None] = contextvars.ContextVar("onnxfuse_verify_budget", default=None)


def run_all(sess: Any, feeds_list: list[Feeds]) -> Outputs:
    """``sess``'s outputs on each input set, as copies that own their memory.

    Copies: the arrays onnxruntime returns wrap its own output buffers (their base is a PyCapsule), which keep
    the session's memory arena, activations and all, alive after the session is freed.

    A sequence or map output (a list or dict, not an array) is kept as an empty float32 array: verification does
    not compare those, so it counts as an output with nothing compared (the verdict is then ``partial``).

    Raises:
        runtime.RunTimeout: the verification's time budget (:data:`BUDGET`) ran out during a run.
    """
    budget = BUDGET.get()
    return [[np.array(a) if isinstance(a, np.ndarray) else np.zeros((0,), np.float32)
             for a in runtime.run(sess, feeds, budget.left() if budget else None)]
            for feeds in feeds_list]


def session(src: str | bytes, level: str = "disable", save_to: str | None = None) -> Any:
    """runtime.session without spinning threads, its heap trimmed while it is built (``trim``), once the budget
    allows (runtime.RunTimeout when it does not). ``save_to``: also write the graph onnxruntime optimized there,
    as :mod:`onnxfuse.ort.optimized_graph` has it written (:data:`onnxfuse.ort.optimized_graph.SAVE_CONFIG`)."""
    budget = BUDGET.get()
    if budget is not None:
        budget.left()
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


def run_candidate(candidate: Model, feeds_list: list[Feeds], ref_inputs: Signature, ref_outputs: Signature
                  ) -> Outputs | str:
    """The candidate's outputs on every input set, or why it fails: onnxruntime cannot load or run it, or its
    outputs (names, order, dtypes) or inputs are not the original's.

    Raises:
        runtime.RunTimeout: the budget ran out.
    """
    with runtime.loadable(candidate, as_file=True) as src:
        try:
            cand_sess = session(src)
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
