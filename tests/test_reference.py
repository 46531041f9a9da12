"""The float64 reference against a brute-force loop, and the 16-bit storage conversions."""
import math

import numpy as np
import pytest

from attnbench.arrays import from_float32, to_float32
from attnbench.patterns import make_mask
from attnbench.reference import reference, rel_error


def brute(q, k, v, mask):
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    B, H, T, D = q.shape
    out = np.zeros((B, H, T, D))
    for b in range(B):
        for h in range(H):
            for i in range(T):
                keys = [j for j in range(T) if mask.allowed(np.int64(i), np.int64(j))]
                s = np.array([q[b, h, i] @ k[b, h, j] for j in keys]) / math.sqrt(D)
                p = np.exp(s - s.max())
                p /= p.sum()
                out[b, h, i] = sum(pj * v[b, h, j] for pj, j in zip(p, keys))
    return out


@pytest.mark.parametrize("name, params", [("dense", {}), ("window", {"window": 3}),
                                          ("streaming", {"sink": 2, "window": 3}),
                                          ("block_diagonal", {"block": 4}),
                                          ("dilated", {"window": 3, "dilation": 2}),
                                          ("bigbird", {"block": 4, "random_blocks": 1})])
@pytest.mark.parametrize("causal", [True, False])
def test_reference_matches_brute_force(name, params, causal):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 2, 12, 5)).astype(np.float32) for _ in range(3))
    m = make_mask(name, 12, causal, **params)
    ref = reference(q, k, v, m, chunk_bytes=800, tile=4)  # several tiles and chunks
    assert np.allclose(ref, brute(q, k, v, m), rtol=1e-12, atol=1e-12)


def test_rel_error_rejects_nan_and_measures():
    ref = np.ones((2, 3))
    assert rel_error(ref * 1.001, ref) == pytest.approx(1e-3)
    bad = ref.copy()
    bad[0, 0] = np.nan
    assert math.isnan(rel_error(bad, ref))


@pytest.mark.parametrize("dtype, tol", [("bfloat16", 2 ** -8), ("float16", 2 ** -11)])
def test_16bit_storage_round_trip(dtype, tol):
    x = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    y = to_float32(from_float32(x, dtype), dtype)
    assert np.all(np.abs(y - x) <= tol * np.abs(x) + 1e-30)
    assert not np.array_equal(y, x)  # rounding happened


def test_reference_notices_a_tile_list_that_misses_pairs(monkeypatch):
    from attnbench import tiles

    m = make_mask("window", 64, True, window=8)
    good = tiles.build

    def drop_last(mask, BM, BN):
        t = good(mask, BM, BN)
        return tiles.Tiles.from_entries(t.BM, t.BN, np.minimum(t.ptr, t.ptr[-1] - 1), t.entries[:-1])

    monkeypatch.setattr(tiles, "build", drop_last)
    q = np.ones((1, 1, 64, 4), np.float32)
    with pytest.raises(AssertionError, match="misses"):
        reference(q, q, q, m, tile=16)
