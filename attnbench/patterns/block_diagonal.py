"""block_diagonal: i // Bk == j // Bk. Device predicate: kernels/patterns/block_diagonal.cuh."""
import numpy as np

from .base import BadInput, Param, Pattern, divisors_of, tiles_divide


class BlockDiagonal(Pattern):
    name = "block_diagonal"
    params = (Param("block", 16, 1, "block size Bk; T must be a multiple"),)
    summary = "block-diagonal: i // Bk == j // Bk"
    default_causal = False  # blocks attend both ways, as encoders and packed documents do

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

    def uniform_tiles(self, p, BM, BN):
        return tiles_divide(p["block"], BM, BN)

    def examples(self, T):
        return [{"block": b} for b in divisors_of(T, (16, 20, 8, 1))[:2]]
