"""The pass tests' ``fuse`` fixture: in a pass's own module (``tests/passes/test_<name>.py``, which sets
``PASS = "<name>"``) it runs that pass alone, so that a test of one pass sees what that pass does and nothing else.

A test that needs other passes names every pass it runs (``only=("constant_fold", PASS)``) or the ones it leaves out
(``skip=...``); cases about several passes together (their order, the fixpoint, which skip a Conv chain keeps) are
in ``test_driver.py``, which sets no ``PASS`` and so runs the whole pipeline.
"""

from __future__ import annotations

import pytest

from tests.conftest import optimize


@pytest.fixture
def fuse(tmp_path, request):
    """``fuse(model, target="cpu", **options) -> pipeline.Result`` for a model built in the test: the module's
    ``PASS`` alone unless ``options`` gives ``only`` or ``skip``; every pass in a module without ``PASS``."""
    own = getattr(request.module, "PASS", None)

    def run(model, target="cpu", **options):
        if own is not None and "only" not in options and "skip" not in options:
            options["only"] = (own,)
        return optimize(tmp_path, model, target, **options)

    return run
