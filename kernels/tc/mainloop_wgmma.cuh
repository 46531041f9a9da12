// The wgmma main loop's parts (sm_90a only; WG 1): both products on Hopper's warpgroup MMA instead
// of mma.sync (TcMmaWgmma), and the loads by bulk tensor copies (TMA 1, unstrided patterns:
// TcLoadTma; strided ones load by cp.async, TcLoadAsync of tc/mainloop_sync.cuh). Both keep the
// interfaces written in tc/mainloop_sync.cuh.
//
// Products: tiles are stored as 64-column panels (TcPanelLayout: the XOR swizzle of the row
// layout within each is the 128-byte swizzle wgmma expects). S = Q K^T is wgmma m64nBNk16 with Q
// and K read from shared memory through descriptors (Ops: their low words), O += P V is
// m64nHEAD_Dk16 with P from registers and V read N-major; each warpgroup owns 64 rows (KWG 2, kernels/decode.cu:
// two warpgroups own the same 64 rows, each a BN-key slice of a stage of 2 x BN keys), and each
// product is issued, committed and waited for in one batch (the softmax between them is
// unchanged). vote(x) is over the block (with REL over the warpgroup); fence_loads() makes
// cp.async writes (generic proxy) visible to wgmma (async proxy).
// Loads: Q and the K/V tiles come by bulk tensor copies (kernels/tma.cuh) that one thread issues,
// each stage completing on its own mbarrier, instead of a cp.async per 16-byte chunk per thread;
// the copy engine applies the 128-byte swizzle and zero-fills rows >= T (the output goes back the
// same way, tc_store_tma of tc/epilogue.cuh). The tensor maps (Q, O: [B*H][T][HEAD_D], K, V: [B*H_kv][T][HEAD_D], viewed
// in boxes of 64 columns) come by value; other builds take them too and ignore them.
//   tma_load_kv(dK, dV, mapK, mapV, row0, bar): rows row0.. of K and V, completing on bar.
//   TcLoadTma: begin() initialises the barriers (after the V stages: Q's, then one per stage);
//     first_tiles(list): Q, then the list's first tiles; waits for Q; refill: waits until every
//     warp is done with stage st_fill (a block barrier), refills it, waits for stage st; release(bar, st):
//     nothing (tc/load_released.cuh's TcLoadTmaReleased waits on the warps' arrivals instead, REL 1);
//     refill_k, wait_v, release_k: nothing (the overlapped walk's hooks for tc/load_split.cuh, KVS 1).
#pragma once
#include "tc/scheduler.cuh"

#define WG_CAT2(a, b) a##b
#define WG_CAT(a, b) WG_CAT2(a, b)

// k-step ks of a K-major tile of ROWS-row panels: panel ks / 4, 32 bytes a step within it (descriptor units;
// the forward's S, the backward's products and dQ's pass on wgmma)
template <int ROWS>
__device__ __forceinline__ u32 tc_wg_kstep(int ks) { return (u32)(((ks >> 2) * ROWS * 128 + (ks & 3) * 32) >> 4); }

struct TcMmaWgmma {
    typedef TcPanelLayout Layout;

    // descriptor low words (start address, LBO) of this warpgroup's 64 Q rows and of K's and V's
    // first stages: a k-step, panel or stage adds a constant to them
    struct Ops {
        u32 q, k, v;
    };

    // (KWG 2: warpgroup w takes rows (w / KWG) * 64.. and keys (w % KWG) * BN.. of a stage of KWG * BN)
    static __device__ __forceinline__ void init(Ops& op, const TcSmem& sm, int warp, int lane) {
        const int w = warp >> 2;
        op.q = wg_desc_lo(sm.q + (u32)((w / KWG) * 64 * 128), 0);
        op.k = wg_desc_lo(sm.k + (u32)((w % KWG) * BN * 128), 0);
        op.v = wg_desc_lo(sm.v + (u32)((w % KWG) * BN * 128), KWG * BN * 128);
    }

    // S = Q K^T for this warpgroup's 64 rows, one batch, K from stage st
    static __device__ __forceinline__ void qk(TcS& s, const Ops& op, int st) {
        qk_issue(s, op, st);
        wg_wait<0>();
    }

    // O += P V for this warpgroup's 64 rows, one batch: P from registers (tc_p_frag), V of stage st
    // read N-major through descriptors (an idle warp's P is 0: it issues the batch with its group)
    static __device__ __forceinline__ void pv(TcAcc& acc, const TcS& s, const Ops& op, int st, bool idle) {
        TcP pa;
        p_frags(pa, s);
        pv_issue(acc, pa, op, st);
        wg_wait<0>();
    }

    // The halves of qk and pv: each batch issued and committed, its wait the caller's (qk and pv above;
    // tc/loop_overlap.cuh keeps S of one tile and P V of the one before in flight together). P's
    // fragments are their own registers, which P V reads until its wait.
    typedef u32 TcP[BN / 16][4];
    static __device__ __forceinline__ void qk_issue(TcS& s, const Ops& op, int st) {
        const u32 so = (u32)st * (TILE_BYTES >> 4);  // the stage's offset in descriptor units
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < HEAD_D / 16; ++ks)
            WG_CAT(wg_ss, BN)(s[0], wg_desc_of(op.q + tc_wg_kstep<BM>(ks)), wg_desc_of(op.k + so + tc_wg_kstep<KWG * BN>(ks)),
                              ks);
        wg_commit();
    }
    static __device__ __forceinline__ void p_frags(TcP& pa, const TcS& s) {
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) tc_p_frag(pa[kk], s[0], kk);
    }
    static __device__ __forceinline__ void pv_issue(TcAcc& acc, const TcP& pa, const Ops& op, int st) {
        const u32 so = (u32)st * (TILE_BYTES >> 4);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk)
            WG_CAT(wg_rs, HEAD_D)(acc[0], pa[kk], wg_desc_of(op.v + so + ((kk * 16 * 128) >> 4)), 1);
        wg_commit();
    }

    // whether x holds on any thread of the warpgroup (the lazy pass's redo of S is the warpgroup's): over the block
    // (__syncthreads_or), or with REL, whose walk has no block barrier, over the warpgroup alone (named barrier
    // 1 + its number, 128 threads)
    static __device__ __forceinline__ bool vote(bool x) {
#if REL && NWARPS > 4
        unsigned r;
        asm volatile("{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n bar.red.or.pred q, %2, 128, p;\n"
                     " selp.u32 %0, 1, 0, q;\n}\n"
                     : "=r"(r) : "r"((unsigned)x), "r"(1 + (int)(threadIdx.x / 128)) : "memory");
        return r != 0;
#else
        return __syncthreads_or(x);
#endif
    }
    // completed cp.async writes (generic proxy) made visible to wgmma's reads (async proxy)
    static __device__ __forceinline__ void fence_loads() { wg_fence_smem(); }
};

// Rows [row0, row0 + BN) of this block's key/value head (tc_kv_bh(): blockIdx.y when KV_GROUP 1; the maps of K
// and V are [B * H_kv][T][HEAD_D]) of K and V into their stages, both completing on `bar`.
__device__ __forceinline__ void tma_load_kv(u32 dK, u32 dV, const void* mapK, const void* mapV, int row0, u32 bar) {
    tma_expect(bar, 2 * TILE_BYTES);
#pragma unroll
    for (int pn = 0; pn < HEAD_D / 64; ++pn) {
        tc_tma_load_rows(dK + pn * BN * 128, mapK, pn * 64, row0, tc_kv_bh(), bar);
        tc_tma_load_rows(dV + pn * BN * 128, mapV, pn * 64, row0, tc_kv_bh(), bar);
    }
}

// ... and rows [row0, row0 + BN) of one of them (K or V, by its map) alone, completing on `bar` (KVS 1,
// tc/load_split.cuh)
__device__ __forceinline__ void tma_load_rows(u32 dst, const void* map, int row0, u32 bar) {
    tma_expect(bar, TILE_BYTES);
#pragma unroll
    for (int pn = 0; pn < HEAD_D / 64; ++pn) tc_tma_load_rows(dst + pn * BN * 128, map, pn * 64, row0, tc_kv_bh(), bar);
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

    __device__ __forceinline__ void first_tiles(const TcTileList& list) { first_tiles_by<TcLoadTma>(list); }

    // first_tiles with Load's load_stage (a loader built on this one names itself)
    template <class Load>
    __device__ __forceinline__ void first_tiles_by(const TcTileList& list) {
        if (threadIdx.x == 0) {
            // Q's copy first, then the list's first tiles (their test of n waits for the head's load)
            tma_expect(bar, BM * HEAD_D * 2);
#pragma unroll
            for (int pn = 0; pn < HEAD_D / 64; ++pn)
                tc_tma_load_rows(sm.q + pn * BM * 128, gm.mq, pn * 64, qt * BM, blockIdx.y, bar);
#pragma unroll
            for (int s = 0; s < STAGES - 1; ++s)
                if (s < list.n) Load::load_stage(sm, gm, bar, s, tc_entry_tile(list.ring[s]) * BN);
        }
        tma_wait(bar, 0);
    }

    // K and V rows row0.. into stage s, both completing on its barrier
    static __device__ __forceinline__ void load_stage(const TcSmem& sm, const TcGlobal& gm, u32 bar, int s, int row0) {
        tma_load_kv(sm.k + s * TILE_BYTES, sm.v + s * TILE_BYTES, gm.mk, gm.mv, row0, bar + 8 * (s + 1));
    }

    // waits until every warp is done with stage st_fill (tile it - 1's), then thread 0 refills it
    // with tile nx (entry ent_nx) when nx < n, and all wait for tile it (stage st, barrier phase
    // `phase`); bar: the barriers (init's)
    static __device__ __forceinline__ void refill(const TcSmem& sm, const TcGlobal& gm, int T, u32 bar, int st,
                                                  int st_fill, u32 phase, int ent_nx, int nx, int n) {
        __syncthreads();  // every warp is done with the stage refilled below (tile it - 1's)
        if (threadIdx.x == 0 && nx < n)
            tma_load_kv(sm.k + st_fill * TILE_BYTES, sm.v + st_fill * TILE_BYTES, gm.mk, gm.mv, tc_entry_tile(ent_nx) * BN,
                        bar + 8 * (st_fill + 1));
        tma_wait(bar + 8 * (st + 1), phase);  // tile `it` has landed
    }

    // tc/load_released.cuh's: a warp done with stage st says so; here the next refill's barrier does
    static __device__ __forceinline__ void release(u32 bar, int st) {}

    // the overlapped walk's hooks for K and V on stages of their own (tc/load_split.cuh, KVS 1); here K and V of
    // a tile share a stage, a barrier and a release, so they do nothing: the load of K of tile nx (entry ent) a
    // tile earlier than V's, the wait for V of tile t before its P V, and the release of K of tile t's stage
    static __device__ __forceinline__ void refill_k(const TcSmem& sm, const TcGlobal& gm, u32 bar, int ent, int nx,
                                                    int n) {}
    static __device__ __forceinline__ void wait_v(u32 bar, int t) {}
    static __device__ __forceinline__ void release_k(u32 bar, int st) {}

    static __device__ __forceinline__ void drain() {}
};
