"""The seed-faithful naive family (kernels/naive.cu): one thread per query, float32."""
from __future__ import annotations

import numpy as np

from . import compile as kc
from .impls import Impl, Problem, Runner, register, timed
from .errors import BadInput

THREADS = 128
# Every thread keeps MAX_T (dense) or MAX_KEYS (sparse) floats in local memory, and the
# device reserves that for every resident thread: past this the reservation runs to tens of GB.
LOCAL_LIMIT = 16384


def constants(prob: Problem) -> dict:
    """MAX_T, MAX_KEYS and C for a problem: from the call unless the user set them."""
    dense = prob.mask.pattern.name == "dense"
    max_t = prob.max_t if prob.max_t is not None else kc.round_up_pow2(prob.T)
    max_keys = prob.max_keys if prob.max_keys is not None else kc.round_up_pow2(prob.mask.max_keys, 16)
    if dense and max_t > LOCAL_LIMIT:
        raise BadInput(f"max_t={max_t} (T={prob.T}) exceeds the naive dense kernel's limit {LOCAL_LIMIT}")
    if not dense and max_keys > LOCAL_LIMIT:
        raise BadInput(f"max_keys={max_keys} (keys per row {prob.mask.max_keys}) exceeds the naive "
                       f"kernels' limit {LOCAL_LIMIT}")
    # the dense kernel needs no key list and the sparse kernel no score row of length T
    return {"MAX_T": max_t if dense else 1, "MAX_KEYS": 1 if dense else max_keys, "C": prob.D,
            **prob.mask.device_defines(runtime=True)}


class NaiveRunner(Runner):
    def __init__(self, prob: Problem, q, k, v):
        import cupy

        self.setup = {}
        dense = prob.mask.pattern.name == "dense"
        with timed(self.setup, "compile_s"):
            mod = kc.get_module("naive", constants(prob))
            self.fn = mod.get_function("naive_dense" if dense else "naive_sparse")
        self._out = cupy.empty(prob.shape, dtype=cupy.float32)
        T = prob.T
        self.grid = ((T + THREADS - 1) // THREADS, prob.B * prob.H)
        head = (q, k, v, self._out, np.int32(T), np.float32(prob.softmax_scale))
        if dense:
            self.args = head + (np.int32(prob.mask.causal),)
        else:
            table = prob.mask.table if prob.mask.table is not None else np.zeros(1, np.int32)
            self._table = cupy.asarray(np.ascontiguousarray(table, dtype=np.int32))
            self._pargs = cupy.asarray(prob.mask.device_args())
            self.args = head + (np.int32(prob.mask.causal), self._pargs, self._table)

    def run(self) -> None:
        self.fn(self.grid, (THREADS,), self.args)


class NaiveImpl(Impl):
    def unsupported(self, prob: Problem) -> str | None:
        why = super().unsupported(prob)
        if why:
            return why
        try:
            constants(prob)
        except BadInput as e:
            return str(e)
        return None

    def build(self, prob: Problem, q, k, v) -> Runner:
        return NaiveRunner(prob, q, k, v)


register(NaiveImpl(
    name="naive",
    family="attnbench",
    description="seed-faithful: one thread per query, float32, scores in local memory (kernels/naive.cu)",
    dtypes=("float32",),
))


def standard_builds() -> list[tuple[str, dict]]:
    """The naive kernels' constants at the seed and llm configurations' head dims, T=4096: every
    pattern at its defaults, and the configurations' own instances at the first of their head dims."""
    from .configs import LLM, SEED, Instance
    from .patterns import PATTERNS

    builds = []
    for cfg in (SEED, LLM):
        for D in cfg.D:
            insts = [Instance.make(name, True) for name in PATTERNS] + list(cfg.instances if D == cfg.D[0] else ())
            for inst in insts:
                prob = Problem(inst.mask(4096), 1, 1, D, "float32")
                b = ("naive", constants(prob))
                if b not in builds:
                    builds.append(b)
    return builds
