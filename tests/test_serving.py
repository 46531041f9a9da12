"""Serving shapes on the host: grouped-query heads, Tq queries at the end of the cache, ragged
batches: their pairs, FLOPs and bytes floor (SPEC sections 1, 3)."""
import numpy as np
import pytest

from attnbench.impls import ITEMSIZE, Problem
from attnbench.patterns import BadInput, examples, make_mask
from attnbench.serving import draw_lens

T = 128


def brute_counts(mask, Tq):
    """(pairs, keys read) of the last Tq rows, from the dense mask."""
    d = mask.dense(np.arange(mask.T - Tq, mask.T))
    return int(d.sum()), int(d.any(axis=0).sum())


@pytest.mark.parametrize("name,causal,ps", list(examples(T)), ids=str)
def test_prefill_numbers_are_unchanged(name, causal, ps):
    m = make_mask(name, T, causal, **ps)
    p = Problem(m, 2, 4, 64, "bfloat16")
    assert p.prefill and p.shape == p.kv_shape == (2, 4, T, 64)
    assert (p.pairs, p.density) == (m.pairs, m.density)
    assert p.flops == 4 * 64 * m.pairs * 2 * 4
    assert p.bytes_floor == 4 * 2 * 4 * T * 64 * 2


@pytest.mark.parametrize("name,causal,ps", list(examples(T)), ids=str)
@pytest.mark.parametrize("Tq", [1, 5, 16, T])
def test_keys_and_counts_of_the_last_rows_match_the_dense_mask(name, causal, ps, Tq):
    m = make_mask(name, T, causal, **ps)
    rows = np.arange(T - Tq, T)
    d = m.dense(rows)
    assert np.array_equal(m.keys(rows), np.flatnonzero(d.any(axis=0)))
    assert m.row_counts(rows).sum() == d.sum()


@pytest.mark.parametrize("Tq", [1, 16])
def test_decode_pairs_flops_and_bytes(Tq):
    m = make_mask("window", T, True, window=32)
    p = Problem(m, 3, 8, 64, "float16", H_kv=2, Tq=Tq)
    pairs, keys = brute_counts(m, Tq)
    assert (p.pairs, p.shape, p.kv_shape) == (pairs, (3, 8, Tq, 64), (3, 2, T, 64))
    assert p.flops == 4 * 64 * pairs * 3 * 8
    assert p.bytes_floor == (2 * 3 * 8 * Tq + 2 * 3 * 2 * keys) * 64 * 2
    assert p.density == pairs / (Tq * T)


def test_gqa_prefill_counts_kv_at_its_heads():
    p = Problem(make_mask("dense", T), 2, 8, 64, "float32", H_kv=2)
    assert p.prefill and p.pairs == T * (T + 1) // 2
    assert p.bytes_floor == (2 * 2 * 8 * T + 2 * 2 * 2 * T) * 64 * 4


def test_streaming_cache_of_any_length_costs_sinks_window_and_queries():
    for Tk in (4096, 1 << 20):
        p = Problem(make_mask("streaming", Tk, True, sink=4, window=1024), 8, 32, 128, "bfloat16", H_kv=8, Tq=16)
        assert p.bytes_floor == (2 * 8 * 32 * 16 + 2 * 8 * 8 * (4 + 1024 + 15)) * 128 * ITEMSIZE["bfloat16"]


@pytest.mark.parametrize("name,ps", [("dense", {}), ("window", {"window": 16}), ("streaming", {"sink": 4, "window": 8}),
                                     ("block_diagonal", {"block": 16}), ("bigbird", {"block": 16}),
                                     ("dilated", {"window": 8, "dilation": 3})])
def test_ragged_batch_sums_its_sequences(name, ps):
    lens = (128, 64, 96, 64)
    p = Problem(make_mask(name, T, True, **ps), 4, 4, 16, "float32", Tq=4, cache_lens=lens)
    per = [brute_counts(make_mask(name, t, True, **ps), 4) for t in lens]
    assert p.pairs == sum(n for n, _ in per)
    assert p.flops == 4 * 16 * p.pairs * 4
    assert p.bytes_floor == (2 * 4 * 4 * 4 + 2 * 4 * sum(k for _, k in per)) * 16 * 4
    assert p.density == p.pairs / (4 * sum(lens))


@pytest.mark.parametrize("kw,words", [
    ({"H_kv": 3}, ["H_kv=3", "H=8"]),
    ({"H_kv": 0}, ["H_kv=0", "H=8"]),
    ({"Tq": 0}, ["Tq=0", "T=128"]),
    ({"Tq": 129}, ["Tq=129", "T=128"]),
    ({"Tq": 16, "cache_lens": (128, 8)}, ["cache_lens", "8", "Tq=16"]),
    ({"Tq": 1, "cache_lens": (128, 256)}, ["cache_lens", "256", "T=128"]),
    ({"Tq": 1, "cache_lens": (128,)}, ["cache_lens", "B=2"]),
])
def test_bad_serving_shapes_are_refused_naming_the_limit(kw, words):
    with pytest.raises(BadInput) as e:
        Problem(make_mask("dense", T), 2, 8, 64, "float32", **kw)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_a_cache_length_the_pattern_does_not_fit_is_refused():
    with pytest.raises(BadInput, match=r"cache_lens holds 40.*block"):
        Problem(make_mask("block_diagonal", T, False, block=16), 2, 1, 16, "float32", Tq=1, cache_lens=(128, 40))


def test_drawn_lengths_are_seeded_and_in_range():
    a = draw_lens("uniform", 3, 64, 32768, 16)
    assert a == draw_lens("uniform", 3, 64, 32768, 16) != draw_lens("uniform", 4, 64, 32768, 16)
    assert all(8192 <= t <= 32768 and t % 64 == 0 for t in a) and len(set(a)) > 10
    with pytest.raises(BadInput, match="--cache-dist"):
        draw_lens("zipf", 0, 2, 128)


def test_a_million_keys_counts_exactly_without_a_dense_mask():
    """A ragged batch of caches up to 2^20 keys counts its pairs and bytes per cache length (a [Tq, Tk] mask per
    sequence would be 2^40 bits a batch): dense causal, queries at Tk_b - 16 .. Tk_b - 1."""
    lens = draw_lens("uniform", 0, 64, 1 << 20, 16)
    p = Problem(make_mask("dense", 1 << 20), 64, 32, 128, "bfloat16", H_kv=8, Tq=16, cache_lens=lens)
    assert max(lens) > 1 << 19 and len(set(lens)) > 32
    assert p.pairs == sum(16 * L - 120 for L in lens)
    assert p.bytes_floor == (2 * 64 * 32 * 16 + 2 * 8 * sum(lens)) * 128 * 2
