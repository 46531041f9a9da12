// class_bands: the class-major layout's pattern (attnbench/patterns/class_bands.py, attnbench/classes.py).
// Position c * n + a (n = T / classes) stands for a * classes + c; the pair (i, j) of query class
// cq and key class ck is live when lo <= a - b <= hi for that class pair's band. The causal clause
// is in the bands (the mask is not causal). Mirrors attnbench/patterns/class_bands.py.
#pragma once
#include "common.cuh"

#define AB_CLASS_BANDS_MAX 8

// The bands again, as a table in constant memory (ClassBands.extra_defines: "lo, hi, ..." per class
// pair, query class major): band_of reads its pair with one indexed constant load (uniform over a
// warp where its rows and keys stay in one class), where picking it out of the struct's fields by
// comparisons cost 3 instructions a class pair, about 40% of the forward's instructions.
#ifdef AB_CLASS_BANDS_TABLE
__constant__ int ab_class_bands_table[] = {AB_CLASS_BANDS_TABLE};
#endif

struct ab_class_bands {
    int causal;
    int classes;
    int n;  // positions per class, T / classes
    int band[2 * AB_CLASS_BANDS_MAX * AB_CLASS_BANDS_MAX];  // (lo, hi) per class pair, query class major

    // the band of class pair (cq, ck): from the constant table where it is compiled in, else chosen
    // by comparisons rather than an index, so that the fields stay in registers, not in local memory
    __device__ __forceinline__ void band_of(int cq, int ck, int& lo, int& hi) const {
        const int at = cq * classes + ck;
#ifdef AB_CLASS_BANDS_TABLE
        const bool in = cq < classes;  // a row past T: no band (and no read past the table)
        lo = in ? ab_class_bands_table[2 * at] : 1;
        hi = in ? ab_class_bands_table[2 * at + 1] : 0;
#else
        lo = 1;
        hi = 0;
#pragma unroll
        for (int k = 0; k < AB_CLASS_BANDS_MAX * AB_CLASS_BANDS_MAX; ++k)
            if (k < classes * classes && k == at) {
                lo = band[2 * k];
                hi = band[2 * k + 1];
            }
#endif
    }
    __device__ __forceinline__ bool allowed(int i, int j) const {
        const int cq = i / n, ck = j / n;
        if (ck >= classes) return false;  // a key past T
        int lo, hi;
        band_of(cq, ck, lo, hi);
        const int d = (i - cq * n) - (j - ck * n);
        return (d >= lo) & (d <= hi);
    }
    // keys j0 .. j0 + 31 in one class (n a multiple of 32 and j0 too): bit b for a - (b0 + b) within
    // the band, one span; else key by key
    __device__ __forceinline__ unsigned bits(int i, int j0) const {
        const int cq = i / n, ck = j0 / n;
        const int b0 = j0 - ck * n;
        if (ck < classes && b0 + 31 < n) {
            const int a = i - cq * n;
            int lo, hi;
            band_of(cq, ck, lo, hi);
            return lo > hi ? 0u : ab_span(a - b0 - hi, a - b0 - lo);
        }
        unsigned m = 0u;
        for (int b = 0; b < 32; ++b)
            if (allowed(i, j0 + b)) m |= 1u << b;
        return m;
    }
    template <class F>
    __device__ __forceinline__ void keys(int i, int T, F&& push) const {
        for (int ck = 0; ck < classes; ++ck)
            for (int j = ck * n; j < (ck + 1) * n && j < T; ++j)
                if (allowed(i, j)) push(j);
    }
};
