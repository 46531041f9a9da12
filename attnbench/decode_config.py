"""fast-decode's shape (``DecodeConfig``) and what follows from it before a launch: the defaults, each beside the
measurement that set it; ``--decode-config``'s fields (``parse_decode_config``); a build's -D constants
(``kernel_defines``); and how a pair's list is split across blocks and clusters (``split_count``, ``ragged_splits``,
``cluster_size``, ``cluster_tries``). The lists and the launches are ``decode``'s.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np

from .fwd_config import pattern_defines
from .shape_fields import parse_fields
from .patterns import Mask

HEAD_DS = (64, 128)
ENV = "ATTNBENCH_DECODE_CONFIG"
# the list's first entries passed with the split launch, a kernel parameter (kernels/tc/decode_common.cuh: DecodeHead),
# so that a block's first K/V loads wait on no read of them from global memory
HEAD_ENTRIES = 128
HEAD_DTYPE = np.dtype([("e", np.int32, (HEAD_ENTRIES,))])
MAX_SMEM = 227 * 1024  # dynamic shared memory a block may ask for (sm_80 163 KiB: refused there at launch)
# a decode list entry's span (kernels/tc/scheduler.cuh ENTRY_SPAN, given these as -D constants): the rows of its tile
# that some query may read, in steps of SPAN_UNIT keys, as SPAN_BITS bits each of the step it starts at and of the
# steps past its end; the tile in the bits above them, so a list names at most MAX_TILES tiles
SPAN_UNIT, SPAN_BITS = 16, 4
MAX_TILES = 1 << (31 - 1 - 2 * SPAN_BITS)


@dataclass(frozen=True)
class DecodeConfig:
    """fast-decode's shape: NWARPS warps, BN-key tiles in STAGES shared-memory stages, MINB blocks per
    SM asked of the register allocator; the splits of each (sequence, key/value head)'s list: SPLITS
    when given (0: derived), else as many as make B * H_kv * splits about BLOCKS_PER_SM blocks per SM
    (0: the most that fit one wave of the blocks the device says one SM holds of this build), each at
    least MIN_PER_SPLIT key tiles; MERGE 0: a second launch (decode_merge) merges the splits, a block
    per output row; 1: the last split of each (sequence, key/value head) to finish merges its rows (one
    launch; kernels/decode.cu only). BY_KEYS 0: the warps take 16 rows each (kernels/decode.cu: the
    block's rows, query heads of a group x Tq, up to 16 NWARPS); 1: every warp the same 16 rows and
    BN / NWARPS keys of each tile (kernels/decode_keys.cu, rows up to 16); 2: the second wherever the
    rows fit 16 and the shape allows it, else the first. ONE_PER_SM: with BLOCKS_PER_SM 0, when the
    SMs number at least ONE_PER_SM for each list (few sequences: long lists), one block per SM
    instead of the wave's (0: never). CLASSES 1: a strided pattern (dilated) with one query a
    sequence reads only the keys of that query's residue class, rows STRIDE apart, by its inner
    pattern's list and predicate in class coordinates, so the rows the pattern skips are never loaded
    (0: every row of the tiles its list names, masked). BN_SHORT: with BN at its default (64), lists
    of at most SHORT_LIST_KEYS keys (in BN-key tiles) take tiles of BN_SHORT keys instead where that
    shape runs (0: never; ``for_list``). PDL 1: on sm_90 and later the merge launch is a programmatic
    dependent of the split launch (attnbench/launch.py): its blocks are placed while the splits run and
    wait for them, so the gap between the two launches is hidden (0: a plain launch). CLUSTER: on sm_90
    and later, where a pair's splits number 2 to CLUSTER (at most 16; above 8 the driver's non-portable
    sizes), they run as one thread-block cluster and merge through distributed shared memory in the
    split launch: no partials in global memory and no merge launch (0: never); a pair whose list holds
    at most CLUSTER x CLUSTER_TILES key tiles takes CLUSTER splits in a cluster even where more were
    derived. A cluster runs only where the driver says every pair's cluster fits one wave
    (cuOccupancyMaxActiveClusters); where it does not, such a short list takes fewer splits in a smaller
    cluster that fits (not when SPLITS is given), a longer one the merge launch. Pairs of more than
    CLUSTER_ROWS query rows keep the merge launch. BY_PAIRS 0: a pair's splits are blocks; 1: a warp takes a
    whole pair (kernels/decode_pairs.cu: NWARPS pairs a block, no splits) wherever a pair's rows fit 16 and
    the warps' stages fit shared memory (``pairs_take``); 2: that where the pairs also outnumber one wave of
    the split kernel's blocks. HEADS: the blocks a group's query heads are dealt to (each takes H / H_kv / HEADS
    of them, x Tq rows, against the key/value head they share; the group's blocks read the same K and V, all but
    the first from L2), so that few pairs still fill the GPU and a block's rows can fit the key slices' kernel:
    1, one block a group; N dividing H / H_kv; 0, where the pairs are few (the SMs number at least ONE_PER_SM for
    each), a group's rows exceed 16 and its list holds at most HEADS_MAX_KEYS keys, the fewest blocks whose rows
    fit 16, else 1 (``heads_split``: the group's blocks read its K and V again from L2, which long lists pay for).
    WG 1: on sm_90 (compute capability 9.0) kernels/decode.cu's products run on Hopper's warpgroup MMA, a warpgroup's
    64 rows a product, where its key tiles are 32, 64 or 128 keys (``wgmma``; the sm_90a build); 0: mma.sync.
    KWG 2 (the rows kernel on warpgroup MMA, NWARPS 8): two warpgroups take the same 64 rows, each BN / 2 keys of every
    BN-key tile with a softmax of its own, merged in shared memory after the last tile, so a split's chain of tiles
    is walked two slices at a time (1: one warpgroup a 64 rows; the key slices' kernel ignores it); 0: KWG 2 with
    NWARPS 8 (BN's tiles, not BN_SHORT's) where the rows kernel runs on warpgroup MMA, a block's rows exceed 16, the pairs
    are neither few nor more than the SMs and the list holds more than WG_SHORT_LIST_KEYS keys, else 1
    (``for_list``).
    EVICT 1: K and V loaded with L2's evict-first policy (each key is read once a launch; a launch that streams more
    than L2 holds then replaces its own lines, not the ones L2 held before it); 0: plain loads; 2: the first where the
    launch's K and V bytes are at most EVICT_L2 times the device's L2 (``evict_for``), else the second. On every
    decode kernel, the rows kernel's warpgroup-MMA build (WG, sm_90a) included, whose tile loads hide their shared
    address from ptxas there (kernels/tc/mainloop_sync.cuh's tc_load_tile; docs/PERF.md "decode: evict-first on the
    warpgroup build").
    CMERGE (where a pair's splits merge in their cluster) 1: each thread issues the reads of all its four-column pieces
    (their log-sum-exps and float4s, through distributed shared memory) before it uses any, so it waits on one round
    trip; 0: piece by piece, two round trips each (kernels/tc/decode_common.cuh's decode_cluster_merge); 2: the first
    where the pair's rows give a thread of the cluster more than one piece, else the second (``cmerge_for``). The
    same sums in the same order, so the same bits.
    RAGGED 1: where the batch's lists differ in length (a ragged batch), the splits are counted from all of them:
    every list is cut at the same number of tiles a split, the most splits of the longest list whose blocks that
    hold tiles fit one wave (``ragged_splits``), so a long sequence takes more blocks than a short one; 0: from the
    longest alone, as if every list were as long (the short lists' blocks end early and leave their SMs idle). A
    batch whose lists are of one length gets the same splits either way.
    FLAT 1: where the batch's lists differ in length and the key slices' kernel merges its splits in the merge launch
    (no cluster, no warp a pair), the pairs' lists are laid end to end and cut into one wave of equal runs of tiles
    (``flat_stretches``): a block walks its run's stretches, which may cross from one pair into the next, so every
    block holds the same tiles and none is empty; 2: that for a batch of one length too, where its pairs' splits
    merge in the merge launch (a uniform batch's splits are equal, but the grid of pairs x splits may leave SMs or
    a wave's slots without a block: B=1's 8 pairs x 16 splits are 128 blocks on 132 SMs); 0: each pair's list split
    on its own (RAGGED).
    SPANS 1: a partial tile's K and V rows that no query of the block reads (past the sinks, before the window's first
    key) are zero-filled, never loaded: each list entry carries the span of its tile that some query reads, in steps
    of 16 keys (``decode.DecodeList.device_entries``); 0: every tile loaded whole.
    OV 1: where kernels/decode.cu runs on warpgroup MMA (``wgmma``), S = Q K^T of each tile and O += P V of the tile
    before it in flight together, the softmax of the one beside the other's product (tc/decode_overlap.cuh; 3 stages
    or more); 0: each product waited for before the next (tc/decode_walk.cuh). The other kernels and builds ignore
    it."""
    NWARPS: int = 4
    BN: int = 64
    STAGES: int = 3
    MINB: int = 1
    SPLITS: int = 0
    BLOCKS_PER_SM: int = 0  # one wave (H200: within 1% of the best split count tried, dense and streaming,
    MIN_PER_SPLIT: int = 4  # B 1 to 64; 4 blocks per SM was 3-17% slower on dense: docs/PERF.md "decode shapes")
    MERGE: int = 0  # the merge in the last split was 4-14% slower at B=1 (docs/PERF.md "decode: the merge")
    BY_KEYS: int = 2
    ONE_PER_SM: int = 8  # B=1: 3-4% faster than two a SM on an H200 (docs/PERF.md "decode v2")
    CLASSES: int = 1  # dilated B=64, Tq=1: 104.7 -> 61.3 us on an H100 (docs/PERF.md "decode v3")
    BN_SHORT: int = 32  # streaming 16+64 B=64, Tq=1: 25.3 -> 19.6 us on an H100 (docs/PERF.md "decode v4")
    PDL: int = 1  # the merge launch (long dense lists; clusters take the short ones) 0.1-1.4% faster on an H200
    #               (docs/PERF.md "Dense decoding at Tq=1 against cuDNN: the merge launch"; "decode v5", "decode v6")
    CLUSTER: int = 9  # H100, B=1, T=32768, 9 / 8 in one process, two runs (results/decode-cluster-sizes-b1-tq16-h100.csv,
    #                  results/decode-push-cluster9-shapes-h100.csv; docs/PERF.md "decode v18"): where 9 shortens
    #                  the heaviest split (lists of 33-65 tiles) 0.95-0.99; 11 to 16 lose (``cluster_size``)
    CLUSTER_TILES: int = 9  # window 4096 at Tq=16 (65 tiles) in a cluster: B=8 73.3 -> 70.2 us, others within
    #                          2% (H100; docs/PERF.md "decode v6")
    CLUSTER_ROWS: int = 64  # H100, 64 rows (Tq=16), the merge of four columns a load: 0.78-0.96 of the merge
    #                         launch's time at B 1 and 8 (docs/PERF.md "decode v6")
    BY_PAIRS: int = 2  # B=64, Tq=1 on an H100: streaming 16+64 19.8 -> 17.4 us, bigbird 49.7 -> 48.2, dilated 61.6 ->
    #                    59.4; fewer pairs keep the split kernel (docs/PERF.md "decode v7")
    HEADS: int = 0  # H200, B=1, Tq=16, T=32768, 4 blocks a group / 1: bigbird 0.80, streaming 16+64 0.91; lists past
    #                 512 keys 1.03-1.47 slower (window 4096 1.13, dense 1.46); B=8 (not few pairs) 1.0-1.84
    #                 (results/decode-heads-h200.csv, docs/PERF.md "decode v8")
    WG: int = 1  # H200, WG 1 / 0 in one process (results/decode-v9-wg-default-ab-h200.csv, docs/PERF.md "decode v9"):
    #              Tq=16 0.91-0.97 at B 1 and 8, 0.96-1.03 at B=64; Tq=1's short lists (the rows kernel) 0.89-0.97
    KWG: int = 0  # H200, T=32768, Tq=16, B=8, NWARPS=8,KWG=2 / the default then (results/decode-kwg-shapes-h200.csv,
    #               docs/PERF.md "decode v10"): bigbird 0.96, dilated 0.95, streaming 4+1024 0.95, window 4096 0.96,
    #               streaming 16+64 (about 100 keys) 1.14; B=1 1.01-1.13, B=64 1.03-1.53
    EVICT: int = 2  # H200, Tq=1, one process (results/decode-evict-shapes-h200.csv): 101-134 MB of K and V 0.91-0.95,
    #                 17 MB 0.97-1.01, 277 MB 1.01-1.02, 1 GB 1.01-1.05; H100, Tq=16 on the warpgroup build
    #                 (results/decode-evict-wg-shapes-h100.csv): 117-137 MB 0.93-0.95, 289 MB 0.98-0.99, 1 GB 1.01-1.04
    CMERGE: int = 2  # H100, T=32768, 1 / 0 with both in each place (results/decode-cmerge-shapes-h100.csv,
    #                  docs/PERF.md "decode v12"): B=8 Tq=16 in a cluster of 2 0.95-1.00, B=1 Tq=16 0.97-1.01; one
    #                  piece a thread (Tq=1) 0.98-1.03, so there the pieces stay in turn
    RAGGED: int = 1  # H100, B=8, Tq=1, 1 / 0 in one process (results/decode-ragged-ab-h100.csv, docs/PERF.md "decode: a
    #                  ragged batch's splits from every list"): dense, one cache of 131072 among seven of 4096 0.614,
    #                  halving lengths 0.937, the decode configuration's ragged batch 0.997; one-length lists the same
    FLAT: int = 1  # H100, B=8, Tq=1, dense, 1 / 0 in one process (results/decode-flat-ab-h100.csv, docs/PERF.md "decode: a
    #                ragged batch walked flat"): the configuration's ragged batch 0.979, one cache of 131072 among seven of
    #                4096 0.894, halving lengths 0.973; FLAT=2 / 1 on batches of one length (B 1 and 8, Tk 32768 and
    #                131072; results/decode-flat2-ab-h100.csv) 0.998-1.015
    SPANS: int = 1  # H100, T=32768, 1 / 0 in one process (results/decode-spans-ab-h100.csv, docs/PERF.md "decode v13"):
    #                 where the K and V bytes fall 8-25%, 0.886-0.955 (streaming 16+64 B=64 Tq=1 16.45 -> 14.78 us); where
    #                 they do not, 0.990-1.025
    OV: int = 0  # H100, Tq=16, OV=1,STAGES=4 / the default (results/decode-ov-shapes-h100.csv, docs/PERF.md "decode
    #              v19"): window 4096 at B=1 0.969-0.973, every other list 1.00-1.02; with 3 stages 0.98-1.06

    @property
    def rows(self) -> int:
        """The most query rows a block takes (kernels/decode.cu's tile)."""
        return 16 * self.NWARPS // self.kwg

    @property
    def kwg(self) -> int:
        """The warpgroups on a block's rows (KWG 0, not yet chosen by ``for_list``: 1)."""
        return max(self.KWG, 1)

    @property
    def threads(self) -> int:
        return 32 * self.NWARPS

    def tile_rows(self, keys: bool) -> int:
        """A block's (and a split's partial's) rows: 16 when the warps take keys."""
        return 16 if keys else self.rows

    def smem_bytes(self, D: int, keys: bool = False) -> int:
        return (self.tile_rows(keys) + 2 * self.STAGES * self.BN) * D * 2

    def cluster_rows_fit(self, D: int, keys: bool = False) -> bool:
        """Whether a block's float32 rows and log-sum-exps for the cluster's merge fit the shared memory it
        already has (Q's tile and the stages; kernels/decode_keys.cu: the stages, beside the warps' rows):
        the kernels' static assertion, asked before a cluster is built."""
        if keys:
            return (self.NWARPS + 1) * 16 * D * 4 + 16 * 4 <= 2 * self.STAGES * self.BN * D * 2
        return self.rows * D * 4 + self.rows * 4 <= self.smem_bytes(D)

    def pairs_smem(self, D: int) -> int:
        """kernels/decode_pairs.cu's shared memory: each warp's 16 query rows and its K and V stages."""
        return self.NWARPS * (16 + 2 * self.STAGES * self.BN) * D * 2

    def pairs_take(self, rows: int, pairs: int, D: int, wave: int, smem_limit: int) -> bool:
        """Whether ``pairs`` (sequence, key/value head) pairs of ``rows`` query rows each at head dimension D
        run kernels/decode_pairs.cu, a warp a pair: BY_PAIRS 1 or 2, the rows one m16 tile, no split count or
        merge given, the warps' stages within ``smem_limit`` bytes; with BY_PAIRS 2 only where the pairs
        outnumber ``wave``, the split kernel's blocks in one wave (one block a pair would need more)."""
        if not self.BY_PAIRS or rows > 16 or self.SPLITS > 1 or self.MERGE or self.pairs_smem(D) > smem_limit:
            return False
        return self.BY_PAIRS == 1 or pairs > wave

    @property
    def spec(self) -> str:
        return ",".join(f"{f}={getattr(self, f)}" for f in DECODE_FIELDS)

    def problem(self, D: int, keys: bool = False) -> str | None:
        """Why the kernel (kernels/decode_keys.cu when ``keys``, else kernels/decode.cu) cannot be built or
        launched with this shape at head dimension D (its loads split a tile's 16-byte chunks evenly
        among the threads, 8 rows apart), or None."""
        rows = self.tile_rows(keys)
        step = self.threads // (D // 8)  # rows one pass of the block's loads covers
        if step % 8 or rows % step or self.BN % step:
            return (f"NWARPS={self.NWARPS} at D={D} loads {step} rows a pass: it must be a multiple of 8 "
                    f"dividing BN={self.BN} and the {rows} rows")
        if keys:
            if self.MERGE:
                return "MERGE=1 is kernels/decode.cu's (BY_KEYS=0)"
            if self.BN % (16 * self.NWARPS) or self.BN // self.NWARPS > 32:
                return (f"BY_KEYS=1 cuts BN={self.BN} keys among NWARPS={self.NWARPS} warps: 16 or 32 keys "
                        "each")
        k = self.kwg
        if k > 1 and not keys and (self.NWARPS != 4 * k or self.BN // k not in (32, 64, 128) or self.BN % k):
            return (f"KWG={k} takes {k} warpgroups (NWARPS={4 * k}, not {self.NWARPS}) on "
                    f"slices of BN / KWG keys, 32, 64 or 128 (BN={self.BN})")
        if self.OV and not keys and self.STAGES < 3:
            return f"OV=1 keeps a tile's P V in flight beside the next tile's S: 3 stages or more (STAGES={self.STAGES})"
        if self.smem_bytes(D, keys) > MAX_SMEM:
            return f"{self.smem_bytes(D, keys)} bytes of shared memory at D={D}, above {MAX_SMEM}"
        return None

    def for_list(self, longest_keys: int, rows: int, D: int, compute_capability: str | int = "",
                 many_pairs: bool = False, middle_pairs: bool = False) -> "DecodeConfig":
        """The shape a problem of ``rows`` query rows a key/value head at head dimension D runs whose
        longest list holds ``longest_keys`` keys in BN-key tiles: with KWG 0, NWARPS=8,KWG=2 where the rows kernel
        runs on warpgroup MMA, ``rows`` exceed 16, the pairs are neither few nor many (``middle_pairs``) and the list
        holds more than WG_SHORT_LIST_KEYS keys, else KWG 1 and then BN_SHORT-key tiles where BN is the
        default's, BN_SHORT is set, the list is short and that shape builds for the rows; else this one.
        Where both shapes run the rows kernel on warpgroup MMA (``wgmma`` on ``compute_capability``) and the
        pairs outnumber the SMs (``many_pairs``: a split a pair, each block walks its whole list), only lists of
        at most WG_SHORT_LIST_KEYS keys take the short tiles (where the long tiles would take the key slices, the
        short ones stay: Tq=1)."""
        if not self.KWG:
            two = replace(self, KWG=2, NWARPS=8)
            if (middle_pairs and rows > 16 and longest_keys > WG_SHORT_LIST_KEYS and rows <= two.rows
                    and two.problem(D) is None and two.wgmma(False, compute_capability)):
                return two
            return replace(self, KWG=1).for_list(longest_keys, rows, D, compute_capability, many_pairs)
        if not (self.BN_SHORT and self.BN == LONG_BN and longest_keys <= SHORT_LIST_KEYS):
            return self
        short = replace(self, BN=self.BN_SHORT)
        keys = short.by_keys(rows, D)
        if short.problem(D, keys) is not None or rows > short.tile_rows(keys):
            return self
        if (many_pairs and longest_keys > WG_SHORT_LIST_KEYS and short.wgmma(keys, compute_capability)
                and self.wgmma(self.by_keys(rows, D), compute_capability)):
            return self
        return short

    def evict_for(self, kv_bytes: int, l2_bytes: int, heads: int = 1) -> "DecodeConfig":
        """The shape with EVICT decided for a launch that reads ``kv_bytes`` of K and V on a device whose L2 holds
        ``l2_bytes``, a group's query heads dealt to ``heads`` blocks: EVICT 2 becomes 1 where kv_bytes <= EVICT_L2 x
        l2_bytes and each K and V byte is read by one block (heads 1; with more, the others read it again from L2),
        else 0; 0 and 1 stay."""
        if self.EVICT != 2:
            return self
        return replace(self, EVICT=int(heads == 1 and kv_bytes <= EVICT_L2 * l2_bytes))

    def cmerge_for(self, rows: int, cluster: int, D: int) -> "DecodeConfig":
        """The shape with CMERGE decided for a pair of ``rows`` query rows at head dimension D whose splits merge in
        a cluster of ``cluster`` blocks: CMERGE 2 becomes 1 where the rows' four-column pieces outnumber the
        cluster's threads (a thread takes more than one, so gathering their reads saves round trips), else 0 (the
        merge launch's builds, ``cluster`` 1, hold no cluster merge); 0 and 1 stay."""
        if self.CMERGE != 2:
            return self
        return replace(self, CMERGE=int(cluster > 1 and rows * D // 4 > cluster * self.threads))

    def few_pairs(self, pairs: int, sms: int) -> bool:
        """Whether ``pairs`` (sequence, key/value head) pairs are few on ``sms`` multiprocessors: ONE_PER_SM set and
        at least that many SMs for each (one block per SM instead of the wave's; HEADS 0's groups dealt out)."""
        return bool(self.ONE_PER_SM) and sms // max(pairs, 1) >= self.ONE_PER_SM

    def heads_split(self, group: int, tq: int, pairs: int, sms: int, list_keys: int = 0) -> int:
        """The blocks (row groups) a group of ``group`` query heads x ``tq`` positions is dealt to, for ``pairs``
        = B x H_kv groups on ``sms`` multiprocessors whose longest list holds ``list_keys`` keys: HEADS where
        given; with HEADS 0, where the pairs are few (the SMs number at least ONE_PER_SM for each), the list
        holds at most HEADS_MAX_KEYS keys and the group's rows exceed 16, the fewest that divide the group and
        leave a block 16 rows or fewer; else 1."""
        if self.HEADS:
            return self.HEADS
        if group * tq <= 16 or not self.few_pairs(pairs, sms) or list_keys > HEADS_MAX_KEYS:
            return 1
        return next((n for n in range(2, group + 1) if group % n == 0 and group // n * tq <= 16), 1)

    def wgmma(self, keys: bool, compute_capability: str | int) -> bool:
        """Whether kernels/decode.cu (not the key slices, ``keys``) runs its products on warpgroup MMA on a device of
        this compute capability: WG 1, sm_90 itself (the build is sm_90a's), a warpgroup's slice of a tile (the
        tile itself but with KWG 2) 32, 64 or 128 keys."""
        return (bool(self.WG) and not keys and str(compute_capability) == "90"
                and self.BN // self.kwg in (32, 64, 128))

    def by_keys(self, rows: int, D: int) -> bool:
        """Whether a group of ``rows`` query rows at head dimension D runs kernels/decode_keys.cu."""
        if self.BY_KEYS == 2:
            return rows <= 16 and self.problem(D, keys=True) is None
        return bool(self.BY_KEYS)


DECODE_FIELDS = tuple(f.name for f in fields(DecodeConfig))
DECODE_LIMITS = {"NWARPS": (4, 16, 4), "BN": (16, 256, 16), "STAGES": (2, 8, 1), "MINB": (1, 16, 1),
                 "SPLITS": (0, 4096, 1), "BLOCKS_PER_SM": (0, 64, 1), "MIN_PER_SPLIT": (1, 4096, 1),
                 "MERGE": (0, 1, 1), "BY_KEYS": (0, 2, 1), "ONE_PER_SM": (0, 1024, 1), "CLASSES": (0, 1, 1),
                 "BN_SHORT": (0, 256, 16), "PDL": (0, 1, 1), "CLUSTER": (0, 16, 1), "CLUSTER_TILES": (1, 4096, 1),
                 "CLUSTER_ROWS": (1, 4096, 1), "BY_PAIRS": (0, 2, 1), "HEADS": (0, 16, 1), "WG": (0, 1, 1),
                 "KWG": (0, 2, 1), "EVICT": (0, 2, 1), "CMERGE": (0, 2, 1),
                 "RAGGED": (0, 1, 1), "FLAT": (0, 2, 1), "SPANS": (0, 1, 1), "OV": (0, 1, 1)}
DEFAULT = DecodeConfig()
LONG_BN = DEFAULT.BN
# lists of at most this many keys (in 64-key tiles) take BN_SHORT-key tiles. H100, B 1 to 64, Tq 1 and 16, BN=32 /
# BN=64 (results/decode-v4-tiles-ab-h100.csv): streaming 16+64 0.77-1.00, streaming 4+1024 (about 1100 keys)
# 0.93-0.99, dilated 512/2 0.92-1.00, bigbird 0.99-1.05; window 4096 (4111 keys) 1.00 at Tq=1 and 1.09 at
# Tq=16, dense at 131072 keys 1.14
SHORT_LIST_KEYS = 2048
# ... but on the rows kernel's warpgroup MMA where the pairs outnumber the SMs, only lists of at most this many keys.
# H200, Tq=16, B=64, T=32768, BN_SHORT=0 / the 32-key tiles, both WG 1 (results/decode-v9-wg-ab-h200.csv): dilated
# 512/2 0.85, streaming 4+1024 0.88, bigbird 0.96, streaming 16+64 (about 100 keys) 1.26; at B=8 0.98-1.07
WG_SHORT_LIST_KEYS = 256
# HEADS 0 deals a group's heads to several blocks only where its list holds at most this many keys (in its tiles):
# each block reads the list's K and V, so L2's bytes grow with the blocks (results/decode-heads-h200.csv)
HEADS_MAX_KEYS = 512
# EVICT 2 loads K and V evict-first where a launch reads at most this many times L2's bytes of them. H200 (60 MiB of
# L2), Tq=1: 101-134 MB 0.91-0.95 of plain loads, 277 MB (streaming 4+1024, B=64) 1.01-1.02, 1 GB and more 1.01-1.05
# (results/decode-evict-shapes-h200.csv); one read of 128 MiB 0.92, of 1 GiB 1.05 (results/floor-evict-h200.csv)
EVICT_L2 = 3
NWARPS, BN, STAGES = DEFAULT.NWARPS, DEFAULT.BN, DEFAULT.STAGES
ROWS = DEFAULT.rows  # query rows of a block: query heads of a group x Tq
BLOCKS_PER_SM = DEFAULT.BLOCKS_PER_SM  # the splits aim at this many blocks per multiprocessor (0: one wave)
MIN_PER_SPLIT = DEFAULT.MIN_PER_SPLIT  # key tiles of a split, at least


@dataclass(frozen=True)
class DecodeSpec:
    """Fields of fast-decode's shape given (``--decode-config``, ATTNBENCH_DECODE_CONFIG); the others
    at DecodeConfig's defaults."""
    given: tuple  # (field, value) pairs in DECODE_FIELDS order

    def __str__(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.given)

    def apply(self, cfg: DecodeConfig = DEFAULT) -> DecodeConfig:
        return replace(cfg, **dict(self.given))


def parse_decode_config(text: str, option: str = "--decode-config") -> DecodeSpec:
    """'FIELD=N,...' of NWARPS, BN, STAGES, MINB, SPLITS, BLOCKS_PER_SM, MIN_PER_SPLIT, MERGE, BY_KEYS,
    ONE_PER_SM, CLASSES, BN_SHORT, PDL, CLUSTER, CLUSTER_TILES, CLUSTER_ROWS, BY_PAIRS, HEADS, WG, KWG, EVICT,
    CMERGE, RAGGED, FLAT, SPANS, OV (any case; the others at their defaults) or all by position from NWARPS,BN,STAGES; BadInput naming
    ``option`` and the limit."""
    given = parse_fields(text, option, DecodeConfig, DECODE_LIMITS, min_positional=3)
    return DecodeSpec(tuple((f, given[f]) for f in DECODE_FIELDS if f in given))


def kernel_defines(D: int, dtype: str, mask: Mask, cfg: DecodeConfig = DEFAULT, keys: bool = False,
                   stride: int = 1, cluster: int = 1, pairs: bool = False, heads: int = 1, wg: bool = False,
                   flat: bool = False) -> dict:
    """The -D constants of kernels/decode.cu (kernels/decode_keys.cu when ``keys``: BN is then a warp's
    slice of the tile; kernels/decode_pairs.cu when ``pairs``): the head dimension, dtype, shape and the
    pattern (with ``stride`` > 1, the inner pattern of a residue class, one query a sequence: ``by_class``;
    with ``cluster`` > 1, the splits of a pair are a cluster of that many blocks that merges in the
    launch: sm_90 only; with ``heads`` > 1, each group's query heads dealt to that many blocks: HSPLIT; with ``wg``,
    kernels/decode.cu's products on warpgroup MMA: WG 1, an sm_90a build, the softmax's max taken on every tile, and
    with OV 1 the overlapped walk (DECODE_OV 1); with
    ``flat``, the key slices' kernel walking a flat run of stretches a block: FLAT 1)."""
    bn = cfg.BN // cfg.NWARPS if keys else cfg.BN
    d = dict(HEAD_D=D, BN=bn, NWARPS=cfg.NWARPS, STAGES=cfg.STAGES, MT=1, MINB=cfg.MINB, QREG=1, STRIDE=stride,
             DECODE_HEAD_N=HEAD_ENTRIES, ENTRY_SPAN=1, SPAN_UNIT=SPAN_UNIT, SPAN_BITS=SPAN_BITS)  # (SPANS)
    if not keys and not pairs:
        d["MERGE_LAST"] = cfg.MERGE
    if cluster > 1:
        d["CLUSTER"] = cluster
        if cfg.CMERGE == 1:  # (2: not yet decided, ``cmerge_for``)
            d["CMERGE"] = 1
    if heads > 1:
        d["HSPLIT"] = heads
    if flat:
        if not keys or cluster > 1:
            raise ValueError("FLAT is the key slices' kernel's (kernels/decode_keys.cu), with the merge launch")
        d["FLAT"] = 1
    if wg:
        if keys or pairs:
            raise ValueError("WG is kernels/decode.cu's (the rows kernel)")
        d.update(WG=1, LAZY=0)
        if cfg.kwg > 1:  # two warpgroups on the rows, a slice of each tile each
            d.update(KWG=cfg.kwg, BN=cfg.BN // cfg.kwg)
        if cfg.OV:  # the products of consecutive tiles in flight together
            d["DECODE_OV"] = 1
    elif cfg.kwg > 1 and not keys and not pairs:
        raise ValueError(f"KWG={cfg.kwg} is the rows kernel's on warpgroup MMA (WG=1, sm_90)")
    if cfg.EVICT == 1:  # (2: not yet decided, ``evict_for``)
        d["KV_EVICT"] = 1
    return dict(d, AB_F16=int(dtype == "float16"), **pattern_defines(mask))


def smem_bytes(D: int, cfg: DecodeConfig = DEFAULT, keys: bool = False) -> int:
    return cfg.smem_bytes(D, keys)


def fewest_splits(tiles: int, per_split: int) -> int:
    """The splits a list of ``tiles`` tiles takes at ``per_split`` tiles a split (at least 1): none without a tile."""
    return max(1, -(-tiles // per_split))


def split_count(longest: int, work: int, sms: int, cfg: DecodeConfig = DEFAULT, resident: int = 1,
                lengths=None) -> tuple[int, int]:
    """(key tiles a split, splits) for lists of at most ``longest`` tiles and ``work`` = B * H_kv of
    them on ``sms`` multiprocessors: SPLITS when given; with BLOCKS_PER_SM 0 the most splits whose
    blocks fit one wave of ``resident`` blocks per SM (at least 1, each at least MIN_PER_SPLIT tiles),
    or one block per SM where the SMs number ONE_PER_SM or more for each list; else about BLOCKS_PER_SM
    blocks per SM, each split at least MIN_PER_SPLIT tiles. ``lengths``, each of the ``work`` lists' tiles
    where known: with RAGGED 1 and lists of different lengths, one wave counts only the blocks that hold tiles
    (``ragged_splits``)."""
    if cfg.SPLITS or not cfg.BLOCKS_PER_SM:
        if cfg.few_pairs(work, sms):
            resident = 1
        most = -(-longest // cfg.MIN_PER_SPLIT)
        splits = cfg.SPLITS or max(1, min(resident * sms // work, most))
        if not cfg.SPLITS and cfg.RAGGED and lengths is not None and len(lengths) and min(lengths) < longest:
            splits = ragged_splits(lengths, longest, resident * sms, splits, most)
        per_split = max(1, -(-longest // splits))
    else:
        per_split = max(cfg.MIN_PER_SPLIT, -(-longest * work // (cfg.BLOCKS_PER_SM * sms)))
    return per_split, fewest_splits(longest, per_split)


def ragged_splits(lengths, longest: int, slots: int, least: int, most: int) -> int:
    """The most splits of the longest list (from ``least`` to ``most``) such that, with every list of ``lengths``
    tiles cut at the same tiles a split, the blocks that hold tiles number at most ``slots`` (one wave). A list
    of half the longest's tiles then takes about half its blocks; the grid's other blocks of it find no tile and
    end at once."""
    lengths = np.asarray(lengths, np.int64)
    best = least
    for s in range(least + 1, most + 1):
        per = -(-longest // s)
        if int((-(-lengths // per)).sum()) > slots:
            break
        best = s
    return best


@dataclass(frozen=True)
class Stretches:
    """A flat walk (FLAT): block x takes ``segs[seg_at[x] : seg_at[x + 1]]``, each (pair, its partial's index,
    first entry's index in the lists' entries, tiles); a pair's partials are ``slots`` apart (pair * slots + its
    stretch's rank among the pair's), the slots no stretch fills left to the merge as weight 0."""
    segs: np.ndarray  # int32 [n, 4]
    seg_at: np.ndarray  # int32 [blocks + 1]
    slots: int

    @property
    def blocks(self) -> int:
        return len(self.seg_at) - 1


def flat_stretches(lengths, firsts, blocks: int, least: int = 1) -> Stretches:
    """The pairs' lists (``lengths`` tiles each, the first entry of pair p at ``firsts[p]``) laid end to end and cut
    into runs of ceil(total / ``blocks``) tiles, at least ``least`` (so at most ``blocks`` runs, one wave; the last
    may be shorter); a run's stretches are its pieces of each pair it crosses."""
    lengths = np.asarray(lengths, np.int64)
    firsts = np.asarray(firsts, np.int64)
    ends = np.cumsum(lengths)
    total = int(ends[-1]) if len(ends) else 0
    per = max(least, -(-total // max(blocks, 1)), 1)
    segs, seg_at, rank = [], [0], np.zeros(len(lengths), np.int64)
    p = 0
    for lo in range(0, total, per):
        hi = min(total, lo + per)
        while lo < hi:
            while ends[p] <= lo:  # (pairs of no tiles: none of their own)
                p += 1
            take = min(hi, int(ends[p])) - lo
            segs.append((p, int(rank[p]), int(firsts[p] + lo - (ends[p] - lengths[p])), take))
            rank[p] += 1
            lo += take
        seg_at.append(len(segs))
    slots = max(1, int(rank.max()) if len(rank) else 1)
    out = np.array(segs, np.int64).reshape(-1, 4)
    out[:, 1] += out[:, 0] * slots
    return Stretches(out.astype(np.int32), np.array(seg_at, np.int32), slots)


def cluster_size(splits: int, longest: int, rows: int, cfg: DecodeConfig, compute_capability: int) -> int:
    """The blocks of the cluster a pair's ``splits`` (of lists of at most ``longest`` key tiles, ``rows``
    query rows a pair) merge in (1: none, the merge launch or the split's own store): on compute
    capability 90 and later, with the merge not the last split's (MERGE) and at most CLUSTER_ROWS rows,
    the splits themselves where they number 2 to CLUSTER, or CLUSTER where more were derived and the list
    holds at most CLUSTER x CLUSTER_TILES tiles, fewer where CLUSTER splits would leave one without a tile (the
    fewest that keep ceil(tiles / CLUSTER) a split). The caller still checks that the clusters fit one wave
    (and takes fewer splits where they do not)."""
    if (cfg.MERGE or not cfg.CLUSTER or compute_capability < 90 or splits < 2 or cfg.SPLITS > cfg.CLUSTER
            or rows > cfg.CLUSTER_ROWS):
        return 1
    if splits <= cfg.CLUSTER:
        return splits
    if longest > cfg.CLUSTER * cfg.CLUSTER_TILES:
        return 1
    return fewest_splits(longest, -(-longest // cfg.CLUSTER))  # (64 tiles: 8 of 8, not 9 with the ninth empty)


def cluster_tries(cluster: int, longest: int, cfg: DecodeConfig) -> list[int]:
    """The cluster sizes to try, largest first, until the driver says every pair's fits one wave: none for
    ``cluster`` 1; for a short list (at most CLUSTER x CLUSTER_TILES tiles) ``cluster`` down to 2, fewer and
    longer splits; for a longer one, or splits given (SPLITS), ``cluster`` only (fewer splits would lengthen a
    long chain, or override the count asked for)."""
    if cluster == 1:
        return []
    if cfg.SPLITS or longest > cfg.CLUSTER * cfg.CLUSTER_TILES:
        return [cluster]
    return list(range(cluster, 1, -1))
