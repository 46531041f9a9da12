// The pattern predicate in both of its device forms, for the tests: bit b of word w of row i is
// allowed(i, 16 w + b) as ab_allowed_bits computes it (fast) and as ab_allowed does key by key
// (ref), keys >= T left 0 in ref. The pattern is compiled in (AB_PATTERN_T), its parameters come
// at run time (pargs: Mask.device_args()), so one module serves every parameter value.
#include "common.cuh"
#include "pattern.cuh"

extern "C" __global__ void predicate_bits(int causal, const int* __restrict__ pargs, const int* __restrict__ table,
                                          int T, int nw, unsigned* __restrict__ fast, unsigned* __restrict__ ref)
{
    const AB_PATTERN_T pat{AB_PATTERN_ARGS};
    const int i = blockIdx.x;
    for (int w = threadIdx.x; w < nw; w += blockDim.x) {
        const int j0 = 16 * w;
        unsigned r = 0;
        for (int b = 0; b < 32 && j0 + b < T; ++b) r |= (unsigned)ab_allowed(pat, i, j0 + b) << b;
        fast[(size_t)i * nw + w] = ab_allowed_bits(pat, i, j0);
        ref[(size_t)i * nw + w] = r;
    }
}
