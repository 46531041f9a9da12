// custom: a pattern from one boolean expression over i, j, T and named integers. Mirrors
// attnbench/patterns/custom.py: the expression comes as the C text AB_CUSTOM_EXPR (Bound.c of
// attnbench/patterns/expr.py), over long long ab_i and ab_j, T and the parameters as literals.
// Every value it computes stays within 2^62 for 0 <= i, j < T + 64 (checked on the host), so
// 64-bit arithmetic here gives what numpy's int64 gives there. The divisors of // and % are
// constants above 0 (checked on the host); the helpers floor as Python does.
#pragma once
#include "common.cuh"

#ifndef AB_CUSTOM_EXPR
#error "AB_CUSTOM_EXPR must be defined: the custom pattern's expression (Mask.device_defines)"
#endif

__device__ __forceinline__ long long ab_floordiv(long long a, long long d) {  // d > 0
    const long long q = a / d;
    return q - (long long)((q * d != a) & (a < 0));
}
__device__ __forceinline__ long long ab_floormod(long long a, long long d) {  // d > 0: in [0, d)
    const long long r = a % d;
    return r < 0 ? r + d : r;
}
__device__ __forceinline__ long long ab_min64(long long a, long long b) { return a < b ? a : b; }
__device__ __forceinline__ long long ab_max64(long long a, long long b) { return a < b ? b : a; }
__device__ __forceinline__ long long ab_abs64(long long a) { return a < 0 ? -a : a; }

__device__ __forceinline__ bool ab_custom_expr(long long ab_i, long long ab_j) { return AB_CUSTOM_EXPR; }

struct ab_custom {
    int causal;
    __device__ __forceinline__ bool allowed(int i, int j) const {
        return ab_custom_expr(i, j) & ab_before(causal, i - j);
    }
    __device__ __forceinline__ unsigned bits(int i, int j0) const {
        unsigned m = 0;
#pragma unroll 4
        for (int b = 0; b < 32; ++b) m |= (unsigned)ab_custom_expr(i, j0 + b) << b;
        return m;
    }
    template <class F>
    __device__ __forceinline__ void keys(int i, int T, F&& push) const {
        const int hi = causal ? i : T - 1;
        for (int j = 0; j <= hi; ++j)
            if (ab_custom_expr(i, j)) push(j);
    }
};
