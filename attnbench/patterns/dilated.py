"""dilated: d = i - j (or |i - j|), d < W*r and d % r == 0. Device predicate:
kernels/patterns/dilated.cuh. Strided: each residue class mod r is a window of W."""
import numpy as np

from .base import Param, Pattern, window_lo_hi


class Dilated(Pattern):
    name = "dilated"
    params = (Param("window", 64, 1, "keys per side"),
              Param("dilation", 2, 1, "stride r between keys"))
    summary = "dilated window: d = i - j (or |i - j|), d < W*r and d % r == 0"
    short, short_key = "{window}/{dilation}", "window/dilation"

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
        lo, hi = window_lo_hi(i, T, (W - 1) * r + 1, causal)
        return lo[None], hi[None], [r == 1]

    def strided(self, p):
        # i - j = r * (a - b) on one residue class: |a - b| < W, i.e. a window of W
        return (p["dilation"], "window", {"window": p["window"]}) if p["dilation"] > 1 else None

    def examples(self, T):
        return [{}, {"window": 7, "dilation": 3}, {"window": 40, "dilation": 1}]
