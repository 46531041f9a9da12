// The backward's two element-wise kernels around its main kernel, shared by both main loops
// (fast_tc_bwd.cu on mma.sync, fast_tc_bwd_wg.cu on wgmma):
//
//   fast_tc_bwd_prep  per row: delta = rowsum(dO * O) in float32, stored beside the forward's
//                     log-sum-exp in base 2 (LD [B * H * T] of float2 (lse * log2 e, delta)); the
//                     row of the float32 dQ accumulator zeroed (not with BWD_DQ_PASS or BWD_DQ_STORE), and the rows
//                     of the split key tiles' float32 dK / dV accumulator. Grid: max(rows, split
//                     rows) / (256 / CH); 256 threads, CH per row.
//   fast_tc_bwd_dq    dQ = scale * the accumulator, in the storage dtype; then (the blocks past dQ)
//                     the split key tiles' dK = scale * its accumulator and dV. Grid: (dQ's
//                     elements + the split rows' D elements) / 2048.
//
// Split accumulator (float32, rows of 2 * HEAD_D: dK's columns then dV's): row
// ((slot * BH + bh) * classes + class) * BN + key for split slot `slot` (its key tile:
// split_kt[slot]), key `key` of the tile.
#pragma once
#include "tc/common.cuh"
#include "tc/bwd_epilogue.cuh"

// BWD_DQ_PASS 1: dQ by a pass of its own over the forward list (fast_tc_bwd.cu's fast_tc_bwd_dq_pass),
// no float32 accumulator and no reductions; 0: dQ's sums by reductions in the main kernel
#ifndef BWD_DQ_PASS
#define BWD_DQ_PASS 0
#endif
// BWD_DQ_STORE 1 (the wgmma main loop, tc/bwd_wgmma.cuh): dQ stored by the main loop, no accumulator either
#ifndef BWD_DQ_STORE
#define BWD_DQ_STORE 0
#endif
#define BWD_PREP_THREADS 256

extern "C" __global__ void __launch_bounds__(BWD_PREP_THREADS)
fast_tc_bwd_prep(const u16* __restrict__ Og, const u16* __restrict__ dOg, const float* __restrict__ Lg,
                 float2* __restrict__ LD, float* __restrict__ dQacc, int rows, float* __restrict__ dKVacc, int srows) {
    const int row = blockIdx.x * (BWD_PREP_THREADS / CH) + threadIdx.x / CH, c = threadIdx.x % CH;
    const bool ok = row < rows;
    if (row < srows) {  // the split key tiles' dK and dV accumulators: a row's 8 columns of each
        float4* z = reinterpret_cast<float4*>(dKVacc + (size_t)row * (2 * HEAD_D) + c * 8);
        z[0] = z[1] = z[HEAD_D / 4] = z[HEAD_D / 4 + 1] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    float d = 0.f;
    if (ok) {
        const size_t at = (size_t)row * HEAD_D + c * 8;  // the layout's row (rows of all heads, T_all each) ...
        const size_t in = LAYOUT_R == 1 ? at : (size_t)tc_flat_row(row) * HEAD_D + c * 8;  // ... where it lies in O, dO
        d = tc_dot8(*reinterpret_cast<const uint4*>(Og + in), *reinterpret_cast<const uint4*>(dOg + in), d);
#if !BWD_DQ_PASS && !BWD_DQ_STORE
        float4* z = reinterpret_cast<float4*>(dQacc + at);
        z[0] = z[1] = make_float4(0.f, 0.f, 0.f, 0.f);
#endif
    }
    // the CH lanes of a row (aligned groups within the warp) add their parts
#pragma unroll
    for (int off = CH / 2; off > 0; off >>= 1) d += __shfl_xor_sync(0xffffffffu, d, off);
    if (ok && c == 0) LD[row] = make_float2(Lg[row] * TC_LOG2E, d);
}

__device__ __forceinline__ uint4 tc_bwd_pack8(const float* __restrict__ src, float scale) {
    const float4 a = reinterpret_cast<const float4*>(src)[0];
    const float4 b = reinterpret_cast<const float4*>(src)[1];
    return make_uint4(tc_pack(a.x * scale, a.y * scale), tc_pack(a.z * scale, a.w * scale),
                      tc_pack(b.x * scale, b.y * scale), tc_pack(b.z * scale, b.w * scale));
}

extern "C" __global__ void __launch_bounds__(BWD_PREP_THREADS)
fast_tc_bwd_dq(const float* __restrict__ dQacc, u16* __restrict__ dQg, float scale, long long n8,
               const float* __restrict__ dKVacc, const int* __restrict__ split_kt, u16* __restrict__ dKg,
               u16* __restrict__ dVg, int BH, int T_all, long long s8) {
    const long long i = (long long)blockIdx.x * BWD_PREP_THREADS + threadIdx.x;  // 8 elements each
    if (i < n8) {
        // the accumulator's rows are the layout's, dQ's where they lie (tc/rows.cuh)
        const long long to = LAYOUT_R == 1 ? i : tc_flat_row(i / CH) * CH + i % CH;
        reinterpret_cast<uint4*>(dQg)[to] = tc_bwd_pack8(dQacc + 8 * i, scale);
        return;
    }
    // past dQ: the split key tiles' dK (times the scale) and dV, 8 columns of a row of each
    const long long j = i - n8;
    if (j >= s8) return;
    const int C = STRIDE < T_all ? STRIDE : T_all;
    const long long row = j / CH;  // ((slot * BH + bh) * C + class) * BN + key
    const int ch = (int)(j % CH), key = (int)(row % BN);
    const long long sbc = row / BN;
    const int cls = (int)(sbc % C), bh = (int)(sbc / C % BH), slot = (int)(sbc / C / BH);
    const int a = split_kt[slot] * BN + key;  // the key's position in its class
    if (a >= (T_all - cls + STRIDE - 1) / STRIDE) return;
    const size_t at = ((size_t)bh * T_all + cls + (size_t)tc_seq_row(a) * STRIDE) * HEAD_D + ch * 8;
    const float* src = dKVacc + row * (2 * HEAD_D) + ch * 8;
    *reinterpret_cast<uint4*>(dKg + at) = tc_bwd_pack8(src, scale);
    *reinterpret_cast<uint4*>(dVg + at) = tc_bwd_pack8(src + HEAD_D, 1.f);
}

