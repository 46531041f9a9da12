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


@pytest.mark.parametrize("whole", [True, False])
def test_arrays_not_kept_are_drawn_but_not_stored(monkeypatch, whole):
    """keep="kv" (a decode cache's k and v): q comes back as None, and k and v hold the values they hold
    when all three are kept, drawn whole or in pieces."""
    if not whole:
        monkeypatch.setattr(arrays, "WHOLE", 100)
        monkeypatch.setattr(arrays, "PIECE", 64)
    shape = (3, 7, 10)
    every = random_inputs(shape, "bfloat16", 5, xp=np)
    for keep in ("kv", "q", "v"):
        got = random_inputs(shape, "bfloat16", 5, xp=np, keep=keep)
        for name, a, want in zip("qkv", got, every):
            if name in keep:
                np.testing.assert_array_equal(a, want)
            else:
                assert a is None


def test_decode_inputs_keep_no_cache_shaped_q(monkeypatch):
    """problem_inputs at Tq < Tk asks for k and v only at the cache's shape and for q only at its own."""
    from attnbench.check import problem_inputs
    from attnbench.impls import Problem
    from attnbench.patterns import make_mask

    calls = []

    def make(shape, dtype, seed, keep="qkv"):
        calls.append((shape, keep))
        return random_inputs(shape, dtype, seed, xp=np, keep=keep)

    prob = Problem(make_mask("dense", 64, True), 2, 8, 64, "bfloat16", H_kv=2, Tq=1)
    q, k, v = problem_inputs(prob, 3, make)
    assert calls == [(prob.kv_shape, "kv"), (prob.shape, "q")]
    assert q.shape == prob.shape and k.shape == v.shape == prob.kv_shape
    _, k0, v0 = random_inputs(prob.kv_shape, "bfloat16", 3, xp=np)
    np.testing.assert_array_equal(k, k0)
    np.testing.assert_array_equal(v, v0)
    np.testing.assert_array_equal(q, random_inputs(prob.shape, "bfloat16", 4, xp=np)[0])
