"""Tile lists (attnbench.tiles): every allowed pair in a visited tile, full tiles truly full,
no tile visited without an allowed pair, runs that expand to the same entries on host and GPU."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnbench.patterns import make_mask
from attnbench.tiles import Tiles, build, heads, tile_list

from test_patterns import masks

SHAPES = [(16, 16), (64, 32), (128, 64), (64, 16), (32, 64), (48, 16)]


def _visited(tiles, nq, nk):
    vis = np.zeros((nq, nk), dtype=int)  # 0 skipped, 1 partial, 2 full
    for q in range(nq):
        for e in tiles.entries[tiles.ptr[q]:tiles.ptr[q + 1]]:
            assert vis[q, e >> 1] == 0, "a key tile listed twice"
            vis[q, e >> 1] = 1 if e & 1 else 2
    return vis


@settings(max_examples=120, deadline=None)
@given(masks(), st.sampled_from([(16, 16), (64, 32), (128, 64), (64, 16), (32, 64)]))
def test_tile_list_covers_exactly(m, tile):
    BM, BN = tile
    T = m.T
    nq, nk = -(-T // BM), -(-T // BN)
    vis = _visited(m.tiles(BM, BN), nq, nk)
    pad = np.zeros((nq * BM, nk * BN), dtype=bool)
    pad[:T, :T] = m.dense()
    blocks = pad.reshape(nq, BM, nk, BN)
    assert not (blocks.any(axis=(1, 3)) & (vis == 0)).any(), "an allowed pair lies in a skipped tile"
    for q, k in zip(*np.nonzero(vis == 2)):
        r1 = min(T, (q + 1) * BM)
        assert (k + 1) * BN <= T, "a full tile reaches past T"
        assert pad[q * BM:r1, k * BN:(k + 1) * BN].all(), "a full tile holds a masked pair"


@settings(max_examples=120, deadline=None)
@given(masks(), st.sampled_from(SHAPES))
def test_tile_list_visits_only_tiles_with_pairs(m, tile):
    """Patterns whose families are exact (all but dilated with a stride) visit a key tile only
    when one of its pairs is allowed."""
    if m.pattern.name == "dilated" and m.params["dilation"] > 1:
        return
    BM, BN = tile
    T = m.T
    nq, nk = -(-T // BM), -(-T // BN)
    vis = _visited(build(m, BM, BN), nq, nk)
    pad = np.zeros((nq * BM, nk * BN), dtype=bool)
    pad[:T, :T] = m.dense()
    has = pad.reshape(nq, BM, nk, BN).any(axis=(1, 3))
    assert not ((vis > 0) & ~has).any(), "a visited tile has no allowed pair"


@settings(max_examples=60, deadline=None)
@given(masks(), st.sampled_from(SHAPES))
def test_runs_expand_to_the_entries(m, tile):
    t = build(m, *tile)
    assert (t.run_len > 0).all() and (np.diff(t.run_off) > 0).all()
    e = t.entries
    assert e.dtype == np.int32 and e.size == t.n_visited
    assert t.n_partial == int((e & 1).sum())
    # a run never crosses a query tile: each starts and ends inside one CSR row
    q_first = np.searchsorted(t.ptr, t.run_off, side="right") - 1
    q_last = np.searchsorted(t.ptr, t.run_off + t.run_len - 1, side="right") - 1
    assert (q_first == q_last).all()
    again = Tiles.from_entries(t.BM, t.BN, t.ptr, e)
    assert (again.entries == e).all() and again.n_partial == t.n_partial


def _as_the_kernel_sees_it(m, BM, BN):
    """allowed(i, j) as a kernel computes it from the list: a pair of a visited tile holds when the
    tile is full or, on a partial tile, when the predicate of ``m.tile_predicate`` allows it."""
    T = m.T
    nq, nk = -(-T // BM), -(-T // BN)
    vis = _visited(build(m, BM, BN), nq, nk)
    per_pair = np.repeat(np.repeat(vis, BM, axis=0), BN, axis=1)[:T, :T]
    return (per_pair == 2) | ((per_pair == 1) & m.tile_predicate(BM, BN).dense())


@settings(max_examples=120, deadline=None)
@given(masks(), st.sampled_from(SHAPES + [(1, 1), (2, 4), (4, 2), (8, 8)]))
def test_partial_tiles_with_the_tile_predicate_give_the_mask(m, tile):
    assert (_as_the_kernel_sees_it(m, *tile) == m.dense()).all()


@settings(max_examples=120, deadline=None)
@given(st.sampled_from(["block_diagonal", "bigbird"]), st.booleans(),
       st.sampled_from([(1, 1), (2, 4), (4, 2), (8, 8), (4, 4), (16, 8)]), st.integers(1, 3),
       st.integers(1, 6), st.integers(0, 99))
def test_block_patterns_over_whole_blocks_need_only_the_causal_clause(name, causal, tile, k, nb, seed):
    """Blocks that the tiles divide: partial tiles take dense's predicate, and the list still
    gives back the mask pair for pair."""
    BM, BN = tile
    block = k * BM * BN // np.gcd(BM, BN)
    ps = dict(block=block)
    if name == "bigbird":
        ps.update(window_blocks=1 + seed % 4, global_blocks=seed % 2, random_blocks=min(nb, seed % 4), seed=seed)
    m = make_mask(name, block * nb, causal, **ps)
    assert m.tile_predicate(BM, BN).pattern.name == "dense"
    assert m.tile_predicate(BM, BN).causal == causal
    assert (_as_the_kernel_sees_it(m, BM, BN) == m.dense()).all()


@pytest.mark.parametrize("name,T,params,tile", [
    ("block_diagonal", 4096, dict(block=16), (64, 32)), ("bigbird", 4096, dict(block=64), (64, 128)),
    ("bigbird", 4608, dict(block=48), (32, 32)), ("window", 4096, dict(window=256), (64, 64)),
    ("streaming", 4096, {}, (64, 32)), ("dilated", 4096, {}, (64, 64)),
])
def test_tiles_that_cut_through_the_pattern_keep_its_predicate(name, T, params, tile):
    m = make_mask(name, T, True, **params)
    assert m.tile_predicate(*tile) is m


def test_tile_list_is_tight_for_sparse_patterns():
    # a 64-key window plus 16 sinks at BN=32: the diagonal band and the sink tile, nothing more
    m = make_mask("streaming", 32768, True, sink=16, window=64)
    t = m.tiles(64, 32)
    per_q = np.diff(t.ptr)
    assert per_q.max() <= 5
    assert t.n_visited < 5 * (32768 // 64)


PARAMS = {("streaming", 1000): dict(sink=16), ("bigbird", 4096): dict(block=64, random_blocks=3)}


@pytest.mark.parametrize("pattern,T", [("streaming", 1000), ("dense", 7), ("bigbird", 4096), ("window", 1)])
def test_heads_point_at_each_list(pattern, T):
    mask = make_mask(pattern, T, True, **PARAMS.get((pattern, T), {}))
    t = tile_list(mask, 64, 32)
    h = heads(t.ptr, t.entries)
    assert h.shape == (t.ptr.size - 1, 4) and h.dtype.name == "int32"
    for q in range(h.shape[0]):
        lst = list(t.entries[t.ptr[q]:t.ptr[q + 1]])
        assert (h[q, 0], h[q, 1]) == (t.ptr[q], len(lst))
        assert list(h[q, 2:]) == (lst + [0, 0])[:2]


def test_lists_are_cached_with_their_build_time():
    a = make_mask("bigbird", 4096, True)
    t = tile_list(a, 64, 64)
    assert t.build_s > 0
    assert tile_list(make_mask("bigbird", 4096, True), 64, 64) is t
    assert tile_list(a, 64, 32) is not t


def test_too_long_a_sequence_is_refused_before_any_work():
    with pytest.raises(ValueError, match="T=536870912"):
        build(make_mask("window", 2 ** 29, True), 64, 64)


@pytest.mark.gpu
@pytest.mark.parametrize("name,T,params,tile", [
    ("dense", 5000, {}, (128, 64)), ("streaming", 3001, {"sink": 16, "window": 64}, (32, 32)),
    ("bigbird", 4096, {}, (64, 64)), ("window", 1, {}, (64, 64)), ("dilated", 999, {"dilation": 3}, (64, 16)),
])
def test_device_expansion_equals_the_host(name, T, params, tile):
    import cupy

    t = build(make_mask(name, T, True, **params), *tile)
    d = t.device()
    assert t.device() is d and d.build_s > 0
    assert (cupy.asnumpy(d.ptr) == t.ptr).all()
    assert (cupy.asnumpy(d.entries) == t.entries).all()
    assert (cupy.asnumpy(d.heads) == heads(t.ptr, t.entries)).all()


@pytest.mark.parametrize("T", [1, 7, 100, 257, 1000])
@pytest.mark.parametrize("causal", [True, False])
def test_one_family_build_cuts_the_runs_of_the_sweep(T, causal):
    """The three-run build of one-family patterns (window, document, dense, ...) gives exactly the
    runs the general sweep over range ends gives."""
    from attnbench import tiles as tl
    from attnbench.patterns import REGISTERED

    checked = 0
    for pat in REGISTERED:
        for p in pat.examples(T):
            mask = make_mask(pat.name, T, causal, **p)
            for BM, BN in ((16, 16), (64, 32), (32, 64)):
                if pat.build_tiles(mask, BM, BN) is not None:
                    continue
                ranges = tl._tile_ranges(mask, BM, BN)
                if ranges[0].shape[0] != 1:
                    continue
                fast = build(mask, BM, BN)
                slow = tl._sweep(BM, BN, *ranges, 0.0)
                assert np.array_equal(fast.ptr, slow.ptr), (mask.label(), BM, BN)
                assert np.array_equal(fast.run_off, slow.run_off) and np.array_equal(fast.run_val, slow.run_val)
                checked += 1
    assert checked >= 10


def test_a_cached_list_keeps_a_warm_rebuild_time():
    t = tile_list(make_mask("window", 4096, True, window=257), 64, 64)
    assert t.build_s > 0 and t.rebuild_s > 0
    assert tile_list(make_mask("window", 4096, True, window=257), 64, 64) is t  # cached, with both


def test_drop_device_copies_forgets_every_cached_lists_device_copy():
    from attnbench import tiles as tl
    from attnbench.patterns import make_mask

    m = make_mask("streaming", 1024, True, sink=4, window=64)
    lists = [tl.tile_list(m, 64, 64), tl.tile_list_t(m, 64, 64), tl.tile_items_t(m, 64, 64, 2)]
    for t in lists:
        t._device[0] = object()  # what .device() keeps per device
    tl.drop_device_copies()
    assert all(not t._device for t in lists)


DOC_SHAPES = [(64, 64), (64, 128), (128, 64), (16, 16), (64, 32), (32, 64), (48, 16), (16, 48)]


def _interval_builds(mask, BM, BN):
    """The list of ``mask`` by the interval build: the one-family cut and the general sweep."""
    from attnbench import tiles as tl

    ks, ke, fs, fe = tl._tile_ranges(mask, BM, BN)
    return tl._one_family(BM, BN, ks[0], ke[0], fs[0], fe[0], 0.0), tl._sweep(BM, BN, ks, ke, fs, fe, 0.0)


def _same_lists(mask, shapes):
    for BM, BN in shapes:
        fast = build(mask, BM, BN)
        assert mask.pattern.tile_bounds(mask, BM, BN) is not None
        for slow in _interval_builds(mask, BM, BN):
            for name in ("ptr", "run_off", "run_val"):
                a, b = getattr(fast, name), getattr(slow, name)
                assert a.dtype == b.dtype and np.array_equal(a, b), (mask.label(), mask.causal, BM, BN, name)


_DOC_LENGTH = st.one_of(st.just(1), st.integers(1, 3), st.sampled_from([16, 32, 48, 64, 128]),
                        st.integers(1, 300))


@settings(max_examples=150, deadline=None)
@given(st.lists(_DOC_LENGTH, min_size=1, max_size=12), st.booleans(), st.sampled_from([0, 0, 1, 2, 5, 64, 100]))
def test_document_closed_form_list_is_the_interval_builds(lens, causal, window):
    """document's closed-form bounds (``tile_bounds``) give the interval build's list byte for byte:
    lengths of 1, boundaries on and off tile edges, odd T, causal or not, with a window or not."""
    mask = make_mask("document", sum(lens), causal, doc_lens=tuple(lens), window=window)
    _same_lists(mask, DOC_SHAPES)


@pytest.mark.parametrize("lens", [(1,), (1,) * 37, (64,) * 8, (63, 1, 64, 65, 1, 1, 128), (1000,),
                                  (1, 127, 129, 1, 255), (200, 1, 1, 1, 300, 7)])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", [0, 1, 3, 64, 129])
def test_document_closed_form_on_chosen_lengths(lens, causal, window):
    _same_lists(make_mask("document", sum(lens), causal, doc_lens=lens, window=window), DOC_SHAPES)


@pytest.mark.parametrize("causal", [True, False])
def test_document_closed_form_on_the_llm_instance(causal):
    """The llm configuration's instance (log-normal lengths around 2048, seed 0), with and without
    a window, at the forward's tile shapes."""
    for window in (0, 4096):
        mask = make_mask("document", 32768, causal, doc_mean=2048, doc_seed=0, window=window)
        _same_lists(mask, [(64, 64), (64, 128), (128, 64)])


def test_only_document_gives_closed_form_bounds():
    """The other patterns keep the interval build (their bounds hook answers None)."""
    from attnbench.patterns import REGISTERED

    for pat in REGISTERED:
        for p in pat.examples(256):
            mask = make_mask(pat.name, 256, True, **p)
            assert (pat.tile_bounds(mask, 64, 64) is not None) == (pat.name == "document"), pat.name


@settings(max_examples=150, deadline=None)
@given(st.lists(_DOC_LENGTH, min_size=1, max_size=12), st.booleans(), st.sampled_from([0, 1, 2, 5, 64, 100]),
       st.sampled_from(DOC_SHAPES))
def test_document_device_capacity_bounds_the_list(lens, causal, window, tile):
    """The room the device build leaves for entries (a bound from the longest document) holds the
    host's list, whatever the lengths."""
    from attnbench.document_tiles import capacity

    mask = make_mask("document", sum(lens), causal, doc_lens=tuple(lens), window=window)
    BM, BN = tile
    assert build(mask, BM, BN).n_visited <= capacity(mask.T, BM, BN, max(lens))


def test_document_lists_name_their_device_build_and_others_do_not():
    doc = build(make_mask("document", 300, True, doc_lens=(100, 200)), 64, 64)
    assert doc.on_device is not None
    assert build(make_mask("window", 300, True, window=7), 64, 64).on_device is None


def _device_doc_matches_host(mask, BM, BN):
    import cupy

    host = build(mask, BM, BN)
    d = host.device()
    assert host.device() is d and d.build_s > 0
    n = host.n_visited
    assert (cupy.asnumpy(d.ptr) == host.ptr).all(), (mask.label(), mask.causal, BM, BN)
    assert (cupy.asnumpy(d.entries[:n]) == host.entries).all(), (mask.label(), mask.causal, BM, BN)
    assert (cupy.asnumpy(d.heads) == heads(host.ptr, host.entries)).all(), (mask.label(), mask.causal, BM, BN)
    assert (cupy.asnumpy(d.table) == mask.table).all()


@pytest.mark.gpu
@pytest.mark.parametrize("lens", [(1,), (1,) * 37, (64,) * 8, (63, 1, 64, 65, 1, 1, 128), (1000,),
                                  (1, 127, 129, 1, 255), (200, 1, 1, 1, 300, 7)])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", [0, 1, 64, 129])
def test_document_device_build_equals_the_host(lens, causal, window):
    """kernels/document_tiles.cu writes the host's closed-form list (ptr, entries, heads) and the
    position table, from the boundaries alone: lengths of 1, odd T, every tile shape."""
    mask = make_mask("document", sum(lens), causal, doc_lens=lens, window=window)
    for BM, BN in DOC_SHAPES:
        _device_doc_matches_host(mask, BM, BN)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [32768, 131072, 100003])
@pytest.mark.parametrize("causal", [True, False])
def test_document_device_build_on_long_sequences(T, causal):
    """Many blocks (every query tile chunk), a drawn length distribution, a window or not."""
    for window in (0, 4096):
        mask = make_mask("document", T, causal, doc_mean=2048, doc_seed=0, window=window)
        for BM, BN in ((64, 64), (128, 64), (64, 128)):
            _device_doc_matches_host(mask, BM, BN)
    _device_doc_matches_host(make_mask("document", T, causal, doc_lens=(T,)), 64, 64)  # one document


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [True, False])
def test_document_device_build_with_more_boundaries_than_shared_memory_holds(causal):
    """Past 4095 documents the kernel searches the boundaries in global memory instead."""
    lens = (1,) * 3000 + (7, 300) * 800 + (2,) * 2000
    mask = make_mask("document", sum(lens), causal, doc_lens=lens, window=50)
    for BM, BN in ((64, 64), (128, 64), (16, 48)):
        _device_doc_matches_host(mask, BM, BN)
