"""Programmatic dependent launch: a kernel launched so that it may start while the kernel before it
in the stream is still running (sm_90 and later).

CuPy's ``RawKernel`` launches through ``cuLaunchKernel``, which takes no launch attributes. ``pdl_launch``
calls the driver's ``cuLaunchKernelEx`` through ctypes with the attribute
``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION``: the launch is processed, and its blocks may be
placed on the multiprocessors, once every block of the kernel before it has executed
``griddepcontrol.launch_dependents`` (or exited). The dependent kernel must execute ``griddepcontrol.wait``
before it reads what the kernel before it writes: that waits for the whole grid and its memory
(kernels/common.cuh: ``ab_pdl_trigger``, ``ab_pdl_wait``). Both instructions are no-ops in a plain launch,
so a kernel that holds them runs correctly either way.

``pdl_available()`` says whether this process can launch so (a device of compute capability 9.0 or more
and a driver that exports ``cuLaunchKernelEx``); where it cannot, callers launch plainly and say so.
"""
from __future__ import annotations

import ctypes
import functools

import numpy as np

_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID


class _Attribute(ctypes.Structure):  # CUlaunchAttribute: the id, padding to 8 bytes, a 64-byte value union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int32 * 16)]


class _Config(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_Attribute)), ("numAttrs", ctypes.c_uint)]


@functools.lru_cache(maxsize=None)
def _driver_call(name: str, *argtypes):
    """libcuda's function ``name`` (returning a CUresult, taking ``argtypes``), or None where there is no
    libcuda or no such function."""
    try:
        fn = getattr(ctypes.CDLL("libcuda.so.1"), name)
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = list(argtypes)
    return fn


def _driver():
    """libcuda's cuLaunchKernelEx, or None."""
    return _driver_call("cuLaunchKernelEx", ctypes.POINTER(_Config), ctypes.c_void_p,
                        ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)


def _occupancy():
    """libcuda's cuOccupancyMaxActiveClusters, or None."""
    return _driver_call("cuOccupancyMaxActiveClusters", ctypes.POINTER(ctypes.c_int), ctypes.c_void_p,
                        ctypes.POINTER(_Config))


def max_active_clusters(kernel, grid, block, shared_mem: int = 0) -> tuple[int, int]:
    """(how many clusters of CuPy RawKernel ``kernel`` (its cluster shape compiled in, ``__cluster_dims__``)
    the device runs at once for this launch shape: the driver's cuOccupancyMaxActiveClusters, which
    counts the GPCs' multiprocessors and each block's registers and shared memory; its CUresult). The
    count is 0 where the driver has no such call (CUresult -1) or refuses the shape, so that a caller
    takes the launch without a cluster and can say why."""
    import cupy

    fn = _occupancy()
    if fn is None:
        return 0, -1
    g, b = _dims(grid), _dims(block)
    cfg = _Config(g[0], g[1], g[2], b[0], b[1], b[2], int(shared_mem),
                  ctypes.c_void_p(cupy.cuda.get_current_stream().ptr), None, 0)
    n = ctypes.c_int(0)
    rc = fn(ctypes.byref(n), ctypes.c_void_p(kernel.kernel.ptr), ctypes.byref(cfg))
    return (n.value if rc == 0 else 0), rc


_ATTR_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14  # CUfunction_attribute


def allow_nonportable_clusters(kernel) -> None:
    """Let CuPy RawKernel ``kernel`` run clusters of more than 8 blocks (up to 16 on sm_90): the driver's
    cuFuncSetAttribute(CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)."""
    fn = _driver_call("cuFuncSetAttribute", ctypes.c_void_p, ctypes.c_int, ctypes.c_int)
    if fn is None:
        raise RuntimeError("clusters of more than 8 blocks: the driver's cuFuncSetAttribute is not there")
    rc = fn(ctypes.c_void_p(kernel.kernel.ptr), _ATTR_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
    if rc != 0:
        raise RuntimeError(f"cuFuncSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED) failed: CUresult {rc}")


def pdl_available() -> bool:
    """True where ``pdl_launch`` launches with the attribute: compute capability 9.0 or more, and the
    driver's ``cuLaunchKernelEx``."""
    import cupy

    major = int(cupy.cuda.Device().compute_capability) // 10
    return major >= 9 and _driver() is not None


def _param(x):
    """The ctypes value of one kernel argument (a CuPy array's pointer, a NumPy scalar, None: null)."""
    import cupy

    if x is None:
        return ctypes.c_void_p(0)
    if isinstance(x, cupy.ndarray):
        return ctypes.c_void_p(x.data.ptr)
    if isinstance(x, np.generic):
        kinds = {np.dtype(np.int32): ctypes.c_int32, np.dtype(np.uint32): ctypes.c_uint32,
                 np.dtype(np.int64): ctypes.c_int64, np.dtype(np.uint64): ctypes.c_uint64,
                 np.dtype(np.float32): ctypes.c_float, np.dtype(np.float64): ctypes.c_double}
        if x.dtype in kinds:
            return kinds[x.dtype](x.item())
    raise TypeError(f"pdl_launch: an argument of type {type(x).__name__} (give CuPy arrays or sized NumPy scalars)")


def _dims(d) -> tuple[int, int, int]:
    d = tuple(int(v) for v in (d if isinstance(d, tuple) else (d,)))
    return (d + (1, 1, 1))[:3]


def pdl_launch(kernel, grid, block, args, shared_mem: int = 0) -> None:
    """Launch CuPy RawKernel ``kernel`` on the current stream as a programmatic dependent of the kernel
    before it (see the module's doc). The caller checks ``pdl_available()`` first."""
    import cupy

    fn = _driver()
    vals = [_param(a) for a in args]
    ptrs = (ctypes.c_void_p * max(1, len(vals)))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in vals])
    attr = _Attribute()
    attr.id = _ATTR_PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value[0] = 1
    g, b = _dims(grid), _dims(block)
    cfg = _Config(g[0], g[1], g[2], b[0], b[1], b[2], int(shared_mem),
                  ctypes.c_void_p(cupy.cuda.get_current_stream().ptr), ctypes.pointer(attr), 1)
    rc = fn(ctypes.byref(cfg), ctypes.c_void_p(kernel.kernel.ptr), ptrs, None)
    if rc != 0:
        raise RuntimeError(f"cuLaunchKernelEx (programmatic dependent launch) failed: CUresult {rc}")
