"""fast-tc as a torch.autograd.Function: the forward saves each row's log-sum-exp, the backward runs
kernels/fast_tc_bwd.cu (``attnbench.attention`` on tensors that need a gradient). Tensors cross to
CuPy by DLPack without a copy; the kernels run on torch's current stream. Imports torch, an
optional extra: import this module only when torch is there.
"""
from __future__ import annotations

import cupy
import torch

from .arrays import Bound, bind, unbind
from .fast_tc_bwd import backward, forward_lse
from .patterns import Mask


def _cupy(t: torch.Tensor, name: str) -> Bound:
    return bind(t.detach().contiguous(), name)


class FastTCAttention(torch.autograd.Function):
    """apply(q, k, v, mask, scale, wgmma): [B, H, T, D] CUDA tensors (bfloat16 or float16)."""

    @staticmethod
    def forward(ctx, q, k, v, mask: Mask, scale, wgmma: bool):
        bq, bk, bv = _cupy(q, "q"), _cupy(k, "k"), _cupy(v, "v")
        with cupy.cuda.Device(q.device.index), cupy.cuda.ExternalStream(torch.cuda.current_stream(q.device).cuda_stream):
            o, lse = forward_lse(mask, bq.array, bk.array, bv.array, scale, dtype=bq.dtype, wgmma=wgmma)
        out = unbind(o, bq)
        ctx.mask, ctx.scale, ctx.wgmma = mask, scale, wgmma
        ctx.save_for_backward(q, k, v, out, torch.from_dlpack(lse))
        return out

    @staticmethod
    def backward(ctx, do):
        q, k, v, out, lse = ctx.saved_tensors
        b = [_cupy(t, name) for t, name in ((q, "q"), (k, "k"), (v, "v"), (out, "o"), (do, "do"))]
        with cupy.cuda.Device(q.device.index), cupy.cuda.ExternalStream(torch.cuda.current_stream(q.device).cuda_stream):
            grads = backward(ctx.mask, *(x.array for x in b[:4]), cupy.from_dlpack(lse), b[4].array, ctx.scale,
                             dtype=b[0].dtype, wgmma=ctx.wgmma)
        return (*(unbind(g, b[0]) for g in grads), None, None, None)


def to_classes(x: torch.Tensor, r: int) -> torch.Tensor:
    """[..., T, D] into the class-major layout of r classes (position c * T / r + a holds a * r + c)."""
    *lead, T, D = x.shape
    return x.reshape(*lead, T // r, r, D).transpose(-2, -3).reshape(*lead, T, D)


def from_classes(x: torch.Tensor, r: int) -> torch.Tensor:
    """``to_classes``' inverse."""
    *lead, T, D = x.shape
    return x.reshape(*lead, r, T // r, D).transpose(-2, -3).reshape(*lead, T, D)


def attention(q, k, v, mask: Mask, scale: float | None, wgmma: bool = True):
    """Attention whose backward runs fast-tc's kernels (inputs made contiguous inside the graph). fast-tc
    (``wgmma``) runs a mask on its class-major layout where ``classes.prefers`` it, as its runner does: read in
    place by the kernels where its classes allow (``Mask.in_place``), else the inputs permuted into it and the
    output out of it by torch, so that the gradients go back the same way."""
    from .classes import prefers, read_in_place

    if wgmma and prefers(mask):
        r, banded = mask.class_major()
        placed = read_in_place(banded)
        if placed is not None:  # the kernels take each layout row where it lies: nothing to permute
            return FastTCAttention.apply(q.contiguous(), k.contiguous(), v.contiguous(), placed, scale, wgmma)
        q, k, v = (to_classes(x, r).contiguous() for x in (q, k, v))
        return from_classes(FastTCAttention.apply(q, k, v, banded, scale, wgmma), r)
    return FastTCAttention.apply(q.contiguous(), k.contiguous(), v.contiguous(), mask, scale, wgmma)
