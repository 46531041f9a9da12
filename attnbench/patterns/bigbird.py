"""bigbird: block window + global blocks + random blocks, a rule over whole key blocks.
Device predicate: kernels/patterns/bigbird.cuh (the random blocks come as a table)."""
from __future__ import annotations

import functools

import numpy as np

from .base import BadInput, Param, Pattern, divisors_of, is_torch, tiles_divide


BLOCK_MASK_LIMIT = 1 << 32  # bytes of the [T / block]^2 boolean block mask the reference and counts use


class BigBird(Pattern):
    name = "bigbird"
    params = (Param("block", 64, 1, "block size Bk; T must be a multiple"),
              Param("window_blocks", 3, 1, "w: blocks with |qb - kb| <= w // 2"),
              Param("global_blocks", 1, 0, "g: first g blocks attend and are attended everywhere"),
              Param("random_blocks", 3, 0, "r: distinct random key blocks per query block"),
              Param("seed", 0, 0, "seed of numpy.random.default_rng for the random table",
                    option="mask-seed", column=False))
    summary = "BigBird: block window + global blocks + random blocks"
    short, short_key = "{block}:{window_blocks}+{global_blocks}+{random_blocks}", "block:window+global+random blocks"
    uses_table = True

    def validate(self, T, p):
        if T % p["block"]:
            raise BadInput(f"T={T} is not a multiple of block={p['block']}")
        nb = T // p["block"]
        if p["random_blocks"] > nb:
            raise BadInput(f"random_blocks={p['random_blocks']} exceeds the {nb} key blocks of T={T}")
        if nb * nb > BLOCK_MASK_LIMIT:
            raise BadInput(f"bigbird at T={T} with block={p['block']} has {nb} key blocks: its block mask of "
                           f"{nb} x {nb} bytes is above {BLOCK_MASK_LIMIT >> 30} GiB (take a larger block)")

    def examples(self, T):
        out = []
        for b in divisors_of(T, (64, 20, 8, 1))[:2]:
            out.append({"block": b, "random_blocks": min(3, T // b)})
        return out

    def device_args(self, p):
        return (p["block"], p["window_blocks"], p["global_blocks"], p["random_blocks"])  # the seed made the table

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

        return torch.as_tensor(_block_mask(T, p, table), device=device)

    def allowed(self, i, j, T, causal, p, table):
        Bk = p["block"]
        # torch indices come with the block mask itself on their device (Mask.allowed)
        bm = table if is_torch(table) else _block_mask(T, p, table)
        return bm[i // Bk, j // Bk]

    def row_counts(self, i, T, causal, p, table):
        Bk = p["block"]
        bm = _block_mask(T, p, table)
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

    def uniform_tiles(self, p, BM, BN):
        return tiles_divide(p["block"], BM, BN)  # a rule over whole blocks

    def monotone_run(self, p):
        return p["block"]  # every family is fixed within a block of rows, but for the causal clip


@functools.lru_cache(maxsize=16)
def _block_mask_cached(T, frozen, table_bytes, shape):
    table = np.frombuffer(table_bytes, dtype=np.int32).reshape(shape)
    return BigBird().block_mask(T, dict(frozen), table)


def _block_mask(T, p, table):
    return _block_mask_cached(T, tuple(sorted(p.items())), table.tobytes(), table.shape)
