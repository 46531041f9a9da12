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
// boxes of 64 columns; read with TMA 1, zeros otherwise). BWD_PERSIST 1 (cp.async): about the GPU's
// resident blocks, each taking the works of that grid in turn (three more parameters: its width, heads
// and works), the next work's loads issued before this one's dQ is stored.
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

// the layout of the pass's shared memory: Q, dO (resident), K stages, V stages; O's tile (BWD_PASS_STATS 2) in
// the K stage the loop refills first
struct TcPassSmem {
    TcSmem sm;
    u32 o, ot;  // dO's tile, O's
};

__device__ __forceinline__ TcPassSmem tc_pass_smem(unsigned char* smem) {
    TcPassSmem p;
    p.sm.q = tc_smem_addr(smem);
    p.o = p.sm.q + BM * HEAD_D * 2;
    p.sm.k = p.o + BM * HEAD_D * 2;
    p.sm.v = p.sm.k + STAGES * TILE_BYTES;
#if BWD_PASS_STATS == 2
    p.ot = p.sm.k + (STAGES - 1) * TILE_BYTES;
#else
    p.ot = 0;  // (unused)
#endif
    return p;
}

#if !TMA
// work w's loads by cp.async: its Q, dO (and O) tiles in one group, then its list's first STAGES - 1 K and V
// stages (lk.issue_first); the caller waits for them (TcPassLoad::wait_first)
__device__ __forceinline__ void tc_pass_issue(TcPassLoad& lk, const TcPassSmem& ps, const TcGlobal& gm, const TcWork& w,
                                              TcTileList& list, const int4* __restrict__ thead,
                                              const int* __restrict__ tent, const u16* __restrict__ dOg,
                                              const u16* __restrict__ Og) {
    lk.init(ps.sm, gm, w);
    tc_load_tile<TcPanelLayout, BM>(ps.sm.q, gm.q, w.qt * BM, w.T);
    tc_load_tile<TcPanelLayout, BM>(ps.o, dOg + w.base, w.qt * BM, w.T);
#if BWD_PASS_STATS == 2
    tc_load_tile<TcPanelLayout, BM>(ps.ot, Og + w.base, w.qt * BM, w.T);
#else
    (void)Og;
#endif
    tc_commit();  // one group, the oldest: wait_first waits for it
    list.init(thead, tent, w.qt);
    lk.issue_first(list);
}
#endif

// the rows' (lse2, delta) of work w (residue class cls), rows row0 + g and + 8: with BWD_PASS_STATS computed from O
// and dO and stored in LD for the main kernel, else LD's
__device__ __forceinline__ void tc_pass_rows(float2& ra, float2& rb, const TcPassSmem& ps, const TcWork& w, int cls,
                                             int row0, int warp, int lane, int g, int T_all, const u16* __restrict__ Og,
                                             const u16* __restrict__ dOg, const float* __restrict__ Lg,
                                             float2* __restrict__ LD) {
    float2* ld = LD + (size_t)w.bh * T_all + cls;  // the class's rows (tc_block_work's grid)
#if BWD_PASS_STATS
    tc_bwd_pass_stats<TcPanelLayout>(Og + w.base, dOg + w.base, ps.ot, ps.o, warp * 16, Lg + (size_t)w.bh * T_all + cls,
                                     ld, row0, w.T, lane, g, ra, rb);
#else
    (void)Og, (void)dOg, (void)Lg, (void)warp, (void)lane;
    ra = tc_bwd_row_stats(ld, row0 + g, w.T);
    rb = tc_bwd_row_stats(ld, row0 + g + 8, w.T);
#endif
}

// dq = dS K summed over the tiles of the list (the loop: stage refills as TcPassLoad's, bar its barriers with TMA);
// the last product waited
template <class P>
__device__ __forceinline__ void tc_pass_tiles(TcBwdCols& dq, TcTileList& list, const int* __restrict__ tent,
                                              const TcPassSmem& ps, const TcGlobal& gm, int T, u32 bar, const P& pat,
                                              int row0, float2 ra, float2 rb, float scale_log2, int g, int t4) {
    // descriptor low words: Q, dO and the first stages of K and V K-major; K's N-major (dQ's B)
    const u32 dQa = wg_desc_lo(ps.sm.q, 0), dOa = wg_desc_lo(ps.o, 0);
    const u32 dKk = wg_desc_lo(ps.sm.k, 0), dVk = wg_desc_lo(ps.sm.v, 0), dKn = wg_desc_lo(ps.sm.k, BN * 128);
    const int n = list.n;
    tc_zero_frag(dq);
    u32 phase = 0;  // parity of the stage barriers' current phase (TMA)
    int st = 0, st_fill = STAGES - 1;
    for (int it = 0; it < n; ++it) {
        int ent_nx;
        const int ent = list.next(tent, it, ent_nx);
        TcPassLoad::refill(ps.sm, gm, T, bar, st, st_fill, phase, ent_nx, it + STAGES - 1, n);
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
}

__device__ __forceinline__ void tc_bwd_dq_pass_wg(unsigned char* smem, const TcWork& w, int cls, const TmaMap& mapQ,
                                                  const TmaMap& mapK, const TmaMap& mapV, const TmaMap& mapdO,
                                                  const TmaMap& mapO, TC_BWD_DQ_PASS_PARAMS) {
    const int qt = w.qt, T = w.T;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane >> 2, t4 = lane & 3;
    const AB_PATTERN_T pat{AB_PATTERN_ARGS};

    const TcPassSmem ps = tc_pass_smem(smem);
    const TcGlobal gm = {Qg + w.base, Kg + w.base, Vg + w.base, nullptr, &mapQ, &mapK, &mapV, nullptr};
    TcPassLoad lk;
    TcTileList list;
#if TMA
    lk.init(ps.sm, gm, w);
    const u32 bar_o = lk.bar + 8 * (STAGES + 1);  // dO's and O's copies: the barrier after the stages'
    if (threadIdx.x == 0) tma_bar_init(bar_o, 1);
    lk.begin();  // Q's and the stages' barriers, fenced with this one for the copy engine
    if (threadIdx.x == 0) {
        tma_expect(bar_o, (BWD_PASS_STATS == 2 ? 2 : 1) * BM * HEAD_D * 2);
#pragma unroll
        for (int pn = 0; pn < HEAD_D / 64; ++pn) {
            tc_tma_load_rows(ps.o + pn * BM * 128, &mapdO, pn * 64, qt * BM, blockIdx.y, bar_o);
#if BWD_PASS_STATS == 2
            tc_tma_load_rows(ps.ot + pn * BM * 128, &mapO, pn * 64, qt * BM, blockIdx.y, bar_o);
#endif
        }
    }
    list.init(thead, tent, qt);
    lk.first_tiles(list);  // Q landed
    tma_wait(bar_o, 0);
#else
    (void)mapdO, (void)mapO;
    tc_pass_issue(lk, ps, gm, w, list, thead, tent, dOg, Og);
    TcPassLoad::wait_first();  // Q, dO and O landed
#endif

    const int row0 = qt * BM + warp * 16;
    float2 ra, rb;
    tc_pass_rows(ra, rb, ps, w, cls, row0, warp, lane, g, T_all, Og, dOg, Lg, LD);
    TcBwdCols dq;
    tc_pass_tiles(dq, list, tent, ps, gm, T, lk.bar, pat, row0, ra, rb, scale_log2, g, t4);
    TcPassLoad::drain();
    tc_bwd_store_cols(dQg + w.base, dq, scale, row0, T, g, t4);
}

#ifndef BWD_PERSIST
#define BWD_PERSIST 0
#endif
#if !BWD_PERSIST
extern "C" __global__ void __launch_bounds__(THREADS, MINB)
fast_tc_bwd_dq_pass(TC_BWD_DQ_PASS_PARAMS, const __grid_constant__ TmaMap mapQ, const __grid_constant__ TmaMap mapK,
                    const __grid_constant__ TmaMap mapV, const __grid_constant__ TmaMap mapdO,
                    const __grid_constant__ TmaMap mapO) {
    extern __shared__ __align__(1024) unsigned char smem[];
    tc_bwd_dq_pass_wg(smem, tc_block_work(T_all), blockIdx.z, mapQ, mapK, mapV, mapdO, mapO, TC_BWD_DQ_PASS_ARGS);
}
#else
// BWD_PERSIST: gridDim.x blocks (about the GPU's resident ones) take the works b = blockIdx.x, + gridDim.x, ...
// below `total` of the non-persistent grid (nqx query tiles, BH heads, the residue classes) in its launch order. Once
// a work's products are done, the block issues the next one's Q, dO (O) and first K and V stages, then stores its
// dQ while they land, so a work's loads wait behind another's stores instead of a block's launch. cp.async only.
static_assert(!TMA, "the persistent pass loads by cp.async");

extern "C" __global__ void __launch_bounds__(THREADS, MINB)
fast_tc_bwd_dq_pass(TC_BWD_DQ_PASS_PARAMS, const __grid_constant__ TmaMap mapQ, const __grid_constant__ TmaMap mapK,
                    const __grid_constant__ TmaMap mapV, const __grid_constant__ TmaMap mapdO,
                    const __grid_constant__ TmaMap mapO, int nqx, int BH, int total) {
    extern __shared__ __align__(1024) unsigned char smem[];
    (void)mapQ, (void)mapK, (void)mapV, (void)mapdO, (void)mapO;
    int b = blockIdx.x;
    if (b >= total) return;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane >> 2, t4 = lane & 3;
    const AB_PATTERN_T pat{AB_PATTERN_ARGS};
    const TcPassSmem ps = tc_pass_smem(smem);
    int cls;
    TcWork w = tc_block_work_flat(T_all, nqx, BH, b, cls);
    TcGlobal gm = {Qg + w.base, Kg + w.base, Vg + w.base, nullptr, nullptr, nullptr, nullptr, nullptr};
    TcPassLoad lk;
    TcTileList list;
    tc_pass_issue(lk, ps, gm, w, list, thead, tent, dOg, Og);
    for (;;) {
        TcPassLoad::wait_first();  // Q, dO and O landed
        const int row0 = w.qt * BM + warp * 16;
        float2 ra, rb;
        tc_pass_rows(ra, rb, ps, w, cls, row0, warp, lane, g, T_all, Og, dOg, Lg, LD);
        TcBwdCols dq;
        tc_pass_tiles(dq, list, tent, ps, gm, w.T, 0, pat, row0, ra, rb, scale_log2, g, t4);
        TcPassLoad::drain();
        const TcWork done = w;
        b += gridDim.x;
        if (b < total) {
            __syncthreads();  // every warp is done with this work's Q, dO, O and stages
            w = tc_block_work_flat(T_all, nqx, BH, b, cls);
            gm = {Qg + w.base, Kg + w.base, Vg + w.base, nullptr, nullptr, nullptr, nullptr, nullptr};
            tc_pass_issue(lk, ps, gm, w, list, thead, tent, dOg, Og);
        }
        tc_bwd_store_cols(dQg + done.base, dq, scale, row0, done.T, g, t4);
        if (b >= total) break;
    }
}
#endif
