"""A document mask's forward tile list and position table built on the device in one launch
(kernels/document_tiles.cu) from the document boundaries: what a training step over freshly packed
documents pays before its attention, the counterpart of FlexAttention's ``create_block_mask``. The
list is the host's closed form (``Document.tile_bounds``) entry for entry (a GPU test compares
them), and fast-tc's forward reads this one where a device is.

Its size is not known before the launch: the entries go into room for ``capacity`` of them, a bound
from the longest document (a query tile's keys span at most BM - 1 + 2 x that length)."""
from __future__ import annotations

import time

import numpy as np

THREADS = 512  # kernels/document_tiles.cu's DT_THREADS
CHUNK = 128    # and DT_CHUNK: query tiles per block


def starts(lens) -> np.ndarray:
    """int32 [ndocs + 1]: each document's first position, then T."""
    out = np.zeros(len(lens) + 1, np.int64)
    np.cumsum(lens, out=out[1:])
    return out.astype(np.int32)


def capacity(T: int, BM: int, BN: int, longest: int) -> int:
    """Entries the list of T rows cannot exceed when no document is longer than ``longest``."""
    nq, nk = -(-T // BM), -(-T // BN)
    return nq * min(nk, -(-(BM - 1 + 2 * longest) // BN) + 1)


def build(mask, BM: int, BN: int, parts: dict | None = None):
    """``DeviceTiles`` of ``mask`` (a document mask) on the current device, its ``table`` the
    position table. Its ``build_s``: the seconds from the document boundaries on the device to the
    list and the table written (one allocation, one launch of two arguments, the wait), as Flex's
    ``block_mask_build_s`` counts from its mask_mod's table on the device to its block mask; the
    boundaries' upload (``ndocs + 1`` integers) and the kernel's compilation come before. With
    ``parts`` (a dict) the seconds of each piece go there instead: ``alloc_s``, ``launch_s`` (the
    call's return), ``wait_s``, and ``kernel_s``, the launch's own time between two CUDA events
    (recorded around it, outside the other pieces)."""
    import cupy

    from .compile import get_module
    from .tiles import DeviceTiles

    T, p = mask.T, mask.params
    lens = mask.pattern.lengths(T, p)
    kernel = get_module("document_tiles", {}).get_function("document_list")
    nq = -(-T // BM)
    cap = capacity(T, BM, BN, int(lens.max()))
    blocks = max(-(-nq // CHUNK), min(-(-T // THREADS), 1024))
    meta = cupy.asarray(np.concatenate([[lens.size, T, BM, BN, p["window"], int(mask.causal), nq, cap],
                                        starts(lens)]).astype(np.int32))
    meta_ptr = np.uint64(meta.data.ptr)
    size = 4 * nq + 2 * T + nq + 1 + cap
    stream = cupy.cuda.get_current_stream()
    stream.synchronize()
    t0 = time.perf_counter()
    mem = cupy.cuda.alloc(4 * size)  # the pool's memory, no array around it yet
    args = (meta_ptr, np.uint64(mem.ptr))  # addresses as plain integers: the launch checks no array
    if parts is None:
        kernel((blocks,), (THREADS,), args)
        stream.synchronize()
    else:
        t1 = time.perf_counter()
        ev = cupy.cuda.Event(), cupy.cuda.Event()
        ev[0].record(stream)
        t2 = time.perf_counter()
        kernel((blocks,), (THREADS,), args)
        t3 = time.perf_counter()
        ev[1].record(stream)
        stream.synchronize()
        parts.update(alloc_s=t1 - t0, launch_s=t3 - t2, wait_s=time.perf_counter() - t3,
                     kernel_s=cupy.cuda.get_elapsed_time(*ev) / 1e3)
    seconds = time.perf_counter() - t0
    # the parts of ``out``, as the kernel lays them out
    out = cupy.ndarray((size,), cupy.int32, memptr=mem)
    heads, rest = out[:4 * nq].reshape(nq, 4), out[4 * nq:]
    table, rest = rest[:2 * T].reshape(T, 2), rest[2 * T:]
    return DeviceTiles(rest[:nq + 1], rest[nq + 1:], heads, seconds, table)


def standard_builds() -> list[tuple[str, dict]]:
    """No compile-time constants: one build."""
    return [("document_tiles", {})]
