"""fast-f32: compile reports, split planning, a numpy model of the split/merge arithmetic, and the
correctness gate on a device."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnbench import fast_f32 as ff
from attnbench.compile import compile_only
from attnbench.impls import Problem, get_impl
from attnbench.patterns import PATTERNS, BadInput, make_mask
from attnbench.reference import reference, rel_error

F32 = np.float32


# ---- masks at any T: block sizes that divide T ----------------------------------------------
def mask_at(pattern: str, T: int, causal: bool = True):
    """The pattern at T with its first example's parameters (block sizes that divide T)."""
    return make_mask(pattern, T, causal, **PATTERNS[pattern].examples(T)[0])


# ---- compile ----------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("D", [64, 128, 384])
def test_compiles_without_spills(arch, D):
    reports = {r.kernel: r for r in compile_only("fast_f32", ff.defines(D, make_mask("bigbird", 4096)), arch)}
    assert set(reports) == {"fast_f32_split", "fast_f32_merge"}
    for r in reports.values():
        assert r.spill_stores == 0 and r.spill_loads == 0, r
        assert 0 < r.registers <= 255, r
        assert r.smem == 0, r  # all shared memory is dynamic, sized by smem_bytes


def test_host_shared_memory_size_is_checked_by_the_kernel():
    bad = dict(ff.defines(128, make_mask("window", 256)), SMEM_BYTES=ff.smem_bytes(128) + 16)
    with pytest.raises(RuntimeError, match="shared memory size"):
        compile_only("fast_f32", bad, "sm_90")


def test_shared_memory_fits_an_h100_block_at_the_largest_head():
    assert ff.smem_bytes(ff.D_MAX) <= 227 * 1024


# ---- input refused ----------------------------------------------------------------------------
@pytest.mark.parametrize("D", [32, 96, 448, 512])
def test_head_dims_outside_the_kernel_are_refused(D):
    prob = Problem(make_mask("dense", 128), 1, 1, D, "float32")
    why = ff.IMPL.unsupported(prob)
    assert why is not None and f"D={D}" in why and str(ff.D_MAX) in why and str(ff.D_STEP) in why


def test_prepare_refuses_before_any_launch(monkeypatch):
    monkeypatch.setattr(ff.FastF32, "availability", lambda self: None)
    prob = Problem(make_mask("dense", 128), 1, 1, 96, "float32")
    with pytest.raises(BadInput, match="D=96"):
        ff.IMPL.prepare(prob, None, None, None)
    with pytest.raises(BadInput, match="splits=0"):
        ff.FastF32(name="x", family="attnbench", description="", dtypes=("float32",), splits=0).prepare(
            Problem(make_mask("dense", 128), 1, 1, 64, "float32"), None, None, None)
    with pytest.raises(BadInput, match="q of type ndarray is not a CuPy array"):
        ff.IMPL.prepare(Problem(make_mask("dense", 128), 1, 1, 64, "float32"), *_inputs(1, 1, 128, 64, 0))


@pytest.mark.parametrize("D", [64, 128, 192, 384])
def test_head_dims_that_fit_are_taken(D):
    assert ff.IMPL.unsupported(Problem(make_mask("dense", 128), 1, 1, D, "float32")) is None


def test_only_float32():
    why = ff.IMPL.unsupported(Problem(make_mask("dense", 128), 1, 1, 64, "bfloat16"))
    assert why and "bfloat16" in why


def test_registered_under_its_name():
    impl = get_impl("fast-f32")
    assert impl.dtypes == ("float32",) and impl.family == "attnbench"


# ---- split planning -----------------------------------------------------------------------------
def check_partition(ptr, splits):
    lo, hi = ff.split_ranges(ptr, splits)
    nq = len(ptr) - 1
    assert lo.shape == hi.shape == (nq, splits)
    hits = np.zeros(int(ptr[-1]), np.int64)
    for qt in range(nq):
        # consecutive, in order, covering the query tile's list exactly
        assert lo[qt, 0] == ptr[qt] and hi[qt, -1] == ptr[qt + 1]
        assert np.all(lo[qt, 1:] == hi[qt, :-1]) and np.all(hi[qt] >= lo[qt])
        sizes = hi[qt] - lo[qt]
        assert sizes.max() - sizes.min() <= 1  # balanced
        for s in range(splits):
            hits[lo[qt, s]:hi[qt, s]] += 1
    assert np.all(hits == 1)  # every visited tile in exactly one split


@settings(max_examples=200, deadline=None)
@given(counts=st.lists(st.integers(0, 300), min_size=1, max_size=80),
       bh=st.integers(1, 64), n_sm=st.integers(1, 200), per_sm=st.integers(1, 4))
def test_plan_balances_and_partitions(counts, bh, n_sm, per_sm):
    ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    s = ff.plan_splits(ptr, bh, n_sm, per_sm)
    longest, total = max(counts), sum(counts) * bh
    assert 1 <= s <= max(1, longest)
    # the longest block is at most 1/WAVES of one resident block's share (or a single tile)
    if total:
        share = math.ceil(total / (n_sm * per_sm * ff.WAVES))
        assert math.ceil(longest / s) <= max(1, share)
        # and S is no larger than that needs
        if s > 1:
            assert math.ceil(longest / (s - 1)) > share
    check_partition(ptr, s)


@pytest.mark.parametrize("splits", [1, 2, 3, 7, 64, 100])
def test_partition_of_real_tile_lists(splits):
    for name in PATTERNS:
        for T in (1, 7, 300, 4096):
            check_partition(mask_at(name, T).tiles(ff.BM, ff.BN).ptr, splits)


@pytest.mark.parametrize("T", [128, 512, 4096, 32768])
@pytest.mark.parametrize("name", ["dense", "window", "streaming", "block_diagonal", "bigbird"])
def test_plan_fills_132_sms_at_b1_h1(T, name):
    n_sm = 132
    tiles = mask_at(name, T).tiles(ff.BM, ff.BN)
    s = ff.plan_splits(tiles.ptr, 1, n_sm)
    lo, hi = ff.split_ranges(tiles.ptr, s)
    busy = int(((hi - lo) > 0).sum())
    # as many working blocks as SMs, or one per visited tile when there are fewer tiles
    assert busy >= min(n_sm, tiles.n_visited)


def test_plan_dense_causal_seed():
    tiles = make_mask("dense", 4096).tiles(ff.BM, ff.BN)
    assert ff.plan_splits(tiles.ptr, 1, 132) > 1
    # plenty of query tiles and heads: no split
    assert ff.plan_splits(tiles.ptr, 64, 132) == 1


def test_workspace_limit_caps_splits():
    assert ff.workspace_splits_limit(1, 64, 384) * 64 * ff.BM * 386 * 4 <= ff.WORKSPACE_LIMIT
    assert ff.workspace_splits_limit(10**6, 10**3, 384) == 1


# ---- numpy model of the kernels' arithmetic ----------------------------------------------------
def emulate(q, k, v, mask, splits, scale):
    """float32 model of fast_f32_split + fast_f32_merge: the same tile list, partition, masking
    (partial tiles only), online softmax with its -inf guards, and merge."""
    B, H, T, D = q.shape
    tiles = mask.tiles(ff.BM, ff.BN)
    nq = len(tiles.ptr) - 1
    lo, hi = ff.split_ranges(tiles.ptr, splits)
    pad = nq * ff.BM + ff.BN  # zero rows past T, as the kernel's zero-filled copies
    out = np.full((B, H, T, D), np.nan, F32)
    rows = np.arange(ff.BM)
    cols = np.arange(ff.BN)
    for b in range(B):
        for h in range(H):
            qp, kp, vp = (np.zeros((pad, D), F32) for _ in range(3))
            qp[:T], kp[:T], vp[:T] = q[b, h], k[b, h], v[b, h]
            for qt in range(nq):
                i = qt * ff.BM + rows
                parts = []
                for s in range(splits):
                    m = np.full(ff.BM, -np.inf, F32)
                    l = np.zeros(ff.BM, F32)
                    o = np.zeros((ff.BM, D), F32)
                    for e in tiles.entries[lo[qt, s]:hi[qt, s]]:
                        kt, partial = int(e) >> 1, bool(e & 1)
                        j = kt * ff.BN + cols
                        x = (qp[i] @ kp[j].T) * F32(scale)
                        if partial:
                            ok = (i[:, None] < T) & (j[None, :] < T)
                            ok &= mask.allowed(np.minimum(i, T - 1)[:, None], np.minimum(j, T - 1)[None, :])
                            x = np.where(ok, x, F32(-np.inf))
                        mn = np.maximum(m, x.max(axis=1))
                        none = mn == -np.inf
                        with np.errstate(invalid="ignore"):
                            alpha = np.where(none, F32(1), np.exp(m - mn))
                            p = np.where(none[:, None], F32(0), np.exp(x - mn[:, None]))
                        m = mn
                        l = l * alpha + p.sum(axis=1, dtype=F32)
                        o = o * alpha[:, None] + p @ vp[j]
                    parts.append((o, m, l))
                valid = i < T
                if splits == 1:
                    o, m, l = parts[0]
                    res = np.where(l[:, None] > 0, o / np.where(l > 0, l, 1)[:, None], 0)
                else:
                    ms = np.stack([p[1] for p in parts])  # [S, BM]
                    mx = ms.max(axis=0)
                    with np.errstate(invalid="ignore"):
                        w = np.where(ms == -np.inf, F32(0), np.exp(ms - mx))
                    den = (w * np.stack([p[2] for p in parts])).sum(axis=0)
                    acc = sum(np.where(w[s][:, None] > 0, w[s][:, None] * parts[s][0], 0)
                              for s in range(splits))
                    res = np.where(den[:, None] > 0, acc / np.where(den > 0, den, 1)[:, None], 0)
                out[b, h, i[valid]] = res[valid]
    return out


def _inputs(B, H, T, D, seed):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((B, H, T, D), dtype=F32) for _ in range(3))


EMU_CASES = [(name, T, causal) for name in PATTERNS for T in (1, 7, 130, 300) for causal in (True, False)]


@pytest.mark.parametrize("name,T,causal", EMU_CASES)
def test_split_merge_model_matches_reference(name, T, causal):
    D = 64
    mask = mask_at(name, T, causal)
    q, k, v = _inputs(1, 2, T, D, seed=T)
    scale = 1 / math.sqrt(D)
    ref = reference(q, k, v, mask, "float32", scale)
    planned = ff.plan_splits(mask.tiles(ff.BM, ff.BN).ptr, 2, 132)
    for splits in sorted({1, 2, 3, planned}):
        err = rel_error(emulate(q, k, v, mask, splits, scale), ref)
        assert err <= 1e-5, (splits, err)


def test_split_merge_model_seed_scale():
    # C = 384, a thousand rows, windowed and dense causal
    for name in ("dense", "streaming"):
        mask = mask_at(name, 1000)
        q, k, v = _inputs(1, 1, 1000, 384, seed=5)
        scale = 1 / math.sqrt(384)
        splits = ff.plan_splits(mask.tiles(ff.BM, ff.BN).ptr, 1, 132)
        assert splits > 1
        assert rel_error(emulate(q, k, v, mask, splits, scale), reference(q, k, v, mask, "float32", scale)) <= 1e-5


def test_model_notices_a_missing_tile():
    # the comparison can fail: drop one key tile from the list
    mask = make_mask("dense", 300)
    q, k, v = _inputs(1, 1, 300, 64, seed=1)
    tiles = mask.tiles(ff.BM, ff.BN)

    class Dropped:
        def __getattr__(self, a):
            return getattr(mask, a)

        def tiles(self, BM, BN):
            ptr = tiles.ptr.copy()
            ptr[-1] -= 1
            return type(tiles).from_entries(BM, BN, ptr, tiles.entries[:-1])

    ref = reference(q, k, v, mask, "float32", 0.125)
    assert rel_error(emulate(q, k, v, Dropped(), 2, 0.125), ref) > 1e-3


# ---- on a device ----------------------------------------------------------------------------------
GPU_CASES = [(name, T, B, H) for name in PATTERNS for T in (1, 7, 128, 1000, 4096) for B, H in ((1, 1), (2, 3))]


@pytest.mark.gpu
@pytest.mark.parametrize("D", [384, 64])
@pytest.mark.parametrize("name,T,B,H", GPU_CASES)
def test_gate(name, T, B, H, D):
    from attnbench.check import gate

    for causal in (True, False):
        prob = Problem(mask_at(name, T, causal), B, H, D, "float32")
        res = gate(ff.IMPL, prob)
        assert res.ok, (prob.mask.label(), causal, res)


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [1, 2, 5, 70])
@pytest.mark.parametrize("name,T", [("dense", 1000), ("streaming", 4096), ("bigbird", 4096), ("dilated", 300)])
def test_gate_fixed_splits(name, T, splits):
    # one split (direct write), a few, and more splits than any list has tiles (empty splits)
    from attnbench.check import gate

    impl = ff.FastF32(name="fast-f32", family="attnbench", description="", dtypes=("float32",), splits=splits)
    prob = Problem(mask_at(name, T), 1, 2, 128, "float32")
    res = gate(impl, prob)
    assert res.ok, (splits, res)


@pytest.mark.gpu
def test_runner_setup_and_repeat():
    from attnbench.arrays import random_inputs

    prob = Problem(make_mask("dense", 4096), 1, 1, 384, "float32")
    q, k, v = random_inputs(prob.shape, "float32", 3)
    runner = ff.IMPL.prepare(prob, q, k, v)
    assert {"tiles_build_s", "compile_s"} <= set(runner.setup)
    assert runner.splits > 1
    runner.run()
    first = runner.out.copy()
    runner.poison()
    runner.run()
    assert bool((runner.out == first).all())  # deterministic, fully rewritten
