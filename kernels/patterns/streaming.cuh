// streaming: attention sinks + sliding window, j < S or |i - j| < W. Mirrors
// attnbench/patterns/streaming.py.
#pragma once
#include "common.cuh"

struct ab_streaming {
    int causal;
    int sink;
    int window;
    __device__ __forceinline__ bool allowed(int i, int j) const {
        return ((j < sink) & ab_before(causal, i - j)) | ab_in_window(i - j, window, causal);
    }
    __device__ __forceinline__ unsigned bits(int i, int j0) const {
        const int r = i - j0;
        return ab_span(-j0, sink - 1 - j0) | ab_span(r - window + 1, causal ? r : r + window - 1);
    }
    // the sinks, then the window, as the seed does
    template <class F>
    __device__ __forceinline__ void keys(int i, int T, F&& push) const {
        const int lo = max(0, i - window + 1);
        const int hi = causal ? i : min(T - 1, i + window - 1);
        for (int j = 0; j < min(sink, lo); ++j) push(j);  // sinks before the window
        for (int j = lo; j <= hi; ++j) push(j);           // the window
        for (int j = hi + 1; j < sink; ++j) push(j);      // sinks after it (non-causal)
    }
};
