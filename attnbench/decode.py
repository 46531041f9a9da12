"""``fast-decode``: decoding attention on tensor cores (kernels/decode.cu) for Tq queries at the end
of each sequence's cache, grouped-query heads and ragged batches, every pattern, split-KV.

The host lists, for each distinct cache length Tk_b of the batch, the key tiles some of the Tq
positions Tk_b - Tq .. Tk_b - 1 allow (``Mask.keys``), each flagged full when every one of those
positions allows every key of the tile and the tile ends within Tk_b, else partial (the kernel
masks it with the predicate). The lists are cut into splits of equal length so that B * H_kv *
splits blocks fill the GPU whatever B; ``decode_split`` leaves each split's rows normalised with
their log-sum-exp and ``decode_merge`` weighs them. A block holds the H / H_kv query heads of its
key/value head times the Tq positions as its rows (at most ``ROWS``); longer query stretches are
prefill's (fast-tc).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .arrays import bind
from .compile import get_module
from .errors import BadInput
from .fast_tc import LOG2E, pattern_defines
from .impls import Impl, Problem, Runner, register, timed
from .patterns import Mask
from .serving import one_predicate

KERNEL = "decode"
SPLIT, MERGE = "decode_split", "decode_merge"
HEAD_DS = (64, 128)
NWARPS, BN, STAGES = 4, 64, 3
ROWS = 16 * NWARPS  # query rows of a block: query heads of a group x Tq
BLOCKS_PER_SM = 4   # the splits aim at this many blocks per multiprocessor
MIN_PER_SPLIT = 4   # key tiles of a split, at least


def kernel_defines(D: int, dtype: str, mask: Mask) -> dict:
    """The -D constants of kernels/decode.cu: the head dimension, dtype, shape and the pattern."""
    return dict(HEAD_D=D, BN=BN, NWARPS=NWARPS, STAGES=STAGES, MT=1, MINB=1, QREG=1, STRIDE=1,
                AB_F16=int(dtype == "float16"), **pattern_defines(mask))


def smem_bytes(D: int) -> int:
    return (ROWS + 2 * STAGES * BN) * D * 2


@dataclass(frozen=True)
class DecodeList:
    """The key tiles of one cache length's Tq positions: entries ``kt << 1 | partial``."""
    Tk: int
    entries: np.ndarray  # int32
    build_s: float


def decode_list(mask: Mask, Tq: int) -> DecodeList:
    """The key tiles the last Tq positions of ``mask`` (at its T) may read, full or partial."""
    t0 = time.perf_counter()
    T = mask.T
    rows = np.arange(T - Tq, T, dtype=np.int64)
    keys = mask.keys(rows)
    kts = np.unique(keys // BN)
    full = np.zeros(kts.size, bool)
    inside = np.flatnonzero((kts + 1) * BN <= T)
    step = max(1, (1 << 24) // (Tq * BN))  # tiles tested at once: every position against every key
    for a in range(0, inside.size, step):
        n = inside[a:a + step]
        cols = (kts[n, None] * BN + np.arange(BN)).ravel()
        full[n] = mask.allowed(rows[:, None], cols[None, :]).reshape(Tq, n.size, BN).all(axis=(0, 2))
    ent = (kts << 1 | (~full).astype(np.int64)).astype(np.int32)
    return DecodeList(T, ent, time.perf_counter() - t0)


class DecodeRunner(Runner):
    def __init__(self, split, merge, grid, merge_grid, smem, args, merge_args, out, setup, D):
        self._split, self._merge = split, merge
        self._grid, self._merge_grid = grid, merge_grid
        self._merge_block = (D,)  # a thread per column
        self._smem = smem
        self._args, self._merge_args = args, merge_args
        self._out = out
        self.setup = setup

    def run(self) -> None:
        self._split(self._grid, (32 * NWARPS,), self._args, shared_mem=self._smem)
        self._merge(self._merge_grid, self._merge_block, self._merge_args)


@dataclass(eq=False)
class FastDecode(Impl):
    gqa = True
    decode = True
    ragged = True
    takes_prefill = False  # Tq = Tk is fast-tc's

    def unsupported(self, prob: Problem) -> str | None:
        why = super().unsupported(prob)
        if why:
            return why
        if prob.D not in HEAD_DS:
            return f"D={prob.D} is not supported by {self.name} (supports D in {', '.join(map(str, HEAD_DS))})"
        why = one_predicate(prob)
        if why:
            return f"{self.name}: {why}"
        rows = prob.H // prob.kv_heads * prob.q_len
        if rows > ROWS:
            return (f"H/H_kv x Tq = {rows} query rows per key/value head exceed {ROWS} for {self.name} "
                    f"(Tq up to {ROWS // (prob.H // prob.kv_heads)} at this grouping; longer stretches are prefill's)")
        return None

    def build(self, prob: Problem, q, k, v) -> Runner:
        import cupy

        qa = bind(q, "q", prob.dtype).array
        ka, va = (bind(x, name, prob.dtype).array for x, name in ((k, "k"), (v, "v")))
        if tuple(qa.shape) != prob.shape or tuple(ka.shape) != prob.kv_shape or tuple(va.shape) != prob.kv_shape:
            raise BadInput(f"q {tuple(qa.shape)}, k {tuple(ka.shape)}, v {tuple(va.shape)}: expected q {prob.shape} "
                           f"and k, v {prob.kv_shape}")
        setup: dict = {}
        lens = prob.lens
        order = sorted(set(lens))
        lists = [decode_list(prob.mask.at(t), prob.q_len) for t in order]
        setup["tiles_build_s"] = sum(x.build_s for x in lists)
        counts = np.array([x.entries.size for x in lists], np.int64)
        firsts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        tent = np.concatenate([x.entries for x in lists] + [np.zeros(1, np.int32)])
        sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
        work = prob.B * prob.kv_heads
        longest = int(counts.max()) if counts.size else 0
        per_split = max(MIN_PER_SPLIT, -(-longest * work // (BLOCKS_PER_SM * sms)))
        splits = max(1, -(-longest // per_split))
        setup["splits"] = splits
        # one predicate for every cache length (``unsupported`` refuses patterns whose predicate or
        # table depends on it)
        table = prob.mask.table
        table = cupy.asarray(table if table is not None else np.zeros(1, np.int32), dtype=cupy.int32)
        with timed(setup, "compile_s"):
            mod = get_module(KERNEL, kernel_defines(prob.D, prob.dtype, prob.mask))
            split_k, merge_k = mod.get_function(SPLIT), mod.get_function(MERGE)
            smem = smem_bytes(prob.D)
            if smem > 48 * 1024:
                split_k.max_dynamic_shared_size_bytes = smem
        heads = cupy.asarray(np.stack([firsts, counts], axis=1).astype(np.int32))
        list_of = cupy.asarray(np.array([order.index(t) for t in lens], np.int32))
        lens_d = cupy.asarray(np.array(lens, np.int32))
        tent_d = cupy.asarray(tent)
        op = cupy.empty((prob.B, prob.kv_heads, splits, ROWS, prob.D), cupy.float32)
        lp = cupy.empty((prob.B, prob.kv_heads, splits, ROWS), cupy.float32)
        out = cupy.empty(prob.shape, dtype=qa.dtype)
        scale_log2 = np.float32(prob.softmax_scale * LOG2E)
        args = (qa, ka, va, op, lp, heads, tent_d, lens_d, list_of, np.int32(prob.H), np.int32(prob.kv_heads),
                np.int32(prob.q_len), np.int32(prob.T), np.int32(per_split), scale_log2, table)
        merge_args = (op, lp, out, np.int32(prob.H), np.int32(prob.kv_heads), np.int32(prob.q_len),
                      np.int32(splits))
        return DecodeRunner(split_k, merge_k, (splits, prob.kv_heads, prob.B), (prob.B * prob.H * prob.q_len,),
                            smem, args, merge_args, out, setup, prob.D)


IMPL = register(FastDecode(
    name="fast-decode",
    family="attnbench",
    description="decoding on tensor cores: Tq queries at the end of each cache, grouped-query heads and ragged "
                "batches, the key tiles the pattern allows split across blocks and merged by log-sum-exp",
    dtypes=("bfloat16", "float16"),
))


def standard_builds() -> list[tuple[str, dict]]:
    """The decode configuration's instances at D = 128 and the llm head dims, bfloat16."""
    from .configs import get_config

    builds = []
    c = get_config("decode")
    for D in HEAD_DS:
        for inst in c.instances:
            b = (KERNEL, kernel_defines(D, "bfloat16", inst.mask(c.build_T)))
            if b not in builds:
                builds.append(b)
    return builds


__all__ = ["FastDecode", "IMPL", "decode_list", "kernel_defines", "standard_builds"]
