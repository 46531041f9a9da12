// The wgmma main loop's parts (sm_90a only; WG 1): both products on Hopper's warpgroup MMA instead
// of mma.sync (TcMmaWgmma, TC_PV_WGMMA), and the loads by bulk tensor copies (TMA 1, unstrided
// patterns: TcLoadTma, TC_TMA_REFILL; strided ones load by cp.async, TcLoadAsync of
// tc/mainloop_sync.cuh).
//
// Products: tiles are stored as 64-column panels (TcPanelLayout: the XOR swizzle of the row
// layout within each is the 128-byte swizzle wgmma expects). S = Q K^T is wgmma m64nBNk16 with Q
// and K read from shared memory through descriptors, O += P V is m64nHEAD_Dk16 with P from
// registers and V read N-major; each warpgroup owns 64 rows, and each product is issued,
// committed and waited for in one batch (the softmax between them is unchanged).
//   TcMmaWgmma::Layout; qk(s, dQ, dK, so): S = Q K^T; vote(x): over the block (its warpgroups
//   issue S together); fence_loads(): cp.async writes (generic proxy) made visible to wgmma (async
//   proxy). TC_PV_WGMMA(acc, s, dV, so): O += P V.
// Loads: Q and the K/V tiles come by bulk tensor copies (kernels/tma.cuh) that one thread issues,
// each stage completing on its own mbarrier, instead of a cp.async per 16-byte chunk per thread;
// the copy engine applies the 128-byte swizzle and zero-fills rows >= T (the output goes back the
// same way, TC_STORE_TMA of tc/epilogue.cuh). The tensor maps (Q, K, V, O: [B*H][T][HEAD_D] viewed
// in boxes of 64 columns) come by value; other builds take them too and ignore them.
//   tma_load_kv(dK, dV, mapK, mapV, row0, bar): rows row0.. of K and V, completing on bar.
//   TcLoadTma: init(sm, gm, w); begin(): the barriers (after the V stages: Q's, then one per
//     stage); first_tiles(list): Q, then the list's first tiles; waits for Q; bar; drain().
//   TC_TMA_REFILL(sK, sV, mapK, mapV, bar, st, st_fill, phase, ent_nx, nx, n): waits until every
//     warp is done with stage st_fill, refills it with tile nx when nx < n, waits for stage st.
#pragma once
#include "tc/scheduler.cuh"

#define WG_CAT2(a, b) a##b
#define WG_CAT(a, b) WG_CAT2(a, b)

struct TcMmaWgmma {
    typedef TcPanelLayout Layout;

    // S = Q K^T for this warpgroup's 64 rows, one batch: dQ, dK the descriptor low words of the Q
    // tile (this warpgroup's rows) and of K's first stage, so the stage's offset in descriptor units
    static __device__ __forceinline__ void qk(float (&s)[MT][BN / 8][4], u32 dQ, u32 dK, u32 so) {
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < HEAD_D / 16; ++ks)  // k-step ks: panel ks / 4, 32 bytes a step in it
            WG_CAT(wg_ss, BN)(s[0], wg_desc_of(dQ + (((ks >> 2) * BM * 128 + (ks & 3) * 32) >> 4)),
                              wg_desc_of(dK + so + (((ks >> 2) * BN * 128 + (ks & 3) * 32) >> 4)), ks);
        wg_commit();
        wg_wait<0>();
    }

    // whether x holds on any thread that issues the products together (the block: its warpgroups
    // issue S together)
    static __device__ __forceinline__ bool vote(bool x) { return __syncthreads_or(x); }
    // completed cp.async writes (generic proxy) made visible to wgmma's reads (async proxy)
    static __device__ __forceinline__ void fence_loads() { wg_fence_smem(); }
};

// O += P V for this warpgroup's 64 rows, one batch: P from registers (tc_p_frag), V read N-major
// through descriptors (dV: V's first stage, so: this stage's offset)
#define TC_PV_WGMMA(acc, s, dV, so)                                                                 \
    {                                                                                               \
        u32 pa[BN / 16][4];                                                                         \
        _Pragma("unroll") for (int kk = 0; kk < BN / 16; ++kk) tc_p_frag(pa[kk], s[0], kk);         \
        wg_fence();                                                                                 \
        _Pragma("unroll") for (int kk = 0; kk < BN / 16; ++kk)                                      \
            WG_CAT(wg_rs, HEAD_D)(acc[0], pa[kk], wg_desc_of(dV + so + ((kk * 16 * 128) >> 4)), 1); \
        wg_commit();                                                                                \
        wg_wait<0>();                                                                               \
                                                                                                    \
    }

// Rows [row0, row0 + BN) of this block's head (blockIdx.y) of K and V into their stages, both completing on `bar`.
__device__ __forceinline__ void tma_load_kv(u32 dK, u32 dV, const void* mapK, const void* mapV, int row0, u32 bar) {
    tma_expect(bar, 2 * TILE_BYTES);
#pragma unroll
    for (int pn = 0; pn < HEAD_D / 64; ++pn) {
        tma_load3(dK + pn * BN * 128, mapK, pn * 64, row0, blockIdx.y, bar);
        tma_load3(dV + pn * BN * 128, mapV, pn * 64, row0, blockIdx.y, bar);
    }
}

struct TcLoadTma {
    TcSmem sm;
    TcGlobal gm;
    int qt;
    u32 bar;  // the mbarriers after the V stages: Q's, then one per stage

    __device__ __forceinline__ void init(const TcSmem& sm_, const TcGlobal& gm_, const TcWork& w) {
        sm = sm_;
        gm = gm_;
        qt = w.qt;
        bar = sm.v + STAGES * TILE_BYTES;
    }

    __device__ __forceinline__ void begin() {
        if (threadIdx.x == 0) {
#pragma unroll
            for (int s = 0; s <= STAGES; ++s) tma_bar_init(bar + 8 * s, 1);
            tma_bar_fence_init();
        }
        __syncthreads();  // the barriers are initialised before anyone (the copy engine too) uses them
    }

    __device__ __forceinline__ void first_tiles(const TcTileList& list) {
        if (threadIdx.x == 0) {
            // Q's copy first, then the list's first tiles (their test of n waits for the head's load)
            tma_expect(bar, BM * HEAD_D * 2);
#pragma unroll
            for (int pn = 0; pn < HEAD_D / 64; ++pn)
                tma_load3(sm.q + pn * BM * 128, gm.mq, pn * 64, qt * BM, blockIdx.y, bar);
#pragma unroll
            for (int s = 0; s < STAGES - 1; ++s)
                if (s < list.n)
                    tma_load_kv(sm.k + s * TILE_BYTES, sm.v + s * TILE_BYTES, gm.mk, gm.mv,
                                tc_entry_tile(list.ring[s]) * BN, bar + 8 * (s + 1));
        }
        tma_wait(bar, 0);
    }

    static __device__ __forceinline__ void drain() {}
};

// TcLoadTma's step of the tile loop: waits until every warp is done with stage st_fill (tile
// it - 1's), then thread 0 refills it with tile nx (entry ent_nx) when nx < n, and all wait for
// tile it (stage st, barrier phase `phase`). (A macro: as a function the TMA builds' cubins change.)
#define TC_TMA_REFILL(SK, SV, MAPK, MAPV, BAR, ST, ST_FILL, PHASE, ENT_NX, NX, N)               \
    {                                                                                           \
        __syncthreads(); /* every warp is done with the stage refilled below (tile it - 1's) */ \
        if (threadIdx.x == 0 && NX < N)                                                         \
            tma_load_kv(SK + ST_FILL * TILE_BYTES, SV + ST_FILL * TILE_BYTES, MAPK, MAPV,       \
                        (ENT_NX >> 1) * BN, BAR + 8 * (ST_FILL + 1));                           \
        tma_wait(BAR + 8 * (ST + 1), PHASE); /* tile `it` has landed */                         \
    }
