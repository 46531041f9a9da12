// document: packed documents, i and j in one document (and |i - j| < W when W > 0). Mirrors
// attnbench/patterns/document.py; the table holds each position's document as [T][2] int32
// (start, end exclusive).
#pragma once
#include "common.cuh"

struct ab_document {
    int causal;
    int window;
    const int* table;
    __device__ __forceinline__ bool allowed(int i, int j) const {
        const int s = table[2 * i], e = table[2 * i + 1];
        const bool near = window == 0 || ab_in_window(i - j, window, causal);
        return (j >= s) & (j < e) & ab_before(causal, i - j) & near;
    }
    __device__ __forceinline__ unsigned bits(int i, int j0) const {
        const int s = table[2 * i], e = table[2 * i + 1];
        unsigned m = ab_span(s - j0, e - 1 - j0);
        if (window) m &= ab_span(i - window + 1 - j0, (causal ? i : i + window - 1) - j0);
        return m;
    }
    template <class F>
    __device__ __forceinline__ void keys(int i, int T, F&& push) const {
        int lo = table[2 * i], hi = causal ? i : table[2 * i + 1] - 1;
        if (window) {
            lo = max(lo, i - window + 1);
            hi = min(hi, i + window - 1);
        }
        for (int j = lo; j <= hi; ++j) push(j);
    }
};
