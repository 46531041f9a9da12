"""Which backward of fast-tc runs where (its launches: ``fast_tc_bwd``).

The shapes (``BwdConfig`` and the measured tables ``BWD_SHAPES``, ``BWD_SHAPES_WG``, ``BWD_SHAPES_WG2``,
``PASS_SHAPES_WG``), the rules that pick a shape, the way dQ is summed (``choose_dq``), the work items' length
(``split_length``) and the rest of the defaults, each beside the measurement that set it; the ``--bwd-config``
fields (``BwdFields``, ``parse_bwd_config``) and the environment overrides ($ATTNBENCH_BWD_*); and a build's
-D constants (``bwd_defines``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from .errors import BadInput
from .fwd_config import WG_ARCH, pattern_defines
from .patterns import Mask
from .tiles import tile_list

KERNEL = "fast_tc_bwd"
KERNEL_WG = "fast_tc_bwd_wg"  # the same kernels, the main one on wgmma (sm_90a)
MAIN, PREP, DQ = "fast_tc_bwd", "fast_tc_bwd_prep", "fast_tc_bwd_dq"
DQ_PASS = "fast_tc_bwd_dq_pass"  # BWD_DQ_PASS builds: dQ by a pass over the forward list
KERNEL_DQ_WG = "fast_tc_bwd_dq_wg"  # that pass on wgmma (sm_90a), the same entry point and parameters
FUSED = "fast_tc_bwd_fused"      # BWD_FUSED builds (wgmma, one warpgroup): the main loop's items and the pass's blocks
DQ_WAYS = ("atomic", "pass", "fused", "store")  # how dQ is summed: reductions into float32 in the main kernel, its
# own pass, that pass's blocks in the main kernel's launch, ordered beside the items that read the same tiles, or
# (where every query tile's forward list holds one key tile, ``store_shape``) stored whole by the main loop
DQ_ENV = "ATTNBENCH_BWD_DQ"      # the way forced (tests, timing); default: choose_dq's rule
# the blocks of a persistent launch (PERSIST; tests give few, so that every block takes many works); default: the
# multiprocessors times the build's MINB
PERSIST_BLOCKS_ENV = "ATTNBENCH_BWD_PERSIST_BLOCKS"
PREP_THREADS = 256  # BWD_PREP_THREADS, of the prep and convert kernels
DEFAULT_SMEM = 48 * 1024


@dataclass(frozen=True)
class BwdConfig:
    """Compile-time shape of the backward: NWARPS warps, key tiles and query tiles of
    BM = BN = 16 * NWARPS rows (a warp owns 16 query rows of S and dP, 16 keys of dK and dV; with
    WG, one warpgroup owns 64 keys and walks 64-row query tiles key-major)."""
    NWARPS: int
    STAGES: int  # buffers the Q and dO tiles stream through
    MINB: int    # blocks per multiprocessor asked of the register allocator
    WG: int = 0  # 1: the main kernel on Hopper's warpgroup MMA (kernels/fast_tc_bwd_wg.cu, sm_90a),
    #              NWARPS / 4 warpgroups of 64 keys each on one 64-row query tile
    PAIRS: int = 1  # two warpgroups at D=64 with dQ summed in the main loop: 1, dQ of two query tiles at
    #                 a time, a tile a warpgroup (two staged dS^T); 2, the same with the pair's dQ products
    #                 in flight through the next pair's first tile (four staged dS^T); 0, both compute one
    #                 tile's panel and each reduces half its columns
    TMA: int = 0    # the wgmma builds, unstrided patterns: 1, the streamed tiles by bulk tensor copies, each
    #                 stage on an mbarrier (dQ's pass, kernels/fast_tc_bwd_dq_wg.cu: K and V; the main loop,
    #                 kernels/fast_tc_bwd_wg.cu: Q and dO, its rows' (lse2, delta) still by cp.async); 0, by cp.async
    PERSIST: int = 0  # the wgmma builds: 1, about the GPU's resident blocks, each taking works in turn and issuing the
    #                   next one's loads before it stores this one's output (BWD_PERSIST: dQ's pass, by cp.async, a
    #                   query tile's dQ; the main loop, by either, an item's dK and dV); 0, a block a work
    DQR: int = 0    # the wgmma main loop with TMA, dQ summed there: 1, a warpgroup's dQ panel staged in shared memory
    #                 and added by bulk tensor reductions (BWD_DQ_BULK); 2, the same with two sets of staging
    #                 buffers in turn (one query tile at a time), so a tile's reductions stay in flight through the
    #                 next tile; 0, by red.global.add from registers
    LAG: int = 0    # two warpgroups of the wgmma main loop with TMA, dQ summed there one query tile at a time: 1, each
    #                 takes dQ of the tile before its current one, the two meeting on barriers of their own (the
    #                 stages' refills, two staged dS^T in turn), no block barrier a tile (BWD_DQ_LAG,
    #                 kernels/tc/bwd_lag.cuh); 2 (D=128), the same with dQ's products issued behind the tile's dK;
    #                 0, both meet at block barriers every tile

    def paired(self, D: int, dq: str = "atomic") -> bool:
        """Whether the wgmma main loop takes its query tiles two at a time for dQ (BWG_DQ_PAIRED)."""
        return bool(self.WG and self.PAIRS and self.NWARPS == 8 and D == 64 and dq in ("atomic", "store"))

    @property
    def BN(self) -> int:
        return 16 * self.NWARPS

    @property
    def BM(self) -> int:
        """Query rows a tile: BN on mma.sync; 64 with WG, the query tile every warpgroup shares."""
        return 64 if self.WG else self.BN

    @property
    def threads(self) -> int:
        return 32 * self.NWARPS

    @property
    def kernel(self) -> str:
        """The source of its main kernel (the prep and convert kernels come with it)."""
        return KERNEL_WG if self.WG else KERNEL

    @property
    def arch(self) -> str | None:
        """The target it needs beyond what CuPy picks for the device (None: any)."""
        return WG_ARCH if self.WG else None

    def smem_bytes(self, D: int, dq: str = "atomic") -> int:
        """K and V, STAGES Q and dO tiles, the staged P and dS (WG: dS alone, twice where ``paired``,
        and STAGES rows of the query tile's (lse2, delta); with TMA an mbarrier a stage; with DQR a float32
        64 x 64 panel of dQ a warpgroup, or a panel of D with one; DQR=2 two sets of them; LAG: two staged dS^T,
        the (lse2, delta) stages a warpgroup, four more mbarriers and a counter a stage)."""
        if self.WG:
            ds = 2 * self.BM * self.BN * (2 * self.PAIRS if self.paired(D, dq) else 2 if self.LAG else 1)
            dqs = max(D // 64, self.NWARPS // 4) * self.BM * 64 * 4 * self.DQR
            ld = 8 * self.STAGES * self.BM * (self.NWARPS // 4 if self.LAG else 1)
            return (2 * D * (2 * self.BN + 2 * self.STAGES * self.BM) + ds + dqs + ld
                    + (8 * self.STAGES if self.TMA else 0) + (32 + 4 * self.STAGES if self.LAG else 0))
        return 2 * D * (2 * self.BN + 2 * self.STAGES * self.BM) + 2 * 2 * self.BM * self.BN

    def dq_pass_smem_bytes(self, D: int) -> int:
        """The dQ pass's: Q and dO, STAGES K and V tiles (with TMA, mbarriers after them: Q's, one a stage,
        dO's and O's)."""
        return 2 * D * (2 * self.BM + 2 * self.STAGES * self.BN) + (8 * (self.STAGES + 2) if self.TMA else 0)

    @property
    def spec(self) -> str:
        return (f"NWARPS={self.NWARPS},BN={self.BN},STAGES={self.STAGES},MINB={self.MINB}" + (",WG=1" if self.WG else "")
                + ("" if self.PAIRS == 1 else f",PAIRS={self.PAIRS}") + (",TMA=1" if self.TMA else "")
                + (",PERSIST=1" if self.PERSIST else "") + (f",DQR={self.DQR}" if self.DQR else "")
                + (f",LAG={self.LAG}" if self.LAG else ""))


# per head dimension: (shape, why). Registers (sm_80 / sm_90, NVRTC 13): D=64 198-206, D=128
# 251-254 of 255 without spills (P kept packed while dP is computed)
BWD_SHAPES: dict[int, tuple[BwdConfig, str]] = {
    64: (BwdConfig(NWARPS=4, STAGES=2, MINB=2), "64 x 64 tiles, Q and dO in 2 stages (56 KiB): 2 blocks per SM"),
    128: (BwdConfig(NWARPS=4, STAGES=2, MINB=1), "64 x 64 tiles, Q and dO in 2 stages (112 KiB); dK and dV "
                                                 "take 128 registers a thread"),
}
# the wgmma main loop's (sm_90), measured (docs/PERF.md "backward v3" to "backward v5"): one warpgroup
# a block on the mma.sync loop's 64 x 64 tiles and lists, or two sharing each 64-row query tile on
# 128-key tiles (dQ summed over 128 keys before its reductions: a 64-column panel each at D=128; at
# D=64 a query tile each of a pair, since v9, PAIRS). Two halve the Q / dO loads and dQ reductions per key but fill
# a 128-key tile where one fills 64; they win where each query reads many keys on average:
# TWO_WG_MIN_KEYS. H200, T=32768, two / one: D=128 dense 0.68, window 4096 0.75, document 0.59,
# window 256 0.95, streaming 16+64 1.05; D=64 dense 0.92, document 0.77, window 4096 0.93,
# streaming 4+1024 1.01, window 256 1.12, streaming 16+64 1.24.
# Registers (NVRTC 13, sm_90a): one warpgroup 179 (D=64), 247 (D=128); two 197 (D=64), 255 (D=128)
# (since v17 one warpgroup at D=64: 163 by bulk copies, 166 by cp.async). One warpgroup at D=64 asks three blocks a
# multiprocessor (MINB=3, no spills): H100, --pass bwd, T=32768, three / two 0.91 on streaming 4+1024, 0.996-1.006 on
# every other llm instance (docs/PERF.md "backward v17"); at D=128 three spill (1.2-2.2x slower)
BWD_SHAPES_WG: dict[int, tuple[BwdConfig, str]] = {
    64: (BwdConfig(NWARPS=4, STAGES=2, MINB=3, WG=1), "one warpgroup, 64 x 64 tiles, Q and dO in 2 stages "
                                                      "(57 KiB): 3 blocks per SM"),
    128: (BwdConfig(NWARPS=4, STAGES=2, MINB=2, WG=1), "one warpgroup, 64 x 64 tiles, Q and dO in 2 stages "
                                                       "(105 KiB): 2 blocks per SM, dK and dV 128 registers a thread"),
}
BWD_SHAPES_WG2: dict[int, tuple[BwdConfig, str]] = {
    64: (BwdConfig(NWARPS=8, STAGES=2, MINB=1, WG=1), "two warpgroups on 128-key tiles, dQ of two query tiles "
                                                      "at a time, one a warpgroup (97 KiB)"),
    128: (BwdConfig(NWARPS=8, STAGES=2, MINB=1, WG=1), "two warpgroups on 128-key tiles, a 64-column panel "
                                                       "of dQ each (145 KiB)"),
}
TWO_WG_MIN_KEYS = {64: 512, 128: 128}  # keys a query reads on average (pairs / T) from which two warpgroups win
# ... when dQ is summed in the main loop. With dQ's own pass (``choose_dq``) the main loop has no dQ
# loads or reductions for two warpgroups to halve, and one wins: H100, --pass bwd, one / two
# (results/train-bwd-v7-wg-ab-h100.csv, docs/PERF.md "backward v7"), D=128, T=32768 and 131072:
# bigbird 0.80 and 0.81, window 256 0.89 and 0.90, block_diagonal 128 0.91 and 0.93; D=64 window 256
# two / one 1.24 and 1.26
# dQ by its own pass wins below these keys a query (pairs / T): the pass recomputes S and dP (1.4x the
# products) but drops the float32 accumulator, its zeroing, conversion and reductions. H100, wgmma main
# loop, pass / atomic (docs/PERF.md "backward v6", results/train-bwd-v6-dq-ab-h100.csv), T=32768 and
# 131072: D=64 0.56-0.81 up to dilated 512/2 (510 keys), streaming 4+1024 (1024) 1.02-1.03, window
# 4096 1.12; D=128 0.62-0.95 up to 256 keys, dilated 512/2 1.02-1.03, streaming 4+1024 1.07
DQ_PASS_MAX_KEYS = {64: 768, 128: 384}
# with dQ's own pass and no key tile split, the pass computes each row's (lse log2 e, delta) and the prep
# launch goes (it read O and dO once more). H100, --pass bwd, pass / prep (results/train-bwd-v8-stats-ab-h100.csv,
# docs/PERF.md "backward v8"): block_diagonal 16 and 128 0.92-0.98, dilated 512/2 (D=64) 0.96, window 256
# 0.95 (D=64) and 1.00 (D=128); with a split key tile (streaming 16+64, bigbird: their tile 0) 1.05-1.13
PASS_STATS = True
# ... reading O and dO (STATS): 1, from global memory before the block's first tile; 2, from shared
# memory, O's tile copied beside Q and dO into the K stage the loop refills first
PASS_STATS_FROM = 2
# dQ's pass: a warp skips dP's and dQ's products on a tile's 16-key blocks where its P is all zero (SKIP),
# at these D. H100, --pass bwd, T=32768, skip / not (docs/PERF.md "backward v12"): D=128 streaming 16+64
# and its custom twin 0.97, the other pass instances 0.99-1.01; D=64 0.90-0.99 slower (172 registers
# against 162: two blocks a multiprocessor instead of three)
PASS_SKIP = {64: 0, 128: 1}
# ... and where a key tile is split, at these D: prep then runs on no row, only zeroing the split tiles'
# accumulators ("zero"). H100, --pass bwd, pass's stats with zero / prep (results/train-bwd-v10-zero-ab-h100.csv,
# docs/PERF.md "backward v10"), T=32768 and 131072: D=64 streaming 16+64, bigbird and the custom twin
# 0.95-0.97; D=128 1.00-1.01 with O read from global memory, 0.93-0.95 since v12 reads it from shared
# memory (results/train-bwd-v12-stats-ab-h100.csv)
PASS_STATS_SPLIT = {64: True, 128: True}


# dQ's own pass beside the wgmma main loop: on wgmma too (kernels/fast_tc_bwd_dq_wg.cu, one warpgroup a
# 64-row query tile), 1; or a launch of the mma.sync build (``BWD_SHAPES``), 0. Since backward v15 (H100,
# T=32768, --pass bwd, the default against --bwd-config PWG=0, docs/PERF.md "backward v15"): window 256 0.87
# (D=64 and 128), dilated 512/2 0.83 (D=64), bigbird 0.93 and 0.91, streaming 16+64 0.94 and 0.96; and
# with it dQ's pass wins up to PASS_WG_MAX_KEYS keys a query (``choose_dq``)
PASS_WG = 1
# ... keys a query reads (pairs / T) from which dQ's float32 reductions win again beside the wgmma main loop with the
# pass on wgmma: H100, --pass bwd, pass / reductions (docs/PERF.md "backward v15"), dense causal at T=32768
# (16384 keys) 0.85 and 0.93 at D=64 and 128, at T=131072 (65536 keys) 1.02 and 1.20: there the one-warpgroup
# main loop and the pass each stream a head's Q and dO (or K and V), 64 MB at D=128, past the 50 MB L2
PASS_WG_MAX_KEYS = 32768
# ... its tiles by bulk tensor copies on unstrided patterns (``--bwd-config PTMA=0``: by cp.async): H100, --pass bwd,
# T=32768, 0.94-0.98 of the cp.async pass's time on every llm instance (docs/PERF.md "backward v16")
PASS_TMA = 1
# ... and the wgmma main loop's Q and dO by bulk tensor copies on unstrided patterns (``--bwd-config MTMA=0``: by
# cp.async): H100, --pass bwd, T=32768, 0.91-1.00 of the cp.async main loop's time on every llm instance measured
# (docs/PERF.md "backward v17")
MAIN_TMA = 1
# ... and the wgmma pass persistent (``--bwd-config PPER=1``: cp.async, about the GPU's resident blocks taking the works
# in turn): H100, --pass bwd, T=32768, 1.5-9% slower than the default on the llm instances (docs/PERF.md "backward v18")
PASS_PERSIST = 0
# ... and the wgmma main loop persistent (``--bwd-config MPER=1``): 10-38% slower at D=64, 0.92-1.29x at D=128
MAIN_PERSIST = 0
# ... and, where it sums dQ (DQ=0) with bulk tensor copies, its dQ panels added by bulk tensor reductions from shared
# memory (``--bwd-config DQR=1``; 0: red.global.add.v2.f32 from each thread's registers): H100, --pass bwd, T=32768,
# against the same shape's reductions 0.97-1.04 at D=128, 1.06-1.21 slower with two warpgroups at D=64, and its best
# build 1.12-1.68x the default's dQ pass (docs/PERF.md "backward v19"). DQR=2 (two sets of staging buffers in turn)
# with two warpgroups at D=128: H200, --pass bwd, dense causal, against the same shape's reductions 0.949 at T=131072
# (430.5 -> 406.4 ms; DQR=1 406.8), 0.940 at T=32768 (where dQ's pass stays the default, 0.90x their time); at D=64
# (PAIRS=0) 1.38 slower (docs/PERF.md "backward v23"). Per head dimension, with two warpgroups:
MAIN_DQ_BULK = {64: 0, 128: 2}


def default_dq_bulk(D: int, cfg: BwdConfig) -> int:
    """DQR of a wgmma main loop that sums dQ and loads by bulk copies where no field gives it: MAIN_DQ_BULK's for D
    with two warpgroups whose query tiles are not paired, else 0 (red.global.add)."""
    return MAIN_DQ_BULK.get(D, 0) if cfg.NWARPS == 8 and not cfg.paired(D) else 0


PASS_SHAPES_WG: dict[int, tuple[BwdConfig, str]] = {
    64: (BwdConfig(NWARPS=4, STAGES=2, MINB=3, WG=1), "one warpgroup, 64 x 64 tiles, K and V in 2 stages (48 KiB): "
                                                      "3 blocks per SM"),
    128: (BwdConfig(NWARPS=4, STAGES=2, MINB=2, WG=1), "one warpgroup, 64 x 64 tiles, K and V in 2 stages (96 KiB): "
                                                       "2 blocks per SM"),
}


def pass_kernel(pcfg: BwdConfig) -> str:
    """The source of dQ's pass of shape ``pcfg``: the wgmma pass's for a WG shape, else the mma.sync build's."""
    return KERNEL_DQ_WG if pcfg.WG else KERNEL


# the wgmma main loop's two warpgroups a tile apart (LAG=1, kernels/tc/bwd_lag.cuh: each takes dQ of the tile before
# its current one, no block barrier a tile) sum dQ by default from this many keys a query, per D (unstrided patterns,
# the loop by bulk copies and a block a work item): H200, --pass bwd, T=32768, LAG=1 / the default's dQ pass
# (docs/PERF.md "backward v24"): D=128 dense 0.927, window 4096 0.970, the three-level dilation 0.960; document
# (1189 keys) 1.063, streaming 4+1024 (1012) 1.136, the short lists 1.3-1.7; dense at T=131072 0.899 of the
# reductions. At D=64 dense LAG=1 took 1.34x the default's time
LAG_MIN_KEYS = {128: 2048}


def choose_dq(D: int, keys_per_query: float | None, wgmma: bool = False, lag: bool = False) -> str:
    """How dQ is summed where nothing forces it: its own pass below a count of keys a query reads, float32
    reductions from there (and when the count is not known). Beside the wgmma main loop with the pass on
    wgmma (PASS_WG) the count is PASS_WG_MAX_KEYS (H100, --pass bwd, pass / float32 reductions, docs/PERF.md
    "backward v15": at T=32768 dense 0.85 and 0.93 at D=64 and 128, window 4096 0.84 and 0.93, document 0.71
    and 0.70, streaming 4+1024 0.81 and 0.80, dilated 512/2 at D=128 0.76, dilated levels 0.96 and 0.99; at
    T=131072 dense 1.02 and 1.20), or where the loop can take dQ a tile behind (``lag``: unstrided, by bulk
    copies, not persistent) LAG_MIN_KEYS's for D; otherwise ``DQ_PASS_MAX_KEYS`` for D."""
    limit = PASS_WG_MAX_KEYS if wgmma and PASS_WG else DQ_PASS_MAX_KEYS[D]
    if wgmma and lag and D in LAG_MIN_KEYS:
        limit = min(limit, LAG_MIN_KEYS[D])
    return "pass" if keys_per_query is not None and keys_per_query < limit else "atomic"


def lag_loop(cfg: BwdConfig, dq: str) -> bool:
    """Whether ``cfg``'s main loop is one that LAG builds on (its query tiles not paired aside): the wgmma loop's two
    warpgroups summing dQ (``dq`` "atomic"), Q and dO by bulk copies, a block a work item."""
    return bool(cfg.WG and cfg.NWARPS == 8 and dq == "atomic" and cfg.TMA and not cfg.PERSIST)


def default_lag(D: int, keys_per_query: float, cfg: BwdConfig, dq: str) -> int:
    """LAG of the wgmma main loop where no field gives it: 1 where two warpgroups sum dQ one query tile at a time by
    bulk copies, a block a work item (``lag_loop``, not paired), and a query reads LAG_MIN_KEYS's keys for D or more;
    else 0."""
    ok = lag_loop(cfg, dq) and not cfg.paired(D, dq)
    return int(ok and D in LAG_MIN_KEYS and keys_per_query >= LAG_MIN_KEYS[D])


def bwd_config(D: int, wgmma: bool = False, keys_per_query: float | None = None, dq: str = "atomic") -> BwdConfig:
    """The backward's shape at head dimension D: mma.sync's, or the wgmma main loop's (sm_90) for a
    pattern whose queries read ``keys_per_query`` keys on average (None: as many as dense's): two
    warpgroups from TWO_WG_MIN_KEYS when dQ is summed in the main loop (``dq`` "atomic"), one when dQ
    has its own pass (no dQ loads or reductions for two to halve)."""
    if not wgmma:
        return BWD_SHAPES[D][0]
    two = (keys_per_query is None or keys_per_query >= TWO_WG_MIN_KEYS[D]) and dq == "atomic"
    return (BWD_SHAPES_WG2 if two else BWD_SHAPES_WG)[D][0]


# ---- work items: the transposed lists cut so that every block's walk is short --------------------
SPLIT_WAVES = 1  # the items of all heads and classes fill about this many waves of the GPU's blocks: one
# since v12 (H100, --pass bwd, --bwd-config WAVES=1 against 4, docs/PERF.md "backward v12"): the split
# instances 0.97-0.99 (streaming 16+64 and 4+1024, bigbird, the custom twin), no other instance moved by
# more than 1% (fewer items of a split key tile: fewer float32 additions of its dK and dV)
SPLIT_MIN = 8    # query tiles an item walks at least (a split item pays its K / V loads and dK / dV atomics)
# The work items' layout where the cut splits a key tile and L > 2 ITEM_CUT (``default_item_layout``): launched by
# position (ITEM_ORDER, tiles.work_items) and the split tile's items at most ITEM_CUT query tiles long. Since
# backward v14 (H100, --pass bwd, --bwd-config ORDER=1,CUT=8 against the earlier items, docs/PERF.md "backward v14"):
# at T=32768 and 131072 bigbird 0.90-0.94, streaming 16+64 and its custom twin at D=128 0.96-0.98, at D=64
# 0.99-1.01; at T=4096 (L 12 to 16, a wave or two of blocks: the long items launched late end last) streaming
# 16+64 and bigbird at D=64 4-8% slower, so not there; the instances with no split tile unchanged.
# Since backward v20 the order by position also where nothing is split and L > 2 ITEM_CUT: longest first put
# key tiles of unrelated documents beside each other, and the blocks read their Q and dO tiles from DRAM (the
# main loop at 75% of DRAM peak on document at D=128). H100, T=32768, --bwd-config ORDER=1 against 0
# (docs/PERF.md "backward v20"): document bwd 0.865 (D=128) and 0.957 (D=64), dilated 1.00; lists of equal
# length (dense, windows) are in the same order either way
ITEM_ORDER = 1
ITEM_CUT = 8
SPLIT_ENV = "ATTNBENCH_BWD_SPLIT"  # L forced (0: nothing split), for tests and timing experiments


def split_length(entries: int, longest: int, heads: int, slots: int, waves: int = SPLIT_WAVES) -> int:
    """L, the most query tiles one work item walks, for a transposed list of ``entries`` entries
    whose longest key tile has ``longest``, run on ``heads`` (B * H * residue classes) copies at
    once by a GPU of ``slots`` resident blocks (multiprocessors x blocks per multiprocessor):

        target = ceil(waves * slots / heads)   items per copy that fill ``waves`` waves (SPLIT_WAVES)
        L      = max(SPLIT_MIN, ceil(entries / target))

    then at most ``longest`` (nothing to cut). With the items dispatched longest first, the walks
    of at most L tiles end within about 1 / waves of the balanced time W / slots (W: all
    walks' tiles): the long items start in the first wave and the short ones fill in behind them.
    Dense causal at T=32768, B*H=16, 132 SMs: nothing split (the 512-tile lists are well under
    W / slots = 7958); streaming 16+64, 264 slots: L=91, key tile 0's 512 tiles in 6 items."""
    target = max(1, -(-waves * slots // max(1, heads)))
    return max(1, min(max(SPLIT_MIN, -(-entries // target)), longest))


def default_item_layout(L: int, split_any: bool) -> tuple[int, int]:
    """(order, cut) of the work items by default (``tiles.work_items``): where L > 2 ITEM_CUT, ITEM_ORDER (by
    position), and ITEM_CUT where the items' length L splits a key tile (``split_any``), else no cut; else (0, 0):
    longest first, no cut."""
    if L <= 2 * ITEM_CUT:
        return 0, 0
    return ITEM_ORDER, ITEM_CUT if split_any else 0


SHAPE_ENV = "ATTNBENCH_BWD_SHAPE"  # fields of the chosen shape replaced, e.g. "NWARPS=4,MINB=2" (timing experiments)


def forced_shape() -> dict:
    """The fields $ATTNBENCH_BWD_SHAPE replaces ("NWARPS=4,STAGES=2,MINB=2,PAIRS=2"; empty: none);
    BadInput naming the entry that is no FIELD=count of NWARPS, STAGES, MINB (N >= 1) or PAIRS (0 to 2)."""
    import os

    given = os.environ.get(SHAPE_ENV, "").strip()
    out = {}
    for part in filter(None, (x.strip() for x in given.split(","))):
        name, _, value = part.partition("=")
        lo, hi = BWD_LIMITS["PAIRS"][:2] if name == "PAIRS" else (1, None)
        if (name not in ("NWARPS", "STAGES", "MINB", "PAIRS") or not value.isdigit() or int(value) < lo
                or (hi is not None and int(value) > hi)):
            raise BadInput(f"{SHAPE_ENV}={given!r}: {part!r} is no FIELD=N with FIELD one of NWARPS, STAGES, MINB "
                           f"(N >= 1) or PAIRS (N from {BWD_LIMITS['PAIRS'][0]} to {BWD_LIMITS['PAIRS'][1]})")
        out[name] = int(value)
    return out


@dataclass(frozen=True)
class BwdFields:
    """The backward's fields a shape variant may fix (``--bwd-config``): the main kernel's NWARPS,
    STAGES and MINB, DQ (0: dQ's sums by float32 reductions, 1: dQ by its own pass, 2: that pass's
    blocks in the main kernel's launch, beside the items that read the same tiles; wgmma, one
    warpgroup, the rows' stats from prep; 3: stored whole by the wgmma main loop where every query tile
    reads one key tile, ``store_shape``) and STATS (with dQ's own pass, 1 or 2: the pass computes the
    rows' (lse log2 e, delta) and runs first, no prep launch reading O and dO, 1 reading O from global
    memory, 2 from O's tile copied into shared memory beside Q and dO; 0: prep computes them) and PAIRS (two warpgroups at D=64, dQ summed in
    the main loop: 1, two query tiles' dQ at a time, one a warpgroup; 2, the same with dQ's products
    in flight through the next pair's first tile; 0, one tile's by both, each reducing half) and SKIP
    (dQ's pass: 1, a warp skips dP's and dQ's products on a tile's 16-key blocks where its P is all
    zero; 0, computes them), WAVES (the waves of blocks the work items are cut to fill,
    ``split_length``) and PMINB (dQ's own pass beside the wgmma main loop: its blocks per
    multiprocessor asked of the register allocator; 0, its shape's), ORDER (the work items' launch
    order, ``tiles.work_items``: 0, longest first; 1, by the query tiles they read, so that a split key
    tile's items run beside the band's items that read the same Q and dO) and L (the most query
    tiles a work item walks; 0, ``split_length``'s) and CUT (the most query tiles an item of a key tile
    that L splits walks, the others whole; 0: L's) and PWG (dQ's own pass beside the wgmma main loop: 1, on
    wgmma, kernels/fast_tc_bwd_dq_wg.cu; 0, a launch of the mma.sync build) and PTMA (that wgmma pass's tiles:
    1, by bulk tensor copies on unstrided patterns; 0, by cp.async) and MTMA (the wgmma main loop's Q and dO
    tiles: 1, by bulk tensor copies on unstrided patterns, not with DQ=2; 0, by cp.async) and PPER (the wgmma
    pass: 1, persistent, its tiles by cp.async; 0, a block a query tile) and MPER (the wgmma main loop: 1,
    persistent, by cp.async or with MTMA=1 by bulk copies, not with DQ=2; 0, a block a work item) and DQR (the wgmma
    main loop with MTMA=1 and DQ=0: 1, dQ's sums by bulk tensor reductions from shared memory; 2, the same from two
    sets of staging buffers in turn, one query tile at a time (PAIRS=0 where two warpgroups at D=64 would pair
    them); 0, by red.global.add from registers) and LAG (two warpgroups of the wgmma main loop with MTMA=1 and DQ=0, one
    query tile at a time: 1, each takes dQ of the tile before its current one, no block barrier a tile; 2 (D=128), the
    same with dQ's products issued behind the tile's dK; 0, both meet at block barriers every tile; default 1 at D=128
    from LAG_MIN_KEYS keys a query); the defaults are those of the positional form."""
    NWARPS: int = 8
    STAGES: int = 2
    MINB: int = 1
    DQ: int = 0
    STATS: int = 2
    PAIRS: int = 1
    SKIP: int = 1
    WAVES: int = SPLIT_WAVES
    PMINB: int = 0
    ORDER: int = 0
    L: int = 0
    CUT: int = 0
    PWG: int = 0
    PTMA: int = 0
    MTMA: int = 0
    PPER: int = 0
    MPER: int = 0
    DQR: int = 0
    LAG: int = 0


BWD_FIELDS = tuple(f.name for f in dataclasses.fields(BwdFields))
BWD_LIMITS = {"NWARPS": (4, 8, 4), "STAGES": (2, 4, 1), "MINB": (1, 4, 1), "DQ": (0, 3, 1), "STATS": (0, 2, 1),
              "PAIRS": (0, 2, 1), "SKIP": (0, 1, 1), "WAVES": (1, 16, 1), "PMINB": (0, 4, 1), "ORDER": (0, 1, 1),
              "L": (0, 65536, 1), "CUT": (0, 65536, 1),
              "PWG": (0, 1, 1), "PTMA": (0, 1, 1), "MTMA": (0, 1, 1), "PPER": (0, 1, 1),
              "MPER": (0, 1, 1), "DQR": (0, 2, 1), "LAG": (0, 2, 1)}
WORK_FIELDS = ("DQ", "STATS", "SKIP", "WAVES", "PMINB", "ORDER", "L", "CUT", "PWG", "PTMA", "MTMA",
               "PPER", "MPER", "DQR", "LAG")  # not the main kernel's shape


@dataclass(frozen=True)
class BwdSpec:
    """Fields of the backward given (``--bwd-config``); the others as fast-tc chooses them."""
    given: tuple  # (field, value) pairs in BWD_FIELDS order

    def __str__(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.given)

    def field(self, name: str) -> int | None:
        """The value given for field ``name``, None when not given."""
        return dict(self.given).get(name)

    @property
    def shape(self) -> dict:
        """The main kernel's fields given (what $ATTNBENCH_BWD_SHAPE would replace)."""
        return {k: v for k, v in self.given if k not in WORK_FIELDS}

    @property
    def dq(self) -> str | None:
        """The dQ way given (DQ_WAYS), None when not."""
        d = self.field("DQ")
        return None if d is None else DQ_WAYS[d]

    @property
    def stats(self) -> int | None:
        """How dQ's pass takes the rows' stats (STATS: 0 from prep, 1 and 2 computed by the pass from O
        and dO in global or shared memory), None when not given."""
        return self.field("STATS")

    @property
    def pass_minb(self) -> int | None:
        """The dQ pass's blocks per multiprocessor asked of the allocator (PMINB; 0 or None: its shape's)."""
        return self.field("PMINB") or None

    @property
    def waves(self) -> int | None:
        """The waves the work items are cut to fill (WAVES), None when not given."""
        return self.field("WAVES")

    @property
    def order(self) -> int | None:
        """The work items' launch order (ORDER, ``tiles.work_items``), None when not given."""
        return self.field("ORDER")

    @property
    def split(self) -> int | None:
        """The most query tiles a work item walks (L; 0 or None: ``split_length``'s)."""
        return self.field("L") or None

    @property
    def cut(self) -> int | None:
        """The most query tiles an item of a split key tile walks (CUT; 0 or None: L's)."""
        return self.field("CUT") or None

    @property
    def pass_wg(self) -> int | None:
        """Whether dQ's own pass runs on wgmma beside the wgmma main loop (PWG), None when not given."""
        return self.field("PWG")

    @property
    def pass_tma(self) -> int | None:
        """Whether the wgmma pass loads its tiles by bulk tensor copies (PTMA), None when not given."""
        return self.field("PTMA")

    @property
    def main_tma(self) -> int | None:
        """Whether the wgmma main loop loads Q and dO by bulk tensor copies (MTMA), None when not given."""
        return self.field("MTMA")

    @property
    def pass_persist(self) -> int | None:
        """Whether the wgmma pass is persistent (PPER), None when not given."""
        return self.field("PPER")

    @property
    def main_persist(self) -> int | None:
        """Whether the wgmma main loop is persistent (MPER), None when not given."""
        return self.field("MPER")

    @property
    def dq_bulk(self) -> int | None:
        """Whether the wgmma main loop adds dQ's sums by bulk tensor reductions (DQR), None when not given."""
        return self.field("DQR")

    @property
    def dq_lag(self) -> int | None:
        """Whether two warpgroups of the wgmma main loop take dQ a tile behind, without block barriers (LAG), None
        when not given."""
        return self.field("LAG")

    @property
    def skip(self) -> int | None:
        """Whether dQ's pass skips the all-zero key blocks of P (SKIP), None when not given."""
        return self.field("SKIP")


def parse_bwd_config(text: str, option: str = "--bwd-config") -> BwdSpec:
    """'FIELD=N,...' of BwdFields' fields (any case; the others as fast-tc chooses them) or all
    by position; BadInput naming ``option`` and the limit."""
    from .shape_fields import parse_fields

    given = parse_fields(text, option, BwdFields, BWD_LIMITS, min_positional=4)
    return BwdSpec(tuple((f, given[f]) for f in BWD_FIELDS if f in given))


def choose_bwd_config(D: int, wgmma: bool, dq: str = "atomic", keys_per_query: float | None = None,
                      fields: dict | None = None) -> BwdConfig:
    """The main kernel's shape: the wgmma main loop's when ``wgmma`` (fast-tc on sm_90), one or two
    warpgroups by ``keys_per_query`` (``bwd_config``); mma.sync's otherwise; the fields
    $ATTNBENCH_BWD_SHAPE names replaced, then those ``fields`` names (a ``BwdSpec``'s). (dQ by its
    own pass, ``dq`` "pass", runs on mma.sync's shape for D either way: ``dq_pass_config``.)"""
    cfg = dataclasses.replace(bwd_config(D, wgmma, keys_per_query, dq), **{**forced_shape(), **(fields or {})})
    # what the kernels' static_asserts take: whole warpgroups, on wgmma one or two (two split dQ's
    # 64-column panels at D=128; at D=64 a pair's query tiles, or with PAIRS=0 a panel's 32-column halves)
    ok = (4, 8)
    if cfg.NWARPS not in ok:
        raise BadInput(f"{SHAPE_ENV}: NWARPS={cfg.NWARPS} does not build for the {'wgmma' if cfg.WG else 'mma.sync'} "
                       f"backward at D={D} (NWARPS in {', '.join(map(str, ok))})")
    return cfg


# two warpgroups at D=64 summing dQ in the main loop (dense causal from T=65536, where the pass gives way to the
# reductions): a pair's dQ products in flight through the next pair's first tile (PAIRS=2) unless a field or
# $ATTNBENCH_BWD_SHAPE gives PAIRS, or DQR=1 is asked (it stages a pair's dQ once done). H100, --pass bwd, dense causal,
# PAIRS=2 / 1: T=131072 0.968 (253.6 -> 245.5 ms; docs/PERF.md "backward v22"), T=32768 0.985 ("backward v11")
ATOMIC_PAIRS = 2


def default_pairs(D: int, cfg: BwdConfig, dq: str, given: dict, dq_bulk: int | None) -> int:
    """PAIRS of the main loop: ``given``'s (the fields and $ATTNBENCH_BWD_SHAPE) where it names PAIRS; ATOMIC_PAIRS
    where two warpgroups at D=64 sum dQ in the main loop (``cfg.paired`` with ``dq`` "atomic") and no bulk reductions
    are asked (``dq_bulk``); else the shape's."""
    if "PAIRS" in given or dq != "atomic" or not cfg.paired(D, dq) or dq_bulk:
        return cfg.PAIRS
    return ATOMIC_PAIRS


# dQ stored whole by the wgmma main loop (DQ=3, BWD_DQ_STORE) where every query tile's forward list at the main
# loop's tiles holds one key tile (``store_shape``: block-diagonal patterns whose blocks fit a key tile): the work
# item of that key tile sums all of the query tile's dQ, so it stores the gradient itself, times the scale; no float32
# accumulator to zero, reduce into and convert, and no pass that reads Q, dO, K and V again. Chosen by default where
# STORE_DQ and one warpgroup's 64-key tiles fit (STORE_DQ_SHAPES): H100, T=32768, against the pass (docs/PERF.md
# "backward v21"), block-diagonal 16 bwd 0.85 (D=64) and 0.89 (D=128); two warpgroups' 128-key tiles (block-diagonal
# 128) 1.17 at D=64 (one block a multiprocessor) and 1.00 at D=128, so there only when asked (DQ=3)
STORE_DQ = 1
STORE_DQ_SHAPES = (BWD_SHAPES_WG,)


def single_key_tile(mask: Mask, BM: int, BN: int) -> bool:
    """Whether every query tile of ``mask``'s forward list at BM x BN tiles holds exactly one key tile."""
    count = np.diff(tile_list(mask, BM, BN).ptr)
    return bool(count.size) and bool((count == 1).all())


def store_shape(D: int, mask: Mask, fields: dict | None = None, shapes_tried: tuple = (BWD_SHAPES_WG, BWD_SHAPES_WG2)
                ) -> BwdConfig | None:
    """The wgmma main loop's shape under which dQ is stored by it (DQ=3): one warpgroup's (64-key tiles) where every
    query tile of ``mask`` (the inner pattern of a strided one) reads one key tile, else two warpgroups' (128-key
    tiles) where that holds there, each with the fields $ATTNBENCH_BWD_SHAPE and ``fields`` name replaced; None
    where neither holds (``shapes_tried``: the shape tables tried, in order; the default choice tries
    STORE_DQ_SHAPES)."""
    for shapes in shapes_tried:
        cfg = dataclasses.replace(shapes[D][0], **{**forced_shape(), **(fields or {})})
        if cfg.NWARPS in (4, 8) and single_key_tile(mask, cfg.BM, cfg.BN):
            return cfg
    return None


def dq_pass_config(D: int, cfg: BwdConfig, minb: int | None = None, wg: int | None = None,
                   tma: int | None = None, stride: int = 1, persist: int | None = None) -> BwdConfig:
    """The shape of the dQ pass beside a main kernel of shape ``cfg``: that shape on mma.sync; beside
    the wgmma main loop, the wgmma pass's (``PASS_SHAPES_WG``) where ``wg`` (None: PASS_WG), its tiles by
    bulk tensor copies where ``tma`` (None: PASS_TMA) and the pattern's ``stride`` is 1, else mma.sync's
    own for D (``BWD_SHAPES``), a launch of the mma.sync build; with ``minb`` (PMINB) its blocks per
    multiprocessor asked of the register allocator replaced; the wgmma pass persistent where ``persist`` (None:
    PASS_PERSIST), its tiles then by cp.async."""
    wg = PASS_WG if wg is None else wg
    pcfg = (PASS_SHAPES_WG if wg else BWD_SHAPES)[D][0] if cfg.WG else cfg
    if pcfg.WG and pcfg is not cfg and (PASS_PERSIST if persist is None else persist):
        pcfg = dataclasses.replace(pcfg, PERSIST=1)
    elif pcfg.WG and pcfg is not cfg and (PASS_TMA if tma is None else tma) and stride == 1:
        pcfg = dataclasses.replace(pcfg, TMA=1)
    return pcfg if not minb else dataclasses.replace(pcfg, MINB=minb)


def persist_blocks(works: int, minb: int) -> int:
    """The blocks of a persistent launch of ``works`` works: $ATTNBENCH_BWD_PERSIST_BLOCKS when set, else the
    multiprocessors times ``minb`` (the blocks the GPU holds at once), at most ``works``; BadInput when the
    variable is not a positive count."""
    import os

    import cupy

    given = os.environ.get(PERSIST_BLOCKS_ENV, "").strip()
    if given and not (given.isdigit() and int(given) > 0):
        raise BadInput(f"{PERSIST_BLOCKS_ENV}={given!r}: expected a positive count of blocks")
    n = int(given) if given else cupy.cuda.Device().attributes["MultiProcessorCount"] * minb
    return max(1, min(works, n))


def forced_dq() -> str | None:
    """How dQ is summed: $ATTNBENCH_BWD_DQ (one of DQ_WAYS), else None (``choose_dq``'s rule);
    BadInput otherwise."""
    import os

    given = os.environ.get(DQ_ENV, "").strip() or None
    if given is not None and given not in DQ_WAYS:
        raise BadInput(f"{DQ_ENV}={given!r}: expected one of {', '.join(DQ_WAYS)}")
    return given


def forced_split() -> int | None:
    """L from $ATTNBENCH_BWD_SPLIT (0: nothing split), None when unset; BadInput when not a count."""
    import os

    given = os.environ.get(SPLIT_ENV, "").strip()
    if not given:
        return None
    if not given.isdigit():
        raise BadInput(f"{SPLIT_ENV}={given!r}: expected a count of query tiles (0: no split)")
    return int(given)


def bwd_defines(D: int, dtype: str, mask: Mask, cfg: BwdConfig | None = None, dq: str = "atomic",
                stats: int = PASS_STATS_FROM, skip: int | None = None) -> dict:
    """The -D constants of kernels/fast_tc_bwd.cu for a head dimension, dtype and pattern (the inner
    pattern and its stride when the pattern is strided); ``dq`` "pass" adds BWD_DQ_PASS, and with
    ``stats`` (1 or 2: where the pass reads O, PASS_STATS_FROM) BWD_PASS_STATS = stats (the pass
    computes the rows' lse log2 e and delta; 0: prep does), and with ``skip`` BWD_PASS_SKIP
    (the pass skips the key blocks where a warp's P is all zero; None: PASS_SKIP's for D)."""
    cfg = cfg or bwd_config(D)
    stride, inner = mask.strided()
    d = dict(HEAD_D=D, BN=cfg.BN, NWARPS=cfg.NWARPS, STAGES=cfg.STAGES, MT=1, MINB=cfg.MINB, QREG=0,
             AB_F16=int(dtype == "float16"), STRIDE=stride)
    if cfg.WG:
        d["WG"] = 1
        if cfg.PAIRS != 1:
            d["BWD_DQ_PAIRS"] = cfg.PAIRS
        if cfg.TMA:
            d["TMA"] = 1
        if cfg.PERSIST:
            d["BWD_PERSIST"] = 1
    if dq in ("pass", "fused") and (PASS_SKIP[D] if skip is None else skip):
        d["BWD_PASS_SKIP"] = 1
    if cfg.DQR:
        d["BWD_DQ_BULK"] = cfg.DQR
    if cfg.LAG:
        d["BWD_DQ_LAG"] = cfg.LAG
    if dq == "fused":  # the main loop's build with the pass's blocks beside it; prep's stats
        d["BWD_DQ_PASS"] = d["BWD_FUSED"] = 1
    elif dq == "pass":
        d["BWD_DQ_PASS"] = 1
        if stats:
            d["BWD_PASS_STATS"] = int(stats)
    elif dq == "store":
        d["BWD_DQ_STORE"] = 1
    d.update(pattern_defines(inner.tile_predicate(cfg.BM, cfg.BN)))
    return d


def check_dtype(dtype: str, what: str = "the backward") -> None:
    if dtype not in ("bfloat16", "float16"):
        raise BadInput(f"dtype={dtype} is not supported by {what} of fast-tc (supports: bfloat16, float16; "
                       f"the float32 family is forward-only)")
