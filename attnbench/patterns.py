"""Sparse-attention patterns: the one definition everything else follows (SPEC section 2).

Each pattern is defined once, here, by:
  * its parameters (defaults = the seeds' defaults) and their validation;
  * ``allowed(i, j)``: the vectorised predicate (the reference mask); the same code runs on
    numpy arrays and on torch tensors (``Mask.mask_mod`` hands it to FlexAttention);
  * ``row_counts(i)``: the exact number of allowed keys of each row, in closed form
    (``pairs`` is their sum, ``max_keys`` their maximum; tests check both against the mask);
  * ``intervals(i)``: for each row, a few key intervals ("families") that cover every
    allowed key; a family marked exact allows every key inside it. The tile builder
    (``attnbench.tiles``) turns these into the list of key tiles each query tile visits;
  * ``device_params``: the integers the kernels' device predicate (kernels/common.cuh,
    ``ab_allowed``) reads, with the same pattern id;
  * ``uniform_tiles(BM, BN)``: whether the pattern is one value over every aligned BM x BN
    tile, so that a kernel's partial tiles need only the causal clause (``Mask.tile_predicate``).

The causal clause (``j <= i``) is applied on top of every pattern by ``Mask``.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np


class BadInput(ValueError):
    """Input that a kernel cannot take; the message names the parameter and the limit."""


@dataclass(frozen=True)
class Param:
    name: str
    default: int
    minimum: int
    help: str


_HOST = (np.ndarray, np.generic, int, float)


def _is_torch(x) -> bool:
    """True for a torch tensor, i.e. anything but a numpy array or a number. torch is never
    imported here, and a plain isinstance test also holds inside a torch.compile trace."""
    return not isinstance(x, _HOST)


def _tri(n):
    n = np.asarray(n, dtype=np.int64)
    return n * (n + 1) // 2


class Pattern:
    name: str = ""
    pid: int = -1
    params: tuple[Param, ...] = ()
    summary: str = ""

    # -- per-pattern definition -------------------------------------------------
    def validate(self, T: int, p: dict) -> None:
        """Extra checks beyond each parameter's minimum (sizes that do not fit T)."""

    def allowed(self, i, j, T: int, causal: bool, p: dict, table):
        raise NotImplementedError

    def row_counts(self, i, T: int, causal: bool, p: dict, table):
        raise NotImplementedError

    def intervals(self, i, T: int, causal: bool, p: dict, table, split: int):
        """Return (lo, hi, exact): lo/hi int64 arrays [F, len(i)] of half-open key
        intervals (hi <= lo means empty), exact a bool per family. Causal clipping is
        applied by the caller. ``split`` > 1 asks patterns whose families are constant
        over blocks of rows to split them so rows of one query tile do not mix."""
        raise NotImplementedError

    def device_params(self, p: dict) -> tuple[int, int, int, int]:
        return (0, 0, 0, 0)

    def monotone_run(self, p: dict) -> int | None:
        """Rows in runs of this length (None: all rows) over which lo and hi of every family
        never decrease: the tile builder then needs only each run's first and last row."""
        return None

    def uniform_tiles(self, p: dict, BM: int, BN: int) -> bool:
        """True when allowed(i, j) before the causal clause is one value over each aligned tile of
        BM rows and BN keys: a partial tile of such a list is partial only through the causal
        clause (or the end of the sequence), and a kernel needs dense's predicate there."""
        return False

    def make_table(self, T: int, p: dict):
        return None

    def strided(self, p: dict) -> tuple[int, str, dict] | None:
        """(r, inner pattern, its parameters) when allowed(i, j) holds only for i = j (mod r) and,
        on each residue class taken as a sequence of its own, equals the inner pattern; kernels
        then gather rows at stride r and work on dense tiles of the inner pattern."""
        return None

    def torch_table(self, T: int, p: dict, table, device):
        """What ``allowed`` reads in place of ``table`` when the indices are torch tensors."""
        return None

    # -- shared ------------------------------------------------------------------
    def defaults(self) -> dict:
        return {q.name: q.default for q in self.params}


def _tiles_divide(block, BM, BN) -> bool:
    """Every aligned BM x BN tile lies inside one block x block square."""
    return block % BM == 0 and block % BN == 0


def _window_lo_hi(i, T, W, causal):
    lo = i - W + 1
    hi = i + 1 if causal else i + W
    return np.maximum(lo, 0), np.minimum(hi, T)


class Dense(Pattern):
    name, pid = "dense", 0
    summary = "every key (causal: every earlier key)"

    def allowed(self, i, j, T, causal, p, table):
        if _is_torch(i) or _is_torch(j):
            return (i >= 0) & (j >= 0)  # every index in range
        return np.ones(np.broadcast(i, j).shape, dtype=bool)

    def row_counts(self, i, T, causal, p, table):
        return (i + 1) if causal else np.full_like(i, T)

    def intervals(self, i, T, causal, p, table, split):
        return np.zeros((1, i.size), np.int64), np.full((1, i.size), T, np.int64), [True]

    def uniform_tiles(self, p, BM, BN):
        return True


class Window(Pattern):
    name, pid = "window", 1
    params = (Param("window", 64, 1, "keys per side within distance < W"),)
    summary = "sliding window: |i - j| < W (causal: 0 <= i - j < W)"

    def allowed(self, i, j, T, causal, p, table):
        d = i - j
        return (d < p["window"]) & (d > -p["window"])

    def row_counts(self, i, T, causal, p, table):
        lo, hi = _window_lo_hi(i, T, p["window"], causal)
        return hi - lo

    def intervals(self, i, T, causal, p, table, split):
        lo, hi = _window_lo_hi(i, T, p["window"], causal)
        return lo[None], hi[None], [True]

    def device_params(self, p):
        return (p["window"], 0, 0, 0)


class Streaming(Pattern):
    name, pid = "streaming", 2
    params = (Param("sink", 16, 0, "attention-sink keys at the start"),
              Param("window", 64, 1, "sliding-window width"))
    summary = "attention sinks + sliding window: j < S or window(i, j)"

    def validate(self, T, p):
        if p["sink"] > T:
            raise BadInput(f"sink={p['sink']} exceeds T={T}: sink must be <= T")

    def allowed(self, i, j, T, causal, p, table):
        return (j < p["sink"]) | Window.allowed(self, i, j, T, causal, p, table)

    def row_counts(self, i, T, causal, p, table):
        lo, hi = _window_lo_hi(i, T, p["window"], causal)
        sinks = np.minimum(p["sink"], lo)  # sinks before the window
        if not causal:  # and, for early rows, sinks after it
            sinks = sinks + np.maximum(p["sink"] - hi, 0)
        return (hi - lo) + sinks

    def intervals(self, i, T, causal, p, table, split):
        lo, hi = _window_lo_hi(i, T, p["window"], causal)
        slo = np.zeros_like(i)
        shi = np.full_like(i, p["sink"])
        return np.stack([slo, lo]), np.stack([shi, hi]), [True, True]

    def device_params(self, p):
        return (p["sink"], p["window"], 0, 0)


class BlockDiagonal(Pattern):
    name, pid = "block_diagonal", 3
    params = (Param("block", 16, 1, "block size Bk; T must be a multiple"),)
    summary = "block-diagonal: i // Bk == j // Bk"

    def validate(self, T, p):
        if T % p["block"]:
            raise BadInput(f"T={T} is not a multiple of block={p['block']}")

    def allowed(self, i, j, T, causal, p, table):
        return (i // p["block"]) == (j // p["block"])

    def row_counts(self, i, T, causal, p, table):
        Bk = p["block"]
        return (i % Bk + 1) if causal else np.full_like(i, Bk)

    def intervals(self, i, T, causal, p, table, split):
        Bk = p["block"]
        lo = (i // Bk) * Bk
        return lo[None], (lo + Bk)[None], [True]

    def device_params(self, p):
        return (p["block"], 0, 0, 0)

    def uniform_tiles(self, p, BM, BN):
        return _tiles_divide(p["block"], BM, BN)


class Dilated(Pattern):
    name, pid = "dilated", 4
    params = (Param("window", 64, 1, "keys per side"),
              Param("dilation", 2, 1, "stride r between keys"))
    summary = "dilated window: d = i - j (or |i - j|), d < W*r and d % r == 0"

    def allowed(self, i, j, T, causal, p, table):
        d = abs(i - j)
        return (d < p["window"] * p["dilation"]) & (d % p["dilation"] == 0)

    def row_counts(self, i, T, causal, p, table):
        W, r = p["window"], p["dilation"]
        back = np.minimum(W - 1, i // r)
        if causal:
            return back + 1
        return back + 1 + np.minimum(W - 1, (T - 1 - i) // r)

    def intervals(self, i, T, causal, p, table, split):
        W, r = p["window"], p["dilation"]
        lo, hi = _window_lo_hi(i, T, (W - 1) * r + 1, causal)
        return lo[None], hi[None], [r == 1]

    def device_params(self, p):
        return (p["window"], p["dilation"], 0, 0)

    def strided(self, p):
        # i - j = r * (a - b) on one residue class: |a - b| < W, i.e. a window of W
        return (p["dilation"], "window", {"window": p["window"]}) if p["dilation"] > 1 else None


class BigBird(Pattern):
    name, pid = "bigbird", 5
    params = (Param("block", 64, 1, "block size Bk; T must be a multiple"),
              Param("window_blocks", 3, 1, "w: blocks with |qb - kb| <= w // 2"),
              Param("global_blocks", 1, 0, "g: first g blocks attend and are attended everywhere"),
              Param("random_blocks", 3, 0, "r: distinct random key blocks per query block"),
              Param("seed", 0, 0, "seed of numpy.random.default_rng for the random table"))
    summary = "BigBird: block window + global blocks + random blocks"

    def validate(self, T, p):
        if T % p["block"]:
            raise BadInput(f"T={T} is not a multiple of block={p['block']}")
        nb = T // p["block"]
        if p["random_blocks"] > nb:
            raise BadInput(f"random_blocks={p['random_blocks']} exceeds the {nb} key blocks of T={T}")

    def make_table(self, T, p):
        nb, r = T // p["block"], p["random_blocks"]
        rng = np.random.default_rng(p["seed"])
        table = np.empty((nb, max(r, 1)), dtype=np.int32)
        table[:] = -1
        for qb in range(nb):
            if r:
                table[qb, :r] = rng.choice(nb, size=r, replace=False)
        return table

    def block_mask(self, T, p, table):
        nb = T // p["block"]
        qb = np.arange(nb)[:, None]
        kb = np.arange(nb)[None, :]
        m = (np.abs(qb - kb) <= p["window_blocks"] // 2) | (qb < p["global_blocks"]) | (kb < p["global_blocks"])
        if p["random_blocks"]:
            m[np.repeat(np.arange(nb), p["random_blocks"]), table[:, :p["random_blocks"]].ravel()] = True
        return m

    def torch_table(self, T, p, table, device):
        import torch

        return torch.as_tensor(_bigbird_block_mask(self, T, _freeze(p), table), device=device)

    def allowed(self, i, j, T, causal, p, table):
        Bk = p["block"]
        # torch indices come with the block mask itself on their device (Mask.allowed)
        bm = table if _is_torch(table) else _bigbird_block_mask(self, T, _freeze(p), table)
        return bm[i // Bk, j // Bk]

    def row_counts(self, i, T, causal, p, table):
        Bk = p["block"]
        bm = _bigbird_block_mask(self, T, _freeze(p), table)
        qb = i // Bk
        if not causal:
            return bm.sum(axis=1)[qb] * Bk
        below = np.cumsum(bm, axis=1)  # below[qb, kb] = allowed blocks <= kb
        before = np.where(qb > 0, below[qb, np.maximum(qb - 1, 0)], 0)
        return before * Bk + (i % Bk) + 1

    def intervals(self, i, T, causal, p, table, split):
        Bk, w, g, r = p["block"], p["window_blocks"], p["global_blocks"], p["random_blocks"]
        qb = i // Bk
        lo = np.zeros((3 + r * split, i.size), np.int64)
        hi = np.zeros_like(lo)
        np.maximum(qb - w // 2, 0, out=lo[0])
        lo[0] *= Bk
        np.minimum(qb + w // 2 + 1, T // Bk, out=hi[0])
        hi[0] *= Bk
        hi[1] = g * Bk
        hi[2, qb < g] = T
        for k in range(r):
            start = table[qb, k] * Bk
            for s in range(split):
                f = 3 + k * split + s
                if split == 1:
                    lo[f] = start
                    hi[f] = start + Bk
                    continue
                mine = (qb % split) == s
                lo[f] = np.where(mine, start, 0)
                hi[f] = np.where(mine, start + Bk, 0)
        return lo, hi, [True] * lo.shape[0]

    def device_params(self, p):
        return (p["block"], p["window_blocks"], p["global_blocks"], p["random_blocks"])

    def uniform_tiles(self, p, BM, BN):
        return _tiles_divide(p["block"], BM, BN)  # a rule over whole blocks

    def monotone_run(self, p):
        return p["block"]  # every family is fixed within a block of rows, but for the causal clip


def _freeze(p: dict):
    return tuple(sorted(p.items()))


@functools.lru_cache(maxsize=16)
def _bigbird_block_mask_cached(T, frozen, table_bytes, shape):
    p = dict(frozen)
    table = np.frombuffer(table_bytes, dtype=np.int32).reshape(shape)
    return BigBird().block_mask(T, p, table)


def _bigbird_block_mask(pattern, T, frozen, table):
    return _bigbird_block_mask_cached(T, frozen, table.tobytes(), table.shape)


PATTERNS: dict[str, Pattern] = {pat.name: pat for pat in
                                (Dense(), Window(), Streaming(), BlockDiagonal(), Dilated(), BigBird())}


def pattern_label(name: str, params: dict) -> str:
    """``window(window=64)``: the parameters in the pattern's own order, the seed left out."""
    ps = ",".join(f"{q.name}={params[q.name]}" for q in get_pattern(name).params
                  if q.name != "seed" and q.name in params)
    return f"{name}({ps})" if ps else name


def get_pattern(name: str) -> Pattern:
    try:
        return PATTERNS[name]
    except KeyError:
        raise BadInput(f"pattern={name!r} is unknown: choose one of {', '.join(PATTERNS)}") from None


@dataclass(frozen=True, eq=False)
class Mask:
    """A pattern at a given T, causal flag and parameters, validated."""
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
        table = self._torch_table(i.device) if _is_torch(i) else self.table
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
        if device is not None and self.table is not None:
            import torch

            self._torch_table(torch.device(device))

        def mask_mod(b, h, q_idx, kv_idx):
            return self.allowed(q_idx, kv_idx)

        return mask_mod

    def dense(self, rows=None) -> np.ndarray:
        """Boolean mask [len(rows), T] for the given rows (all rows by default)."""
        i = np.arange(self.T) if rows is None else np.asarray(rows)
        return self.allowed(i[:, None], np.arange(self.T)[None, :])

    def row_counts(self) -> np.ndarray:
        i = np.arange(self.T, dtype=np.int64)
        return np.asarray(self.pattern.row_counts(i, self.T, self.causal, self.params, self.table), np.int64)

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
        return pattern_label(self.pattern.name, self.params)

    def strided(self) -> tuple[int, "Mask"]:
        """(r, inner): position i belongs to residue class i % r and is row or key i // r of
        that class, a sequence of ceil((T - i % r) / r) positions; ``inner`` is the mask of
        every class, built at the longest, ceil(T / r). (1, self) for a pattern with no
        stride."""
        s = self.pattern.strided(self.params)
        if s is None:
            return 1, self
        r, name, params = s
        return r, make_mask(name, -(-self.T // r), self.causal, **params)

    def device_params(self) -> tuple[int, ...]:
        return (self.pattern.pid, int(self.causal)) + tuple(int(x) for x in self.pattern.device_params(self.params))

    def tile_predicate(self, BM: int, BN: int) -> "Mask":
        """The mask whose device predicate a kernel needs on the partial tiles of this mask's
        BM x BN list: itself, or dense with the same causal flag when the pattern is uniform over
        such tiles (``Pattern.uniform_tiles``: BigBird and block-diagonal with blocks that the
        tiles divide), which leaves only the causal clause (and j < T) to test."""
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
        """The list of key tiles each BM-row query tile visits (``attnbench.tiles``), built now."""
        from .tiles import build

        return build(self, BM, BN)


def make_mask(pattern: str, T: int, causal: bool = True, **params) -> Mask:
    """Validate a pattern at T and return its Mask; raises BadInput naming the parameter."""
    pat = get_pattern(pattern)
    if not isinstance(T, (int, np.integer)) or T < 1:
        raise BadInput(f"T={T} must be a positive integer")
    known = {q.name for q in pat.params}
    extra = sorted(k for k, v in params.items() if v is not None and k not in known)
    if extra:
        raise BadInput(f"pattern {pat.name!r} takes no parameter {', '.join(extra)}"
                       f" (it takes: {', '.join(sorted(known)) or 'none'})")
    p = pat.defaults()
    for q in pat.params:
        v = params.get(q.name)
        if v is not None:
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
                raise BadInput(f"{q.name}={v!r} must be an integer")
            p[q.name] = int(v)
        if p[q.name] < q.minimum:
            raise BadInput(f"{q.name}={p[q.name]} is below its minimum {q.minimum}")
    pat.validate(int(T), p)
    table = pat.make_table(int(T), p)
    return Mask(pat, int(T), bool(causal), p, table)


def replace_T(mask: Mask, T: int) -> Mask:
    """The same pattern and parameters at another T."""
    return make_mask(mask.pattern.name, T, mask.causal, **mask.params)


__all__ = ["BadInput", "Param", "Pattern", "PATTERNS", "get_pattern", "Mask", "make_mask",
           "replace_T"]
