"""fast-tc: compiles cleanly for sm_80 / sm_90 (CPU, NVRTC), and passes the gate on the GPU."""
from dataclasses import replace

import pytest

from attnbench.compile import compile_only
from attnbench.fwd_config import (CONFIGS, HOPPER_CONFIGS, HOPPER_LONG_CONFIGS, HOPPER_PARTIAL_CONFIGS,
                                  HOPPER_STRIDED_MINB, LONG_KEYS_PER_ROW, HOPPER_WIDE_CONFIGS, PARTIAL_CONFIGS,
                                  WIDE_CONFIGS, TileConfig, choose_config, kernel_defines)
from attnbench.fast_tc import IMPL, SYNC_IMPL
from attnbench.tiles import tile_list
from attnbench.impls import Problem, get_impl
from attnbench.patterns import BadInput, PATTERNS, make_mask

DTYPES = ("bfloat16", "float16")
DIMS = (64, 128)


def _params_for(pattern: str, T: int) -> dict:
    """Pattern parameters valid at T: the pattern's first example (block sizes dividing T)."""
    return PATTERNS[pattern].examples(T)[0]


# ---- CPU: NVRTC ----------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_90a"])
@pytest.mark.parametrize("D", DIMS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pattern", ["dense", "dilated", "bigbird", "streaming", "document"])
def test_compiles_without_spills(arch, D, dtype, pattern):
    """Every shape either table picks (sm_90a: the wgmma shapes) compiles without spills."""
    mask = make_mask(pattern, 4096, True, **({"window": 64} if pattern == "streaming" else {}))
    cfg = choose_config(mask, D, wgmma=arch == "sm_90a")
    assert cfg.WG == (arch == "sm_90a")
    reports = compile_only("fast_tc", kernel_defines(D, dtype, mask, cfg), arch)
    assert [r.kernel for r in reports] == ["fast_tc_fwd"]
    r = reports[0]
    assert r.arch == arch
    assert 0 < r.registers <= 255
    assert (r.spill_stores, r.spill_loads, r.stack) == (0, 0, 0), r


@pytest.mark.parametrize("D", DIMS)
@pytest.mark.parametrize("wgmma", [False, True])
def test_config_follows_the_tile_list(D, wgmma):
    # these patterns reach the three shapes the compile test above covers
    default, wide, partial = ((HOPPER_CONFIGS, HOPPER_WIDE_CONFIGS, HOPPER_PARTIAL_CONFIGS) if wgmma
                              else (CONFIGS, WIDE_CONFIGS, PARTIAL_CONFIGS))
    long = HOPPER_LONG_CONFIGS[D] if wgmma else wide[D]
    assert choose_config(make_mask("dense", 4096, True), D, wgmma) == (long if D == 128 else wide[D])
    # rows averaging LONG_KEYS_PER_ROW keys take the long shape on sm_90 (two warpgroups, 128-key tiles), unstrided
    assert choose_config(make_mask("dense", 2 * LONG_KEYS_PER_ROW[D], True), D, wgmma) == long
    assert choose_config(make_mask("window", 2 * LONG_KEYS_PER_ROW[D], True, window=LONG_KEYS_PER_ROW[D] - 64), D,
                         wgmma) == wide[D]
    # a custom expression (the user's predicate) where the long shape's registers allow it
    every = choose_config(make_mask("custom", 2 * LONG_KEYS_PER_ROW[D], True, expr="j >= 0"), D, wgmma)
    assert every == (long if (D == 128 or not wgmma) else wide[D])
    strided = choose_config(make_mask("dilated", 8 * LONG_KEYS_PER_ROW[D], True, window=4 * LONG_KEYS_PER_ROW[D],
                                      dilation=2), D, wgmma)
    assert strided.NWARPS == wide[D].NWARPS and strided.BN == wide[D].BN
    dilated = choose_config(make_mask("dilated", 4096, True), D, wgmma)
    assert replace(dilated, MINB=partial[D].MINB) == partial[D]
    # strided patterns keep cp.async on sm_90: there the allocator is asked for more blocks per SM
    assert dilated.MINB == (max(partial[D].MINB, HOPPER_STRIDED_MINB.get(D, 0)) if wgmma else partial[D].MINB)
    assert choose_config(make_mask("streaming", 4096, True, window=64), D, wgmma) == partial[D]
    assert choose_config(make_mask("bigbird", 4096, True), D, wgmma) == default[D]
    assert choose_config(make_mask("block_diagonal", 4096, False, block=128), D, wgmma) == default[D]
    assert {c.WG for c in (default[D], wide[D], partial[D])} == {int(wgmma)}


def test_registered_and_refuses_other_head_dims(monkeypatch):
    # pretend a device is there, so the refusal comes from D, not from the machine
    monkeypatch.setattr(type(IMPL), "availability", lambda self: None)
    assert get_impl("fast-tc") is IMPL and get_impl("fast-tc-sync") is SYNC_IMPL
    assert IMPL.family == "attnbench" and set(IMPL.dtypes) == set(DTYPES) == set(SYNC_IMPL.dtypes)
    assert IMPL.wgmma and not SYNC_IMPL.wgmma
    mask = make_mask("window", 256, True)
    for D in DIMS:
        assert IMPL.unsupported(Problem(mask, 1, 1, D, "bfloat16")) is None
    why = IMPL.unsupported(Problem(mask, 1, 1, 96, "bfloat16"))
    assert why and "D=96" in why and "64" in why and "128" in why
    assert "float32" in IMPL.unsupported(Problem(mask, 1, 1, 64, "float32"))
    with pytest.raises(BadInput, match="D=32"):
        IMPL.require(Problem(mask, 1, 1, 32, "float16"))


def test_tile_list_is_cached_per_mask_and_shape():
    a = make_mask("streaming", 1000, True)
    b = make_mask("streaming", 1000, True)
    cfg = CONFIGS[64]
    t1 = tile_list(a, cfg.BM, cfg.BN)
    assert tile_list(b, cfg.BM, cfg.BN) is t1
    assert tile_list(make_mask("streaming", 1000, False), cfg.BM, cfg.BN) is not t1
    assert tile_list(a, cfg.BM, 2 * cfg.BN) is not t1


def test_defines_fix_the_pattern_and_dtype():
    m = make_mask("streaming", 4096, False, sink=4, window=512)
    d = kernel_defines(128, "float16", m)
    assert (d["HEAD_D"], d["AB_F16"], d["CAUSAL"], d["STRIDE"]) == (128, 1, 0, 1)
    assert (d["AB_PATTERN_T"], d["AB_PATTERN_ARGS"]) == ("ab_streaming", "0,4,512")
    assert kernel_defines(64, "bfloat16", m)["AB_F16"] == 0


@pytest.mark.parametrize("wgmma", [False, True])
def test_block_patterns_compile_the_causal_clause_alone_when_tiles_divide_their_blocks(wgmma):
    """BigBird with 64-key blocks at 64 x 64 tiles: partial tiles lie on the diagonal, the kernel
    gets dense's predicate (no random-block table lookups); 16-key blocks in 32-key tiles keep theirs."""
    bb = make_mask("bigbird", 4096, True)
    cfg = choose_config(bb, 64, wgmma)
    assert 64 % cfg.BM == 0 and 64 % cfg.BN == 0
    d = kernel_defines(64, "bfloat16", bb, cfg)
    assert (d["AB_PATTERN_T"], d["AB_PATTERN_ARGS"], d["CAUSAL"]) == ("ab_dense", "1", 1)
    bd = make_mask("block_diagonal", 4096, False, block=16)
    cfg = TileConfig(NWARPS=4, BN=32, STAGES=3, WG=int(wgmma))
    d = kernel_defines(64, "bfloat16", bd, cfg)
    assert (d["AB_PATTERN_T"], d["AB_PATTERN_ARGS"], d["CAUSAL"]) == ("ab_block_diagonal", "0,16", 0)


def test_dilated_runs_as_a_window_on_each_residue_class():
    m = make_mask("dilated", 4096, True, window=512, dilation=3)
    d = kernel_defines(64, "bfloat16", m)
    assert (d["AB_PATTERN_T"], d["AB_PATTERN_ARGS"], d["STRIDE"]) == ("ab_window", "1,512", 3)
    # the inner window's list: no tile is partial for the stride, only along the diagonal band
    cfg = choose_config(m, 64)
    t = tile_list(m.strided()[1], cfg.BM, cfg.BN)
    assert t.n_partial < t.n_visited


def test_strided_patterns_on_sm90_fit_the_blocks_per_sm_they_ask_for():
    """Dilated's cp.async loads on the wgmma shape at D=64: the registers of MINB blocks per SM
    (allocated in steps of 8 per thread), without spills, at the llm configuration's T."""
    mask = make_mask("dilated", 32768, True, window=512, dilation=2)
    cfg = choose_config(mask, 64, wgmma=True)
    assert cfg.MINB == HOPPER_STRIDED_MINB[64] and cfg.WG == 1
    (r,) = compile_only("fast_tc", kernel_defines(64, "bfloat16", mask, cfg), "sm_90a")
    assert (r.spill_stores, r.spill_loads, r.stack) == (0, 0, 0), r
    assert -(-r.registers // 8) * 8 * cfg.threads * cfg.MINB <= 65536, r


# ---- GPU: the gate -------------------------------------------------------------------------------
TS = (1, 7, 100, 1000, 4096)


def _cases():
    for pattern in PATTERNS:
        for D in DIMS:
            for n, T in enumerate(TS):
                for dtype in DTYPES:
                    # both (B, H) shapes and both causal flags reach every pattern, D and dtype
                    bh = (2, 3) if n % 2 else (1, 1)
                    causal = (dtype == "bfloat16") != (n == 2)
                    yield pytest.param(pattern, D, T, dtype, bh, causal,
                                       id=f"{pattern}-D{D}-T{T}-{dtype}-B{bh[0]}H{bh[1]}-{'c' if causal else 'nc'}")


@pytest.mark.gpu
@pytest.mark.parametrize("impl", [IMPL, SYNC_IMPL], ids=["fast-tc", "fast-tc-sync"])
@pytest.mark.parametrize("pattern,D,T,dtype,bh,causal", list(_cases()))
def test_gate(impl, pattern, D, T, dtype, bh, causal):
    from attnbench.check import gate

    mask = make_mask(pattern, T, causal, **_params_for(pattern, T))
    res = gate(impl, Problem(mask, bh[0], bh[1], D, dtype))
    assert res.ok, res


@pytest.mark.gpu
def test_wgmma_runs_on_sm90_only():
    import cupy

    from attnbench.arrays import random_inputs
    from attnbench.fwd_config import TileConfig

    prob = Problem(make_mask("window", 300, True, window=64), 1, 2, 64, "bfloat16")
    q, k, v = random_inputs(prob.shape, prob.dtype, seed=3)
    hopper = cupy.cuda.Device().compute_capability == "90"
    runner = IMPL.prepare(prob, q, k, v)
    assert runner.cfg.WG == int(hopper)
    # bulk tensor copies with wgmma on unstrided patterns, their maps built at setup
    assert ("tma_maps_s" in runner.setup) == hopper
    assert SYNC_IMPL.prepare(prob, q, k, v).cfg.WG == 0
    assert "tma_maps_s" not in SYNC_IMPL.prepare(prob, q, k, v).setup
    dil = Problem(make_mask("dilated", 300, True, window=16, dilation=3), 1, 2, 64, "bfloat16")
    assert "tma_maps_s" not in IMPL.prepare(dil, q, k, v).setup  # strided: cp.async
    if not hopper:
        with pytest.raises(BadInput, match="sm_90"):
            IMPL.prepare(prob, q, k, v, cfg=TileConfig(4, 64, 2, WG=1))


@pytest.mark.gpu
def test_gate_long_sequence():
    from attnbench.check import gate

    mask = make_mask("streaming", 32768, True, sink=16, window=64)
    res = gate(IMPL, Problem(mask, 1, 1, 64, "bfloat16"))
    assert res.ok, res


@pytest.mark.gpu
def test_rows_without_allowed_keys_in_a_partial_tile_stay_finite():
    """Causal window 64 with 32- or 64-key tiles: the first (partial) tile a query tile visits holds no
    allowed key for its last rows, whose running max is still -inf there."""
    from attnbench.check import gate

    mask = make_mask("window", 777, True, window=64)
    cfg = choose_config(mask, 64)
    t = tile_list(mask, cfg.BM, cfg.BN)
    assert t.n_partial >= t.ptr.size - 2  # several partial tiles, each query tile but the first has two
    res = gate(IMPL, Problem(mask, 1, 2, 64, "float16"))
    assert res.ok, res


@pytest.mark.gpu
def test_setup_is_recorded_and_launch_errors_surface():
    import cupy

    from attnbench.arrays import random_inputs

    mask = make_mask("window", 300, True, window=64)
    prob = Problem(mask, 1, 2, 64, "bfloat16")
    q, k, v = random_inputs(prob.shape, prob.dtype, seed=3)
    runner = IMPL.prepare(prob, q, k, v)
    assert {"tiles_build_s", "tiles_step_s", "compile_s"} <= set(runner.setup)
    assert runner.setup["tiles_step_s"] >= runner.setup["tiles_rebuild_s"] > 0
    runner.run()
    cupy.cuda.get_current_stream().synchronize()
    with pytest.raises(BadInput, match="shape"):
        IMPL.prepare(prob, q[:, :1], k, v)
    # a grid the device refuses raises instead of failing silently
    runner._grid = (1, 1 << 20)
    with pytest.raises(cupy.cuda.driver.CUDADriverError):
        runner.run()


@pytest.mark.gpu
@pytest.mark.parametrize("T,window,dilation,causal", [
    (1000, 64, 3, True), (1000, 100, 3, False), (4097, 512, 2, True), (777, 33, 5, False), (7, 4, 9, True),
])
def test_gate_strided(T, window, dilation, causal):
    """Dilated runs one grid layer per residue class; classes of unequal length (T % r != 0) and
    more classes than positions (r > T) included."""
    from attnbench.check import gate

    mask = make_mask("dilated", T, causal, window=window, dilation=dilation)
    for D in DIMS:
        for impl in (IMPL, SYNC_IMPL):
            res = gate(impl, Problem(mask, 1, 2, D, "bfloat16"))
            assert res.ok, (impl.name, res)


@pytest.mark.gpu
@pytest.mark.parametrize("T,causal,levels", [
    (9001, True, ((2048, 1), (2048, 2), (2048, 4))),  # the llm levels: full tiles below 2048, partial past it
    (1001, False, ((40, 1), (24, 2), (16, 4))),
    (777, True, ((20, 3), (9, 5), (3, 33))),           # residues by division; a level sparser than a word
    (333, False, ((7, 31), (4, 64), (50, 1))),
])
def test_gate_dilated_levels(T, causal, levels):
    """Several dilation levels run unstrided, each partial tile through the levels' words
    (dilated.cuh level_bits), at odd T, on both main loops and head dims."""
    from attnbench.check import gate

    (W, r), extra = levels[0], levels[1:]
    mask = make_mask("dilated", T, causal, window=W, dilation=r, levels=extra)
    assert mask.strided()[0] == 1
    for D in DIMS:
        for impl in (IMPL, SYNC_IMPL):
            res = gate(impl, Problem(mask, 1, 2, D, "bfloat16"))
            assert res.ok, (impl.name, D, res)


@pytest.mark.gpu
@pytest.mark.parametrize("impl", [IMPL, SYNC_IMPL], ids=["fast-tc", "fast-tc-sync"])
@pytest.mark.parametrize("rising", [True, False], ids=["rising", "falling"])
@pytest.mark.parametrize("pattern,params", [("dense", {}), ("window", dict(window=256)),
                                            ("streaming", dict(sink=16, window=64))])
def test_scores_that_outgrow_the_running_max(impl, rising, pattern, params):
    """Scores that move by about 2^46 in exp2 units every 64 keys (rising along the keys or falling):
    on sm_90, exponentials taken against a running max from earlier tiles overflow (float16's P
    from 2^16) unless the tile is redone against its own max."""
    import cupy
    import numpy as np

    from attnbench.arrays import from_float32
    from attnbench.check import judge

    T = 1000
    mask = make_mask(pattern, T, True, **params)
    rng = np.random.default_rng(7)
    pos = np.arange(T, dtype=np.float32) if rising else np.arange(T, 0, -1, dtype=np.float32)
    for D in DIMS:
        for dtype in DTYPES:
            prob = Problem(mask, 1, 2, D, dtype)
            q, k, v = (rng.standard_normal(prob.shape).astype(np.float32) * 0.5 for _ in range(3))
            q[..., 0] = 8.0
            k[..., 0] = pos / 2  # score q_i . k_j about 4 j (rising)
            q, k, v = (from_float32(cupy.asarray(a), dtype) for a in (q, k, v))
            res = judge(impl, prob, impl.prepare(prob, q, k, v), q, k, v)
            assert res.ok, (D, dtype, res)


SERIAL_RELEASED = ["OV=0,REL=1", "NWARPS=8,BN=128,STAGES=2,MINB=1,OV=0,REL=1"]  # REL on the serial walk
KV_APART = ["OV=1,STAGES=3,REL=1,KVS=1", "NWARPS=8,BN=128,STAGES=3,MINB=1,OV=1,REL=1,KVS=1"]  # K and V on stages apart


@pytest.mark.gpu
@pytest.mark.parametrize("spec", SERIAL_RELEASED + ["NWARPS=8,BN=128,STAGES=3,MINB=1,OV=1,REL=1"])
def test_warpgroups_that_redo_different_tiles(spec):
    """Scores that outgrow the running max in every other 64-row block only (the rows of one warpgroup of a
    two-warpgroup block): with REL each warpgroup votes alone on redoing a tile against its own max, so one redoes
    where the other does not, and both must still come out right."""
    import cupy
    import numpy as np

    from attnbench.arrays import from_float32
    from attnbench.check import judge
    from attnbench.fwd_config import parse_tile_config

    variant = IMPL.tile_variant(parse_tile_config(spec))
    T = 1000
    rng = np.random.default_rng(11)
    growing = ((np.arange(T) // 64) % 2 == 0).astype(np.float32)
    for D in DIMS:
        for dtype in DTYPES:
            prob = Problem(make_mask("dense", T, True), 1, 2, D, dtype)
            q, k, v = (rng.standard_normal(prob.shape).astype(np.float32) * 0.5 for _ in range(3))
            q[..., 0] = 8.0 * growing
            k[..., 0] = np.arange(T, dtype=np.float32) / 2
            q, k, v = (from_float32(cupy.asarray(a), dtype) for a in (q, k, v))
            res = judge(variant, prob, variant.prepare(prob, q, k, v), q, k, v)
            assert res.ok, (D, dtype, res)


def test_gate_builds_cover_every_pattern_on_both_main_loops():
    from attnbench.fast_tc import gate_builds

    named = gate_builds()
    builds = [d for _, d in named]
    structs = {d["AB_PATTERN_T"] for d in builds}
    assert {f"ab_{p}" for p in PATTERNS} - {"ab_dilated"} <= structs  # dilated runs strided (ab_window) or as itself
    assert {d.get("WG", 0) for d in builds} == {0, 1} and {d["HEAD_D"] for d in builds} == {64, 128}
    # each once (a source and its defines: the wgmma main loop and dQ's wgmma pass share a shape at D=64)
    assert len(named) == len({(name, tuple(sorted(d.items()))) for name, d in named})


@pytest.mark.gpu
@pytest.mark.parametrize("pattern,params,T", [("dense", {}, 1000), ("window", {"window": 256}, 4096),
                                              ("streaming", {"sink": 4, "window": 64}, 777),
                                              ("document", {"doc_lens": (300, 1, 700)}, 1001),
                                              ("block_diagonal", {"block": 16}, 112)])
@pytest.mark.parametrize("D", DIMS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("spec", ["OV=1,STAGES=3", "OV=1,STAGES=3,REL=1", "NWARPS=8,BN=128,STAGES=3,MINB=1,OV=1,REL=1",
                                  "NWARPS=8,BN=128,STAGES=3,MINB=1,OV=1,REL=1,PP=1",
                                  "NWARPS=12,BN=64,STAGES=3,MINB=1,OV=1,REL=1,PP=1"] + SERIAL_RELEASED + KV_APART)
def test_gate_of_the_overlapped_walk(pattern, params, T, D, dtype, spec):
    """--tile-config OV=1 (kernels/tc/loop_overlap.cuh): S of a tile in flight beside P V of the one
    before, the rescale waiting for P V, lists of one tile (block-diagonal) and idle warps included; with
    REL=1 the stages released by the warps' arrivals (kernels/tc/load_released.cuh), one warpgroup and two; with
    PP=1 two and three warpgroups issuing their products in turn (kernels/tc/turns.cuh), one-tile lists included;
    and REL on the serial walk (kernels/tc/loop.cuh), one warpgroup and two, the lazy pass's vote the warpgroup's;
    and KVS=1, K and V on stages of their own (kernels/tc/load_split.cuh), one warpgroup and two."""
    from attnbench.check import gate
    from attnbench.fwd_config import parse_tile_config

    variant = IMPL.tile_variant(parse_tile_config(spec))
    res = gate(variant, Problem(make_mask(pattern, T, pattern != "block_diagonal", **params), 2, 3, D, dtype))
    assert res.ok, res


@pytest.mark.gpu
@pytest.mark.parametrize("pattern,params,T", [("dense", {}, 1000), ("window", {"window": 256}, 4096),
                                              ("streaming", {"sink": 4, "window": 64}, 777),
                                              ("document", {"doc_lens": (300, 1, 700)}, 1001),
                                              ("block_diagonal", {"block": 16}, 112), ("dense", {}, 8193)])
@pytest.mark.parametrize("D", DIMS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_gate_of_the_long_shapes(pattern, params, T, D, dtype):
    """The long lists' shape (HOPPER_LONG_CONFIGS: two warpgroups sharing 128-key tiles; at D=128 on the
    overlapped walk) on short lists too: a warpgroup whose rows are idle, a list of one tile, odd T; and where
    fast-tc takes it itself (dense at T=8193)."""
    from attnbench.check import gate
    from attnbench.fwd_config import HOPPER_LONG_CONFIGS, parse_tile_config

    mask = make_mask(pattern, T, pattern != "block_diagonal", **params)
    long = HOPPER_LONG_CONFIGS[D]
    if T == 8193:
        assert choose_config(mask, D, True) == long
    res = gate(IMPL.tile_variant(parse_tile_config(long.spec)), Problem(mask, 1, 3, D, dtype))
    assert res.ok, res
