import pytest

from attnbench.impls import device_problem


def pytest_collection_modifyitems(config, items):
    reason = device_problem()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"gpu test: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
