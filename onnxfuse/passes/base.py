"""The pass contract: a read-only ``match`` that returns a :class:`Match`, a :class:`~onnxfuse.records.Skip` or
None, and a ``rewrite`` that only does numpy math and edge surgery and returns a :class:`~onnxfuse.records.Fusion`.

Every reason a pass declines a pattern it found is one of the :class:`Reason` codes below; reports and tests
name them. A pass anchors on the *last* node of its chain (its producer chain is unique, its consumers are not).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar

import numpy as np
import onnx_graphsurgeon as gs

from onnxfuse.ir import constants, edit
from onnxfuse.model.domains import is_default_domain
from onnxfuse.ort.providers import Target
from onnxfuse.records import Fusion, Reason, RewriteKind, Skip

if TYPE_CHECKING:
    from onnxfuse.analysis.symbolic import SymbolicShapes


#: Growth (bytes) that folds giving a Conv or Gemm its own copy of a shared weight may add to the whole model
#: without ``--materialize-weights``: 1 MiB, the per-fold growth limit of ``constant_fold`` (FOLD_GROWTH_LIMIT_BYTES).
SHARED_COPY_GROWTH_BYTES = 1 << 20


@dataclass
class Match:
    """A pattern that a pass will rewrite. Each pass subclasses it with typed fields for what ``match``
    computed and ``rewrite`` needs (folded arrays, the activation and its parameters).

    Attributes:
        nodes: the matched nodes in execution order; the first is the Conv (or Gemm...), the last the anchor.
    """

    nodes: list[gs.Node]


@dataclass
class Context:
    """What a pass may read while matching: the target, the constants policy and static tensor info.

    Attributes:
        target: the execution-provider target.
        overridable: initializer names that are graph inputs and therefore not constants.
        shapes: tensor name -> (shape tuple of int | str | None, numpy dtype | None), from onnx shape inference
            on the unfused model with its own (possibly symbolic) input shapes.
        namer: fresh names for new initializers and nodes, unique in the whole model.
        graph: the (sub)graph being optimized (set by ``driver.run_passes`` for each graph in turn).
        main_graph: the model's main graph (set by ``driver.run_passes``; :attr:`graph` is it or one of its
            subgraphs).
        members: ``id()`` of the nodes of ``graph`` (rewrites only remove nodes, so it stays valid).
        order: the node slots of ``graph`` that rewrites edit (see ``onnxfuse.ir.edit.NodeOrder``; set with ``graph``; a
            rewrite reads it as :attr:`edit_order`).
        symbolic: the model's own symbolic shapes (``onnxfuse.analysis.symbolic.SymbolicShapes``: every dim a sympy
            expression in the input dims, from onnxruntime's symbolic shape inference), or None when not computed;
            passes read them through :meth:`own_symbolic`.
        symbolic_loader: computes :attr:`symbolic` on first use where the pipeline did not (its counts were made
            at concrete input shapes): a pass's decision must not depend on which command or figures asked for it.
        materialize_bytes: bytes the model may still grow by where ``constant_fold`` stores a conv/Gemm weight
            computed from compact constants (int8 x scale) as plain floats (``Options.materialize_weights_bytes``;
            each such fold spends its growth). 0: weights stay compact.
        portable: output tensor names of chains onnxruntime fuses itself at the target's level, where a form that
            needs a newer onnxruntime than the input model is not emitted (``onnxfuse.passes.portable``).
        excluded: sites (``records.Fusion.site``) that the driver must leave unfused, each with the sentence of
            the ``rewrite-broke-verification`` skip it records instead (the culprit search's reruns), or with
            ``(reason, sentence)`` for a skip of another reason (``--tune``'s ``slower-when-measured``).
            each such fold spends its growth). 0: weights stay compact. A fold into a weight other nodes also
            read spends from it too, once :attr:`shared_copy_bytes` is spent.
        shared_copy_bytes: bytes the whole model may still grow by where a fold gives a Conv or Gemm its own
            folded copy of a weight (or bias) that other nodes also read, which therefore stays
            (``passes._growth``): without it one weight shared by many convs, each with its own
            BatchNormalization, grew the model by one copy per conv (9.9 MB to 1.89 GB).
    """

    target: Target
    overridable: frozenset[str]
    shapes: dict[str, tuple[tuple | None, np.dtype | None]]
    namer: constants.Namer
    graph: gs.Graph | None = None
    main_graph: gs.Graph | None = None
    members: set[int] = field(default_factory=set)
    order: edit.NodeOrder | None = None
    symbolic: SymbolicShapes | None = None
    symbolic_loader: Callable[[], SymbolicShapes] | None = None
    materialize_bytes: int = 0
    portable: frozenset[str] = frozenset()
    excluded: dict[tuple[str, ...], str | tuple[Reason, str]] = field(default_factory=dict)
    shared_copy_bytes: int = SHARED_COPY_GROWTH_BYTES

    def own_symbolic(self) -> SymbolicShapes | None:
        """:attr:`symbolic`, computed by :attr:`symbolic_loader` on the first call where it is None."""
        if self.symbolic is None and self.symbolic_loader is not None:
            loader, self.symbolic_loader = self.symbolic_loader, None
            self.symbolic = loader()
        return self.symbolic

    def constant(self, tensor: gs.Tensor) -> tuple[np.ndarray | None, Reason | None]:
        """``(value, None)`` for a constant tensor, else ``(None, reason)``.

        The reason is :attr:`Reason.INITIALIZER_IS_INPUT` for an initializer that the caller may override (an
        initializer listed as a graph input, IR version 4 or later: ``model.io.overridable_initializers``) and
        for a value computed only from constants and such initializers (``--constant-initializer-inputs`` would
        make it a constant), :attr:`Reason.PARAMS_NOT_CONSTANT` otherwise.
        """
        value = constants.constant_value(tensor, self.overridable)
        if value is not None:
            return value, None
        if self.overridable and self._rests_on_overridable(tensor):
            return None, Reason.INITIALIZER_IS_INPUT
        return None, Reason.PARAMS_NOT_CONSTANT

    def _rests_on_overridable(self, tensor: gs.Tensor, limit: int = 64) -> bool:
        """True when ``tensor`` is an overridable initializer, or every path back from it (through at most
        ``limit`` tensors) ends at constants and at least one at an overridable initializer."""
        seen: set[int] = set()
        todo, found = [tensor], False
        while todo:
            t = todo.pop()
            if id(t) in seen:
                continue
            seen.add(id(t))
            if isinstance(t, gs.Constant):
                found = found or t.name in self.overridable
                continue
            node = t.inputs[0] if t.inputs else None
            if node is None or len(seen) > limit or not is_default_domain(node.domain):
                return False
            todo.extend(i for i in node.inputs if i.name)
        return found

    @property
    def opset(self) -> int:
        """The default-domain opset of :attr:`graph` (``gs.Graph.opset``).

        Raises:
            RuntimeError: no graph was set (``driver.run_passes`` sets it).
        """
        if self.graph is None:
            raise RuntimeError("Context.graph is not set: passes run inside onnxfuse.passes.driver.run_passes")
        return int(self.graph.opset)

    @property
    def edit_order(self) -> edit.NodeOrder:
        """:attr:`order`, which a rewrite edits.

        Raises:
            RuntimeError: no order was set (a rewrite called outside ``driver.run_passes``, which sets it).
        """
        if self.order is None:
            raise RuntimeError("Context.order is not set: rewrites run inside onnxfuse.passes.driver.run_passes")
        return self.order

    def dtype(self, tensor: gs.Tensor) -> np.dtype | None:
        """numpy dtype of ``tensor``, or None when no one knows it (bfloat16 and float8 are None too)."""
        if isinstance(tensor, gs.Constant):
            return constants.tensor_dtype(tensor)
        info = self.shapes.get(tensor.name)
        if info is not None and info[1] is not None:
            return info[1]
        return constants.tensor_dtype(tensor)

    def shape(self, tensor: gs.Tensor) -> tuple | None:
        """Static shape of ``tensor``: ints for known dims, strings for named symbolic dims, None for unknown ones.
        None when even the rank is unknown."""
        if isinstance(tensor, gs.Constant):
            return tuple(tensor.shape)
        info = self.shapes.get(tensor.name)
        if info is not None and info[0] is not None:
            return info[0]
        return tuple(tensor.shape) if tensor.shape is not None else None


M = TypeVar("M", bound=Match)


class Pass(Generic[M]):
    """Base class of a pass. Subclasses set the class attributes and implement both methods.

    Attributes:
        name: the name ``--only``/``--skip`` and the report use.
        kind: what its rewrites do (:class:`~onnxfuse.records.RewriteKind`; each :class:`Fusion` it returns carries
            it). ``canonicalize`` passes must be in ``onnxfuse.passes.CANONICALIZE`` and
            ``records.CANONICALIZE_NAMES``, the others in ``DEFAULT_PASSES``.
        summary: one line for ``onnxfuse passes``.
        reasons: every :class:`Reason` its ``match`` can return in a Skip (each has a test named after it in
            ``tests/passes/test_<name>.py``).
        anchors: the default-domain op types of the node a pattern ends on; ``match`` returns None for any other
            node, so the pipeline does not call it there. Empty: ``match`` is called on every node.
    """

    name: str = ""
    kind: RewriteKind
    summary: str = ""
    reasons: tuple[Reason, ...] = ()
    anchors: tuple[str, ...] = ()

    def match(self, node: gs.Node, ctx: Context) -> M | Skip | None:  # pragma: no cover - interface
        """Read-only: None when ``node`` does not end this pass's pattern, a Skip when it does but the rewrite
        would be unsafe or unsupported by the target, a typed Match otherwise."""
        raise NotImplementedError

    def rewrite(self, match: M, ctx: Context) -> Fusion:  # pragma: no cover - interface
        """Apply ``match`` to ``ctx.graph`` (numpy math and edge surgery, no decisions) and describe it."""
        raise NotImplementedError
