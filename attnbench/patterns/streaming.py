"""streaming: attention sinks + sliding window, j < S or |i - j| < W.
Device predicate: kernels/patterns/streaming.cuh."""
import numpy as np

from .base import BadInput, Param, Pattern, window_lo_hi


class Streaming(Pattern):
    name = "streaming"
    params = (Param("sink", 16, 0, "attention-sink keys at the start"),
              Param("window", 64, 1, "sliding-window width"))
    summary = "attention sinks + sliding window: j < S or window(i, j)"
    short, short_key = "{sink}+{window}", "sink+window"

    def validate(self, T, p):
        if p["sink"] > T:
            raise BadInput(f"sink={p['sink']} exceeds T={T}: sink must be <= T")

    def allowed(self, i, j, T, causal, p, table):
        d = i - j
        return (j < p["sink"]) | ((d < p["window"]) & (d > -p["window"]))

    def row_counts(self, i, T, causal, p, table):
        lo, hi = window_lo_hi(i, T, p["window"], causal)
        sinks = np.minimum(p["sink"], lo)  # sinks before the window
        if not causal:  # and, for early rows, sinks after it
            sinks = sinks + np.maximum(p["sink"] - hi, 0)
        return (hi - lo) + sinks

    def intervals(self, i, T, causal, p, table, split):
        lo, hi = window_lo_hi(i, T, p["window"], causal)
        slo = np.zeros_like(i)
        shi = np.full_like(i, p["sink"])
        return np.stack([slo, lo]), np.stack([shi, hi]), [True, True]

    def examples(self, T):
        return [{"sink": min(16, T)}, {"sink": min(4, T), "window": 33}, {"sink": min(100, T), "window": 7}]
