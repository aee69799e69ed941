"""What the model computes, without running it: static shapes from onnx's inference (``shapes``), symbolic
shapes and byte expressions (``symbolic``, ``ort_symbolic`` for onnxruntime's SymbolicShapeInference,
``expressions`` to read them back), and the memory traffic of each node (``traffic``)."""
