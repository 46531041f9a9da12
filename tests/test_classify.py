"""Tile lists and row counts by classification (attnbench/classify.py, kernels/classify.cu): the
counts of every tile against the dense mask, the lists against the interval build, the device
against the host."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnbench import classify as cl
from attnbench.compile import compile_only
from attnbench.errors import BadInput
from attnbench.patterns import PATTERNS, make_mask
from attnbench.tiles import build

from test_patterns import masks
from test_tiles import SHAPES, _visited

GRIDS = SHAPES + [(1, 1), (2, 4), (8, 8)]


def flags(tiles, T):
    """0 skipped, 1 partial, 2 full per (query tile, key tile)."""
    return _visited(tiles, -(-T // tiles.BM), -(-T // tiles.BN))


def truth(m, BM, BN):
    """What classification must give, from the dense mask: 0 no pair, 1 some, 2 every pair of a
    tile that ends at or before T."""
    T = m.T
    nq, nk = -(-T // BM), -(-T // BN)
    pad = np.zeros((nq * BM, nk * BN), bool)
    pad[:T, :T] = m.dense()
    valid = np.zeros_like(pad)
    valid[:T, :T] = True
    b, v = pad.reshape(nq, BM, nk, BN), valid.reshape(nq, BM, nk, BN)
    full = (b == v).all(axis=(1, 3)) & ((np.arange(nk) + 1) * BN <= T)[None, :]
    return np.where(b.any(axis=(1, 3)), np.where(full, 2, 1), 0)


def boxes_of(m):
    return m.pattern.bound(m.T, m.params).boxes if m.pattern.name == "custom" else None


@settings(max_examples=150, deadline=None)
@given(masks(), st.sampled_from(GRIDS))
def test_host_classification_counts_every_pair(m, tile):
    got = cl.host(m, *tile, boxes_of(m))
    assert (flags(got.tiles, m.T) == truth(m, *tile)).all()
    assert (got.row_counts == m.dense().sum(axis=1)).all()
    assert got.where == "host" and got.tiles.build_s > 0


@settings(max_examples=150, deadline=None)
@given(masks(), st.sampled_from(GRIDS))
def test_classification_refines_the_interval_build(m, tile):
    """The classified list holds exactly the interval list's tiles that have a pair; a tile the
    interval build calls full is full here too (the interval build may call a full tile partial)."""
    if m.pattern.name == "custom":
        return
    ours, theirs = flags(cl.host(m, *tile).tiles, m.T), flags(build(m, *tile), m.T)
    has = truth(m, *tile) > 0
    assert ((ours > 0) == (theirs > 0) & has).all()
    assert not ((theirs == 2) & (ours != 2)).any()


@settings(max_examples=60, deadline=None)
@given(masks(), st.sampled_from(GRIDS))
def test_runs_of_a_classified_list(m, tile):
    t = cl.host(m, *tile, boxes_of(m)).tiles
    assert (t.run_len > 0).all() and (np.diff(t.run_off) > 0).all() and t.entries.size == t.n_visited
    q_first = np.searchsorted(t.ptr, t.run_off, side="right") - 1
    q_last = np.searchsorted(t.ptr, t.run_off + t.run_len - 1, side="right") - 1
    assert (q_first == q_last).all()
    # runs as long as they can be: a run never continues where the previous one ended
    ends = t.run_val + 2 * (t.run_len - 1)
    same_q = q_first[1:] == q_first[:-1]
    assert not (same_q & (t.run_val[1:] == ends[:-1] + 2)).any()


def test_intervals_spare_the_host_most_pairs(monkeypatch):
    """At T = 131072 a 64-key window leaves a few tiles per query tile to evaluate pair by pair."""
    m = make_mask("custom", 131072, True, expr="i - j < 64")
    evaluated = []
    real = m.pattern.bound(m.T, m.params).allowed
    monkeypatch.setattr(type(m.pattern), "allowed", lambda self, i, j, *a: evaluated.append(i.size) or real(i, j))
    got = cl.host(m, 64, 64, m.pattern.bound(m.T, m.params).boxes)
    assert (got.row_counts == np.minimum(np.arange(m.T) + 1, 64)).all()
    assert sum(evaluated) <= 2 * (m.T // 64) * 64  # the diagonal tile and the one before, rows only
    assert got.tiles.n_visited == 2 * (m.T // 64) - 1


def test_the_host_refuses_more_pairs_than_its_limit(monkeypatch):
    from attnbench.patterns import Mask

    monkeypatch.setattr(cl, "HOST_PAIRS", 1 << 20)
    small = make_mask("custom", 256, True, expr="(i - j) % 2 == 0")
    m = Mask(small.pattern, 4096, True, small.params)  # every tile below the diagonal undecided
    with pytest.raises(BadInput) as e:
        cl.host(m, 64, 64, boxes_of(m))
    assert "T=4096" in str(e.value) and f"limit of {1 << 20}" in str(e.value)


def test_the_device_is_taken_above_host_T_where_there_is_one(monkeypatch):
    from attnbench import impls

    monkeypatch.setattr(impls, "device_problem", lambda: None)
    assert cl.where(cl.HOST_T) == "host" and cl.where(cl.HOST_T + 1) == "device"
    monkeypatch.setattr(impls, "device_problem", lambda: "no CUDA device (test)")
    assert cl.where(1 << 20) == "host"


def test_classifications_are_kept_with_their_seconds():
    m = make_mask("custom", 300, False, expr="abs(i - j) < 5")
    a = cl.classify(m, 32, 32, boxes_of(m))
    assert cl.classify(m, 32, 32, boxes_of(m)) is a
    assert cl.classify(m, 32, 32, boxes_of(m), fresh=True) is not a
    assert m.tiles(32, 32).build_s > 0


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name", ["custom", "streaming", "document"])
def test_the_classification_kernel_compiles_for_any_pattern(arch, name):
    m = make_mask(name, 4096, True, **PATTERNS[name].examples(4096)[1])
    (r,) = compile_only("classify", m.device_defines(runtime=True), arch)
    assert r.kernel == "classify_tiles" and r.spill_stores == 0 and r.stack == 0


# ---- on a device ------------------------------------------------------------------------------------
DEVICE_CASES = [(name, T, n, causal, tile) for name in ("custom", "streaming", "bigbird", "document", "dilated")
                for T, tile in ((1, (64, 64)), (77, (16, 16)), (1000, (64, 32)), (4099, (128, 64)), (3000, (48, 16)))
                for n in range(len(PATTERNS[name].examples(T))) for causal in (True, False)
                if not (name == "bigbird" and T % 64)]


@pytest.mark.gpu
@pytest.mark.parametrize("name,T,n,causal,tile", DEVICE_CASES)
def test_device_classification_equals_the_host(name, T, n, causal, tile):
    m = make_mask(name, T, causal, **PATTERNS[name].examples(T)[n])
    d, h = cl.device(m, *tile), cl.host(m, *tile, boxes_of(m))
    assert d.where == "device" and d.tiles.build_s > 0
    assert (d.tiles.ptr == h.tiles.ptr).all() and (d.tiles.entries == h.tiles.entries).all()
    assert (d.row_counts == h.row_counts).all()


@pytest.mark.gpu
@pytest.mark.parametrize("expr,causal", [("(i - j < 1024) | (j < 4) | (j % 512 == 0)", True),
                                         ("i // 128 == j // 128", False)])
def test_device_classification_at_131072_takes_under_50_ms(expr, causal):
    m = make_mask("custom", 131072, causal, expr=expr)
    cl.device(m, 64, 64)  # compiled, warm
    best = min(cl.device(m, 64, 64).tiles.build_s for _ in range(3))
    assert best < 0.050, f"{best * 1e3:.1f} ms"
