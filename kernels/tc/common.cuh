// Low-level helpers shared by the parts of fast_tc (kernels/tc/*.cuh): shared-memory addresses and
// the block's shared-memory layout (TcSmem), the tensors of a work item (TcGlobal), the swizzled
// tile layouts (TcRowLayout, TcPanelLayout), cp.async, ldmatrix, mma.sync m16n8k16, packing to
// 16-bit pairs, the P fragment, zeroing accumulators, exp2 / rcp. Includes what every part relies
// on: the pattern predicate and conversions (common.cuh), the PTX wrappers of wgmma (wgmma.cuh)
// and of the bulk tensor copies (tma.cuh), the compile-time constants (tc/config.cuh), and where a row lies
// in the arrays (tc/rows.cuh); inline functions cost nothing in the builds that do not call them. Include
// paths are relative to kernels/ (attnbench.compile expands them textually).
//
// The parts are __forceinline__ functions and small structs with fixed interfaces (each header says
// its own), so a backward or a decoding kernel can compose the same ones. (Until v15 the tile
// loop's parts were macros, which kept the cubins byte-identical to the single-file kernel; as
// functions the instructions are the same, numbered and scheduled otherwise: docs/PERF.md v15.)
#pragma once
#include "common.cuh"
#include "pattern.cuh"
#include "tc/config.cuh"
#include "wgmma.cuh"
#include "tma.cuh"
#include "tc/rows.cuh"


typedef unsigned short u16;
typedef unsigned int u32;

// A thread's fragments of the m16 tiles its warp owns (MT of them; the accumulator layout of
// mma.sync, wgmma's per warp: rows g and g + 8 of each, g = lane / 4)
typedef float TcS[MT][BN / 8][4];       // S (then P) of one key tile
typedef float TcAcc[MT][HEAD_D / 8][4];  // the output accumulators
typedef float TcRows[MT][2];             // one value per row of the thread (rows g and g + 8)

__device__ __forceinline__ u32 tc_smem_addr(const void* p) {
    u32 r;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
    return r;
}

// The block's dynamic shared memory (its pointer aligned to 1024 bytes: every tile starts at a
// multiple of its row pitch, which the XOR addressing of the swizzled layouts relies on): the Q
// tile (BM rows, later the output's staging), STAGES K tiles, STAGES V tiles (BN rows each), and
// after them, with TMA, the mbarriers (tc/mainloop_wgmma.cuh).
struct TcSmem {
    u32 q, k, v;  // shared addresses of the Q tile, of K's first stage, of V's first stage
};
__device__ __forceinline__ TcSmem tc_smem(const void* smem) {
    TcSmem s;
    s.q = tc_smem_addr(smem);
    s.k = s.q + BM * HEAD_D * 2;
    s.v = s.k + STAGES * TILE_BYTES;
    return s;
}

// The tensors a block reads and writes, at its work item's first row (tc_block_work's base),
// and their maps for the bulk tensor copies (TMA builds; the others ignore them).
struct TcGlobal {
    const u16 *q, *k, *v;
    u16* o;
    const TmaMap *mq, *mk, *mv, *mo;
};

// Byte offset of 16-byte chunk c of row r in a swizzled tile of ROWS rows (rows of 16-byte chunks
// XOR-swizzled so that ldmatrix and cp.async are free of bank conflicts):
// TcRowLayout: rows of CH chunks (the mma.sync products, tc/mainloop_sync.cuh);
// TcPanelLayout: panels of 64 columns, [CH / 8][ROWS][8 chunks], each row 128 bytes (the K-major
// and N-major layouts wgmma reads with 128-byte swizzle, tc/mainloop_wgmma.cuh); the same for
// HEAD_D 64. ROWB: bytes from a row to the next.
struct TcRowLayout {
    enum { ROWB = CH * 16 };
    template <int ROWS>
    static __device__ __forceinline__ u32 swz(int r, int c) { return (u32)((r * CH + (c ^ (r & 7))) * 16); }
};
struct TcPanelLayout {
    enum { ROWB = 128 };
    template <int ROWS>
    static __device__ __forceinline__ u32 swz(int r, int c) {
        return (u32)((((c >> 3) * ROWS + r) << 7) + (((c & 7) ^ (r & 7)) << 4));
    }
};

__device__ __forceinline__ void tc_cp_async16(u32 dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(dst), "l"(src), "r"(bytes));
}

// KV_EVICT 1 (fast-decode's EVICT): K and V, read once a launch, ask L2 to evict their own lines first
// (an L2 cache policy, createpolicy's evict_first), so that a launch streaming more than L2 holds replaces
// its own lines instead of every line L2 held before it (dirty ones are written back as they go). 0: plain
// loads, the builds as before.
#ifndef KV_EVICT
#define KV_EVICT 0
#endif
__device__ __forceinline__ unsigned long long tc_evict_first_policy() {
    unsigned long long p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
    return p;
}
// tc_cp_async16, with an L2 cache policy (tc_evict_first_policy's) when EVF; plain otherwise (policy unused)
template <int EVF>
__device__ __forceinline__ void tc_cp_async16_kv(u32 dst, const void* src, int bytes, unsigned long long policy) {
    if (EVF)
        asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n"
                     :: "r"(dst), "l"(src), "r"(bytes), "l"(policy));
    else
        tc_cp_async16(dst, src, bytes);
}
__device__ __forceinline__ void tc_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void tc_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N)); }

__device__ __forceinline__ void tc_ldsm_x4(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void tc_ldsm_x4_t(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// d += a * b for one m16n8k16 tile (a: 4 regs, b: 2 regs, d: 4 floats).
__device__ __forceinline__ void tc_mma(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
#if AB_F16
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
#endif
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ u32 tc_pack(float lo, float hi) {
#if AB_F16
    return ab_pack_f16(lo, hi);
#else
    return ab_pack_bf16(lo, hi);
#endif
}

// The m16n8k16 A fragment of P for k-step kk (keys 16 kk .. 16 kk + 15) from an m16 tile's S
// accumulators (the same per warp for mma.sync and for wgmma with A in registers).
template <int J>
__device__ __forceinline__ void tc_p_frag(u32 (&a)[4], const float (&s)[J][4], int kk) {
    a[0] = tc_pack(s[2 * kk][0], s[2 * kk][1]);
    a[1] = tc_pack(s[2 * kk][2], s[2 * kk][3]);
    a[2] = tc_pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    a[3] = tc_pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

// Zero M m16 tiles of accumulators of J n8 column blocks each (S or O).
template <int M, int J>
__device__ __forceinline__ void tc_zero(float (&x)[M][J][4]) {
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
        for (int j = 0; j < J; ++j) x[m][j][0] = x[m][j][1] = x[m][j][2] = x[m][j][3] = 0.f;
}

__device__ __forceinline__ float tc_rcp(float x) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// x summed over the 4 lanes holding one row of an accumulator fragment (the lanes of one g)
__device__ __forceinline__ float tc_quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

#define TC_LN2 0.6931471805599453f
#define TC_LOG2E 1.4426950408889634f

__device__ __forceinline__ float tc_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
