"""fast-tc's backward (kernels/fast_tc_bwd.cu, attnbench/fast_tc_bwd.py): compiles for sm_80 / sm_90
without spills and refuses bad input before any launch (CPU); on the GPU, dQ, dK and dV against the
float64 reference for every llm pattern and more, the forward's log-sum-exp, fwd+bwd, and training
through attnbench.attention against SDPA.

The lists are cut into work items (attnbench.tiles.work_items): at these T and B*H the rule's L is
SPLIT_MIN (8), so the cases with lists longer than 8 query tiles (dense, prefix_lm, document, wide
windows at T=1000) run split key tiles already; test_gradients_match_the_reference_with_split_lists
forces L (1, 2, 3, and 0: nothing split) through $ATTNBENCH_BWD_SPLIT, each with dQ summed by float32
reductions and by its own pass over the forward list ($ATTNBENCH_BWD_DQ=pass), as does the fwd+bwd test.

GPU: python3 -m pytest -q -m gpu tests/test_fast_tc_bwd.py (about 2 minutes on an H100, most of it
compiling)."""
import itertools

import numpy as np
import pytest

from attnbench.bwd_config import (BWD_SHAPES, BWD_SHAPES_WG, BWD_SHAPES_WG2, TWO_WG_MIN_KEYS, bwd_config,
                                  bwd_defines, choose_bwd_config)
from attnbench.compile import compile_only, source
from attnbench.configs import LLM
from attnbench.fwd_config import choose_config, kernel_defines
from attnbench.fast_tc import IMPL, SYNC_IMPL
from attnbench.fast_tc_bwd import standard_builds
from attnbench.impls import Problem, get_impl
from attnbench.patterns import PATTERNS, BadInput, make_mask

DTYPES = ("bfloat16", "float16")
DIMS = (64, 128)
BWD_KERNELS = ["fast_tc_bwd", "fast_tc_bwd_dq", "fast_tc_bwd_prep"]


# ---- CPU: NVRTC ----------------------------------------------------------------------------------
# (pattern, T, causal, params) of the compile tests: every kind of predicate and list
COMPILE_CASES = [
    ("dense", 4096, True, {}), ("streaming", 4096, True, dict(sink=16, window=64)),
    ("dilated", 4096, True, dict(window=512, dilation=2)), ("bigbird", 4096, True, {}),
    ("document", 4096, False, {}), ("custom", 4096, True, {}), ("window", 1000, False, dict(window=100)),
    ("prefix_lm", 4096, False, dict(prefix=1000)),
]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("D", DIMS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pattern,T,causal,params", COMPILE_CASES)
def test_backward_compiles_without_spills(arch, D, dtype, pattern, T, causal, params):
    """The three kernels, the work items' split path (float32 dK / dV sums, their conversion) included."""
    mask = make_mask(pattern, T, causal, **params)
    reports = compile_only("fast_tc_bwd", bwd_defines(D, dtype, mask), arch)
    assert sorted(r.kernel for r in reports) == BWD_KERNELS
    for r in reports:
        assert r.arch == arch and 0 < r.registers <= 255
        assert (r.spill_stores, r.spill_loads, r.stack) == (0, 0, 0), r


@pytest.mark.parametrize("D", DIMS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pattern,T,causal,params", COMPILE_CASES)
@pytest.mark.parametrize("other", [False, True], ids=["chosen", "other-warpgroups"])
def test_the_wgmma_backward_compiles_for_sm_90a_without_spills(D, dtype, pattern, T, causal, params, other):
    """kernels/fast_tc_bwd_wg.cu: the same three kernels, the main one on wgmma; sm_90a only; the
    shape for dense (two warpgroups on 128-key tiles) and one warpgroup (a pattern with few keys a
    query; $ATTNBENCH_BWD_SHAPE=NWARPS=4,MINB=2)."""
    import dataclasses

    from attnbench.compile import target_arch, unbuildable

    mask = make_mask(pattern, T, causal, **params)
    cfg = bwd_config(D, wgmma=True)
    assert (cfg.NWARPS, cfg.MINB) == (8, 1)
    if other:
        cfg = dataclasses.replace(cfg, NWARPS=4, MINB=2)
    d = bwd_defines(D, dtype, mask, cfg)
    assert cfg.kernel == "fast_tc_bwd_wg" and cfg.arch == "sm_90a" and d["WG"] == 1
    assert target_arch(d, "sm_80") is None and target_arch(d, "sm_90") == "sm_90a"
    assert unbuildable("fast_tc_bwd_wg", "sm_80") and not unbuildable("fast_tc_bwd_wg", "sm_90a")
    reports = compile_only("fast_tc_bwd_wg", d, "sm_90a")
    assert sorted(r.kernel for r in reports) == BWD_KERNELS
    for r in reports:
        assert r.arch == "sm_90a" and 0 < r.registers <= 255
        assert (r.spill_stores, r.spill_loads, r.stack) == (0, 0, 0), r


def test_fast_tc_takes_the_wgmma_backward_on_sm_90_and_mma_sync_otherwise():
    """The main kernel's shape follows the products (wgmma: fast-tc on sm_90) whatever the dQ way; dQ's
    own pass runs on mma.sync's shape for D beside the mma.sync loop, and beside the wgmma loop on wgmma's
    (PASS_WG) or with PWG=0 mma.sync's (dq_pass_config)."""
    import dataclasses

    from attnbench.bwd_config import PASS_SHAPES_WG, PASS_TMA, PASS_WG, dq_pass_config

    for D in DIMS:
        assert choose_bwd_config(D, True).WG == 1 and choose_bwd_config(D, True) == BWD_SHAPES_WG2[D][0]
        assert choose_bwd_config(D, False) == BWD_SHAPES[D][0] and not BWD_SHAPES[D][0].WG
        # dQ's own pass leaves the main loop nothing of dQ's for two warpgroups to halve: one, whatever the keys
        assert choose_bwd_config(D, True, "pass") == BWD_SHAPES_WG[D][0]
        assert choose_bwd_config(D, True, "pass", keys_per_query=256) == BWD_SHAPES_WG[D][0]
        assert choose_bwd_config(D, True, "atomic", keys_per_query=TWO_WG_MIN_KEYS[D]) == BWD_SHAPES_WG2[D][0]
        assert dq_pass_config(D, choose_bwd_config(D, False, "pass")) == BWD_SHAPES[D][0]
        # beside the wgmma main loop: the wgmma pass, its tiles by bulk copies (PASS_TMA) on unstrided patterns
        pwg = dataclasses.replace(PASS_SHAPES_WG[D][0], TMA=PASS_TMA)
        assert dq_pass_config(D, choose_bwd_config(D, True, "pass")) == (pwg if PASS_WG else BWD_SHAPES[D][0])
        assert dq_pass_config(D, choose_bwd_config(D, True, "pass"), wg=0) == BWD_SHAPES[D][0]
        assert dq_pass_config(D, choose_bwd_config(D, True, "pass"), wg=1) == pwg
        assert dq_pass_config(D, choose_bwd_config(D, True, "pass"), wg=1, tma=0) == PASS_SHAPES_WG[D][0]
        assert dq_pass_config(D, choose_bwd_config(D, True, "pass"), wg=1, tma=1, stride=3) == PASS_SHAPES_WG[D][0]
        # persistent: by cp.async whatever the pattern; beside the mma.sync loop (or PWG=0) nothing persistent
        assert dq_pass_config(D, choose_bwd_config(D, True, "pass"), wg=1, persist=1) == dataclasses.replace(
            PASS_SHAPES_WG[D][0], PERSIST=1)
        assert dq_pass_config(D, choose_bwd_config(D, True, "pass"), wg=0, persist=1) == BWD_SHAPES[D][0]
        assert dq_pass_config(D, choose_bwd_config(D, True, "pass"), 4, wg=1).MINB == 4
        assert choose_bwd_config(D, True).BM == 64  # every warpgroup's query tile
        assert choose_bwd_config(D, False).BN == 64
        assert choose_bwd_config(D, True).BN == 128  # two warpgroups, 64 keys each
        assert choose_bwd_config(D, True, keys_per_query=80) == BWD_SHAPES_WG[D][0]  # one: mma.sync's 64 x 64 lists
        assert choose_bwd_config(D, True, keys_per_query=80).BN == 64
    mask = make_mask("dense", 1000, True)
    d = bwd_defines(64, "bfloat16", mask, bwd_config(64, True), dq="pass")
    assert d["WG"] == 1 and d["BWD_DQ_PASS"] == 1
    assert "WG" not in bwd_defines(64, "bfloat16", mask)


def test_the_wgmma_backwards_smem_fits_its_blocks_per_sm():
    """K, V, two Q and dO stages, the staged dS^T and the (lse2, delta) rows, as the kernel lays them
    out (BWG_SMEM_BYTES), MINB times within an sm_90 multiprocessor's 228 KiB (two blocks of one warpgroup)."""
    for D, kpq in itertools.product(DIMS, (None, 1)):
        cfg = bwd_config(D, True, kpq)
        kv, q = 2 * D * cfg.BN, 2 * D * cfg.BM
        bufs = 2 if (D, cfg.NWARPS) == (64, 8) else 1  # two warpgroups at D=64 stage two tiles' dS^T for dQ
        assert cfg.paired(D) == (bufs == 2) and not cfg.paired(D, "pass")
        assert cfg.smem_bytes(D) == 2 * kv + 2 * cfg.STAGES * q + bufs * 2 * cfg.BM * cfg.BN + cfg.STAGES * cfg.BM * 8
        assert cfg.smem_bytes(D, "pass") == cfg.smem_bytes(D) - (bufs - 1) * 2 * cfg.BM * cfg.BN
        assert cfg.MINB * (cfg.smem_bytes(D) + 1024) <= 228 * 1024


def test_pairs_0_and_2_build_their_own_and_name_themselves():
    """PAIRS=0 (two warpgroups at D=64 both computing one tile's dQ panel) and 2 (pairs, their dQ products
    in flight a tile longer) are defines of their own and fields of the shape's name; the default
    (pairs) adds no define."""
    from attnbench.bwd_config import parse_bwd_config

    mask = make_mask("dense", 1000, True)
    cfg = choose_bwd_config(64, True, fields=parse_bwd_config("PAIRS=0").shape)
    assert cfg.spec == "NWARPS=8,BN=128,STAGES=2,MINB=1,WG=1,PAIRS=0" and not cfg.paired(64)
    assert bwd_defines(64, "bfloat16", mask, cfg)["BWD_DQ_PAIRS"] == 0
    assert "BWD_DQ_PAIRS" not in bwd_defines(64, "bfloat16", mask, bwd_config(64, True))
    assert cfg.smem_bytes(64) == bwd_config(64, True).smem_bytes(64) - 2 * 64 * 128
    pipe = choose_bwd_config(64, True, fields=parse_bwd_config("PAIRS=2").shape)  # two sets of the pair's dS^T
    assert pipe.spec.endswith(",PAIRS=2") and pipe.paired(64)
    assert bwd_defines(64, "bfloat16", mask, pipe)["BWD_DQ_PAIRS"] == 2
    assert pipe.smem_bytes(64) == bwd_config(64, True).smem_bytes(64) + 2 * 2 * 64 * 128


def test_the_backwards_shape_fields_come_from_the_environment(monkeypatch):
    """$ATTNBENCH_BWD_SHAPE replaces fields of the chosen shape (timing one against another); a bad
    entry is refused naming it, before anything is built."""
    from attnbench.bwd_config import SHAPE_ENV

    monkeypatch.setenv(SHAPE_ENV, "NWARPS=8,MINB=1")
    cfg = choose_bwd_config(128, True, keys_per_query=1)
    assert (cfg.NWARPS, cfg.MINB, cfg.BN, cfg.BM, cfg.WG, cfg.STAGES) == (8, 1, 128, 64, 1, BWD_SHAPES_WG[128][0].STAGES)
    assert cfg.threads == 256 and cfg.spec == "NWARPS=8,BN=128,STAGES=2,MINB=1,WG=1"
    assert choose_bwd_config(64, True, keys_per_query=1).spec == "NWARPS=8,BN=128,STAGES=2,MINB=1,WG=1"
    monkeypatch.setenv(SHAPE_ENV, "NWARPS=8,MINB=1,PAIRS=2")
    assert choose_bwd_config(64, True).spec == "NWARPS=8,BN=128,STAGES=2,MINB=1,WG=1,PAIRS=2"
    for bad in ("NWARPS=0", "BN=64", "NWARPS", "MINB=two", "NWARPS=12", "NWARPS=6", "PAIRS=3"):
        monkeypatch.setenv(SHAPE_ENV, bad)
        with pytest.raises(BadInput, match=SHAPE_ENV):
            choose_bwd_config(64, True)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("D", DIMS)
@pytest.mark.parametrize("pattern,T,causal,params", [
    ("dense", 4096, True, {}), ("streaming", 4096, True, dict(sink=16, window=64)),
    ("dilated", 4096, True, dict(window=512, dilation=2)), ("bigbird", 4096, True, {}),
    ("prefix_lm", 4096, False, dict(prefix=1000)),
])
@pytest.mark.parametrize("stats", [1, 2, 0], ids=["pass-stats-global", "pass-stats-shared", "prep-stats"])
def test_the_dq_pass_builds_compile_without_spills(arch, D, pattern, T, causal, params, stats):
    """BWD_DQ_PASS: the main kernel without dQ, prep without its accumulator, and the pass itself (with
    BWD_PASS_STATS computing the rows' lse log2 e and delta from O and dO in global or shared memory,
    or reading prep's)."""
    mask = make_mask(pattern, T, causal, **params)
    d = bwd_defines(D, "bfloat16", mask, dq="pass", stats=stats)
    assert d["BWD_DQ_PASS"] == 1 and "BWD_DQ_PASS" not in bwd_defines(D, "bfloat16", mask)
    assert d.get("BWD_PASS_STATS", 0) == stats and "BWD_PASS_STATS" not in bwd_defines(D, "bfloat16", mask)
    reports = compile_only("fast_tc_bwd", d, arch)
    assert sorted(r.kernel for r in reports) == sorted(BWD_KERNELS + ["fast_tc_bwd_dq_pass"])
    for r in reports:
        assert r.arch == arch and 0 < r.registers <= 255
        assert (r.spill_stores, r.spill_loads, r.stack) == (0, 0, 0), r


@pytest.mark.parametrize("D", DIMS)
@pytest.mark.parametrize("pattern,T,causal,params", [
    ("dense", 4096, True, {}), ("streaming", 4096, True, dict(sink=16, window=64)),
    ("dilated", 4096, True, dict(window=512, dilation=2)), ("bigbird", 4096, True, {}),
    ("prefix_lm", 4096, False, dict(prefix=1000)), ("document", 4096, False, {}),
])
@pytest.mark.parametrize("stats", [1, 2, 0], ids=["pass-stats-global", "pass-stats-shared", "prep-stats"])
@pytest.mark.parametrize("tma", [0, 1], ids=["cp.async", "bulk-copies"])
def test_the_wgmma_dq_pass_compiles_without_spills_at_its_blocks_per_sm(D, pattern, T, causal, params, stats, tma):
    """kernels/fast_tc_bwd_dq_wg.cu: dQ's pass on wgmma (one warpgroup, sm_90a only), the mma.sync pass's
    entry point and parameters then five tensor maps; its tiles by cp.async or (TMA, unstrided patterns) by
    bulk tensor copies; its shape's blocks per multiprocessor held by registers and shared memory."""
    import dataclasses

    from attnbench.compile import unbuildable
    from attnbench.bwd_config import KERNEL_DQ_WG, PASS_SHAPES_WG, dq_pass_config, pass_kernel

    pcfg = PASS_SHAPES_WG[D][0]
    if tma:
        if make_mask(pattern, T, causal, **params).strided()[0] > 1:
            pytest.skip("a residue class's rows are no box of the [B*H, T, D] view: strided patterns load by cp.async")
        pcfg = dataclasses.replace(pcfg, TMA=1)
        assert pcfg.spec.endswith(",TMA=1") and pcfg.dq_pass_smem_bytes(D) == PASS_SHAPES_WG[D][0].dq_pass_smem_bytes(D) + 8 * 4
        main = choose_bwd_config(D, True, "pass")
        assert dq_pass_config(D, main, wg=1, tma=1) == pcfg and dq_pass_config(D, main, wg=1, tma=1, stride=3).TMA == 0
        assert dq_pass_config(D, main, wg=0, tma=1).TMA == 0  # the mma.sync pass has none
    assert pass_kernel(pcfg) == KERNEL_DQ_WG and pass_kernel(BWD_SHAPES[D][0]) == "fast_tc_bwd"
    assert unbuildable(KERNEL_DQ_WG, "sm_80") and not unbuildable(KERNEL_DQ_WG, "sm_90a")
    mask = make_mask(pattern, T, causal, **params)
    d = bwd_defines(D, "bfloat16", mask, pcfg, dq="pass", stats=stats, skip=0)
    assert d["WG"] == 1 and d["BWD_DQ_PASS"] == 1 and "BWD_PASS_SKIP" not in d and d.get("TMA", 0) == tma
    (r,) = compile_only(KERNEL_DQ_WG, d, "sm_90a")
    assert r.kernel == "fast_tc_bwd_dq_pass" and r.arch == "sm_90a"
    assert (r.spill_stores, r.spill_loads, r.stack) == (0, 0, 0), r
    assert r.registers * pcfg.threads * pcfg.MINB <= 65536, r  # MINB blocks' registers fit the register file
    assert pcfg.MINB * (pcfg.dq_pass_smem_bytes(D) + 1024) <= 228 * 1024  # ... and their shared memory


@pytest.mark.parametrize("D", DIMS)
@pytest.mark.parametrize("pattern,T,causal,params", [
    ("dense", 4096, True, {}), ("streaming", 4096, True, dict(sink=16, window=64)),
    ("dilated", 4096, True, dict(window=512, dilation=2)), ("document", 4096, False, {}),
])
@pytest.mark.parametrize("nwarps", [8, 4], ids=["two-warpgroups", "one"])
def test_the_wgmma_main_loop_without_dq_compiles_without_spills(D, pattern, T, causal, params, nwarps):
    """BWD_DQ_PASS on the wgmma build: its main kernel leaves dQ to the pass (no staging, no
    reductions), prep zeroes no accumulator; fewer registers than the build with dQ."""
    import dataclasses

    mask = make_mask(pattern, T, causal, **params)
    cfg = dataclasses.replace(bwd_config(D, True), NWARPS=nwarps, MINB=1 if nwarps == 8 else 2)
    d = bwd_defines(D, "bfloat16", mask, cfg, dq="pass")
    reports = {r.kernel: r for r in compile_only("fast_tc_bwd_wg", d, "sm_90a")}
    assert sorted(reports) == BWD_KERNELS
    for r in reports.values():
        assert r.arch == "sm_90a" and 0 < r.registers <= 255
        assert (r.spill_stores, r.spill_loads, r.stack) == (0, 0, 0), r
    with_dq = {r.kernel: r for r in compile_only("fast_tc_bwd_wg", bwd_defines(D, "bfloat16", mask, cfg), "sm_90a")}
    assert reports["fast_tc_bwd"].registers <= with_dq["fast_tc_bwd"].registers


@pytest.mark.parametrize("D", DIMS)
@pytest.mark.parametrize("pattern,T,causal,params", [
    ("dense", 4096, True, {}), ("streaming", 4096, True, dict(sink=16, window=64)),
    ("dilated", 4096, True, dict(window=512, dilation=2)), ("bigbird", 4096, True, {}),
])
def test_the_fused_build_compiles_without_spills(D, pattern, T, causal, params):
    """BWD_FUSED (dq "fused", DQ=2): the wgmma main loop's build without dQ, with the fused launch's kernel
    beside its own: one warpgroup's items and the pass's blocks in one kernel, no spills."""
    mask = make_mask(pattern, T, causal, **params)
    cfg = choose_bwd_config(D, True, "fused", mask.pairs / T)
    assert (cfg.WG, cfg.NWARPS) == (1, 4)
    d = bwd_defines(D, "bfloat16", mask, cfg, dq="fused")
    assert d["BWD_FUSED"] == d["BWD_DQ_PASS"] == 1 and "BWD_PASS_STATS" not in d
    reports = {r.kernel: r for r in compile_only("fast_tc_bwd_wg", d, "sm_90a")}
    assert sorted(reports) == sorted(BWD_KERNELS + ["fast_tc_bwd_fused"])
    for r in reports.values():
        assert r.arch == "sm_90a" and 0 < r.registers <= 255
        assert (r.spill_stores, r.spill_loads, r.stack) == (0, 0, 0), r
    assert cfg.smem_bytes(D, "fused") >= cfg.dq_pass_smem_bytes(D)  # the pass's blocks fit the launch's smem


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_pass_that_skips_keeps_three_blocks_at_d64_with_pminb_3(arch):
    """SKIP at D=64 takes the pass from 162 to 172 registers (two blocks a multiprocessor, docs/PERF.md
    "backward v12"); asking for three (PMINB=3) fits it in 168 without spills."""
    from attnbench.bwd_config import dq_pass_config

    mask = make_mask("streaming", 32768, True, sink=16, window=64)
    pcfg = dq_pass_config(64, bwd_config(64, True, 80, "pass"), 3, wg=0)  # the mma.sync pass
    assert (pcfg.MINB, pcfg.WG, pcfg.NWARPS) == (3, 0, 4)
    d = bwd_defines(64, "bfloat16", mask, pcfg, dq="pass", skip=1)
    assert d["BWD_PASS_SKIP"] == 1 and d["MINB"] == 3
    r = {x.kernel: x for x in compile_only("fast_tc_bwd", d, arch)}["fast_tc_bwd_dq_pass"]
    assert r.registers <= 168 and (r.spill_stores, r.spill_loads, r.stack) == (0, 0, 0), r


def test_the_fused_order_runs_every_block_once_beside_the_tiles_it_reads():
    from attnbench.fast_tc_bwd import fused_order
    from attnbench.tiles import tile_items_t

    mask = make_mask("streaming", 1000, True, sink=16, window=64)
    items = tile_items_t(mask, 64, 64, 4)  # key tile 0 (the sinks) split in items of 4 query tiles
    assert items.n_split == 1
    nqx = -(-1000 // 64)  # the forward list's query tiles
    bh, classes = 3, 1
    order = fused_order(items.heads, items.n_items, nqx, bh, classes)
    n_main, n_pass = items.n_items * bh, nqx * bh
    assert order.dtype == np.int32 and sorted(order.tolist()) == list(range(-n_pass, n_main))
    main = order >= 0
    # tile by tile: the items whose stretch starts at query tile t, then the pass's blocks of query tile t
    pos = np.empty(order.size, np.int64)
    pos[main] = items.heads[order[main] // bh, 2] >> 1
    pos[~main] = nqx - 1 - (-1 - order[~main]) % nqx
    assert (np.diff(pos) >= 0).all()
    kt, slot = items.tiles[order[main] // bh, 0], items.tiles[order[main] // bh, 1]
    for t in range(nqx):
        at = np.flatnonzero(pos == t)
        kinds = main[at]
        assert (~kinds).sum() == bh and not kinds[np.argmin(kinds):].any()  # (items first)
        # a causal band: key tile t's item starts at query tile t; the sinks' items every 4 tiles
        here = pos[main] == t
        assert set(kt[here & (slot < 0)].tolist()) == ({t} if t > 0 else set())
        assert (slot[here] >= 0).any() == (t % 4 == 0)


def test_the_fused_launch_is_refused_where_it_does_not_build(no_device_check):
    from attnbench.fast_tc_bwd import Backward

    prob = Problem(make_mask("streaming", 1000, True, sink=16, window=64), 1, 2, 64, "bfloat16", pass_name="bwd")
    with pytest.raises(BadInput, match="one warpgroup.*mma.sync"):
        Backward(prob, dq="fused", wgmma=False)
    with pytest.raises(BadInput, match="one warpgroup.*NWARPS=8"):
        Backward(prob, dq="fused", wgmma=True, fields={"NWARPS": 8, "MINB": 1})
    with pytest.raises(BadInput, match="stats from prep.*STATS=2"):
        Backward(prob, dq="fused", wgmma=True, stats=2)
    with pytest.raises(BadInput, match="DQ=2.*cp.async.*MTMA=0"):
        Backward(prob, dq="fused", wgmma=True, main_tma=1)


# ---- dQ stored by the wgmma main loop (DQ=3) where every query tile reads one key tile ---------------------------
STORE_CASES = [  # (pattern, T, causal, params, NWARPS of the store shape)
    ("block_diagonal", 784, False, dict(block=16), 4), ("block_diagonal", 1024, True, dict(block=64), 4),
    ("block_diagonal", 896, False, dict(block=128), 8), ("custom", 1000, False, dict(expr="i // 128 == j // 128"), 8),
    ("custom", 777, True, dict(expr="i // 16 == j // 16"), 4),
]


@pytest.mark.parametrize("D", DIMS)
def test_the_store_shape_is_where_every_query_tile_reads_one_key_tile(D):
    """store_shape: one warpgroup's 64-key tiles where every query tile reads one of them, else two warpgroups'
    128-key tiles, else None (a query tile reading two key tiles, or a block that straddles them)."""
    from attnbench.bwd_config import store_shape, single_key_tile

    for pattern, T, causal, params, nwarps in STORE_CASES:
        mask = make_mask(pattern, T, causal, **params)
        cfg = store_shape(D, mask)
        assert cfg == (BWD_SHAPES_WG if nwarps == 4 else BWD_SHAPES_WG2)[D][0], (pattern, params)
        assert single_key_tile(mask, cfg.BM, cfg.BN)
        assert single_key_tile(mask, 64, 128)  # (a 64-key fit fits 128 keys too)
        assert store_shape(D, mask, {"NWARPS": 8, "MINB": 1}).NWARPS == 8  # the fields win
    for pattern, T, causal, params in (("streaming", 1000, True, dict(sink=16, window=64)), ("dense", 1000, True, {}),
                                       ("document", 4096, True, dict(doc_mean=512)), ("window", 1000, True, dict(window=8)),
                                       ("block_diagonal", 960, False, dict(block=96)),
                                       ("dilated", 777, True, dict(window=70, dilation=3))):
        mask = make_mask(pattern, T, causal, **params)
        assert store_shape(D, mask.strided()[1]) is None, pattern
    # block-diagonal 128 on 64-key tiles: a query tile reads its block's two key tiles
    assert not single_key_tile(make_mask("block_diagonal", 896, False, block=128), 64, 64)
    d = bwd_defines(D, "bfloat16", make_mask("block_diagonal", 784, False, block=16), BWD_SHAPES_WG[D][0], dq="store")
    assert d["BWD_DQ_STORE"] == 1 and "BWD_DQ_PASS" not in d and "BWD_PASS_SKIP" not in d


@pytest.mark.parametrize("D", DIMS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nwarps", [4, 8], ids=["one-warpgroup", "two"])
def test_the_store_builds_compile_without_spills(D, dtype, nwarps):
    """BWD_DQ_STORE: the wgmma main loop storing dQ itself (and prep zeroing no accumulator), one warpgroup and two
    (at D=64 a pair's tiles, at D=128 a panel each), no spills."""
    import dataclasses

    mask = make_mask("block_diagonal", 896, False, block=128 if nwarps == 8 else 16)
    cfg = dataclasses.replace((BWD_SHAPES_WG if nwarps == 4 else BWD_SHAPES_WG2)[D][0], TMA=1)
    d = bwd_defines(D, dtype, mask, cfg, dq="store")
    reports = {r.kernel: r for r in compile_only("fast_tc_bwd_wg", d, "sm_90a")}
    assert sorted(reports) == BWD_KERNELS
    for r in reports.values():
        assert r.arch == "sm_90a" and 0 < r.registers <= 255
        assert (r.spill_stores, r.spill_loads, r.stack) == (0, 0, 0), r


def test_dq_store_is_refused_where_it_does_not_build(no_device_check):
    from attnbench.fast_tc_bwd import Backward

    prob = Problem(make_mask("streaming", 1000, True, sink=16, window=64), 1, 2, 64, "bfloat16", pass_name="bwd")
    with pytest.raises(BadInput, match=r"dq=store \(DQ=3\).*several key tiles.*give DQ=0, 1 or 2"):
        Backward(prob, dq="store", wgmma=True)
    bd = Problem(make_mask("block_diagonal", 896, False, block=128), 1, 2, 64, "bfloat16", pass_name="bwd")
    with pytest.raises(BadInput, match=r"dq=store \(DQ=3\).*mma.sync"):
        Backward(bd, dq="store", wgmma=False)
    with pytest.raises(BadInput, match="not in flight.*PAIRS=0 or 1"):
        Backward(bd, dq="store", wgmma=True, fields={"NWARPS": 8, "MINB": 1, "PAIRS": 2})


@pytest.mark.gpu
@pytest.mark.parametrize("pattern,T,causal,params,nwarps", STORE_CASES)
@pytest.mark.parametrize("D,dtype", [(64, "bfloat16"), (128, "float16")])
@pytest.mark.parametrize("text", ["", "DQ=3", "DQ=3,MTMA=0", "DQ=3,MPER=1", "DQ=3,L=1"])
def test_dq_stored_by_the_main_loop_matches_the_reference(monkeypatch, pattern, T, causal, params, nwarps, D, dtype,
                                                          text):
    """Where every query tile reads one key tile, DQ=3 stores dQ from the wgmma main loop (no pass, no accumulator,
    no convert; fast-tc's default on sm_90 where one warpgroup's 64-key tiles fit, STORE_DQ_SHAPES): through the
    gate, with bulk copies and by cp.async, persistent, and with every key tile that two query tiles visit split
    (L=1: its dK and dV summed in float32, converted after)."""
    from attnbench.bwd_config import PERSIST_BLOCKS_ENV, parse_bwd_config

    if not IMPL.uses_wgmma():
        pytest.skip("dQ is stored by the wgmma main loop (sm_90)")
    monkeypatch.setenv(PERSIST_BLOCKS_ENV, "5")
    mask = make_mask(pattern, T, causal, **params)
    prob = Problem(mask, 2, 3, D, dtype, pass_name="bwd")
    q, k, v, do = _inputs(prob, seed=T + D + 11)
    impl = IMPL.bwd_variant(parse_bwd_config(text)) if text else IMPL
    runner = impl.prepare(prob, q, k, v, do=do)
    if not text and nwarps == 8:  # two warpgroups' store only where asked: by default the pass, checked all the same
        assert runner.setup["bwd_dq"] == "pass"
    else:
        assert runner.setup["bwd_dq"] == "store"
        assert runner.setup["bwd_tile_config"].startswith(f"NWARPS={nwarps},")
        split = runner.setup["bwd_split_tiles"] > 0
        assert split == (text == "DQ=3,L=1" and nwarps == 8)  # (a 64-key tile here is one query tile's alone)
        assert runner.setup["bwd_launches"] == "prep,main" + (",convert" if split else "")
    for _ in range(2):  # a second run writes every gradient again
        runner.poison()
        runner.run()
        _check_grads(prob, runner.grads, q, k, v, do)


def test_a_persistent_launchs_blocks_come_from_the_environment(monkeypatch):
    from attnbench.bwd_config import PERSIST_BLOCKS_ENV, persist_blocks

    monkeypatch.setenv(PERSIST_BLOCKS_ENV, "7")
    assert persist_blocks(100, 3) == 7 and persist_blocks(5, 3) == 5  # never more blocks than works
    for bad in ("0", "x", "-2"):
        monkeypatch.setenv(PERSIST_BLOCKS_ENV, bad)
        with pytest.raises(BadInput, match=PERSIST_BLOCKS_ENV):
            persist_blocks(100, 3)


def test_the_dq_way_comes_from_the_environment(monkeypatch):
    from attnbench.bwd_config import DQ_ENV, forced_dq

    monkeypatch.delenv(DQ_ENV, raising=False)
    assert forced_dq() is None  # choose_dq's rule
    monkeypatch.setenv(DQ_ENV, "pass")
    assert forced_dq() == "pass"
    monkeypatch.setenv(DQ_ENV, "both")
    with pytest.raises(BadInput, match=DQ_ENV):
        forced_dq()


def test_dq_takes_its_own_pass_where_a_query_reads_few_keys():
    """choose_dq: the pass below DQ_PASS_MAX_KEYS keys a query (pairs / T), float32 reductions from there
    and where the count is not known; the llm instances it sends each way."""
    from attnbench.bwd_config import DQ_PASS_MAX_KEYS, choose_dq

    for D in DIMS:
        assert choose_dq(D, DQ_PASS_MAX_KEYS[D] - 1) == "pass" and choose_dq(D, DQ_PASS_MAX_KEYS[D]) == "atomic"
        assert choose_dq(D, None) == "atomic"
    T = 32768
    masks = [i.mask(T) for i in LLM.instances]
    # beside the wgmma main loop with dQ's pass on wgmma, the pass below PASS_WG_MAX_KEYS (backward v15): every llm
    # instance at T=32768, dense causal at 131072 not
    from attnbench.bwd_config import PASS_WG, PASS_WG_MAX_KEYS

    if PASS_WG:
        assert {choose_dq(D, m.pairs / T, wgmma=True) for m in masks for D in DIMS} == {"pass"}
        dense = make_mask("dense", 131072, True)
        assert dense.pairs / dense.T >= PASS_WG_MAX_KEYS
        assert {choose_dq(D, dense.pairs / dense.T, wgmma=True) for D in DIMS} == {"atomic"}
        assert choose_dq(64, PASS_WG_MAX_KEYS - 1, wgmma=True) == "pass"
    assert choose_dq(64, None, wgmma=True) == "atomic"
    # where the wgmma main loop can take dQ a tile behind (LAG=1: unstrided, bulk copies), D=128 sums dQ there from
    # LAG_MIN_KEYS keys a query: dense, window 4096 and the three-level dilation at T=32768; D=64 keeps the pass
    from attnbench.bwd_config import LAG_MIN_KEYS

    if PASS_WG:
        assert LAG_MIN_KEYS == {128: 2048}
        lag = {m.label() for m in masks if choose_dq(128, m.pairs / T, wgmma=True, lag=True) == "atomic"}
        assert lag == {"dense", "window(window=4096)", "dilated(levels=2048:1+2048:2+2048:4)"}, lag
        assert {choose_dq(64, m.pairs / T, wgmma=True, lag=True) for m in masks} == {"pass"}
        assert choose_dq(128, 2047.9, wgmma=True, lag=True) == "pass" and choose_dq(128, 2048, wgmma=True) == "pass"
    ways = {(m.label(), D): choose_dq(D, m.pairs / T) for m in masks for D in DIMS}
    for D in DIMS:
        assert ways["streaming(sink=16,window=64)", D] == ways["block_diagonal(block=128)", D] == "pass"
        assert ways["window(window=256)", D] == "pass"
        assert ways["dense", D] == ways["window(window=4096)", D] == ways["streaming(sink=4,window=1024)", D] == "atomic"
    assert ways["dilated(window=512,dilation=2)", 64] == "pass" and ways["dilated(window=512,dilation=2)", 128] == "atomic"


@pytest.mark.gpu
@pytest.mark.parametrize("impl", [IMPL, SYNC_IMPL], ids=["fast-tc", "fast-tc-sync"])
def test_the_runner_takes_the_dq_way_the_rule_gives(monkeypatch, impl):
    from attnbench.bwd_config import DQ_ENV

    from attnbench.bwd_config import PASS_WG

    monkeypatch.delenv(DQ_ENV, raising=False)
    dense_way = "pass" if impl.uses_wgmma() and PASS_WG else "atomic"
    for pattern, params, way in (("streaming", dict(sink=16, window=64), "pass"), ("dense", {}, dense_way)):
        mask = make_mask(pattern, 2048, True, **params)
        prob = Problem(mask, 1, 2, 64, "bfloat16", pass_name="bwd")
        q, k, v, do = _inputs(prob, seed=3)
        runner = impl.prepare(prob, q, k, v, do=do)
        assert runner.setup["bwd_dq"] == way
        runner.poison()
        runner.run()
        _check_grads(prob, runner.grads, q, k, v, do)


@pytest.mark.parametrize("D", DIMS)
def test_the_float32_sums_are_vector_reductions_on_sm_90_only(D):
    """tc_red2: dQ's and the split key tiles' dK / dV column pairs as red.global.add.v2.f32 on sm_90,
    scalar atomics (reductions once ptxas sees the result unused) on sm_80."""
    from cupy.cuda import nvrtc

    from attnbench.compile import options

    d = bwd_defines(D, "bfloat16", make_mask("dilated", 4096, True, window=512, dilation=2))
    counts = {}
    for arch in ("80", "90"):
        prog = nvrtc.createProgram(source("fast_tc_bwd", d), "fast_tc_bwd.cu", [], [])
        try:
            nvrtc.compileProgram(prog, list(options(d)) + [f"-arch=compute_{arch}"])
            ptx = nvrtc.getPTX(prog).decode()
        finally:
            nvrtc.destroyProgram(prog)
        counts[arch] = (ptx.count("red.global.add.v2.f32"), ptx.count("atom.global.add.f32"))
    # per thread: dQ's chunk 2 rows x DQ_CHUNK / 8 pairs; dK and dV 2 x 2 rows x D / 8 pairs
    pairs = 2 * 32 // 8 + 4 * D // 8
    assert counts == {"80": (0, 2 * pairs), "90": (pairs, 0)}, counts


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_the_forward_with_lse_is_an_entry_of_its_own(arch):
    """FWD_LSE 1 builds fast_tc_fwd_lse alone; the plain build keeps fast_tc_fwd alone."""
    mask = make_mask("streaming", 4096, True, sink=16, window=64)
    for D in DIMS:
        d = kernel_defines(D, "bfloat16", mask, choose_config(mask, D, wgmma=arch == "sm_90a"))
        (plain,) = compile_only("fast_tc", d, arch)
        (lse,) = compile_only("fast_tc", {**d, "FWD_LSE": 1}, arch)
        assert (plain.kernel, lse.kernel) == ("fast_tc_fwd", "fast_tc_fwd_lse")
        assert (lse.spill_stores, lse.spill_loads, lse.stack) == (0, 0, 0), lse


def test_standard_builds_hold_the_backward_of_every_llm_instance():
    builds = standard_builds()
    bwd = [d for n, d in builds if n == "fast_tc_bwd"]
    fwd = [d for n, d in builds if n == "fast_tc"]
    assert {d["HEAD_D"] for d in bwd} == set(DIMS) and {d["AB_F16"] for d in bwd} == {0, 1}
    assert all(d.get("FWD_LSE") == 1 for d in fwd) and {d.get("WG", 0) for d in fwd} == {0, 1}
    from attnbench.bwd_config import choose_dq

    wg = [d for n, d in builds if n == "fast_tc_bwd_wg"]
    for inst in LLM.instances:
        for D in DIMS:
            m = inst.mask(LLM.build_T)
            dq = choose_dq(D, m.pairs / m.T)  # the way the runner takes: its builds, main loop and pass
            assert bwd_defines(D, "bfloat16", m, dq=dq) in bwd
            dq = choose_dq(D, m.pairs / m.T, wgmma=True)  # ... beside the wgmma main loop
            assert bwd_defines(D, "bfloat16", m, bwd_config(D, True, m.pairs / m.T, dq), dq) in wg
            if dq == "pass":
                from attnbench.bwd_config import KERNEL_DQ_WG, PASS_SHAPES_WG

                assert (KERNEL_DQ_WG, bwd_defines(D, "bfloat16", m, PASS_SHAPES_WG[D][0], dq, skip=0)) in builds
    assert any(d.get("BWD_DQ_PASS") for d in bwd) and not all(d.get("BWD_DQ_PASS") for d in bwd)
    from attnbench import compile as kc

    every = kc.standard_builds()
    assert all(b in every for b in builds)  # attnbench compile and tests/test_compile.py build them


def test_defines_run_strided_patterns_on_their_residue_classes():
    m = make_mask("dilated", 1000, True, window=64, dilation=3)
    d = bwd_defines(128, "float16", m)
    assert (d["AB_PATTERN_T"], d["AB_PATTERN_ARGS"], d["STRIDE"], d["AB_F16"]) == ("ab_window", "1,64", 3, 1)
    cfg = BWD_SHAPES[128][0]
    assert (d["BN"], d["NWARPS"], d["QREG"], d["MT"]) == (cfg.BN, cfg.NWARPS, 0, 1) and cfg.BM == cfg.BN
    # the backward's source composes fast_tc's parts with its own
    src = source("fast_tc_bwd", d)
    assert "struct TcTileList" in src and "tc_bwd_cols" in src and src.count("struct TcTileList") == 1


# ---- CPU: refusals before any launch ------------------------------------------------------------
@pytest.fixture
def no_device_check(monkeypatch):
    """Pretend a device is there, so a refusal comes from the input, not from the machine."""
    from attnbench.impls import Impl

    monkeypatch.setattr(Impl, "availability", lambda self: None)


def test_passes_dtypes_and_the_output_gradient_are_checked_by_name(no_device_check):
    mask = make_mask("window", 256, True)
    for impl in (IMPL, SYNC_IMPL):
        assert impl.passes == ("fwd", "bwd", "fwd+bwd")
        for p in ("bwd", "fwd+bwd"):
            assert impl.unsupported(Problem(mask, 1, 2, 64, "bfloat16", pass_name=p)) is None
            why = impl.unsupported(Problem(mask, 1, 2, 64, "float32", pass_name=p))
            assert "dtype=float32" in why
            with pytest.raises(BadInput, match="do="):  # before any array is looked at
                impl.prepare(Problem(mask, 1, 2, 64, "bfloat16", pass_name=p), None, None, None)
    for name in ("naive", "fast-f32"):
        with pytest.raises(BadInput, match=f"pass=bwd is not supported by {name}"):
            get_impl(name).require(Problem(mask, 1, 1, 64, "float32", pass_name="bwd"))


def test_the_low_level_api_refuses_host_arrays_and_float32_by_name():
    from attnbench.fast_tc_bwd import backward, forward_lse

    mask = make_mask("dense", 64)
    host = np.zeros((1, 1, 64, 64), np.float32)
    with pytest.raises(BadInput, match="q is a numpy array"):
        forward_lse(mask, host, host, host)
    with pytest.raises(BadInput, match="q is a numpy array"):
        backward(mask, host, host, host, host, host, host)


def test_attention_with_grad_refuses_impls_without_a_backward():
    from attnbench import _attention_with_grad

    with pytest.raises(BadInput, match="impl='naive' computes no backward"):
        _attention_with_grad(None, None, None, "dense", "naive", True, None)


# ---- GPU: gradients against the float64 reference ---------------------------------------------
def _fit_T(pattern: str, params: dict, T: int) -> int:
    """T, or the next size its block parameter divides (block_diagonal 16: 1008, not a multiple of
    the 64-row tiles; 64- and 128-key blocks: multiples of them)."""
    block = params.get("block") if pattern in ("block_diagonal", "bigbird") else None
    return T if not block else -(-T // block) * block


def _cases():
    """Every llm instance, then document, prefix_lm, custom and non-causal / unequal-class cases;
    each at two of the four (D, dtype) pairs, odd T, B=2, H=3, alternating fast-tc and fast-tc-sync."""
    insts = [(i.pattern, i.causal, i.param_dict) for i in LLM.instances]
    # (the pattern's examples at the T of each case: document's first holds lengths that sum to T)
    insts += [("document", True, 0), ("document", False, 1), ("prefix_lm", False, dict(prefix=256)),
              ("custom", True, 1), ("window", False, dict(window=100)), ("dilated", False, dict(window=7, dilation=3)),
              ("streaming", False, dict(sink=4, window=33))]
    for n, (pattern, causal, given) in enumerate(insts):
        pairs = ((64, "bfloat16", 1000), (128, "float16", 777)) if n % 2 == 0 else \
            ((128, "bfloat16", 1000), (64, "float16", 777))
        for D, dtype, T in pairs:
            params = PATTERNS[pattern].examples(T)[given] if isinstance(given, int) else given
            T = _fit_T(pattern, params, T)
            label = "-".join(f"{k}{v}" for k, v in sorted(params.items()) if v not in ((), None, ""))[:40]
            yield pytest.param(pattern, causal, params, D, dtype, T, n % 2,
                               id=f"{pattern}-{label}-{'c' if causal else 'nc'}-D{D}-{dtype}-T{T}")


def _inputs(prob: Problem, seed: int):
    from attnbench.arrays import random_inputs

    q, k, v = random_inputs(prob.shape, prob.dtype, seed)
    do = random_inputs(prob.shape, prob.dtype, seed + 1000)[0]
    return q, k, v, do


def _check_grads(prob: Problem, grads, q, k, v, do, out=None):
    from attnbench.arrays import to_float32
    from attnbench.reference import reference_backward, reference_forward, rel_error

    ref = reference_backward(q, k, v, do, prob.mask, prob.dtype, prob.softmax_scale)
    errs = {}
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref[:3]):
        assert tuple(got.shape) == prob.shape, name
        errs[name] = rel_error(to_float32(got, prob.dtype), want)
    if out is not None:
        errs["o"] = rel_error(to_float32(out, prob.dtype), reference_forward(q, k, v, prob.mask, prob.dtype,
                                                                             prob.softmax_scale)[0])
    bad = {n: e for n, e in errs.items() if not e <= prob.tolerance}  # NaN fails too
    assert not bad, (errs, prob.tolerance)
    return errs


@pytest.mark.gpu
@pytest.mark.parametrize("pattern,causal,params,D,dtype,T,sync", list(_cases()))
def test_gradients_match_the_reference(pattern, causal, params, D, dtype, T, sync):
    mask = make_mask(pattern, T, causal, **params)
    prob = Problem(mask, 2, 3, D, dtype, pass_name="bwd")
    q, k, v, do = _inputs(prob, seed=T + D)
    runner = (SYNC_IMPL if sync else IMPL).prepare(prob, q, k, v, do=do)
    assert runner.out is None and {"tiles_t_build_s", "compile_s", "bwd_items", "bwd_split"} <= set(runner.setup)
    runner.poison()
    runner.run()
    _check_grads(prob, runner.grads, q, k, v, do)
    runner.poison()  # a second run writes every gradient again
    runner.run()
    _check_grads(prob, runner.grads, q, k, v, do)


@pytest.mark.gpu
@pytest.mark.parametrize("pattern,causal,params,T", [
    ("dense", True, {}, 1000), ("window", False, dict(window=100), 777), ("bigbird", True, {}, 1024),
    ("prefix_lm", False, dict(prefix=256), 777), ("document", True, 0, 1000),
    ("streaming", True, dict(sink=16, window=64), 1000),  # the sink's key tile split: dK, dV summed
    ("dilated", True, dict(window=70, dilation=3), 777),  # strided: the variant loads by cp.async
])
@pytest.mark.parametrize("D,dtype", [(64, "bfloat16"), (128, "float16")])
@pytest.mark.parametrize("text,kernel,marker", [
    ("DQ=1,PTMA=1", "bwd_dq_tile_config", ",TMA=1"), ("MTMA=1", "bwd_tile_config", ",TMA=1"),
    ("DQ=0,MTMA=1", "bwd_tile_config", ",TMA=1"), ("NWARPS=8,MINB=1,DQ=0,MTMA=1", "bwd_tile_config", ",TMA=1"),
    ("DQ=1,PPER=1", "bwd_dq_tile_config", ",PERSIST=1"), ("MPER=1", "bwd_tile_config", ",PERSIST=1"),
    ("NWARPS=8,MINB=1,DQ=0,MPER=1", "bwd_tile_config", ",PERSIST=1"),
    ("MPER=1,MTMA=1", "bwd_tile_config", ",TMA=1"),  # (persistent too: the variant test asserts it)
    ("DQ=0,DQR=1", "bwd_tile_config", ",DQR=1"), ("NWARPS=8,MINB=1,DQ=0,DQR=1", "bwd_tile_config", ",DQR=1"),
    ("NWARPS=8,MINB=1,DQ=0,PAIRS=0,DQR=1", "bwd_tile_config", ",DQR=1"),
    ("NWARPS=8,MINB=1,DQ=0,MPER=1,DQR=1", "bwd_tile_config", ",DQR=1"), ("DQ=0,DQR=2", "bwd_tile_config", ",DQR=2"),
    ("NWARPS=8,MINB=1,DQ=0,PAIRS=0,DQR=2", "bwd_tile_config", ",DQR=2")])
def test_the_wgmma_kernels_variants_match_the_reference(pattern, causal, params, T, D, dtype, text, kernel, marker,
                                                        monkeypatch):
    """--bwd-config DQ=1,PTMA=1: dQ's pass on wgmma with its K and V tiles by bulk tensor copies; MTMA=1: the wgmma
    main loop's Q and dO tiles so, beside dQ's pass and with dQ's float32 reductions, one warpgroup and two (zero-
    filled past T; strided patterns by cp.async); PPER=1: the pass persistent, its blocks taking the query tiles in
    turn (every pattern), MPER=1 the main loop so, its blocks taking the work items in turn, by 7 blocks so that
    each takes many works across heads; DQR=1: dQ's sums by bulk tensor reductions (one warpgroup, two, two
    reducing halves, persistent; strided patterns by reductions from registers); DQR=2: the same from two sets of
    staging buffers in turn (one warpgroup, two): through the gate on patterns of every kind, odd T, both head
    dims."""
    from attnbench.bwd_config import PERSIST_BLOCKS_ENV, parse_bwd_config

    monkeypatch.setenv(PERSIST_BLOCKS_ENV, "7")

    if not IMPL.uses_wgmma():
        pytest.skip("the wgmma kernels run on sm_90")
    params = PATTERNS[pattern].examples(T)[params] if isinstance(params, int) else params
    mask = make_mask(pattern, T, causal, **params)
    prob = Problem(mask, 2, 3, D, dtype, pass_name="bwd")
    q, k, v, do = _inputs(prob, seed=T + D + 7)
    runner = IMPL.bwd_variant(parse_bwd_config(text)).prepare(prob, q, k, v, do=do)
    assert (marker in runner.setup[kernel]) == (mask.strided()[0] == 1 or marker not in (",TMA=1", ",DQR=1", ",DQR=2"))
    for _ in range(2):  # a second run writes every gradient again
        runner.poison()
        runner.run()
        _check_grads(prob, runner.grads, q, k, v, do)


@pytest.mark.gpu
@pytest.mark.parametrize("pattern,causal,params,T", [
    ("dense", True, {}, 1000), ("window", False, dict(window=100), 777), ("bigbird", True, {}, 1024),
    ("prefix_lm", False, dict(prefix=256), 777), ("document", True, 0, 1000),
    ("streaming", True, dict(sink=16, window=64), 1000),  # the sink's key tile split: dK, dV summed
])
@pytest.mark.parametrize("D,dtype", [(64, "bfloat16"), (128, "float16")])
@pytest.mark.parametrize("bulk", ["", "DQR=0,", "DQR=1,"])
@pytest.mark.parametrize("split", ["", "1", "3"])
@pytest.mark.parametrize("lag", [1, 2])
def test_two_warpgroups_a_tile_apart_match_the_reference(pattern, causal, params, T, D, dtype, bulk, split, lag,
                                                         monkeypatch):
    """--bwd-config LAG=1 (kernels/tc/bwd_lag.cuh): the two warpgroups of the wgmma main loop each take dQ of the tile
    before their current one and meet on barriers of their own, with dQ's panels by reductions from registers
    (DQR=0), by bulk reductions (DQR=1) and from two sets of staging buffers (D=128's default, DQR=2); lists as long
    as the pattern gives, and cut into items of one query tile (no tile before the last) and of three (a dS^T set
    restaged): through the gate on unstrided patterns of every kind, odd T, both head dims, twice each. LAG=2 (dQ's
    products issued behind the tile's dK) the same at D=128, and refused by name at D=64."""
    from attnbench.bwd_config import MAIN_DQ_BULK, SPLIT_ENV, parse_bwd_config

    if not IMPL.uses_wgmma():
        pytest.skip("the wgmma main loop runs on sm_90")
    monkeypatch.setenv(SPLIT_ENV, split)
    params = PATTERNS[pattern].examples(T)[params] if isinstance(params, int) else params
    mask = make_mask(pattern, T, causal, **params)
    prob = Problem(mask, 2, 3, D, dtype, pass_name="bwd")
    q, k, v, do = _inputs(prob, seed=T + D + 11)
    variant = IMPL.bwd_variant(parse_bwd_config(f"NWARPS=8,MINB=1,DQ=0,PAIRS=0,{bulk}LAG={lag}"))
    if lag == 2 and D == 64:
        with pytest.raises(BadInput, match="LAG=2 issues a warpgroup's whole 64-column panel of dQ.*D=64"):
            variant.prepare(prob, q, k, v, do=do)
        return
    runner = variant.prepare(prob, q, k, v, do=do)
    cfg = runner.setup["bwd_tile_config"]
    dqr = int(bulk[4]) if bulk else MAIN_DQ_BULK[D]
    assert runner.setup["bwd_dq"] == "atomic" and cfg.startswith("NWARPS=8,") and ",TMA=1" in cfg, cfg
    assert cfg.endswith((f",DQR={dqr}" if dqr else "") + f",LAG={lag}"), cfg
    for _ in range(2):  # a second run writes every gradient again
        runner.poison()
        runner.run()
        _check_grads(prob, runner.grads, q, k, v, do)


def test_two_warpgroups_take_dq_a_tile_behind_by_default_from_lag_min_keys():
    """default_lag: LAG=1 where two warpgroups at D=128 sum dQ one query tile at a time by bulk copies, a block a
    work item, and a query reads LAG_MIN_KEYS[128] keys or more; not below, not at D=64 (paired or not), not by
    cp.async or persistent, not beside dQ's pass."""
    import dataclasses

    from attnbench.bwd_config import LAG_MIN_KEYS, default_lag

    two = dataclasses.replace(BWD_SHAPES_WG2[128][0], TMA=1)
    n = LAG_MIN_KEYS[128]
    assert default_lag(128, n, two, "atomic") == 1 and default_lag(128, n - 1, two, "atomic") == 0
    assert default_lag(128, n, two, "pass") == 0
    assert default_lag(128, n, dataclasses.replace(two, TMA=0), "atomic") == 0
    assert default_lag(128, n, dataclasses.replace(two, PERSIST=1), "atomic") == 0
    assert default_lag(128, n, dataclasses.replace(BWD_SHAPES_WG[128][0], TMA=1), "atomic") == 0
    for pairs in (0, 1):
        assert default_lag(64, 16384, dataclasses.replace(BWD_SHAPES_WG2[64][0], TMA=1, PAIRS=pairs), "atomic") == 0


@pytest.mark.gpu
def test_dense_at_d128_sums_dq_two_warpgroups_a_tile_apart_by_default():
    """Dense causal at D=128 and T=4097 (2049 keys a query): dQ summed in the main loop, two warpgroups a tile apart
    (LAG=1) with D=128's two sets of staging buffers, through the gate; LAG=0 given, or the loop by cp.async (MTMA=0),
    keeps dQ's own pass."""
    from attnbench.bwd_config import parse_bwd_config

    if not IMPL.uses_wgmma():
        pytest.skip("the wgmma main loop runs on sm_90")
    prob = Problem(make_mask("dense", 4097, True), 1, 2, 128, "bfloat16", pass_name="bwd")
    q, k, v, do = _inputs(prob, seed=17)
    runner = IMPL.prepare(prob, q, k, v, do=do)
    cfg = runner.setup["bwd_tile_config"]
    assert runner.setup["bwd_dq"] == "atomic" and cfg.startswith("NWARPS=8,") and cfg.endswith(",DQR=2,LAG=1"), cfg
    runner.poison()
    runner.run()
    _check_grads(prob, runner.grads, q, k, v, do)
    for text in ("LAG=0", "MTMA=0"):
        other = IMPL.bwd_variant(parse_bwd_config(text)).prepare(prob, q, k, v, do=do)
        assert other.setup["bwd_dq"] == "pass" and ",LAG=1" not in other.setup["bwd_tile_config"], text


def test_two_warpgroups_a_tile_apart_fit_and_leave_the_tiles_block_barriers():
    """LAG=1's shared memory (a second dS^T, a warpgroup's own (lse2, delta) stages, four barriers and a counter a
    stage) fits one block a multiprocessor with D=128's two sets of dQ staging buffers; its build waits and arrives on
    mbarriers for dS^T, refills a stage from the warpgroup that releases it second (a shared counter), and has fewer
    block barriers than the same shape that meets every tile."""
    import dataclasses

    from attnbench.compile import ptx

    cfg = dataclasses.replace(BWD_SHAPES_WG2[128][0], TMA=1, DQR=2, LAG=1)
    base = dataclasses.replace(cfg, LAG=0)
    assert cfg.smem_bytes(128) == base.smem_bytes(128) + 2 * 64 * 128 + 8 * 2 * 64 + 32 + 4 * 2
    assert cfg.smem_bytes(128) <= 227 * 1024 and cfg.spec.endswith(",TMA=1,DQR=2,LAG=1")
    mask = make_mask("dense", 4096)
    text = {c.LAG: ptx("fast_tc_bwd_wg", bwd_defines(128, "bfloat16", mask, c), "sm_90a") for c in (base, cfg)}
    import re

    block = {lag: len(re.findall(r"bar\.sync\s+0;", t)) for lag, t in text.items()}
    assert block[1] < block[0], block
    assert "atom.shared.add.u32" in text[1] and "atom.shared.add.u32" not in text[0]
    assert text[1].count("mbarrier.arrive.shared::cta.b64") >= 2 > text[0].count("mbarrier.arrive.shared::cta.b64")


def _split_cases():
    """Transposed lists cut into items of L query tiles (L=1: every entry an item; 2, 3: the long
    lists split, the short ones not; 0: nothing split, the long lists walked whole): the shapes
    with long lists (streaming's sink tile, dense causal's first key tiles, BigBird's global block,
    prefix_lm's prefix, a document's first tiles) and a strided pattern (split rows per residue
    class), odd T and partial last tiles, D 64 and 128."""
    cases = [("streaming", True, dict(sink=16, window=64), 1000, (2, 1)),
             ("dense", True, {}, 777, (3, 0)),
             ("bigbird", True, dict(block=16), 1000, (2,)),
             ("prefix_lm", False, dict(prefix=300), 999, (3,)),
             ("document", True, dict(doc_lens=(1, 300, 476)), 777, (2,)),
             ("dilated", False, dict(window=33, dilation=3), 1000, (2,))]
    for pattern, causal, params, T, Ls in cases:
        T = _fit_T(pattern, params, T)
        for L in Ls:
            for D, dtype in ((64, "bfloat16"), (128, "float16")):
                yield pytest.param(pattern, causal, params, D, dtype, T, L,
                                   id=f"{pattern}-{'c' if causal else 'nc'}-L{L}-D{D}-{dtype}-T{T}")


@pytest.mark.gpu
@pytest.mark.parametrize("dq", ["atomic", "pass"])
@pytest.mark.parametrize("pattern,causal,params,D,dtype,T,L", list(_split_cases()))
def test_gradients_match_the_reference_with_split_lists(monkeypatch, pattern, causal, params, D, dtype, T, L, dq):
    """dq: dQ's sums by float32 reductions, or dQ by its own pass over the forward list."""
    from attnbench.bwd_config import DQ_ENV, SPLIT_ENV

    monkeypatch.setenv(SPLIT_ENV, str(L))
    monkeypatch.setenv(DQ_ENV, dq)
    mask = make_mask(pattern, T, causal, **params)
    prob = Problem(mask, 2, 3, D, dtype, pass_name="bwd")
    q, k, v, do = _inputs(prob, seed=T + D + L)
    runner = IMPL.prepare(prob, q, k, v, do=do)
    st = runner.setup
    assert st["bwd_items"] >= st["bwd_split_tiles"] >= 0 and "bwd_items_build_s" in st and st["bwd_dq"] == dq
    if L > 0:
        assert st["bwd_split"] == L and st["bwd_split_tiles"] > 0, st
    else:
        assert st["bwd_split_tiles"] == 0 and st["bwd_split"] > 3, st
    for _ in range(2):  # the second run: the accumulators zeroed again
        runner.poison()
        runner.run()
        _check_grads(prob, runner.grads, q, k, v, do)


@pytest.mark.gpu
@pytest.mark.parametrize("D,shape", [(128, "NWARPS=4,MINB=2"), (128, "NWARPS=8,MINB=1"), (64, "NWARPS=8,MINB=1"),
                                     (64, "NWARPS=8,MINB=1,PAIRS=2"), (64, "NWARPS=4,MINB=2")],
                         ids=["D128-one-warpgroup", "D128-two-warpgroups", "D64-two-warpgroups",
                              "D64-two-warpgroups-dq-in-flight", "D64-one-warpgroup"])
@pytest.mark.parametrize("pattern,causal,params,T", [
    ("dense", True, {}, 1000), ("streaming", True, dict(sink=16, window=64), 777),
    ("document", False, dict(doc_lens=(1, 300, 476)), 777), ("dilated", False, dict(window=33, dilation=3), 1000),
    ("block_diagonal", False, dict(block=16), 1008)])
@pytest.mark.parametrize("dq", ["atomic", "pass"])
def test_both_wgmma_shapes_match_the_reference(monkeypatch, pattern, causal, params, T, D, shape, dq):
    """fast-tc's wgmma backward with one warpgroup on 64-key tiles and with two on 128-key tiles (a
    64-column panel of dQ each at D=128, dQ's column halves at D=64), split lists included (L=2);
    dq "pass": the main loop without dQ, dQ by the mma.sync build's pass."""
    from attnbench.bwd_config import DQ_ENV, SHAPE_ENV, SPLIT_ENV

    if not IMPL.uses_wgmma():
        pytest.skip("the wgmma backward runs on sm_90")
    monkeypatch.setenv(SHAPE_ENV, shape)
    monkeypatch.setenv(DQ_ENV, dq)
    mask = make_mask(pattern, T, causal, **params)
    for L in ("2", ""):
        monkeypatch.setenv(SPLIT_ENV, L)
        prob = Problem(mask, 2, 3, D, "bfloat16" if D == 128 else "float16", pass_name="bwd")
        q, k, v, do = _inputs(prob, seed=T + len(L))
        runner = IMPL.prepare(prob, q, k, v, do=do)
        assert "WG=1" in runner.setup["bwd_tile_config"]
        assert ("NWARPS=8,BN=128" in runner.setup["bwd_tile_config"]) == shape.startswith("NWARPS=8")
        assert runner.setup["bwd_dq"] == dq and ("bwd_dq_tile_config" in runner.setup) == (dq == "pass")
        runner.poison()
        runner.run()
        _check_grads(prob, runner.grads, q, k, v, do)


@pytest.mark.gpu
@pytest.mark.parametrize("D", DIMS)
@pytest.mark.parametrize("pattern,causal,params,T", [
    ("dense", True, {}, 1000), ("streaming", True, dict(sink=16, window=64), 777),
    ("document", False, dict(doc_lens=(1, 300, 476)), 777), ("dilated", False, dict(window=33, dilation=3), 1000),
    ("block_diagonal", False, dict(block=16), 1008), ("bigbird", True, {}, 1536)])
def test_the_fused_launch_matches_the_reference(monkeypatch, pattern, causal, params, T, D):
    """dq "fused": one warpgroup's items and dQ's pass's blocks in one launch after prep, split lists
    included (L=2), run twice on poisoned outputs."""
    from attnbench.bwd_config import DQ_ENV, SPLIT_ENV

    if not IMPL.uses_wgmma():
        pytest.skip("the fused launch runs on sm_90")
    monkeypatch.setenv(DQ_ENV, "fused")
    mask = make_mask(pattern, T, causal, **params)
    for L in ("2", ""):
        monkeypatch.setenv(SPLIT_ENV, L)
        prob = Problem(mask, 2, 3, D, "bfloat16" if D == 128 else "float16", pass_name="bwd")
        q, k, v, do = _inputs(prob, seed=T + len(L) + D)
        runner = IMPL.prepare(prob, q, k, v, do=do)
        st = runner.setup
        assert st["bwd_dq"] == "fused" and st["bwd_tile_config"].startswith("NWARPS=4,BN=64,")
        assert st["bwd_launches"] == "prep,fused" + (",convert" if st["bwd_split_tiles"] else ""), st
        for _ in range(2):
            runner.poison()
            runner.run()
            _check_grads(prob, runner.grads, q, k, v, do)


@pytest.mark.gpu
@pytest.mark.parametrize("dq", ["atomic", "pass"])
@pytest.mark.parametrize("impl", [IMPL, SYNC_IMPL], ids=["fast-tc", "fast-tc-sync"])
@pytest.mark.parametrize("pattern,params,T", [("dense", {}, 1000), ("streaming", dict(sink=16, window=64), 777),
                                              ("dilated", dict(window=33, dilation=5), 1000)])
def test_fwd_plus_bwd_recomputes_the_forward_each_run(monkeypatch, impl, pattern, params, T, dq):
    from attnbench.bwd_config import DQ_ENV

    monkeypatch.setenv(DQ_ENV, dq)
    mask = make_mask(pattern, T, True, **params)
    for D, dtype in ((64, "float16"), (128, "bfloat16")):
        prob = Problem(mask, 2, 3, D, dtype, pass_name="fwd+bwd")
        q, k, v, do = _inputs(prob, seed=5)
        runner = impl.prepare(prob, q, k, v, do=do)
        runner.poison()
        assert runner.out is not None
        runner.run()
        _check_grads(prob, runner.grads, q, k, v, do, out=runner.out)


@pytest.mark.gpu
@pytest.mark.parametrize("wgmma", [True, False], ids=["fast-tc", "fast-tc-sync"])
def test_the_forward_saves_the_rows_log_sum_exp(wgmma):
    import cupy

    from attnbench.arrays import random_inputs, to_float32
    from attnbench.fast_tc import forward_lse
    from attnbench.reference import reference_forward, rel_error

    for pattern, T, causal, params in (("dense", 1000, True, {}), ("streaming", 777, True, dict(sink=16, window=64)),
                                       ("dilated", 1000, False, dict(window=16, dilation=3)),
                                       ("bigbird", 1024, True, {})):
        mask = make_mask(pattern, T, causal, **params)
        for D, dtype in ((64, "bfloat16"), (128, "float16")):
            q, k, v = random_inputs((2, 3, T, D), dtype, seed=11)
            o, lse = forward_lse(mask, q, k, v, dtype=dtype, wgmma=wgmma)
            ref_o, ref_lse = reference_forward(q, k, v, mask, dtype)
            assert lse.dtype == cupy.float32 and lse.shape == (2, 3, T)
            assert rel_error(to_float32(o, dtype), ref_o) <= {"bfloat16": 1e-2, "float16": 5e-3}[dtype]
            assert float(cupy.abs(lse.astype(cupy.float64) - ref_lse).max()) < 2e-3, (pattern, D, dtype)


@pytest.mark.gpu
def test_the_low_level_api_gives_the_runners_gradients():
    from attnbench.fast_tc import backward, forward_lse

    mask = make_mask("window", 300, True, window=64)
    prob = Problem(mask, 1, 2, 64, "bfloat16", scale=0.3)
    q, k, v, do = _inputs(prob, seed=3)
    o, lse = forward_lse(mask, q, k, v, 0.3, dtype="bfloat16")
    grads = backward(mask, q, k, v, o, lse, do, 0.3, dtype="bfloat16")
    _check_grads(prob, grads, q, k, v, do)
    with pytest.raises(BadInput, match="lse must be"):
        backward(mask, q, k, v, o, lse[:, :1], do, 0.3, dtype="bfloat16")
    with pytest.raises(BadInput, match="do has shape"):
        backward(mask, q, k, v, o, lse, do[:, :1], 0.3, dtype="bfloat16")


# ---- GPU: autograd -----------------------------------------------------------------------------
def _layer(torch, E: int, H: int, D: int, seed: int):
    torch.manual_seed(seed)
    qkv = torch.nn.Linear(E, 3 * H * D, bias=False, device="cuda")
    out = torch.nn.Linear(H * D, E, bias=False, device="cuda")
    return torch.nn.ModuleList([qkv, out])


def _apply(layer, x, attn, H: int, D: int):
    import torch

    B, T, _ = x.shape
    q, k, v = layer[0](x).view(B, T, 3, H, D).permute(2, 0, 3, 1, 4)  # each [B, H, T, D], strided
    o = attn(*(t.to(torch.bfloat16) for t in (q, k, v))).float()
    return layer[1](o.transpose(1, 2).reshape(B, T, H * D))


@pytest.mark.gpu
def test_training_through_attention_follows_sdpa():
    """A projection + attention + projection layer learns a random teacher with SGD, once with
    attnbench.attention (dense causal, our backward) and once with SDPA, from the same weights: the
    first gradients agree, both losses fall and the curves agree."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    import attnbench

    B, T, E, H, D, steps = 4, 256, 64, 2, 64, 300
    ours = lambda q, k, v: attnbench.attention(q, k, v, pattern="dense", causal=True)  # noqa: E731
    sdpa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(B, T, E, device="cuda", generator=g)
    with torch.no_grad():
        y = _apply(_layer(torch, E, H, D, seed=1), x, sdpa, H, D) * 4
    curves, first = {}, {}
    for name, attn in (("ours", ours), ("sdpa", sdpa)):
        layer = _layer(torch, E, H, D, seed=2)
        opt = torch.optim.SGD(layer.parameters(), lr=0.5, momentum=0.9)
        losses = []
        for step in range(steps):
            opt.zero_grad()
            loss = F.mse_loss(_apply(layer, x, attn, H, D), y) / y.var()
            loss.backward()
            if step == 0:
                first[name] = layer[0].weight.grad.detach().clone()
            opt.step()
            losses.append(loss.item())
        curves[name] = np.array(losses)
    a, b = first["ours"], first["sdpa"]
    assert float((a - b).norm() / b.norm()) < 2e-2  # the q, k, v projections' gradient: our backward
    for c in curves.values():
        assert np.isfinite(c).all() and c[-10:].mean() < 0.8 * c[0], c[::30]
    gap = np.abs(curves["ours"] - curves["sdpa"]) / curves["sdpa"]
    assert gap.max() < 0.05, (gap.max(), curves["ours"][::30], curves["sdpa"][::30])


@pytest.mark.gpu
def test_attention_returns_a_tensor_in_the_graph_only_when_asked():
    torch = pytest.importorskip("torch")

    import attnbench

    q, k, v = (torch.randn(1, 2, 100, 64, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
    out = attnbench.attention(q, k, v, pattern="window", window=16)
    assert out.requires_grad and out.grad_fn is not None and out.dtype == torch.float16
    out.float().square().sum().backward()
    assert all(t.grad is not None and t.grad.shape == t.shape and torch.isfinite(t.grad).all() for t in (q, k, v))
    with torch.no_grad():
        plain = attnbench.attention(q, k, v, pattern="window", impl="fast-tc", window=16)
    assert plain.grad_fn is None and float((plain - out.detach()).abs().max()) < 1e-2
    with pytest.raises(BadInput, match="dtype=torch.float32"):
        attnbench.attention(*(t.float() for t in (q, k, v)), pattern="window", window=16)



@pytest.mark.gpu
@pytest.mark.parametrize("wgmma", [True, False], ids=["wgmma", "mma.sync"])
@pytest.mark.parametrize("T,causal,D", [(64, False, 64), (128, True, 64), (1000, True, 128)])
def test_the_backward_stage_by_stage(T, causal, D, wgmma):
    """Each stage against the reference on its own, so that a failure says which one is wrong: the
    forward's output and log-sum-exp, the prep's (lse log2 e, delta), then dV (P alone), dK, dQ; the
    main loop of fast-tc (wgmma on sm_90) and of fast-tc-sync."""
    import cupy

    from attnbench import fast_tc_bwd as fb
    from attnbench.arrays import to_float32
    from attnbench.reference import reference_backward, reference_forward, rel_error

    dtype = "bfloat16"
    mask = make_mask("dense", T, causal)
    prob = Problem(mask, 1, 2, D, dtype, pass_name="bwd")
    q, k, v, do = _inputs(prob, seed=5)
    ref_o, _ = reference_forward(q, k, v, mask, dtype)
    rdq, rdk, rdv, rlse, rdelta = reference_backward(q, k, v, do, mask, dtype)
    errs = {}
    for wg in (False, True):  # both forwards; the backward below on the parameter's main loop
        o, lse = fb.forward_lse(mask, q, k, v, dtype=dtype, wgmma=wg)
        errs[f"o{int(wg)}"] = rel_error(to_float32(o, dtype), ref_o)
        errs[f"lse{int(wg)}"] = float(cupy.abs(lse.astype(cupy.float64) - rlse).max())
    bw = fb.Backward(prob, wgmma=wgmma and IMPL.uses_wgmma(), stats=0)  # prep's stats, checked on their own
    grads = tuple(cupy.full(prob.shape, 0x7FC0, dtype=q.dtype) for _ in range(3))
    ld, acc, dkv = bw.scratch()
    prep, *rest = bw.launches(q, k, v, o, lse, do, *grads, ld, acc, dkv)  # then main and convert, or dQ's pass
    assert bw.setup["bwd_launches"].startswith("prep,main")
    prep()
    errs["ld.lse2"] = float(cupy.abs(ld[..., 0].astype(cupy.float64) - rlse * 1.4426950408889634).max())
    delta16 = (to_float32(do, dtype).astype(cupy.float64) * to_float32(o, dtype)).sum(-1)
    errs["ld.delta"] = float(cupy.abs(ld[..., 1] - delta16).max())
    # dQ's float32 accumulator, zeroed by prep; with dQ's own pass there is none (a one-element stand-in)
    errs["acc zeroed"] = float(cupy.abs(acc).max()) if bw.dq_way == "atomic" else float(acc.size != 1)
    if bw.n_split:
        errs["acc zeroed"] = max(errs["acc zeroed"], float(cupy.abs(dkv).max()))
    for ln in rest:
        ln()
    for name, got, want in zip(("dq", "dk", "dv"), grads, (rdq, rdk, rdv)):
        errs[name] = rel_error(to_float32(got, dtype), want)
        g = to_float32(got, dtype).astype(cupy.float64)
        errs[name + " norm ratio"] = float(cupy.linalg.norm(g) / cupy.linalg.norm(want)) if cupy.isfinite(g).all() else -1
    bad = [n for n in ("o0", "o1", "dq", "dk", "dv") if not errs[n] <= 1e-2]
    bad += [n for n in ("lse0", "lse1", "ld.lse2", "ld.delta", "acc zeroed") if not errs[n] <= 2e-2]
    assert not bad, (bad, errs)


# ---- --bwd-config: the backward's fields as a variant of its own (CPU) -------------------------------
def test_bwd_config_parses_fields_and_refuses_bad_ones_by_name():
    from attnbench.bwd_config import parse_bwd_config

    s = parse_bwd_config("dq=1")
    assert str(s) == "DQ=1" and s.dq == "pass" and s.shape == {}
    s = parse_bwd_config("NWARPS=4,MINB=2,DQ=0")
    assert str(s) == "NWARPS=4,MINB=2,DQ=0" and s.dq == "atomic" and s.shape == {"NWARPS": 4, "MINB": 2}
    assert parse_bwd_config("NWARPS=8").dq is None and parse_bwd_config("NWARPS=8").stats is None
    s = parse_bwd_config("DQ=1,STATS=0")
    assert s.dq == "pass" and s.stats == 0 and s.shape == {}
    assert parse_bwd_config("DQ=1,STATS=2").stats == 2
    assert parse_bwd_config("4,2,2,1").stats == 2  # the positional form's default
    assert parse_bwd_config("DQ=2").dq == "fused"
    assert parse_bwd_config("DQ=1,SKIP=0").skip == 0 and parse_bwd_config("DQ=1").skip is None
    assert parse_bwd_config("DQ=1,SKIP=0").shape == {}
    assert parse_bwd_config("DQ=1,PMINB=3").pass_minb == 3 and parse_bwd_config("PMINB=3").shape == {}
    assert parse_bwd_config("PMINB=0").pass_minb is None  # 0: the pass's shape's own
    assert parse_bwd_config("DQ=1,PWG=1").pass_wg == 1 and parse_bwd_config("PWG=0").shape == {}
    assert parse_bwd_config("DQ=1").pass_wg is None
    assert parse_bwd_config("DQ=1,PTMA=1").pass_tma == 1 and parse_bwd_config("PTMA=1").shape == {}
    assert parse_bwd_config("MTMA=1").main_tma == 1 and parse_bwd_config("MTMA=1").shape == {}
    assert parse_bwd_config("DQ=1").main_tma is None
    assert parse_bwd_config("DQ=1,PPER=1").pass_persist == 1 and parse_bwd_config("PPER=1").shape == {}
    assert parse_bwd_config("MPER=1").main_persist == 1 and parse_bwd_config("MPER=1").shape == {}
    assert parse_bwd_config("DQR=1").dq_bulk == 1 and parse_bwd_config("DQR=1").shape == {}
    assert parse_bwd_config("DQR=2").dq_bulk == 2 and parse_bwd_config("DQR=2").shape == {}
    assert parse_bwd_config("DQ=0").dq_bulk is None
    assert parse_bwd_config("LAG=1").dq_lag == 1 and parse_bwd_config("LAG=1").shape == {}
    assert parse_bwd_config("DQ=0").dq_lag is None
    s = parse_bwd_config("ORDER=1,L=8")
    assert s.order == 1 and s.split == 8 and s.shape == {} and str(s) == "ORDER=1,L=8"
    assert parse_bwd_config("ORDER=1,CUT=8").cut == 8 and parse_bwd_config("CUT=8").shape == {}
    assert parse_bwd_config("L=0").split is None and parse_bwd_config("DQ=1").order is None  # 0: split_length's
    for bad, words in (("DQ=4", "DQ=4 must be from 0 to 3"), ("NWARPS=6", "NWARPS=6 must be a multiple of 4"),
                       ("BN=64", "unknown field 'BN'"), ("8,2", "positional form takes 4 to 19"),
                       ("ORDER=2", "ORDER=2 must be 0 or 1"),
                       ("STATS=3", "STATS=3 must be from 0 to 2"), ("SKIP=2", "SKIP=2 must be 0 or 1"), ("PWG=2", "PWG=2 must be 0 or 1"), ("PTMA=2", "PTMA=2 must be 0 or 1"), ("MTMA=2", "MTMA=2 must be 0 or 1"), ("PPER=2", "PPER=2 must be 0 or 1"), ("MPER=2", "MPER=2 must be 0 or 1"), ("DQR=3", "DQR=3 must be from 0 to 2"), ("LAG=3", "LAG=3 must be from 0 to 2"), ("PAIRS=3", "PAIRS=3 must be from 0 to 2")):
        with pytest.raises(BadInput, match="--bwd-config") as e:
            parse_bwd_config(bad)
        assert words in str(e.value)


def test_a_bwd_variant_is_named_by_its_fields_and_leaves_the_forward_to_its_base():
    from attnbench import sweep as sw
    from attnbench.bwd_config import parse_bwd_config

    spec = parse_bwd_config("NWARPS=4,DQ=1")
    impls = sw.select_impls(["fast-tc", "fast-tc-sync", "flex"], bwd_configs=[spec])
    assert [i.name for i in impls] == ["fast-tc", "fast-tc[bwd:NWARPS=4,DQ=1]", "fast-tc-sync",
                                       "fast-tc-sync[bwd:NWARPS=4,DQ=1]", "flex"]
    v = impls[1]
    assert v.bwd is spec and IMPL.bwd is None and v.passes == IMPL.passes
    mask = make_mask("window", 256, True, window=32)
    assert v.unsupported(Problem(mask, 1, 2, 64, "bfloat16")) == (
        "fast-tc[bwd:NWARPS=4,DQ=1] fixes backward fields: its forward is fast-tc's row")
    assert v.unsupported(Problem(mask, 1, 2, 64, "bfloat16", pass_name="bwd")) is None
    with pytest.raises(BadInput, match="--bwd-config: none of the implementations \\(flex\\) takes backward fields"):
        sw.select_impls(["flex"], bwd_configs=[spec])


def test_the_items_launch_by_position_and_cut_where_a_long_split_leaves_room():
    """Backward v14's default: the split instances at T=32768 (L 91 to 136) and 131072 (362 to 542) take
    the order by position with items of 8 query tiles; at T=4096 (L 12 to 16, measured slower there) the items
    stay longest first and whole; since v20 unsplit lists past that L launch by position too, uncut."""
    from attnbench.bwd_config import ITEM_CUT, ITEM_ORDER, default_item_layout

    assert (ITEM_ORDER, ITEM_CUT) == (1, 8)
    assert default_item_layout(91, True) == (1, 8) and default_item_layout(542, True) == (1, 8)
    assert default_item_layout(12, True) == (0, 0) and default_item_layout(16, True) == (0, 0)
    assert default_item_layout(17, True) == (1, 8)
    # where nothing is split, by position too from the same L (backward v20: document's lists), never cut
    assert default_item_layout(362, False) == (1, 0) and default_item_layout(17, False) == (1, 0)
    assert default_item_layout(16, False) == (0, 0)


@pytest.mark.gpu
@pytest.mark.parametrize("text,words", [("DQ=1,SKIP=1,PWG=1", "SKIP=1 is not built by dQ's pass on wgmma"),
                                        ("DQ=1,PPER=1,PTMA=1", "PPER=1 loads the pass's tiles by cp.async"),
                                        ("DQ=1,PPER=1,PWG=0", "PPER=1 is built for dQ's own pass on wgmma"),
                                        ("DQ=2,MTMA=1", "DQ=2.*cp.async.*MTMA=0"),
                                        ("DQ=2,MPER=1", "MPER=1 runs the main loop's work items one after"),
                                        ("DQ=1,DQR=1", "DQR=1 adds the dQ sums.*dq=pass"),
                                        ("DQ=0,MTMA=0,DQR=1", "DQR=1 adds the dQ sums.*give it with DQ=0 and MTMA=1"),
                                        ("NWARPS=8,MINB=1,DQ=0,PAIRS=2,DQR=1", "DQR=1 stages a pair's dQ"),
                                        ("NWARPS=8,MINB=1,DQ=0,DQR=2", "DQR=2 stages dQ one query tile at a time.*"
                                                                       "PAIRS=0"),
                                        ("DQ=1,DQR=2", "DQR=2 adds the dQ sums.*dq=pass"),
                                        ("NWARPS=8,MINB=1,DQ=0,LAG=1", "LAG=1 takes dQ one query tile at a time.*"
                                                                       "PAIRS=0"),
                                        ("DQ=1,LAG=1", "LAG=1 takes dQ a tile behind.*dq=pass"),
                                        ("DQ=0,LAG=1", "LAG=1 takes dQ a tile behind.*NWARPS=8.*NWARPS=4"),
                                        ("NWARPS=8,MINB=1,DQ=0,PAIRS=0,MTMA=0,LAG=1", "LAG=1.*MTMA=1"),
                                        ("NWARPS=8,MINB=1,DQ=0,PAIRS=0,MPER=1,LAG=1", "LAG=1.*MPER=0.*PERSIST=1")])
def test_the_wgmma_kernels_refuse_what_they_do_not_build_before_any_launch(text, words):
    """SKIP=1 is the mma.sync pass's: with the pass on wgmma (PWG=1) it is refused by name; so is a persistent
    pass by bulk copies or on mma.sync, and the fused launch by bulk copies; and dQ by bulk reductions where the
    main loop does not sum dQ, loads by cp.async or keeps a pair's dQ in flight, and dQ from two sets of staging
    buffers (DQR=2) where two warpgroups pair their query tiles; and dQ a tile behind (LAG=1) where the main loop is not
    two warpgroups summing dQ one query tile at a time by bulk copies, one work item a block."""
    from attnbench.bwd_config import parse_bwd_config

    if not IMPL.uses_wgmma():
        pytest.skip("the wgmma pass runs beside the wgmma main loop (sm_90)")
    mask = make_mask("streaming", 777, True, sink=16, window=64)
    prob = Problem(mask, 1, 2, 64, "bfloat16", pass_name="bwd")
    q, k, v, do = _inputs(prob, seed=3)
    with pytest.raises(BadInput, match=words):
        IMPL.bwd_variant(parse_bwd_config(text)).prepare(prob, q, k, v, do=do)


def test_two_warpgroups_summing_dq_at_d64_keep_a_pairs_products_in_flight_by_default():
    """default_pairs: ATOMIC_PAIRS where two warpgroups at D=64 sum dQ in the main loop; a given PAIRS wins; bulk
    reductions (DQR=1), dQ's pass, D=128 and one warpgroup keep the shape's."""
    from attnbench.bwd_config import ATOMIC_PAIRS, default_pairs

    assert ATOMIC_PAIRS == 2
    two, one = BWD_SHAPES_WG2[64][0], BWD_SHAPES_WG[64][0]
    assert default_pairs(64, two, "atomic", {}, None) == 2
    assert default_pairs(64, two, "atomic", {"PAIRS": 1}, None) == 1 and default_pairs(64, two, "atomic", {"PAIRS": 0}, None) == 1
    assert default_pairs(64, two, "atomic", {}, 1) == 1  # DQR=1 stages a pair's dQ once done
    assert default_pairs(64, two, "atomic", {}, 0) == 2
    assert default_pairs(64, two, "pass", {}, None) == 1 and default_pairs(64, two, "store", {}, None) == 1
    assert default_pairs(128, BWD_SHAPES_WG2[128][0], "atomic", {}, None) == 1
    assert default_pairs(64, one, "atomic", {}, None) == 1


def test_two_warpgroups_summing_dq_at_d128_stage_it_in_two_sets_of_buffers_by_default():
    """default_dq_bulk: DQR=2 where two warpgroups at D=128 sum dQ in the main loop (dense causal at T=131072);
    one warpgroup, D=64 (paired or not) and the pass's shapes keep red.global.add (0)."""
    import dataclasses

    from attnbench.bwd_config import MAIN_DQ_BULK, default_dq_bulk

    assert MAIN_DQ_BULK == {64: 0, 128: 2}
    assert default_dq_bulk(128, BWD_SHAPES_WG2[128][0]) == 2
    assert default_dq_bulk(128, BWD_SHAPES_WG[128][0]) == 0
    assert default_dq_bulk(64, BWD_SHAPES_WG2[64][0]) == 0
    assert default_dq_bulk(64, dataclasses.replace(BWD_SHAPES_WG2[64][0], PAIRS=0)) == 0
    assert default_dq_bulk(64, BWD_SHAPES_WG[64][0]) == 0
    # two sets of 16 KiB panels a warpgroup beside the 128-key tiles still fit one block a multiprocessor
    cfg = dataclasses.replace(BWD_SHAPES_WG2[128][0], TMA=1, DQR=2)
    assert cfg.smem_bytes(128) == dataclasses.replace(cfg, DQR=1).smem_bytes(128) + 2 * 64 * 64 * 4
    assert cfg.smem_bytes(128) + 1024 <= 228 * 1024 and cfg.spec.endswith(",TMA=1,DQR=2")


@pytest.mark.gpu
def test_dq_summed_by_two_warpgroups_at_d128_takes_dqr_2_and_matches_the_reference():
    """DQ=0 at D=128 on a long list: two warpgroups, bulk copies, dQ's panels by bulk reductions from two sets of
    staging buffers (the default there), through the gate at an odd T; DQR=0 given keeps red.global.add."""
    from attnbench.bwd_config import parse_bwd_config

    if not IMPL.uses_wgmma():
        pytest.skip("the wgmma main loop runs on sm_90")
    prob = Problem(make_mask("dense", 901, True), 2, 3, 128, "bfloat16", pass_name="bwd")
    q, k, v, do = _inputs(prob, seed=11)
    for text, marker in (("DQ=0", ",DQR=2"), ("DQ=0,DQR=0", "")):
        runner = IMPL.bwd_variant(parse_bwd_config(text)).prepare(prob, q, k, v, do=do)
        cfg = runner.setup["bwd_tile_config"]
        assert runner.setup["bwd_dq"] == "atomic" and cfg.startswith("NWARPS=8,") and ",TMA=1" in cfg, cfg
        assert (",DQR=" in cfg) == bool(marker) and (not marker or cfg.endswith(marker)), cfg
        for _ in range(2):
            runner.poison()
            runner.run()
            _check_grads(prob, runner.grads, q, k, v, do)


def test_the_variants_fields_win_over_the_environments(monkeypatch):
    from attnbench.bwd_config import SHAPE_ENV

    monkeypatch.setenv(SHAPE_ENV, "NWARPS=8,MINB=1")
    cfg = choose_bwd_config(64, True, "pass", keys_per_query=4096, fields={"NWARPS": 4, "MINB": 2})
    assert (cfg.NWARPS, cfg.MINB, cfg.WG) == (4, 2, 1)


@pytest.mark.gpu
@pytest.mark.parametrize("text, dq, nwarps", [("DQ=1", "pass", None), ("NWARPS=4,MINB=2,DQ=1", "pass", 4),
                                              ("NWARPS=8,MINB=1,DQ=0", "atomic", 8),
                                              ("NWARPS=8,MINB=1,DQ=0,PAIRS=0", "atomic", 8),
                                              ("NWARPS=8,MINB=1,DQ=0,PAIRS=1", "atomic", 8),
                                              ("NWARPS=8,MINB=1,DQ=0,PAIRS=2", "atomic", 8), ("DQ=1,STATS=0", "pass", None),
                                              ("DQ=1,STATS=1", "pass", None), ("DQ=1,STATS=2", "pass", None),
                                              ("DQ=2", "fused", 4), ("DQ=1,SKIP=0", "pass", None),
                                              ("DQ=1,SKIP=1,PWG=0", "pass", None), ("DQ=1,SKIP=1,PMINB=3,PWG=0", "pass", None),
                                              ("ORDER=1,L=4", "pass", None), ("DQ=0,ORDER=1,L=3", "atomic", None),
                                              ("ORDER=1,CUT=2", "pass", None), ("DQ=1,PWG=1", "pass", None),
                                              ("DQ=1,PWG=1,STATS=0", "pass", None), ("DQ=1,PWG=1,STATS=1", "pass", None),
                                              ("DQ=1,PWG=0", "pass", None), ("DQ=1,PWG=1,PMINB=4", "pass", None),
                                              ("DQ=1,PTMA=1", "pass", None), ("DQ=1,PTMA=1,STATS=0", "pass", None),
                                              ("DQ=1,PTMA=1,STATS=1", "pass", None), ("DQ=1,PTMA=0", "pass", None),
                                              ("DQ=1,MTMA=1", "pass", None), ("DQ=0,MTMA=1", "atomic", None),
                                              ("NWARPS=8,MINB=1,DQ=0,MTMA=1", "atomic", 8),
                                              ("NWARPS=8,MINB=1,DQ=0,PAIRS=2,MTMA=1", "atomic", 8),
                                              ("DQ=1,MTMA=1,PTMA=0,STATS=0", "pass", None),
                                              ("DQ=1,PPER=1", "pass", None), ("DQ=1,PPER=1,STATS=0", "pass", None),
                                              ("DQ=1,PPER=1,STATS=1", "pass", None), ("MPER=1", "pass", None),
                                              ("DQ=0,MPER=1", "atomic", None),
                                              ("NWARPS=8,MINB=1,DQ=0,MPER=1", "atomic", 8),
                                              ("NWARPS=8,MINB=1,DQ=0,PAIRS=2,MPER=1", "atomic", 8),
                                              ("DQ=1,MPER=1,PPER=1", "pass", None), ("MPER=1,MTMA=1", "pass", None),
                                              ("NWARPS=8,MINB=1,DQ=0,MPER=1,MTMA=1", "atomic", 8),
                                              ("DQ=1,MTMA=0", "pass", None), ("NWARPS=8,MINB=1,DQ=0,MTMA=0", "atomic", 8),
                                              ("MPER=1,MTMA=0", "pass", None), ("DQ=0,DQR=1", "atomic", None),
                                              ("NWARPS=8,MINB=1,DQ=0,DQR=1", "atomic", 8),
                                              ("NWARPS=8,MINB=1,DQ=0,PAIRS=0,DQR=1", "atomic", 8),
                                              ("DQ=0,DQR=2", "atomic", None),
                                              ("NWARPS=8,MINB=1,DQ=0,PAIRS=0,DQR=2", "atomic", 8)])
@pytest.mark.parametrize("split", ["", "0"], ids=["split-as-chosen", "nothing-split"])
def test_a_bwd_variant_runs_its_fields_and_matches_the_reference(monkeypatch, text, dq, nwarps, split):
    from attnbench.bwd_config import PASS_SKIP, PASS_STATS_FROM, PASS_STATS_SPLIT, SPLIT_ENV, parse_bwd_config

    monkeypatch.setenv(SPLIT_ENV, split)  # "": the split the GPU gets (the sink's key tile 0 is split)
    from attnbench.bwd_config import PERSIST_BLOCKS_ENV

    monkeypatch.setenv(PERSIST_BLOCKS_ENV, "5")  # a persistent launch's blocks take several works each

    v = IMPL.bwd_variant(parse_bwd_config(text))
    mask = make_mask("streaming", 777, True, sink=16, window=64)
    prob = Problem(mask, 2, 3, 64, "bfloat16", pass_name="bwd")
    q, k, v_, do = _inputs(prob, seed=5)
    runner = v.prepare(prob, q, k, v_, do=do)
    assert runner.setup["bwd_dq"] == dq
    if nwarps is not None:
        assert runner.setup["bwd_tile_config"].startswith(f"NWARPS={nwarps},")
    # the launches in order: where the pass computes the stats (STATS=1 or 2, or by default where nothing
    # is split) it goes first, and prep runs on no row, only to zero a split key tile's accumulators ("zero")
    cut = runner.setup["bwd_split_tiles"] > 0
    given_L = dict(parse_bwd_config(text).given).get("L")
    assert not (cut and split == "0" and not given_L)  # the variant's L wins over the environment's
    if given_L:
        assert cut and runner.setup["bwd_split"] == given_L
    # the items' order and cut: the variant's fields, else the default layout for the split this GPU gets
    from attnbench.bwd_config import default_item_layout
    fields = dict(parse_bwd_config(text).given)
    d_order, d_cut = default_item_layout(runner.setup["bwd_split"], cut)
    assert runner.setup["bwd_items_order"] == fields.get("ORDER", d_order)
    assert runner.setup["bwd_items_cut"] == fields.get("CUT", d_cut)
    given = dict(parse_bwd_config(text).given).get("STATS")
    stats = 0 if dq != "pass" else (given if given is not None else
                                      PASS_STATS_FROM if not cut or PASS_STATS_SPLIT[64] else 0)
    want = ("prep,main,convert" if dq == "atomic" else "prep,fused" + (",convert" if cut else "") if dq == "fused" else
            ("zero," if cut else "") + "dq_pass,main" + (",convert" if cut else "") if stats else
            "prep,main,dq_pass" + (",convert" if cut else ""))
    assert runner.setup["bwd_launches"] == want
    assert runner.setup.get("bwd_pass_stats") == (None if dq == "atomic" else stats)
    from attnbench.bwd_config import PASS_WG
    pass_wg = IMPL.uses_wgmma() and dq == "pass" and fields.get("PWG", PASS_WG)
    skip = 0 if pass_wg else dict(parse_bwd_config(text).given).get("SKIP", PASS_SKIP[64])
    assert runner.setup.get("bwd_pass_skip") == (None if dq == "atomic" else skip)
    if dq == "pass":
        from attnbench.bwd_config import PASS_TMA

        assert (",WG=1" in runner.setup["bwd_dq_tile_config"]) == bool(pass_wg)
        from attnbench.bwd_config import PASS_PERSIST

        persist = pass_wg and fields.get("PPER", PASS_PERSIST)
        assert (",TMA=1" in runner.setup["bwd_dq_tile_config"]) == bool(pass_wg and not persist
                                                                        and fields.get("PTMA", PASS_TMA))
        assert (",PERSIST=1" in runner.setup["bwd_dq_tile_config"]) == bool(persist)
    from attnbench.bwd_config import MAIN_TMA

    from attnbench.bwd_config import MAIN_PERSIST

    main_persist = IMPL.uses_wgmma() and dq != "fused" and fields.get("MPER", MAIN_PERSIST)
    main_tma = IMPL.uses_wgmma() and dq != "fused" and fields.get("MTMA", MAIN_TMA)
    assert (",TMA=1" in runner.setup["bwd_tile_config"]) == bool(main_tma)
    assert (",PERSIST=1" in runner.setup["bwd_tile_config"]) == bool(main_persist)
    from attnbench.bwd_config import MAIN_DQ_BULK

    bulk = fields.get("DQR", MAIN_DQ_BULK[64] if nwarps == 8 and fields.get("PAIRS") == 0 else 0) if main_tma and dq == "atomic" and fields.get("PAIRS") != 2 else 0
    for n in (1, 2):
        assert (f",DQR={n}" in runner.setup["bwd_tile_config"]) == (bulk == n)
    # two warpgroups summing dQ at D=64: the pair's products in flight by default (ATOMIC_PAIRS), unless given
    from attnbench.bwd_config import ATOMIC_PAIRS

    paired = IMPL.uses_wgmma() and dq == "atomic" and nwarps == 8
    pairs = fields.get("PAIRS", ATOMIC_PAIRS if paired and not fields.get("DQR") else 1)
    assert (f",PAIRS={pairs}" in runner.setup["bwd_tile_config"]) == (pairs != 1), runner.setup["bwd_tile_config"]
    runner.poison()
    runner.run()
    _check_grads(prob, runner.grads, q, k, v_, do)
