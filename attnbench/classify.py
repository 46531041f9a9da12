"""Tile lists and row counts by classification: count the allowed pairs of every (query tile,
key tile) of a BM x BN grid, and of every row. A tile with no pair is skipped, a tile whose every
pair (i < T, j < T) is allowed and that ends at or before T is full, any other tile partial (the
kernels mask keys >= T on partial tiles only, as in the interval build). This is how the
``custom`` pattern, which has no closed-form key intervals, gets its tile lists and exact pair
counts; it works for any pattern (the tests compare it with the interval build).

Two ways to the same counts:

* ``device``: kernels/classify.cu evaluates every pair of every tile on the GPU (tiles wholly above
  the diagonal skipped when causal) and the counts become a list there (CuPy); about T^2 / 2
  predicate evaluations, a few milliseconds at T = 131072;
* ``host``: numpy. With ``boxes`` (the custom expression's interval arithmetic) it decides whole
  blocks of tiles first, coarse to fine (a block the expression holds on, or fails on, everywhere
  needs no pair evaluated), and evaluates pair by pair only the tiles it cannot decide; without,
  every tile below the causal diagonal pair by pair. It refuses to evaluate more than
  ``HOST_PAIRS`` pairs (BadInput naming T and the limit).

``classify`` takes the device for T above ``HOST_T`` when there is one, the host otherwise, and
keeps the last results (per pattern, parameters, T, causal flag and tile shape) with the seconds
they took, which become the list's ``build_s``.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from .errors import BadInput
from .tiles import Tiles

HOST_T = 2048            # at and below this T the host classifies even where a device is
HOST_PAIRS = 1 << 28     # pairs the host evaluates one by one, at most
HOST_TILES = 1 << 26     # tiles of a grid the host classifies, at most
DEVICE_TILES = 1 << 29   # tiles of a grid the device classifies, at most (4 bytes of count each)
CHUNK = 1 << 22          # pairs evaluated at once on the host
THREADS = 128            # kernels/classify.cu's block
BLOCKS = 16384           # about this many blocks per launch: query tiles x key-tile groups
ROWS_TILE = (64, 64)     # the grid whose classification gives a mask's row counts


@dataclass(frozen=True)
class Classified:
    """What a classification gives: the tile list (its ``build_s``: the seconds the classification
    took), the allowed keys of every row (int64 [T]), and where it ran ("host" or "device")."""
    tiles: Tiles
    row_counts: np.ndarray
    where: str


def _grid(T: int, BM: int, BN: int) -> tuple[int, int]:
    if BM < 1 or BN < 1:
        raise ValueError(f"tile shape {BM}x{BN}: both sides must be positive")
    return -(-T // BM), -(-T // BN)


def counts_to_list(xp, counts, T: int, BM: int, BN: int):
    """(ptr, run_off, run_val) of the tile list of a count grid [nq, nk] (numpy or CuPy arrays
    ``xp``): every tile with a pair, ``kt << 1 | partial``, consecutive entries of one flag in one
    query tile as a run (``attnbench.tiles.Tiles``)."""
    nq, nk = counts.shape
    rows_in = xp.minimum(T - xp.arange(nq, dtype=xp.int64) * BM, BM)
    cols_in = xp.minimum(T - xp.arange(nk, dtype=xp.int64) * BN, BN)
    flat = counts.ravel()
    nz = xp.flatnonzero(flat)
    qt, kt = nz // nk, nz % nk
    full = (flat[nz] == rows_in[qt] * cols_in[kt]) & ((kt + 1) * BN <= T)
    entries = kt * 2 + (~full).astype(xp.int64)
    ptr = xp.searchsorted(qt, xp.arange(nq + 1, dtype=xp.int64))  # qt ascends; an empty list too
    start = xp.ones(nz.size, dtype=bool)
    start[1:] = (qt[1:] != qt[:-1]) | (entries[1:] != entries[:-1] + 2)
    run_off = xp.flatnonzero(start)
    return ptr, run_off, entries[run_off]


def _tiles(ptr, run_off, run_val, BM: int, BN: int, seconds: float) -> Tiles:
    if int(ptr[-1]) >= 2 ** 30:
        raise ValueError(f"a tile list of {int(ptr[-1])} entries exceeds 2^30 (int32 entries)")
    return Tiles(BM, BN, np.asarray(ptr, np.int32), np.asarray(run_off, np.int64), np.asarray(run_val, np.int64),
                 seconds)


# ---- host ---------------------------------------------------------------------------------------
def _undecided(ilo, ihi, jlo, jhi):
    shape = np.shape(ilo)
    return np.ones(shape, bool), np.ones(shape, bool)


def _decide(mask, boxes, q0, q1, k0, k1, BM: int, BN: int):
    """(full, undecided) of blocks of tiles [q0, q1) x [k0, k1): whether the predicate, the causal
    clause included, holds on every pair (i < T, j < T) of the block, or cannot be decided."""
    T = mask.T
    ilo, ihi = q0 * BM, np.minimum(q1 * BM, T) - 1
    jlo, jhi = k0 * BN, np.minimum(k1 * BN, T) - 1
    may_true, may_false = boxes(ilo, ihi, jlo, jhi)
    if mask.causal:  # j <= i: true somewhere when jlo <= ihi, false somewhere when jhi > ilo
        may_true = may_true & (jlo <= ihi)
        may_false = may_false | (jhi > ilo)
    return may_true & ~may_false, may_true & may_false


def _tile_blocks(mask, boxes, nq: int, nk: int, BM: int, BN: int):
    """Coarse to fine over square blocks of tiles (2^L x 2^L, cut at the grid's edge): the blocks
    decided full, as (q0, q1, k0, k1) arrays, and the tiles left undecided (qt, kt)."""
    level = max(0, int(np.ceil(np.log2(max(nq, nk)))))
    q0 = k0 = np.zeros(1, np.int64)
    full = []
    while True:
        size = 1 << level
        q1, k1 = np.minimum(q0 + size, nq), np.minimum(k0 + size, nk)
        is_full, open_ = _decide(mask, boxes, q0, q1, k0, k1, BM, BN)
        full.append(np.stack([q0, q1, k0, k1])[:, is_full])
        q0, k0 = q0[open_], k0[open_]
        if level == 0 or not q0.size:
            return np.concatenate(full, axis=1), q0, k0
        level -= 1
        half = 1 << level
        q0 = np.concatenate([q0, q0, q0 + half, q0 + half])
        k0 = np.concatenate([k0, k0 + half, k0, k0 + half])
        inside = (q0 < nq) & (k0 < nk)
        q0, k0 = q0[inside], k0[inside]


def host(mask, BM: int, BN: int, boxes=None) -> Classified:
    """The classification on the host (numpy); ``boxes(ilo, ihi, jlo, jhi) -> (may be true, may be
    false)`` decides whole blocks of tiles where it can (``expr.Bound.boxes``)."""
    t0 = time.perf_counter()
    T = mask.T
    nq, nk = _grid(T, BM, BN)
    if nq * nk > HOST_TILES:
        raise BadInput(f"{mask.label()} at T={T}: a {BM}x{BN} grid of {nq * nk} tiles is above the {HOST_TILES} "
                       f"the host classifies (a GPU classifies it)")
    blocks, qt, kt = _tile_blocks(mask, boxes or _undecided, nq, nk, BM, BN)
    pairs = qt.size * BM * BN
    if pairs > HOST_PAIRS:
        raise BadInput(f"{mask.label()} at T={T}: the host would evaluate {pairs} pairs one by one (tiles the "
                       f"expression's bounds cannot decide), above its limit of {HOST_PAIRS}: a smaller T, or "
                       f"a machine with a GPU, which counts them all")
    rows_in = np.minimum(T - np.arange(nq, dtype=np.int64) * BM, BM)
    cols_in = np.minimum(T - np.arange(nk, dtype=np.int64) * BN, BN)
    # the full blocks through a 2-D difference array: +1 at a block's corner, -1 past its edges
    diff = np.zeros((nq + 1, nk + 1), np.int32)
    q0, q1, k0, k1 = blocks
    for dq, dk, s in ((q0, k0, 1), (q0, k1, -1), (q1, k0, -1), (q1, k1, 1)):
        np.add.at(diff, (dq, dk), s)
    full = np.cumsum(np.cumsum(diff, axis=0), axis=1)[:nq, :nk] > 0
    counts = np.where(full, rows_in[:, None] * cols_in[None, :], 0)
    rows = np.repeat(full.astype(np.int64) @ cols_in, BM)[:T]
    # the undecided tiles, pair by pair (positions past T clipped to T - 1, then left out)
    r, c = np.arange(BM, dtype=np.int64), np.arange(BN, dtype=np.int64)
    step = max(1, CHUNK // (BM * BN))
    for s in range(0, qt.size, step):
        tq, tk = qt[s:s + step], kt[s:s + step]
        i = tq[:, None, None] * BM + r[None, :, None]
        j = tk[:, None, None] * BN + c[None, None, :]
        ok = mask.allowed(np.minimum(i, T - 1), np.minimum(j, T - 1)) & (i < T) & (j < T)
        per_row = ok.sum(axis=2)
        counts[tq, tk] = per_row.sum(axis=1)
        i_rows = i[:, :, 0].ravel()
        rows += np.bincount(i_rows, weights=per_row.ravel(), minlength=nq * BM)[:T].astype(np.int64)
    ptr, run_off, run_val = counts_to_list(np, counts, T, BM, BN)
    seconds = time.perf_counter() - t0
    return Classified(_tiles(ptr, run_off, run_val, BM, BN, seconds), rows, "host")


# ---- device -------------------------------------------------------------------------------------
def device(mask, BM: int, BN: int) -> Classified:
    """The classification on the current CUDA device (kernels/classify.cu, then CuPy); the
    seconds from the upload of the pattern's arguments to the list and row counts on the host
    (the compilation of the kernel and of CuPy's own kernels before, not counted)."""
    import cupy

    from .compile import get_module

    T = mask.T
    nq, nk = _grid(T, BM, BN)
    if nq * nk > DEVICE_TILES:
        raise BadInput(f"{mask.label()} at T={T}: a {BM}x{BN} grid of {nq * nk} tiles is above the {DEVICE_TILES} "
                       f"the device classifies (larger tiles)")
    kernel = get_module("classify", mask.device_defines(runtime=True)).get_function("classify_tiles")
    counts_to_list(cupy, cupy.ones((2, 2), cupy.int32), 2, 1, 1)  # CuPy compiles its kernels on first use
    stream = cupy.cuda.get_current_stream()
    stream.synchronize()
    t0 = time.perf_counter()
    table = mask.table if mask.table is not None else np.zeros(1, np.int32)
    table = cupy.asarray(np.ascontiguousarray(table, dtype=np.int32))
    pargs = cupy.asarray(mask.device_args())
    counts = cupy.zeros((nq, nk), cupy.int32)
    rows = cupy.zeros(T, cupy.int32)
    groups = max(1, min(nk, 65535, -(-BLOCKS // nq)))
    kernel((nq, groups), (THREADS,), (np.int32(mask.causal), pargs, table, np.int32(T), np.int32(BM), np.int32(BN),
                                      np.int32(nk), counts, rows), shared_mem=4 * BM)
    ptr, run_off, run_val = (cupy.asnumpy(a) for a in counts_to_list(cupy, counts, T, BM, BN))
    row_counts = cupy.asnumpy(rows).astype(np.int64)
    seconds = time.perf_counter() - t0
    return Classified(_tiles(ptr, run_off, run_val, BM, BN, seconds), row_counts, "device")


# ---- choice and cache ---------------------------------------------------------------------------
_CACHE: OrderedDict = OrderedDict()
_KEEP = 16


def where(T: int) -> str:
    """Where ``classify`` runs at T: the device above HOST_T when there is one, else the host."""
    from .impls import device_problem

    return "device" if T > HOST_T and device_problem() is None else "host"


def classify(mask, BM: int, BN: int, boxes=None, fresh: bool = False) -> Classified:
    """The classification of ``mask`` on a BM x BN grid, on the device or the host (``where``),
    kept per (pattern, parameters, T, causal, BM, BN); ``fresh`` runs it again."""
    at = where(mask.T)
    key = (mask.pattern.name, tuple(sorted(mask.params.items())), mask.T, mask.causal, BM, BN, at)
    got = None if fresh else _CACHE.get(key)
    if got is None:
        got = device(mask, BM, BN) if at == "device" else host(mask, BM, BN, boxes)
        _CACHE[key] = got
        while len(_CACHE) > _KEEP:
            _CACHE.popitem(last=False)
    else:
        _CACHE.move_to_end(key)
    return got


def row_counts(mask, boxes=None) -> np.ndarray:
    """The allowed keys of every row (int64 [T]), from the classification on ``ROWS_TILE``."""
    return classify(mask, *ROWS_TILE, boxes=boxes).row_counts


def tiles(mask, BM: int, BN: int, boxes=None, fresh: bool = False) -> Tiles:
    """The tile list of ``mask`` by classification (its ``build_s``: the classification's seconds)."""
    return classify(mask, BM, BN, boxes, fresh).tiles


def standard_builds() -> list[tuple[str, dict]]:
    """The classification kernel of the custom pattern's default expression and of the llm
    configuration's custom instances, at the configuration's build T."""
    from .configs import LLM
    from .patterns import make_mask

    builds = []
    masks = [make_mask("custom", LLM.build_T, True)] + [i.mask(LLM.build_T) for i in LLM.instances
                                                          if i.pattern == "custom"]
    for mask in masks:
        b = ("classify", mask.device_defines(runtime=True))
        if b not in builds:
            builds.append(b)
    return builds


__all__ = ["Classified", "classify", "host", "device", "where", "row_counts", "tiles", "counts_to_list",
           "HOST_T", "HOST_PAIRS", "ROWS_TILE"]
