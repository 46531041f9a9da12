"""Random inputs on the host (numpy as the array module): shapes, dtypes, and large arrays drawn in pieces."""
import numpy as np
import pytest

from attnbench import arrays
from attnbench.arrays import random_inputs, to_float32


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_whole_draws_are_the_ones_they_always_were(dtype):
    shape = (2, 3, 50, 8)
    got = random_inputs(shape, dtype, 7, xp=np, scale=0.5)
    rng = np.random.default_rng(7)
    for a in got:
        want = arrays.from_float32(rng.standard_normal(shape, dtype=np.float32) * np.float32(0.5), dtype)
        assert a.shape == shape and a.dtype == np.dtype(arrays.STORAGE[dtype])
        np.testing.assert_array_equal(a, want)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_large_arrays_are_drawn_in_pieces_of_one_stream(monkeypatch, dtype):
    """Above WHOLE elements: the same stream of normals, piece by piece, into the storage array (the
    float32 draw of a whole 17 GB cache never exists)."""
    monkeypatch.setattr(arrays, "WHOLE", 100)
    monkeypatch.setattr(arrays, "PIECE", 64)
    shape = (3, 7, 10)  # 210 elements: pieces of 64, 64, 64 and 18
    got = random_inputs(shape, dtype, 11, xp=np, scale=2.0)
    rng = np.random.default_rng(11)
    for a in got:
        want = np.concatenate([rng.standard_normal(n, dtype=np.float32) for n in (64, 64, 64, 18)]) * np.float32(2)
        assert a.shape == shape and a.dtype == np.dtype(arrays.STORAGE[dtype])
        np.testing.assert_array_equal(a.ravel(), arrays.from_float32(want, dtype))
    values = to_float32(np.concatenate([a.ravel() for a in got]), dtype)
    assert 1.5 < values.std() < 2.5 and len(np.unique(values)) > 400
