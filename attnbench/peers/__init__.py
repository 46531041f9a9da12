"""Peer baselines, timed under the same protocol and correctness gate as attnbench's kernels.

* ``cublas``: the attention a user writes with CuPy alone: S = Q K^T through cuBLAS, the
  pattern's dense mask, a max-subtracted softmax, O = P V, chunked over queries.
* ``sdpa-flash``, ``sdpa-cudnn``, ``sdpa-efficient``, ``sdpa-math``: ``torch.nn.functional.
  scaled_dot_product_attention`` pinned to one backend each (math: unfused, the scores
  materialised, refused above ``SDPA_MATH_BYTES`` of them).
* ``flex``: FlexAttention under ``torch.compile``, its mask_mod the pattern's own predicate
  (``Mask.mask_mod``), at the better of block 64 and 128 (SPEC section 6).

Every peer computes the three passes (``impls.PASSES``): ``cublas`` its backward with CuPy and
cuBLAS over the same chunks as its forward, the torch peers theirs through
``torch.autograd.grad`` (``common.TorchRunner``), Flex at the fastest of ``FLEX_BWD_SETTINGS`` that
compiles. Serving shapes stay forward-only (``Problem`` refuses a backward there).

One module a peer (``cublas``, ``sdpa``, ``flex``), what they share in ``common``.

torch is optional and imported lazily: without it the torch peers stay registered and
``availability`` says why they cannot run. Inputs and outputs cross between CuPy and torch
through DLPack without copies, and torch runs on CuPy's current stream.
"""
from __future__ import annotations

# in this order: each module registers its peers on import, and the registry lists them so
from .cublas import CUBLAS, MASK_CACHE_BYTES, SCRATCH_BYTES, CublasImpl, cublas_rows
from .sdpa import (SDPA_CUDNN, SDPA_EFFICIENT, SDPA_FLASH, SDPA_MASK_BYTES, SDPA_MATH, SDPA_MATH_BYTES, SdpaImpl,
                   sdpa_mask_bytes, sdpa_math_bytes)
from .flex import FLEX, FLEX_BLOCKS, FLEX_BWD_SETTINGS, FlexImpl, FlexSetting, flex_kernel_options

__all__ = ["CUBLAS", "SDPA_FLASH", "SDPA_CUDNN", "SDPA_EFFICIENT", "SDPA_MATH", "FLEX", "CublasImpl", "SdpaImpl",
           "FlexImpl", "FlexSetting", "FLEX_BLOCKS", "FLEX_BWD_SETTINGS", "MASK_CACHE_BYTES", "SCRATCH_BYTES",
           "SDPA_MASK_BYTES", "SDPA_MATH_BYTES", "cublas_rows", "sdpa_mask_bytes", "sdpa_math_bytes",
           "flex_kernel_options"]
