// The backward's reads and writes of global memory outside the tile pipeline: the rows' saved
// statistics, dQ's float32 atomics, dK and dV's stores, and the element loops of the prep and
// convert kernels.
//
// Interface:
//   tc_unpack(x): the two 16-bit values of a packed register as floats (lo, hi); tc_dot8(a, b, d): d plus
//     the dot product of two 8-element rows packed as uint4.
//   tc_bwd_row_stats(ld, row, T): (lse2, delta) of a class row (ld: the row's class base; rows
//     STRIDE apart), (+inf, 0) past T: P = 0 and dS = 0 on padding rows.
//   tc_bwd_probs(x, ra, rb, scale_log2): a warp's S fragment into P = exp2(S scale log2 e - lse2)
//     (ra: rows g, rb: rows g + 8; masked keys and padding rows 0).
//   tc_bwd_dscores(x, p, ra, rb): a warp's dP fragment into dS = P (dP - delta), P packed (p).
//   tc_bwd_dq_add<C>(dq, c, c0, row0, T, g, t4): c (a warp's [16][C] chunk of dS K at columns
//     c0) added to float32 dq (the class base, rows STRIDE * HEAD_D floats apart) at rows
//     row0 + g and row0 + g + 8 below T, a column pair per reduction (tc_red2).
//   tc_bwd_store_cols(o, acc, scale, row0, T, g, t4): a warp's [16][HEAD_D] accumulators times
//     scale as 16-bit values into rows row0 + g and + 8 below T (4-byte stores, once per block);
//     tc_bwd_store_part<C>(o, acc, c0, ...) the same for C of them at columns c0.
//   tc_bwd_add_cols(a, acc, r0, n, g, t4): a warp's [16][HEAD_D] accumulators added to float32
//     rows r0 + g and r0 + g + 8 (below n) of a split key tile's accumulator a (rows 2 * HEAD_D
//     floats apart: dK's then dV's columns), once per item.
//   tc_bwd_finish(dKg, dVg, dKVacc, dk, dv, kts, w, cls, BH, T_all, scale, warp, g, t4): the end of a
//     work item (key tile kts.x, split slot kts.y or -1) whose warp w holds keys 16 w .. + 15 of dK
//     and dV: stored (times the scale for dK) when the tile is not split, else added to the split
//     tile's float32 rows (tc/bwd_prep.cuh's layout).
//   tc_red2(p, x, y): p[0] += x, p[1] += y without a result (p 8-byte aligned): one vector
//     red.global.add.v2.f32 on sm_90, two scalar reductions before.
#pragma once
#include "tc/common.cuh"
#include "tc/scheduler.cuh"
#include "tc/bwd_mma.cuh"

__device__ __forceinline__ float2 tc_unpack(u32 x) {
#if AB_F16
    return make_float2(ab_f16_to_f32((u16)(x & 0xffffu)), ab_f16_to_f32((u16)(x >> 16)));
#else
    return make_float2(ab_bf16_to_f32((u16)(x & 0xffffu)), ab_bf16_to_f32((u16)(x >> 16)));
#endif
}

// d + the dot product of two packed 8-element rows (uint4 of 16-bit pairs): delta = rowsum(dO * O)
__device__ __forceinline__ float tc_dot8(uint4 a, uint4 b, float d) {
    const u32 av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 x = tc_unpack(av[i]), y = tc_unpack(bv[i]);
        d = fmaf(x.x, y.x, fmaf(x.y, y.y, d));
    }
    return d;
}

__device__ __forceinline__ float2 tc_bwd_row_stats(const float2* __restrict__ ld, int row, int T) {
    return row < T ? ld[(size_t)row * STRIDE] : make_float2(__int_as_float(0x7f800000), 0.f);
}

__device__ __forceinline__ void tc_red2(float* p, float x, float y) {
#if __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" :: "l"(p), "f"(x), "f"(y) : "memory");
#else
    atomicAdd(p, x);
    atomicAdd(p + 1, y);
#endif
}

__device__ __forceinline__ void tc_bwd_probs(TcBwdRows& x, float2 ra, float2 rb, float scale_log2) {
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
        x[j][0] = tc_exp2(fmaf(x[j][0], scale_log2, -ra.x));
        x[j][1] = tc_exp2(fmaf(x[j][1], scale_log2, -ra.x));
        x[j][2] = tc_exp2(fmaf(x[j][2], scale_log2, -rb.x));
        x[j][3] = tc_exp2(fmaf(x[j][3], scale_log2, -rb.x));
    }
}

// p[kk][e] (tc_p_frag): e = 0 / 1 rows g / g + 8 of n8 block 2 kk, e = 2 / 3 the same of block 2 kk + 1
__device__ __forceinline__ void tc_bwd_dscores(TcBwdRows& x, const TcBwdFrag& p, float2 ra, float2 rb) {
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float2 pv = tc_unpack(p[kk][e]);
            const float dl = (e & 1) ? rb.y : ra.y;
            float* d = x[2 * kk + (e >> 1)] + 2 * (e & 1);
            d[0] = pv.x * (d[0] - dl);
            d[1] = pv.y * (d[1] - dl);
        }
    }
}

template <int C>
__device__ __forceinline__ void tc_bwd_dq_add(float* __restrict__ dq, const float (&c)[C / 8][4], int c0, int row0,
                                              int T, int g, int t4) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = row0 + g + 8 * h;
        if (row < T) {
            float* p = dq + (size_t)row * (STRIDE * HEAD_D) + c0 + 2 * t4;
#pragma unroll
            for (int j = 0; j < C / 8; ++j) tc_red2(p + 8 * j, c[j][2 * h], c[j][2 * h + 1]);
        }
    }
}

template <int C>
__device__ __forceinline__ void tc_bwd_store_part(u16* __restrict__ o, const float (&acc)[C / 8][4], int c0, float scale,
                                                  int row0, int T, int g, int t4) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = row0 + g + 8 * h;
        if (row < T) {
            u32* p = reinterpret_cast<u32*>(o + (size_t)tc_seq_row(row) * (STRIDE * HEAD_D) + c0 + 2 * t4);
#pragma unroll
            for (int j = 0; j < C / 8; ++j) p[4 * j] = tc_pack(acc[j][2 * h] * scale, acc[j][2 * h + 1] * scale);
        }
    }
}

__device__ __forceinline__ void tc_bwd_store_cols(u16* __restrict__ o, const float (&acc)[HEAD_D / 8][4], float scale,
                                                  int row0, int T, int g, int t4) {
    tc_bwd_store_part<HEAD_D>(o, acc, 0, scale, row0, T, g, t4);
}

__device__ __forceinline__ void tc_bwd_add_cols(float* __restrict__ a, const float (&acc)[HEAD_D / 8][4], int r0, int n,
                                                int g, int t4) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = r0 + g + 8 * h;
        if (row < n) {
            float* p = a + (size_t)row * (2 * HEAD_D) + 2 * t4;
#pragma unroll
            for (int j = 0; j < HEAD_D / 8; ++j) tc_red2(p + 8 * j, acc[j][2 * h], acc[j][2 * h + 1]);
        }
    }
}

__device__ __forceinline__ void tc_bwd_finish(u16* __restrict__ dKg, u16* __restrict__ dVg, float* __restrict__ dKVacc,
                                              const float (&dk)[HEAD_D / 8][4], const float (&dv)[HEAD_D / 8][4],
                                              int2 kts, const TcWork& w, int cls, int BH, int T_all, float scale,
                                              int warp, int g, int t4) {
    const int kt = kts.x;
    if (kts.y < 0) {  // the key tile's only item: its gradients
        const int key0 = kt * BN + warp * 16;
        tc_bwd_store_cols(dKg + w.base, dk, scale, key0, w.T, g, t4);
        tc_bwd_store_cols(dVg + w.base, dv, 1.f, key0, w.T, g, t4);
    } else {  // one of a split key tile's items: its partial sums into the tile's float32 rows
        const int C = STRIDE < T_all ? STRIDE : T_all;
        float* a = dKVacc + ((size_t)(kts.y * BH + w.bh) * C + cls) * (BN * 2 * HEAD_D);
        tc_bwd_add_cols(a, dk, warp * 16, w.T - kt * BN, g, t4);
        tc_bwd_add_cols(a + HEAD_D, dv, warp * 16, w.T - kt * BN, g, t4);
    }
}
