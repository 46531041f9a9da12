// Seed-faithful naive kernels: one thread per (batch*head, query), float32 throughout,
// scores in a compile-time local array, max-subtracted softmax, causal by default.
//
// Compile-time constants (injected as -D options by attnbench/compile.py):
//   MAX_T     longest sequence the dense kernel takes (its score array has MAX_T floats)
//   MAX_KEYS  most keys one row of a sparse pattern may see (its key and score arrays)
//   C         head dimension D
#include "common.cuh"

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

// Appends j to the compact key list when the pattern allows it.
__device__ __forceinline__ void naive_push(const ABPattern& p, int i, int j, int* keys, int& n) {
    if (n < MAX_KEYS && ab_allowed(p, i, j)) keys[n++] = j;
}

// Sparse patterns: build the compact list of allowed keys of row i (streaming: the sinks, then the
// window, as the seed does), then attend over that list only.
extern "C" __global__ void naive_sparse(const float* __restrict__ q, const float* __restrict__ k,
                                        const float* __restrict__ v, float* __restrict__ o,
                                        int T, float scale, int pid, int causal,
                                        int p0, int p1, int p2, int p3, const int* __restrict__ table) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= T) return;
    const ABPattern p = {pid, causal, p0, p1, p2, p3, table};
    int keys[MAX_KEYS];
    int n = 0;
    switch (pid) {
    case AB_WINDOW: {
        const int hi = causal ? i : min(T - 1, i + p0 - 1);
        for (int j = max(0, i - p0 + 1); j <= hi; ++j) naive_push(p, i, j, keys, n);
        break;
    }
    case AB_STREAMING: {
        const int lo = max(0, i - p1 + 1);
        const int hi = causal ? i : min(T - 1, i + p1 - 1);
        for (int j = 0; j < min(p0, lo); ++j) naive_push(p, i, j, keys, n);  // sinks before the window
        for (int j = lo; j <= hi; ++j) naive_push(p, i, j, keys, n);         // the window
        for (int j = hi + 1; j < p0; ++j) naive_push(p, i, j, keys, n);     // sinks after it (non-causal)
        break;
    }
    case AB_BLOCK_DIAGONAL: {
        const int b0 = (i / p0) * p0;
        for (int j = b0; j < min(T, b0 + p0); ++j) naive_push(p, i, j, keys, n);
        break;
    }
    case AB_DILATED: {
        for (int m = p0 - 1; m >= 1; --m) {  // behind, farthest first
            const int j = i - m * p1;
            if (j >= 0) naive_push(p, i, j, keys, n);
        }
        naive_push(p, i, i, keys, n);
        if (!causal)
            for (int m = 1; m < p0; ++m) {
                const int j = i + m * p1;
                if (j < T) naive_push(p, i, j, keys, n);
            }
        break;
    }
    case AB_BIGBIRD: {
        const int nb = T / p0;
        for (int kb = 0; kb < nb; ++kb) {
            const int j0 = kb * p0;
            if (causal && j0 > i) break;
            if (!ab_allowed(p, (i / p0) * p0, j0)) continue;  // the block is not allowed
            for (int j = j0; j < j0 + p0; ++j) naive_push(p, i, j, keys, n);
        }
        break;
    }
    default:  // dense through the key list
        for (int j = 0; j < (causal ? i + 1 : T); ++j) naive_push(p, i, j, keys, n);
    }
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
