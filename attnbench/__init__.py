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


def attention(q, k, v, pattern: str = "streaming", impl: str | None = None, causal: bool = True,
              scale: float | None = None, dtype: str | None = None, max_t: int | None = None,
              max_keys: int | None = None, **params):
    """Sparse attention of q, k, v ([B, H, T, D], CuPy arrays or anything with __dlpack__ /
    __cuda_array_interface__, e.g. torch tensors); returns the output as the same kind of array.

    ``params`` are the pattern's parameters (window, sink, block, dilation, window_blocks,
    global_blocks, random_blocks, seed); ``dtype='bfloat16'`` reads CuPy uint16 arrays as
    bfloat16 bit patterns.

    On torch tensors that require a gradient (with grad enabled) the output is part of the graph:
    its backward runs fast-tc's backward kernels (``attnbench.autograd``; bfloat16 or float16,
    D 64 or 128); ``impl`` is then "fast-tc" (the default; wgmma forward on sm_90) or
    "fast-tc-sync". Otherwise ``impl`` defaults to "naive"."""
    from .arrays import unbind
    from .impls import get_impl

    if _needs_grad(q, k, v):
        return _attention_with_grad(q, k, v, pattern, impl or "fast-tc", causal, scale, **params)
    bound, prob = problem_for(q, k, v, pattern, causal, scale, dtype, max_t, max_keys, **params)
    im = get_impl(impl or "naive")
    im.require(prob)
    runner = im.prepare(prob, *(b.array for b in bound))
    runner.run()
    return unbind(runner.out, bound[0])


def _needs_grad(*xs) -> bool:
    """Whether any input is a torch tensor that requires a gradient, with grad enabled."""
    if not any(type(x).__module__.startswith("torch") for x in xs):
        return False
    import torch

    return torch.is_grad_enabled() and any(getattr(x, "requires_grad", False) for x in xs)


def _attention_with_grad(q, k, v, pattern: str, impl: str, causal: bool, scale, **params):
    """fast-tc's forward and backward through torch.autograd (BadInput before any launch)."""
    if impl not in ("fast-tc", "fast-tc-sync"):
        raise BadInput(f"impl={impl!r} computes no backward: with inputs that require a gradient, use "
                       f"impl='fast-tc' or 'fast-tc-sync'")
    shapes = {tuple(x.shape) for x in (q, k, v)}
    dtypes = {str(x.dtype) for x in (q, k, v)}
    if len(shapes) != 1 or len(dtypes) != 1 or len(q.shape) != 4:
        raise BadInput(f"q, k, v must be [B, H, T, D] of one shape and dtype, got {[tuple(x.shape) for x in (q, k, v)]} "
                       f"and {sorted(dtypes)}")
    if dtypes != {"torch.bfloat16"} and dtypes != {"torch.float16"}:
        raise BadInput(f"dtype={q.dtype} has no backward in fast-tc (supports torch.bfloat16, torch.float16)")
    from .autograd import attention as run

    mask = make_mask(pattern, int(q.shape[2]), causal, **params)
    return run(q, k, v, mask, scale, wgmma=impl == "fast-tc")


__all__ = ["attention", "make_mask", "PATTERNS", "BadInput", "__version__"]
