// custom: a pattern from one boolean expression over i, j, T and named integers. Mirrors
// attnbench/patterns/custom.py: the expression comes as the C text AB_CUSTOM_EXPR (Bound.c of
// attnbench/patterns/expr.py), over long long ab_i and ab_j, T and the parameters as literals.
// Every value it computes stays within 2^62 for 0 <= i, j < T + 64 (checked on the host), so
// 64-bit arithmetic here gives what numpy's int64 gives there. The divisors of // and % are
// constants above 0 (checked on the host); the helpers floor as Python does.
//
// bits(i, j0), the partial tiles' predicate, comes as the C text AB_CUSTOM_BITS (Bound.c_bits,
// attnbench/patterns/expr_bits.py): the expression's &, | and ~ as AND, OR and NOT of 32-bit words,
// each comparison one word over int ab_i, ab_j0: a span of keys from its bound (ab_cmp_word,
// ab_div_word), every key or none (ab_rows_word), or, for any other comparison, the comparison at
// each of the 32 keys (AB_EACH). A comparison is computed in int when the host has shown that its
// values stay below 2^29, else in 64-bit. Without AB_CUSTOM_BITS, bits evaluates AB_CUSTOM_EXPR
// 32 times.
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

__device__ __forceinline__ int ab_floordiv32(int a, int d) {  // d > 0
    const int q = a / d;
    return q - (int)((q * d != a) & (a < 0));
}
// (ab_floormod32, also dilated's residue, is in common.cuh)
__device__ __forceinline__ int ab_min32(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ int ab_max32(int a, int b) { return a < b ? b : a; }
__device__ __forceinline__ int ab_abs32(int a) { return a < 0 ? -a : a; }

__device__ __forceinline__ bool ab_custom_expr(long long ab_i, long long ab_j) { return AB_CUSTOM_EXPR; }

// ---- the bits form: one 32-bit word per comparison, bit b for key j0 + b --------------------------
enum { AB_LT, AB_LE, AB_GT, AB_GE, AB_EQ, AB_NE };

// (ab_span_from, ab_span_to: common.cuh)

// v of a comparison (|v| < 2^30 in int; a 64-bit one clamped to -64 .. 64, which keeps its place
// against 0 .. 31)
__device__ __forceinline__ int ab_clamp_word(int v) { return v; }
__device__ __forceinline__ int ab_clamp_word(long long v) { return (int)(v < -64 ? -64LL : (v > 64 ? 64LL : v)); }

// the bits b = 0 .. 31 with b OP v
template <int OP>
__device__ __forceinline__ unsigned ab_cmp_word(int v) {
    if (OP == AB_LT) return ab_span_to(v - 1);
    if (OP == AB_LE) return ab_span_to(v);
    if (OP == AB_GT) return ab_span_from(v + 1);
    if (OP == AB_GE) return ab_span_from(v);
    const unsigned one = ab_shl(1u, (unsigned)v);  // a negative v is 2^31 or more as unsigned: 0
    return OP == AB_EQ ? one : ~one;
}

template <class I>
__device__ __forceinline__ I ab_clamp_i(I x, I lo, I hi) { return x < lo ? lo : (x > hi ? hi : x); }

// the bits b = 0 .. 31 at which q(b) OP q(0) + n, for q(b) = (x0 + S b) // k, r0 = x0 mod k, k > 0.
// S = 1: q(b) - q(0) reaches m from b = m k - r0 on; S = -1: it falls below m from b = r0 - m k + 1
// on; m clamped where the bound is past 0 .. 31 anyway (so m k stays small), the bound to -1 .. 33.
template <int OP, int S, class I>
__device__ __forceinline__ unsigned ab_div_word(I n, I r0, I k) {
    int lo, hi;  // the word: bits lo .. hi (NE: the others)
    if (S > 0) {
        const I top = 32 / k + 2;
        const int u0 = (int)ab_clamp_i<I>(ab_clamp_i<I>(n, 0, top) * k - r0, -1, 33);
        const int u1 = (int)ab_clamp_i<I>(ab_clamp_i<I>(n + 1, 0, top) * k - r0, -1, 33);
        lo = (OP == AB_LT || OP == AB_LE) ? 0 : (OP == AB_GT ? u1 : u0);
        hi = OP == AB_LT ? u0 - 1 : ((OP == AB_GT || OP == AB_GE) ? 31 : u1 - 1);
    } else {
        const I bottom = -(32 / k + 1);
        const int l0 = (int)ab_clamp_i<I>(r0 - ab_clamp_i<I>(n, bottom, 1) * k + 1, -1, 33);
        const int l1 = (int)ab_clamp_i<I>(r0 - ab_clamp_i<I>(n + 1, bottom, 1) * k + 1, -1, 33);
        lo = OP == AB_LT ? l0 : ((OP == AB_GT || OP == AB_GE) ? 0 : l1);
        hi = (OP == AB_LT || OP == AB_LE) ? 31 : (OP == AB_GE ? l0 - 1 : (OP == AB_GT ? l1 - 1 : l0 - 1));
    }
    const unsigned w = (lo <= 0 ? 0xffffffffu : ab_span_from(lo)) & (hi >= 31 ? 0xffffffffu : ab_span_to(hi));
    return OP == AB_NE ? ~w : w;
}

// every bit or none: a comparison of i alone
__device__ __forceinline__ unsigned ab_rows_word(bool c) { return 0u - (unsigned)c; }

// any other comparison, at each key (ab_j; over ab_i, ab_j0 of the enclosing ab_custom_bits)
#define AB_EACH(cond) ([&]() -> unsigned {                                   \
    unsigned ab_m = 0;                                                        \
    _Pragma("unroll 4") for (int ab_b = 0; ab_b < 32; ++ab_b) {              \
        const int ab_j = ab_j0 + ab_b;                                        \
        ab_m |= (unsigned)(bool)(cond) << ab_b;                               \
    }                                                                         \
    return ab_m;                                                              \
}())

#ifdef AB_CUSTOM_BITS
__device__ __forceinline__ unsigned ab_custom_bits(int ab_i, int ab_j0) { return AB_CUSTOM_BITS; }
#else
__device__ __forceinline__ unsigned ab_custom_bits(int ab_i, int ab_j0) {
    unsigned m = 0;
#pragma unroll 4
    for (int b = 0; b < 32; ++b) m |= (unsigned)ab_custom_expr(ab_i, ab_j0 + b) << b;
    return m;
}
#endif

struct ab_custom {
    int causal;
    __device__ __forceinline__ bool allowed(int i, int j) const {
        return ab_custom_expr(i, j) & ab_before(causal, i - j);
    }
    __device__ __forceinline__ unsigned bits(int i, int j0) const { return ab_custom_bits(i, j0); }
    template <class F>
    __device__ __forceinline__ void keys(int i, int T, F&& push) const {
        const int hi = causal ? i : T - 1;
        for (int j = 0; j <= hi; ++j)
            if (ab_custom_expr(i, j)) push(j);
    }
};
