"""float64 reference attention, straight from the pattern's mask (SPEC sections 1, 2, 4).

Chunked over queries so that T = 4096 with B = 2, H = 4 runs in modest memory, on the CPU
(numpy) or on the GPU (cupy): pass arrays of either library. Sparse patterns cost what
their allowed pairs cost, so the gate runs at T = 131072 too.
"""
from __future__ import annotations

import math

import numpy as np

from .arrays import to_float32
from .patterns import Mask


def _xp(a):
    return np if isinstance(a, np.ndarray) else __import__("cupy")


def reference(q, k, v, mask: Mask, dtype: str = "float32", scale: float | None = None,
              chunk_bytes: int = 1 << 28, tile: int = 128):
    """Attention in float64 of storage arrays [B, H, T, D]; returns float64 [B, H, T, D].

    Rows go in blocks of ``tile``; each block looks only at the key tiles the pattern's tile
    list names, with the exact mask applied on them. The allowed pairs seen are counted and
    must equal the pattern's closed-form pair count, so a tile the list missed cannot pass
    unnoticed."""
    xp = _xp(q)
    B, H, T, D = q.shape
    if mask.T != T:
        raise ValueError(f"mask is for T={mask.T}, inputs have T={T}")
    s = (1.0 / math.sqrt(D)) if scale is None else scale
    q64, k64, v64 = (to_float32(a, dtype).astype(xp.float64) for a in (q, k, v))
    out = xp.empty((B, H, T, D), dtype=xp.float64)
    tiles = mask.tiles(tile, tile)
    seen = 0
    for qt in range(len(tiles.ptr) - 1):
        kts = (tiles.entries[tiles.ptr[qt]:tiles.ptr[qt + 1]] >> 1).astype(np.int64)
        keys = (kts[:, None] * tile + np.arange(tile)[None, :]).ravel()
        keys = np.sort(keys[keys < T])
        if keys.size and keys[-1] - keys[0] + 1 == keys.size:  # one range (dense, windows): no copy
            kg, vg = (a[:, :, int(keys[0]):int(keys[-1]) + 1] for a in (k64, v64))
        else:
            kg, vg = (a[:, :, xp.asarray(keys)] for a in (k64, v64))
        r_end = min(T, (qt + 1) * tile)
        rows = max(1, chunk_bytes // max(1, 8 * B * H * keys.size * 2))
        for r0 in range(qt * tile, r_end, rows):
            r1 = min(r_end, r0 + rows)
            m_host = mask.allowed(np.arange(r0, r1)[:, None], keys[None, :])
            seen += int(m_host.sum())
            m = xp.asarray(m_host)
            sc = xp.matmul(q64[:, :, r0:r1], kg.swapaxes(-1, -2)) * s
            sc = xp.where(m, sc, -xp.inf)
            sc -= sc.max(axis=-1, keepdims=True)
            p = xp.exp(sc)
            p /= p.sum(axis=-1, keepdims=True)
            out[:, :, r0:r1] = xp.matmul(p, vg)
    if seen != mask.pairs:
        raise AssertionError(f"reference saw {seen} allowed pairs of {mask.label()} at T={T}, "
                             f"the closed form counts {mask.pairs}: the tile list misses some")
    return out


def rel_error(out, ref) -> float:
    """||out - ref|| / ||ref||, NaN when out holds NaN or Inf."""
    xp = _xp(ref)
    o = xp.asarray(out, dtype=xp.float64)
    if not bool(xp.isfinite(o).all()):
        return float("nan")
    return float(xp.linalg.norm(o - ref) / xp.linalg.norm(ref))
