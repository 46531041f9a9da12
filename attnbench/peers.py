"""Peer baselines, timed under the same protocol and correctness gate as attnbench's kernels.

* ``cublas``: the attention a user writes with CuPy alone: S = Q K^T through cuBLAS, the
  pattern's dense mask, a max-subtracted softmax, O = P V, chunked over queries.
* ``sdpa-flash``, ``sdpa-cudnn``, ``sdpa-efficient``: ``torch.nn.functional.
  scaled_dot_product_attention`` pinned to one backend each.
* ``flex``: FlexAttention under ``torch.compile``, its mask_mod the pattern's own predicate
  (``Mask.mask_mod``), at the better of block 64 and 128 (SPEC section 6).

torch is optional and imported lazily: without it the torch peers stay registered and
``availability`` says why they cannot run. Inputs and outputs cross between CuPy and torch
through DLPack without copies, and torch runs on CuPy's current stream.
"""
from __future__ import annotations

import functools
import importlib.util
import math
import time
import warnings
from dataclasses import dataclass

import numpy as np

from .arrays import STORAGE, Bound, poison, unbind
from .errors import BadInput
from .impls import DTYPES, ITEMSIZE, Impl, Problem, Runner, device_problem, register, timed
from .patterns import Mask
from .serving import one_predicate

SCRATCH_BYTES = 256 << 20     # cublas: scores and probabilities of one chunk of query rows
MASK_CACHE_BYTES = 1 << 30    # cublas: the uploaded mask is kept between runs up to T*T this size
SDPA_MASK_BYTES = 4 << 30     # sdpa: largest T x T attn_mask built
FLEX_BLOCKS = (64, 128)
# From this T on the BlockMask is built by a compiled create_block_mask (what its _compile=True
# does): the eager build materialises the T x T mask and its int64 index arithmetic (over 10 GB
# at T = 32768, 128 GiB of mask alone at T = 131072).
FLEX_COMPILED_MASK_FROM = 32768
TORCH_MISSING = "torch is not installed (pip install -e '.[torch]')"
ALL_DTYPES = DTYPES


# -- shared helpers ---------------------------------------------------------------------------
def _torch_reason(flex: bool = False) -> str | None:
    try:
        import torch
    except ImportError:
        return TORCH_MISSING
    why = device_problem()
    if why:
        return why
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False: a CPU-only torch build?)"
    if flex:
        try:
            import torch.nn.attention.flex_attention  # noqa: F401
        except ImportError as e:
            return f"torch {torch.__version__} has no FlexAttention ({e}): it needs torch >= 2.5"
        if importlib.util.find_spec("triton") is None:
            return "triton is not installed (torch.compile needs it for FlexAttention)"
    return None


def _row_chunks(T: int, rows: int):
    for r0 in range(0, T, rows):
        yield r0, min(T, r0 + rows)


def _as_torch(a, dtype: str):
    """A CuPy storage array as a torch tensor of the real dtype, sharing memory."""
    return unbind(a, Bound(a, dtype, "torch"))


def _as_cupy(t, dtype: str):
    """A torch tensor (any strides) as a CuPy storage array, sharing memory."""
    import cupy
    import torch

    if dtype == "bfloat16":
        return cupy.from_dlpack(t.view(torch.int16)).view(cupy.uint16)
    return cupy.from_dlpack(t)


def _sync() -> None:
    import cupy

    cupy.cuda.get_current_stream().synchronize()


def _time_ms(fn, warmup: int = 2, reps: int = 10) -> float:
    """Mean milliseconds of ``fn`` on the current stream (a quick pick, not a benchmark)."""
    import cupy

    for _ in range(warmup):
        fn()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return cupy.cuda.get_elapsed_time(start, end) / reps


# -- cublas ------------------------------------------------------------------------------------
_CUDA_TYPE = {"float32": "CUDA_R_32F", "float16": "CUDA_R_16F", "bfloat16": "CUDA_R_16BF"}
_OP_N, _OP_T = 0, 1
_COMPUTE_32F, _COMPUTE_32F_PEDANTIC = 68, 69  # cublasComputeType_t
_GEMM_DEFAULT = -1
_ONE = np.array(1.0, np.float32)
_ZERO = np.array(0.0, np.float32)


@functools.lru_cache(maxsize=None)
def _kernels():
    import cupy

    # -inf by its bits: NVRTC here defines no INFINITY
    block = cupy.ElementwiseKernel("bool blocked", "float32 s", "if (blocked) s = __int_as_float(0xff800000);",
                                   "attnbench_peer_block")
    to_bf16 = cupy.ElementwiseKernel(
        "float32 x", "uint16 y",
        "unsigned int u = __float_as_uint(x); y = (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);",
        "attnbench_peer_to_bf16")
    return block, to_bf16


def cublas_rows(B: int, H: int, T: int, dtype: str) -> int:
    """Query rows per chunk: the float32 scores and the storage-dtype probabilities of all
    B*H heads for these rows take at most SCRATCH_BYTES (one row at the least)."""
    per_row = B * H * T * (4 + (0 if dtype == "float32" else ITEMSIZE[dtype]))
    rows = max(1, min(T, SCRATCH_BYTES // per_row))
    if 64 <= rows < T:
        rows -= rows % 64
    return rows


class _CublasRunner(Runner):
    def __init__(self, prob: Problem, q, k, v):
        import cupy
        from cupy_backends.cuda.api import runtime

        self.prob, self.q, self.k, self.v = prob, q, k, v
        B, H, T, D = prob.shape
        self.bh = B * H
        self.o = cupy.empty_like(q)
        self.ctype = getattr(runtime, _CUDA_TYPE[prob.dtype])
        self.f32 = runtime.CUDA_R_32F
        self.isz = ITEMSIZE[prob.dtype]
        # float32 without TF32 whatever the handle's math mode; tensor cores with float32
        # accumulation for the 16-bit dtypes
        self.compute = _COMPUTE_32F_PEDANTIC if prob.dtype == "float32" else _COMPUTE_32F
        self.rows = cublas_rows(B, H, T, prob.dtype)
        self.chunks = list(_row_chunks(T, self.rows))
        self.s = cupy.empty((self.bh, self.rows, T), np.float32)
        self.p = self.s if prob.dtype == "float32" else cupy.empty((self.bh, self.rows, T), STORAGE[prob.dtype])
        self.scale = np.array(prob.softmax_scale, np.float32)
        self.setup = {}
        self.full = prob.mask.pairs == T * T  # every key allowed: no mask at all
        self.masks = None
        if not self.full and T * T <= MASK_CACHE_BYTES:
            with timed(self.setup, "mask_build_s"):
                self.masks = [self._blocked(r0, r1) for r0, r1 in self.chunks]
                _sync()

    def _blocked(self, r0, r1):
        """Blocked keys of rows [r0, r1) on the device; None when every key is allowed."""
        import cupy

        b = ~self.prob.mask.dense(np.arange(r0, r1))
        return cupy.asarray(b) if b.any() else None

    def _gemm(self, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, c, ctype, ldc, sc):
        import cupy
        from cupy_backends.cuda.libs import cublas

        cublas.gemmStridedBatchedEx(
            cupy.cuda.device.get_cublas_handle(), ta, tb, m, n, k, alpha.ctypes.data,
            a, self.ctype, lda, sa, b, self.ctype, ldb, sb, _ZERO.ctypes.data,
            c, ctype, ldc, sc, self.bh, self.compute, _GEMM_DEFAULT)

    def run(self) -> None:
        import cupy

        block, to_bf16 = _kernels()
        T, D, rows, isz = self.prob.T, self.prob.D, self.rows, self.isz
        for c, (r0, r1) in enumerate(self.chunks):
            n = r1 - r0
            s = self.s[:, :n]
            # row-major S[n, T] = scale * Q[r0:r1] K^T is column-major S^T = K Q^T
            self._gemm(_OP_T, _OP_N, T, n, D, self.scale,
                       self.k.data.ptr, D, T * D, self.q.data.ptr + r0 * D * isz, D, T * D,
                       s.data.ptr, self.f32, T, rows * T)
            if not self.full:
                blocked = self.masks[c] if self.masks is not None else self._blocked(r0, r1)
                if blocked is not None:
                    block(blocked, s)
            s -= s.max(axis=-1, keepdims=True)
            cupy.exp(s, out=s)
            s /= s.sum(axis=-1, keepdims=True)
            p = self.p[:, :n]
            if self.prob.dtype == "bfloat16":
                to_bf16(s, p)
            elif self.prob.dtype == "float16":
                cupy.copyto(p, s)
            # row-major O[r0:r1] = P V is column-major O^T = V^T P^T, written in storage dtype
            self._gemm(_OP_N, _OP_N, D, n, T, _ONE,
                       self.v.data.ptr, D, T * D, p.data.ptr, T, rows * T,
                       self.o.data.ptr + r0 * D * isz, self.ctype, D, T * D)

    @property
    def out(self):
        return self.o

    def poison(self) -> None:
        poison(self.o)


@dataclass(eq=False)
class CublasImpl(Impl):
    def availability(self) -> str | None:
        why = device_problem()
        if why:
            return why
        try:
            from cupy_backends.cuda.libs import cublas  # noqa: F401
        except ImportError as e:
            return f"cuBLAS cannot be loaded ({str(e).splitlines()[0]})"
        return None

    def unsupported(self, prob: Problem) -> str | None:
        why = super().unsupported(prob)
        if why:
            return why
        T = prob.T
        if prob.mask.pairs != T * T and T * T > MASK_CACHE_BYTES:
            return (f"cublas keeps the [T, T] mask on the device up to T*T = {MASK_CACHE_BYTES >> 20} MiB; "
                    f"T={T} needs {T * T >> 20} MiB, and rebuilding it on the host every run would time the host")
        return None

    def build(self, prob: Problem, q, k, v) -> Runner:
        return _CublasRunner(prob, q, k, v)


# -- torch peers: common runner ---------------------------------------------------------------
class _TorchRunner(Runner):
    """q, k, v seen as torch tensors; each run on CuPy's current stream, without autograd.

    torch allocates a fresh output per call, so ``poison`` fills the previous output with NaN
    and lets it go: the caching allocator hands that block to the next output of the same size
    on the same stream, which is then poisoned (best effort: it cannot be forced)."""

    def __init__(self, prob: Problem, q, k, v):
        import torch

        self.torch = torch
        self.prob = prob
        self.device = torch.device("cuda", q.device.id)
        self._streams = {}
        self._out = None
        self.setup = {}
        with torch.cuda.stream(self.stream()):
            self.q, self.k, self.v = (_as_torch(a, prob.dtype) for a in (q, k, v))

    def stream(self):
        import cupy

        ptr = cupy.cuda.get_current_stream().ptr
        s = self._streams.get(ptr)
        if s is None:
            cuda = self.torch.cuda
            s = cuda.default_stream(self.device) if ptr == 0 else cuda.ExternalStream(ptr, device=self.device)
            self._streams[ptr] = s
        return s

    def _call(self):
        raise NotImplementedError

    def run(self) -> None:
        torch = self.torch
        with torch.cuda.stream(self.stream()), torch.no_grad():
            self._out = self._call()

    @property
    def out(self):
        return _as_cupy(self._out, self.prob.dtype)

    def poison(self) -> None:
        if self._out is not None:
            poison(self.out)
            self._out = None


# -- sdpa ---------------------------------------------------------------------------------------
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


def _sdpa_mask(mask: Mask | None, T: int, dtype, device, masked_value: float):
    """Additive [T, T] mask in the inputs' dtype (0 allowed, ``masked_value`` blocked), rows
    padded to 8 elements; all zeros when ``mask`` is None. It is what SDPA would turn a
    boolean mask into on every call, built once here."""
    import torch

    m = torch.zeros((T, _padded(T)), dtype=dtype, device=device)[:, :T]
    if mask is not None:
        j = torch.arange(T, device=device)
        for r0, r1 in _row_chunks(T, max(1, (32 << 20) // T)):
            i = torch.arange(r0, r1, device=device)
            m[r0:r1].masked_fill_(~mask.allowed(i[:, None], j[None, :]), masked_value)
    return m


def serving_allowed(prob: Problem, device, b0: int = 0, b1: int | None = None):
    """The predicate of a decode or ragged batch as a torch bool tensor [b1 - b0, 1, Tq, Tk]:
    query t of sequence b at its absolute position Tk_b - Tq + t, keys past Tk_b excluded (one
    sequence, [1, 1, Tq, Tk], when the batch is not ragged: every sequence alike)."""
    import torch

    from .serving import query_offsets

    offs = query_offsets(prob)
    lens = prob.lens
    b1 = (prob.B if prob.cache_lens is not None else 1) if b1 is None else b1
    j = torch.arange(prob.T, device=device)
    t = torch.arange(prob.q_len, device=device)
    rows = [prob.mask.allowed((t + int(offs[b]))[:, None], j[None, :]) & (j < lens[b])[None, :]
            for b in range(b0, b1)]
    return torch.stack(rows)[:, None]


def serving_mask_mod(prob: Problem, device):
    """FlexAttention's mask_mod of a decode or ragged batch: the pattern's predicate at each
    query's absolute position (q_idx + Tk_b - Tq), keys past Tk_b excluded."""
    import torch

    from .serving import query_offsets

    allowed = prob.mask.mask_mod(device)  # places a table on the device now
    if prob.cache_lens is None:
        off = prob.T - prob.q_len

        def mask_mod(b, h, q_idx, kv_idx):
            return allowed(b, h, q_idx + off, kv_idx)
        return mask_mod
    offs = torch.as_tensor(query_offsets(prob), device=device)
    lens = torch.as_tensor(np.asarray(prob.lens, np.int64), device=device)

    def ragged_mask_mod(b, h, q_idx, kv_idx):
        return allowed(b, h, q_idx + offs[b], kv_idx) & (kv_idx < lens[b])
    return ragged_mask_mod


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
                device: int, group: int = 1, Tq: int | None = None) -> str | None:
    """Run the pinned backend once on a small problem of the same kind; None if it runs,
    else the backend's own reasons (torch warns them before refusing)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dev = torch.device("cuda", device)
    tdt = getattr(torch, dtype)
    Tq = T if Tq is None else Tq
    q = torch.randn(1, group, Tq, D, dtype=tdt, device=dev)
    k, v = (torch.randn(1, 1, T, D, dtype=tdt, device=dev) for _ in range(2))
    am = _sdpa_mask(None, T, tdt, dev, masked_value)[:Tq] if mode == "mask" else None
    gqa = {"enable_gqa": True} if group > 1 else {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with sdpa_kernel(getattr(SDPBackend, backend)), torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, attn_mask=am, is_causal=mode == "causal", **gqa)
            torch.cuda.synchronize(dev)
        except RuntimeError as e:
            return _no_kernel(backend, caught, e)
    return None


class _SdpaRunner(_TorchRunner):
    def __init__(self, impl: "SdpaImpl", prob: Problem, q, k, v):
        super().__init__(prob, q, k, v)
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
                _sync()
        # first call (cuDNN builds its execution plan here), kept out of the timings
        t0 = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                self.run()
            except RuntimeError as e:
                if "No available kernel" not in str(e):
                    raise
                raise BadInput(f"{impl.name} cannot run {prob.mask.label()} at T={prob.T}: "
                               f"{_no_kernel(impl.backend, caught, e)}") from e
        _sync()
        self.setup["first_call_s"] = time.perf_counter() - t0

    def _call(self):
        with self.sdpa_kernel(self.backend):
            return self.sdpa(self.q, self.k, self.v, attn_mask=self.attn_mask, is_causal=self.causal,
                             scale=self.prob.softmax_scale, **self.gqa)


@dataclass(eq=False)
class SdpaImpl(Impl):
    backend: str = ""              # SDPBackend member
    takes_mask: bool = True
    masked_value: float = -math.inf
    gqa = True     # enable_gqa
    decode = True  # an attn_mask at the queries' absolute positions (dense, one query: none)
    ragged = True  # keys past each sequence's cache masked

    def availability(self) -> str | None:
        why = _torch_reason()
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
        why = one_predicate(prob)
        if why:
            return f"{self.name}: {why}"
        mode = _sdpa_mode(prob)
        if mode == "mask":
            if not self.takes_mask:
                return (f"{self.name}: the {self.backend} backend takes no attn_mask, which "
                        f"{prob.mask.label()} needs here (it runs every key, or dense causal prefill)")
            nbytes = sdpa_mask_bytes(prob.T, prob.dtype) if prob.prefill else _serving_mask_bytes(prob)
            if nbytes > SDPA_MASK_BYTES:
                return (f"{self.name}: the attn_mask of {prob.mask.label()} at T={prob.T} would take "
                        f"{nbytes / 2**30:.1f} GiB, above the {SDPA_MASK_BYTES >> 30} GiB limit on a built mask")
        if self.availability() is not None:
            return None  # the machine, not the problem: availability says why
        import cupy

        Tq = None if prob.prefill else min(prob.q_len, _probe_T(prob.T))
        return _sdpa_probe(self.backend, prob.dtype, prob.D, _probe_T(prob.T), mode, self.masked_value,
                           cupy.cuda.Device().id, prob.H // prob.kv_heads, Tq)

    def build(self, prob: Problem, q, k, v) -> Runner:
        return _SdpaRunner(self, prob, q, k, v)


# -- flex ---------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _flex():
    """(compiled flex_attention, create_block_mask, compiled create_block_mask).

    Every configuration brings its own mask_mod, so torch.compile recompiles for each; past
    its recompile limit it would silently run FlexAttention eagerly (unfused), so the limits
    are raised. Shapes are static, as a user with one model would compile them."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    cfg = torch._dynamo.config
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, floor in (("recompile_limit", 4096), ("cache_size_limit", 4096),
                            ("accumulated_recompile_limit", 65536), ("accumulated_cache_size_limit", 65536)):
            if hasattr(cfg, name):
                setattr(cfg, name, max(getattr(cfg, name), floor))
    return torch.compile(flex_attention, dynamic=False), create_block_mask, torch.compile(create_block_mask)


def flex_kernel_options(bs: int):
    return {"BLOCK_M": bs, "BLOCK_N": bs} if bs == 64 else None


class _FlexRunner(_TorchRunner):
    def __init__(self, prob: Problem, q, k, v, blocks=FLEX_BLOCKS):
        super().__init__(prob, q, k, v)
        self.fn, eager_build, compiled_build = _flex()
        T, Tq = prob.T, prob.q_len
        build = compiled_build if T >= FLEX_COMPILED_MASK_FROM else eager_build
        mask_mod = prob.mask.mask_mod(self.device) if prob.prefill else serving_mask_mod(prob, self.device)
        B = prob.B if prob.cache_lens is not None else None  # a ragged batch: a block mask per sequence
        self.gqa = {"enable_gqa": True} if prob.kv_heads != prob.H else {}
        t_select = time.perf_counter()
        best = None
        with self.torch.cuda.stream(self.stream()):
            for bs in blocks:
                self.opts = flex_kernel_options(bs)
                t0 = time.perf_counter()
                self.block_mask = build(mask_mod, B, None, Tq, T, device=self.device, BLOCK_SIZE=bs)
                self.run()
                _sync()
                first = time.perf_counter() - t0
                t0 = time.perf_counter()
                self.block_mask = build(mask_mod, B, None, Tq, T, device=self.device, BLOCK_SIZE=bs)
                _sync()
                rebuild = time.perf_counter() - t0
                ms = _time_ms(self.run)
                if best is None or ms < best[0]:
                    best = (ms, bs, self.block_mask, self.opts, first, rebuild)
        _, bs, self.block_mask, self.opts, first, rebuild = best
        self.setup.update(compile_s=first, block_mask_build_s=rebuild, flex_block=bs,
                          block_select_s=time.perf_counter() - t_select)

    def _call(self):
        return self.fn(self.q, self.k, self.v, block_mask=self.block_mask, scale=self.prob.softmax_scale,
                       kernel_options=self.opts, **self.gqa)


@dataclass(eq=False)
class FlexImpl(Impl):
    blocks: tuple = FLEX_BLOCKS  # block sizes tried in prepare; the fastest is kept
    gqa = True     # enable_gqa
    decode = True  # the pattern's mask_mod at the queries' absolute positions
    ragged = True  # a block mask per sequence, keys past its cache excluded

    def availability(self) -> str | None:
        return _torch_reason(flex=True)

    def unsupported(self, prob: Problem) -> str | None:
        why = super().unsupported(prob)
        if why:
            return why
        why = one_predicate(prob)
        if why:
            return f"{self.name}: {why}"
        D = prob.D
        if D < 16 or D & (D - 1):
            return f"{self.name}: head dim D={D} is not a power of two >= 16, which FlexAttention needs"
        return None

    def build(self, prob: Problem, q, k, v) -> Runner:
        return _FlexRunner(prob, q, k, v, self.blocks)


# -- the registry ------------------------------------------------------------------------------
_SDPA_COMMON = ("torch.nn.functional.scaled_dot_product_attention pinned with sdpa_kernel(SDPBackend.{b}); "
                "dense causal through is_causal=True, dense non-causal plain")
_SDPA_MASKED = ("; other patterns through an additive [T, T] attn_mask in the inputs' dtype ({v} where blocked: "
                "what SDPA makes of a boolean mask on every call) built once in prepare, refused above "
                f"{SDPA_MASK_BYTES >> 30} GiB")

CUBLAS = register(CublasImpl(
    "cublas", "peer",
    "CuPy + cuBLAS written by hand: S = scale * Q K^T for a chunk of query rows over all T keys "
    "(cublasGemmStridedBatchedEx, float32 out), the pattern's dense mask (Mask.dense, uploaded once in "
    f"prepare; masked patterns up to T*T = {MASK_CACHE_BYTES >> 20} MiB), "
    "max-subtracted softmax in float32, P rounded to the storage dtype, O = P V accumulated in float32 "
    f"and written in the storage dtype; bfloat16 natively (CUDA_R_16BF); chunks of at most "
    f"{SCRATCH_BYTES >> 20} MiB of scratch",
    ALL_DTYPES))
SDPA_FLASH = register(SdpaImpl(
    "sdpa-flash", "peer", _SDPA_COMMON.format(b="FLASH_ATTENTION") + "; no attn_mask (other patterns are refused)",
    ("bfloat16", "float16"), backend="FLASH_ATTENTION", takes_mask=False))
SDPA_CUDNN = register(SdpaImpl(
    "sdpa-cudnn", "peer", _SDPA_COMMON.format(b="CUDNN_ATTENTION") + _SDPA_MASKED.format(v="-65504"),
    ("bfloat16", "float16"), backend="CUDNN_ATTENTION", masked_value=-65504.0))
SDPA_EFFICIENT = register(SdpaImpl(
    "sdpa-efficient", "peer", _SDPA_COMMON.format(b="EFFICIENT_ATTENTION") + _SDPA_MASKED.format(v="-inf"),
    ALL_DTYPES, backend="EFFICIENT_ATTENTION"))
FLEX = register(FlexImpl(
    "flex", "peer",
    "torch.nn.attention.flex_attention under torch.compile (static shapes), mask_mod = the pattern's own "
    "predicate (Mask.mask_mod), BlockMask built once per configuration (create_block_mask compiled from "
    f"T = {FLEX_COMPILED_MASK_FROM}), at the faster of block 64 (kernel BLOCK_M = BLOCK_N = 64) and 128 "
    "by a short timing in prepare",
    ALL_DTYPES))

__all__ = ["CUBLAS", "SDPA_FLASH", "SDPA_CUDNN", "SDPA_EFFICIENT", "FLEX", "CublasImpl", "SdpaImpl",
           "FlexImpl", "cublas_rows", "sdpa_mask_bytes", "flex_kernel_options"]
