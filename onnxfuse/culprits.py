"""When the optimized model fails verification: find the rewrites that broke it, and verify the rest without them.

:func:`search` is what :func:`onnxfuse.pipeline.analyse` runs on a ``failed`` verification (``Options.find_culprits``,
on by default). It searches over the rewrite sites the passes recorded (every ``Fusion``'s ``site``: the pass and
the original nodes it consumed; never a model's name or a fixed list of passes) with
:func:`onnxfuse.verification.search.find_culprits`, each candidate built by running the passes again on the
original with some sites left unfused (``Context.excluded``). With the culprits found, the passes run once more
with just them left out (each recorded as a ``rewrite-broke-verification`` skip naming the output and error it
moved), and that remainder is verified again like any output (:func:`onnxfuse.verification.verify.verify_models`).

The result's verification: ``failed`` (the original verdict, the culprits named) unless ``drop_culprits``
(``--drop-culprits``) and the remainder passed, then the remainder's ``passed`` verdict with the culprits named.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any, Protocol

import onnx

from onnxfuse.model import io as model_io
from onnxfuse.records import Fusion, Skip
from onnxfuse.verification import search as search_mod
from onnxfuse.verification.options import VerifyOptions
from onnxfuse.verification.result import Status, Verification

log = logging.getLogger(__name__)

#: A site's key (``records.Fusion.site``).
Site = tuple[str, ...]


class Rewriter(Protocol):
    """What runs the passes (``onnxfuse.pipeline._Rewriter``)."""

    def run(self, model: onnx.ModelProto, excluded: dict[Site, str] | None = None
            ) -> tuple[onnx.ModelProto, list[Fusion], list[Skip]]: ...


@dataclass
class Outcome:
    """What :func:`search` hands back to the pipeline.

    Attributes:
        verification: the result's verification (see the module docstring), with ``culprits``,
            ``culprit_search`` and ``remainder`` filled in.
        remainder: ``(model, fusions, skips)`` of the passes run with the culprits left unfused, when the search
            completed and that model passed verification; None otherwise.
    """

    verification: Verification
    remainder: tuple[onnx.ModelProto, list[Fusion], list[Skip]] | None


def fresh_original(loaded: model_io.LoadedModel) -> onnx.ModelProto:
    """A new copy of the input model, for one more run of the passes (which rewrite their model in place).

    Raises:
        InputError: as :func:`onnxfuse.model.io.load_model` (the file changed since it was read).
    """
    if loaded.path is not None:
        model = model_io.load_model(loaded.path).model
        assert model is not None  # a model just loaded
        return model
    return onnx.load_model_from_string(loaded.ort_source())


def site_text(fusion: Fusion) -> str:
    """``conv_batchnorm of Conv_3 (Conv), BatchNormalization_4 (BatchNormalization)``."""
    return f"{fusion.pass_name} of " + ", ".join(f"{name} ({op})" for name, op, _ in fusion.replaced)


def culprit_detail(fusion: Fusion, culprit: search_mod.Culprit) -> str:
    """The sentence of a culprit's ``rewrite-broke-verification`` skip: the rewrite and what it moved."""
    return (f"the {site_text(fusion)} broke verification ({culprit.moved_text()}); left unfused, the rest "
            "verified without it")


def culprit_record(fusion: Fusion, culprit: search_mod.Culprit) -> dict[str, Any]:
    """One culprit as the JSON report has it (report.schema.json, ``verification.culprits``)."""
    return {"pass": fusion.pass_name, "nodes": [name for name, _, _ in fusion.replaced],
            "ops": [op for _, op, _ in fusion.replaced], "output": fusion.output,
            "moved": [{"output": name, "max_abs_error": err if err != float("inf") else None, "tolerance": tol}
                      for name, err, tol in culprit.moved],
            "reason": culprit.reason}


def search(loaded: model_io.LoadedModel, rewriter: Rewriter, fusions: list[Fusion], failed: Verification,
           verify_options: VerifyOptions, drop_culprits: bool) -> Outcome:
    """Find the sites among ``fusions`` that broke ``failed`` (the verification of the model with all of them
    applied), then run the passes with them left unfused and verify that remainder. See the module docstring.

    Raises:
        InputError: as :func:`onnxfuse.verification.verify.verify_models`, or the input file changed.
    """
    from onnxfuse.verification import verify

    by_site = {f.site: f for f in fusions if f.site}
    sites = list(by_site)
    original = loaded.ort_source()
    log.debug("verification failed: searching %d rewrite sites for the culprit(s)", len(sites))

    def build(excluded: frozenset[Site]) -> onnx.ModelProto:
        return rewriter.run(fresh_original(loaded), {s: "left out by the culprit search" for s in excluded})[0]

    found = search_mod.find_culprits(original, sites, build, verify_options, failed)
    culprits = [(by_site[c.site], c) for c in found.culprits]
    records = [culprit_record(f, c) for f, c in culprits]
    log.debug("culprit search: %d culprit(s) in %d verifications, %.1f s", len(culprits), found.verifications,
              found.seconds)
    remainder = None
    remainder_check = None
    if found.complete and culprits:
        remainder = rewriter.run(fresh_original(loaded), {f.site: culprit_detail(f, c) for f, c in culprits})
        remainder_check = verify.verify_models(original, remainder[0], verify_options)
        if remainder_check.status != Status.PASSED:
            remainder = None
    rest = None if remainder_check is None else {"status": str(remainder_check.status),
                                                  "summary": remainder_check.summary}
    named = "; ".join(f"{site_text(f)}: {c.moved_text()}" for f, c in culprits)
    if drop_culprits and remainder is not None and remainder_check is not None:
        return Outcome(replace(remainder_check, culprits=records, culprit_search=found.to_dict(), remainder=rest),
                       remainder)
    reason = failed.reason or ""
    if culprits:
        reason += f"; culprit(s): {named}"
    if not found.complete:
        reason += f"; culprit search incomplete: {found.note}"
    return Outcome(replace(failed, reason=reason, culprits=records, culprit_search=found.to_dict(), remainder=rest),
                   remainder)
