"""``fast-decode``: decoding attention on tensor cores (kernels/decode.cu) for Tq queries at the end
of each sequence's cache, grouped-query heads and ragged batches, every pattern, split-KV.

The host lists, for each distinct cache length Tk_b of the batch, the key tiles some of the Tq
positions Tk_b - Tq .. Tk_b - 1 allow (``Mask.keys``), each flagged full when every one of those
positions allows every key of the tile and the tile ends within Tk_b, else partial (the kernel
masks it with the predicate), with the span of the tile those positions read: the loads leave the
rest unread (``SPANS``, ``DecodeList.device_entries``). The lists are cut into splits of equal length so that B * H_kv *
splits blocks fill the GPU whatever B; ``decode_split`` leaves each split's rows normalised with
their log-sum-exp and ``decode_merge`` weighs them. In a ragged batch every list is cut at the same tiles a
split (``RAGGED``), or, where the key slices' kernel merges by the merge launch, the lists are laid end to end
and cut into one wave of equal runs, a block's run crossing from one pair into the next (``FLAT``,
``decode_config.flat_stretches``). A block holds the H / H_kv query heads of its
key/value head times the Tq positions as its rows (at most ``ROWS``); longer query stretches are
prefill's (fast-tc). The list's first HEAD_ENTRIES entries come with the split launch as a parameter
(``list_head``), so a block's first K/V loads wait on no read of them (docs/PERF.md "decode v11").

Two kernels share the lists, the splits and the merge: kernels/decode.cu gives each warp 16 of the
block's rows; kernels/decode_keys.cu, for groups whose rows fit 16 (one query against 4 heads, the
decode configuration's Tq = 1), gives every warp the same 16 rows and a slice of each key tile's
keys, so no warp multiplies padding rows (``BY_KEYS`` picks; by default the second wherever it takes
the case). A pair with a single split stores its output from the split kernel; no merge runs. Where
the pairs are many (more than one wave of split blocks, e.g. B=64 against 8 key/value heads) and a pair's
rows fit 16, kernels/decode_pairs.cu gives each warp a whole pair instead, NWARPS pairs a block and no
splits (``BY_PAIRS``; its stages need the short lists' tiles to fit shared memory). Where the pairs are few
(B=1), a group's rows exceed 16 and its list is short, a group's query heads are dealt to several blocks
against the key/value head they share (``HEADS``; the kernels' HSPLIT), so the rows fit the key slices.

A strided pattern (dilated) with one query a sequence reads only the keys of that query's residue
class (``CLASSES=1``, the default): K and V rows the stride apart (the loader's row step, ``STRIDE``),
the inner pattern's list and predicate in class coordinates (``by_class``), so the rows the pattern
skips are not loaded (docs/PERF.md "decode v3").

Short lists (at most ``SHORT_LIST_KEYS`` keys in 64-key tiles: the sparse patterns' few tiles) take
32-key tiles (``BN_SHORT``): fewer keys loaded past the pattern's edges and more splits of a list,
where latency, not bytes, sets the time (docs/PERF.md "decode v4").

The shape (``decode_config.DecodeConfig``: warps, key-tile size, stages, blocks per SM asked of the register
allocator, the split count or what it is derived from, and which kernel) can be given for tuning: in a sweep by
``--decode-config SPEC`` (each adds a row per configuration, impl ``fast-decode[SPEC]``, timed with
the others), elsewhere by the environment variable ATTNBENCH_DECODE_CONFIG (the plain fast-decode's
shape). The shape run is in each row's ``setup_s`` (``decode_config``, ``splits``).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace

import numpy as np

from .arrays import bind
from .compile import get_module, resident_blocks
from .decode_config import (BN, DEFAULT, ENV, EVICT_L2, HEAD_DS, HEAD_DTYPE, HEAD_ENTRIES, LONG_BN, MAX_TILES, NWARPS,
                            SHORT_LIST_KEYS, SPAN_BITS, SPAN_UNIT, DecodeConfig, DecodeSpec, cluster_size, cluster_tries, flat_stretches,
                            kernel_defines, parse_decode_config, split_count)
from .errors import BadInput
from .fwd_config import WG_ARCH
from .fast_tc import LOG2E
from .impls import Impl, Problem, Runner, register, timed
from .launch import allow_nonportable_clusters, max_active_clusters, pdl_available, pdl_launch
from .patterns import Mask
from .serving import one_predicate

KERNEL, KEYS_KERNEL, PAIRS_KERNEL = "decode", "decode_keys", "decode_pairs"  # warps take a tile's rows / keys / pairs
SPLIT, KEYS_SPLIT, PAIRS_SPLIT, MERGE = "decode_split", "decode_keys_split", "decode_pairs", "decode_merge"
def by_class(prob: Problem, cfg: DecodeConfig) -> tuple[int, Mask] | None:
    """(stride, inner pattern) when fast-decode reads only the query's residue class (CLASSES 1, a
    strided pattern, one query a sequence, and one inner predicate for every cache length), else None."""
    r, inner = prob.mask.strided()
    if not cfg.CLASSES or r == 1 or prob.q_len != 1:
        return None
    if any(inner.at(class_len(t, r)).device_defines() != inner.device_defines() for t in set(prob.lens)):
        return None
    return r, inner


def class_len(Tk: int, r: int) -> int:
    """Keys of the residue class of position Tk - 1 up to it (its position in the class, plus one)."""
    return (Tk - 1) // r + 1


@dataclass(frozen=True)
class DecodeList:
    """The key tiles of one cache length's Tq positions: entries ``kt << 1 | partial``, and of each tile the keys
    some position reads, from its offset ``lo`` to ``hi`` (exclusive) in the tile."""
    Tk: int
    entries: np.ndarray  # int32
    build_s: float
    lo: np.ndarray  # int32, as entries
    hi: np.ndarray

    def device_entries(self, BN: int, spans: bool = True) -> np.ndarray:
        """The entries the kernels read (ENTRY_SPAN): ``kt << 9 | lo << 5 | tail << 1 | partial``, the tile's keys
        from SPAN_UNIT x lo to BN - SPAN_UNIT x tail holding every key some position reads (the loads zero-fill the
        others); with ``spans`` False (``--decode-config SPANS=0``), every tile whole."""
        kt, partial = self.entries.astype(np.int64) >> 1, self.entries.astype(np.int64) & 1
        if (kt >= MAX_TILES).any():
            raise ValueError(f"a decode list names at most {MAX_TILES} key tiles")
        lo = tail = np.zeros_like(kt)
        if spans and BN // SPAN_UNIT > 1:
            lo = np.minimum(self.lo // SPAN_UNIT, (1 << SPAN_BITS) - 1)
            tail = np.minimum(BN // SPAN_UNIT - -(-self.hi.astype(np.int64) // SPAN_UNIT), (1 << SPAN_BITS) - 1)
        return (kt << (1 + 2 * SPAN_BITS) | lo << (1 + SPAN_BITS) | tail << 1 | partial).astype(np.int32)

    def span_keys(self, BN: int, spans: bool = True) -> int:
        """The keys (K and V rows) a walk of this list loads: whole tiles, or with ``spans`` each tile's span."""
        e, step = self.device_entries(BN, spans).astype(np.int64), (1 << SPAN_BITS) - 1
        return int((BN - SPAN_UNIT * ((e >> (1 + SPAN_BITS) & step) + (e >> 1 & step))).sum())


def decode_list(mask: Mask, Tq: int, BN: int = BN) -> DecodeList:
    """The key tiles (of BN keys) the last Tq positions of ``mask`` (at its T) may read, full or partial, and
    the span of each that they read."""
    t0 = time.perf_counter()
    T = mask.T
    rows = np.arange(T - Tq, T, dtype=np.int64)
    keys = mask.keys(rows)  # sorted
    kts, first = np.unique(keys // BN, return_index=True)
    last = np.append(first[1:], keys.size) - 1
    lo, hi = keys[first] - kts * BN, keys[last] - kts * BN + 1
    full = np.zeros(kts.size, bool)
    inside = np.flatnonzero((kts + 1) * BN <= T)
    step = max(1, (1 << 24) // (Tq * BN))  # tiles tested at once: every position against every key
    for a in range(0, inside.size, step):
        n = inside[a:a + step]
        cols = (kts[n, None] * BN + np.arange(BN)).ravel()
        full[n] = mask.allowed(rows[:, None], cols[None, :]).reshape(Tq, n.size, BN).all(axis=(0, 2))
    ent = (kts << 1 | (~full).astype(np.int64)).astype(np.int32)
    return DecodeList(T, ent, time.perf_counter() - t0, lo.astype(np.int32), hi.astype(np.int32))


def plan_lists(prob: Problem, cfg: DecodeConfig, order: list[int], rows: int | None = None,
               compute_capability: str | int = "", sms: int = 0) -> tuple[DecodeConfig, int, Mask, list[DecodeList]]:
    """(shape, stride, mask, lists) a problem runs: the residue class's mask and stride where ``by_class``
    takes it (else 1 and the problem's), the lists of the cache lengths ``order`` in BN-key tiles, then the
    shape ``for_list`` gives for the longest of them and a block's ``rows`` (None: a whole group's; and the lists
    again in its tiles if they changed) on a device of ``compute_capability`` with ``sms`` multiprocessors (its
    pairs, B x H_kv, many where they outnumber them)."""
    stride, mask = by_class(prob, cfg) or (1, prob.mask)  # the list and predicate of the query's residue class

    def lists_of(bn: int) -> list[DecodeList]:
        return [decode_list(mask.at(class_len(t, stride)), prob.q_len, bn) for t in order]

    lists = lists_of(cfg.BN)
    pairs = prob.B * prob.kv_heads
    many = bool(sms) and pairs > sms
    chosen = cfg.for_list(max((x.entries.size for x in lists), default=0) * cfg.BN,
                          rows or prob.H // prob.kv_heads * prob.q_len, prob.D, compute_capability, many,
                          bool(sms) and not many and not cfg.few_pairs(pairs, sms))
    if chosen.BN != cfg.BN:
        lists = lists_of(chosen.BN)
    return chosen, stride, mask, lists


def list_head(tent: np.ndarray) -> np.ndarray:
    """The split launch's last argument: tent's first HEAD_ENTRIES entries (zeros past its end) as one
    structure passed by value (kernels/tc/decode_common.cuh: DecodeHead)."""
    head = np.zeros(HEAD_ENTRIES, np.int32)
    n = min(HEAD_ENTRIES, tent.size)
    head[:n] = tent[:n]
    return head.view(HEAD_DTYPE)


class DecodeRunner(Runner):
    def __init__(self, split, merge, grid, merge_grid, smem, args, merge_args, out, setup, D, threads=32 * NWARPS,
                 pdl=False):
        self._split, self._merge = split, merge  # merge None: the split kernel stores the output
        self._pdl = pdl  # the merge a programmatic dependent of the split launch
        self._threads = threads
        self._grid, self._merge_grid = grid, merge_grid
        self._merge_block = (D,)  # a thread per column
        self._smem = smem
        self._args, self._merge_args = args, merge_args
        self._out = out
        self.setup = setup

    def run(self) -> None:
        self._split(self._grid, (self._threads,), self._args, shared_mem=self._smem)
        if self._merge is None:
            return
        if self._pdl:
            pdl_launch(self._merge, self._merge_grid, self._merge_block, self._merge_args)
        else:
            self._merge(self._merge_grid, self._merge_block, self._merge_args)


@dataclass(eq=False)
class FastDecode(Impl):
    gqa = True
    decode = True
    ragged = True
    takes_prefill = False  # Tq = Tk is fast-tc's
    config: DecodeSpec | None = None  # fields of the shape fixed (``--decode-config``); None: ATTNBENCH_DECODE_CONFIG

    def decode_variant(self, spec: DecodeSpec) -> "FastDecode":
        """Named '<name>[<spec>]': its shape with ``spec``'s fields fixed."""
        return replace(self, name=f"{self.name}[{spec}]", config=spec,
                       description=f"{self.name} with the shape fields {spec} (the others at their defaults)")

    def shape(self) -> DecodeConfig:
        """The shape it runs: its own spec, else ATTNBENCH_DECODE_CONFIG's, else the default."""
        if self.config is not None:
            return self.config.apply()
        env = os.environ.get(ENV, "").strip()
        return parse_decode_config(env, ENV).apply() if env else DEFAULT

    def unsupported(self, prob: Problem) -> str | None:
        why = super().unsupported(prob)
        if why:
            return why
        if prob.D not in HEAD_DS:
            return f"D={prob.D} is not supported by {self.name} (supports D in {', '.join(map(str, HEAD_DS))})"
        why = one_predicate(prob)
        if why:
            return f"{self.name}: {why}"
        cfg = self.shape()  # (short lists take BN_SHORT's tiles only where that shape runs: ``for_list``)
        group = prob.H // prob.kv_heads
        if cfg.HEADS and group % cfg.HEADS:
            return (f"{self.name}: HEADS={cfg.HEADS} does not divide the {group} query heads of a key/value head "
                    f"(H={prob.H}, H_kv={prob.kv_heads})")
        bn = min(cfg.BN, cfg.BN_SHORT or cfg.BN)  # (the smallest tiles its lists may take)
        if -(-prob.T // bn) > MAX_TILES:
            return (f"{self.name}: T={prob.T} keys are {-(-prob.T // bn)} tiles of {bn}; its lists name at most "
                    f"{MAX_TILES} tiles (T up to {MAX_TILES * bn} at BN={bn})")
        rows = group // (cfg.HEADS or 1) * prob.q_len  # (HEADS 0 deals a group out only where it fits unsplit too)
        keys = cfg.by_keys(rows, prob.D)
        why = cfg.problem(prob.D, keys)
        if why:
            return f"{self.name}: shape {cfg.spec}: {why}"
        most = cfg.tile_rows(keys)
        if rows > most:
            return (f"H/H_kv x Tq = {rows} query rows per key/value head exceed {most} for {self.name} "
                    f"(Tq up to {most // (group // (cfg.HEADS or 1))} at this grouping"
                    + ("; BY_KEYS=1 takes 16 rows)" if keys else "; longer stretches are prefill's)"))
        return None

    def build(self, prob: Problem, q, k, v) -> Runner:
        import cupy

        qa = bind(q, "q", prob.dtype).array
        ka, va = (bind(x, name, prob.dtype).array for x, name in ((k, "k"), (v, "v")))
        if tuple(qa.shape) != prob.shape or tuple(ka.shape) != prob.kv_shape or tuple(va.shape) != prob.kv_shape:
            raise BadInput(f"q {tuple(qa.shape)}, k {tuple(ka.shape)}, v {tuple(va.shape)}: expected q {prob.shape} "
                           f"and k, v {prob.kv_shape}")
        setup: dict = {}
        lens = prob.lens
        order = sorted(set(lens))
        list_of_seq = [order.index(t) for t in lens]  # each sequence's list (one per distinct cache length)
        sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
        cc = cupy.cuda.Device().compute_capability
        given = self.shape()
        cfg, stride, mask, lists = plan_lists(prob, given, order, None, cc, sms)
        # a block's row group: H / H_kv / heads query heads x Tq; `groups` of them a sequence (the kernels' H_kv)
        heads = setup["heads"] = given.heads_split(prob.H // prob.kv_heads, prob.q_len, prob.B * prob.kv_heads, sms,
                                                   max(x.entries.size for x in lists) * cfg.BN)
        groups, rows = prob.kv_heads * heads, prob.H // prob.kv_heads // heads * prob.q_len
        if heads > 1:  # the shape (short lists' tiles) for the block's rows
            cfg, stride, mask, lists = plan_lists(prob, given, order, rows, cc, sms)
        # K's and V's bytes the launch reads from memory (each sequence's list, every key/value head once)
        kv_bytes = setup["kv_bytes"] = (sum(lists[i].span_keys(cfg.BN, bool(cfg.SPANS)) for i in list_of_seq)
                                        * prob.D * 4 * prob.kv_heads)
        cfg = cfg.evict_for(kv_bytes, cupy.cuda.Device().attributes["L2CacheSize"], heads)
        setup["decode_config"] = cfg.spec
        keys = cfg.by_keys(rows, prob.D)
        wg = setup["wgmma"] = cfg.wgmma(keys, cc)
        if cfg.kwg > 1 and not keys and not wg:
            raise BadInput(f"--decode-config KWG={cfg.kwg}: the rows kernel's warpgroups on key slices run on warpgroup "
                           f"MMA (WG=1, compute capability 9.0; this device's is {cc})")
        setup["kernel"] = KEYS_KERNEL if keys else KERNEL
        setup["classes"] = stride
        setup["tiles_build_s"] = sum(x.build_s for x in lists)
        counts = np.array([x.entries.size for x in lists], np.int64)
        firsts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        tent = np.concatenate([x.device_entries(cfg.BN, bool(cfg.SPANS)) for x in lists] + [np.zeros(1, np.int32)])
        # one predicate for every cache length (``unsupported`` refuses patterns whose predicate or
        # table depends on it)
        table = mask.table
        table = cupy.asarray(table if table is not None else np.zeros(1, np.int32), dtype=cupy.int32)
        smem = cfg.smem_bytes(prob.D, keys)

        def kernels(cluster: int = 1, flat: bool = False):
            mod = get_module(setup["kernel"], kernel_defines(prob.D, prob.dtype, mask,
                                                             cfg.cmerge_for(rows, cluster, prob.D), keys, stride,
                                                             cluster, heads=heads, wg=wg, flat=flat),
                             WG_ARCH if wg else None)
            split = mod.get_function(KEYS_SPLIT if keys else SPLIT)
            if smem > 48 * 1024:
                split.max_dynamic_shared_size_bytes = smem
            if cluster > 8:  # the non-portable sizes
                allow_nonportable_clusters(split)
            return split, mod.get_function(MERGE)

        with timed(setup, "compile_s"):
            split_k, merge_k = kernels()
        resident = 1
        if not cfg.BLOCKS_PER_SM and not cfg.SPLITS:  # one wave, by the device's occupancy of this build
            resident = setup["blocks_per_sm"] = resident_blocks(split_k, cfg.threads, smem)
        longest = int(counts.max()) if counts.size else 0
        # each pair's list length in tiles (a sequence's list, once for each of its groups)
        pair_tiles = np.repeat(counts[list_of_seq], groups)
        per_split, splits = split_count(longest, prob.B * groups, sms, cfg, resident, pair_tiles)
        cluster = cluster_size(splits, longest, rows, cfg, int(cc)) if cfg.cluster_rows_fit(prob.D, keys) else 1
        # a warp a pair (kernels/decode_pairs.cu) where the shape takes it: one split, the whole list
        by_pairs = bool(cfg.BY_PAIRS) and cfg.pairs_take(
            rows, prob.B * groups, prob.D,
            resident_blocks(split_k, cfg.threads, smem) * sms,
            cupy.cuda.Device().attributes["MaxSharedMemoryPerBlockOptin"])
        if by_pairs:
            setup["kernel"] = PAIRS_KERNEL
            setup["wgmma"] = False
            smem = cfg.pairs_smem(prob.D)
            with timed(setup, "compile_s"):
                split_k = get_module(PAIRS_KERNEL, kernel_defines(prob.D, prob.dtype, mask, cfg, stride=stride,
                                                                  pairs=True, heads=heads)).get_function(PAIRS_SPLIT)
            if smem > 48 * 1024:
                split_k.max_dynamic_shared_size_bytes = smem
            per_split, splits, cluster = max(longest, 1), 1, 1
        # the same kernel with the cluster's merge in it, where every pair's cluster fits one wave; else a
        # smaller one (``cluster_tries``); else the merge launch
        for size in cluster_tries(cluster, longest, cfg):
            with timed(setup, "compile_s"):
                split_c, _ = kernels(size)
            fit, rc = max_active_clusters(split_c, (size, groups, prob.B), cfg.threads, smem)
            setup["clusters_fit"] = fit
            if rc:  # the driver refused the question: no cluster, and the row says why
                setup["clusters_error"] = f"cuOccupancyMaxActiveClusters: CUresult {rc}"
            if fit >= prob.B * groups:
                split_k, splits, cluster = split_c, size, size
                per_split = -(-longest // splits)
                break
        else:
            cluster = 1
        setup["cluster"] = cluster
        setup["decode_config"] = cfg.cmerge_for(rows, cluster, prob.D).spec  # (CMERGE decided by the cluster)
        # a ragged batch's lists end to end in one wave of equal runs (FLAT), where the key slices' kernel merges its
        # splits in the merge launch; FLAT=2 a batch of one length too, where it has more than one split a pair
        stretches = None
        if (cfg.FLAT and keys and not by_pairs and cluster == 1 and not cfg.SPLITS and not cfg.MERGE
                and (len(set(pair_tiles.tolist())) > 1 or (cfg.FLAT == 2 and splits > 1))):
            with timed(setup, "compile_s"):
                split_k, _ = kernels(flat=True)
            wave = (1 if cfg.few_pairs(prob.B * groups, sms) else resident_blocks(split_k, cfg.threads, smem)) * sms
            stretches = flat_stretches(pair_tiles, np.repeat(firsts[list_of_seq], groups), wave, cfg.MIN_PER_SPLIT)
            splits = stretches.slots
            setup["flat_blocks"] = stretches.blocks
            setup["flat_stretches"] = len(stretches.segs)
        setup["splits"] = splits
        heads_d = cupy.asarray(np.stack([firsts, counts], axis=1).astype(np.int32))  # each list's (first, count)
        list_of = cupy.asarray(np.array(list_of_seq, np.int32))
        lens_d = cupy.asarray(np.array(lens, np.int32))
        tent_d = cupy.asarray(tent)
        # partials only for the merge launch or the last split's merge: a single split stores the output itself, a
        # cluster merges in shared memory
        part_rows = 0 if (splits == 1 or cluster > 1) and stretches is None else cfg.tile_rows(keys)
        if stretches is None:
            op = cupy.empty((prob.B, groups, splits, part_rows, prob.D), cupy.float32)
            lp = cupy.empty((prob.B, groups, splits, part_rows), cupy.float32)
        else:  # the slots no stretch fills: weight 0 in the merge (a log-sum-exp of -inf, finite rows)
            op = cupy.zeros((prob.B, groups, splits, part_rows, prob.D), cupy.float32)
            lp = cupy.full((prob.B, groups, splits, part_rows), -np.inf, cupy.float32)
        segs = cupy.asarray(stretches.segs if stretches is not None else np.zeros((1, 4), np.int32))
        seg_at = cupy.asarray(stretches.seg_at if stretches is not None else np.zeros(2, np.int32))
        out = cupy.empty(prob.shape, dtype=qa.dtype)
        tickets = cupy.zeros(prob.B * groups, cupy.int32)  # MERGE: splits finished per row group, back to 0
        scale_log2 = np.float32(prob.softmax_scale * LOG2E)
        one_len = len(order) == 1 and order[0] == prob.T  # every sequence at T: the list head as arguments
        args = (qa, ka, va, op, lp, heads_d, tent_d, lens_d, list_of, np.int32(prob.H), np.int32(groups),
                np.int32(prob.q_len), np.int32(prob.T), np.int32(per_split), scale_log2, table, out, tickets,
                np.int32(one_len), np.int32(counts[0] if one_len else 0), segs, seg_at, list_head(tent))
        merge_args = (op, lp, out, np.int32(prob.H), np.int32(groups), np.int32(prob.q_len),
                      np.int32(splits))
        # no merge launch when the last split merges, when each pair has one split (it stores the output), or
        # when the splits merge in their cluster
        merge = None if (cfg.MERGE or splits == 1 or cluster > 1) and stretches is None else merge_k
        pdl = setup["pdl"] = bool(merge is not None and cfg.PDL and pdl_available())
        grid = ((-(-groups // cfg.NWARPS), 1, prob.B) if by_pairs else (stretches.blocks, 1, 1) if stretches is not None
                else (splits, groups, prob.B))
        return DecodeRunner(split_k, merge, grid, (prob.B * prob.H * prob.q_len,), smem, args, merge_args, out,
                            setup, prob.D, cfg.threads, pdl)


IMPL = register(FastDecode(
    name="fast-decode",
    family="attnbench",
    description="decoding on tensor cores (a group of more than 16 query rows on warpgroup MMA on sm_90, else "
                "mma.sync): Tq queries at the end of each cache, grouped-query heads and ragged "
                "batches, the key tiles the pattern allows split across blocks and merged by log-sum-exp (a warp a "
                "whole pair where the pairs outnumber a wave and their rows fit 16); its shape "
                f"({DEFAULT.spec}, SPLITS=0: derived; lists of at most {SHORT_LIST_KEYS} keys in BN_SHORT-key tiles; EVICT=2: K and "
                f"V evict-first in L2 where a launch reads at most {EVICT_L2} L2s of them) tunable by `sweep --decode-config FIELD=N,...` (a row per "
                f"shape) or {ENV}=FIELD=N,...",
    dtypes=("bfloat16", "float16"),
))


def standard_builds() -> list[tuple[str, dict]]:
    """The decode configuration's instances at D = 128 and the llm head dims, bfloat16."""
    from .configs import get_config

    builds = []

    def add(b):
        if b not in builds:
            builds.append(b)

    c = get_config("decode")
    for D in HEAD_DS:
        for inst in c.instances:
            m = inst.mask(c.build_T)
            for keys in (False, True):
                add((KEYS_KERNEL if keys else KERNEL, kernel_defines(D, "bfloat16", m, keys=keys)))
            for tq in c.Tqs:  # the shape each query length runs (short lists' tiles, a residue class)
                prob = Problem(m, 1, c.H, D, "bfloat16", H_kv=c.H_kv, Tq=tq)
                cfg, stride, mask, _ = plan_lists(prob, DEFAULT, [prob.T])
                keys = cfg.by_keys(c.H // c.H_kv * tq, D)
                add((KEYS_KERNEL if keys else KERNEL, kernel_defines(D, "bfloat16", mask, cfg, keys, stride)))
                if cfg.wgmma(keys, 90):  # the rows kernel on sm_90: its warpgroup build
                    add((KERNEL, kernel_defines(D, "bfloat16", mask, cfg, keys, stride, wg=True)))
                many, _, _, _ = plan_lists(prob, DEFAULT, [prob.T], None, "90", 1)  # ... and its tiles for many pairs
                if many.BN != cfg.BN:  # (``for_list`` changes them only between two warpgroup rows-kernel shapes)
                    add((KERNEL, kernel_defines(D, "bfloat16", mask, many, stride=stride, wg=True)))
                if c.H // c.H_kv * tq <= 16 and cfg.BN != LONG_BN:  # a warp a pair: the short lists' tiles
                    add((PAIRS_KERNEL, kernel_defines(D, "bfloat16", mask, cfg, stride=stride, pairs=True)))
    # a group's query heads dealt to 4 blocks (HEADS: Tq=16 against 4 heads, 16 rows a block), on the first instance
    add((KEYS_KERNEL, kernel_defines(128, "bfloat16", c.instances[0].mask(c.build_T), keys=True, heads=4)))
    # a ragged batch's flat walk (FLAT: the key slices' kernel, the merge launch), on the first instance
    add((KEYS_KERNEL, kernel_defines(128, "bfloat16", c.instances[0].mask(c.build_T), keys=True, flat=True)))
    # the merge in the last split (MERGE=1), on the first instance
    add((KERNEL, kernel_defines(128, "bfloat16", c.instances[0].mask(c.build_T), replace(DEFAULT, MERGE=1))))
    # two warpgroups on the rows (KWG=2) with the splits merged in a cluster of 2, as at B=8, Tq=16
    add((KERNEL, kernel_defines(128, "bfloat16", c.instances[0].mask(c.build_T), replace(DEFAULT, NWARPS=8, KWG=2),
                                cluster=2, wg=True)))
    # the warpgroup build with its splits merged in a cluster of 8, of 9 (the default's, a non-portable size: B=1's
    # short lists), and in the last split
    add((KERNEL, kernel_defines(128, "bfloat16", c.instances[0].mask(c.build_T), cluster=8, wg=True)))
    add((KERNEL, kernel_defines(128, "bfloat16", c.instances[0].mask(c.build_T), cluster=DEFAULT.CLUSTER, wg=True)))
    add((KERNEL, kernel_defines(128, "bfloat16", c.instances[0].mask(c.build_T), replace(DEFAULT, MERGE=1), wg=True)))
    # the cluster's merge gathered (CMERGE=1) on the warpgroup builds (sm_90a only, as clusters are): clusters of 2
    # (two warpgroups, B=8 Tq=16) and of 8; the key slices' kernel's, sm_90 only, compile in tests/test_decode.py
    cm = replace(DEFAULT, CMERGE=1)
    add((KERNEL, kernel_defines(128, "bfloat16", c.instances[0].mask(c.build_T), replace(cm, NWARPS=8, KWG=2),
                                cluster=2, wg=True)))
    add((KERNEL, kernel_defines(128, "bfloat16", c.instances[0].mask(c.build_T), cm, cluster=8, wg=True)))
    # K and V evict-first (EVICT=1) on the kernels that take it, on the first instance
    evict = replace(DEFAULT, EVICT=1)
    first = c.instances[0].mask(c.build_T)
    for kw in (dict(), dict(keys=True), dict(pairs=True), dict(wg=True)):
        add((KEYS_KERNEL if kw.get("keys") else PAIRS_KERNEL if kw.get("pairs") else KERNEL,
             kernel_defines(128, "bfloat16", first, replace(evict, BN=32) if kw.get("pairs") else evict, **kw)))
    # a residue class's keys (CLASSES=1) for the strided instances, both kernels
    for inst in c.instances:
        r, inner = inst.mask(c.build_T).strided()
        if r > 1:
            for keys in (False, True):
                add((KEYS_KERNEL if keys else KERNEL, kernel_defines(128, "bfloat16", inner, DEFAULT, keys, r)))
    return builds


__all__ = ["FastDecode", "IMPL", "KERNEL", "KEYS_KERNEL", "PAIRS_KERNEL", "MAX_TILES", "SPAN_UNIT", "decode_list",
           "standard_builds", "by_class", "class_len", "plan_lists", "list_head"]
