"""prefix_lm: a bidirectional prefix of P tokens, causal after: j < P or j <= i (run it with the
causal flag off; on, it is dense causal). Device predicate: kernels/patterns/prefix_lm.cuh."""
import numpy as np

from .base import Param, Pattern


class PrefixLM(Pattern):
    name = "prefix_lm"
    params = (Param("prefix", 256, 0, "prefix length P, attended both ways"),)
    summary = "prefix LM: j < P or j <= i (the prefix attends both ways, the rest causally)"
    default_causal = False

    def allowed(self, i, j, T, causal, p, table):
        return (j < p["prefix"]) | (j <= i)

    def row_counts(self, i, T, causal, p, table):
        if causal:
            return i + 1
        return np.maximum(i + 1, min(p["prefix"], T))

    def intervals(self, i, T, causal, p, table, split):
        return np.zeros((1, i.size), np.int64), np.maximum(i + 1, p["prefix"])[None], [True]

    def examples(self, T):
        return [{"prefix": min(256, T)}, {"prefix": T // 3}, {"prefix": 0}]
