// Shared device helpers for every attnbench kernel family.
//
// The pattern predicate below mirrors attnbench/patterns.py (SPEC section 2); the pattern ids
// and the meaning of p0..p3 are those of Pattern.device_params(). No CUDA headers are included,
// so the same source compiles through NVRTC with or without a device.
#pragma once

#define AB_DENSE 0
#define AB_WINDOW 1
#define AB_STREAMING 2
#define AB_BLOCK_DIAGONAL 3
#define AB_DILATED 4
#define AB_BIGBIRD 5

// Everything a kernel needs to evaluate allowed(i, j).
struct ABPattern {
    int pid;      // pattern id
    int causal;   // 1: also require j <= i
    int p0, p1, p2, p3;
    const int* table;  // bigbird: random key blocks, [T / block][max(1, r)] int32
};

#define AB_NEG_INF (-__int_as_float(0x7f800000))

__device__ __forceinline__ int ab_abs(int x) { return x < 0 ? -x : x; }

// |d| < W (causal: 0 <= d < W) in one unsigned comparison, for any W >= 1 and |d| < 2^31 - W.
__device__ __forceinline__ bool ab_in_window(int d, int W, int causal) {
    return causal ? (unsigned)d < (unsigned)W
                  : (unsigned)d + (unsigned)(W - 1) < 2u * (unsigned)W - 1u;
}

// BigBird's block-level rule: key block kb is allowed to query block qb (before the causal clause).
__device__ __forceinline__ bool ab_bigbird_block(const ABPattern& p, int qb, int kb) {
    if (ab_abs(qb - kb) <= p.p1 / 2 || qb < p.p2 || kb < p.p2) return true;
    const int stride = p.p3 > 0 ? p.p3 : 1;
    for (int r = 0; r < p.p3; ++r)
        if (p.table[qb * stride + r] == kb) return true;
    return false;
}

// allowed(i, j) for 0 <= i, j < T. Written without branches (bitwise & and |) so that, with the
// pattern compiled in, a tile of predicates becomes a few integer instructions per element.
__device__ __forceinline__ bool ab_allowed(const ABPattern& p, int i, int j) {
    const int d = i - j;
    const bool before = !p.causal | (d >= 0);  // the causal clause
    switch (p.pid) {
    case AB_DENSE:
        return before;
    case AB_WINDOW:  // p0 = W
        return ab_in_window(d, p.p0, p.causal);
    case AB_STREAMING:  // p0 = S, p1 = W
        return ((j < p.p0) & before) | ab_in_window(d, p.p1, p.causal);
    case AB_BLOCK_DIAGONAL:  // p0 = Bk
        return ((i / p.p0) == (j / p.p0)) & before;
    case AB_DILATED: {  // p0 = W, p1 = r
        const int a = ab_abs(d);
        return (a < p.p0 * p.p1) & ((a % p.p1) == 0) & before;
    }
    case AB_BIGBIRD:  // p0 = Bk, p1 = w, p2 = g, p3 = r
        return before && ab_bigbird_block(p, i / p.p0, j / p.p0);
    }
    return false;
}

// Bits lo .. hi (clamped to 0 .. 31; none when lo > hi) of a 32-bit word. PTX shifts by 32 or
// more give 0, so no comparison is needed: ~0 << lo keeps bits >= lo, ~0 >> (31 - hi) bits <= hi.
// The PTX shifts (any count; 32 or more gives 0), opaque to the compiler's rewriting of shifts.
__device__ __forceinline__ unsigned ab_shl(unsigned x, unsigned n) {
    unsigned y;
    asm("shl.b32 %0, %1, %2;" : "=r"(y) : "r"(x), "r"(n));
    return y;
}
__device__ __forceinline__ unsigned ab_shr(unsigned x, unsigned n) {
    unsigned y;
    asm("shr.b32 %0, %1, %2;" : "=r"(y) : "r"(x), "r"(n));
    return y;
}

__device__ __forceinline__ unsigned ab_span(int lo, int hi) {
    return ab_shl(0xffffffffu, (unsigned)max(lo, 0)) & ab_shr(0xffffffffu, (unsigned)(31 - min(hi, 31)));
}

// allowed(i, j0 + b) for b = 0 .. 31 as bit b, for 0 <= i < T and j0 >= 0 (keys >= T are the
// caller's to clear when the pattern is not causal): the predicate above a row at a time, each
// pattern as the key intervals it allows (streaming: sink and window; BigBird: one per allowed key
// block), so a kernel pays a few instructions a row instead of a few an element.
__device__ __forceinline__ unsigned ab_allowed_bits(const ABPattern& p, int i, int j0) {
    const int r = i - j0;  // the row, relative to j0
    const int back = p.causal ? r : r + p.p0 - 1;
    unsigned m = 0;
    switch (p.pid) {
    case AB_DENSE:
        m = 0xffffffffu;
        break;
    case AB_WINDOW:
        m = ab_span(r - p.p0 + 1, back);
        break;
    case AB_STREAMING:
        m = ab_span(-j0, p.p0 - 1 - j0) | ab_span(r - p.p1 + 1, p.causal ? r : r + p.p1 - 1);
        break;
    case AB_BLOCK_DIAGONAL: {
        const int b0 = (i / p.p0) * p.p0 - j0;
        m = ab_span(b0, b0 + p.p0 - 1);
        break;
    }
    case AB_DILATED:
        if (p.p1 == 1) {
            m = ab_span(r - p.p0 + 1, back);
        } else {
            for (int b = 0; b < 32; ++b) m |= (unsigned)ab_allowed(p, i, j0 + b) << b;
        }
        break;
    case AB_BIGBIRD: {
        const int qb = i / p.p0;
        for (int kb = j0 / p.p0; kb <= (j0 + 31) / p.p0; ++kb)
            if (ab_bigbird_block(p, qb, kb)) m |= ab_span(kb * p.p0 - j0, kb * p.p0 + p.p0 - 1 - j0);
        break;
    }
    }
    return p.causal ? m & ab_span(0, r) : m;
}

// ---- 16-bit float conversions without cuda_fp16.h / cuda_bf16.h ---------------------------
// bfloat16 and float16 travel as unsigned short bit patterns.
__device__ __forceinline__ float ab_bf16_to_f32(unsigned short h) {
    return __uint_as_float(((unsigned int)h) << 16);
}
__device__ __forceinline__ float ab_f16_to_f32(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
// Two floats into one register of two 16-bit values (lo in the low half), round to nearest even.
__device__ __forceinline__ unsigned int ab_pack_bf16(float lo, float hi) {
    unsigned int r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ unsigned int ab_pack_f16(float lo, float hi) {
    unsigned int r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
