"""onnxruntime: its level names (``levels``), sessions and inputs (``sessions``), the graphs it optimizes
(``optimized_graph``) and its profiles (``profile``), and what each execution provider's fused kernels accept
(``providers``). The only package that creates onnxruntime sessions."""
