"""Numerical verification: does an optimized model compute what the original does, in onnxruntime?

The entry point is :func:`onnxfuse.verification.verify.verify_models` (the rule: :mod:`onnxfuse.verification.rule`);
the public API reaches it as ``onnxfuse.verify`` and its result as ``onnxfuse.Verification``.
"""
