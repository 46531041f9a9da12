// dQ's own pass of the backward (BWD_DQ_PASS) on Hopper's warpgroup MMA (sm_90a, WG 1): the work of
// tc/bwd_dq_pass.cuh's mma.sync block, one warpgroup a 64-row query tile of the forward list (its grid
// and order, tc_block_work), its products on wgmma. The block keeps its Q and dO tiles, streams the K
// and V tiles of its list through STAGES buffers by cp.async (the forward's TcLoadAsync on 64-column
// panels, so strided patterns load too), or with TMA 1 (unstrided patterns) by bulk tensor copies that one
// thread issues (the forward's TcLoadTma: Q and every stage completing on an mbarrier of its own; dO's and
// O's tiles on one more) and per tile:
//
//   S = Q K^T, dP = dO V^T   m64n64k16 from shared memory, K-major (Q / dO resident, K / V a
//                            stage), issued together;
//   P = exp2(S scale log2 e - lse2) on partial tiles after the mask (and where the tile reaches
//   past T), dS = P (dP - delta), both packed as A operands;
//   dQ += dS K               m64nHEAD_Dk16, A from registers, K read N-major (as the forward reads V).
//
// No accumulator in global memory: dQ (times the scale) is stored once in the storage dtype. With
// BWD_PASS_STATS 2 the block computes its rows' (lse log2 e, delta) from O's tile, copied into the K
// stage the loop refills first, and stores them in LD for the main kernel that runs after it
// (tc_bwd_pass_stats, as the mma.sync pass). One barrier a tile (the refill's). Same entry point and
// parameters as fast_tc_bwd.cu's pass, then the tensor maps of Q, K, V, dO and O ([B*H][T][HEAD_D] in
// boxes of 64 columns; read with TMA 1, zeros otherwise).
#include "tc/config.cuh"
#include "tc/common.cuh"
#include "tc/scheduler.cuh"
#include "tc/mask.cuh"
#include "tc/mainloop_sync.cuh"
#include "tc/mainloop_wgmma.cuh"
#include "tc/bwd_mma.cuh"
#include "tc/bwd_epilogue.cuh"
#include "tc/bwd_dq_pass.cuh"

static_assert(WG && NWARPS == 4 && BN == 64 && BM == 64 && !BWD_PASS_SKIP,
              "the wgmma dQ pass: one warpgroup, 64 x 64 tiles, no key-block skip");
static_assert(BWD_PASS_STATS != 2 || STAGES >= 2, "O's tile takes the K stage the loop refills first");

#if TMA
typedef TcLoadTma TcPassLoad;
#else
typedef TcLoadAsync<TcMmaWgmma> TcPassLoad;
#endif

// x = A B^T over HEAD_D, both K-major: A the resident tile at descriptor word a, B the stage's at b; one
// commit group
__device__ __forceinline__ void tc_pass_scores(TcBwdRows& x, u32 a, u32 b) {
#pragma unroll
    for (int ks = 0; ks < HEAD_D / 16; ++ks)
        wg_ss64(x, wg_desc_of(a + tc_wg_kstep<BM>(ks)), wg_desc_of(b + tc_wg_kstep<BN>(ks)), ks);
    wg_commit();
}

__device__ __forceinline__ void tc_bwd_dq_pass_wg(unsigned char* smem, const TcWork& w, int cls, const TmaMap& mapQ,
                                                  const TmaMap& mapK, const TmaMap& mapV, const TmaMap& mapdO,
                                                  const TmaMap& mapO, TC_BWD_DQ_PASS_PARAMS) {
    const int qt = w.qt, T = w.T;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane >> 2, t4 = lane & 3;
    const AB_PATTERN_T pat{AB_PATTERN_ARGS};

    // shared memory: Q, dO (resident), K stages, V stages
    TcSmem sm;
    sm.q = tc_smem_addr(smem);
    const u32 sO = sm.q + BM * HEAD_D * 2;
    sm.k = sO + BM * HEAD_D * 2;
    sm.v = sm.k + STAGES * TILE_BYTES;
    const TcGlobal gm = {Qg + w.base, Kg + w.base, Vg + w.base, nullptr, &mapQ, &mapK, &mapV, nullptr};
#if BWD_PASS_STATS == 2
    const u32 sOt = sm.k + (STAGES - 1) * TILE_BYTES;  // O's tile: the K stage the loop refills first
#else
    const u32 sOt = 0;  // (unused)
    (void)sOt;
#endif
    TcPassLoad lk;
    lk.init(sm, gm, w);
#if TMA
    const u32 bar_o = lk.bar + 8 * (STAGES + 1);  // dO's and O's copies: the barrier after the stages'
    if (threadIdx.x == 0) tma_bar_init(bar_o, 1);
    lk.begin();  // Q's and the stages' barriers, fenced with this one for the copy engine
    if (threadIdx.x == 0) {
        tma_expect(bar_o, (BWD_PASS_STATS == 2 ? 2 : 1) * BM * HEAD_D * 2);
#pragma unroll
        for (int pn = 0; pn < HEAD_D / 64; ++pn) {
            tma_load3(sO + pn * BM * 128, &mapdO, pn * 64, qt * BM, blockIdx.y, bar_o);
#if BWD_PASS_STATS == 2
            tma_load3(sOt + pn * BM * 128, &mapO, pn * 64, qt * BM, blockIdx.y, bar_o);
#endif
        }
    }
#else
    tc_load_tile<TcPanelLayout, BM>(sm.q, gm.q, qt * BM, T);
    tc_load_tile<TcPanelLayout, BM>(sO, dOg + w.base, qt * BM, T);
#if BWD_PASS_STATS == 2
    tc_load_tile<TcPanelLayout, BM>(sOt, Og + w.base, qt * BM, T);
#endif
    tc_commit();  // one group, the oldest: first_tiles waits for it
#endif
    TcTileList list;
    list.init(thead, tent, qt);
    const int n = list.n;
    lk.first_tiles(list);  // Q (with cp.async: dO and O too) landed
#if TMA
    tma_wait(bar_o, 0);
#endif

    const int row0 = qt * BM + warp * 16;
    float2* ld = LD + (size_t)w.bh * T_all + cls;  // the class's rows (tc_block_work's grid)
#if BWD_PASS_STATS
    float2 ra, rb;
    tc_bwd_pass_stats<TcPanelLayout>(Og + w.base, dOg + w.base, sOt, sO, warp * 16, Lg + (size_t)w.bh * T_all + cls,
                                     ld, row0, T, lane, g, ra, rb);
#else
    const float2 ra = tc_bwd_row_stats(ld, row0 + g, T), rb = tc_bwd_row_stats(ld, row0 + g + 8, T);
#endif
    // descriptor low words: Q, dO and the first stages of K and V K-major; K's N-major (dQ's B)
    const u32 dQa = wg_desc_lo(sm.q, 0), dOa = wg_desc_lo(sO, 0);
    const u32 dKk = wg_desc_lo(sm.k, 0), dVk = wg_desc_lo(sm.v, 0), dKn = wg_desc_lo(sm.k, BN * 128);

    TcBwdCols dq;
    tc_zero_frag(dq);
    u32 phase = 0;  // parity of the stage barriers' current phase (TMA)
    int st = 0, st_fill = STAGES - 1;
    for (int it = 0; it < n; ++it) {
        int ent_nx;
        const int ent = list.next(tent, it, ent_nx);
        TcPassLoad::refill(sm, gm, T, lk.bar, st, st_fill, phase, ent_nx, it + STAGES - 1, n);
        st_fill = st_fill == STAGES - 1 ? 0 : st_fill + 1;
        const u32 so = (u32)st * (TILE_BYTES >> 4);  // the stage's offset in descriptor units
        if (st == STAGES - 1) phase ^= 1;
        st = st == STAGES - 1 ? 0 : st + 1;
        const int kt = tc_entry_tile(ent);

        TcBwdRows s, dp;
        TcBwdFrag p, f;
        wg_fence();
        tc_pass_scores(s, dQa, dKk + so);   // S = Q K^T
        tc_pass_scores(dp, dOa, dVk + so);  // dP = dO V^T
        wg_wait<1>();
        if ((ent & 1) || kt * BN + BN > T) tc_mask_frag(s, pat, row0, kt * BN, T, g, t4);
        tc_bwd_probs(s, ra, rb, scale_log2);  // P
        tc_bwd_pack(p, s);
        wg_wait<0>();
        tc_bwd_dscores(dp, p, ra, rb);  // dS
        tc_bwd_pack(f, dp);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk)  // dQ += dS K
            WG_CAT(wg_rs, HEAD_D)(dq, f[kk], wg_desc_of(dKn + so + ((kk * 16 * 128) >> 4)), 1);
        wg_commit();
        wg_wait<0>();  // K's stage is refilled after the next step's barrier
    }
    TcPassLoad::drain();
    tc_bwd_store_cols(dQg + w.base, dq, scale, row0, T, g, t4);
}

extern "C" __global__ void __launch_bounds__(THREADS, MINB)
fast_tc_bwd_dq_pass(TC_BWD_DQ_PASS_PARAMS, const __grid_constant__ TmaMap mapQ, const __grid_constant__ TmaMap mapK,
                    const __grid_constant__ TmaMap mapV, const __grid_constant__ TmaMap mapdO,
                    const __grid_constant__ TmaMap mapO) {
    extern __shared__ __align__(1024) unsigned char smem[];
    tc_bwd_dq_pass_wg(smem, tc_block_work(T_all), blockIdx.z, mapQ, mapK, mapV, mapdO, mapO, TC_BWD_DQ_PASS_ARGS);
}
