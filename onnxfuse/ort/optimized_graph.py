"""What onnxruntime itself runs at a graph optimization level: the graphs behind the report's figures "vs what
onnxruntime already runs at LEVEL".

onnxruntime optimizes every model again when a session loads it (``SessionOptions.graph_optimization_level``):
at ``basic`` it folds BatchNormalization, Add and Mul into Conv; at ``extended`` it fuses Conv + activation into
FusedConv on the CPU provider; at ``all`` it also rewrites convs to its NCHWc layout and absorbs activations and
Adds into them (``onnxruntime/core/optimizer/graph_transformer_utils.cc``). Many of onnxfuse's fusions are therefore
ones the user's runtime makes anyway. This module has onnxruntime write the graph it optimized
(``optimized_model_filepath``) for the original and for the optimized model, and compares them:

* **kernels**: the nodes of each optimized graph (every subgraph included), i.e. the kernels onnxruntime runs;
* **materialized tensors**: the names of the tensors those nodes write. A fusion of onnxfuse is *made by
  onnxruntime too* when none of the intermediate tensors it removed is still written in onnxruntime's graph of the
  original (onnxruntime keeps the name of the last output of a chain it fuses, as onnxfuse does, and drops the
  intermediates). Tensors onnxruntime renamed count by their original names: those it writes again in another
  dtype (``InsertedPrecisionFreeCast_``, :func:`original_names`) and those it writes in its NCHWc layout
  (``reorder_token_N``, :func:`written_tensors`).

The graphs are only inspected (their weights are written to a side file and never read back); the sessions run
on the CPU execution provider of the installed onnxruntime, which is what these figures are measured against.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata

import onnx

from onnxfuse.errors import one_line
from onnxfuse.model.domains import is_default_domain


@dataclass
class RuntimeGraphs:
    """onnxruntime's own optimized graphs of the original and the optimized model at one level.

    Attributes:
        level: the graph optimization level (``onnxfuse.ort.levels.ORT_LEVELS``).
        onnxruntime: the installed onnxruntime's version, which made the graphs.
        provider: the execution provider the sessions used.
        original_ops / optimized_ops: op -> number of nodes (kernels) in each optimized graph, ``domain::op`` for
            ops outside the default domain; empty when unavailable.
        original_tensors: names of the tensors the nodes of onnxruntime's graph of the original write.
        reason: why the graphs are unavailable (onnxruntime could not load a model), else None.
        unchanged: nothing was rewritten, so no session was made: the output runs as the original does, and
            nothing is saved beyond onnxruntime (:meth:`nothing_rewritten`).
    """

    level: str
    onnxruntime: str
    provider: str = "CPUExecutionProvider"
    original_ops: dict[str, int] = field(default_factory=dict)
    optimized_ops: dict[str, int] = field(default_factory=dict)
    original_tensors: frozenset[str] = frozenset()
    reason: str | None = None
    unchanged: bool = False

    @classmethod
    def nothing_rewritten(cls, level: str) -> RuntimeGraphs:
        """The comparison of a model that nothing rewrote: no session needed (the output is the original)."""
        return cls(level=level, onnxruntime=installed_version(), unchanged=True)

    @property
    def available(self) -> bool:
        """True when both graphs were made."""
        return self.reason is None

    def materialized(self, name: str) -> bool:
        """True when a node of onnxruntime's graph of the original writes the tensor called ``name``."""
        return name in self.original_tensors

    def made_by_onnxruntime(self, intermediates: list[str]) -> bool:
        """True when onnxruntime's graph of the original writes none of ``intermediates`` (tensor names that a
        fusion of onnxfuse removed): onnxruntime makes that fusion itself at load."""
        return not any(self.materialized(name) for name in intermediates)


def installed_version() -> str:
    """The installed onnxruntime's version (package metadata; nothing is imported)."""
    try:
        return metadata.version("onnxruntime")
    except metadata.PackageNotFoundError:  # another build of it (onnxruntime-gpu, -openvino...)
        import onnxruntime

        return onnxruntime.__version__


def runtime_graphs(original: str | bytes, optimized: onnx.ModelProto | str, level: str,
                   original_graph: onnx.ModelProto | None = None, check: Callable[[], None] | None = None,
                   original_of: RuntimeGraphs | None = None, optimized_graph: onnx.ModelProto | None = None
                   ) -> RuntimeGraphs:
    """Have onnxruntime optimize ``original`` (a path, or serialized bytes) and ``optimized`` (a ModelProto, or the
    path of its file) at ``level`` on the CPU execution provider and describe both graphs (:class:`RuntimeGraphs`).

    ``original_graph``: onnxruntime's graph of ``original`` at ``level``, when a session made with the same options
    (:func:`onnxfuse.ort.sessions.session` with ``spinning=False`` and :data:`SAVE_CONFIG`) already wrote it
    (:func:`read_graph`); no session of the original is made then. ``optimized_graph``: the same for
    ``optimized`` (verification's session of it at level ``disable`` wrote it).

    ``original_of``: an earlier result for the same ``original`` at the same ``level`` (available), whose
    original side is taken as it is: no session of the original is made (the model after the culprit search
    is compared again with the same original).

    ``check``: called before each session is made (the budget of ``pipeline.optimize``, shared with
    verification: ``onnxfuse.verification.run.check_budget``); when it raises :class:`RunTimeout` (or
    :class:`WorkSpent`) no more sessions are made and the result's ``reason`` says the budget ran out.

    Never raises for a model onnxruntime cannot load: the result's ``reason`` says why (one line).
    """
    from onnxfuse.ort import sessions as runtime

    result = RuntimeGraphs(level=level, onnxruntime=installed_version())
    reuse = original_of is not None and original_of.available and original_of.level == level
    try:
        if original_graph is None and not reuse:
            if check is not None:
                check()
            original_graph = _optimized_graph(original, level)
        if optimized_graph is None:
            if check is not None:
                check()
            with runtime.loadable(optimized, as_file=True) as source:
                optimized_graph = _optimized_graph(source, level)
    except runtime.RunTimeout as exc:
        kind = "work (--verify-budget)" if isinstance(exc, runtime.WorkSpent) else "time (--verify-timeout)"
        result.reason = f"the budget that verification and this comparison share ran out of {kind}"
        return result
    except Exception as exc:  # onnxruntime raises its own exception types for a model it cannot load
        result.reason = f"onnxruntime {result.onnxruntime} could not load the model at level {level} " \
                        f"({one_line(exc, 200)})"
        return result
    if reuse:
        assert original_of is not None
        result.original_ops, result.original_tensors = original_of.original_ops, original_of.original_tensors
    else:
        assert original_graph is not None
        result.original_ops = op_counts(original_graph)
        result.original_tensors = written_tensors(original_graph)
    result.optimized_ops = op_counts(optimized_graph)
    return result


#: onnxruntime's NCHWc transformer replaces a node by one in the blocked layout named after the tensor the old node
#: wrote, ``<tensor>_nchwc`` (``graph.GenerateNodeName``, which appends ``_token_N`` to a name already taken), and
#: gives it a new output, ``reorder_token_N``; a ReorderOutput writes the tensor under its own name again only where
#: a node outside the layout reads it (``onnxruntime/core/optimizer/nchwc_transformer.cc``).
_NCHWC_DOMAIN = "com.microsoft.nchwc"
_NCHWC_NODE = re.compile(r"^(?P<tensor>.+)_nchwc(?:_token_\d+)?$")


def written_tensors(graph: onnx.ModelProto) -> frozenset[str]:
    """The tensors the nodes of onnxruntime's optimized ``graph`` (every subgraph included) write, by the names the
    model it optimized gives them: each output's name (:func:`original_names`), and for a node of the NCHWc layout
    (:data:`_NCHWC_NODE`) the tensor it is named after, which it writes in the blocked layout under a
    ``reorder_token_N`` name: that tensor still makes its round trip through memory, so a fusion that removed it
    is not one onnxruntime makes itself."""
    names: list[str] = []
    for sub in _graphs(graph.graph):
        for node in sub.node:
            names.extend(name for name in node.output if name)
            if node.domain == _NCHWC_DOMAIN:
                found = _NCHWC_NODE.match(node.name)
                if found:
                    names.append(found["tensor"])
    return frozenset(original_names(names))


#: Prefixes onnxruntime gives a tensor it writes again in another dtype: its insert-cast transformer runs an op
#: that has no float16 kernel in float32 between Casts, names the cast tensor ``InsertedPrecisionFreeCast_`` + the
#: original name (``graph.GenerateNodeName``, which may append ``_N``), and renames it ``FusedBack_...`` where it
#: removes a Cast pair (``onnxruntime/core/optimizer/insert_cast_transformer.cc``).
_CAST_PREFIXES = ("InsertedPrecisionFreeCast_", "FusedBack_")
_UNIQUE_SUFFIX = re.compile(r"_\d+$")


def original_names(names) -> set[str]:
    """The tensor names of onnxruntime's optimized graph (``names``), plus, for a tensor onnxruntime renamed when it
    inserted a Cast (:data:`_CAST_PREFIXES`), the original tensor's name: the model still writes that tensor (in
    another dtype), so a fusion that removed it is not one onnxruntime makes itself."""
    out = set()
    for name in names:
        out.add(name)
        for prefix in _CAST_PREFIXES:
            if name.startswith(prefix):
                base = name[len(prefix):]
                out.update((base, _UNIQUE_SUFFIX.sub("", base)))
    return out


def kernels_at(model: onnx.ModelProto, level: str) -> int | None:
    """How many kernels (nodes, every subgraph included) onnxruntime's optimized graph of ``model`` has at
    ``level`` on the CPU execution provider; None when onnxruntime cannot load it."""
    from onnxfuse.ort import sessions as runtime

    try:
        with runtime.loadable(model, as_file=True) as source:
            return kernels(op_counts(_optimized_graph(source, level)))
    except Exception:  # onnxruntime raises its own exception types for a model it cannot load
        return None


def _optimized_graph(source: str | bytes, level: str) -> onnx.ModelProto:
    """The graph onnxruntime runs for ``source`` at ``level``, without its weights (they go to a side file that
    is deleted unread)."""
    from onnxfuse.ort import sessions as runtime

    with tempfile.TemporaryDirectory(prefix="onnxfuse-ort-") as folder:
        path = graph_path(folder)
        runtime.session(source, level=level, save_to=path, spinning=False, config=SAVE_CONFIG, trim=True)
        return onnx.load_model(path, load_external_data=False)


def graph_path(folder: str, name: str = "optimized.onnx") -> str:
    """Where a session made with :data:`SAVE_CONFIG` writes its graph in ``folder`` (an empty folder of the
    caller's, one graph each): ``folder/name``, with the side file of its weights made a symbolic link to
    ``os.devnull`` first, so that the weights, never read back, are not written to disk (2.3 GB for a 2.3 GB
    model, twice in optimize's comparison). onnxruntime opens the side file by its name (``std::ofstream`` in
    ``Graph::ToGraphProtoWithExternalInitializers``, graph.cc) and so writes through the link; the graph file is
    the same. Where no such link can be made (no symbolic links, no ``os.devnull``), the weights are written to
    the side file as before."""
    try:
        os.symlink(os.devnull, os.path.join(folder, SAVE_CONFIG[_WEIGHTS_FILE_KEY]))
    except (OSError, NotImplementedError):
        pass
    return os.path.join(folder, name)


#: The session configuration key of the side file's name (onnxruntime_session_options_config_keys.h).
_WEIGHTS_FILE_KEY = "session.optimized_model_external_initializers_file_name"

#: Session configuration of the sessions whose optimized graph is read (onnxruntime_session_options_config_keys.h):
#: write every initializer to a side file, so that a model of any size can be saved (a graph over 2 GiB cannot) and
#: only its structure is read back (:func:`graph_path` sends the side file to ``os.devnull``). With
#: ``spinning=False`` (:func:`onnxfuse.ort.sessions.session`), the options of every session that writes a graph for
#: :func:`runtime_graphs`.
SAVE_CONFIG = {_WEIGHTS_FILE_KEY: "weights.bin",
               "session.optimized_model_external_initializers_min_size_in_bytes": "0"}


def read_graph(path: str) -> onnx.ModelProto | None:
    """The graph a session made with :data:`SAVE_CONFIG` wrote to ``path``, without its weights; None when there
    is no such file or it cannot be read (the session that should have written it failed)."""
    if not os.path.isfile(path):
        return None
    try:
        return onnx.load_model(path, load_external_data=False)
    except Exception:  # onnx raises DecodeError, ValueError... for a truncated file
        return None


def _graphs(graph: onnx.GraphProto):
    """``graph`` and every subgraph in its nodes' attributes (If/Loop/Scan bodies), depth first."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                yield from _graphs(sub)


def op_counts(model: onnx.ModelProto) -> dict[str, int]:
    """op -> node count over every graph of ``model`` (``domain::op`` outside the default domain), sorted."""
    counts = Counter(node.op_type if is_default_domain(node.domain) else f"{node.domain}::{node.op_type}"
                     for graph in _graphs(model.graph) for node in graph.node)
    return dict(sorted(counts.items()))


def kernels(ops: dict[str, int]) -> int:
    """Number of kernels (nodes) in an :func:`op_counts` result."""
    return sum(ops.values())


def ops_removed(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """op -> how many fewer nodes of it ``after`` has than ``before`` (only ops with fewer), sorted."""
    return dict(sorted((Counter(before) - Counter(after)).items()))

