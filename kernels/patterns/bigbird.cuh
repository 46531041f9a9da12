// bigbird: block window + global blocks + random blocks, a rule over whole key blocks. Mirrors
// attnbench/patterns/bigbird.py; the random key blocks come as a table [T / block][max(1, r)].
#pragma once
#include "common.cuh"

struct ab_bigbird {
    int causal;
    int block;
    int window_blocks;
    int global_blocks;
    int random_blocks;
    const int* table;
    // key block kb is allowed to query block qb (before the causal clause)
    __device__ __forceinline__ bool block_allowed(int qb, int kb) const {
        if (ab_abs(qb - kb) <= window_blocks / 2 || qb < global_blocks || kb < global_blocks) return true;
        const int stride = random_blocks > 0 ? random_blocks : 1;
        for (int r = 0; r < random_blocks; ++r)
            if (table[qb * stride + r] == kb) return true;
        return false;
    }
    __device__ __forceinline__ bool allowed(int i, int j) const {
        return ab_before(causal, i - j) && block_allowed(i / block, j / block);
    }
    // one span per allowed key block
    __device__ __forceinline__ unsigned bits(int i, int j0) const {
        const int qb = i / block;
        unsigned m = 0;
        for (int kb = j0 / block; kb <= (j0 + 31) / block; ++kb)
            if (block_allowed(qb, kb)) m |= ab_span(kb * block - j0, kb * block + block - 1 - j0);
        return m;
    }
    template <class F>
    __device__ __forceinline__ void keys(int i, int T, F&& push) const {
        const int nb = T / block;
        for (int kb = 0; kb < nb; ++kb) {
            const int j0 = kb * block;
            if (causal && j0 > i) break;
            if (!block_allowed(i / block, kb)) continue;
            for (int j = j0; j < j0 + block; ++j) push(j);
        }
    }
};
