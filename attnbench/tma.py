"""Tensor maps for Hopper's bulk tensor copies (TMA), encoded by the CUDA driver.

``cuTensorMapEncodeTiled`` is a driver call CuPy does not wrap, so it is reached through ctypes
in ``libcuda``. A map is 128 opaque bytes describing a tiled view of a tensor in device memory;
kernels/fast_tc.cu takes the maps of Q, K and V by value (kernels/tma.cuh): each goes to the
launch as a pointer to its host bytes, which the driver copies into the kernel's parameters.
"""
from __future__ import annotations

import ctypes

MAP_BYTES = 128
# enum values of cuda.h (CUtensorMapDataType, CUtensorMapInterleave, CUtensorMapSwizzle,
# CUtensorMapL2promotion, CUtensorMapFloatOOBfill)
DTYPE_UINT16 = 1
DTYPE_FLOAT32 = 7
INTERLEAVE_NONE = 0
SWIZZLE_128B = 3
L2_PROMOTION_128B = 2
OOB_FILL_ZERO = 0

_encode = None


def _driver_encode():
    global _encode
    if _encode is None:
        lib = ctypes.CDLL("libcuda.so.1")
        f = lib.cuTensorMapEncodeTiled
        u64p, u32p = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32)
        f.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p, u32p, u32p,
                      ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        f.restype = ctypes.c_int
        _encode = f
    return _encode


class TensorMap:
    """128 bytes of a tensor map in host memory, 64-byte aligned; ``arg`` passes them by value
    to a kernel launch (the driver reads them through the pointer when the launch is made)."""

    def __init__(self):
        self._buf = ctypes.create_string_buffer(MAP_BYTES + 64)
        self.address = (ctypes.addressof(self._buf) + 63) // 64 * 64

    @property
    def arg(self):
        from cupy.cuda.function import CPointer

        return CPointer(self.address)


def encode_tiled(ptr: int, dims: tuple[int, ...], strides: tuple[int, ...], box: tuple[int, ...],
                 dtype: int = DTYPE_UINT16) -> TensorMap:
    """The map of a tensor of 16-bit elements (``dtype`` DTYPE_UINT16) at device address ``ptr``: ``dims`` innermost
    first, ``strides`` the byte strides of every dimension but the innermost, ``box`` the tile one
    copy moves (innermost 128 bytes, 64 elements: the 128-byte swizzle). Coordinates past ``dims`` read
    as 0. ``dtype`` DTYPE_FLOAT32: of 32-bit floats (innermost box 32 elements)."""
    if len(strides) != len(dims) - 1 or len(box) != len(dims):
        raise ValueError(f"rank {len(dims)} needs {len(dims) - 1} strides and {len(dims)} box sizes")
    rank = len(dims)
    m = TensorMap()
    res = _driver_encode()(
        ctypes.c_void_p(m.address), dtype, rank, ctypes.c_void_p(ptr),
        (ctypes.c_uint64 * rank)(*dims), (ctypes.c_uint64 * max(1, rank - 1))(*strides),
        (ctypes.c_uint32 * rank)(*box), (ctypes.c_uint32 * rank)(*([1] * rank)),
        INTERLEAVE_NONE, SWIZZLE_128B, L2_PROMOTION_128B, OOB_FILL_ZERO)
    if res != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed with CUresult {res} "
                           f"(address {ptr:#x}, dims {dims}, byte strides {strides}, box {box})")
    return m


def head_maps(arrays, box_rows: tuple[int, ...], classes: int = 1) -> list[TensorMap]:
    """One map per [B, H, T, D] array of 16-bit elements, in boxes of ``box_rows[i]`` rows by 64
    columns of one head (dims D, T, B*H). ``classes`` r > 1: the class-major layout read in place
    (kernels/tc/rows.cuh): dims D, r, T / r, B*H (row a * r + c is class c's row a), boxes of rows of one
    class, which the kernels address by (column, class, row in the class, head)."""
    maps = []
    for a, rows in zip(arrays, box_rows):
        B, H, T, D = a.shape
        if classes == 1:
            maps.append(encode_tiled(a.data.ptr, (D, T, B * H), (D * 2, T * D * 2), (64, rows, 1)))
        else:
            maps.append(encode_tiled(a.data.ptr, (D, classes, T // classes, B * H),
                                     (D * 2, classes * D * 2, T * D * 2), (64, 1, rows, 1)))
    return maps


def acc_map(acc, rows: int) -> TensorMap:
    """The map of a [B, H, T, D] float32 accumulator, in boxes of ``rows`` rows by 32 columns of one
    head (dims D, T, B*H): what a bulk tensor reduction adds into (kernels/tma.cuh, tma_reduce_add3)."""
    B, H, T, D = acc.shape
    return encode_tiled(acc.data.ptr, (D, T, B * H), (D * 4, T * D * 4), (32, rows, 1), DTYPE_FLOAT32)
