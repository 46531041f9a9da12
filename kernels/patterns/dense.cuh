// dense: every key (causal: every earlier key). Mirrors attnbench/patterns/dense.py.
#pragma once
#include "common.cuh"

struct ab_dense {
    int causal;
    __device__ __forceinline__ bool allowed(int i, int j) const { return ab_before(causal, i - j); }
    __device__ __forceinline__ unsigned bits(int i, int j0) const { return 0xffffffffu; }
    template <class F>
    __device__ __forceinline__ void keys(int i, int T, F&& push) const {
        for (int j = 0; j < (causal ? i + 1 : T); ++j) push(j);
    }
};
