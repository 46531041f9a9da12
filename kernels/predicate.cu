// The pattern predicate in both of its device forms, for the tests: bit b of word w of row i is
// allowed(i, 16 w + b) as ab_allowed_bits computes it (fast) and as ab_allowed does key by key
// (ref), keys >= T left 0 in ref. The pattern comes as arguments (Mask.device_params()), so one
// module serves every pattern. No compile-time constants.
#include "common.cuh"

extern "C" __global__ void predicate_bits(int pid, int causal, int p0, int p1, int p2, int p3,
                                          const int* __restrict__ table, int T, int nw,
                                          unsigned* __restrict__ fast, unsigned* __restrict__ ref)
{
    ABPattern p;
    p.pid = pid;
    p.causal = causal;
    p.p0 = p0; p.p1 = p1; p.p2 = p2; p.p3 = p3;
    p.table = table;
    const int i = blockIdx.x;
    for (int w = threadIdx.x; w < nw; w += blockDim.x) {
        const int j0 = 16 * w;
        unsigned r = 0;
        for (int b = 0; b < 32 && j0 + b < T; ++b) r |= (unsigned)ab_allowed(p, i, j0 + b) << b;
        fast[(size_t)i * nw + w] = ab_allowed_bits(p, i, j0);
        ref[(size_t)i * nw + w] = r;
    }
}
