import pytest


def _device_reason():
    try:
        import cupy
    except Exception as e:  # pragma: no cover - depends on the machine
        return f"CuPy is not importable: {e}"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        return f"no CUDA device: {e}"
    return None if n > 0 else "no CUDA device"


def pytest_collection_modifyitems(config, items):
    reason = _device_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"gpu test: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
