import sys
from pathlib import Path

import pytest

from attnbench import impls
from attnbench.impls import device_problem

sys.path.insert(0, str(Path(__file__).parent / "data"))


def pytest_collection_modifyitems(config, items):
    reason = device_problem()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"gpu test: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def registry(monkeypatch):
    """The registry holds the fake implementations of tests/data/fakes.py only."""
    from fakes import fake_impls

    reg = {i.name: i for i in fake_impls()}
    monkeypatch.setattr(impls, "_REGISTRY", reg)
    monkeypatch.setattr(impls, "_load_all", lambda: None)
    return reg
