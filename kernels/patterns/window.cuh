// window: |i - j| < W (causal: 0 <= i - j < W). Mirrors attnbench/patterns/window.py.
#pragma once
#include "common.cuh"

struct ab_window {
    int causal;
    int window;
    __device__ __forceinline__ bool allowed(int i, int j) const { return ab_in_window(i - j, window, causal); }
    __device__ __forceinline__ unsigned bits(int i, int j0) const {
        const int r = i - j0;
        return ab_span(r - window + 1, causal ? r : r + window - 1);
    }
    template <class F>
    __device__ __forceinline__ void keys(int i, int T, F&& push) const {
        const int hi = causal ? i : min(T - 1, i + window - 1);
        for (int j = max(0, i - window + 1); j <= hi; ++j) push(j);
    }
};
