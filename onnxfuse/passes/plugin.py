"""Passes from outside the package (plugins): the public pass API a plugin imports, and how onnxfuse loads it.

A plugin is a subclass of :class:`Pass` (the contract every built-in pass follows, :mod:`onnxfuse.passes.base`),
in a module of its own package. onnxfuse finds it two ways:

* installed packages that declare it in the entry-point group :data:`ENTRY_POINT_GROUP` (``onnxfuse.passes``)::

      [project.entry-points."onnxfuse.passes"]
      minmax_clip = "onnxfuse_minmax_clip:MinMaxClip"

  These run on every model, as the built-in passes do (set ``ONNXFUSE_DISABLE_PLUGIN_AUTOLOAD=1``,
  :data:`AUTOLOAD_ENV`, to load none of them);
* ``--plugin module:Name`` (``optimize``, ``report``, ``batch``) or ``plugins=["module:Name"]`` (the Python API)
  for a module on ``sys.path``; the API also takes the class or an instance.

A plugin pass runs in the same fixpoint driver as the built-in ones (:mod:`onnxfuse.passes.driver`): a
``canonicalize`` one after the built-in canonicalization passes, a ``fold`` or ``fuse`` one after the built-in
folds and fusions (before ``conv_unfused``, which only names what is left). ``onnxfuse passes`` lists it with its
origin, ``--only``/``--skip`` select it by its ``name``, and its rewrites and refusals appear in every report
under that name. Its output is verified exactly as a built-in's: the pass has no say over verification.

What a plugin may do, and what onnxfuse checks (each failure is a :class:`PluginError`, exit code 2, one line
naming the plugin, nothing written):

* the object named is a :class:`Pass` subclass (or instance) with a ``name`` that no other pass has, a
  :class:`RewriteKind` ``kind`` and ``reasons`` that are :class:`Reason` members (``Reason.PLUGIN_DECLINED`` is
  the row for a plugin's own conditions; its Skip's ``detail`` says which);
* ``match`` returns a :class:`Match`, a :class:`Skip` with one of its ``reasons``, or None, and raises nothing;
* ``rewrite`` returns a :class:`Fusion` and raises nothing (the record is stored under the plugin's ``name`` and
  ``kind`` whatever it says);
* the model after the passes is valid (``onnx.checker.check_model`` with ``full_check``) when a plugin rewrote it.

The helpers the built-in passes use are re-exported here: ``edit`` (:mod:`onnxfuse.ir.edit`: ``producer``,
``consumers``, ``replace_chain``, ``bypass``), :func:`is_op`, :func:`private_check`, :func:`skip`,
:func:`replaced`, :func:`describe`, :func:`new_constant`.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import onnx_graphsurgeon as gs

from onnxfuse.errors import InputError, one_line
from onnxfuse.ir import edit
from onnxfuse.ir.constants import new_constant
from onnxfuse.passes._checks import describe, is_op, private_check, replaced, skip
from onnxfuse.passes.base import Context, Match, Pass
from onnxfuse.records import Fusion, Reason, RewriteKind, Skip

#: The entry-point group of installed plugins (``importlib.metadata.entry_points(group=...)``).
ENTRY_POINT_GROUP = "onnxfuse.passes"

#: Environment variable that, set to ``1``, keeps the installed plugins (entry points) from loading.
AUTOLOAD_ENV = "ONNXFUSE_DISABLE_PLUGIN_AUTOLOAD"

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*\Z")


class PluginError(InputError):
    """A plugin that cannot be loaded or that broke the contract while running (exit code 2, as bad input: the
    model is not written). The message is one line that names the plugin and where it came from."""


@dataclass(frozen=True)
class Origin:
    """Where a pass came from.

    Attributes:
        spec: ``module:Name`` (the object a plugin names), or ``onnxfuse`` for a built-in pass.
        source: ``built-in``, ``--plugin`` (also the API's ``plugins``) or ``entry point NAME of DIST VERSION``.
    """

    spec: str
    source: str

    def __str__(self) -> str:
        return self.source if self.source == "built-in" else f"plugin {self.spec} ({self.source})"


BUILT_IN = Origin("onnxfuse", "built-in")


class PluginPass(Pass[Match]):
    """A plugin's pass as the driver runs it: its ``name``, ``kind``, ``summary``, ``reasons`` and ``anchors``,
    with ``match`` and ``rewrite`` guarded (any exception, or a result outside the contract, becomes a
    :class:`PluginError` naming the plugin).

    Attributes:
        inner: the plugin's own pass instance.
        origin: where it came from.
    """

    def __init__(self, inner: Pass, origin: Origin):
        self.inner, self.origin = inner, origin
        self.name, self.kind, self.summary = inner.name, inner.kind, str(inner.summary or "")
        self.reasons, self.anchors = tuple(inner.reasons), tuple(inner.anchors)

    def _error(self, what: str) -> PluginError:
        return PluginError(f"{self.origin}: {what}")

    def match(self, node: gs.Node, ctx: Context) -> Match | Skip | None:
        """The plugin's ``match``, checked.

        Raises:
            PluginError: it raised, or returned something other than a Match, a Skip with one of its reasons,
                or None.
        """
        try:
            found = self.inner.match(node, ctx)
        except Exception as exc:
            raise self._error(f"match raised {type(exc).__name__} on node {node.name!r}: {one_line(exc)}") from None
        if found is None or isinstance(found, Match):
            return found
        if isinstance(found, Skip):
            if found.reason not in self.reasons:
                raise self._error(f"match declined node {node.name!r} with reason {found.reason!s}, which is not "
                                  "among its reasons")
            return found
        raise self._error(f"match returned {type(found).__name__} for node {node.name!r}, not a Match, a Skip or "
                          "None")

    def rewrite(self, match: Match, ctx: Context) -> Fusion:
        """The plugin's ``rewrite``, checked; the record carries this pass's ``name`` and ``kind``.

        Raises:
            PluginError: it raised, or did not return a Fusion.
        """
        first = match.nodes[0].name if match.nodes else "?"
        try:
            fusion = self.inner.rewrite(match, ctx)
        except Exception as exc:
            raise self._error(f"rewrite raised {type(exc).__name__} at node {first!r}: {one_line(exc)}") from None
        if not isinstance(fusion, Fusion):
            raise self._error(f"rewrite returned {type(fusion).__name__} at node {first!r}, not a Fusion")
        return replace(fusion, pass_name=self.name, kind=self.kind)


def load(spec: str | type | Pass, source: str = "--plugin") -> PluginPass:
    """The plugin named by ``spec``, checked and wrapped: ``"module:Name"`` (``Name`` may be dotted: an
    attribute path in the module), a :class:`Pass` subclass (instantiated with no arguments) or an instance.

    Raises:
        PluginError: ``spec`` is not ``module:Name``, the module cannot be imported (any exception of its
            import), it has no such attribute, the object is no Pass, instantiating it raised, or its attributes
            break the contract (:func:`check`).
    """
    if isinstance(spec, str):
        module_name, sep, attr = spec.partition(":")
        if not sep or not module_name or not attr:
            raise PluginError(f"--plugin {spec!r}: expected module:Name, e.g. my_passes:MyPass")
        origin = Origin(spec, source)
        try:
            obj: Any = importlib.import_module(module_name)
        except Exception as exc:
            raise PluginError(f"{origin}: cannot import {module_name} ({type(exc).__name__}: {one_line(exc)})"
                              ) from None
        for part in attr.split("."):
            if not hasattr(obj, part):
                raise PluginError(f"{origin}: {module_name} has no attribute {attr!r}")
            obj = getattr(obj, part)
    else:
        obj = spec
        cls = spec if isinstance(spec, type) else type(spec)
        origin = Origin(f"{cls.__module__}:{cls.__qualname__}", source)
    if isinstance(obj, type) and issubclass(obj, Pass):
        try:
            obj = obj()
        except Exception as exc:
            raise PluginError(f"{origin}: {type(exc).__name__} when creating the pass: {one_line(exc)}") from None
    if not isinstance(obj, Pass):
        what = f"the class {obj.__name__}" if isinstance(obj, type) else f"a {type(obj).__name__}"
        raise PluginError(f"{origin}: is {what}, not a subclass of onnxfuse.passes.plugin.Pass")
    check(obj, origin)
    return PluginPass(obj, origin)


def check(p: Pass, origin: Origin) -> None:
    """The plugin pass's class attributes against the contract.

    Raises:
        PluginError: ``name`` empty or not made of letters, digits, ``_``, ``.``, ``-``; ``kind`` not a
            :class:`RewriteKind`; ``reasons`` empty or holding something other than :class:`Reason` members;
            ``anchors`` not strings.
    """
    name = getattr(p, "name", "")
    if not isinstance(name, str) or not _NAME.match(name):
        raise PluginError(f"{origin}: its name {name!r} is not a pass name (letters, digits, _ . -)")
    if not isinstance(getattr(p, "kind", None), RewriteKind):
        raise PluginError(f"{origin}: its kind must be a RewriteKind (canonicalize, fold, fuse)")
    reasons = getattr(p, "reasons", ())
    if not isinstance(reasons, (tuple, list)) or not reasons or not all(isinstance(r, Reason) for r in reasons):
        raise PluginError(f"{origin}: its reasons must be a non-empty tuple of onnxfuse Reason members "
                          "(Reason.PLUGIN_DECLINED for its own conditions)")
    anchors = getattr(p, "anchors", ())
    if not isinstance(anchors, (tuple, list)) or not all(isinstance(a, str) for a in anchors):
        raise PluginError(f"{origin}: its anchors must be a tuple of op types")


@functools.lru_cache(maxsize=1)
def _installed_cached() -> tuple[PluginPass, ...]:
    from importlib.metadata import entry_points

    found = []
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        dist = getattr(ep, "dist", None)
        source = f"entry point {ep.name}" + (f" of {dist.name} {dist.version}" if dist is not None else "")
        found.append(load(ep.value, source))
    return tuple(found)


def installed() -> tuple[PluginPass, ...]:
    """The passes of the installed packages' :data:`ENTRY_POINT_GROUP` entry points, by entry-point name
    (loaded once per process); none when :data:`AUTOLOAD_ENV` is ``1``.

    Raises:
        PluginError: as :func:`load`, for the first entry point that fails.
    """
    if os.environ.get(AUTOLOAD_ENV, "").strip() == "1":
        return ()
    return _installed_cached()


def resolve(specs: Iterable[str | type | Pass] = ()) -> tuple[PluginPass, ...]:
    """The installed plugins, then those of ``specs`` (:func:`load`), in that order; a spec naming an installed
    plugin's pass again is that plugin (not loaded twice).

    Raises:
        PluginError: as :func:`load`; two plugins, or a plugin and a built-in pass, share a name.
    """
    from onnxfuse.passes import PASS_NAMES

    plugins = list(installed())
    for spec in specs:
        loaded = load(spec)
        same = next((p for p in plugins if p.name == loaded.name), None)
        if same is not None and type(same.inner) is type(loaded.inner):
            continue
        plugins.append(loaded)
    seen: dict[str, PluginPass] = {}
    for p in plugins:
        if p.name in PASS_NAMES:
            raise PluginError(f"{p.origin}: its name {p.name!r} is the name of a built-in pass")
        if p.name in seen:
            raise PluginError(f"{p.origin}: its name {p.name!r} is also the name of {seen[p.name].origin}")
        seen[p.name] = p
    return tuple(plugins)


def origin(p: Pass) -> Origin:
    """Where pass ``p`` came from: :data:`BUILT_IN`, or a plugin's :class:`Origin`."""
    return p.origin if isinstance(p, PluginPass) else BUILT_IN


def check_output(model, fusions: list[Fusion], selected: Iterable[Pass]) -> None:
    """Refuse the model written after the passes when a plugin rewrote it and ``onnx.checker`` (``full_check``:
    types and shapes too) rejects it. Models over protobuf's 2 GiB are not checked here (onnxruntime's load in
    verification is then the check).

    Raises:
        PluginError: naming the plugins that rewrote the model and the checker's first line.
    """
    import onnx

    names = {p.name: p for p in selected if isinstance(p, PluginPass)}
    rewrote = list(dict.fromkeys(f.pass_name for f in fusions if f.pass_name in names))
    if not rewrote or model.ByteSize() >= 2**31:
        return
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as exc:
        who = ", ".join(str(names[n].origin) for n in rewrote)
        raise PluginError(f"{who}: the model after its rewrites is invalid ({one_line(exc, 200)})") from None


__all__ = ["AUTOLOAD_ENV", "BUILT_IN", "ENTRY_POINT_GROUP", "Context", "Fusion", "Match", "Origin", "Pass",
           "PluginError", "PluginPass", "Reason", "RewriteKind", "Skip", "check", "check_output", "describe",
           "edit", "installed", "is_op", "load", "new_constant", "origin", "private_check", "replaced", "resolve",
           "skip"]
