// Seed-faithful naive kernels: one thread per (batch*head, query), float32 throughout,
// scores in a compile-time local array, max-subtracted softmax, causal by default.
//
// Compile-time constants (injected as -D options by attnbench/compile.py):
//   MAX_T     longest sequence the dense kernel takes (its score array has MAX_T floats)
//   MAX_KEYS  most keys one row of a sparse pattern may see (its key and score arrays)
//   C         head dimension D
//   AB_PATTERN_T, AB_PATTERN_ARGS: the pattern (kernels/common.cuh), its parameters read at run time
//             from pargs, so one module serves every parameter value of a pattern
#include "common.cuh"
#include "pattern.cuh"

#ifndef MAX_T
#error "MAX_T must be defined"
#endif
#ifndef MAX_KEYS
#error "MAX_KEYS must be defined"
#endif
#ifndef C
#error "C must be defined"
#endif

__device__ __forceinline__ float naive_dot(const float* __restrict__ a, const float* __restrict__ b) {
    float s = 0.f;
    for (int c = 0; c < C; ++c) s += a[c] * b[c];
    return s;
}

// Softmax over n scores in place (max-subtracted) and the weighted sum of V rows into out.
// key(jj) gives the key index of score jj.
template <typename KeyOf>
__device__ __forceinline__ void naive_softmax_pv(float* scores, int n, float m, KeyOf key,
                                                 const float* __restrict__ vb, float* __restrict__ out) {
    float sum = 0.f;
    for (int jj = 0; jj < n; ++jj) {
        float e = expf(scores[jj] - m);
        scores[jj] = e;
        sum += e;
    }
    const float inv = 1.f / sum;
    for (int c = 0; c < C; ++c) {
        float acc = 0.f;
        for (int jj = 0; jj < n; ++jj) acc += scores[jj] * vb[(size_t)key(jj) * C + c];
        out[c] = acc * inv;
    }
}

// Dense attention: every key (causal: j <= i).
extern "C" __global__ void naive_dense(const float* __restrict__ q, const float* __restrict__ k,
                                       const float* __restrict__ v, float* __restrict__ o,
                                       int T, float scale, int causal) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= T) return;
    const size_t base = (size_t)blockIdx.y * T * C;
    const float* qi = q + base + (size_t)i * C;
    const float* kb = k + base;
    float scores[MAX_T];
    const int n = causal ? i + 1 : T;
    float m = AB_NEG_INF;
    for (int j = 0; j < n; ++j) {
        float s = naive_dot(qi, kb + (size_t)j * C) * scale;
        scores[j] = s;
        m = fmaxf(m, s);
    }
    naive_softmax_pv(scores, n, m, [](int jj) { return jj; }, v + base, o + base + (size_t)i * C);
}

// Sparse patterns: build the compact list of allowed keys of row i in the pattern's own order
// (streaming: the sinks, then the window, as the seed does), then attend over that list only.
extern "C" __global__ void naive_sparse(const float* __restrict__ q, const float* __restrict__ k,
                                        const float* __restrict__ v, float* __restrict__ o,
                                        int T, float scale, int causal, const int* __restrict__ pargs,
                                        const int* __restrict__ table) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= T) return;
    const AB_PATTERN_T pat{AB_PATTERN_ARGS};
    int keys[MAX_KEYS];
    int n = 0;
    pat.keys(i, T, [&](int j) {
        if (n < MAX_KEYS && ab_allowed(pat, i, j)) keys[n++] = j;
    });
    const size_t base = (size_t)blockIdx.y * T * C;
    const float* qi = q + base + (size_t)i * C;
    float scores[MAX_KEYS];
    float m = AB_NEG_INF;
    for (int jj = 0; jj < n; ++jj) {
        float s = naive_dot(qi, k + base + (size_t)keys[jj] * C) * scale;
        scores[jj] = s;
        m = fmaxf(m, s);
    }
    naive_softmax_pv(scores, n, m, [&](int jj) { return keys[jj]; }, v + base, o + base + (size_t)i * C);
}
