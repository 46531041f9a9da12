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
``torch.autograd.grad`` (``_TorchRunner``), Flex at the fastest of ``FLEX_BWD_SETTINGS`` that
compiles. Serving shapes stay forward-only (``Problem`` refuses a backward there).

torch is optional and imported lazily: without it the torch peers stay registered and
``availability`` says why they cannot run. Inputs and outputs cross between CuPy and torch
through DLPack without copies, and torch runs on CuPy's current stream.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import math
import time
import warnings
from dataclasses import dataclass

import numpy as np

from .arrays import STORAGE, Bound, poison, to_float32, unbind
from .errors import BadInput
from .impls import DTYPES, ITEMSIZE, PASSES, Impl, Problem, Runner, device_problem, register, timed
from .patterns import Mask
from .serving import one_predicate

SCRATCH_BYTES = 256 << 20     # cublas: scores and probabilities of one chunk of query rows
MASK_CACHE_BYTES = 1 << 30    # cublas: the uploaded mask is kept between runs up to T*T this size
SDPA_MASK_BYTES = 4 << 30     # sdpa: largest T x T attn_mask built
SDPA_MATH_BYTES = 4 << 30     # sdpa-math: largest float32 [B, H, Tq, Tk] scores and probabilities it materialises
FLEX_BLOCKS = (64, 128)
REBUILDS = 5  # warm create_block_mask calls after the first: their median is block_mask_build_s
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


@functools.lru_cache(maxsize=None)
def _selection_timer():
    from .timing import EventTimer

    return EventTimer()


def _time_ms(fn, warmup: int = 2, reps: int = 5) -> float:
    """Median milliseconds of ``fn`` under the rows' own protocol (``timing.EventTimer``: the L2
    flushed, the host's path behind a hold), so a setting is chosen by the time its row shows and
    not by how fast the host issues it back to back."""
    for _ in range(warmup):
        fn()
    timer = _selection_timer()
    return float(np.median([timer.sample(fn) for _ in range(reps)]))


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


def cublas_rows(B: int, H: int, T: int, dtype: str, backward: bool = False) -> int:
    """Query rows per chunk: the float32 scores and the storage-dtype probabilities of all
    B*H heads for these rows (a backward pass: and the float32 dP beside them) take at most
    SCRATCH_BYTES (one row at the least)."""
    per_row = B * H * T * (4 + (0 if dtype == "float32" else ITEMSIZE[dtype]) + (4 if backward else 0))
    rows = max(1, min(T, SCRATCH_BYTES // per_row))
    if 64 <= rows < T:
        rows -= rows % 64
    return rows


class _CublasRunner(Runner):
    """The forward chunked over query rows; for a backward pass the forward also keeps each row's
    log-sum-exp, and the backward goes over the same chunks again: S recomputed, P = exp(S - lse),
    dV += P^T dO, dP = dO V^T, dS = P (dP - delta), dQ = scale dS K, dK += scale dS^T Q, with
    delta = rowsum(dO * O) (dK and dV accumulated in float32 over the chunks). ``xp`` is the inputs'
    array module (CuPy; numpy where the CPU tests stand in for cuBLAS)."""

    def __init__(self, prob: Problem, q, k, v, do=None):
        import cupy
        from cupy_backends.cuda.api import runtime

        self.xp = xp = cupy.get_array_module(q)
        self.prob, self.q, self.k, self.v = prob, q, k, v
        self.pass_name = prob.pass_name
        backward = prob.pass_name != "fwd"
        B, H, T, D = prob.shape
        self.bh = B * H
        self.o = xp.empty_like(q)
        self.ctype = getattr(runtime, _CUDA_TYPE[prob.dtype])
        self.f32 = runtime.CUDA_R_32F
        # float32 without TF32 whatever the handle's math mode; tensor cores with float32
        # accumulation for the 16-bit dtypes
        self.compute = _COMPUTE_32F_PEDANTIC if prob.dtype == "float32" else _COMPUTE_32F
        self.rows = cublas_rows(B, H, T, prob.dtype, backward)
        self.chunks = list(_row_chunks(T, self.rows))
        self.s = xp.empty((self.bh, self.rows, T), np.float32)
        self.p = self.s if prob.dtype == "float32" else xp.empty((self.bh, self.rows, T), STORAGE[prob.dtype])
        self.scale = np.array(prob.softmax_scale, np.float32)
        self.setup = {}
        self.full = prob.mask.pairs == T * T  # every key allowed: no mask at all
        self.masks = None
        if not self.full and T * T <= MASK_CACHE_BYTES:
            with timed(self.setup, "mask_build_s"):
                self.masks = [self._blocked(r0, r1) for r0, r1 in self.chunks]
                _sync()
        if backward:
            if do is None:
                raise ValueError(f"pass={prob.pass_name} needs do=, the output's gradient")
            self.do = do
            self.lse = xp.empty((self.bh, T), np.float32)
            self.dp = xp.empty((self.bh, self.rows, T), np.float32)
            # dS in the storage dtype shares P's buffer (P is done with by then); float32 keeps it in dP
            self.ds = self.dp if prob.dtype == "float32" else self.p
            self.dq = xp.empty_like(q)
            self.dk32, self.dv32 = (xp.empty(a.shape, np.float32) for a in (k, v))
            self.dk, self.dv = ((self.dk32, self.dv32) if prob.dtype == "float32"
                                else (xp.empty_like(k), xp.empty_like(v)))
            self._grads = (self.dq, self.dk, self.dv)
            if prob.pass_name == "bwd":  # the saved forward state: O and the row log-sum-exp
                with timed(self.setup, "forward_s"):
                    self._forward()
                    _sync()

    def _blocked(self, r0, r1):
        """Blocked keys of rows [r0, r1) on the device; None when every key is allowed."""
        b = ~self.prob.mask.dense(np.arange(r0, r1))
        return self.xp.asarray(b) if b.any() else None

    def _mask(self, c: int, r0: int, r1: int, s) -> None:
        """The blocked keys of chunk ``c`` (rows [r0, r1)) of the scores ``s`` to -inf."""
        if not self.full:
            blocked = self.masks[c] if self.masks is not None else self._blocked(r0, r1)
            if blocked is not None:
                _kernels()[0](blocked, s)

    def _round(self, src, dst) -> None:
        """float32 ``src`` rounded into ``dst``, of the 16-bit storage dtype."""
        if self.prob.dtype == "float32":  # every float32 destination is its source's own buffer
            return
        if self.prob.dtype == "bfloat16":
            _kernels()[1](src, dst)
        else:
            self.xp.copyto(dst, src)

    def _gemm(self, ta, tb, m, n, k, alpha, a, ao, lda, sa, b, bo, ldb, sb, c, co, ctype, ldc, sc, beta=None):
        """cublasGemmStridedBatchedEx over the B*H heads, column-major: C = alpha op(A) op(B) + beta C,
        the operands as (array, offset in elements); A and B in the storage dtype, C of ``ctype``."""
        import cupy
        from cupy_backends.cuda.libs import cublas

        beta = _ZERO if beta is None else beta
        cublas.gemmStridedBatchedEx(
            cupy.cuda.device.get_cublas_handle(), ta, tb, m, n, k, alpha.ctypes.data,
            a.data.ptr + ao * a.itemsize, self.ctype, lda, sa, b.data.ptr + bo * b.itemsize, self.ctype, ldb, sb,
            beta.ctypes.data, c.data.ptr + co * c.itemsize, ctype, ldc, sc, self.bh, self.compute, _GEMM_DEFAULT)

    def _abt(self, c, a, r0: int, n: int, b, alpha) -> None:
        """Row-major c[:, :n] = alpha a[r0:r0+n] b^T in float32 (a, b: [T, D] per head; c: a chunk
        buffer [rows, T] per head), as column-major c^T = b a^T."""
        T, D = self.prob.T, self.prob.D
        self._gemm(_OP_T, _OP_N, T, n, D, alpha, b, 0, D, T * D, a, r0 * D, D, T * D, c, 0, self.f32, T,
                   self.rows * T)

    def _pb(self, c, co: int, ctype, p, n: int, b, alpha) -> None:
        """Row-major c[co/D : co/D + n] = alpha p[:, :n] b (p: a chunk buffer [rows, T], b and c:
        [T, D] per head), as column-major c^T = b^T p^T."""
        T, D = self.prob.T, self.prob.D
        self._gemm(_OP_N, _OP_N, D, n, T, alpha, b, 0, D, T * D, p, 0, T, self.rows * T, c, co, ctype, D, T * D)

    def _ptb(self, c, p, n: int, b, r0: int, alpha, beta) -> None:
        """Row-major float32 c = alpha p[:, :n]^T b[r0:r0+n] + beta c (c: [T, D] per head), as
        column-major c^T = b^T p."""
        T, D = self.prob.T, self.prob.D
        self._gemm(_OP_N, _OP_T, D, T, n, alpha, b, r0 * D, D, T * D, p, 0, T, self.rows * T, c, 0, self.f32, D,
                   T * D, beta)

    def _forward(self) -> None:
        xp = self.xp
        save = self.pass_name != "fwd"  # the row log-sum-exp, for the backward
        for c, (r0, r1) in enumerate(self.chunks):
            n = r1 - r0
            s = self.s[:, :n]
            # row-major S[n, T] = scale * Q[r0:r1] K^T is column-major S^T = K Q^T
            self._abt(self.s, self.q, r0, n, self.k, self.scale)
            self._mask(c, r0, r1, s)
            mx = s.max(axis=-1, keepdims=True)
            s -= mx
            xp.exp(s, out=s)
            tot = s.sum(axis=-1, keepdims=True)
            s /= tot
            if save:
                self.lse[:, r0:r1] = (mx + xp.log(tot))[..., 0]
            self._round(s, self.p[:, :n])
            # row-major O[r0:r1] = P V, written in storage dtype
            self._pb(self.o, r0 * self.prob.D, self.ctype, self.p, n, self.v, _ONE)

    def _backward(self) -> None:
        xp, dtype, T = self.xp, self.prob.dtype, self.prob.T
        delta = (to_float32(self.do, dtype) * to_float32(self.o, dtype)).sum(axis=-1).reshape(self.bh, T)
        for c, (r0, r1) in enumerate(self.chunks):
            n = r1 - r0
            beta = _ZERO if c == 0 else _ONE  # dK and dV: the first chunk writes, the others add
            s, dp = self.s[:, :n], self.dp[:, :n]
            self._abt(self.s, self.q, r0, n, self.k, self.scale)  # S again
            self._mask(c, r0, r1, s)
            s -= self.lse[:, r0:r1, None]
            xp.exp(s, out=s)  # P, float32
            self._round(s, self.p[:, :n])
            self._ptb(self.dv32, self.p, n, self.do, r0, _ONE, beta)  # dV += P^T dO
            self._abt(self.dp, self.do, r0, n, self.v, _ONE)  # dP = dO V^T
            dp -= delta[:, r0:r1, None]
            dp *= s  # dS = P (dP - delta), float32
            self._round(dp, self.ds[:, :n])
            self._pb(self.dq, r0 * self.prob.D, self.ctype, self.ds, n, self.k, self.scale)  # dQ = scale dS K
            self._ptb(self.dk32, self.ds, n, self.q, r0, self.scale, beta)  # dK += scale dS^T Q
        self._round(self.dk32, self.dk)
        self._round(self.dv32, self.dv)

    def run(self) -> None:
        if self.pass_name != "bwd":
            self._forward()
        if self.pass_name != "fwd":
            self._backward()

    @property
    def out(self):
        return self.o

    def poison(self) -> None:
        if self.pass_name != "bwd":  # the backward alone reads the forward's O: never poisoned
            poison(self.o)
        for g in self._grads or ():
            poison(g)


@dataclass(eq=False)
class CublasImpl(Impl):
    passes = PASSES  # the backward written with CuPy and cuBLAS as the forward is
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

    def build(self, prob: Problem, q, k, v, do=None) -> Runner:
        return _CublasRunner(prob, q, k, v, do)


# -- torch peers: common runner ---------------------------------------------------------------
class _TorchRunner(Runner):
    """q, k, v seen as torch tensors; each run on CuPy's current stream.

    A forward runs without autograd. A backward pass sees q, k, v as leaves that require grad
    (sharing the CuPy inputs' memory) and do as the output's gradient: ``bwd`` records the forward
    once (``save_forward``, in prepare: its graph holds the saved state, O and the row log-sum-exp)
    and each run is ``torch.autograd.grad`` through it with the graph retained; ``fwd+bwd`` runs the
    forward, then the gradient, every run. The gradients come back as CuPy storage arrays through
    DLPack, without copies.

    torch allocates a fresh output (and fresh gradients) per call, so ``poison`` fills the previous
    ones with NaN and lets them go: the caching allocator hands those blocks to the next ones of the
    same size on the same stream, which are then poisoned (best effort: it cannot be forced). The
    forward a ``bwd`` pass goes back through is never poisoned."""

    def __init__(self, prob: Problem, q, k, v, do=None):
        import torch

        self.torch = torch
        self.prob = prob
        self.pass_name = prob.pass_name
        self.device = torch.device("cuda", q.device.id)
        self._streams = {}
        self._out = None
        self._graph = None   # bwd: the recorded forward's output
        self._tgrads = None  # the last run's (dq, dk, dv), torch tensors
        self.setup = {}
        with torch.cuda.stream(self.stream()):
            self.q, self.k, self.v = (_as_torch(a, prob.dtype) for a in (q, k, v))
            if self.pass_name != "fwd":
                if do is None:
                    raise ValueError(f"pass={self.pass_name} needs do=, the output's gradient")
                self.q, self.k, self.v = (t.detach().requires_grad_() for t in (self.q, self.k, self.v))
                self.do = _as_torch(do, prob.dtype)

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

    def _pinned(self):
        """The context the backward runs in (SDPA: its backend pinned, as for the forward)."""
        return contextlib.nullcontext()

    def save_forward(self) -> None:
        """``bwd``: the forward, recorded by autograd; every run goes back through its graph."""
        torch = self.torch
        with torch.cuda.stream(self.stream()), torch.enable_grad():
            self._graph = self._call()
        self._out = self._graph.detach()

    def run(self) -> None:
        torch = self.torch
        with torch.cuda.stream(self.stream()):
            if self.pass_name == "fwd":
                with torch.no_grad():
                    self._out = self._call()
                return
            with torch.enable_grad():
                out = self._graph if self.pass_name == "bwd" else self._call()
                with self._pinned():
                    self._tgrads = torch.autograd.grad(out, (self.q, self.k, self.v), self.do,
                                                       retain_graph=self.pass_name == "bwd")
            if self.pass_name == "fwd+bwd":
                self._out = out.detach()

    @property
    def out(self):
        return _as_cupy(self._out, self.prob.dtype)

    @property
    def grads(self):
        if self._tgrads is None:
            return None
        return tuple(_as_cupy(g, self.prob.dtype) for g in self._tgrads)

    def poison(self) -> None:
        if self._out is not None and self.pass_name != "bwd":
            poison(self.out)
            self._out = None
        for g in self.grads or ():
            poison(g)
        self._tgrads = None


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


class _SdpaRunner(_TorchRunner):
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
                _sync()
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
        _sync()
        self.setup["first_call_s"] = time.perf_counter() - t0

    def _call(self):
        with self.sdpa_kernel(self.backend):
            return self.sdpa(self.q, self.k, self.v, attn_mask=self.attn_mask, is_causal=self.causal,
                             scale=self.prob.softmax_scale, **self.gqa)

    def _pinned(self):
        return self.sdpa_kernel(self.backend)


@dataclass(eq=False)
class SdpaImpl(Impl):
    backend: str = ""              # SDPBackend member
    takes_mask: bool = True
    masked_value: float = -math.inf
    materializes: bool = False     # the backend computes the [B, H, Tq, Tk] scores unfused (MATH)
    passes = PASSES  # the backward through autograd, the backend pinned for it too
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


# -- flex ---------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _flex():
    """(compiled flex_attention, create_block_mask, compiled create_block_mask).

    Every configuration brings its own mask_mod, so torch.compile recompiles for each; past
    its recompile limit it would silently run FlexAttention eagerly (unfused), so the limits
    are raised. Shapes are static, as a user with one model would compile them.

    The backward alone (``bwd``) goes back through one recorded forward with retain_graph=True,
    which a compiled backward with donated buffers (saved tensors it may overwrite) refuses; they
    are turned off (torch._functorch.config.donated_buffer), for every pass alike."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    cfg = torch._dynamo.config
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, floor in (("recompile_limit", 4096), ("cache_size_limit", 4096),
                            ("accumulated_recompile_limit", 65536), ("accumulated_cache_size_limit", 65536)):
            if hasattr(cfg, name):
                setattr(cfg, name, max(getattr(cfg, name), floor))
    try:
        import torch._functorch.config as aot_config
    except ImportError:  # an older torch, without donated buffers
        aot_config = None
    if hasattr(aot_config, "donated_buffer"):
        aot_config.donated_buffer = False
    return torch.compile(flex_attention, dynamic=False), create_block_mask, torch.compile(create_block_mask)


def flex_kernel_options(bs: int):
    return {"BLOCK_M": bs, "BLOCK_N": bs} if bs == 64 else None


@dataclass(frozen=True)
class FlexSetting:
    """What a Flex row runs at: the BlockMask's block size and the kernel options flex_attention is
    called with (none: its own defaults). The backward reads options of its own: BLOCK_M1 and
    BLOCK_N1 (the dK, dV loop's query and key blocks), BLOCK_M2 and BLOCK_N2 (the dQ loop's),
    num_warps, num_stages (``bwd_``/``fwd_`` prefixes aim them at one pass)."""
    block: int
    options: tuple = ()  # (name, value) pairs, in the order given

    @classmethod
    def make(cls, block: int, **options) -> "FlexSetting":
        return cls(block, tuple(options.items()))

    @classmethod
    def forward(cls, block: int) -> "FlexSetting":
        """The forward's setting at a block size (``flex_kernel_options``)."""
        return cls.make(block, **(flex_kernel_options(block) or {}))

    @property
    def kernel_options(self) -> dict | None:
        return dict(self.options) or None

    def label(self) -> str:
        """``BLOCK_SIZE=64 BLOCK_M=64 ...``, or ``BLOCK_SIZE=128 (defaults)``: as setup_s records it."""
        return f"BLOCK_SIZE={self.block}" + ("".join(f" {k}={v}" for k, v in self.options) or " (defaults)")


# The settings a backward pass tries in prepare, the fastest kept: block 128 at Flex's defaults, and
# block 64 with the backward block sizes SPEC section 7 names. At block 64 the backward may find no
# kernel: torch filters its default backward configurations (on sm90, for D = 64 and 128, BLOCK_N1 =
# BLOCK_M2 = 128) by whether they divide the BlockMask's blocks before it applies the options given
# (NoValidChoicesError); such a setting is recorded in setup_s (flex_failed) and left out.
FLEX_BWD_SETTINGS = (
    FlexSetting.make(128),
    FlexSetting.make(64, BLOCK_M=64, BLOCK_N=64, BLOCK_M1=32, BLOCK_N1=64, BLOCK_M2=64, BLOCK_N2=32),
)


def _failure(e: BaseException, most: int = 400) -> str:
    text = f"{type(e).__name__}: {' '.join(str(e).split())}"
    return text if len(text) <= most else text[:most] + "..."


class _FlexRunner(_TorchRunner):
    """Tries each setting in prepare (the forward's: a block size each, ``blocks``; a backward
    pass's: ``bwd_settings``) and keeps the fastest at the pass it times. A setting a backward pass
    cannot compile or run is left out with its reason (``setup['flex_failed']``); none left is a
    BadInput naming every one."""

    def __init__(self, prob: Problem, q, k, v, blocks=FLEX_BLOCKS, bwd_settings=FLEX_BWD_SETTINGS, do=None):
        super().__init__(prob, q, k, v, do)
        self.fn, eager_build, compiled_build = _flex()
        T, Tq = prob.T, prob.q_len
        build = compiled_build if T >= FLEX_COMPILED_MASK_FROM else eager_build
        mask_mod = prob.mask.mask_mod(self.device) if prob.prefill else serving_mask_mod(prob, self.device)
        B = prob.B if prob.cache_lens is not None else None  # a ragged batch: a block mask per sequence
        self.gqa = {"enable_gqa": True} if prob.kv_heads != prob.H else {}
        backward = prob.pass_name != "fwd"
        settings = tuple(bwd_settings) if backward else tuple(FlexSetting.forward(bs) for bs in blocks)
        t_select = time.perf_counter()
        best, failed = None, {}
        with self.torch.cuda.stream(self.stream()):
            for st in settings:
                self.opts = st.kernel_options
                t0 = time.perf_counter()
                try:
                    self.block_mask = build(mask_mod, B, None, Tq, T, device=self.device, BLOCK_SIZE=st.block)
                    if self.pass_name == "bwd":
                        self.save_forward()
                    self.run()
                    _sync()
                except Exception as e:  # noqa: BLE001 - a backward setting that does not compile: left out
                    if not backward:
                        raise
                    failed[st.label()] = _failure(e)
                    self._graph = self._out = self._tgrads = None
                    continue
                first = time.perf_counter() - t0
                rebuilds = []
                for _ in range(REBUILDS):
                    t0 = time.perf_counter()
                    self.block_mask = build(mask_mod, B, None, Tq, T, device=self.device, BLOCK_SIZE=st.block)
                    _sync()
                    rebuilds.append(time.perf_counter() - t0)
                rebuild = float(np.median(rebuilds))
                ms = _time_ms(self.run)
                if best is None or ms < best[0]:
                    best = (ms, st, self.block_mask, first, rebuild)
        if best is None:
            raise BadInput(f"flex: no setting of its {prob.pass_name} pass runs for {prob.mask.label()} at T={T}: "
                           + "; ".join(f"{k}: {v}" for k, v in failed.items()))
        _, st, self.block_mask, first, rebuild = best
        self.opts = st.kernel_options
        self.setup.update(compile_s=first, block_mask_build_s=rebuild, flex_block=st.block,
                          block_select_s=time.perf_counter() - t_select)
        if backward:
            self.setup["flex_options"] = st.label()
            if failed:
                self.setup["flex_failed"] = failed
            if self.pass_name == "bwd":  # the graph of the setting kept
                self.save_forward()
                _sync()

    def _call(self):
        return self.fn(self.q, self.k, self.v, block_mask=self.block_mask, scale=self.prob.softmax_scale,
                       kernel_options=self.opts, **self.gqa)


@dataclass(eq=False)
class FlexImpl(Impl):
    blocks: tuple = FLEX_BLOCKS  # block sizes tried in prepare; the fastest is kept
    bwd_settings: tuple = FLEX_BWD_SETTINGS  # FlexSettings a backward pass tries; the fastest that runs is kept
    passes = PASSES  # the backward through autograd of the compiled flex_attention
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

    def build(self, prob: Problem, q, k, v, do=None) -> Runner:
        return _FlexRunner(prob, q, k, v, self.blocks, self.bwd_settings, do)


# -- the registry ------------------------------------------------------------------------------
_SDPA_COMMON = ("torch.nn.functional.scaled_dot_product_attention pinned with sdpa_kernel(SDPBackend.{b}); "
                "dense causal through is_causal=True, dense non-causal plain; the backward through "
                "torch.autograd.grad (bwd: of a forward recorded in prepare, its graph retained), the backend "
                "pinned for it too")
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
    f"{SCRATCH_BYTES >> 20} MiB of scratch. The backward over the same chunks: S again, P = exp(S - lse) "
    "from the forward's row log-sum-exp, dV += P^T dO, dP = dO V^T, dS = P (dP - rowsum(dO * O)), "
    "dQ = scale dS K, dK += scale dS^T Q (P and dS rounded to the storage dtype, dK and dV accumulated in "
    "float32)",
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
SDPA_MATH = register(SdpaImpl(
    "sdpa-math", "peer", _SDPA_COMMON.format(b="MATH") + _SDPA_MASKED.format(v="-inf")
    + "; unfused: the scores and probabilities are materialised ([B, H, Tq, Tk], float32 for 16-bit inputs, "
    f"grouped heads through enable_gqa's repeat of K and V), refused above {SDPA_MATH_BYTES >> 30} GiB of them "
    "(two arrays for the forward, four with a backward)",
    ALL_DTYPES, backend="MATH", materializes=True))
FLEX = register(FlexImpl(
    "flex", "peer",
    "torch.nn.attention.flex_attention under torch.compile (static shapes), mask_mod = the pattern's own "
    "predicate (Mask.mask_mod), BlockMask built once per configuration (create_block_mask compiled from "
    f"T = {FLEX_COMPILED_MASK_FROM}), at the faster of block 64 (kernel BLOCK_M = BLOCK_N = 64) and 128 "
    "by a short timing in prepare under the rows' protocol (L2 flushed, host path held out); the backward through torch.autograd.grad of the compiled call, at the "
    "fastest of FLEX_BWD_SETTINGS that compiles (block 128 at Flex's defaults; block 64 with BLOCK_M1=32 "
    "BLOCK_N1=64 BLOCK_M2=64 BLOCK_N2=32), the one used and those that failed in setup_s",
    ALL_DTYPES))

__all__ = ["CUBLAS", "SDPA_FLASH", "SDPA_CUDNN", "SDPA_EFFICIENT", "SDPA_MATH", "FLEX", "CublasImpl", "SdpaImpl",
           "FlexImpl", "FlexSetting", "FLEX_BWD_SETTINGS", "cublas_rows", "sdpa_mask_bytes", "sdpa_math_bytes",
           "flex_kernel_options"]
