// dilated: d = i - j (or |i - j|), d < W*r and d % r == 0; with extra levels, the union of several
// (W, r), LongNet-style. Mirrors attnbench/patterns/dilated.py. (The fast kernels run one level with
// dilation > 1 as a window over each residue class: Mask.strided.)
#pragma once
#include "common.cuh"

#define AB_DILATED_MAX_LEVELS 8

struct ab_dilated {
    int causal;
    int window;
    int dilation;
    int extra;                          // levels beyond (window, dilation); 0 when none were given
    int lv[2 * AB_DILATED_MAX_LEVELS];  // their (W, r), in order
    __device__ __forceinline__ bool allowed(int i, int j) const {
        const int a = ab_abs(i - j);
        bool ok = (a < window * dilation) & ((a % dilation) == 0);
#pragma unroll
        for (int k = 0; k < AB_DILATED_MAX_LEVELS; ++k)
            if (k < extra) ok |= (a < lv[2 * k] * lv[2 * k + 1]) & ((a % lv[2 * k + 1]) == 0);
        return ok & ab_before(causal, i - j);
    }
    // one level's keys among j0 .. j0 + 31 for rr = i - j0: the bits b with rr - b a multiple of r
    // (every r-th bit from rr mod r: the level's constant word ab_every(r) shifted; none past bit 31
    // when r >= 32) within the level's reach behind the row, and ahead of it when not causal (keys
    // past the row are the caller's when causal, ab_allowed_bits). With the parameters compiled in,
    // a few integer instructions a level: the word is a constant, rr mod r a mask for a power of two
    // r (a multiply-high otherwise), no loop over the word's bits.
    __device__ __forceinline__ unsigned level_bits(int rr, int W, int r) const {
        const int reach = (W - 1) * r;
        const unsigned m = ab_shl(ab_every(r), (unsigned)ab_floormod32(rr, r)) & ab_span_from(rr - reach);
        return causal ? m : m & ab_span_to(rr + reach);
    }
    __device__ __forceinline__ unsigned bits(int i, int j0) const {
        const int rr = i - j0;
        unsigned m = level_bits(rr, window, dilation);
#pragma unroll
        for (int k = 0; k < AB_DILATED_MAX_LEVELS; ++k)
            if (k < extra) m |= level_bits(rr, lv[2 * k], lv[2 * k + 1]);
        return m;
    }
    template <class F>
    __device__ __forceinline__ void keys(int i, int T, F&& push) const {
        if (extra == 0) {
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
            return;
        }
        int reach = (window - 1) * dilation;  // several levels: every key within the farthest reach, in order
        for (int k = 0; k < extra; ++k) reach = max(reach, (lv[2 * k] - 1) * lv[2 * k + 1]);
        const int hi = causal ? i : min(T - 1, i + reach);
        for (int j = max(0, i - reach); j <= hi; ++j)
            if (allowed(i, j)) push(j);
    }
};
