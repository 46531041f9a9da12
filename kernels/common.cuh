// Shared device helpers for every attnbench kernel family.
//
// A pattern's device predicate is a struct of its own, ab_<name> in kernels/patterns/<name>.cuh,
// compiled into a kernel by name: compile.py sets AB_PATTERN_T (the struct) and AB_PATTERN_ARGS (its
// initialiser: `causal`, then the fields of Pattern.device_args(), then `table` for a pattern that
// reads one) and expands `#include "pattern.cuh"` into that file. Every such struct has
//   int causal;                        first field: also require j <= i
//   bool allowed(int i, int j)         the predicate for 0 <= i, j < T, causal clause included
//   unsigned bits(int i, int j0)       allowed(i, j0 + b) as bit b for b = 0 .. 31, before the causal
//                                      clause (ab_allowed_bits applies it: with it, keys past the row
//                                      may come set or not); keys >= T are the caller's
//   void keys(int i, int T, push)      push(j) for the allowed keys of row i, in the seed's order
// No CUDA headers are included, so the same source compiles through NVRTC with or without a device.
#pragma once

#define AB_NEG_INF __int_as_float(0xff800000)  // -inf, the one spelling every kernel uses

__device__ __forceinline__ int ab_abs(int x) { return x < 0 ? -x : x; }

// the causal clause for d = i - j: always true when the pattern is not causal
__device__ __forceinline__ bool ab_before(int causal, int d) { return !causal | (d >= 0); }

// |d| < W (causal: 0 <= d < W) in one unsigned comparison, for any W >= 1 and |d| < 2^31 - W.
__device__ __forceinline__ bool ab_in_window(int d, int W, int causal) {
    return causal ? (unsigned)d < (unsigned)W
                  : (unsigned)d + (unsigned)(W - 1) < 2u * (unsigned)W - 1u;
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

// ab_span's two halves: bits >= lo (ab_span_from) and bits <= hi (ab_span_to)
__device__ __forceinline__ unsigned ab_span_from(int lo) { return ab_shl(0xffffffffu, (unsigned)max(lo, 0)); }
__device__ __forceinline__ unsigned ab_span_to(int hi) { return ab_shr(0xffffffffu, (unsigned)(31 - min(hi, 31))); }
__device__ __forceinline__ unsigned ab_span(int lo, int hi) { return ab_span_from(lo) & ab_span_to(hi); }

// Bits 0, r, 2r, ... of a 32-bit word (bit 0 alone for r >= 32), r >= 1: five steps, each doubling
// the bits set; a constant when r is one. Bits b, b + r, ... are ab_shl(ab_every(r), b).
__device__ __forceinline__ unsigned ab_every(int r) {
    const int s = min(r, 32);
    unsigned m = 1u;
#pragma unroll
    for (int k = 0; k < 5; ++k)
        if ((s << k) < 32) m |= m << (s << k);
    return m;
}

// a mod d in 0 .. d - 1 for any sign of a (floored, as Python's %), d >= 1: a mask when d is a
// power of two (one instruction when d is a constant)
__device__ __forceinline__ int ab_floormod32(int a, int d) {
    if ((d & (d - 1)) == 0) return a & (d - 1);
    const int r = a % d;
    return r < 0 ? r + d : r;
}

// allowed(i, j) of any pattern struct (the patterns' own written without branches where they can,
// so that, with the pattern compiled in, a tile of predicates becomes a few integer instructions)
template <class P>
__device__ __forceinline__ bool ab_allowed(const P& p, int i, int j) { return p.allowed(i, j); }

// allowed(i, j0 + b) for b = 0 .. 31 as bit b, for 0 <= i < T and j0 >= 0 (keys >= T are the
// caller's to clear when the pattern is not causal): the predicate a row at a time, each pattern
// as the key intervals it allows, so a kernel pays a few instructions a row instead of a few an element.
template <class P>
__device__ __forceinline__ unsigned ab_allowed_bits(const P& p, int i, int j0) {
    const unsigned m = p.bits(i, j0);
    return p.causal ? m & ab_span_to(i - j0) : m;
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

// Programmatic dependent launch (sm_90 and later; attnbench/launch.py launches the dependent):
// ab_pdl_trigger lets the next kernel in the stream, when launched as a programmatic dependent, be
// placed once every block of this one has called it or exited; ab_pdl_wait, in that dependent, waits
// until the kernel before it has finished and its writes are visible. Both are no-ops in a plain
// launch and on earlier architectures.
__device__ __forceinline__ void ab_pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void ab_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
