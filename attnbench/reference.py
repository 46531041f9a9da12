"""float64 reference attention, straight from the pattern's mask (SPEC sections 1, 2, 4).

Chunked over queries so that T = 4096 with B = 2, H = 4 runs in modest memory, on the CPU
(numpy) or on the GPU (cupy): pass arrays of either library; a block of rows holds at most
``default_chunk_bytes`` of float64 scores (more on a GPU with memory free, so dense causal at
T = 131072 goes in blocks of tens of rows, not a few). Sparse patterns cost what their allowed
pairs cost, so the gate runs at T = 131072 too.

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
              chunk_bytes: int | None = None, tile: int = 128, cache_lens=None):
    """Attention in float64 of storage arrays q [B, H, Tq, D], k and v [B, H_kv, T, D]; returns
    float64 [B, H, Tq, D].

    Prefill (Tq = T, no ``cache_lens``): rows go in blocks of ``tile``; each block looks only at
    the key tiles the pattern's tile list names, with the exact mask applied on them. A decode
    looks at the keys some of its queries allows (``Mask.keys``). The allowed pairs seen are
    counted and must equal the pattern's closed-form pair count, so a tile the list missed cannot
    pass unnoticed."""
    xp = _xp(q)
    chunk_bytes = chunk_bytes or default_chunk_bytes(xp)
    B, H, Tq, D = q.shape
    H_kv, T = k.shape[1], k.shape[2]
    s = _check(mask, T, D, scale)
    if H % H_kv or k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"q {tuple(q.shape)} with k {tuple(k.shape)}, v {tuple(v.shape)}: k and v must be "
                         f"[B, H_kv, T, D] with H_kv dividing H")
    if Tq == T and cache_lens is None:
        if H_kv != H:  # grouped heads: each query head's key/value head, repeated
            k, v = (xp.repeat(_as64(xp, a, dtype), H // H_kv, axis=1) for a in (k, v))
        return reference_forward(q, k, v, mask, dtype, scale, chunk_bytes, tile)[0]
    q64 = _as64(xp, q, dtype)
    out = xp.empty((B, H, Tq, D), dtype=xp.float64)
    lens = [T] * B if cache_lens is None else [int(t) for t in cache_lens]
    seen = expected = 0
    for t in sorted(set(lens)):  # the sequences of one cache length together
        m = mask.at(t)
        group = [b for b in range(B) if lens[b] == t]
        rows = np.arange(t - Tq, t)
        keys = m.keys(rows)
        expected += int(m.row_counts(rows).sum()) * len(group)
        # K and V go to float64 at the keys read only, a few sequences at a time: whole, the caches of
        # B=8, Tk=1048576 (or B=64, Tk=131072) would take 137 GB as float64
        per_seq = 2 * H_kv * max(1, keys.size) * D * 8
        nb = max(1, DECODE_KV_CHUNKS * chunk_bytes // per_seq)
        for c in range(0, len(group), nb):
            bs = group[c:c + nb]
            sel = slice(bs[0], bs[-1] + 1) if bs[-1] - bs[0] + 1 == len(bs) else bs
            kg, vg = (_as64(xp, a, dtype) for a in _gather(k[sel], v[sel], keys, xp))
            step = max(1, chunk_bytes // max(1, 8 * len(bs) * H * keys.size * 2))
            for r0 in range(0, Tq, step):
                r1 = min(Tq, r0 + step)
                allowed = m.allowed(rows[r0:r1, None], keys[None, :])
                seen += int(allowed.sum()) * len(bs)
                out[sel, :, r0:r1] = _attend(q64[sel, :, r0:r1], kg, vg, xp.asarray(allowed), s, xp)
            del kg, vg
    if seen != expected:
        raise AssertionError(f"reference saw {seen} allowed pairs of {mask.label()} at T={T}, Tq={Tq}, "
                             f"the counts give {expected}")
    return out


def reference_forward(q, k, v, mask: Mask, dtype: str = "float32", scale: float | None = None,
                      chunk_bytes: int | None = None, tile: int = 128):
    """``reference`` and the row log-sum-exp of the scaled scores (what a forward saves for its
    backward): (out [B, H, T, D], lse [B, H, T]), float64."""
    xp = _xp(q)
    chunk_bytes = chunk_bytes or default_chunk_bytes(xp)
    B, H, T, D = q.shape
    s = _check(mask, T, D, scale)
    q64, k64, v64 = (_as64(xp, a, dtype) for a in (q, k, v))
    out = xp.empty((B, H, T, D), dtype=xp.float64)
    lse = xp.empty((B, H, T), dtype=xp.float64)
    for r0, r1, keys, m, kg, vg in _blocks(mask, q64, k64, v64, chunk_bytes, tile):
        p, lse[:, :, r0:r1] = _probs(xp, q64[:, :, r0:r1], kg, m, s)
        out[:, :, r0:r1] = xp.matmul(p, vg)
    return out, lse


def reference_backward(q, k, v, do, mask: Mask, dtype: str = "float32", scale: float | None = None,
                       chunk_bytes: int | None = None, tile: int = 128):
    """The gradients of attention in float64 (SPEC section 3's backward), masked exactly like
    ``reference``: given storage arrays q, k, v and the output's gradient ``do`` [B, H, T, D],
    returns (dq, dk, dv, lse, delta): dq, dk, dv [B, H, T, D] and, per row, the log-sum-exp of
    the forward's scaled scores and ``delta = rowsum(dO * O)`` [B, H, T], all float64.

    With P = softmax(masked S), S = scale Q K^T: dV = P^T dO, dP = dO V^T,
    dS = P * (dP - delta), dQ = scale dS K, dK = scale dS^T Q. The forward runs first (its
    output and log-sum-exp), then the same blocks of rows again, each block adding to dK and dV
    of the keys it sees only."""
    g = reference_gradients(q, k, v, do, mask, dtype, scale, chunk_bytes, tile)
    return g["dq"], g["dk"], g["dv"], g["lse"], g["delta"]


def reference_gradients(q, k, v, do, mask: Mask, dtype: str = "float32", scale: float | None = None,
                        chunk_bytes: int | None = None, tile: int = 128) -> dict:
    """``reference_backward`` with the forward's output kept: a dict of float64 arrays ``out``, ``dq``,
    ``dk``, ``dv``, ``lse`` and ``delta`` (what a training step's gate compares: the output too)."""
    xp = _xp(q)
    chunk_bytes = chunk_bytes or default_chunk_bytes(xp)
    B, H, T, D = q.shape
    s = _check(mask, T, D, scale)
    out, lse = reference_forward(q, k, v, mask, dtype, s, chunk_bytes, tile)
    q64, k64, v64, do64 = (_as64(xp, a, dtype) for a in (q, k, v, do))
    delta = (do64 * out).sum(axis=-1)
    dq = xp.empty_like(q64)
    dk = xp.zeros_like(k64)
    dv = xp.zeros_like(v64)
    # a block holds about twice the arrays of the forward's: half the rows
    for r0, r1, keys, m, kg, vg in _blocks(mask, q64, k64, v64, chunk_bytes // 2, tile):
        qr, dor = q64[:, :, r0:r1], do64[:, :, r0:r1]
        p = xp.exp(xp.where(m, xp.matmul(qr, kg.swapaxes(-1, -2)) * s, -xp.inf) - lse[:, :, r0:r1, None])
        ds = p * (xp.matmul(dor, vg.swapaxes(-1, -2)) - delta[:, :, r0:r1, None])
        dq[:, :, r0:r1] = xp.matmul(ds, kg) * s
        kidx = slice(int(keys[0]), int(keys[-1]) + 1) if _one_range(keys) else xp.asarray(keys)
        dk[:, :, kidx] += xp.matmul(ds.swapaxes(-1, -2), qr) * s
        dv[:, :, kidx] += xp.matmul(p.swapaxes(-1, -2), dor)
    return {"out": out, "dq": dq, "dk": dk, "dv": dv, "lse": lse, "delta": delta}


HOST_CHUNK = 1 << 28     # bytes of float64 scores a block of rows holds at once on the CPU
DEVICE_CHUNK = (1 << 28, 1 << 31)  # on the GPU: a sixteenth of the free memory, within these bounds


DECODE_KV_CHUNKS = 4  # a decode's float64 K and V of one batch of sequences: at most this many chunk_bytes


def default_chunk_bytes(xp, free: int | None = None) -> int:
    """The float64 scores a block of rows may hold: HOST_CHUNK with numpy; with CuPy a sixteenth of
    the device's free memory (``free``, else asked), within DEVICE_CHUNK. A block's few temporaries
    of that size fit, and long rows (dense causal at T = 131072 reads 2^17 keys a row) go in blocks
    of many rows, not a few rows per launch of every array operation."""
    if xp is np:
        return HOST_CHUNK
    if free is None:
        free = xp.cuda.runtime.memGetInfo()[0]
    lo, hi = DEVICE_CHUNK
    return int(min(hi, max(lo, free // 16)))


def _check(mask: Mask, T: int, D: int, scale: float | None) -> float:
    """The scale to use; ValueError when the mask is for another T."""
    if mask.T != T:
        raise ValueError(f"mask is for T={mask.T}, inputs have T={T}")
    return (1.0 / math.sqrt(D)) if scale is None else scale


def _as64(xp, a, dtype: str):
    """Storage values as float64; float64 arrays as they are (finite differences need them whole)."""
    return a if a.dtype == xp.float64 else to_float32(a, dtype).astype(xp.float64)


def _one_range(keys) -> bool:
    return bool(keys.size) and keys[-1] - keys[0] + 1 == keys.size


def _probs(xp, qr, kg, m, s):
    """Softmax of the masked scaled scores of rows ``qr`` against keys ``kg``, and the rows'
    log-sum-exp."""
    sc = xp.where(m, xp.matmul(qr, kg.swapaxes(-1, -2)) * s, -xp.inf)
    mx = sc.max(axis=-1, keepdims=True)
    p = xp.exp(sc - mx)
    tot = p.sum(axis=-1, keepdims=True)
    return p / tot, (mx + xp.log(tot))[..., 0]


def _gather(k64, v64, keys: np.ndarray, xp):
    """k and v at the given sorted keys (a view when they form one range: dense, windows)."""
    if _one_range(keys):
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


def _blocks(mask: Mask, q64, k64, v64, chunk_bytes: int, tile: int):
    """(r0, r1, keys, m, kg, vg) per block of rows: the rows [r0, r1) of a query tile, the keys of
    the key tiles its list names (ascending), the mask on them (on q's device) and those keys'
    K and V. Raises AssertionError when the allowed pairs seen are not the closed-form count."""
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
            yield r0, r1, keys, xp.asarray(m_host), kg, vg
    if seen != mask.pairs:
        raise AssertionError(f"reference saw {seen} allowed pairs of {mask.label()} at T={T}, "
                             f"the closed form counts {mask.pairs}: the tile list misses some")


def rel_error(out, ref, norm: float | None = None) -> float:
    """||out - ref|| / ||ref|| (or over ``norm`` where given), NaN when out holds NaN or Inf."""
    xp = _xp(ref)
    o = xp.asarray(out, dtype=xp.float64)
    if not bool(xp.isfinite(o).all()):
        return float("nan")
    return float(xp.linalg.norm(o - ref) / (xp.linalg.norm(ref) if norm is None else norm))
