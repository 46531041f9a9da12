"""dense: every key (causal: every earlier key). Device predicate: kernels/patterns/dense.cuh."""
import numpy as np

from .base import Pattern, is_torch


class Dense(Pattern):
    name = "dense"
    summary = "every key (causal: every earlier key)"

    def allowed(self, i, j, T, causal, p, table):
        if is_torch(i) or is_torch(j):
            return (i >= 0) & (j >= 0)  # every index in range
        return np.ones(np.broadcast(i, j).shape, dtype=bool)

    def row_counts(self, i, T, causal, p, table):
        return (i + 1) if causal else np.full_like(i, T)

    def intervals(self, i, T, causal, p, table, split):
        return np.zeros((1, i.size), np.int64), np.full((1, i.size), T, np.int64), [True]

    def uniform_tiles(self, p, BM, BN):
        return True
