"""float64 reference attention, straight from the pattern's mask (SPEC sections 1, 2, 4).

Chunked over queries so that T = 4096 with B = 2, H = 4 runs in modest memory, on the CPU
(numpy) or on the GPU (cupy): pass arrays of either library.
"""
from __future__ import annotations

import math

import numpy as np

from .arrays import to_float32
from .patterns import Mask


def _xp(a):
    return np if isinstance(a, np.ndarray) else __import__("cupy")


def reference(q, k, v, mask: Mask, dtype: str = "float32", scale: float | None = None,
              chunk_bytes: int = 1 << 28):
    """Attention in float64 of storage arrays [B, H, T, D]; returns float64 [B, H, T, D]."""
    xp = _xp(q)
    B, H, T, D = q.shape
    if mask.T != T:
        raise ValueError(f"mask is for T={mask.T}, inputs have T={T}")
    s = (1.0 / math.sqrt(D)) if scale is None else scale
    q64, k64, v64 = (to_float32(a, dtype).astype(xp.float64) for a in (q, k, v))
    out = xp.empty((B, H, T, D), dtype=xp.float64)
    rows = max(1, min(T, chunk_bytes // max(1, 8 * B * H * T * 2)))
    for r0 in range(0, T, rows):
        r1 = min(T, r0 + rows)
        m = xp.asarray(mask.dense(np.arange(r0, r1)))
        sc = xp.matmul(q64[:, :, r0:r1], k64.swapaxes(-1, -2)) * s
        sc = xp.where(m, sc, -xp.inf)
        sc -= sc.max(axis=-1, keepdims=True)
        p = xp.exp(sc)
        p /= p.sum(axis=-1, keepdims=True)
        out[:, :, r0:r1] = xp.matmul(p, v64)
    return out


def rel_error(out, ref) -> float:
    """||out - ref|| / ||ref||, NaN when out holds NaN or Inf."""
    xp = _xp(ref)
    o = xp.asarray(out, dtype=xp.float64)
    if not bool(xp.isfinite(o).all()):
        return float("nan")
    return float(xp.linalg.norm(o - ref) / xp.linalg.norm(ref))
