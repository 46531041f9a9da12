"""Arrays in and out: CuPy arrays, torch tensors (DLPack, no copy), 16-bit storage.

CuPy has no bfloat16 dtype, so inside attnbench every tensor is a CuPy array in its
storage dtype: float32 -> float32, float16 -> float16, bfloat16 -> uint16 bit patterns.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import BadInput

STORAGE = {"float32": "float32", "float16": "float16", "bfloat16": "uint16"}


def to_float32(x, dtype: str):
    """Values of a storage array as float32 (numpy or cupy alike)."""
    if dtype == "bfloat16":
        return (x.astype(np.uint32) << 16).view(np.float32)
    return x.astype(np.float32)


def from_float32(x, dtype: str):
    """float32 values rounded (to nearest even) into the storage dtype."""
    if dtype == "bfloat16":
        u = x.astype(np.float32).view(np.uint32)
        u = u + (np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1)))
        return (u >> 16).astype(np.uint16)
    return x.astype(STORAGE[dtype])


# Arrays of more elements than WHOLE are drawn PIECE elements at a time into their storage: drawn whole, a
# decode cache of 2^33 elements (B=8, H_kv=8, Tk=1048576, D=128, 17 GB in bfloat16) took its float32 draw and two
# uint32 temporaries, 103 GB, beside the caches already made, and ran out of an H200's memory. Up to WHOLE (every
# prefill shape of the configurations) the draws are the ones they always were.
WHOLE = 1 << 30
PIECE = 1 << 27


def random_inputs(shape, dtype: str, seed: int, xp=None, scale: float = 1.0, keep: str = "qkv"):
    """Fresh random q, k, v (standard normal times ``scale``) in storage dtype, on the device by default.

    ``keep`` names the arrays wanted; the others are drawn as they would be (the same generator
    calls, so the kept ones hold the same values) but not stored, and come back as None. Decoding
    takes k and v at the cache's shape and q at its own: the cache-shaped q it did not keep was a
    third cache's memory (17 GB at B=8, Tk=1048576)."""
    if xp is None:
        import cupy as xp
    rng = xp.random.default_rng(seed) if hasattr(xp.random, "default_rng") else xp.random.RandomState(seed)
    size = int(np.prod(shape))
    out = []
    for name in "qkv":
        if size <= WHOLE:
            a = rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)
            out.append(from_float32(a, dtype) if name in keep else None)
            continue
        flat = xp.empty(size, dtype=STORAGE[dtype]) if name in keep else None
        for start in range(0, size, PIECE):
            n = min(PIECE, size - start)
            piece = rng.standard_normal(n, dtype=np.float32)
            if flat is not None:
                flat[start:start + n] = from_float32(piece * np.float32(scale), dtype)
        out.append(flat.reshape(shape) if flat is not None else None)
    return tuple(out)


def poison(x) -> None:
    """Fill a storage array with NaN (all-ones exponent, non-zero mantissa)."""
    if x.dtype == np.uint16:
        x.fill(0x7FC0)
    else:
        x.fill(np.nan)


@dataclass
class Bound:
    """An input brought onto the device: CuPy storage array, its dtype name, where it came from."""
    array: object
    dtype: str
    kind: str  # "cupy" or "torch"


_TORCH_DTYPES = {"torch.float32": "float32", "torch.float16": "float16", "torch.bfloat16": "bfloat16"}


def bind(x, name: str, dtype: str | None = None) -> Bound:
    """Bring q, k or v onto the device as a CuPy storage array without a copy."""
    import cupy

    mod = type(x).__module__
    if isinstance(x, np.ndarray):
        raise BadInput(f"{name} is a numpy array on the host: pass a CuPy array or a CUDA torch tensor")
    if mod.startswith("torch"):
        import torch

        if not x.is_cuda:
            raise BadInput(f"{name} is a torch tensor on {x.device}: it must be on a CUDA device")
        tname = _TORCH_DTYPES.get(str(x.dtype))
        if tname is None:
            raise BadInput(f"{name} has dtype {x.dtype}: supported are float32, float16, bfloat16")
        if not x.is_contiguous():
            raise BadInput(f"{name} is not contiguous: call .contiguous() first")
        t = x.detach()  # a tensor that requires grad exports no DLPack capsule; the storage is the same
        t = t.view(torch.int16) if tname == "bfloat16" else t
        arr = cupy.from_dlpack(t)
        if tname == "bfloat16":
            arr = arr.view(cupy.uint16)
        return Bound(arr, tname, "torch")
    if isinstance(x, cupy.ndarray):
        arr = x
    elif hasattr(x, "__cuda_array_interface__") or hasattr(x, "__dlpack__"):
        arr = cupy.from_dlpack(x) if hasattr(x, "__dlpack__") else cupy.asarray(x)
    else:
        raise BadInput(f"{name} of type {type(x).__name__} is not a device array: pass a CuPy array "
                       f"or anything with __dlpack__ / __cuda_array_interface__")
    if arr.dtype == np.uint16:
        if dtype not in ("bfloat16", None):
            raise BadInput(f"{name} holds uint16 bit patterns, which only dtype='bfloat16' takes")
        if dtype is None:
            raise BadInput(f"{name} is uint16: pass dtype='bfloat16' to read it as bfloat16 bit patterns")
        tname = "bfloat16"
    elif arr.dtype == np.float32:
        tname = "float32"
    elif arr.dtype == np.float16:
        tname = "float16"
    else:
        raise BadInput(f"{name} has dtype {arr.dtype}: supported are float32, float16, bfloat16 (as uint16)")
    if dtype is not None and dtype != tname:
        raise BadInput(f"{name} has dtype {tname} but dtype={dtype!r} was asked for")
    if not arr.flags.c_contiguous:
        raise BadInput(f"{name} is not contiguous: pass a C-contiguous array")
    return Bound(arr, tname, "cupy")


def unbind(out, like: Bound):
    """Return the output as the kind of array the caller gave."""
    if like.kind == "torch":
        import torch

        t = torch.from_dlpack(out.view(np.int16) if like.dtype == "bfloat16" else out)
        return t.view(torch.bfloat16) if like.dtype == "bfloat16" else t
    return out
