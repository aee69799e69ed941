"""The committed sample models are exactly what sample_models/make_samples.py makes."""

import importlib.util

from tests.conftest import REPO


def test_samples_are_up_to_date():
    spec = importlib.util.spec_from_file_location("make_samples", REPO / "sample_models" / "make_samples.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    models = module.all_models()
    assert len(models) == 11
    for name, model in models.items():
        path = REPO / "sample_models" / name
        assert path.exists(), name
        assert path.read_bytes() == model.SerializeToString(deterministic=True), f"{name} is stale: rerun the script"
        assert path.stat().st_size < 100_000
