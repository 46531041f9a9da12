// Epilogue: normalise the output accumulators by the row sums, stage them as 16-bit values in the
// Q buffer (in the layout of the products, TcMma::Layout), store the tile.
//
// Interface:
//   tc_stage_output<Layout>(sQ, acc, l, warp, g, t4): each warp's MT m16 tiles times the
//     reciprocals of their row sums (l summed over the row's 4 lanes; 0 for a row without allowed
//     keys) into its own rows of the BM-row tile at sQ.
//   tc_store_rows<Layout>(o, sQ, qt, T, warp, lane): each warp copies its staged rows (after
//     __syncwarp: a warp reads only what it staged) to rows qt * BM + warp * RW + r < T of o,
//     STRIDE * HEAD_D elements apart, with 16-byte stores (4-byte stores straight from the
//     accumulators measured 5-9% slower).
//   tc_store_tma(mapO, sQ, qt): the whole staged tile by one bulk tensor copy (rows >= T left out
//     by the copy engine), after a proxy fence and __syncthreads; thread 0 issues it and waits
//     until it has read shared memory.
//   tc_store_output<Layout>(o, mapO, sQ, qt, T, warp, lane): the build's store (TMA 1: the bulk
//     copy, else the rows).
//   tc_store_lse(L, sf, scale_log2, T_all, qt, T, warp, g, t4): each row's log-sum-exp, natural
//     log: ln(sum over its allowed keys of exp(scale * s)) = (m * scale_log2 + log2(l)) * ln 2,
//     float32, into L [B * H][T_all] at the block's rows (class positions c + STRIDE * a); -inf
//     for a row without allowed keys (none in any pattern).
#pragma once
#include "tc/common.cuh"
#include "tc/softmax.cuh"

template <class Layout>
__device__ __forceinline__ void tc_stage_output(u32 sQ, const TcAcc& acc, const TcRows& l, int warp, int g, int t4) {
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        float inv[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float x = tc_quad_sum(l[m][r]);
            inv[r] = x > 0.f ? tc_rcp(x) : 0.f;
        }
        const int wrow = warp * RW + m * 16;
#pragma unroll
        for (int d = 0; d < HEAD_D / 8; ++d) {
            const u32 lo = tc_pack(acc[m][d][0] * inv[0], acc[m][d][1] * inv[0]);
            const u32 hi = tc_pack(acc[m][d][2] * inv[1], acc[m][d][3] * inv[1]);
            asm volatile("st.shared.u32 [%0], %1;\n" :: "r"(sQ + Layout::template swz<BM>(wrow + g, d) + t4 * 4), "r"(lo));
            asm volatile("st.shared.u32 [%0], %1;\n" :: "r"(sQ + Layout::template swz<BM>(wrow + g + 8, d) + t4 * 4), "r"(hi));
        }
    }
}

template <class Layout>
__device__ __forceinline__ void tc_store_rows(u16* __restrict__ o, u32 sQ, int qt, int T, int warp, int lane) {
    __syncwarp();
#pragma unroll
    for (int idx = lane; idx < RW * CH; idx += 32) {
        const int r = idx / CH, c = idx % CH;
        const int grow = qt * BM + warp * RW + r;
        if (grow < T) {
            u32 x0, x1, x2, x3;
            asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                         : "=r"(x0), "=r"(x1), "=r"(x2), "=r"(x3) : "r"(sQ + Layout::template swz<BM>(warp * RW + r, c)));
            asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};\n"
                         :: "l"(o + (size_t)tc_seq_row(grow) * (STRIDE * HEAD_D) + c * 8), "r"(x0), "r"(x1), "r"(x2), "r"(x3));
        }
    }
}

__device__ __forceinline__ void tc_store_tma(const void* mapO, u32 sQ, int qt) {
    wg_fence_smem();  // the staged rows (generic proxy) made visible to the copy engine
    __syncthreads();
    if (threadIdx.x == 0) {
#pragma unroll
        for (int pn = 0; pn < HEAD_D / 64; ++pn) tc_tma_store_rows(mapO, pn * 64, qt * BM, blockIdx.y, sQ + pn * BM * 128);
        tma_store_commit_and_wait();  // the block's shared memory must outlive the copy's reads
    }
}

template <class Layout>
__device__ __forceinline__ void tc_store_output(u16* __restrict__ o, const void* mapO, u32 sQ, int qt, int T, int warp,
                                                int lane) {
#if TMA
    tc_store_tma(mapO, sQ, qt);
#else
    tc_store_rows<Layout>(o, sQ, qt, T, warp, lane);
#endif
}

__device__ __forceinline__ void tc_store_lse(float* __restrict__ L, const TcSoftmax& sf, float scale_log2, int T_all,
                                             int qt, int T, int warp, int g, int t4) {
    const size_t base = (size_t)blockIdx.y * (size_t)T_all + blockIdx.z;
#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float x = tc_quad_sum(sf.l[m][r]);
            const int row = qt * BM + warp * RW + m * 16 + g + 8 * r;
            if (t4 == 0 && row < T)
                L[base + (size_t)row * STRIDE] = x > 0.f ? (sf.m[m][r] * scale_log2 + __log2f(x)) * TC_LN2 : AB_NEG_INF;
        }
    }
}
