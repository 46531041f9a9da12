// block_diagonal: i // Bk == j // Bk. Mirrors attnbench/patterns/block_diagonal.py.
#pragma once
#include "common.cuh"

struct ab_block_diagonal {
    int causal;
    int block;
    __device__ __forceinline__ bool allowed(int i, int j) const {
        return ((i / block) == (j / block)) & ab_before(causal, i - j);
    }
    __device__ __forceinline__ unsigned bits(int i, int j0) const {
        const int b0 = (i / block) * block - j0;
        return ab_span(b0, b0 + block - 1);
    }
    template <class F>
    __device__ __forceinline__ void keys(int i, int T, F&& push) const {
        const int b0 = (i / block) * block;
        for (int j = b0; j < min(T, b0 + block); ++j) push(j);
    }
};
