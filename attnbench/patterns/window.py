"""window: |i - j| < W (causal: 0 <= i - j < W). Device predicate: kernels/patterns/window.cuh."""
from .base import Param, Pattern, window_lo_hi


class Window(Pattern):
    name = "window"
    params = (Param("window", 64, 1, "keys per side within distance < W"),)
    summary = "sliding window: |i - j| < W (causal: 0 <= i - j < W)"

    def allowed(self, i, j, T, causal, p, table):
        d = i - j
        return (d < p["window"]) & (d > -p["window"])

    def row_counts(self, i, T, causal, p, table):
        lo, hi = window_lo_hi(i, T, p["window"], causal)
        return hi - lo

    def intervals(self, i, T, causal, p, table, split):
        lo, hi = window_lo_hi(i, T, p["window"], causal)
        return lo[None], hi[None], [True]

    def examples(self, T):
        return [{}, {"window": 1}, {"window": 33}]
