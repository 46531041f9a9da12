"""fast-f32: tiled float32 attention on CUDA cores (kernels/fast_f32.cu).

A block computes one query tile of BM rows against a share of the key tiles its tile list
(``attnbench.tiles``) names. With few query tiles (B = H = 1) every list is split across S
blocks (split-K); each writes its un-normalised output and its row max and row sum to a float32
workspace, and a second kernel merges the splits. S is chosen here, on the host, so that the
longest block is a fraction of one SM's share of the work; S = 1 writes the output directly.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .arrays import poison
from .compile import get_module, resident_blocks
from .errors import BadInput
from .impls import Impl, Problem, Runner, register, timed
from .patterns import Mask
from .tiles import setup_times, tile_list

BM = 64    # query rows per tile
BN = 64    # keys per tile
NT = 256   # threads per block
DK = 32    # K columns per pipeline stage
VK = 8     # V keys per pipeline stage
TX = 16    # threads across columns (kernel constant)
D_STEP = 4 * TX   # head dims must be multiples of this
D_MAX = 384       # largest head dim whose accumulators fit in registers
WAVES = 2         # the longest block is at most 1 / WAVES of an SM's share of the work
WORKSPACE_LIMIT = 1 << 30  # bytes of split workspace at most
MERGE_THREADS = 256


def supported_d(D: int) -> str | None:
    """None when the kernel takes head dim D, else why not."""
    if D % D_STEP or D > D_MAX:
        return f"D={D} is not supported by fast-f32: D must be a multiple of {D_STEP} and at most {D_MAX}"
    return None


def smem_bytes(D: int) -> int:
    """Dynamic shared memory of one block (kernel layout: Q tile, P tile, two ring slots)."""
    q = BM * (D + 4)
    p = BM * (BN + 4)
    ring = max(BN * (DK + 4), VK * (D + 4))
    return 4 * (q + p + 2 * ring)


def defines(D: int, mask: Mask) -> dict:
    """The kernel's constants: tile shape, and the pattern (its parameters come at run time)."""
    return {"C": D, "BM": BM, "BN": BN, "NT": NT, "DK": DK, "VK": VK, "SMEM_BYTES": smem_bytes(D),
            **mask.device_defines(runtime=True)}


# ---- split planning (host) ------------------------------------------------------------------
def plan_splits(ptr: np.ndarray, bh: int, n_sm: int, per_sm: int = 1, waves: int = WAVES,
                max_splits: int | None = None) -> int:
    """Number of splits S per query tile.

    The work is ``bh * sum(counts)`` key tiles over ``n_sm * per_sm`` resident blocks; a block's
    share is ``ceil(work / (n_sm * per_sm * waves))`` tiles (at least 1). With S splits the longest
    block does ``ceil(max(counts) / S)`` tiles: S is the smallest value that keeps this within one
    share (then capped by ``max_splits``)."""
    counts = np.diff(np.asarray(ptr, dtype=np.int64))
    longest = int(counts.max()) if counts.size else 0
    total = int(counts.sum()) * bh
    if longest <= 1:
        return 1
    share = max(1, -(-total // (n_sm * per_sm * waves)))
    s = -(-longest // share)
    if max_splits is not None:
        s = min(s, max_splits)
    return max(1, s)


def split_ranges(ptr: np.ndarray, splits: int) -> tuple[np.ndarray, np.ndarray]:
    """[nq, S] entry ranges [lo, hi) of each split, as the kernel computes them: split s of a query
    tile with n entries takes [n*s // S, n*(s+1) // S) of its list."""
    ptr = np.asarray(ptr, dtype=np.int64)
    n = (ptr[1:] - ptr[:-1])[:, None]
    s = np.arange(splits, dtype=np.int64)[None, :]
    return ptr[:-1, None] + n * s // splits, ptr[:-1, None] + n * (s + 1) // splits


def workspace_splits_limit(bh: int, nq: int, D: int) -> int:
    """The most splits whose workspace (output rows plus (m, l) per row) fits WORKSPACE_LIMIT."""
    per_split = bh * nq * BM * (D + 2) * 4
    return max(1, WORKSPACE_LIMIT // per_split)


# ---- runner ---------------------------------------------------------------------------------
class FastF32Runner(Runner):
    def __init__(self, prob: Problem, q, k, v, splits: int | None):
        import cupy

        self.setup = {}
        tiles = tile_list(prob.mask, BM, BN)
        self.setup.update(setup_times(tiles))
        with timed(self.setup, "compile_s"):
            mod = get_module("fast_f32", defines(prob.D, prob.mask))
            self._split_k = mod.get_function("fast_f32_split")
            self._merge_k = mod.get_function("fast_f32_merge")
        self._smem = smem_bytes(prob.D)
        self._split_k.max_dynamic_shared_size_bytes = self._smem

        T, D = prob.T, prob.D
        bh = prob.B * prob.H
        nq = tiles.ptr.size - 1
        if splits is None:
            n_sm = cupy.cuda.Device().attributes["MultiProcessorCount"]
            splits = plan_splits(tiles.ptr, bh, n_sm, resident_blocks(self._split_k, NT, self._smem),
                                 max_splits=workspace_splits_limit(bh, nq, D))
        self.splits = int(splits)
        self.nq, self.bh, self.T, self.D = nq, bh, T, D

        self._q, self._k, self._v = q, k, v
        self._out = cupy.empty(prob.shape, dtype=cupy.float32)
        if self.splits > 1:
            rows = bh * nq * self.splits * BM
            self._ws_o = cupy.empty((rows, D), dtype=cupy.float32)
            self._ws_ml = cupy.empty((rows, 2), dtype=cupy.float32)
        else:  # the split kernel writes the output directly and never touches the workspace
            self._ws_o = cupy.empty((1, 4), dtype=cupy.float32)
            self._ws_ml = cupy.empty((1, 2), dtype=cupy.float32)
        self._ptr = tiles.device().ptr
        self._entries = tiles.device().entries
        table = prob.mask.table
        self._table = cupy.asarray(table if table is not None else np.full(1, -1, np.int32), dtype=cupy.int32)
        self._pargs = cupy.asarray(prob.mask.device_args())
        self._args = (self._q, self._k, self._v, self._out, self._ws_o, self._ws_ml, self._ptr, self._entries,
                      self._table, np.int32(T), np.int32(nq), np.int32(self.splits), np.int32(prob.mask.causal),
                      self._pargs, np.float32(prob.softmax_scale), np.int32(self.splits == 1))
        total = bh * T * (D // 4)
        self._merge_args = (self._out, self._ws_o, self._ws_ml, np.int32(T), np.int32(nq),
                            np.int32(self.splits), np.int64(total))
        self._merge_grid = (-(-total // MERGE_THREADS),)

    def run(self) -> None:
        self._split_k((self.nq, self.splits, self.bh), (NT,), self._args, shared_mem=self._smem)
        if self.splits > 1:
            self._merge_k(self._merge_grid, (MERGE_THREADS,), self._merge_args)

    def poison(self) -> None:
        super().poison()
        if self.splits > 1:
            poison(self._ws_o)
            poison(self._ws_ml)


def _check_input(name: str, x, prob: Problem) -> None:
    import cupy

    if not isinstance(x, cupy.ndarray):
        raise BadInput(f"{name} of type {type(x).__name__} is not a CuPy array")
    shape = tuple(getattr(x, "shape", ()))
    if shape != prob.shape:
        raise BadInput(f"{name} has shape {shape}, expected {prob.shape}")
    if str(getattr(x, "dtype", "")) != "float32":
        raise BadInput(f"{name} has dtype {getattr(x, 'dtype', None)}: fast-f32 takes float32")
    if not x.flags.c_contiguous:
        raise BadInput(f"{name} is not C-contiguous")


@dataclass(eq=False)
class FastF32(Impl):
    """``splits`` fixes S (None: planned from the tile list and the SM count)."""
    splits: int | None = None

    def unsupported(self, prob: Problem) -> str | None:
        why = super().unsupported(prob)
        if why:
            return why
        why = supported_d(prob.D)
        if why:
            return why
        if prob.B * prob.H > 65535:
            return f"B*H={prob.B * prob.H} exceeds the grid limit 65535 of fast-f32"
        return None

    def build(self, prob: Problem, q, k, v) -> Runner:
        if self.splits is not None and self.splits < 1:
            raise BadInput(f"splits={self.splits} must be at least 1")
        for name, x in (("q", q), ("k", k), ("v", v)):
            _check_input(name, x, prob)
        return FastF32Runner(prob, q, k, v, self.splits)


IMPL = register(FastF32(
    name="fast-f32", family="attnbench",
    description=f"tiled float32 on CUDA cores: {BM}x{BN} tiles over the tile list, split-K with an LSE merge",
    dtypes=("float32",)))

__all__ = ["FastF32", "FastF32Runner", "IMPL", "plan_splits", "split_ranges", "smem_bytes", "defines",
           "supported_d", "workspace_splits_limit"]


def standard_builds() -> list[tuple[str, dict]]:
    """The seed configuration (C = 384) and the llm head dims, every pattern."""
    from .patterns import PATTERNS, make_mask

    return [("fast_f32", defines(D, make_mask(name, 4096, True))) for D in (384, 64, 128) for name in PATTERNS]
