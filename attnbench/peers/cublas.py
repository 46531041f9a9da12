"""``cublas``: the attention a user writes with CuPy alone: S = Q K^T through cuBLAS, the pattern's dense mask, a
max-subtracted softmax, O = P V, chunked over queries; its backward with CuPy and cuBLAS over the same chunks."""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..arrays import STORAGE, poison, to_float32
from ..impls import ITEMSIZE, PASSES, Impl, Problem, Runner, device_problem, register, timed
from .common import ALL_DTYPES, row_chunks, sync

SCRATCH_BYTES = 256 << 20     # cublas: scores and probabilities of one chunk of query rows
MASK_CACHE_BYTES = 1 << 30    # cublas: the uploaded mask is kept between runs up to T*T this size


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
        self.chunks = list(row_chunks(T, self.rows))
        self.s = xp.empty((self.bh, self.rows, T), np.float32)
        self.p = self.s if prob.dtype == "float32" else xp.empty((self.bh, self.rows, T), STORAGE[prob.dtype])
        self.scale = np.array(prob.softmax_scale, np.float32)
        self.setup = {}
        self.full = prob.mask.pairs == T * T  # every key allowed: no mask at all
        self.masks = None
        if not self.full and T * T <= MASK_CACHE_BYTES:
            with timed(self.setup, "mask_build_s"):
                self.masks = [self._blocked(r0, r1) for r0, r1 in self.chunks]
                sync()
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
                    sync()

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
