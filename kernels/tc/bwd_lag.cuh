// The wgmma main loop's two warpgroups a tile apart at most (BWD_DQ_LAG 1; fast_tc_bwd_wg.cu, two warpgroups,
// bulk tensor copies, dQ summed in the loop one query tile at a time): no block barrier inside a work item.
//
// Each warpgroup takes dQ of the tile before its current one. At tile `it` it issues S^T and dP^T, P^T, dV and
// dK as the serial loop does, stages its 64 keys' rows of dS^T in set it % 2 of two and announces them on that
// set's "full" barrier; once its dK has landed it releases the Q / dO stage, then waits for both warpgroups' dS^T
// of tile it - 1 and adds its panel of dQ(it - 1) = dS K. A warpgroup that reaches a tile early runs its softmax
// and dS while the other's products hold the tensor pipe. What meets, and how:
// - Q and dO: STAGES stages, tile t in stage t % STAGES, all of them filled before the loop (TcBwgWalk's first
//   STAGES - 1 and one more). A warpgroup whose dK of tile t has landed releases the stage: its first thread adds 1
//   to the stage's counter in shared memory, and the warpgroup that adds second (the old count odd) copies tile
//   t + STAGES into it (its bulk copies completing on the stage's barrier, phase t / STAGES). Neither waits for
//   the other to refill; a stage's next tile follows both releases.
// - (lse2, delta): each warpgroup loads its own copy of a tile's rows (STAGES stages a warpgroup, by cp.async
//   from its threads 0..63, one commit group a tile), so only its own warps wait for them (a named barrier).
// - dS^T: set s's "full" barrier counts the block's 8 warps (a warp's lanes meet, then lane 0 arrives, after the
//   proxy fence that shows its stores to wgmma); its "empty" barrier counts the 8 warps done with dQ's products
//   on it. A warpgroup restages set it % 2 once both are done with dQ(it - 2).
// - Every wait is on a phase no more than one ahead of its waiter, so parities from the tile number suffice
//   (a block runs one work item; BWD_PERSIST is not built with it).
// Interface:
//   TcBwgLag::init(sm): the stage, "full" and "empty" barriers and the counters, before a block barrier.
//   TcBwgLag::issue_first(sm, src, list, T, wg): tiles 0 .. STAGES - 1 (commit groups one a tile); wait_first():
//     the group before them (K and V's), then a block barrier.
//   TcBwgLag::take(sm, it, wg): tile it's (lse2, delta) rows and its Q and dO landed; -> its stage.
//   TcBwgLag::release(sm, src, ent_nx, T, it, n, wg): tile it's stage done (after dK's wait), ent_nx tile
//     it + STAGES's entry: the refill as above, and this warpgroup's copy of that tile's rows.
//   TcBwgLag::staged(sm, it) / wait_staged(sm, it): dS^T of tile it announced / waited for (both warpgroups').
//   TcBwgLag::freed(sm, it) / wait_freed(sm, it): dQ's products on tile it's dS^T done / waited for.
// BWD_DQ_LAG 2 (D = 128): the same, with dQ(it - 1)'s products issued behind tile it's dK (tc_bwg_lag_dq_behind).
#pragma once
#include "tc/bwd_wgmma.cuh"

#ifndef BWD_PERSIST
#define BWD_PERSIST 0
#endif
static_assert(!BWD_DQ_LAG || (BWG_NWG == 2 && TMA && !BWD_DQ_PASS && !BWG_DQ_PAIRED && !BWD_DQ_STORE && !BWD_PERSIST),
              "dQ a tile behind: two warpgroups, bulk tensor copies, dQ summed in the main loop one query tile at a "
              "time, one work item a block");
static_assert(BWD_DQ_LAG != 2 || HEAD_D == 64 * BWG_NWG, "dQ issued behind dK: a whole 64-column panel a warpgroup");

#if BWD_DQ_LAG
struct TcBwgLag {
    static __device__ __forceinline__ u32 stage_bar(const TcBwgSmem& sm, int s) { return sm.bar + 8 * s; }
    static __device__ __forceinline__ u32 full(const TcBwgSmem& sm, int set) { return sm.bar + 8 * (STAGES + set); }
    static __device__ __forceinline__ u32 empty(const TcBwgSmem& sm, int set) { return sm.bar + 8 * (STAGES + 2 + set); }
    static __device__ __forceinline__ u32 counter(const TcBwgSmem& sm, int s) { return sm.bar + 8 * (STAGES + 4) + 4 * s; }
    // warpgroup wg's (lse2, delta) rows of stage s
    static __device__ __forceinline__ u32 rows(const TcBwgSmem& sm, int wg, int s) {
        return sm.ld + (u32)((wg * STAGES + s) * BWG_LDB);
    }

    static __device__ __forceinline__ void init(const TcBwgSmem& sm) {
        if (threadIdx.x == 0) {
#pragma unroll
            for (int s = 0; s < STAGES; ++s) {
                tma_bar_init(stage_bar(sm, s), 1);
                asm volatile("st.shared.u32 [%0], %1;\n" :: "r"(counter(sm, s)), "r"(0) : "memory");
            }
#pragma unroll
            for (int set = 0; set < 2; ++set) {
                tma_bar_init(full(sm, set), NWARPS);
                tma_bar_init(empty(sm, set), NWARPS);
            }
            tma_bar_fence_init();
        }
        __syncthreads();  // the barriers are initialised before anyone (the copy engine too) uses them
    }

    // warpgroup wg's copy of query tile qt's (lse2, delta) rows into its stage s (rows >= T zero-filled)
    static __device__ __forceinline__ void load_rows(const TcBwgSmem& sm, const TcBwgSrc& src, int qt, int T, int s,
                                                     int wg) {
        const int i = threadIdx.x % 128;
        if (i < BWG_QT) {
            const int row = qt * BWG_QT + i;
            const bool ok = row < T;
            tc_cp_async8(rows(sm, wg, s) + i * 8, ok ? src.ld + (size_t)row * STRIDE : src.ld, ok ? 8 : 0);
        }
    }

    static __device__ __forceinline__ void issue_first(const TcBwgSmem& sm, const TcBwgSrc& src,
                                                       const TcTileList& list, int T, int wg) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {
            if (s < list.n) {
                if (threadIdx.x == 0) tc_bwg_copy(sm, src, tc_entry_tile(list.ring[s]), s);
                load_rows(sm, src, tc_entry_tile(list.ring[s]), T, s, wg);
            }
            tc_commit();
        }
    }

    static __device__ __forceinline__ void wait_first() {
        tc_wait<STAGES>();  // K and V's group is the oldest
        wg_fence_smem();
        __syncthreads();
    }

    static __device__ __forceinline__ void wg_sync(int wg) {
        asm volatile("bar.sync %0, 128;\n" :: "r"(1 + wg) : "memory");
    }

    static __device__ __forceinline__ int take(const TcBwgSmem& sm, int it, int wg) {
        const int st = it % STAGES;
        tc_wait<STAGES - 1>();  // this thread's rows of tile it (the groups of tiles it + 1 .. it + STAGES - 1 after)
        wg_sync(wg);            // ... and the warpgroup's other threads'
        tma_wait(stage_bar(sm, st), (u32)(it / STAGES) & 1);  // tile it's Q and dO
        return st;
    }

    // (after dK's wait) the warpgroup is done with tile it's stage; ent_nx: tile it + STAGES's entry
    static __device__ __forceinline__ void release(const TcBwgSmem& sm, const TcBwgSrc& src, int ent_nx, int T, int it,
                                                   int n, int wg) {
        const int st = it % STAGES, nx = it + STAGES;
        wg_sync(wg);  // every warp of the warpgroup done with the stage's rows
        if (nx < n) {
            if (threadIdx.x % 128 == 0) {
                __threadfence_block();
                u32 old;
                asm volatile("atom.shared.add.u32 %0, [%1], 1;\n" : "=r"(old) : "r"(counter(sm, st)) : "memory");
                if (old & 1) {  // the other warpgroup released it first: the stage is free
                    __threadfence_block();
                    tc_bwg_copy(sm, src, tc_entry_tile(ent_nx), st);
                }
            }
            load_rows(sm, src, tc_entry_tile(ent_nx), T, st, wg);
        }
        tc_commit();
    }

    static __device__ __forceinline__ void staged(const TcBwgSmem& sm, int it) {
        wg_fence_smem();  // this thread's dS^T stores visible to wgmma
        tma_warp_arrive(full(sm, it & 1));
    }
    static __device__ __forceinline__ void wait_staged(const TcBwgSmem& sm, int it) {
        tma_wait(full(sm, it & 1), (u32)(it >> 1) & 1);
    }
    static __device__ __forceinline__ void freed(const TcBwgSmem& sm, int it) { tma_warp_arrive(empty(sm, it & 1)); }
    static __device__ __forceinline__ void wait_freed(const TcBwgSmem& sm, int it) {
        tma_wait(empty(sm, it & 1), (u32)(it >> 1) & 1);
    }
};

// before warpgroup wg's dQ products on tile `it`: both warpgroups' dS^T of it staged (set it % 2), and with
// BWD_DQ_BULK the buffers its panel is staged in read by their last reductions; -> the set's descriptor word
__device__ __forceinline__ u32 tc_bwg_lag_ds(const TcBwgSmem& sm, const TcBwgOps& op, int it, int wg) {
    TcBwgLag::wait_staged(sm, it);
#if BWD_DQ_BULK
    tc_bwg_dq_free();
    TcBwgLag::wg_sync(wg);  // the buffers this panel is staged in are read
#else
    (void)wg;
#endif
    return op.ds + (u32)(((it & 1) * BWG_DSB) >> 4);
}

// warpgroup wg's dQ panel of tile `it` (query tile qt) from both warpgroups' dS^T in set it % 2: waited for,
// issued, added (BWD_DQ_BULK 2: in set it % 2 of the staging buffers), and the set released
template <class Dq>
__device__ __forceinline__ void tc_bwg_lag_dq(const TcBwgSmem& sm, const Dq& dq, const TcBwgOps& op, int it, int qt,
                                              int wg, int warp, int T, int g, int t4) {
    TcBwgOps o = op;
    o.ds = tc_bwg_lag_ds(sm, op, it, wg);
    tc_bwg_dq(dq, o, wg, qt * BWG_QT + (warp & 3) * 16, T, g, t4, BWD_DQ_BULK == 2 ? (it & 1) : 0);
    TcBwgLag::freed(sm, it);  // (tc_bwg_dq waited for its products)
}

// BWD_DQ_LAG 2 (HEAD_D = 128: a whole 64-column panel a warpgroup): dQ(it - 1)'s products issued behind tile it's dK,
// before its wait, so that the tensor pipe takes them on without a gap; the stage is released once dV and dK have
// landed (the older groups), and the panel added once dQ's have
template <class Dq>
__device__ __forceinline__ void tc_bwg_lag_dq_behind(const TcBwgSmem& sm, const Dq& dq, const TcBwgOps& op,
                                                     const TcBwgSrc& src, int ent_nx, int it, int n, int qt, int wg,
                                                     int warp, int T, int g, int t4) {
    const int p = it - 1;
    float c[8][4];
    tc_bwg_dq_issue(c, op, tc_bwg_lag_ds(sm, op, p, wg), wg);
    wg_wait<1>();  // tile it's dV and dK landed (dQ's products run on)
    TcBwgLag::release(sm, src, ent_nx, T, it, n, wg);
    wg_wait<0>();
    tc_bwg_dq_out<64>(dq, c, wg * 64, qt * BWG_QT + (warp & 3) * 16, T, g, t4,
                      (BWD_DQ_BULK == 2 ? (p & 1) * BWG_DQ_BUFS : 0) + wg);
    TcBwgLag::freed(sm, p);
}

// the work item's walk (after K and V's loads and the list's init; the caller's K and V group committed)
template <class P, class Dq>
__device__ __forceinline__ void tc_bwg_lag_loop(const TcBwgSmem& sm, const TcBwgSrc& src, TcTileList& list,
                                                const int* __restrict__ tent, const P& pat, const Dq& dq,
                                                TcBwdCols& dk, TcBwdCols& dv, int kt, int T, float scale_log2, int warp,
                                                int g, int t4) {
    const int n = list.n, wg = warp >> 2;
    TcBwgLag::init(sm);
    TcBwgLag::issue_first(sm, src, list, T, wg);
    TcBwgLag::wait_first();
    const TcBwgOps op = tc_bwg_ops(sm, wg);
    const bool edge = kt * BN + BN > T;
    const int key0 = kt * BN + warp * 16;
    int qt_prev = 0;
    for (int it = 0; it < n; ++it) {
        int ahead;  // (tile it + STAGES - 1's entry: the serial walk's refill, already in a stage here)
        const int ent = list.next(tent, it, ahead);
        const int ent_nx = list.ring[STAGES - 1];  // tile it + STAGES's, which next() has just read
        const int qt = tc_entry_tile(ent);
        const int st = TcBwgLag::take(sm, it, wg);
        const u32 so = (u32)st * (BWG_QBYTES >> 4);
        const u32 lds = TcBwgLag::rows(sm, wg, st) + 16 * t4;
        TcBwgRows s, dp;
        TcBwgFrag pd;
        tc_bwg_scores(s, dp, op, st);  // S^T landed, dP^T on its way
        if ((ent & 1) || edge) tc_bwg_mask(s, pat, key0, qt * BWG_QT, T, g, t4);
        TC_BWG_PRODUCTS(s, dp, pd, dk, dv, op, so, lds, scale_log2);  // dV and dK issued, dS^T packed in pd
        if (it >= 2) TcBwgLag::wait_freed(sm, it - 2);  // both done with dQ(it - 2) on this set
        tc_bwg_stage(sm.ds + (it & 1) * BWG_DSB, pd, warp, g, t4);
        TcBwgLag::staged(sm, it);
#if BWD_DQ_LAG == 2
        if (it > 0) {
            tc_bwg_lag_dq_behind(sm, dq, op, src, ent_nx, it, n, qt_prev, wg, warp, T, g, t4);
        } else {
            wg_wait<0>();
            TcBwgLag::release(sm, src, ent_nx, T, it, n, wg);
        }
#else
        wg_wait<0>();  // dV and dK done reading the stage
        TcBwgLag::release(sm, src, ent_nx, T, it, n, wg);
        if (it > 0) tc_bwg_lag_dq(sm, dq, op, it - 1, qt_prev, wg, warp, T, g, t4);
#endif
        qt_prev = qt;
    }
    if (n > 0) tc_bwg_lag_dq(sm, dq, op, n - 1, qt_prev, wg, warp, T, g, t4);
}
#endif
