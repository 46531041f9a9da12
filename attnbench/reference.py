"""float64 reference attention, straight from the pattern's mask (SPEC sections 1, 2, 4).

Chunked over queries so that T = 4096 with B = 2, H = 4 runs in modest memory, on the CPU
(numpy) or on the GPU (cupy): pass arrays of either library. Sparse patterns cost what
their allowed pairs cost, so the gate runs at T = 131072 too.

Serving shapes (SPEC section 1): k and v may hold H_kv heads (query head h reads key/value head
h // (H // H_kv)), and q may hold Tq < Tk queries, at absolute positions Tk - Tq .. Tk - 1; in a
ragged batch sequence b holds Tk_b keys (``cache_lens``) and its queries sit at Tk_b - Tq ..
Tk_b - 1, the keys beyond Tk_b unused.
"""
from __future__ import annotations

import math

import numpy as np

from .arrays import to_float32
from .patterns import Mask


def _xp(a):
    return np if isinstance(a, np.ndarray) else __import__("cupy")


def reference(q, k, v, mask: Mask, dtype: str = "float32", scale: float | None = None,
              chunk_bytes: int = 1 << 28, tile: int = 128, cache_lens=None):
    """Attention in float64 of storage arrays q [B, H, Tq, D], k and v [B, H_kv, T, D]; returns
    float64 [B, H, Tq, D].

    Prefill (Tq = T, no ``cache_lens``): rows go in blocks of ``tile``; each block looks only at
    the key tiles the pattern's tile list names, with the exact mask applied on them. A decode
    looks at the keys some of its queries allows (``Mask.keys``). The allowed pairs seen are
    counted and must equal the pattern's closed-form pair count, so a tile the list missed cannot
    pass unnoticed."""
    xp = _xp(q)
    B, H, Tq, D = q.shape
    H_kv, T = k.shape[1], k.shape[2]
    if mask.T != T:
        raise ValueError(f"mask is for T={mask.T}, inputs have T={T}")
    if H % H_kv or k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"q {tuple(q.shape)} with k {tuple(k.shape)}, v {tuple(v.shape)}: k and v must be "
                         f"[B, H_kv, T, D] with H_kv dividing H")
    s = (1.0 / math.sqrt(D)) if scale is None else scale
    q64, k64, v64 = (to_float32(a, dtype).astype(xp.float64) for a in (q, k, v))
    out = xp.empty((B, H, Tq, D), dtype=xp.float64)
    if Tq == T and cache_lens is None:
        _prefill(q64, k64, v64, out, mask, s, chunk_bytes, tile)
        return out
    lens = [T] * B if cache_lens is None else [int(t) for t in cache_lens]
    seen = expected = 0
    for t in sorted(set(lens)):  # the sequences of one cache length together
        m = mask.at(t)
        bs = [b for b in range(B) if lens[b] == t]
        rows = np.arange(t - Tq, t)
        keys = m.keys(rows)
        expected += int(m.row_counts(rows).sum()) * len(bs)
        sel = bs if len(bs) < B else slice(None)
        kg, vg = _gather(k64[sel], v64[sel], keys, xp)
        step = max(1, chunk_bytes // max(1, 8 * len(bs) * H * keys.size * 2))
        for r0 in range(0, Tq, step):
            r1 = min(Tq, r0 + step)
            allowed = m.allowed(rows[r0:r1, None], keys[None, :])
            seen += int(allowed.sum()) * len(bs)
            out[sel, :, r0:r1] = _attend(q64[sel, :, r0:r1], kg, vg, xp.asarray(allowed), s, xp)
    if seen != expected:
        raise AssertionError(f"reference saw {seen} allowed pairs of {mask.label()} at T={T}, Tq={Tq}, "
                             f"the counts give {expected}")
    return out


def _gather(k64, v64, keys: np.ndarray, xp):
    """k and v at the given sorted keys (a view when they form one range: dense, windows)."""
    if keys.size and keys[-1] - keys[0] + 1 == keys.size:
        return tuple(a[:, :, int(keys[0]):int(keys[-1]) + 1] for a in (k64, v64))
    return tuple(a[:, :, xp.asarray(keys)] for a in (k64, v64))


def _attend(qr, kg, vg, allowed, s: float, xp):
    """Softmax attention of rows qr [b, H, r, D] over kg, vg [b, H_kv, n, D] where ``allowed``
    [r, n]; query head h reads key/value head h // (H // H_kv)."""
    b, H, r, D = qr.shape
    H_kv = kg.shape[1]
    qg = qr.reshape(b, H_kv, H // H_kv, r, D)
    sc = xp.matmul(qg, kg[:, :, None].swapaxes(-1, -2)) * s
    sc = xp.where(allowed, sc, -xp.inf)
    sc -= sc.max(axis=-1, keepdims=True)
    p = xp.exp(sc)
    p /= p.sum(axis=-1, keepdims=True)
    return xp.matmul(p, vg[:, :, None]).reshape(b, H, r, D)


def _prefill(q64, k64, v64, out, mask: Mask, s: float, chunk_bytes: int, tile: int) -> None:
    xp = _xp(q64)
    B, H, T, D = q64.shape
    tiles = mask.tiles(tile, tile)
    seen = 0
    for qt in range(len(tiles.ptr) - 1):
        kts = (tiles.entries[tiles.ptr[qt]:tiles.ptr[qt + 1]] >> 1).astype(np.int64)
        keys = (kts[:, None] * tile + np.arange(tile)[None, :]).ravel()
        keys = np.sort(keys[keys < T])
        kg, vg = _gather(k64, v64, keys, xp)
        r_end = min(T, (qt + 1) * tile)
        rows = max(1, chunk_bytes // max(1, 8 * B * H * keys.size * 2))
        for r0 in range(qt * tile, r_end, rows):
            r1 = min(r_end, r0 + rows)
            m_host = mask.allowed(np.arange(r0, r1)[:, None], keys[None, :])
            seen += int(m_host.sum())
            out[:, :, r0:r1] = _attend(q64[:, :, r0:r1], kg, vg, xp.asarray(m_host), s, xp)
    if seen != mask.pairs:
        raise AssertionError(f"reference saw {seen} allowed pairs of {mask.label()} at T={T}, "
                             f"the closed form counts {mask.pairs}: the tile list misses some")


def rel_error(out, ref) -> float:
    """||out - ref|| / ||ref||, NaN when out holds NaN or Inf."""
    xp = _xp(ref)
    o = xp.asarray(out, dtype=xp.float64)
    if not bool(xp.isfinite(o).all()):
        return float("nan")
    return float(xp.linalg.norm(o - ref) / xp.linalg.norm(ref))
