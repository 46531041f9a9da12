// dQ's own pass (BWD_DQ_PASS) as the work of one block, and the walk the mma.sync loops share: one
// step of a walk over a list whose tiles stream through the STAGES buffers.
//   TcBwdWalk::step(list, tent, sm, gm, T, it, n, so): the list's next entry, the wait for this
//     tile and the refill of the stage the previous one freed; so: this tile's stage offset.
//   tc_bwd_dq_pass_block(smem, w, cls, ...): the pass's block of work w (query tile w.qt, head
//     w.bh, residue class cls); fast_tc_bwd.cu's fast_tc_bwd_dq_pass runs one a block (its grid),
//     fast_tc_bwd_wg.cu's fused launch runs them among the main loop's items.
// The mma.sync products and cp.async loads, on any build whose BM == BN == 64 * NWARPS / 4 (one
// warpgroup's shape on wgmma builds).
#pragma once
#include "tc/common.cuh"
#include "tc/scheduler.cuh"
#include "tc/mask.cuh"
#include "tc/mainloop_sync.cuh"
#include "tc/bwd_mma.cuh"
#include "tc/bwd_epilogue.cuh"

struct TcBwdWalk {
    int st = 0, st_fill = STAGES - 1;

    __device__ __forceinline__ int step(TcTileList& list, const int* __restrict__ tent, const TcSmem& sm,
                                        const TcGlobal& gm, int T, int it, int n, u32& so) {
        int ent_nx;
        const int ent = list.next(tent, it, ent_nx);
        TcLoadAsync<TcMmaSync>::refill(sm, gm, T, 0, st, st_fill, 0, ent_nx, it + STAGES - 1, n);
        st_fill = st_fill == STAGES - 1 ? 0 : st_fill + 1;
        so = st * TILE_BYTES;
        st = st == STAGES - 1 ? 0 : st + 1;
        return ent;
    }
};

#ifndef BWD_PASS_STATS
#define BWD_PASS_STATS 0
#endif
// BWD_PASS_SKIP 1: a warp skips dP's and dQ's products on the 16-key blocks of a tile where its P is
// all zero (masked keys: a causal diagonal's far side, a sink tile past its sinks)
#ifndef BWD_PASS_SKIP
#define BWD_PASS_SKIP 0
#endif
// A warp's 16 rows' (lse2, delta) computed here (BWD_PASS_STATS; prep's work, so that the pass runs
// first and no prep launch reads O and dO again): two lanes a row (lane 2 i + h: row row0 + i, the
// h-th half of its columns) take delta = rowsum(dO * O), store (lse * log2 e, delta) in LD for the
// main kernel that follows, and hand rows g and g + 8 to the lanes of the mma layout. Past T:
// (+inf, 0), as tc_bwd_row_stats. Where O and dO come from:
//   BWD_PASS_STATS 1: global memory (dO's rows are being loaded into shared memory beside it, so
//     from L2), loads the block waits for before its first tile;
//   BWD_PASS_STATS 2: shared memory, O's tile copied (cp.async) in the group of Q and dO into the
//     K stage the loop refills first (free until then), so its read overlaps theirs; rl0 the
//     warp's first row in the tiles (in layout L).
__device__ __forceinline__ uint4 tc_lds16(u32 addr) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
    return v;
}

// (L: the tiles' layout, TcRowLayout for the mma.sync products, TcPanelLayout for wgmma's)
template <class L = TcRowLayout>
__device__ __forceinline__ void tc_bwd_pass_stats(const u16* __restrict__ o, const u16* __restrict__ dO, u32 sOt,
                                                  u32 sdO, int rl0, const float* __restrict__ lse,
                                                  float2* __restrict__ ld, int row0, int T, int lane, int g,
                                                  float2& ra, float2& rb) {
    const int r = row0 + (lane >> 1), h = lane & 1;
    float d = 0.f, l2 = __int_as_float(0x7f800000);
    if (r < T) {
#if BWD_PASS_STATS == 2
        const int rl = rl0 + (lane >> 1);
#pragma unroll
        for (int c = h * (HEAD_D / 16); c < (h + 1) * (HEAD_D / 16); ++c) {
            const u32 at = L::template swz<BM>(rl, c);
            d = tc_dot8(tc_lds16(sOt + at), tc_lds16(sdO + at), d);
        }
#else
        const size_t at = (size_t)tc_seq_row(r) * STRIDE * HEAD_D + h * (HEAD_D / 2);
#pragma unroll
        for (int c = 0; c < HEAD_D / 2; c += 8)
            d = tc_dot8(*reinterpret_cast<const uint4*>(o + at + c), *reinterpret_cast<const uint4*>(dO + at + c), d);
#endif
        l2 = lse[(size_t)r * STRIDE] * TC_LOG2E;
    }
    d += __shfl_xor_sync(0xffffffffu, d, 1);
    if (r < T && h == 0) ld[(size_t)r * STRIDE] = make_float2(l2, d);
    ra = make_float2(__shfl_sync(0xffffffffu, l2, 2 * g), __shfl_sync(0xffffffffu, d, 2 * g));
    rb = make_float2(__shfl_sync(0xffffffffu, l2, 2 * g + 16), __shfl_sync(0xffffffffu, d, 2 * g + 16));
}

// dQ query-tile-major over the forward list (its grid and order, tc_block_work): the block keeps its
// Q and dO tiles and its rows' (lse2, delta) (read from prep's LD, or with BWD_PASS_STATS computed
// here and stored in LD for the main kernel, launched after this one), streams the K and V tiles of
// its list through the forward's stages and, per tile, recomputes S, P, dP and dS as the main
// kernel does and adds dS K to dQ in registers; dQ (times the scale) stored once in the storage
// dtype. One barrier a tile (the refill's): nothing is staged.
// the pass's parameters, in the order of its entry point (fast_tc_bwd_dq_pass of fast_tc_bwd.cu and of
// fast_tc_bwd_dq_wg.cu: the host launches either the same way), and of the blocks' work after (smem, w, cls)
#define TC_BWD_DQ_PASS_PARAMS                                                                               \
    const u16 *__restrict__ Qg, const u16 *__restrict__ Kg, const u16 *__restrict__ Vg,                    \
        const u16 *__restrict__ dOg, float2 *__restrict__ LD, u16 *__restrict__ dQg,                       \
        const int4 *__restrict__ thead, const int *__restrict__ tent, int T_all, float scale_log2, float scale, \
        const int *__restrict__ table, const u16 *__restrict__ Og, const float *__restrict__ Lg
#define TC_BWD_DQ_PASS_ARGS Qg, Kg, Vg, dOg, LD, dQg, thead, tent, T_all, scale_log2, scale, table, Og, Lg

__device__ __forceinline__ void tc_bwd_dq_pass_block(unsigned char* smem, const TcWork& w, int cls,
                                                     TC_BWD_DQ_PASS_PARAMS) {
    const int qt = w.qt, T = w.T;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane >> 2, t4 = lane & 3;
    const AB_PATTERN_T pat{AB_PATTERN_ARGS};

    // shared memory: Q, dO (resident), K stages, V stages
    TcSmem sm;
    sm.q = tc_smem_addr(smem);
    const u32 sO = sm.q + TILE_BYTES;
    sm.k = sO + TILE_BYTES;
    sm.v = sm.k + STAGES * TILE_BYTES;
    const TcGlobal gm = {Qg + w.base, Kg + w.base, Vg + w.base, nullptr, nullptr, nullptr, nullptr, nullptr};
    tc_load_tile<TcRowLayout, BM>(sm.q, gm.q, qt * BM, T);
    tc_load_tile<TcRowLayout, BM>(sO, dOg + w.base, qt * BM, T);
#if BWD_PASS_STATS == 2
    static_assert(BM == BN && STAGES >= 2, "O's tile takes a K stage: BM == BN rows, a stage past the first");
    const u32 sOt = sm.k + (STAGES - 1) * TILE_BYTES;  // O's tile: the K stage the loop refills first
    tc_load_tile<TcRowLayout, BM>(sOt, Og + w.base, qt * BM, T);
#else
    const u32 sOt = 0;  // (unused)
    (void)sOt;
#endif
    tc_commit();  // one group, the oldest: first_tiles waits for it
    TcLoadAsync<TcMmaSync> lk;
    lk.init(sm, gm, w);
    TcTileList list;
    list.init(thead, tent, qt);
    const int n = list.n;
    lk.first_tiles(list);

    const int row0 = qt * BM + warp * 16;
    float2* ld = LD + (size_t)w.bh * T_all + cls;  // the class's rows (tc_block_work's grid)
#if BWD_PASS_STATS
    float2 ra, rb;
    tc_bwd_pass_stats(Og + w.base, dOg + w.base, sOt, sO, warp * 16, Lg + (size_t)w.bh * T_all + cls, ld, row0,
                      T, lane, g, ra, rb);
#else
    const float2 ra = tc_bwd_row_stats(ld, row0 + g, T), rb = tc_bwd_row_stats(ld, row0 + g + 8, T);
#endif
    const u32 aQ = sm.q + warp * 16 * BWD_ROWB + tc_lane_a(lane, BWD_ROWB);
    const u32 aO = sO + warp * 16 * BWD_ROWB + tc_lane_a(lane, BWD_ROWB);
    const u32 nK = sm.k + tc_lane_n(lane, BWD_ROWB), nV = sm.v + tc_lane_n(lane, BWD_ROWB);
    const u32 tK = sm.k + tc_lane_t(lane, BWD_ROWB);

    TcBwdCols dq;
    tc_zero_frag(dq);
    TcBwdWalk walk;
    for (int it = 0; it < n; ++it) {
        u32 so;
        const int ent = walk.step(list, tent, sm, gm, T, it, n, so);
        const int kt = tc_entry_tile(ent);

        TcBwdRows x;
        TcBwdFrag p, f;
        tc_bwd_rows(x, aQ, nK + so);  // S = Q K^T
        if ((ent & 1) || kt * BN + BN > T) tc_mask_frag(x, pat, row0, kt * BN, T, g, t4);
        tc_bwd_probs(x, ra, rb, scale_log2);
#if BWD_PASS_SKIP
        const unsigned live = tc_bwd_live(x);  // the warp's key blocks with a nonzero P (dS zero elsewhere)
        tc_bwd_pack(p, x);
        tc_bwd_rows_live(x, aO, nV + so, live);  // dP = dO V^T
        tc_bwd_dscores(x, p, ra, rb);
        tc_bwd_pack(f, x);
        tc_bwd_dq_mac_live<HEAD_D>(dq, f, tK + so, 0, live);  // dQ += dS K
#else
        tc_bwd_pack(p, x);
        tc_bwd_rows(x, aO, nV + so);  // dP = dO V^T
        tc_bwd_dscores(x, p, ra, rb);
        tc_bwd_pack(f, x);
        tc_bwd_dq_mac<HEAD_D>(dq, f, tK + so, 0);  // dQ += dS K
#endif
    }
    TcLoadAsync<TcMmaSync>::drain();
    tc_bwd_store_cols(dQg + w.base, dq, scale, row0, T, g, t4);
}
