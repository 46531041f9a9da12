"""A pattern at a given T, causal flag and parameters, validated: the mask, its counts, its tile
lists and what a kernel needs to compile its predicate in."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from .base import Pattern, is_torch


@dataclass(frozen=True, eq=False)
class Mask:
    pattern: Pattern
    T: int
    causal: bool
    params: dict
    table: np.ndarray | None = None
    # the pattern's torch_table, kept on the device it was last asked for
    _torch: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    # -- the mask and its counts ---------------------------------------------------
    def allowed(self, i, j):
        """The predicate on index arrays that broadcast: numpy arrays or torch tensors."""
        table = self._torch_table(i.device) if is_torch(i) else self.table
        a = self.pattern.allowed(i, j, self.T, self.causal, self.params, table)
        if self.causal:
            a = a & (j <= i)
        return a

    def _torch_table(self, device):
        t = self._torch.get("table")
        if t is not None and t.device == device:
            return t
        if self.table is None:
            return None
        t = self._torch["table"] = self.pattern.torch_table(self.T, self.params, self.table, device)
        return t

    def mask_mod(self, device=None):
        """FlexAttention's ``mask_mod(b, h, q_idx, kv_idx)``: this mask's own predicate.
        Give the device the indices will live on so that any table the predicate reads is
        placed there now, outside any torch.compile trace."""
        if device is None:
            def mask_mod(b, h, q_idx, kv_idx):
                return self.allowed(q_idx, kv_idx)
            return mask_mod
        import torch

        table = self._torch_table(torch.device(device))
        pred = self.pattern.predicate(self.T, self.causal, self.params, table)  # looked up now, not in the trace
        causal = self.causal

        def mask_mod(b, h, q_idx, kv_idx):
            a = pred(q_idx, kv_idx)
            return a & (kv_idx <= q_idx) if causal else a

        return mask_mod

    def dense(self, rows=None) -> np.ndarray:
        """Boolean mask [len(rows), T] for the given rows (all rows by default)."""
        i = np.arange(self.T) if rows is None else np.asarray(rows)
        return self.allowed(i[:, None], np.arange(self.T)[None, :])

    def row_counts(self, rows=None) -> np.ndarray:
        """Allowed keys of each row: every row, or those given (e.g. the last Tq rows of a decode)."""
        i = np.arange(self.T, dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
        return np.asarray(self.pattern.row_counts(i, self.T, self.causal, self.params, self.table), np.int64)

    def keys(self, rows, chunk: int = 1 << 22) -> np.ndarray:
        """The sorted keys that some of ``rows`` allows (the K and V rows a decode may read): the
        union of the rows' exact key intervals, and of the keys of their other families that the
        predicate allows (every key for a pattern without intervals), tested ``chunk`` pairs at a
        time. Never a T x T mask: the cost follows the intervals of the rows given."""
        rows = np.asarray(rows, dtype=np.int64)
        try:
            lo, hi, exact = self.intervals(rows)
        except NotImplementedError:  # custom: no intervals, every key a candidate
            lo, hi, exact = np.zeros((1, 1), np.int64), np.full((1, 1), self.T, np.int64), np.array([False])
        sure = _ranges(lo[exact].ravel(), hi[exact].ravel())
        maybe = _ranges(lo[~exact].ravel(), hi[~exact].ravel())
        maybe = maybe[~np.isin(maybe, sure, assume_unique=True)]
        step = max(1, chunk // max(1, rows.size))
        found = [maybe[c:c + step][self.allowed(rows[:, None], maybe[None, c:c + step]).any(axis=0)]
                 for c in range(0, maybe.size, step)]
        return np.union1d(sure, np.concatenate(found)) if found else sure

    @functools.cached_property
    def pairs(self) -> int:
        return int(self.row_counts().sum())

    @functools.cached_property
    def max_keys(self) -> int:
        return int(self.row_counts().max())

    @property
    def density(self) -> float:
        return self.pairs / float(self.T) ** 2

    def label(self) -> str:
        """``window(window=64)`` (``pattern_label``), from the pattern itself, so that a pattern outside
        the registry (``class_bands``) has one too."""
        ps = ",".join(f"{k}={v}" for k, v in self.pattern.label_items(self.params))
        return f"{self.pattern.name}({ps})" if ps else self.pattern.name

    def at(self, T: int) -> "Mask":
        """The same pattern instance at another length (a ragged batch's shorter caches)."""
        from . import make_mask

        return self if T == self.T else make_mask(self.pattern.name, T, self.causal, **self.params)

    def strided(self) -> tuple[int, "Mask"]:
        """(r, inner): position i belongs to residue class i % r and is row or key i // r of
        that class, a sequence of ceil((T - i % r) / r) positions; ``inner`` is the mask of
        every class, built at the longest, ceil(T / r). (1, self) for a pattern with no
        stride."""
        from . import make_mask

        s = self.pattern.strided(self.params)
        if s is None:
            return 1, self
        r, name, params = s
        return r, make_mask(name, -(-self.T // r), self.causal, **params)

    def class_major(self) -> tuple[int, "Mask"]:
        """(r, banded): the mask in the class-major layout (``Pattern.class_major``): ``banded`` is
        a ``class_bands`` mask at the same T, not causal (the clause is in its bands), whose
        position c * (T / r) + a stands for this mask's a * r + c. (1, self) for a pattern without
        that layout, or a T that r does not divide."""
        from .class_bands import ClassBands

        cm = self.pattern.class_major(self.params, self.causal)
        if cm is None or self.T % cm[0]:
            return 1, self
        r, bands = cm
        pat = ClassBands()
        params = {"classes": r, "length": self.T // r, "bands": bands}
        pat.validate(self.T, params)
        return r, Mask(pat, self.T, False, params)

    def in_place(self) -> "Mask | None":
        """This layout mask (``class_bands``) read in place by the kernels (``Pattern.in_place``: each class holds
        a multiple of 128 positions), else None."""
        p = self.pattern.in_place(self.params)
        return None if p is None else Mask(self.pattern, self.T, self.causal, p)

    def rows_in_place(self) -> int:
        """The classes r of a layout the kernels read in place (the arrays in the sequence's order,
        kernels/tc/rows.cuh), else 1."""
        return self.pattern.rows_in_place(self.params)

    # -- the device predicate --------------------------------------------------------
    def device_args(self) -> np.ndarray:
        """int32 values of the device struct's fields after ``causal`` (kernels that take the
        pattern at run time read them from a small array, ``pargs``)."""
        return np.asarray(self.pattern.device_args(self.params) or (0,), dtype=np.int32)

    def device_defines(self, runtime: bool = False) -> dict:
        """The -D constants that compile this pattern's predicate into a kernel: AB_PATTERN_T, the
        struct of kernels/patterns/<name>.cuh (compile.source includes that file), and
        AB_PATTERN_ARGS, its initialiser: the values themselves (folded by the compiler), or with
        ``runtime`` the kernel's own ``causal`` and ``pargs[k]``. A pattern with a table ends with
        the kernel's ``table`` pointer. The pattern's ``extra_defines`` come with them (custom:
        AB_CUSTOM_EXPR, its expression in C, whatever ``runtime`` says)."""
        n = len(self.pattern.device_args(self.params))
        if runtime:
            args = ["causal"] + [f"pargs[{k}]" for k in range(n)]
        else:
            args = [str(int(self.causal))] + [str(int(v)) for v in self.pattern.device_args(self.params)]
        if self.pattern.uses_table:
            args.append("table")
        return {"AB_PATTERN_T": self.pattern.device_struct, "AB_PATTERN_ARGS": ",".join(args),
                **self.pattern.extra_defines(self.T, self.params)}

    def tile_predicate(self, BM: int, BN: int) -> "Mask":
        """The mask whose device predicate a kernel needs on the partial tiles of this mask's
        BM x BN list: itself, or dense with the same causal flag when the pattern is uniform over
        such tiles (``Pattern.uniform_tiles``: BigBird and block-diagonal with blocks that the
        tiles divide), which leaves only the causal clause (and j < T) to test."""
        from . import make_mask

        if self.pattern.uniform_tiles(self.params, BM, BN):
            return make_mask("dense", self.T, self.causal)
        return self

    # -- intervals and tiles -------------------------------------------------------
    def intervals(self, i, split: int = 1):
        lo, hi, exact = self.pattern.intervals(i, self.T, self.causal, self.params, self.table, split)
        lo = np.maximum(lo, 0)  # new arrays: a pattern may hand out views of its own (np.clip: 5x slower)
        np.minimum(lo, self.T, out=lo)
        hi = np.maximum(hi, 0)
        np.minimum(hi, self.T, out=hi)
        if self.causal:
            np.minimum(hi, i[None] + 1, out=hi)
        return lo, np.maximum(hi, lo, out=hi), np.asarray(exact, dtype=bool)

    def tiles(self, BM: int, BN: int):
        """The list of key tiles each BM-row query tile visits (``attnbench.tiles``), built now
        (from the intervals, or by the pattern's own ``build_tiles``)."""
        from ..tiles import build

        return build(self, BM, BN)


def _ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The sorted integers of the union of half-open intervals [lo, hi) (empty ones left out)."""
    keep = hi > lo
    lo, hi = lo[keep], hi[keep]
    if not lo.size:
        return np.zeros(0, np.int64)
    order = np.argsort(lo, kind="stable")
    lo, hi = lo[order], np.maximum.accumulate(hi[order])
    start = np.ones(lo.size, bool)  # an interval that begins past every earlier end starts a run
    start[1:] = lo[1:] > hi[:-1]
    run = np.cumsum(start) - 1
    r_lo = lo[start]
    r_hi = np.zeros(r_lo.size, np.int64)
    np.maximum.at(r_hi, run, hi)
    n = r_hi - r_lo
    return np.repeat(r_lo - np.concatenate(([0], np.cumsum(n)[:-1])), n) + np.arange(n.sum())
