"""onnx-graphsurgeon: conversion of a model to and from its graph (``convert``), the in-place export
(``export``), reading constants (``constants``) and editing edges (``edit``). The passes and this package are the
only users of onnx-graphsurgeon."""
