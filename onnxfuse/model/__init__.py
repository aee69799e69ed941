"""ONNX protobuf only (onnx and numpy, no onnx-graphsurgeon, no onnxruntime): loading and checking a model
(``io``), the atomic writers (``io.save_model`` for models, ``files.write_atomically`` for reports), hygiene, graph
walking and the weight-free skeleton (``proto``), operator domains and dtypes."""
