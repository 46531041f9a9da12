"""fast-tc's backward (kernels/fast_tc_bwd.cu, kernels/fast_tc_bwd_wg.cu) and its forward that saves
each row's log-sum-exp: the launches. Which shape and way run where, and why, is ``bwd_config``'s.

The backward's main kernel runs on Hopper's warpgroup MMA for fast-tc on sm_90 (fast_tc_bwd_wg.cu,
``BWD_SHAPES_WG``: one warpgroup a block, key-major, P^T and dS^T kept in registers for dV and dK)
and on mma.sync with cp.async otherwise (fast_tc_bwd.cu: fast-tc-sync, and fast-tc before sm_90);
both walk the same lists and work items with the same prep and convert kernels, key-tile-major over the transposed tile list (``tiles.tile_list_t``: for each key tile the
query tiles that visit it, flagged full or partial, so only partial tiles are masked), with dQ
accumulated by float32 atomics. The lists are cut into work items of at most L query tiles
(``tiles.work_items``; L from ``split_length``), the longest first, so that no block walks a long
list alone (streaming's sink tile, BigBird's global blocks, a prefix); the items of a key tile cut in
several add their dK and dV in float32. Three launches: ``fast_tc_bwd_prep`` (delta = rowsum(dO * O)
beside the log-sum-exp, the dQ and split dK / dV accumulators zeroed), ``fast_tc_bwd`` (dK, dV, and
dQ's sums), ``fast_tc_bwd_dq`` (dQ times the scale in the storage dtype, and the split key tiles' dK
and dV). Where a query reads few keys (``choose_dq``: below ``DQ_PASS_MAX_KEYS``; beside the wgmma main
loop below ``PASS_WG_MAX_KEYS``, every llm instance but dense at T=131072), or with ``Backward(dq="pass")``
($ATTNBENCH_BWD_DQ=pass, ``--bwd-config DQ=1``), dQ comes instead from a pass of its own over the forward
list (``fast_tc_bwd_dq_pass``, the main loop then skipping dQ: on mma.sync, and beside the wgmma main loop
on wgmma too, kernels/fast_tc_bwd_dq_wg.cu, ``PASS_WG``; ``--bwd-config PWG=0``: the mma.sync build's):
no float32 accumulator and no reductions, 1.4x the products; docs/PERF.md "backward v2", "backward v6" and
"backward v15" measure both ways. The
pass computes the rows' stats itself and runs first (prep then only zeroes a split key tile's
accumulators, or does not run), reading O from a tile copied into shared memory ("backward v8" to
"backward v12"). ``--bwd-config DQ=2`` (``fast_tc_bwd_fused``) runs the pass's blocks in the wgmma
main loop's launch instead, after prep: a measured variant, not a default ("backward v12"). Where every
query tile reads one key tile of the wgmma main loop (block-diagonal up to 64 on one warpgroup's tiles,
``store_shape``), the main loop stores dQ itself (``--bwd-config DQ=3``, "backward v21"): no pass, no accumulator.
Where two warpgroups at D=128 sum dQ in the main loop (dense causal at T=131072), their panels leave by bulk tensor
reductions from two sets of staging buffers in shared memory (``default_dq_bulk``, ``--bwd-config DQR=2``,
"backward v23"); elsewhere by red.global.add from registers. At D=128 on unstrided patterns whose queries read
LAG_MIN_KEYS keys or more (dense, window 4096, the three-level dilation at T=32768) dQ is summed in the main loop by
default, its two warpgroups a tile apart (``default_lag``, ``--bwd-config LAG=1``, kernels/tc/bwd_lag.cuh: each takes
dQ of the query tile before its current one, and they meet on barriers of their own, not at a block barrier every
tile; "backward v24").

The log-sum-exp is the natural log: ``lse[b, h, i] = log(sum_j exp(scale * q_i . k_j))`` over row
i's allowed keys, float32 [B, H, T] (``reference.reference_forward``'s), as the forward with
FWD_LSE 1 (entry ``fast_tc_fwd_lse``) stores it.

Low-level API on CuPy storage arrays (bfloat16 as uint16 bit patterns): ``forward_lse(mask, q, k,
v, scale)`` -> (o, lse) and ``backward(mask, q, k, v, o, lse, do, scale)`` -> (dq, dk, dv). The
runners of ``fast-tc`` and ``fast-tc-sync`` for the passes ``bwd`` and ``fwd+bwd``
(``build_backward``) and ``attnbench.attention``'s autograd function use them.
"""
from __future__ import annotations

import dataclasses
from collections import OrderedDict

import numpy as np

from .arrays import bind
from .bwd_config import (BWD_SHAPES, BWD_SHAPES_WG, BWD_SHAPES_WG2, BwdConfig, DEFAULT_SMEM, DQ, DQ_PASS, DQ_WAYS,
                         FUSED, KERNEL, KERNEL_DQ_WG, KERNEL_WG, MAIN, MAIN_PERSIST, MAIN_TMA, PASS_SHAPES_WG,
                         PASS_SKIP, PASS_STATS, PASS_STATS_FROM, PASS_STATS_SPLIT, PREP, PREP_THREADS, SPLIT_WAVES,
                         STORE_DQ, STORE_DQ_SHAPES, bwd_config, bwd_defines, check_dtype, choose_bwd_config,
                         choose_dq, default_dq_bulk, default_item_layout, default_lag, default_pairs, dq_pass_config,
                         forced_dq, forced_shape, forced_split, lag_loop, pass_kernel, persist_blocks,
                         single_key_tile, split_length, store_shape)
from .compile import get_module
from .errors import BadInput
from .fwd_config import TileConfig
from .fast_tc import IMPL, SYNC_IMPL, LOG2E, FastTC, Launch, bind_inputs, forward_launch, table_array
from .impls import Problem, Runner, timed
from .patterns import Mask
from .tiles import lru, mask_key, tile_items_t, tile_list, tile_list_t


def fused_order(heads: np.ndarray, n_items: int, nqx: int, bh: int, classes: int):
    """The blocks of the fused launch (int32, in launch order): the main loop's blocks b (item b // (bh *
    classes), the kernels' tc_item_work_at numbering) and the pass's blocks f as -1 - f (f = (cls * bh + head) *
    nqx + x, query tile nqx - 1 - x), ordered by the query tile they start at, so that a pass block
    runs beside the items that read its query tile's Q and dO: tile by tile, the items whose stretch
    starts at query tile t (a causal band's key tile t; a split key tile's item of its stretch),
    then the pass's blocks of query tile t (``heads``: WorkItems.heads, whose third column is the
    first entry, query tile << 1 | partial; an empty item's is 0)."""
    per = bh * classes
    b = np.arange(n_items * per, dtype=np.int64)
    item = b // per
    pos_main = heads[item, 2].astype(np.int64) >> 1
    f = np.arange(nqx * per, dtype=np.int64)
    pos_pass = nqx - 1 - f % nqx
    pos = np.concatenate([pos_main, pos_pass])
    kind = np.concatenate([np.zeros(b.size, np.int8), np.ones(f.size, np.int8)])
    code = np.concatenate([b, -1 - f])
    order = np.lexsort((np.arange(code.size), kind, pos))
    return code[order].astype(np.int32)


class Backward:
    """The backward of one problem: its transposed list cut into work items (``tiles.WorkItems``)
    on the device and its kernels compiled (timed into ``setup``); ``launches`` binds them to
    arrays. ``split``: the most query tiles a work item walks (0: no key tile split; None: from
    $ATTNBENCH_BWD_SPLIT, else ``split_length`` for this GPU and ``waves``, default SPLIT_WAVES).
    ``dq``: "atomic" (dQ's sums by float32 reductions in the main kernel, converted after it),
    "pass" (dQ by a query-tile-major pass of its own over the forward list, no accumulator) or
    "fused" (that pass's blocks in the main kernel's launch, ``fused_order``; wgmma, one warpgroup,
    prep's stats) or "store" (the wgmma main loop stores dQ whole where every query tile reads one key tile,
    ``store_shape``; BadInput elsewhere); None: $ATTNBENCH_BWD_DQ, else "store" where STORE_DQ and ``store_shape``
    finds one of STORE_DQ_SHAPES (``cfg`` not given), else ``choose_dq`` (the pass below DQ_PASS_MAX_KEYS keys a query). ``stats``: where the pass's rows' stats come from (0: prep; 1, 2: the pass, from O in
    global or shared memory; None: PASS_STATS_FROM where PASS_STATS and PASS_STATS_SPLIT allow, else
    prep). ``skip``: whether the pass skips a warp's all-zero key blocks of P (None: PASS_SKIP's).
    ``pass_minb``: the pass's MINB (``dq_pass_config``; None: its shape's). ``order``: the work items'
    launch order (``tiles.work_items``; None: ``default_item_layout``'s); ``cut``: the most query tiles an
    item of a split key tile walks (``tiles.work_items``; None: ``default_item_layout``'s, 0: L's).
    ``wgmma``: the wgmma main loop (fast-tc on sm_90; ``choose_bwd_config``), else mma.sync's. ``pass_wg``:
    dQ's pass beside the wgmma main loop on wgmma too (``dq_pass_config``; None: PASS_WG); it has no skip.
    ``pass_tma``: that pass's tiles by bulk tensor copies on unstrided patterns (None: PASS_TMA). ``main_tma``:
    the wgmma main loop's Q and dO tiles by bulk tensor copies on unstrided patterns, not beside the pass's
    blocks in one launch (None: MAIN_TMA where that holds). ``pass_persist``: the wgmma pass persistent, by
    cp.async (None: PASS_PERSIST). ``main_persist``: the wgmma main loop persistent (its loads
    as ``main_tma`` says), not beside the pass's blocks in one launch (None: MAIN_PERSIST where that holds).
    ``dq_bulk``: where the wgmma main loop sums dQ and loads by bulk tensor copies, its dQ panels added by bulk tensor
    reductions (None: ``default_dq_bulk``; 2: from two sets of staging buffers in turn, not with paired tiles; given where dQ
    has its own pass or the loads are cp.async's: BadInput)."""

    def __init__(self, prob: Problem, setup: dict | None = None, cfg: BwdConfig | None = None,
                 split: int | None = None, dq: str | None = None, wgmma: bool = False, fields: dict | None = None,
                 stats: int | None = None, skip: int | None = None, waves: int | None = None,
                 pass_minb: int | None = None, order: int | None = None, cut: int | None = None,
                 pass_wg: int | None = None, pass_tma: int | None = None, main_tma: int | None = None,
                 pass_persist: int | None = None, main_persist: int | None = None, dq_bulk: int | None = None,
                 dq_lag: int | None = None):
        check_dtype(prob.dtype)
        if prob.D not in BWD_SHAPES:
            raise BadInput(f"D={prob.D} is not supported by the backward of fast-tc "
                           f"(supports D in {', '.join(map(str, sorted(BWD_SHAPES)))})")
        self.prob = prob
        kpq = prob.mask.pairs / prob.mask.T
        dq = forced_dq() if dq is None else dq
        stride, inner = prob.mask.strided()
        store = None  # the shape under which the main loop stores dQ (``store_shape``), where asked or chosen
        if wgmma and cfg is None and (dq == "store" or (dq is None and STORE_DQ)):
            store = store_shape(prob.D, inner, fields, (BWD_SHAPES_WG, BWD_SHAPES_WG2) if dq else STORE_DQ_SHAPES)
            dq = "store" if store is not None else dq
        lag_ok = (stride == 1 and main_tma != 0 and not main_persist and dq_lag != 0
                  and {**forced_shape(), **(fields or {})}.get("NWARPS", 8) == 8)
        self.dq_way = dq = choose_dq(prob.D, kpq, wgmma, lag_ok) if dq is None else dq
        if dq not in DQ_WAYS:
            raise BadInput(f"dq={dq!r}: expected one of {', '.join(DQ_WAYS)}")
        if cfg is None:
            cfg = store or choose_bwd_config(prob.D, wgmma, dq, kpq, fields)
            cfg = dataclasses.replace(cfg, PAIRS=default_pairs(prob.D, cfg, dq, {**forced_shape(), **(fields or {})},
                                                               dq_bulk))
        self.cfg = cfg
        if dq == "store" and not (cfg.WG and single_key_tile(inner, cfg.BM, cfg.BN)):
            raise BadInput("dq=store (DQ=3) stores dQ from the wgmma main loop (fast-tc on sm_90) where every query "
                           "tile reads one key tile of 64 or 128 keys; here " + (
                               f"a query tile reads several key tiles (or none) at {cfg.spec}" if cfg.WG else
                               "the main loop is mma.sync's") + ": give DQ=0, 1 or 2")
        if dq == "store" and cfg.paired(prob.D, dq) and cfg.PAIRS == 2:
            raise BadInput("dq=store (DQ=3) stores a pair's dQ once its products are done, not in flight: give "
                           "PAIRS=0 or 1")
        if dq == "fused" and not (cfg.WG and cfg.NWARPS == 4):
            raise BadInput(f"dq=fused (DQ=2) runs dQ's pass in the launch of the wgmma main loop with one warpgroup; "
                           f"this backward's main loop is {cfg.spec} ({'wgmma' if cfg.WG else 'mma.sync'})")
        if dq == "fused" and stats:
            raise BadInput(f"dq=fused (DQ=2) takes the rows' stats from prep (STATS=0), not STATS={int(stats)}")
        if dq == "fused" and main_tma:
            raise BadInput("dq=fused (DQ=2) loads the main loop's tiles by cp.async: give MTMA=0 with it")
        if main_persist and not cfg.WG:
            raise BadInput("MPER=1 is built for the wgmma main loop (fast-tc on sm_90)")
        if main_persist and dq == "fused":
            raise BadInput("MPER=1 runs the main loop's work items one after another in a block, not beside the "
                           "pass's blocks: give it DQ=0 or DQ=1, not DQ=2")
        if cfg.WG and dq != "fused" and (MAIN_PERSIST if main_persist is None else main_persist):
            self.cfg = cfg = dataclasses.replace(cfg, PERSIST=1)  # a block takes work items in turn
        if cfg.WG and not cfg.TMA and dq != "fused" and stride == 1 and (MAIN_TMA if main_tma is None else main_tma):
            self.cfg = cfg = dataclasses.replace(cfg, TMA=1)  # Q and dO by bulk tensor copies
        if dq_bulk and not (cfg.WG and dq == "atomic" and (cfg.TMA or stride > 1)):
            raise BadInput(f"DQR={dq_bulk} adds the dQ sums of the wgmma main loop with bulk tensor copies: give it "
                           f"with DQ=0 and MTMA=1 (this backward: dq={dq}, main loop {cfg.spec})")
        if dq_bulk and cfg.paired(prob.D, dq) and cfg.PAIRS == 2:
            raise BadInput(f"DQR={dq_bulk} stages a pair's dQ once its products are done, not in flight: give PAIRS=0 "
                           f"or 1")
        if dq_bulk == 2 and cfg.paired(prob.D, dq):
            raise BadInput("DQR=2 stages dQ one query tile at a time, in two sets of buffers in turn, not a pair's: "
                           "give PAIRS=0")
        if dq_lag and not lag_loop(cfg, dq):
            raise BadInput(f"LAG={dq_lag} takes dQ a tile behind in the wgmma main loop's two warpgroups, dQ summed there, "
                           f"Q and dO by bulk tensor copies, a block a work item: give it with NWARPS=8, DQ=0, "
                           f"MTMA=1 and MPER=0 on an unstrided pattern (this backward: dq={dq}, main loop {cfg.spec})")
        if dq_lag and cfg.paired(prob.D, dq):
            raise BadInput(f"LAG={dq_lag} takes dQ one query tile at a time, not a pair's: give PAIRS=0")
        if dq_lag == 2 and prob.D != 128:
            raise BadInput(f"LAG=2 issues a warpgroup's whole 64-column panel of dQ behind dK: D=128, not D={prob.D}")
        lag = default_lag(prob.D, kpq, cfg, dq) if dq_lag is None else dq_lag
        if lag:
            self.cfg = cfg = dataclasses.replace(cfg, LAG=int(lag))  # dQ a tile behind, no block barrier a tile
        bulk = default_dq_bulk(prob.D, cfg) if dq_bulk is None else dq_bulk
        if cfg.TMA and dq == "atomic" and not (cfg.paired(prob.D, dq) and cfg.PAIRS == 2) and bulk:
            self.cfg = cfg = dataclasses.replace(cfg, DQR=int(bulk))  # dQ's panels by bulk tensor reductions
        self.setup = setup = {} if setup is None else setup
        self.stride, self.inner = stride, inner
        tt = tile_list_t(inner, cfg.BM, cfg.BN)
        # the list at the backward's tile shape and its transposition (what a changed mask costs)
        setup["tiles_t_build_s"] = tile_list(inner, cfg.BM, cfg.BN).build_s + tt.build_s
        self.tiles = tt.device()
        setup["tiles_t_device_s"] = self.tiles.build_s
        self.heads = prob.B * prob.H * min(stride, prob.T)
        split = forced_split() if split is None else split
        longest = int(np.diff(tt.ptr).max(initial=0))
        if split is None:
            split = split_length(tt.n_visited, longest, self.heads, self.slots(cfg),
                                 SPLIT_WAVES if waves is None else waves)
        L = max(1, min(split, longest)) if split > 0 else max(1, longest)
        d_order, d_cut = default_item_layout(L, bool((np.diff(tt.ptr) > L).any()))
        self.order_items = d_order if order is None else int(order)
        self.cut = d_cut if cut is None else int(cut)
        items = tile_items_t(inner, cfg.BM, cfg.BN, L, self.order_items, self.cut)
        self.items = items.device()
        self.n_items, self.n_split = items.n_items, items.n_split
        setup.update(bwd_items=items.n_items, bwd_split=L, bwd_split_tiles=items.n_split,
                     bwd_items_order=self.order_items, bwd_items_cut=self.cut, bwd_items_build_s=items.build_s,
                     bwd_items_device_s=self.items.build_s)
        if self.n_items * self.heads >= 2 ** 31:
            raise BadInput(f"{self.n_items} work items x {self.heads} heads and classes exceed the grid (2^31 blocks)")
        setup["bwd_dq"] = dq
        # with dQ's own pass: the pass computes the rows' stats and runs before the main kernel, where
        # no key tile is split, or at the D of PASS_STATS_SPLIT (a split tile's accumulators zeroed by
        # prep on no row); elsewhere prep computes them. self.stats: 0 (prep's), else the pass's
        # BWD_PASS_STATS (PASS_STATS_FROM, or ``stats`` given: 0 prep's, 1 or 2 where the pass reads O and dO)
        if stats is None:
            stats = PASS_STATS_FROM if PASS_STATS and (self.n_split == 0 or PASS_STATS_SPLIT[prob.D]) else 0
        self.stats = int(stats) if dq == "pass" else 0
        self.skip = (PASS_SKIP[prob.D] if skip is None else int(skip)) if dq in ("pass", "fused") else 0
        if dq in ("pass", "fused"):  # the forward list at the dQ pass's tiles, on the device (built above on mma.sync)
            self.pcfg = pcfg = cfg if dq == "fused" else dq_pass_config(prob.D, cfg, pass_minb, pass_wg, pass_tma, stride,
                                                                        pass_persist)
            if pass_persist and not (pcfg.WG and pcfg is not cfg):
                raise BadInput("PPER=1 is built for dQ's own pass on wgmma (fast-tc on sm_90, DQ=1, PWG=1)")
            if pass_persist and pass_tma:
                raise BadInput("PPER=1 loads the pass's tiles by cp.async: give PTMA=0 with it")
            if pcfg.WG and pcfg is not cfg:
                if skip:
                    raise BadInput("SKIP=1 is not built by dQ's pass on wgmma (PWG=1): give SKIP=0 or PWG=0")
                self.skip = 0
            setup["bwd_pass_stats"] = int(self.stats)
            setup["bwd_pass_skip"] = self.skip
            self.fwd_tiles = tile_list(inner, pcfg.BM, pcfg.BN).device()
            setup["bwd_dq_tile_config"] = pcfg.spec
        if dq == "fused":
            import cupy

            self.order = cupy.asarray(fused_order(items.heads, self.n_items, self.fwd_tiles.heads.shape[0],
                                                  prob.B * prob.H, min(stride, prob.T)))
        self.table = table_array(inner)
        with timed(setup, "compile_s"):
            mod = get_module(cfg.kernel, bwd_defines(prob.D, prob.dtype, prob.mask, cfg, dq, self.stats, self.skip),
                             cfg.arch)
            self.main, self.prep, self.dq = (mod.get_function(x) for x in (MAIN, PREP, DQ))
            self.smem = cfg.smem_bytes(prob.D, dq)
            if dq == "fused":  # its blocks are the main loop's or the pass's
                self.main = mod.get_function(FUSED)
                self.smem = max(self.smem, cfg.dq_pass_smem_bytes(prob.D))
            if self.smem > DEFAULT_SMEM:
                self.main.max_dynamic_shared_size_bytes = self.smem
            if dq == "pass":
                pmod = mod if pcfg is cfg else get_module(pass_kernel(pcfg), bwd_defines(
                    prob.D, prob.dtype, prob.mask, pcfg, dq, self.stats, self.skip), pcfg.arch)
                self.dq_pass = pmod.get_function(DQ_PASS)
                self.dq_smem = pcfg.dq_pass_smem_bytes(prob.D)
                if self.dq_smem > DEFAULT_SMEM:
                    self.dq_pass.max_dynamic_shared_size_bytes = self.dq_smem
        setup["bwd_tile_config"] = cfg.spec

    @staticmethod
    def slots(cfg: BwdConfig) -> int:
        """Blocks of the main kernel the current GPU holds at once (its MINB per multiprocessor)."""
        import cupy

        return cupy.cuda.Device().attributes["MultiProcessorCount"] * cfg.MINB

    @property
    def split_rows(self) -> int:
        """Rows of the split key tiles' float32 dK / dV accumulator: BN per (slot, head, class)."""
        return self.n_split * self.heads * self.cfg.BN

    def scratch(self):
        """(ld, dq_acc, dkv_acc): float32 [B, H, T, 2] (lse * log2 e, delta), float32 [B, H, T, D]
        (one element with the dQ pass) and float32 [split rows, 2, D] (dK, dV of the split key
        tiles; one element when none)."""
        import cupy

        B, H, T, D = self.prob.shape
        dkv = cupy.empty((max(1, self.split_rows), 2, D), cupy.float32)
        acc = cupy.empty((B, H, T, D) if self.dq_way == "atomic" else (1,), cupy.float32)
        return cupy.empty((B, H, T, 2), cupy.float32), acc, dkv

    def launches(self, q, k, v, o, lse, do, dq, dk, dv, ld, dq_acc, dkv_acc) -> list[Launch]:
        """prep, main, convert on these storage arrays (lse float32 [B, H, T]; ld, dq_acc, dkv_acc:
        ``scratch``); with the dQ pass: prep, main, the pass, and the convert only when a key tile
        is split (it converts nothing else); with the pass computing the rows' stats (``stats``): the
        pass, then main; when a key tile is split, prep before them on no row but the split tiles'
        accumulators ("zero": it reads no O or dO), and the convert after; fused (``dq`` "fused"): prep,
        the main loop's items and the pass's blocks in one launch, the convert where a key tile is split; store
        (``dq`` "store"): prep (the stats alone), the main loop storing dQ itself, the convert where a key tile
        is split."""
        prob, cfg = self.prob, self.cfg
        B, H, T, D = prob.shape
        rows, srows = B * H * T, self.split_rows
        per_block = PREP_THREADS // (D // 8)
        scale = prob.softmax_scale
        it = self.items
        def prep_on(n: int) -> Launch:  # prep on n rows' stats (and dQ's zeroing), beside the split rows'
            return Launch(self.prep, (-(-max(n, srows) // per_block),), (PREP_THREADS,), 0,
                          (o, do, lse, ld, dq_acc, np.int32(n), dkv_acc, np.int32(srows)))

        prep = prep_on(rows)
        dq_main = dq if self.dq_way == "store" else dq_acc  # what the main loop writes dQ's sums into
        margs = (q, k, v, do, ld, dq_main, dk, dv, it.heads, it.tiles, self.tiles.entries, dkv_acc,
                 np.int32(B * H), np.int32(T), np.float32(scale * LOG2E), np.float32(scale), self.table)
        mmaps = []
        if cfg.TMA:  # then the maps of Q and dO (the wgmma main loop's bulk copies)
            from .tma import head_maps

            mmaps = head_maps([q, do], (cfg.BM, cfg.BM), prob.mask.rows_in_place())
            if cfg.DQR:  # then the map of dQ's float32 accumulator (its bulk reductions)
                from .tma import acc_map

                mmaps.append(acc_map(dq_acc, cfg.BM))
            margs += tuple(m.arg for m in mmaps)
        mgrid = self.n_items * self.heads
        if cfg.PERSIST:  # about the resident blocks, the items in turn
            margs += (np.int32(mgrid),)
            mgrid = persist_blocks(mgrid, cfg.MINB)
        main = Launch(self.main, (mgrid,), (cfg.threads,), self.smem, margs, mmaps)
        n8, s8 = (rows * D // 8 if self.dq_way == "atomic" else 0), srows * D // 8
        conv = Launch(self.dq, (-(-(n8 + s8) // PREP_THREADS),), (PREP_THREADS,), 0,
                      (dq_acc, dq, np.float32(scale), np.int64(n8), dkv_acc, it.split_kt, dk, dv, np.int32(B * H),
                       np.int32(T), np.int64(s8)))
        if self.dq_way == "atomic":
            return self._order([("prep", prep), ("main", main), ("convert", conv)])
        if self.dq_way == "store":  # dQ stored by the main loop: the convert only for split key tiles' dK and dV
            return self._order([("prep", prep), ("main", main)] + ([("convert", conv)] if s8 else []))
        ft = self.fwd_tiles
        if self.dq_way == "fused":  # the items and the pass's blocks in one launch, in fused_order's order
            fused = Launch(self.main, (self.order.size,), (cfg.threads,), self.smem, main.args + (
                dq, ft.heads, ft.entries, self.order, np.int32(ft.heads.shape[0])))
            return self._order([("prep", prep), ("fused", fused)] + ([("convert", conv)] if s8 else []))
        pargs = (q, k, v, do, ld, dq, ft.heads, ft.entries, np.int32(T), np.float32(scale * LOG2E), np.float32(scale),
                 self.table, o, lse)
        maps = []
        if pass_kernel(self.pcfg) == KERNEL_DQ_WG:  # then the maps of Q, K, V, dO and O (zeros without TMA)
            from .tma import TensorMap, head_maps

            BM, BN = self.pcfg.BM, self.pcfg.BN
            maps = (head_maps([q, k, v, do, o], (BM, BN, BN, BM, BM), prob.mask.rows_in_place()) if self.pcfg.TMA
                    else [TensorMap()] * 5)
            pargs += tuple(m.arg for m in maps)
        grid = (ft.heads.shape[0], B * H, min(self.stride, T))
        if self.pcfg.PERSIST:  # about the resident blocks, the works of that grid in turn
            total = grid[0] * grid[1] * grid[2]
            pargs += (np.int32(grid[0]), np.int32(B * H), np.int32(total))
            grid = (persist_blocks(total, self.pcfg.MINB), 1, 1)
        dq_pass = Launch(self.dq_pass, grid, (self.pcfg.threads,), self.dq_smem, pargs, maps)
        tail = [("convert", conv)] if s8 else []
        if self.stats:  # the pass writes the stats the main kernel reads: before it; prep on no row but
            # the split key tiles' accumulators, to zero them
            return self._order(([("zero", prep_on(0))] if s8 else []) + [("dq_pass", dq_pass), ("main", main)] + tail)
        return self._order([("prep", prep), ("main", main), ("dq_pass", dq_pass)] + tail)

    def _order(self, named: list) -> list[Launch]:
        """The launches in order; their names in ``setup["bwd_launches"]``."""
        self.setup["bwd_launches"] = ",".join(n for n, _ in named)
        return [ln for _, ln in named]


class FastTCBwdRunner(Runner):
    """``bwd``: the forward with the log-sum-exp ran once at prepare time, ``run`` is the backward
    (prep, main, convert); ``fwd+bwd``: ``run`` is the forward with the log-sum-exp, then the
    backward. ``grads`` (dq, dk, dv); ``out`` the forward's output for ``fwd+bwd`` (None for
    ``bwd``: its saved output is no output of the run, and poisoning it would break the next)."""

    def __init__(self, fwd: Launch, bwd: list[Launch], o, grads, setup: dict, cfg: TileConfig, with_fwd: bool):
        self._fwd, self._bwd = fwd, bwd
        self._o = o
        self._out = o if with_fwd else None
        self._grads = grads
        self._with_fwd = with_fwd
        self.setup = setup
        self.cfg = cfg

    def run(self) -> None:
        if self._with_fwd:
            self._fwd()
        for ln in self._bwd:
            ln()


def build_backward(impl: FastTC, prob: Problem, q, k, v, do, cfg: TileConfig | None = None) -> Runner:
    """The runner of ``impl`` for ``prob.pass_name`` ``bwd`` or ``fwd+bwd`` (``do``: the output's
    gradient, q's shape and storage dtype). BadInput naming what is missing or wrong, before any
    launch."""
    import cupy

    if do is None:
        raise BadInput(f"pass={prob.pass_name} needs do=, the output's gradient (q's shape and dtype)")
    check_dtype(prob.dtype)
    q, k, v, do = bind_inputs(prob, q, k, v, do, names=("q", "k", "v", "do"))
    setup: dict = {}
    fcfg = impl.checked_shape(prob, cfg, setup)
    B, H, T, D = prob.shape
    o = cupy.empty(prob.shape, dtype=q.dtype)
    lse = cupy.empty((B, H, T), cupy.float32)
    fwd = forward_launch(prob, fcfg, (q, k, v), o, lse, setup)
    spec = impl.bwd  # a --bwd-config variant's fields (None: as chosen)
    bwd = Backward(prob, setup, wgmma=impl.uses_wgmma(), dq=spec.dq if spec else None,
                   fields=spec.shape if spec else None, stats=spec.stats if spec else None,
                   skip=spec.skip if spec else None, waves=spec.waves if spec else None,
                   pass_minb=spec.pass_minb if spec else None, order=spec.order if spec else None,
                   split=spec.split if spec else None, cut=spec.cut if spec else None,
                   pass_wg=spec.pass_wg if spec else None, pass_tma=spec.pass_tma if spec else None,
                   main_tma=spec.main_tma if spec else None, pass_persist=spec.pass_persist if spec else None,
                   main_persist=spec.main_persist if spec else None, dq_bulk=spec.dq_bulk if spec else None,
                   dq_lag=spec.dq_lag if spec else None)
    grads = tuple(cupy.empty(prob.shape, dtype=q.dtype) for _ in range(3))
    launches = bwd.launches(q, k, v, o, lse, do, *grads, *bwd.scratch())
    with_fwd = prob.pass_name == "fwd+bwd"
    if not with_fwd:
        fwd()  # the forward's saved state, once
    return FastTCBwdRunner(fwd, launches, o, grads, setup, fcfg, with_fwd)


# ---- low-level API ------------------------------------------------------------------------------
_PLANS: OrderedDict = OrderedDict()  # forward shapes and backward plans of the low-level API


def _problem(mask: Mask, shape, dtype: str, scale) -> Problem:
    if len(shape) != 4:
        raise BadInput(f"q has shape {tuple(shape)}: expected 4 dimensions [B, H, T, D]")
    B, H, T, D = (int(x) for x in shape)
    if T != mask.T:
        raise BadInput(f"q has T={T} but the mask is for T={mask.T}")
    return Problem(mask, B, H, D, dtype, scale)


def _bound(mask: Mask, scale, dtype, **arrays):
    """(problem, CuPy storage arrays) of inputs of one shape and dtype; BadInput naming the first
    that does not fit."""
    names = list(arrays)
    first = bind(arrays[names[0]], names[0], dtype)
    check_dtype(first.dtype, "forward_lse / backward")
    prob = _problem(mask, first.array.shape, first.dtype, scale)
    if prob.D not in BWD_SHAPES:
        raise BadInput(f"D={prob.D} is not supported by the backward of fast-tc (supports D in "
                       f"{', '.join(map(str, sorted(BWD_SHAPES)))})")
    out = bind_inputs(prob, *arrays.values(), names=names)
    for a, name in zip(out, names):
        if a.data.ptr % 16:
            raise BadInput(f"{name} does not start at a 16-byte boundary (the kernels read 16 bytes at a time)")
    return prob, out


def _cached(prob: Problem, what: str, wgmma: bool, make):
    """``make()`` kept per (what, mask, shape, dtype, scale, products, device), the last 16."""
    import cupy

    key = (what, mask_key(prob.mask), prob.shape, prob.dtype, prob.softmax_scale, wgmma, cupy.cuda.Device().id)
    return lru(_PLANS, key, make, keep=16)


def forward_lse(mask: Mask, q, k, v, scale: float | None = None, dtype: str | None = None, wgmma: bool = True):
    """fast-tc's forward of q, k, v ([B, H, T, D] CuPy storage arrays, bfloat16 or float16) under
    ``mask``, saving each row's log-sum-exp: (o, lse), o in q's storage dtype, lse float32
    [B, H, T] (natural log). ``wgmma``: fast-tc's shapes (wgmma on sm_90), else fast-tc-sync's."""
    import cupy

    prob, (q, k, v) = _bound(mask, scale, dtype, q=q, k=k, v=v)
    impl = IMPL if wgmma else SYNC_IMPL
    cfg = _cached(prob, "fwd-shape", wgmma, lambda: impl.checked_shape(prob, None, {}))
    B, H, T, D = prob.shape
    o = cupy.empty(prob.shape, dtype=q.dtype)
    lse = cupy.empty((B, H, T), cupy.float32)
    forward_launch(prob, cfg, (q, k, v), o, lse)()
    return o, lse


def backward(mask: Mask, q, k, v, o, lse, do, scale: float | None = None, dtype: str | None = None,
             wgmma: bool = True):
    """The gradients (dq, dk, dv) of fast-tc's attention at q, k, v given its output ``o``, the
    rows' log-sum-exp ``lse`` (float32 [B, H, T], natural log, as ``forward_lse`` gives them) and
    the output's gradient ``do``; CuPy storage arrays of q's shape and dtype. ``wgmma``: fast-tc's
    main loop (wgmma on sm_90), else fast-tc-sync's (mma.sync)."""
    import cupy

    prob, (q, k, v, o, do) = _bound(mask, scale, dtype, q=q, k=k, v=v, o=o, do=do)
    if not isinstance(lse, cupy.ndarray) or lse.dtype != cupy.float32 or tuple(lse.shape) != prob.shape[:3] \
            or not lse.flags.c_contiguous:
        raise BadInput(f"lse must be a contiguous float32 CuPy array of shape {prob.shape[:3]} (forward_lse's), got "
                       f"{type(lse).__name__} {getattr(lse, 'dtype', '')} {tuple(getattr(lse, 'shape', ()))}")
    wg = wgmma and IMPL.uses_wgmma()
    plan = _cached(prob, ("bwd", forced_split(), forced_dq()), wg, lambda: Backward(prob, wgmma=wg))
    grads = tuple(cupy.empty(prob.shape, dtype=q.dtype) for _ in range(3))
    for ln in plan.launches(q, k, v, o, lse, do, *grads, *plan.scratch()):
        ln()
    return grads


def _builds_of(mask: Mask, D: int, dtype: str) -> list[tuple[str, dict]]:
    """The backward of ``mask`` (mma.sync and wgmma main loops) and the forwards with the log-sum-exp
    it runs after (mma.sync and wgmma shapes)."""
    from .fwd_config import choose_config, kernel_defines, lse_shape
    from .fast_tc import KERNEL as FWD

    kpq = mask.pairs / mask.T
    # the pass's stats where no key tile is split, and at the D of PASS_STATS_SPLIT where one is (the GPU's
    # size decides): elsewhere prep's too
    stats = (PASS_STATS_FROM,) + (() if PASS_STATS_SPLIT[D] else (0,))
    dq = choose_dq(D, kpq)  # mma.sync's way at this T
    # beside the wgmma main loop both ways (which one a T takes: ``choose_dq``), with dQ's pass on wgmma
    # (PASS_SHAPES_WG) where it is the pass; on unstrided patterns each wgmma build by bulk copies too (TMA)
    def both(c: BwdConfig, persist_tma: bool = False, bulk: bool = False) -> tuple:  # (and persistent: the pass
        # by cp.async only; ``bulk``: dQ summed in the main loop, by bulk tensor reductions too)
        tma = (dataclasses.replace(c, TMA=1),) + ((dataclasses.replace(c, TMA=1, PERSIST=1),) if persist_tma else ()) \
            + ((dataclasses.replace(c, TMA=1, DQR=1),) if bulk else ()) \
            + ((dataclasses.replace(c, TMA=1, DQR=2),) if bulk and not c.paired(D) else ()) \
            + tuple(dataclasses.replace(c, TMA=1, DQR=r, LAG=1) for r in (0, 2)
                    if bulk and c.NWARPS == 8 and not c.paired(D))
        return (c, dataclasses.replace(c, PERSIST=1)) + (tma if mask.strided()[0] == 1 else ())

    wgmma = [(KERNEL_WG, bwd_defines(D, dtype, mask, c, way, st))
             for way in ("pass", "atomic") for st in (stats if way == "pass" else stats[:1])
             for c in both(bwd_config(D, True, kpq, way), persist_tma=True, bulk=way == "atomic")]
    pwg = PASS_SHAPES_WG[D][0]
    passes = [(KERNEL_DQ_WG, bwd_defines(D, dtype, mask, p, "pass", st, skip=0)) for st in stats
              for p in both(pwg)]
    return [(KERNEL, bwd_defines(D, dtype, mask, dq=dq, stats=st)) for st in (stats if dq == "pass" else stats[:1])] + \
        wgmma + passes + [
        (FWD, {**kernel_defines(D, dtype, mask, lse_shape(choose_config(mask, D, wgmma))), "FWD_LSE": 1})
        for wgmma in (False, True)]


def _unique(builds) -> list[tuple[str, dict]]:
    out = []
    for b in builds:
        if b not in out:
            out.append(b)
    return out


def standard_builds() -> list[tuple[str, dict]]:
    """Those of every llm instance (SPEC section 5) at its build T, and of its class-major layout where it
    has one (fast-tc-classes), D = 64 and 128, bfloat16 (and float16 for dense causal)."""
    from .configs import LLM, layouts

    return _unique(b for D in BWD_SHAPES for inst in LLM.instances
                   for dtype in (("bfloat16", "float16") if inst.pattern == "dense" else ("bfloat16",))
                   for mask in layouts(inst.mask(LLM.build_T))
                   for b in _builds_of(mask, D, dtype))


def gate_builds(masks) -> list[tuple[str, dict]]:
    """Those of these masks at D = 64 and 128, bfloat16 and float16."""
    return _unique(b for mask in masks for D in BWD_SHAPES for dtype in ("bfloat16", "float16")
                   for b in _builds_of(mask, D, dtype))


__all__ = ["Backward", "FastTCBwdRunner", "backward", "build_backward", "forward_lse", "fused_order", "gate_builds",
           "standard_builds"]
