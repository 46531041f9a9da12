"""The backward's work items (attnbench.tiles.work_items, tile_items_t; the rule of L in
attnbench.bwd_config.split_length): every (key tile, query tile) entry of the transposed list in
exactly one item, items of a key tile contiguous and at most L long, split flags and slots right,
longest first; on every llm instance and the document, prefix_lm and custom examples at T=4096 and
131072, and the cut under a millisecond at T=131072 (CPU)."""
import time

import numpy as np
import pytest

from attnbench import tiles as tl
from attnbench.configs import LLM
from attnbench.errors import BadInput
from attnbench.bwd_config import BWD_SHAPES, SPLIT_ENV, SPLIT_MIN, SPLIT_WAVES, bwd_config, forced_split, split_length
from attnbench.patterns import PATTERNS, make_mask
from attnbench.tiles import WorkItems, tile_items_t, tile_list_t, work_items

SMS = 132  # an H100 SXM's multiprocessors (an H200's too)


def _masks(T: int):
    """(label, inner mask) of every llm instance and of the document, prefix_lm and custom examples
    that build at T (both causal flags); strided patterns as the backward runs them, their inner
    pattern on a residue class."""
    out = [(f"{i.pattern}{i.param_dict}", i.mask(T)) for i in LLM.instances]
    for name in ("document", "prefix_lm", "custom"):
        for causal in (True, False):
            for ps in PATTERNS[name].examples(T):
                try:
                    out.append((f"{name}{ps}-{causal}", make_mask(name, T, causal, **ps)))
                except BadInput:  # a custom expression the host cannot classify at this T
                    continue
    return [(label, m.strided()[1]) for label, m in out]


def brute_items(tt, L: int) -> list[tuple[int, list[int]]]:
    """(key tile, entries) of each item, one key tile at a time in plain Python: its list cut into
    k = max(1, ceil(n / L)) stretches, the first n % k one longer; then ordered by the key tile's
    stretch length ceil(n / k), longest first, key tiles ascending."""
    ent = tt.entries
    per_tile = []
    for kt in range(tt.n_ktiles):
        row = list(ent[tt.ptr[kt]:tt.ptr[kt + 1]])
        n = len(row)
        k = max(1, -(-n // L))
        q, r = divmod(n, k)
        cuts, at = [], 0
        for j in range(k):
            size = q + (j < r)
            cuts.append(row[at:at + size])
            at += size
        per_tile.append((-(-n // k), kt, cuts))
    per_tile.sort(key=lambda x: (-x[0], x[1]))
    return [(kt, c) for _, kt, cuts in per_tile for c in cuts]


def assert_items(tt, it: WorkItems, L: int, brute: bool):
    """``it`` against the rules (vectorised, any size) and, when ``brute``, against brute_items."""
    nk = tt.n_ktiles
    start, size, e0, e1 = (it.heads[:, i].astype(np.int64) for i in range(4))
    kt, slot = it.tiles[:, 0].astype(np.int64), it.tiles[:, 1].astype(np.int64)
    count = np.diff(tt.ptr.astype(np.int64))
    assert it.L == L and it.heads.dtype == np.int32 and it.tiles.dtype == np.int32
    assert it.n_items == int(np.maximum(1, -(-count // L)).sum())
    assert (size >= 0).all() and (size <= L).all()
    # every entry in exactly one item, an item inside its key tile's row of the list
    assert (start >= tt.ptr[kt]).all() and (start + size <= tt.ptr[kt + 1]).all()
    order = np.argsort(start, kind="stable")
    s, z = start[order], size[order]
    nz = z > 0
    assert s[nz][0] == 0 if nz.any() else tt.n_visited == 0
    assert (s[nz][1:] == (s + z)[nz][:-1]).all() and int(z.sum()) == tt.n_visited
    # every key tile has items (an empty list one empty item), one after another
    first = np.flatnonzero(np.append(True, kt[1:] != kt[:-1]))
    assert np.array_equal(np.sort(kt[first]), np.arange(nk))  # each key tile's items in one block
    n_of = np.bincount(kt, minlength=nk)
    assert (n_of == np.maximum(1, -(-count // L))).all()
    # within a key tile: balanced stretches in order, the longer ones first
    assert (np.abs(size - count[kt] // n_of[kt] - (size > count[kt] // n_of[kt])) == 0).all()
    # split flags and slots: slot >= 0 iff the key tile has more than one item; slots in key-tile order
    split = n_of > 1
    assert np.array_equal(slot >= 0, split[kt])
    assert np.array_equal(it.split_kt, np.flatnonzero(split)) and it.n_split == int(split.sum())
    assert (it.split_kt[slot[slot >= 0]] == kt[slot >= 0]).all()
    # longest first: the key tiles' stretch lengths never grow; no item after another is more than
    # one query tile longer
    per = -(-count // n_of)
    assert (np.diff(per[kt]) <= 0).all()
    if size.size:
        assert (size + 1 >= np.maximum.accumulate(size[::-1])[::-1]).all()
    # the heads carry the first two entries (0 past the stretch)
    ent = np.append(tt.entries, [0, 0]).astype(np.int64)
    assert np.array_equal(e0, np.where(size > 0, ent[start], 0))
    assert np.array_equal(e1, np.where(size > 1, ent[start + 1], 0))
    if brute:
        got = [(int(k), list(tt.entries[a:a + n])) for k, a, n in zip(kt, start, size)]
        assert got == brute_items(tt, L)


@pytest.mark.parametrize("T", [4096, 131072])
def test_items_cover_every_entry_once_longest_first(T):
    n = 0
    for label, m in _masks(T):
        tt = tile_list_t(m, 64, 64)
        longest = int(np.diff(tt.ptr).max(initial=0))
        Ls = {split_length(tt.n_visited, longest, 16, SMS * bwd_config(D).MINB) for D in BWD_SHAPES}
        Ls |= {1, 3, 8, 24} if T == 4096 else {24}
        for L in sorted(Ls):
            assert_items(tt, work_items(tt, L), L, brute=T == 4096)
        n += 1
    assert n >= len(LLM.instances) + 6


@pytest.mark.parametrize("T", [1, 7, 100, 1000])
@pytest.mark.parametrize("tile", [(64, 64), (16, 16)])
def test_items_of_small_and_odd_lists(T, tile):
    """Tiny and odd lists, empty key tiles (a window's keys past every row), L from 1 up."""
    for name, causal, ps in (("dense", True, {}), ("dense", False, {}), ("window", False, dict(window=3)),
                             ("streaming", True, dict(sink=4, window=16)), ("bigbird", True, dict(block=16)),
                             ("dilated", False, dict(window=8, dilation=3))):
        try:
            m = make_mask(name, T, causal, **ps).strided()[1]
        except BadInput:
            continue
        tt = tile_list_t(m, *tile)
        for L in (1, 2, 5, 1000):
            assert_items(tt, work_items(tt, L), L, brute=True)


@pytest.mark.parametrize("T", [4096, 131072])
def test_items_by_position_are_the_same_items_in_the_order_of_their_stretch(T):
    """order=1: the same items (entries, key tile, slot) as order 0, launched by the query tile of
    their second entry (first where alone), longer first among equals; a causal band's key tile t
    just after a split tile's item whose stretch reaches t."""
    n_split = 0
    for label, m in _masks(T):
        tt = tile_list_t(m, 64, 64)
        for L in (4, 24):
            a, b = work_items(tt, L), work_items(tt, L, order=1)
            assert a.n_split == b.n_split and np.array_equal(a.split_kt, b.split_kt)
            rows = lambda it: sorted(map(tuple, np.concatenate([it.heads, it.tiles], axis=1).tolist()))
            assert rows(a) == rows(b), label
            size = b.heads[:, 1]
            pos = np.where(size > 1, b.heads[:, 3], b.heads[:, 2]) >> 1
            key = np.stack([pos, -size], axis=1)
            assert (np.diff(pos) >= 0).all() and all(tuple(x) <= tuple(y) for x, y in zip(key[:-1], key[1:])), label
            n_split += b.n_split > 0
    assert n_split >= 3  # streaming's sink tiles, bigbird's global columns and the custom twin are cut
    with pytest.raises(ValueError, match="order=2"):
        work_items(tile_list_t(make_mask("dense", 256, True).strided()[1], 64, 64), 4, order=2)


def test_items_by_position_put_a_split_sink_item_beside_the_band_it_shares_tiles_with():
    m = make_mask("streaming", 4096, True, sink=16, window=64).strided()[1]
    tt = tile_list_t(m, 64, 64)
    it = work_items(tt, 4, order=1)
    kt, size = it.tiles[:, 0], it.heads[:, 1]
    first = it.heads[:, 2] >> 1
    sink = np.flatnonzero((kt == 0) & (it.tiles[:, 1] >= 0))
    assert sink.size == -(-(4096 // 64) // 4) and (size[sink] <= 4).all()  # key tile 0's 64 query tiles, 4 an item
    for i in sink[1:]:  # the band's key tiles just before and after reach the sink item's stretch
        assert abs(int(kt[i - 1]) - int(first[i])) <= 4 and abs(int(kt[i + 1]) - int(first[i])) <= 4


@pytest.mark.parametrize("T", [4096, 131072])
def test_a_cut_shortens_the_split_tiles_items_only(T):
    """cut: the key tiles L splits are cut into items of at most ``cut`` entries, balanced as L's; the
    others stay whole, so every entry is still in exactly one item."""
    for label, m in _masks(T):
        tt = tile_list_t(m, 64, 64)
        count = np.diff(tt.ptr)
        L = 24
        a, b = work_items(tt, L), work_items(tt, L, cut=4)
        split = set(a.split_kt.tolist())
        assert set(b.split_kt.tolist()) == split, label
        for kt in range(tt.n_ktiles):
            items = b.heads[b.tiles[:, 0] == kt]
            assert items[:, 1].sum() == count[kt], label
            if kt in split:
                assert items[:, 1].max() <= 4 and items.shape[0] == max(-(-count[kt] // L), -(-count[kt] // 4))
                assert items[:, 1].max() - items[:, 1].min() <= 1
            else:
                assert items.shape[0] == 1, label


def test_an_empty_transposed_list_gives_one_empty_item_per_key_tile():
    tt = tl.transpose(tl.Tiles.from_entries(64, 64, np.zeros(3, np.int32), []), 4)
    it = work_items(tt, 5)
    assert it.n_items == 4 and it.n_split == 0 and not it.heads[:, 1:].any()
    assert sorted(it.tiles[:, 0]) == [0, 1, 2, 3] and (it.tiles[:, 1] == -1).all()
    with pytest.raises(ValueError, match="at least one entry"):
        work_items(tt, 0)


def test_items_are_cached_beside_the_transposed_list():
    m = make_mask("streaming", 4096, True, sink=16, window=64)
    a = tile_items_t(m, 64, 64, 8)
    assert tile_items_t(make_mask("streaming", 4096, True, sink=16, window=64), 64, 64, 8) is a
    assert tile_items_t(m, 64, 64, 9) is not a and a.build_s > 0
    assert a.n_split == 1 and a.split_kt.tolist() == [0]  # the sink tile, visited by all 64 query tiles
    assert a.heads[0, 1] == 8 and a.tiles[0].tolist() == [0, 0]


def test_the_split_rule():
    """L = max(SPLIT_MIN, ceil(entries / ceil(waves * slots / heads))), at most the longest list; waves
    SPLIT_WAVES unless given."""
    assert (SPLIT_WAVES, SPLIT_MIN) == (1, 8)
    # T=32768, B*H=16, 64 x 64 tiles, 132 SMs: D=64 (2 blocks an SM) and D=128 (1)
    assert split_length(131328, 512, 16, 264) == 512  # dense causal: 7725 > 512, nothing to cut
    assert split_length(1533, 512, 16, 264) == 91     # streaming 16+64: key tile 0 in 6 items
    assert split_length(1533, 512, 16, 132) == 171
    assert split_length(2298, 512, 16, 264) == 136    # bigbird
    assert split_length(100, 512, 16, 264) == SPLIT_MIN
    assert split_length(10 ** 6, 512, 10 ** 6, 264) == 512  # many heads: no cut
    assert split_length(0, 0, 16, 264) == 1
    # four waves (the rule before docs/PERF.md "backward v12"): shorter items, more of them
    assert split_length(131328, 512, 16, 264, waves=4) == 512
    assert split_length(1533, 512, 16, 264, waves=4) == 24
    assert split_length(1533, 512, 16, 132, waves=4) == 47
    assert split_length(2298, 512, 16, 264, waves=4) == 35
    m = make_mask("streaming", 32768, True, sink=16, window=64)
    tt = tile_list_t(m, 64, 64)
    it = work_items(tt, split_length(tt.n_visited, 512, 16, 264))
    assert it.n_split == 1 and it.n_items == 512 + 6 - 1 and it.heads[:6, 1].tolist() == [86] * 2 + [85] * 4
    it = work_items(tt, split_length(tt.n_visited, 512, 16, 264, waves=4))
    assert it.n_split == 1 and it.n_items == 512 + 22 - 1 and it.heads[:22, 1].tolist() == [24] * 6 + [23] * 16


def test_the_forced_split_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(SPLIT_ENV, raising=False)
    assert forced_split() is None
    monkeypatch.setenv(SPLIT_ENV, "3")
    assert forced_split() == 3
    monkeypatch.setenv(SPLIT_ENV, "0")
    assert forced_split() == 0
    monkeypatch.setenv(SPLIT_ENV, "x")
    with pytest.raises(BadInput, match=SPLIT_ENV):
        forced_split()


def test_items_build_under_a_millisecond_at_131072():
    """The cut at the rule's L (B=1, H=16, 132 SMs) for every llm instance, best of 5 (loose: 2 ms;
    docs/PERF.md reports the times)."""
    slow = {}
    for inst in LLM.instances:
        m = inst.mask(131072).strided()[1]
        tt = tile_list_t(m, 64, 64)
        longest = int(np.diff(tt.ptr).max(initial=0))
        for D in BWD_SHAPES:
            L = split_length(tt.n_visited, longest, 16 * inst.mask(131072).strided()[0], SMS * bwd_config(D).MINB)
            best = float("inf")
            for _ in range(5):
                t0 = time.perf_counter()
                work_items(tt, L)
                best = min(best, time.perf_counter() - t0)
            if best > 2e-3:
                slow[f"{inst.pattern}{inst.param_dict} D={D}"] = best
    assert not slow, slow
