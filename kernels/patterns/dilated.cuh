// dilated: d = i - j (or |i - j|), d < W*r and d % r == 0. Mirrors attnbench/patterns/dilated.py.
// (The fast kernels run dilation > 1 as a window over each residue class: Mask.strided.)
#pragma once
#include "common.cuh"

struct ab_dilated {
    int causal;
    int window;
    int dilation;
    __device__ __forceinline__ bool allowed(int i, int j) const {
        const int a = ab_abs(i - j);
        return (a < window * dilation) & ((a % dilation) == 0) & ab_before(causal, i - j);
    }
    __device__ __forceinline__ unsigned bits(int i, int j0) const {
        const int r = i - j0;
        if (dilation == 1) return ab_span(r - window + 1, causal ? r : r + window - 1);
        unsigned m = 0;
        for (int b = 0; b < 32; ++b) m |= (unsigned)allowed(i, j0 + b) << b;
        return m;
    }
    template <class F>
    __device__ __forceinline__ void keys(int i, int T, F&& push) const {
        for (int m = window - 1; m >= 1; --m) {  // behind, farthest first
            const int j = i - m * dilation;
            if (j >= 0) push(j);
        }
        push(i);
        if (!causal)
            for (int m = 1; m < window; ++m) {
                const int j = i + m * dilation;
                if (j < T) push(j);
            }
    }
};
