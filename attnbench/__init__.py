"""attnbench: sparse-attention kernels, peers and benchmarks on CUDA, driven from Python."""
from __future__ import annotations

from .patterns import PATTERNS, BadInput, make_mask

__version__ = "0.1.0"


def problem_for(q, k, v, pattern: str, causal: bool, scale, dtype, max_t, max_keys, **params):
    """Bind q, k, v onto the device and describe the problem; raises BadInput before any launch."""
    from .arrays import bind
    from .impls import Problem

    bound = [bind(x, name, dtype) for x, name in ((q, "q"), (k, "k"), (v, "v"))]
    shape = tuple(bound[0].array.shape)
    if len(shape) != 4:
        raise BadInput(f"q has shape {shape}: expected 4 dimensions [B, H, T, D]")
    for b, name in zip(bound[1:], ("k", "v")):
        if tuple(b.array.shape) != shape:
            raise BadInput(f"{name} has shape {tuple(b.array.shape)}, q has {shape}: they must match")
        if b.dtype != bound[0].dtype:
            raise BadInput(f"{name} has dtype {b.dtype}, q has {bound[0].dtype}: they must match")
    B, H, T, D = shape
    mask = make_mask(pattern, T, causal, **params)
    return bound, Problem(mask, B, H, D, bound[0].dtype, scale, max_t, max_keys)


def attention(q, k, v, pattern: str = "streaming", impl: str = "naive", causal: bool = True,
              scale: float | None = None, dtype: str | None = None, max_t: int | None = None,
              max_keys: int | None = None, **params):
    """Sparse attention of q, k, v ([B, H, T, D], CuPy arrays or anything with __dlpack__ /
    __cuda_array_interface__, e.g. torch tensors); returns the output as the same kind of array.

    ``params`` are the pattern's parameters (window, sink, block, dilation, window_blocks,
    global_blocks, random_blocks, seed); ``dtype='bfloat16'`` reads CuPy uint16 arrays as
    bfloat16 bit patterns."""
    from .arrays import unbind
    from .impls import get_impl

    bound, prob = problem_for(q, k, v, pattern, causal, scale, dtype, max_t, max_keys, **params)
    im = get_impl(impl)
    im.require(prob)
    runner = im.prepare(prob, *(b.array for b in bound))
    runner.run()
    return unbind(runner.out, bound[0])


__all__ = ["attention", "make_mask", "PATTERNS", "BadInput", "__version__"]
