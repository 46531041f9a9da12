"""``sdpa-flash``, ``sdpa-cudnn``, ``sdpa-efficient``, ``sdpa-math``: ``torch.nn.functional.scaled_dot_product_attention``
pinned to one backend each; patterns other than dense through an additive attn_mask built once (math: unfused, the
scores materialised, refused above ``SDPA_MATH_BYTES`` of them)."""
from __future__ import annotations

import functools
import math
import time
import warnings
from dataclasses import dataclass

from ..errors import BadInput
from ..impls import ITEMSIZE, PASSES, Problem, Runner, register, timed
from ..patterns import Mask
from .common import ALL_DTYPES, TorchImpl, TorchRunner, row_chunks, sync, torch_reason

SDPA_MASK_BYTES = 4 << 30     # sdpa: largest T x T attn_mask built
SDPA_MATH_BYTES = 4 << 30     # sdpa-math: largest float32 [B, H, Tq, Tk] scores and probabilities it materialises


def _sdpa_mode(prob: Problem) -> str:
    """'causal' (is_causal=True), 'none' (every key: dense non-causal, or a dense decode of one
    query per sequence, all of equal length) or 'mask' (an attn_mask). SDPA's is_causal aligns the
    diagonal top-left, which a decode's queries (the last Tq positions) do not follow."""
    mask = prob.mask
    if mask.pattern.name == "dense":
        if prob.prefill:
            return "causal" if mask.causal else "none"
        if prob.q_len == 1 and prob.cache_lens is None:
            return "none"
    return "mask"


def _serving_mask_bytes(prob: Problem) -> int:
    return (prob.B if prob.cache_lens is not None else 1) * prob.q_len * _padded(prob.T) * ITEMSIZE[prob.dtype]


def _padded(T: int) -> int:
    # rows padded to 8 elements so the efficient backend reads the mask in place
    return -(-T // 8) * 8


def sdpa_mask_bytes(T: int, dtype: str) -> int:
    return T * _padded(T) * ITEMSIZE[dtype]


def sdpa_math_copies(prob: Problem) -> int:
    """[B, H, Tq, Tk] arrays the math backend holds at once: the scores and the probabilities for a
    forward; with a backward also their gradients."""
    return 2 if prob.pass_name == "fwd" else 4


def sdpa_math_bytes(prob: Problem) -> int:
    """What the math backend materialises, counted in float32 (it computes 16-bit inputs in float32
    unless torch is told otherwise): ``sdpa_math_copies`` arrays of [B, H, Tq, Tk]."""
    return sdpa_math_copies(prob) * prob.B * prob.H * prob.q_len * prob.T * 4


def _sdpa_mask(mask: Mask | None, T: int, dtype, device, masked_value: float):
    """Additive [T, T] mask in the inputs' dtype (0 allowed, ``masked_value`` blocked), rows
    padded to 8 elements; all zeros when ``mask`` is None. It is what SDPA would turn a
    boolean mask into on every call, built once here."""
    import torch

    m = torch.zeros((T, _padded(T)), dtype=dtype, device=device)[:, :T]
    if mask is not None:
        j = torch.arange(T, device=device)
        for r0, r1 in row_chunks(T, max(1, (32 << 20) // T)):
            i = torch.arange(r0, r1, device=device)
            m[r0:r1].masked_fill_(~mask.allowed(i[:, None], j[None, :]), masked_value)
    return m


def serving_allowed(prob: Problem, device, b0: int = 0, b1: int | None = None):
    """The predicate of a decode or ragged batch as a torch bool tensor [b1 - b0, 1, Tq, Tk]:
    query t of sequence b at its absolute position Tk_b - Tq + t, keys past Tk_b excluded (one
    sequence, [1, 1, Tq, Tk], when the batch is not ragged: every sequence alike)."""
    import torch

    from ..serving import query_offsets

    offs = query_offsets(prob)
    lens = prob.lens
    b1 = (prob.B if prob.cache_lens is not None else 1) if b1 is None else b1
    j = torch.arange(prob.T, device=device)
    t = torch.arange(prob.q_len, device=device)
    rows = [prob.mask.allowed((t + int(offs[b]))[:, None], j[None, :]) & (j < lens[b])[None, :]
            for b in range(b0, b1)]
    return torch.stack(rows)[:, None]


def _probe_T(T: int) -> int:
    # the real T when small, else one of the same residue modulo 64
    return T if T <= 1024 else 1024 + T % 64


def _no_kernel(backend: str, caught, err) -> str:
    notes = " ".join(" ".join(str(w.message).split()) for w in caught) or " ".join(str(err).split())
    if len(notes) > 400:
        notes = notes[:400] + "..."
    return f"the {backend} backend takes no such input: {notes}"


@functools.lru_cache(maxsize=None)
def _sdpa_probe(backend: str, dtype: str, D: int, T: int, mode: str, masked_value: float,
                device: int, group: int = 1, Tq: int | None = None, backward: bool = False) -> str | None:
    """Run the pinned backend once on a small problem of the same kind (``backward``: its
    gradients too); None if it runs, else the backend's own reasons (torch warns them before
    refusing)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dev = torch.device("cuda", device)
    tdt = getattr(torch, dtype)
    Tq = T if Tq is None else Tq
    q = torch.randn(1, group, Tq, D, dtype=tdt, device=dev, requires_grad=backward)
    k, v = (torch.randn(1, 1, T, D, dtype=tdt, device=dev, requires_grad=backward) for _ in range(2))
    am = _sdpa_mask(None, T, tdt, dev, masked_value)[:Tq] if mode == "mask" else None
    gqa = {"enable_gqa": True} if group > 1 else {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with sdpa_kernel(getattr(SDPBackend, backend)), torch.set_grad_enabled(backward):
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=am, is_causal=mode == "causal", **gqa)
                if backward:
                    torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
            torch.cuda.synchronize(dev)
        except RuntimeError as e:
            return _no_kernel(backend, caught, e)
    return None


class _SdpaRunner(TorchRunner):
    def __init__(self, impl: "SdpaImpl", prob: Problem, q, k, v, do=None):
        super().__init__(prob, q, k, v, do)
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        self.sdpa, self.sdpa_kernel = F.scaled_dot_product_attention, sdpa_kernel
        self.backend = getattr(SDPBackend, impl.backend)
        mode = _sdpa_mode(prob)
        self.causal = mode == "causal"
        self.gqa = {"enable_gqa": True} if prob.kv_heads != prob.H else {}
        self.attn_mask = None
        if mode == "mask":
            with timed(self.setup, "mask_build_s"), torch.cuda.stream(self.stream()):
                if prob.prefill:
                    self.attn_mask = _sdpa_mask(prob.mask, prob.T, self.q.dtype, self.device, impl.masked_value)
                else:  # [B or 1, 1, Tq, Tk], additive in the inputs' dtype, rows padded as above
                    allowed = serving_allowed(prob, self.device)
                    m = torch.zeros(allowed.shape[:-1] + (_padded(prob.T),), dtype=self.q.dtype,
                                    device=self.device)[..., :prob.T]
                    self.attn_mask = m.masked_fill_(~allowed, impl.masked_value)
                sync()
        # first call (cuDNN builds its execution plans here), kept out of the timings; the backward
        # alone first records the forward it goes back through
        t0 = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                if self.pass_name == "bwd":
                    self.save_forward()
                self.run()
            except RuntimeError as e:
                if "No available kernel" not in str(e):
                    raise
                raise BadInput(f"{impl.name} cannot run {prob.mask.label()} at T={prob.T}: "
                               f"{_no_kernel(impl.backend, caught, e)}") from e
        sync()
        self.setup["first_call_s"] = time.perf_counter() - t0

    def _call(self):
        with self.sdpa_kernel(self.backend):
            return self.sdpa(self.q, self.k, self.v, attn_mask=self.attn_mask, is_causal=self.causal,
                             scale=self.prob.softmax_scale, **self.gqa)

    def _pinned(self):
        return self.sdpa_kernel(self.backend)


@dataclass(eq=False)
class SdpaImpl(TorchImpl):
    backend: str = ""              # SDPBackend member
    takes_mask: bool = True
    masked_value: float = -math.inf
    materializes: bool = False     # the backend computes the [B, H, Tq, Tk] scores unfused (MATH)
    passes = PASSES  # the backward through autograd, the backend pinned for it too
    gqa = True     # enable_gqa
    decode = True  # an attn_mask at the queries' absolute positions (dense, one query: none)
    ragged = True  # keys past each sequence's cache masked

    def availability(self) -> str | None:
        why = torch_reason()
        if why:
            return why
        from torch.nn.attention import SDPBackend

        if not hasattr(SDPBackend, self.backend):
            import torch

            return f"torch {torch.__version__} has no SDPBackend.{self.backend}"
        return None

    def unsupported(self, prob: Problem) -> str | None:
        why = super().unsupported(prob)
        if why:
            return why
        mode = _sdpa_mode(prob)
        if mode == "mask":
            if not self.takes_mask:
                return (f"{self.name}: the {self.backend} backend takes no attn_mask, which "
                        f"{prob.mask.label()} needs here (it runs every key, or dense causal prefill)")
            nbytes = sdpa_mask_bytes(prob.T, prob.dtype) if prob.prefill else _serving_mask_bytes(prob)
            if nbytes > SDPA_MASK_BYTES:
                return (f"{self.name}: the attn_mask of {prob.mask.label()} at T={prob.T} would take "
                        f"{nbytes / 2**30:.1f} GiB, above the {SDPA_MASK_BYTES >> 30} GiB limit on a built mask")
        if self.materializes:
            nbytes = sdpa_math_bytes(prob)
            if nbytes > SDPA_MATH_BYTES:
                return (f"{self.name}: the {self.backend} backend materialises the scores: {sdpa_math_copies(prob)} "
                        f"float32 [B, H, Tq, Tk] = [{prob.B}, {prob.H}, {prob.q_len}, {prob.T}] arrays would take "
                        f"{nbytes / 2**30:.1f} GiB, above its {SDPA_MATH_BYTES >> 30} GiB limit")
        if self.availability() is not None:
            return None  # the machine, not the problem: availability says why
        import cupy

        Tq = None if prob.prefill else min(prob.q_len, _probe_T(prob.T))
        return _sdpa_probe(self.backend, prob.dtype, prob.D, _probe_T(prob.T), mode, self.masked_value,
                           cupy.cuda.Device().id, prob.H // prob.kv_heads, Tq, prob.pass_name != "fwd")

    def build(self, prob: Problem, q, k, v, do=None) -> Runner:
        return _SdpaRunner(self, prob, q, k, v, do)


_SDPA_COMMON = ("torch.nn.functional.scaled_dot_product_attention pinned with sdpa_kernel(SDPBackend.{b}); "
                "dense causal through is_causal=True, dense non-causal plain; the backward through "
                "torch.autograd.grad (bwd: of a forward recorded in prepare, its graph retained), the backend "
                "pinned for it too")
_SDPA_MASKED = ("; other patterns through an additive [T, T] attn_mask in the inputs' dtype ({v} where blocked: "
                "what SDPA makes of a boolean mask on every call) built once in prepare, refused above "
                f"{SDPA_MASK_BYTES >> 30} GiB")

SDPA_FLASH = register(SdpaImpl(
    "sdpa-flash", "peer", _SDPA_COMMON.format(b="FLASH_ATTENTION") + "; no attn_mask (other patterns are refused)",
    ("bfloat16", "float16"), backend="FLASH_ATTENTION", takes_mask=False))
SDPA_CUDNN = register(SdpaImpl(
    "sdpa-cudnn", "peer", _SDPA_COMMON.format(b="CUDNN_ATTENTION") + _SDPA_MASKED.format(v="-65504"),
    ("bfloat16", "float16"), backend="CUDNN_ATTENTION", masked_value=-65504.0))
SDPA_EFFICIENT = register(SdpaImpl(
    "sdpa-efficient", "peer", _SDPA_COMMON.format(b="EFFICIENT_ATTENTION") + _SDPA_MASKED.format(v="-inf"),
    ALL_DTYPES, backend="EFFICIENT_ATTENTION"))
SDPA_MATH = register(SdpaImpl(
    "sdpa-math", "peer", _SDPA_COMMON.format(b="MATH") + _SDPA_MASKED.format(v="-inf")
    + "; unfused: the scores and probabilities are materialised ([B, H, Tq, Tk], float32 for 16-bit inputs, "
    f"grouped heads through enable_gqa's repeat of K and V), refused above {SDPA_MATH_BYTES >> 30} GiB of them "
    "(two arrays for the forward, four with a backward)",
    ALL_DTYPES, backend="MATH", materializes=True))
