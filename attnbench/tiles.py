"""Key-tile lists: which key tiles each query tile visits, each flagged full or partial.

A list is built from a pattern's intervals (``Pattern.intervals``) in two steps:

1. per query tile, on the host, a few key-tile ranges per family: the hull of the family over the
   tile's rows (visited) and the part every row of the tile allows (full, exact families only).
   A sweep over the range ends cuts them into *runs*: consecutive key tiles with one flag. This
   step costs O(query tiles x families), whatever the number of entries;
2. the runs are expanded into entries ``kt << 1 | partial`` (CSR: ``ptr`` per query tile), on the
   host with numpy (``Tiles.entries``) or on the GPU (``Tiles.device``, kernels/tiles.cu), where a
   dense list of a million entries takes microseconds.

A pattern of one family may give step 1's ranges in closed form instead (``Pattern.tile_bounds``:
document, whose build then costs a few vectorised passes over the query tiles).

``tile_list`` caches lists per (pattern, parameters, T, causal, BM, BN) and each list keeps the
seconds its build took, so a benchmark row reports the build even when the list was cached.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

_BIG = np.int32(1 << 30)


@dataclass(frozen=True, eq=False)
class Tiles:
    """Key tiles each query tile visits: entries ``kt << 1 | partial``, CSR over query tiles,
    stored as runs (``run_off``: index of a run's first entry, ``run_val``: that entry; entry
    ``run_off + t`` of a run is ``run_val + 2 t``)."""
    BM: int
    BN: int
    ptr: np.ndarray      # int32 [n_qtiles + 1]
    run_off: np.ndarray  # int64 [n_runs], increasing
    run_val: np.ndarray  # int64 [n_runs]
    build_s: float = 0.0
    rebuild_s: float = 0.0  # a second build of the same list, warm (what a training step that
                            # rebuilds its mask pays; Flex's block_mask_build_s is measured so too)
    on_device: object = field(default=None, repr=False)  # a pattern's own device build of the list
                                                         # (``Pattern.device_tiles``), or None
    _device: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_entries(cls, BM: int, BN: int, ptr, entries) -> "Tiles":
        """A list given entry by entry (one run per entry)."""
        entries = np.asarray(entries, np.int64)
        return cls(BM, BN, np.asarray(ptr, np.int32), np.arange(entries.size, dtype=np.int64), entries)

    @property
    def n_visited(self) -> int:
        return int(self.ptr[-1])

    @functools.cached_property
    def run_len(self) -> np.ndarray:
        return np.diff(np.append(self.run_off, self.n_visited))

    @property
    def n_partial(self) -> int:
        return int(self.run_len[(self.run_val & 1) == 1].sum())

    @functools.cached_property
    def entries(self) -> np.ndarray:
        """int32 [n_visited], expanded on the host."""
        n = self.n_visited
        base = np.repeat(self.run_val - 2 * self.run_off, self.run_len)
        return (base + np.arange(0, 2 * n, 2, dtype=np.int64)).astype(np.int32)

    def device(self) -> "DeviceTiles":
        """The list on the current CUDA device, built once per device: by the pattern's own device
        build where it has one, else expanded there from the runs."""
        return _per_device(self._device, self.device_build)

    def device_build(self) -> "DeviceTiles":
        """A new device copy of the list, uncached (its ``build_s``: what this build took)."""
        return self.on_device() if self.on_device is not None else DeviceTiles.expand(self)


def _per_device(store: dict, make):
    """``store``'s value for the current CUDA device, ``make()`` the first time."""
    import cupy

    dev = cupy.cuda.Device().id
    d = store.get(dev)
    if d is None:
        d = store[dev] = make()
    return d


@dataclass(frozen=True)
class DeviceTiles:
    """A tile list on a device (int32): ``ptr``, ``entries`` (one 0 when the list is empty; room
    for more after the list's own where a build could not know its size), ``heads`` [n_qtiles, 4]
    (``heads`` below), and ``build_s``, the seconds from the upload of the runs to the end of their
    expansion (kernels/tiles.cu, one launch). ``table``: the pattern's table where the build wrote
    it too (``Pattern.device_tiles``), else None."""
    ptr: object
    entries: object
    heads: object
    build_s: float
    table: object = None

    @classmethod
    def expand(cls, tiles: Tiles) -> "DeviceTiles":
        import cupy

        from .compile import get_module

        kernel = get_module("tiles", {}).get_function("expand_tiles")  # compiled once, not timed
        nq, n, runs = tiles.ptr.size - 1, tiles.n_visited, tiles.run_off.size
        stream = cupy.cuda.get_current_stream()
        stream.synchronize()
        t0 = time.perf_counter()
        packed = np.concatenate([tiles.ptr, tiles.run_off, tiles.run_val - 2 * tiles.run_off]).astype(np.int32)
        packed = cupy.asarray(packed)
        # one allocation: the entries (one 0 when the list is empty), then the heads 16-byte aligned
        ne = -(-max(n, 1) // 4) * 4
        out = cupy.empty(ne + 4 * nq, cupy.int32) if n else cupy.zeros(ne + 4 * nq, cupy.int32)
        entries, heads = out[:max(n, 1)], out[ne:].reshape(nq, 4)
        threads = 256
        kernel((-(-(n + nq) // threads),), (threads,),
               (packed, np.int32(nq), np.int32(runs), np.int32(n), entries, heads))
        stream.synchronize()
        return cls(packed[:nq + 1], entries, heads, time.perf_counter() - t0)


def heads(ptr, entries) -> np.ndarray:
    """int32 [n_qtiles, 4]: per query tile the index of its first entry, its entry count and its
    first two entries (0 past the end), fast_tc's one read before its first loads (the host
    version of what kernels/tiles.cu writes)."""
    start = ptr[:-1].astype(np.int64)
    count = np.diff(ptr).astype(np.int64)
    ent = np.append(np.asarray(entries)[:int(ptr[-1])], np.zeros(2, np.int32)).astype(np.int64)
    return np.stack([start, count, np.where(count > 0, ent[start], 0),
                     np.where(count > 1, ent[start + 1], 0)], axis=1).astype(np.int32)


# ---- building ---------------------------------------------------------------------------------
def _segment_starts(T: int, BM: int, run: int | None) -> np.ndarray:
    """Rows where a segment starts: every query tile's first row and, for a pattern constant over
    runs of rows, every run's first row (the union of two progressions, one period tiled)."""
    if not run or run % BM == 0:
        return np.arange(0, T, BM, dtype=np.int64)
    if BM % run == 0:
        return np.arange(0, T, run, dtype=np.int64)
    period = BM * run // math.gcd(BM, run)
    base = np.union1d(np.arange(0, period, BM), np.arange(0, period, run)).astype(np.int64)
    starts = (np.arange(0, T, period, dtype=np.int64)[:, None] + base[None]).ravel()
    return starts[starts < T]


def _runs_per_tile(BM: int, run: int | None) -> int:
    """The most runs of ``run`` rows one tile of BM rows touches (tiles and runs both start at
    multiples of their size; the pattern repeats every lcm(BM, run) rows)."""
    if not run:
        return 1
    q = np.arange(run // math.gcd(BM, run), dtype=np.int64) * BM
    return int(((q + BM - 1) // run - q // run).max()) + 1


def _tile_ranges(mask, BM: int, BN: int):
    """Per query tile and family: the visited key-tile range [ks, ke) and the full one [fs, fe),
    int32 arrays [families, query tiles]."""
    T = mask.T
    nq = -(-T // BM)
    # segments: the rows of a tile cut where the pattern's monotone runs start; within a segment
    # the hull of a family is [lo(first), hi(last)) and its intersection [lo(last), hi(first))
    # (when not empty every row in between holds it), so two rows per segment tell all
    run = mask.pattern.monotone_run(mask.params)
    starts = _segment_starts(T, BM, run)
    ends = np.append(starts[1:], T) - 1
    split = _runs_per_tile(BM, run)  # runs sharing a tile get families of their own
    S = starts.size
    lo, hi, exact = mask.intervals(np.concatenate([starts, ends]), split)
    lo, hi = lo.astype(np.int32), hi.astype(np.int32)  # half the bytes of every step below
    lo_f, lo_l, hi_f, hi_l = lo[:, :S], lo[:, S:], hi[:, :S], hi[:, S:]
    seg_has = hi_l > lo_f
    if S == nq:  # one segment per tile: its hull and intersection are the tile's
        ks = lo_f // BN
        ke = np.where(seg_has, -(-hi_l // BN), ks)
        i_lo, i_hi = lo_l, hi_f
    else:  # per tile: the union of its segments' hulls, the intersection of their intersections
        first = np.searchsorted(starts, np.arange(nq, dtype=np.int64) * BM)
        u_lo = np.minimum.reduceat(np.where(seg_has, lo_f, _BIG), first, axis=1)
        u_hi = np.maximum.reduceat(np.where(seg_has, hi_l, -_BIG), first, axis=1)
        has = np.logical_or.reduceat(seg_has, first, axis=1)
        ks = np.where(has, u_lo // BN, 0)
        ke = np.where(has, -(-u_hi // BN), 0)
        i_lo = np.maximum.reduceat(lo_l, first, axis=1)
        i_hi = np.minimum.reduceat(np.where(hi_f > lo_f, hi_f, -_BIG), first, axis=1)
    fs = -(-i_lo // BN)
    fe = np.minimum(i_hi, T) // BN  # a tile reaching past T is never full
    fe = np.where(exact[:, None] & (fe > fs), fe, fs)
    return ks, ke, fs, fe


def build(mask, BM: int, BN: int, fresh: bool = False) -> Tiles:
    """The tile list of ``mask`` for BM-row query tiles and BN-key tiles: every key tile any row
    of a query tile may see, flagged partial unless one exact family allows the whole tile for
    every row. A pattern without intervals gives its own (``Pattern.build_tiles``: custom
    classifies every tile, ``fresh`` asks it not to take one it kept)."""
    own = mask.pattern.build_tiles(mask, BM, BN, fresh)
    if own is not None:
        return own
    t0 = time.perf_counter()
    if mask.T >= 2 ** 29:
        raise ValueError(f"T={mask.T} is too long for the tile-list build (int32 keys): T < 2^29")
    bounds = mask.pattern.tile_bounds(mask, BM, BN)
    if bounds is not None:  # one family in closed form (document), maybe a device build of its own
        tiles = _three_runs(BM, BN, bounds, t0)
        if mask.pattern.builds_on_device:
            tiles = dataclasses.replace(tiles, on_device=functools.partial(mask.pattern.device_tiles, mask, BM, BN))
        return tiles
    ks, ke, fs, fe = _tile_ranges(mask, BM, BN)
    F, nq = ks.shape
    if F == 1:
        return _one_family(BM, BN, ks[0], ke[0], fs[0], fe[0], t0)
    return _sweep(BM, BN, ks, ke, fs, fe, t0)


def _sweep(BM: int, BN: int, ks, ke, fs, fe, t0: float) -> Tiles:
    """``build`` from the per-family ranges of every query tile ([F, query tiles] each)."""
    F, nq = ks.shape
    # sweep the 4F range ends of each query tile in order: the coverage after an end holds up to
    # the next end; a piece covered by a visited range is a run, partial unless a full one covers it.
    # Each end is sorted as one int32 key, key tile << 2 | kind (a row-wise argsort costs 5x more).
    # Both coverages come from one running sum, visited + M x full (each at most F < M), taken
    # over all rows at once: every row closes what it opens, so the sum is 0 at each row's end
    M = 1 << F.bit_length()
    if F * M >= 2 ** 30:
        raise ValueError(f"{F} interval families are too many for the tile-list build")
    keys = np.empty((nq, 4 * F), np.int32)  # fresh arrays cost page faults: work in place
    for n, a in enumerate((ks, ke, fs, fe)):
        keys[:, n * F:(n + 1) * F] = a.T
    keys <<= 2
    keys |= np.repeat(np.arange(4, dtype=np.int32), F)
    keys.sort(axis=1)
    keys = keys.ravel()  # [nq x 4F], row by row
    # kind k -> +1, -1, +M, -M as (1 - 2 (k & 1)) << (b (k >> 1)), b = log2 M: in-place passes
    # cost less than np.take through a table
    cov = np.bitwise_and(keys, 1)
    np.multiply(cov, -2, out=cov)
    cov += 1
    length = np.right_shift(keys, 1)
    length &= 1
    length *= M.bit_length() - 1
    np.left_shift(cov, length, out=cov)
    np.cumsum(cov, out=cov)
    pts = np.right_shift(keys, 2, out=keys)
    # the gap to the next end where a visited range covers it, else 0 (a ufunc's where= runs 10x
    # slower than the multiplication by 0 or 1)
    np.subtract(pts[1:], pts[:-1], out=length[:-1])
    length[-1] = 0
    covered = np.bitwise_and(cov, M - 1)
    np.minimum(covered, 1, out=covered)
    length *= covered
    keep = np.flatnonzero(length)
    run_len = length[keep].astype(np.int64)
    run_val = pts[keep]  # key tile << 1 | partial, in int32 (key tiles < 2^29), then widened
    run_val <<= 1
    run_val |= cov[keep] < M
    run_val = run_val.astype(np.int64)
    ends = np.cumsum(length, out=length)  # int32: the total is checked below
    ptr = np.zeros(nq + 1, np.int64)
    ptr[1:] = ends[4 * F - 1::4 * F]
    run_off = ends[keep] - run_len
    if ptr[-1] >= 2 ** 30:
        raise ValueError(f"a tile list of {ptr[-1]} entries exceeds 2^30 (int32 entries)")
    return Tiles(BM, BN, ptr.astype(np.int32), run_off, run_val, time.perf_counter() - t0)


def _one_family(BM: int, BN: int, ks, ke, fs, fe, t0: float) -> Tiles:
    """``build`` for a pattern of one family (window, prefix LM, dense, ...): each query
    tile's list is at most three runs, [ks, fs) partial, [fs, fe) full, [fe, ke) partial: the
    pieces the sweep over range ends would cut, found without sorting (where the lists are short,
    the sweep's fixed cost dominates the build)."""
    b = np.empty((ks.size, 4), np.int64)  # the run bounds of each query tile: ks <= fs <= fe <= ke
    b[:, 0], b[:, 3] = ks, ke
    np.minimum(np.maximum(fs, ks), ke, out=b[:, 1])
    np.minimum(np.maximum(fe, b[:, 1]), ke, out=b[:, 2])
    return _three_runs(BM, BN, b, t0)


def _three_runs(BM: int, BN: int, b, t0: float) -> Tiles:
    """The list of run bounds ``b`` (int64 [query tiles, 4], ks <= fs <= fe <= ke per row): the
    non-empty ones of [ks, fs) partial, [fs, fe) full and [fe, ke) partial, in order."""
    return Tiles(BM, BN, *_three_run_arrays(b), time.perf_counter() - t0)


def _three_run_arrays(b):
    """(ptr, run_off, run_val) of ``_three_runs`` (rows of ``b``: query tiles, or the key tiles of
    a transposed list)."""
    # on the flat bounds, 4 per query tile: one difference gives the three run lengths of each tile
    # and a fourth, from its ke to the next tile's ks, that is zeroed (a [nq, 3] slice of a [nq, 4]
    # array costs 5x more to subtract, and a bool array 3x less to search than an int one)
    bounds = b.ravel()
    length = np.empty(bounds.size, np.int64)
    np.subtract(bounds[1:], bounds[:-1], out=length[:-1])
    length[3::4] = 0
    keep = (length > 0).nonzero()[0]
    val = bounds << 1
    val[::2] |= 1  # the runs from ks and from fe are partial
    ends = np.add.accumulate(length)  # np.cumsum's wrapper costs as much again at this size
    if ends.size and ends[-1] >= 2 ** 30:
        raise ValueError(f"a tile list of {ends[-1]} entries exceeds 2^30 (int32 entries)")
    ptr = np.zeros(b.shape[0] + 1, np.int32)
    ptr[1:] = ends[3::4]
    ends -= length  # each run's first entry
    return ptr, ends[keep], val[keep]


# ---- transposed lists (the backward's: query tiles per key tile) --------------------------------
@dataclass(frozen=True, eq=False)
class TransposedTiles(Tiles):
    """The query tiles each key tile visits: entries ``qt << 1 | partial``, CSR over key tiles
    (``ptr`` [n_ktiles + 1]), stored as runs like ``Tiles``, each run as long as it can be (the
    next query tile of its key tile is absent or flagged otherwise); the same (query tile, key
    tile) pairs and flags as the forward list it was transposed from, whose BM and BN it keeps."""

    @property
    def n_ktiles(self) -> int:
        return self.ptr.size - 1


def transpose(tiles: Tiles, n_ktiles: int) -> TransposedTiles:
    """The forward list ``tiles`` transposed: for each of ``n_ktiles`` key tiles, the query tiles
    whose lists name it, ascending, with the same flags (a list's runs ascend within its query
    tile, as every builder writes them). Three ways to one result, the cheapest that applies:

    - a band (``_band``: every query tile's list one stretch, partial, full, partial, whose bounds
      never decrease from one query tile to the next: dense, windows, documents, block diagonals,
      dilation levels): each key tile's query tiles in closed form, O(query + key tiles);
    - a list of few entries (``_by_entries``: sinks, BigBird's random blocks): one sort of them;
    - a long list of another shape (``_by_runs``): a sweep over the runs' ends, O(runs).

    ``build_s`` is the whole call's seconds, the choice included."""
    t0 = time.perf_counter()
    return TransposedTiles(tiles.BM, tiles.BN, *_transposed(tiles, n_ktiles), time.perf_counter() - t0)


def _transposed(tiles: Tiles, n_ktiles: int):
    """(ptr, run_off, run_val) of ``transpose``."""
    nq, n, R = tiles.ptr.size - 1, tiles.n_visited, tiles.run_off.size
    if R == 0:
        return np.zeros(n_ktiles + 1, np.int32), np.zeros(0, np.int64), np.zeros(0, np.int64)
    first = None
    if n > 4 * (nq + n_ktiles) + 4096:  # below, the entries' sort costs less than the band's fixed steps
        first = _first_runs(tiles)
        got = _band(tiles, n_ktiles, first)
        if got is not None:
            return got
    if n <= 8 * R + 4096:  # above, the sweep over 4 ends a run costs less than sorting every entry
        return _by_entries(tiles, n_ktiles)
    return _by_runs(tiles, n_ktiles, first)


def _first_runs(tiles: Tiles) -> np.ndarray:
    """Each query tile's first run, and R at the end (nq searches, not one per run)."""
    return np.searchsorted(tiles.run_off, tiles.ptr)


def _timed(how):
    """``how`` alone as a ``transpose`` (the tests compare the three ways), None where it declines."""
    def run(tiles: Tiles, n_ktiles: int):
        t0 = time.perf_counter()
        got = how(tiles, n_ktiles) if tiles.run_off.size else _transposed(tiles, n_ktiles)
        return None if got is None else TransposedTiles(tiles.BM, tiles.BN, *got, time.perf_counter() - t0)
    return run


def _key_dtype(top: int):
    """int32 when every key is below ``top`` < 2^31, else int64."""
    return np.int32 if top < 2 ** 31 else np.int64


def _band(tiles: Tiles, n_ktiles: int, first=None):
    """``transpose`` of a band, None for another list. In a band every query tile's list is one
    stretch [ks, ke), partial on [ks, fs), full on [fs, fe), partial on [fe, ke), and no bound
    decreases from a query tile to the next (a tile without a full stretch is given an empty one
    where the tiles before it end theirs, within its own stretch). Then key tile kt is visited by
    the query tiles [c0, c3), partial on [c0, c1), full on [c1, c2), partial on [c2, c3), where
    c0..c3 count the query tiles whose ke, fe, fs, ks lie at or before kt: one bincount and one
    cumulative sum give them all, and the forward build's three-run cut (``_three_run_arrays``)
    the runs; the two partial stretches join where the full one is empty.
    ``first``: ``_first_runs(tiles)`` when the caller has it."""
    val = tiles.run_val
    first = _first_runs(tiles) if first is None else first
    nq = first.size - 1
    cnt = np.diff(first)
    if not cnt.all():
        return None  # a query tile without entries
    b = np.empty((4, nq), np.int64)  # the bounds ke, fe, fs, ks of every query tile
    ks, ke = b[3], b[0]
    np.right_shift(val[first[:-1]], 1, out=ks)
    last = first[1:] - 1  # each query tile's last run, which ends where the tile's entries do
    np.right_shift(val[last], 1, out=ke)
    ke += tiles.ptr[1:]
    ke -= tiles.run_off[last]
    # runs never overlap, so each list fills [ks, ke) exactly when the lengths add up
    if int(ke.sum()) - int(ks.sum()) != tiles.n_visited:
        return None
    lo = val >> 1
    hi = np.diff(tiles.run_off, append=tiles.n_visited)
    hi += lo
    full = np.flatnonzero(~(val & 1).astype(bool))
    row = np.repeat(np.arange(nq), cnt)[full]
    new = np.empty(row.size + 1, bool)
    new[0] = new[-1] = True
    np.not_equal(row[1:], row[:-1], out=new[1:-1])
    new = np.flatnonzero(new)  # the first full run of each query tile that has one, and the end
    rows_f = row[new[:-1]]
    fs_f = lo[full[new[:-1]]]
    fe_f = hi[full[new[1:] - 1]]
    if int(fe_f.sum()) - int(fs_f.sum()) != int(hi[full].sum()) - int(lo[full].sum()):
        return None  # a query tile with two full stretches
    fs, fe = b[2], b[1]
    fe[:] = ks
    fe[rows_f] = fe_f
    np.maximum.accumulate(fe, out=fe)
    fs[0] = ks[0]
    fs[1:] = fe[:-1]
    np.clip(fs, ks, ke, out=fs)
    fe[:] = fs
    fs[rows_f] = fs_f
    fe[rows_f] = fe_f
    if nq > 1 and (b[:, 1:] < b[:, :-1]).any():
        return None
    W = n_ktiles + 1
    b += np.arange(0, 4 * W, W)[:, None]
    c = np.bincount(b.ravel(), minlength=4 * W).reshape(4, W)[:, :n_ktiles]
    bounds = np.empty((n_ktiles, 4), np.int64)
    np.cumsum(c, axis=1, out=bounds.T)  # per key tile c0 <= c1 <= c2 <= c3
    no_full = bounds[:, 1] == bounds[:, 2]  # then its two partial stretches are one run, [c0, c3)
    bounds[no_full, 1:3] = bounds[no_full, 3:]
    return _three_run_arrays(bounds)


def _by_entries(tiles: Tiles, n_ktiles: int):
    """``transpose`` entry by entry: each entry a key kt << qb | qt << 1 | partial (int32 where it
    fits), made by one cumulative sum over the list (entry t of a run adds t << qb to the run's
    first key) and sorted once; a run goes on while the next key is 2 more (the next query tile,
    the same key tile and flag)."""
    ptr, off, val = tiles.ptr, tiles.run_off, tiles.run_val
    nq, n = ptr.size - 1, tiles.n_visited
    qb = nq.bit_length() + 1  # qt << 1 | partial < 2^qb, also for qt + 1
    step = 1 << qb
    dt = _key_dtype(n_ktiles << qb)
    g = val >> 1
    g <<= qb
    g |= val & 1
    g -= off << qb  # a run's first key less its offset times the step: the differences are the jumps
    d = np.full(n, step, dt)
    d[0] = g[0]
    d[off[1:]] = np.diff(g) + step
    keys = np.cumsum(d, out=d)
    keys += np.repeat(np.arange(0, 2 * nq, 2, dtype=dt), np.diff(ptr))  # qt << 1
    keys.sort()
    start = np.empty(n, bool)
    start[0] = True
    np.not_equal(keys[1:], keys[:-1] + 2, out=start[1:])
    run_off = np.flatnonzero(start)
    head = keys[run_off]
    run_val = head & (step - 1)
    head >>= qb
    return _csr(head, np.diff(run_off, append=n), n_ktiles), run_off, run_val.astype(np.int64)


def _csr(kt, run_len, n_ktiles: int) -> np.ndarray:
    """int32 ``ptr`` [n_ktiles + 1] of runs in key-tile order (``kt`` each one's key tile)."""
    ptr = np.zeros(n_ktiles + 1, np.int32)
    ptr[1:] = np.cumsum(np.bincount(kt, weights=run_len, minlength=n_ktiles))  # exact below 2^53
    return ptr


def _by_runs(tiles: Tiles, n_ktiles: int, first=None):
    """``transpose`` from the runs without expanding them. Query tile r's list differs from r - 1's
    at *change points* (r, kt); one sweep over the range ends of every list and of its
    predecessor's, copied one query tile on, finds them all (as ``build``: one sort, one running
    sum). Sorted by key tile, each change point where r's list holds kt starts a run that ends at
    the key tile's next change point: the cost grows with the runs, not with the entries."""
    ptr, off, val = tiles.ptr, tiles.run_off, tiles.run_val
    first = _first_runs(tiles) if first is None else first
    nq = ptr.size - 1
    kb = n_ktiles.bit_length()  # a range end <= n_ktiles < 2^kb
    qb = nq.bit_length()        # a query tile <= nq < 2^qb
    sh = kb + 3
    # range ends as events (r << kb | kt) << 3 | code, code bit 0: closes, bit 1: the previous
    # query tile's (copied onto r), bit 2: partial; each adds +-1 << (code >> 1) to the coverage
    lo = np.repeat(np.arange(nq, dtype=np.int64) << sh, np.diff(first))
    lo |= val << 2
    hi = np.diff(off, append=tiles.n_visited)
    hi <<= 3
    hi += lo
    hi += 1
    join = lo[1:] == hi[:-1] - 1  # a run going on in the next one (same tile and flag): one range
    if join.any():
        keep = np.flatnonzero(~join)
        lo = lo[np.append(0, keep + 1)]
        hi = hi[np.append(keep, off.size - 1)]
    R = lo.size
    ev = np.empty(4 * R, _key_dtype((nq + 1) << sh))
    ev[:R] = lo
    ev[R:2 * R] = hi
    np.add(ev[:2 * R], (1 << sh) | 2, out=ev[2 * R:])
    ev.sort()
    cov = np.bitwise_and(ev, 1)
    cov *= -2
    cov += 1
    length = np.right_shift(ev, 1)
    length &= 3
    cov <<= length
    np.cumsum(cov, out=cov)  # bits: 0 r's full, 1 r - 1's full, 2 r's partial, 3 r - 1's partial
    pos = np.right_shift(ev, 3, out=ev)
    np.subtract(pos[1:], pos[:-1], out=length[:-1])
    length[-1] = 0
    change = np.right_shift(cov, 1)
    change ^= cov
    change &= 5
    change *= length
    at = np.flatnonzero(change.astype(bool))
    # the change points, key tile << S | r << 3 | r's state (0 none, 1 full, 4 partial), sorted
    S = qb + 3
    kdt = _key_dtype(n_ktiles << S)
    p = pos[at]
    keys = (p & ((1 << kb) - 1)).astype(kdt)
    keys <<= S
    p >>= kb
    p <<= 3
    keys |= p
    own = cov[at]
    own &= 5
    keys |= own
    length = length[at]
    total = int(length.sum())
    if total > at.size:  # stretches of change points: one per key tile
        base = np.cumsum(length, dtype=np.int64)
        base -= length
        base <<= S
        np.subtract(keys, base, out=base)
        keys = np.repeat(base, length)
        keys += np.arange(0, total << S, 1 << S, dtype=np.int64)
        keys = keys.astype(kdt)
    keys.sort()
    # every key tile's last change point empties it (past the last query tile at the latest)
    j = np.flatnonzero((keys & 5).astype(bool))
    r = np.right_shift(keys, 3)
    r &= (1 << qb) - 1
    run_len = r[j + 1].astype(np.int64)
    run_len -= r[j]
    head = keys[j]
    run_val = np.right_shift(head, 2)
    run_val &= (1 << (qb + 1)) - 1  # r << 1 | partial
    head >>= S
    run_off = np.cumsum(run_len)
    run_off -= run_len
    return _csr(head, run_len, n_ktiles), run_off, run_val.astype(np.int64)


_transpose_band = _timed(_band)
_transpose_entries = _timed(_by_entries)
_transpose_runs = _timed(_by_runs)


# ---- work items (the backward's: a transposed list cut into stretches) -------------------------
@dataclass(frozen=True, eq=False)
class WorkItems:
    """A transposed list cut into work items of at most ``L`` query tiles: each key tile's list into
    k = max(1, ceil(count / L)) stretches of balanced length (the first count % k one longer), an
    empty list into one empty item (its keys' gradients are still written). A key tile cut into
    more than one item is *split* and gets a slot (0, 1, ... in key-tile order): its items add their
    partial dK and dV into float32 accumulators instead of storing them. Items come ordered by their
    key tile's item length ceil(count / k), longest first (ties: key tile ascending), the items of a
    key tile one after another, so no item is more than one query tile longer than any before it
    (``work_items``' order 0; order 1 orders them by position).

    ``heads`` is ``heads()``'s layout for the items (the first entry's index in the transposed
    list, the count, the first two entries), so the kernel reads an item as it reads a list."""
    L: int
    heads: np.ndarray     # int32 [n_items, 4]
    tiles: np.ndarray     # int32 [n_items, 2]: key tile, split slot (-1: not split)
    split_kt: np.ndarray  # int32 [n_split]: the key tile of each slot
    build_s: float = 0.0
    _device: dict = field(default_factory=dict, repr=False)

    @property
    def n_items(self) -> int:
        return self.heads.shape[0]

    @property
    def n_split(self) -> int:
        return self.split_kt.size

    @property
    def longest(self) -> int:
        return int(self.heads[:, 1].max(initial=0))

    def device(self) -> "DeviceItems":
        """The items on the current CUDA device, uploaded once per device."""
        return _per_device(self._device, lambda: DeviceItems.upload(self))


@dataclass(frozen=True)
class DeviceItems:
    """``WorkItems`` on a device (int32; ``split_kt`` one 0 when nothing is split) and the seconds
    of the upload."""
    heads: object
    tiles: object
    split_kt: object
    build_s: float

    @classmethod
    def upload(cls, items: WorkItems) -> "DeviceItems":
        import cupy

        stream = cupy.cuda.get_current_stream()
        stream.synchronize()
        t0 = time.perf_counter()
        heads = cupy.asarray(items.heads)
        tiles = cupy.asarray(items.tiles)
        split_kt = cupy.asarray(items.split_kt if items.n_split else np.zeros(1, np.int32))
        stream.synchronize()
        return cls(heads, tiles, split_kt, time.perf_counter() - t0)


ITEM_ORDERS = (0, 1)  # 0: longest first; 1: by position, the query tile of the item's second entry


def work_items(tt: Tiles, L: int, order: int = 0, cut: int = 0) -> WorkItems:
    """``tt`` (CSR ``ptr`` over key tiles, entries as runs) cut into work items of at most ``L``
    entries (``WorkItems``), vectorised: the cost grows with the items, not with the entries.
    ``order`` 1 puts the items in the order of their stretch's position instead of longest first:
    by the query tile of the item's second entry (its first where it has one), longer items first
    among equals. A causal band's key tile t then sits beside a split key tile's item whose stretch
    starts near t, so that the two read the same Q and dO tiles at about the same time (the second
    entry, because a pattern with global rows, bigbird's, puts query tile 0 first in every list).
    ``cut`` (> 0) cuts the key tiles that L splits into items of at most ``cut`` entries instead
    (the others stay whole): shorter stretches of a split tile, for order 1."""
    if L < 1:
        raise ValueError(f"L={L}: work items hold at least one entry")
    if order not in ITEM_ORDERS:
        raise ValueError(f"order={order}: expected one of {ITEM_ORDERS}")
    t0 = time.perf_counter()
    ptr = tt.ptr.astype(np.int64)
    count = np.diff(ptr)
    k = np.maximum(1, -(-count // L))  # items per key tile
    if cut > 0:
        k = np.where(k > 1, np.maximum(k, -(-count // cut)), k)
    per = -(-count // k)               # its item length (the longer ones)
    longest = np.argsort(-per, kind="stable")  # longest first, key tile ascending
    k_o = k[longest]
    n = int(k_o.sum())
    kt = np.repeat(longest, k_o)
    j = np.arange(n, dtype=np.int64) - np.repeat(np.cumsum(k_o) - k_o, k_o)  # the item's index in its tile
    q, r = np.divmod(count[kt], k[kt])
    size = q + (j < r)
    start = ptr[kt] + j * q + np.minimum(j, r)
    split = k > 1
    slot_of = np.where(split, np.cumsum(split) - 1, -1)
    heads_ = np.empty((n, 4), np.int32)
    heads_[:, 0] = start
    heads_[:, 1] = size
    for col, off in ((2, 0), (3, 1)):  # the entries at start and start + 1, from their runs
        has = size > off
        at = start[has] + off
        run = np.searchsorted(tt.run_off, at, side="right") - 1  # runs never cross a key tile's row
        heads_[:, col] = 0
        heads_[has, col] = tt.run_val[run] + 2 * (at - tt.run_off[run])
    tiles_ = np.stack([kt, slot_of[kt]], axis=1).astype(np.int32)
    if order == 1:
        pos = np.where(size > 1, heads_[:, 3], heads_[:, 2]) >> 1
        by = np.lexsort((np.arange(n), -size, pos))
        heads_, tiles_ = heads_[by], tiles_[by]
    return WorkItems(int(L), heads_, tiles_, np.flatnonzero(split).astype(np.int32), time.perf_counter() - t0)


# ---- cache ------------------------------------------------------------------------------------
_CACHE: OrderedDict = OrderedDict()
_KEEP = 32


def _cached(cache: OrderedDict, mask, BM: int, BN: int, make):
    """``make()``, kept in ``cache`` per (pattern, parameters, T, causal, BM, BN), the last _KEEP."""
    return lru(cache, (mask_key(mask), BM, BN), make)


def mask_key(mask) -> tuple:
    """What a mask's lists and kernels depend on: (pattern, parameters, T, causal)."""
    return (mask.pattern.name, tuple(sorted(mask.params.items())), mask.T, mask.causal)


def lru(cache: OrderedDict, key, make, keep: int = _KEEP):
    """``cache[key]``, made by ``make()`` when missing; the last ``keep`` keys used are kept."""
    t = cache.get(key)
    if t is None:
        t = cache[key] = make()
        while len(cache) > keep:
            cache.popitem(last=False)
    else:
        cache.move_to_end(key)
    return t


def tile_list(mask, BM: int, BN: int) -> Tiles:
    """``build(mask, BM, BN)``, cached per (pattern, parameters, T, causal, BM, BN)."""
    return _cached(_CACHE, mask, BM, BN, lambda: _with_rebuild(mask, BM, BN))


def _with_rebuild(mask, BM: int, BN: int) -> Tiles:
    """The list, with the seconds of a second build of it, warm (``Tiles.rebuild_s``)."""
    first = mask.tiles(BM, BN)
    return dataclasses.replace(first, rebuild_s=build(mask, BM, BN, fresh=True).build_s)


_CACHE_T: OrderedDict = OrderedDict()


def tile_list_t(mask, BM: int, BN: int) -> TransposedTiles:
    """The transposed list of ``tile_list(mask, BM, BN)`` (query tiles per key tile), cached beside
    it; its ``build_s`` is the transposition's own seconds (the forward list keeps its own)."""
    return _cached(_CACHE_T, mask, BM, BN, lambda: transpose(tile_list(mask, BM, BN), -(-mask.T // BN)))


def drop_device_copies() -> None:
    """Forget the device copy of every cached list, transposed list and work-item list: the next
    user builds (and counts, in its memory and setup columns) its own."""
    for cache in (_CACHE, _CACHE_T, _CACHE_ITEMS):
        for t in cache.values():
            t._device.clear()


_CACHE_ITEMS: OrderedDict = OrderedDict()


def tile_items_t(mask, BM: int, BN: int, L: int, order: int = 0, cut: int = 0) -> WorkItems:
    """``work_items(tile_list_t(mask, BM, BN), L, order, cut)``, cached beside the transposed list per
    (pattern, parameters, T, causal, BM, BN, L, order, cut); its ``build_s`` is the cut's own seconds."""
    return lru(_CACHE_ITEMS, (mask_key(mask), BM, BN, int(L), int(order), int(cut)),
               lambda: work_items(tile_list_t(mask, BM, BN), L, order, cut))


STEP_BUILDS = 5  # device builds whose median is a row's tiles_step_s


def setup_times(tiles: Tiles) -> dict:
    """What a runner reports of its list: host build (the first, and a second one warm), device
    expansion seconds (each the list's own build, also when it came from the cache), and
    ``tiles_step_s``, what a step that rebuilds its list pays, the counterpart of Flex's
    ``block_mask_build_s``: the median of STEP_BUILDS more device builds (discarded) where the
    pattern builds its list on the device from its parameters (``Pattern.device_tiles``: the host
    build is then not needed), else the warm host build plus that median of expansions."""
    first = tiles.device().build_s
    step = float(np.median([tiles.device_build().build_s for _ in range(STEP_BUILDS)]))
    if tiles.on_device is None:
        step += tiles.rebuild_s
    return {"tiles_build_s": tiles.build_s, "tiles_rebuild_s": tiles.rebuild_s, "tiles_device_s": first,
            "tiles_step_s": step}


__all__ = ["Tiles", "TransposedTiles", "DeviceTiles", "WorkItems", "DeviceItems", "build", "heads", "tile_list",
           "transpose", "tile_list_t", "work_items", "tile_items_t", "setup_times"]


def standard_builds() -> list[tuple[str, dict]]:
    """The expansion kernel takes no constants: one build."""
    return [("tiles", {})]
