// prefix_lm: a bidirectional prefix of P tokens, causal after: j < P or j <= i. Mirrors
// attnbench/patterns/prefix_lm.py.
#pragma once
#include "common.cuh"

struct ab_prefix_lm {
    int causal;
    int prefix;
    __device__ __forceinline__ bool allowed(int i, int j) const {
        return ((j < prefix) | (j <= i)) & ab_before(causal, i - j);
    }
    __device__ __forceinline__ unsigned bits(int i, int j0) const {
        return ab_span(-j0, max(i, prefix - 1) - j0);
    }
    template <class F>
    __device__ __forceinline__ void keys(int i, int T, F&& push) const {
        const int hi = causal ? i : min(T - 1, max(i, prefix - 1));
        for (int j = 0; j <= hi; ++j) push(j);
    }
};
