"""Transposed tile lists (attnbench.tiles.transpose, tile_list_t): for each key tile the query tiles
the forward list pairs with it, flagged alike, for every registered pattern's examples and every llm
instance (against a plain sort of the entries, byte for byte)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnbench.configs import LLM
from attnbench.errors import BadInput
from attnbench.fwd_config import choose_config
from attnbench import tiles as tl
from attnbench.patterns import examples, make_mask
from attnbench.tiles import Tiles, TransposedTiles, build, tile_list, tile_list_t, transpose

from test_patterns import masks

SHAPES = [(16, 16), (64, 32), (128, 64), (64, 16), (32, 64), (48, 16)]


def brute_transpose(t: Tiles, n_ktiles: int) -> list[list[int]]:
    """Per key tile, entries qt << 1 | partial, from the forward entries one by one."""
    out = [[] for _ in range(n_ktiles)]
    for qt in range(t.ptr.size - 1):
        for e in t.entries[t.ptr[qt]:t.ptr[qt + 1]]:
            out[e >> 1].append(qt << 1 | (e & 1))
    return out


def assert_transposed(m, BM, BN):
    """Every way of transposing (a band's closed form where it applies, from the entries, from the
    runs) gives the brute-force list."""
    for how in (transpose, tl._transpose_band, tl._transpose_entries, tl._transpose_runs):
        assert_transposed_by(how, m, BM, BN)


def assert_transposed_by(how, m, BM, BN):
    fwd = build(m, BM, BN)
    nk = -(-m.T // BN)
    tt = how(fwd, nk)
    if tt is None:  # not a band
        assert how is tl._transpose_band
        return
    assert isinstance(tt, TransposedTiles) and (tt.BM, tt.BN) == (BM, BN)
    assert tt.ptr.dtype == np.int32 and tt.ptr.size == nk + 1 and tt.n_ktiles == nk
    want = brute_transpose(fwd, nk)
    got = [list(tt.entries[tt.ptr[k]:tt.ptr[k + 1]]) for k in range(nk)]
    assert got == want
    assert tt.n_visited == fwd.n_visited and tt.n_partial == fwd.n_partial
    assert (tt.run_len > 0).all() and (np.diff(tt.run_off) >= 1).all()
    # a run stays inside one key tile's row, and runs are maximal
    k_first = np.searchsorted(tt.ptr, tt.run_off, side="right") - 1
    k_last = np.searchsorted(tt.ptr, tt.run_off + tt.run_len - 1, side="right") - 1
    assert (k_first == k_last).all()
    last = tt.run_val + 2 * (tt.run_len - 1)
    assert not ((k_first[1:] == k_first[:-1]) & (tt.run_val[1:] == last[:-1] + 2)).any()


@pytest.mark.parametrize("T", [1, 7, 128, 257, 1000, 1536])
@pytest.mark.parametrize("tile", [(64, 64), (128, 64), (64, 32), (48, 16)])
def test_transpose_of_every_example_is_the_brute_force_one(T, tile):
    n = 0
    for name, causal, ps in examples(T):
        try:
            m = make_mask(name, T, causal, **ps)
        except BadInput:  # an example that does not fit this T (a block that does not divide it)
            continue
        assert_transposed(m, *tile)
        n += 1
    assert n > 0


@settings(max_examples=120, deadline=None)
@given(masks(), st.sampled_from(SHAPES + [(1, 1), (2, 4), (4, 2)]))
def test_transpose_of_random_masks(m, tile):
    assert_transposed(m, *tile)


def test_an_empty_list_transposes_to_an_empty_list():
    t = Tiles.from_entries(64, 64, np.zeros(4, np.int32), [])
    tt = transpose(t, 5)
    assert tt.n_visited == 0 and list(tt.ptr) == [0] * 6 and tt.entries.size == 0


def test_transposed_lists_are_cached_beside_the_forward_ones():
    a = make_mask("window", 4096, True, window=256)
    tt = tile_list_t(a, 64, 64)
    assert tt.build_s > 0
    assert tile_list_t(make_mask("window", 4096, True, window=256), 64, 64) is tt
    assert tile_list_t(a, 64, 32) is not tt
    assert tt.n_visited == tile_list(a, 64, 64).n_visited


def test_transposing_a_dense_list_costs_its_runs_not_its_entries():
    """Dense causal at T=131072: two million entries, a few thousand runs either way."""
    m = make_mask("dense", 131072, True)
    fwd = tile_list(m, 64, 64)
    tt = tile_list_t(m, 64, 64)
    assert tt.n_visited == fwd.n_visited > 2_000_000
    assert tt.run_off.size <= 2 * (131072 // 64)


def reference_transpose(t: Tiles, n_ktiles: int):
    """(ptr, run_off, run_val) the plain way: every entry expanded with its query tile, one stable
    sort by key tile (query tiles stay ascending), a run cut where the next entry of a key tile is
    not the next query tile with the same flag."""
    ent = t.entries.astype(np.int64)
    qt = np.repeat(np.arange(t.ptr.size - 1, dtype=np.int64), np.diff(t.ptr))
    order = np.argsort(ent >> 1, kind="stable")
    kt, val = ent[order] >> 1, qt[order] << 1 | ent[order] & 1
    start = np.ones(kt.size, bool)
    start[1:] = (kt[1:] != kt[:-1]) | (val[1:] != val[:-1] + 2)
    run_off = np.flatnonzero(start)
    ptr = np.zeros(n_ktiles + 1, np.int32)
    ptr[1:] = np.cumsum(np.bincount(kt, minlength=n_ktiles))
    return ptr, run_off.astype(np.int64), val[run_off]


def _llm_lists(T: int):
    """(label, forward list, key tiles) of every llm instance that builds at T, at each tile shape
    fast-tc takes for it (both D, wgmma or not), its inner pattern for a strided one."""
    for inst in LLM.instances:
        try:
            mask = inst.mask(T)
        except BadInput:  # a block that does not divide T
            continue
        inner = mask.strided()[1]
        shapes = {(c.BM, c.BN) for D in LLM.D for wgmma in (True, False) for c in [choose_config(mask, D, wgmma)]}
        for BM, BN in sorted(shapes):
            yield f"{mask.label()} {BM}x{BN}", build(inner, BM, BN), -(-inner.T // BN)


@pytest.mark.parametrize("T", [4096, 32768, 131072, 1000, 4160, 33000])
def test_every_llm_instance_transposes_byte_for_byte_as_the_plain_sort(T):
    """``transpose`` and each of its ways against ``reference_transpose``: the same arrays, dtypes
    included, for every llm instance (document and custom ones too) at the llm sizes and odd ones."""
    seen = set()
    for label, fwd, nk in _llm_lists(T):
        seen.add(label.split("(")[0].split(" ")[0])
        want = reference_transpose(fwd, nk)
        for how in (transpose, tl._transpose_band, tl._transpose_entries, tl._transpose_runs):
            tt = how(fwd, nk)
            if tt is None:
                continue
            for got, ref in zip((tt.ptr, tt.run_off, tt.run_val), want):
                assert got.dtype == ref.dtype and np.array_equal(got, ref), (label, how)
    assert {"dense", "window", "document", "custom"} <= seen


def test_the_long_llm_lists_are_bands():
    """At T=131072 every llm list longer than its entries' sort pays for (dense, windows, the
    document and the dilation levels) is a band: its transposed list costs O(tiles), not a sort."""
    long = 0
    for label, fwd, nk in _llm_lists(131072):
        if fwd.n_visited > 4 * (fwd.ptr.size - 1 + nk) + 4096 and not label.startswith("streaming"):
            assert tl._transpose_band(fwd, nk) is not None, label
            long += 1
    assert long >= 5
