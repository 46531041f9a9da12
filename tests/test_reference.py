"""The float64 reference against a brute-force loop, and the 16-bit storage conversions."""
import math

import numpy as np
import pytest

from attnbench.arrays import from_float32, to_float32
from attnbench.patterns import make_mask
from attnbench.reference import reference, rel_error


def brute(q, k, v, mask):
    """One query at a time over the whole sequence (the serving loop below with Tq = T)."""
    return brute_serving(q, k, v, mask)


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
    with pytest.raises(AssertionError, match="misses"), np.errstate(invalid="ignore"):  # the row left keyless: NaN
        reference(q, q, q, m, tile=16)


# -- serving shapes: grouped-query heads, Tq < Tk, ragged batches -----------------------------

def brute_serving(q, k, v, mask, cache_lens=None):
    """One query at a time: sequence b holds Tk_b keys, its Tq queries at Tk_b - Tq .. Tk_b - 1,
    query head h reads key/value head h // (H // H_kv); the predicate on absolute positions."""
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    B, H, Tq, D = q.shape
    H_kv = k.shape[1]
    out = np.zeros(q.shape)
    for b in range(B):
        t = mask.T if cache_lens is None else cache_lens[b]
        m = mask.at(t)
        for h in range(H):
            g = h // (H // H_kv)
            for n in range(Tq):
                i = t - Tq + n
                keys = [j for j in range(t) if m.allowed(np.int64(i), np.int64(j))]
                s = np.array([q[b, h, n] @ k[b, g, j] for j in keys]) / math.sqrt(D)
                p = np.exp(s - s.max())
                p /= p.sum()
                out[b, h, n] = sum(pj * v[b, g, j] for pj, j in zip(p, keys))
    return out


SERVING_PATTERNS = [("dense", {}), ("window", {"window": 3}), ("streaming", {"sink": 2, "window": 3}),
                    ("block_diagonal", {"block": 4}), ("bigbird", {"block": 4, "random_blocks": 1}),
                    ("dilated", {"window": 3, "dilation": 2}),
                    ("document", {"doc_lens": (5, 3, 8)})]


@pytest.mark.parametrize("name, params", SERVING_PATTERNS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("H, H_kv, Tq, lens", [(4, 2, 16, None), (4, 1, 5, None), (2, 2, 1, None),
                                               (4, 2, 3, (16, 8, 12)), (6, 3, 1, (4, 16, 8)),
                                               (4, 2, 2, (16, 8, 16, 8))])
@pytest.mark.parametrize("chunk_bytes", [900, 1 << 20], ids=["a-sequence-at-a-time", "together"])
def test_serving_reference_matches_brute_force(name, params, causal, H, H_kv, Tq, lens, chunk_bytes):
    rng = np.random.default_rng(1)
    B, T, D = (len(lens) if lens else 2), 16, 5
    q = rng.standard_normal((B, H, Tq, D)).astype(np.float32)
    k, v = (rng.standard_normal((B, H_kv, T, D)).astype(np.float32) for _ in range(2))
    m = make_mask(name, T, causal, **params)
    if lens and name == "document":  # the table is for T: a ragged batch needs a table per length
        pytest.skip("document's doc_lens sum to one T only")
    ref = reference(q, k, v, m, chunk_bytes=chunk_bytes, tile=4, cache_lens=lens)
    assert np.allclose(ref, brute_serving(q, k, v, m, lens), rtol=1e-12, atol=1e-12)


def test_keys_beyond_a_sequences_cache_are_unused():
    rng = np.random.default_rng(2)
    q = rng.standard_normal((2, 2, 3, 4)).astype(np.float32)
    k, v = (rng.standard_normal((2, 1, 16, 4)).astype(np.float32) for _ in range(2))
    m = make_mask("window", 16, True, window=4)
    a = reference(q, k, v, m, cache_lens=(8, 16))
    k[0, :, 8:], v[0, :, 8:] = np.nan, np.nan
    assert np.array_equal(a, reference(q, k, v, m, cache_lens=(8, 16)))


@pytest.mark.parametrize("name, params", SERVING_PATTERNS)
def test_prefill_with_one_kv_head_per_query_head_is_the_plain_reference(name, params):
    """Tq = Tk, H_kv = H: the tile-list path, against the loop."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 2, 16, 4)).astype(np.float32) for _ in range(3))
    m = make_mask(name, 16, True, **params)
    assert np.allclose(reference(q, k, v, m, tile=4), brute(q, k, v, m), rtol=1e-12, atol=1e-12)


def test_the_block_of_rows_is_sized_by_the_memory_it_may_take():
    """On the CPU a fixed 256 MiB of float64 scores; on a GPU a sixteenth of the free memory within
    256 MiB and 2 GiB, so long rows go in blocks of many rows (numpy stands in for no GPU here: any
    other array module is taken for CuPy)."""
    import numpy as np

    from attnbench.reference import DEVICE_CHUNK, HOST_CHUNK, default_chunk_bytes

    assert default_chunk_bytes(np) == HOST_CHUNK == 1 << 28
    gpu = object()
    assert DEVICE_CHUNK == (1 << 28, 1 << 31)
    assert default_chunk_bytes(gpu, free=8 << 30) == 512 << 20
    assert default_chunk_bytes(gpu, free=80 << 30) == 1 << 31
    assert default_chunk_bytes(gpu, free=1 << 30) == 1 << 28
