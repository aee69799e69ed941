"""onnxruntime's graph optimization levels by the names onnxfuse gives them (``--ort-level``, ``bench --level``,
a batch row's ``ort_level``). Imports nothing, so that the command line lists them in ``--help`` without loading
the library.
"""

from __future__ import annotations

#: Level name -> ``onnxruntime.GraphOptimizationLevel`` member name, in increasing order (onnxruntime's
#: ``SessionOptions.graph_optimization_level``).
GRAPH_OPTIMIZATION_LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC",
                             "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}

#: The level names, in increasing order.
ORT_LEVELS = tuple(GRAPH_OPTIMIZATION_LEVELS)

#: The level onnxfuse assumes the user's sessions run at when none is given: onnxruntime's own default
#: (``SessionOptions.graph_optimization_level`` is ORT_ENABLE_ALL).
DEFAULT_ORT_LEVEL = "all"
