// Tensor-core attention backward on Hopper's warpgroup MMA (sm_90a), for bfloat16 / float16 with
// float32 accumulation: fast_tc_bwd.cu's three kernels and work (the transposed tile list cut
// into work items, key-tile-major, dK and dV in registers, dQ's sums by float32 reductions), its
// main kernel's products on wgmma (tc/bwd_wgmma.cuh) instead of mma.sync. NWARPS / 4 warpgroups a
// block, 64 keys each, against 64-query tiles they share (one warpgroup: the tile lists and work
// items of the mma.sync backward; two: 128-key tiles, dQ summed over them before its reductions,
// a 64-column panel a warpgroup at D = 128, at D = 64 the panel computed by both and half its
// columns reduced by each).
//
// Per query tile of the item: S^T = K Q^T and dP^T = V dO^T issued together; partial tiles (and a
// key tile reaching past T) masked; P^T = exp2(S^T scale log2 e - lse2), packed as the A operand
// of dV += P^T dO, issued at once; dS^T = P^T (dP^T - delta) once dP^T lands, packed for
// dK += dS^T Q, issued, and staged in shared memory while the products run; then, every warp's
// dS^T staged, dQ += dS K by 64 columns, added to the float32 accumulator. Two barriers a tile (the
// refill's, the staged dS^T's); two warpgroups at D = 64 (BWG_DQ_PAIRED) stage two tiles' dS^T and
// then take one tile's dQ each: three barriers a pair. BWD_DQ_PASS 1: no dQ here, one barrier a tile; dQ comes from
// a pass query-major over the forward list, no accumulator: fast_tc_bwd_dq_wg.cu's on wgmma, or
// fast_tc_bwd.cu's fast_tc_bwd_dq_pass (a launch of the mma.sync build). TMA 1 (unstrided patterns): the
// Q and dO tiles by bulk tensor copies (tc/bwd_wgmma.cuh's TcBwgWalk), their maps after the main
// kernel's parameters; with BWD_DQ_BULK dQ's sums by bulk tensor reductions from shared memory (tc_bwg_dq_out; 2:
// from two sets of staging buffers in turn), the map of its float32 accumulator after them. BWD_DQ_STORE: where one work item holds all of
// each query tile's keys, dQ stored by it (tc_bwg_dq_out), its pointer in dQacc's place; no accumulator. BWD_DQ_LAG
// (two warpgroups, TMA, dQ summed here): tc/bwd_lag.cuh's walk instead, each warpgroup taking dQ of the tile before its
// current one, the two meeting on mbarriers of their own, no block barrier a tile.
#include "tc/config.cuh"
#include "tc/common.cuh"
#include "tc/scheduler.cuh"
#include "tc/bwd_wgmma.cuh"
#include "tc/bwd_prep.cuh"
#include "tc/bwd_lag.cuh"

// tile `it` of the walk up to its S^T, landed and masked (dP^T on its way): its query tile; so, lds: its
// stage's descriptor offset and (lse2, delta) rows
template <class P>
__device__ __forceinline__ int tc_bwg_front(TcBwgWalk& walk, const TcBwgSmem& sm, const TcBwgSrc& src, TcTileList& list,
                                            const int* __restrict__ tent, int T, int it, int n, const TcBwgOps& op,
                                            const P& pat, bool edge, int key0, u32 lds0, int g, int t4, TcBwgRows& s,
                                            TcBwgRows& dp, u32& so, u32& lds) {
    int st;
    const int ent = walk.step(sm, src, list, tent, T, it, n, st);
    const int qt = tc_entry_tile(ent);
    so = (u32)st * (BWG_QBYTES >> 4);
    lds = lds0 + st * BWG_LDB;
    tc_bwg_scores(s, dp, op, st);  // S^T landed, dP^T on its way
    if ((ent & 1) || edge) tc_bwg_mask(s, pat, key0, qt * BWG_QT, T, g, t4);
    return qt;
}

#ifndef BWD_PERSIST
#define BWD_PERSIST 0
#endif

// the tensors block number b's item streams (TMA: with the maps of Q and dO and its head)
__device__ __forceinline__ TcBwgSrc tc_bwg_src(const TcWork& w, int cls, const u16* __restrict__ Qg,
                                               const u16* __restrict__ dOg, const float2* __restrict__ LD, int T_all,
                                               const TmaMap* mq, const TmaMap* mo) {
#if TMA
    return {Qg + w.base, dOg + w.base, LD + (size_t)w.bh * T_all + cls, mq, mo, w.bh};
#else
    (void)mq, (void)mo;
    return {Qg + w.base, dOg + w.base, LD + (size_t)w.bh * T_all + cls};
#endif
}

// BWD_PERSIST: the loads of block number b's item (its K and V in one commit group, its list's first stages a
// group each), issued by the block that runs it while it finishes its previous item
__device__ __forceinline__ void tc_bwg_issue(const TcBwgSmem& sm, int b, const u16* __restrict__ Qg,
                                             const u16* __restrict__ Kg, const u16* __restrict__ Vg,
                                             const u16* __restrict__ dOg, const float2* __restrict__ LD,
                                             const int4* __restrict__ ihead, const int2* __restrict__ itile,
                                             const int* __restrict__ tent, int BH, int T_all, const TmaMap* mq,
                                             const TmaMap* mo) {
    int item, cls;
    const TcWork w = tc_item_work_at(T_all, BH, b, item, cls);
    const int kt = itile[item].x;
    const TcBwgSrc src = tc_bwg_src(w, cls, Qg, dOg, LD, T_all, mq, mo);
    tc_load_tile<TcPanelLayout, BN>(sm.k, Kg + w.base, kt * BN, w.T);
    tc_load_tile<TcPanelLayout, BN>(sm.v, Vg + w.base, kt * BN, w.T);
    tc_commit();
    TcTileList list;
    list.init(ihead, tent, item);
    TcBwgWalk::issue_first(sm, src, list, w.T);
}

// the main loop's work item of block number b (tc_item_work_at); with BWD_PERSIST, `pre`: its loads issued
// (tc_bwg_issue) by the item before it, and nb >= 0: the block number whose loads it issues once its products
// are done, before it stores dK and dV; `phases`: (TMA) the stage barriers' parities, carried from item to item
__device__ __forceinline__ void
tc_bwg_item(unsigned char* smem, int b, const u16* __restrict__ Qg, const u16* __restrict__ Kg,
            const u16* __restrict__ Vg, const u16* __restrict__ dOg, const float2* __restrict__ LD,
            float* __restrict__ dQacc, u16* __restrict__ dKg, u16* __restrict__ dVg, const int4* __restrict__ ihead,
            const int2* __restrict__ itile, const int* __restrict__ tent, float* __restrict__ dKVacc, int BH,
            int T_all, float scale_log2, float scale, const int* __restrict__ table, const TmaMap* mq,
            const TmaMap* mo, const TmaMap* mdq, bool pre = false, int nb = -1, u32* phases = nullptr) {
    int item, cls;
    const TcWork w = tc_item_work_at(T_all, BH, b, item, cls);
    const int2 kts = itile[item];  // (key tile, split slot or -1)
    const int kt = kts.x, T = w.T;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane >> 2, t4 = lane & 3;
    const AB_PATTERN_T pat{AB_PATTERN_ARGS};

    const TcBwgSmem sm = tc_bwg_smem(smem);
    const TcBwgSrc src = tc_bwg_src(w, cls, Qg, dOg, LD, T_all, mq, mo);
#if BWD_PERSIST
    if (!pre) tc_bwg_issue(sm, b, Qg, Kg, Vg, dOg, LD, ihead, itile, tent, BH, T_all, mq, mo);
    TcTileList list;
    list.init(ihead, tent, item);  // the item's stretch of its key tile's list (its first tiles issued)
    const int n = list.n;
    TcBwgWalk walk;
#if TMA
    walk.phases = *phases;
#endif
    TcBwgWalk::wait_first();
#else
    (void)pre, (void)nb, (void)phases;
    tc_load_tile<TcPanelLayout, BN>(sm.k, Kg + w.base, kt * BN, T);
    tc_load_tile<TcPanelLayout, BN>(sm.v, Vg + w.base, kt * BN, T);
    tc_commit();
    TcTileList list;
    list.init(ihead, tent, item);  // the item's stretch of its key tile's list
    const int n = list.n;
#if !BWD_DQ_LAG  // (the lagged walk starts its own, tc_bwg_lag_loop)
    TcBwgWalk walk;
    walk.first(sm, src, list, T);
#endif
#endif
    const int wg = BWG_NWG == 1 ? 0 : warp >> 2;  // (a constant with one warpgroup)
    const TcBwgOps op = tc_bwg_ops(sm, wg);

    TcBwdCols dk, dv;
    tc_zero_frag(dk);
    tc_zero_frag(dv);
#if BWD_DQ_STORE  // dQacc is dQ itself, in the storage dtype
    const TcBwgDq dq = tc_bwg_dq_store_at(reinterpret_cast<u16*>(dQacc) + w.base, scale);
#elif !BWD_DQ_PASS
    const TcBwgDq dq = tc_bwg_dq_at(dQacc + w.base, mdq, w.bh, sm);
#endif
    const bool edge = kt * BN + BN > T;  // keys >= T in the tile: masked on every query tile
    const int key0 = kt * BN + warp * 16;
    const u32 lds0 = sm.ld + 16 * t4;
#if BWG_DQ_PIPE
    float cq[8][4];   // the last pair's dQ sums, in flight
    int dq_row = 0;   // their rows
#endif
#if BWG_DQ_PIPE
    // a pipelined tile: dS^T staged in its pair's buffers (pair it / 2: set (it / 2) % 2 of two)
    // with `take`, the last pair's dQ sums reduced once S^T lands (their group is older than S^T's)
    auto ptile = [&](int it, bool take) -> int {
        TcBwgRows s, dp;
        TcBwgFrag pd;
        u32 so, lds;
        const int qt = tc_bwg_front(walk, sm, src, list, tent, T, it, n, op, pat, edge, key0, lds0, g, t4, s, dp, so, lds);
        if (take) tc_bwd_dq_add<64>(dq.p, cq, 0, dq_row, T, g, t4);
        TC_BWG_PRODUCTS(s, dp, pd, dk, dv, op, so, lds, scale_log2);
        tc_bwg_stage(sm.ds + ((it >> 1) & 1) * 2 * BWG_DSB + (it & 1) * BWG_DSB, pd, warp, g, t4);
        wg_wait<0>();  // dV and dK done reading the stage before the next step refills it
        return qt;
    };
    const int pairs = n >> 1;
    int qa = 0, qb = 0;  // the staged pair's tiles
    if (pairs > 0) {
        qa = ptile(0, false);
        qb = ptile(1, false);
        wg_fence_smem();
        __syncthreads();  // pair 0's dS^T staged by every warp
    }
    // pair p staged: warpgroup w issues tile w's dQ, which runs through the next step's barrier and the
    // next S^T; the loop's code from issue to reduction is straight, so the compiler keeps wgmma async
    for (int p = 0; p + 1 < pairs; ++p) {
        tc_bwg_dq_issue(cq, op, op.ds + ((((p & 1) * 2 + wg) * BWG_DSB) >> 4));
        dq_row = (wg ? qb : qa) * BWG_QT + (warp & 3) * 16;
        qa = ptile(2 * p + 2, true);
        qb = ptile(2 * p + 3, false);
        wg_fence_smem();
        __syncthreads();  // pair p + 1's dS^T staged; every warpgroup's pair-p dQ landed
    }
    if (pairs > 0)  // the last pair's dQ, at once
        tc_bwg_dq_tile(dq, op, op.ds + (((((pairs - 1) & 1) * 2 + wg) * BWG_DSB) >> 4), wg,
                       (wg ? qb : qa) * BWG_QT + (warp & 3) * 16, T, g, t4);
    if (n & 1) {  // a list's odd last tile: both compute it, each reduces half
        const int qt = ptile(n - 1, false);
        wg_fence_smem();
        __syncthreads();
        TcBwgOps o = op;
        o.ds += ((pairs & 1) * 2 * BWG_DSB) >> 4;
        tc_bwg_dq(dq, o, wg, qt * BWG_QT + (warp & 3) * 16, T, g, t4);
    }
#elif BWD_DQ_LAG
    (void)n, (void)op, (void)edge, (void)key0, (void)lds0;
    tc_bwg_lag_loop(sm, src, list, tent, pat, dq, dk, dv, kt, T, scale_log2, warp, g, t4);
#else
#if BWG_DQ_PAIRED
    int qt_prev = 0;  // the pair's first tile
#endif

    for (int it = 0; it < n; ++it) {
        TcBwgRows s, dp;
        TcBwgFrag pd;
        u32 so, lds;
        const int qt = tc_bwg_front(walk, sm, src, list, tent, T, it, n, op, pat, edge, key0, lds0, g, t4, s, dp, so, lds);
        TC_BWG_PRODUCTS(s, dp, pd, dk, dv, op, so, lds, scale_log2);  // dV and dK issued, dS^T packed in pd
#if BWG_DQ_PAIRED
        tc_bwg_stage(sm.ds + (it & 1) * BWG_DSB, pd, warp, g, t4);  // tile `it` of its pair
        wg_wait<0>();  // dV and dK done reading the stage before the next step refills it
        if ((it & 1) || it == n - 1) {
            wg_fence_smem();
            tc_bwg_dq_free();
            __syncthreads();  // the pair's dS^T staged by every warp (and the dQ buffers free)
            if (it & 1)  // warpgroup w: the pair's tile w, all its columns
                tc_bwg_dq_tile(dq, op, op.ds + wg * (BWG_DSB >> 4), wg, (wg ? qt : qt_prev) * BWG_QT + (warp & 3) * 16,
                               T, g, t4);
            else  // a list's odd last tile: both compute it, each reduces half
                tc_bwg_dq(dq, op, wg, qt * BWG_QT + (warp & 3) * 16, T, g, t4);
        }
        qt_prev = qt;
#elif !BWD_DQ_PASS
        tc_bwg_stage(sm.ds, pd, warp, g, t4);
        wg_wait<0>();
        wg_fence_smem();
        tc_bwg_dq_free();
        __syncthreads();  // dS^T staged by every warp (and the dQ buffers free)
        tc_bwg_dq(dq, op, wg, qt * BWG_QT + (BWG_NWG == 1 ? warp : warp & 3) * 16, T, g, t4,
                  BWD_DQ_BULK == 2 ? (it & 1) : 0);  // dQ += dS K (one warpgroup: v3's code)
#else
        wg_wait<0>();  // dV and dK done reading the stage before the next step refills it
#endif
    }
#endif
    tc_wait<0>();
    tc_bwg_dq_drain();
#if BWD_PERSIST
    if (nb >= 0) {
        __syncthreads();  // every warp is done with this item's K, V and stages
        tc_bwg_issue(sm, nb, Qg, Kg, Vg, dOg, LD, ihead, itile, tent, BH, T_all, mq, mo);
    }
#if TMA
    *phases = walk.phases;
#endif
#endif
    tc_bwd_finish(dKg, dVg, dKVacc, dk, dv, kts, w, cls, BH, T_all, scale, warp, g, t4);
}

// the parameters of fast_tc_bwd.cu's main kernel, in its order: the host launches either the same way
// (TMA 1: then the maps of Q and dO; BWD_DQ_BULK: then the map of dQ's float32 accumulator; BWD_PERSIST: then
// the count of items x heads x classes, which the blocks take in turn, b = blockIdx.x, + gridDim.x, ...)
extern "C" __global__ void __launch_bounds__(THREADS, MINB)
fast_tc_bwd(const u16* __restrict__ Qg, const u16* __restrict__ Kg, const u16* __restrict__ Vg,
            const u16* __restrict__ dOg, const float2* __restrict__ LD, float* __restrict__ dQacc,
            u16* __restrict__ dKg, u16* __restrict__ dVg, const int4* __restrict__ ihead,
            const int2* __restrict__ itile, const int* __restrict__ tent, float* __restrict__ dKVacc, int BH,
            int T_all, float scale_log2, float scale, const int* __restrict__ table
#if TMA
            , const __grid_constant__ TmaMap mapQ, const __grid_constant__ TmaMap mapdO
#endif
#if BWD_DQ_BULK
            , const __grid_constant__ TmaMap mapdQ
#endif
#if BWD_PERSIST
            , int total
#endif
) {
    extern __shared__ __align__(1024) unsigned char smem[];
#if TMA
    const TmaMap *mq = &mapQ, *mo = &mapdO;
#else
    const TmaMap *mq = nullptr, *mo = nullptr;
#endif
#if BWD_DQ_BULK
    const TmaMap* mdq = &mapdQ;
#else
    const TmaMap* mdq = nullptr;
#endif
#if BWD_PERSIST
    u32 phases = 0;
#if TMA
    if ((int)blockIdx.x < total) TcBwgWalk::init_barriers(tc_bwg_smem(smem));
#endif
    for (int b = blockIdx.x; b < total; b += gridDim.x)
        tc_bwg_item(smem, b, Qg, Kg, Vg, dOg, LD, dQacc, dKg, dVg, ihead, itile, tent, dKVacc, BH, T_all, scale_log2,
                    scale, table, mq, mo, mdq, b != (int)blockIdx.x, b + (int)gridDim.x < total ? b + (int)gridDim.x : -1,
                    &phases);
#else
    tc_bwg_item(smem, (int)blockIdx.x, Qg, Kg, Vg, dOg, LD, dQacc, dKg, dVg, ihead, itile, tent, dKVacc, BH, T_all,
                scale_log2, scale, table, mq, mo, mdq);
#endif
}

#ifndef BWD_FUSED
#define BWD_FUSED 0
#endif
#if BWD_FUSED
// BWD_FUSED: the main loop's items and dQ's pass (tc/bwd_dq_pass.cuh, query-major over the forward
// list) in one launch, so that a pass block and the items beside it in the order read the same Q,
// dO, K and V tiles, one from memory and the other from L2. sched[blockIdx.x]: b >= 0, the main
// loop's block b (tc_item_work_at); -1 - f, the pass's block f = (cls * BH + bh) * nqx + x of its
// own grid (nqx query tiles wide: tc_block_work_at). The host orders them (Backward.fused_order).
// The rows' (lse2, delta) are prep's: both kinds read them, neither writes them.
#include "tc/bwd_dq_pass.cuh"
static_assert(BWD_DQ_PASS && BWG_NWG == 1 && !BWD_PASS_STATS && !TMA && !BWD_PERSIST,
              "the fused launch: dQ's pass beside one warpgroup's main loop, the rows' stats from prep, cp.async loads");

extern "C" __global__ void __launch_bounds__(THREADS, MINB)
fast_tc_bwd_fused(const u16* __restrict__ Qg, const u16* __restrict__ Kg, const u16* __restrict__ Vg,
                  const u16* __restrict__ dOg, const float2* __restrict__ LD, float* __restrict__ dQacc,
                  u16* __restrict__ dKg, u16* __restrict__ dVg, const int4* __restrict__ ihead,
                  const int2* __restrict__ itile, const int* __restrict__ tent, float* __restrict__ dKVacc, int BH,
                  int T_all, float scale_log2, float scale, const int* __restrict__ table, u16* __restrict__ dQg,
                  const int4* __restrict__ fhead, const int* __restrict__ fent, const int* __restrict__ sched,
                  int nqx) {
    extern __shared__ __align__(1024) unsigned char smem[];
    const int b = sched[blockIdx.x];
    if (b >= 0) {
        tc_bwg_item(smem, b, Qg, Kg, Vg, dOg, LD, dQacc, dKg, dVg, ihead, itile, tent, dKVacc, BH, T_all, scale_log2,
                    scale, table, nullptr, nullptr, nullptr);
        return;
    }
    int cls;
    const TcWork w = tc_block_work_flat(T_all, nqx, BH, -1 - b, cls);
    tc_bwd_dq_pass_block(smem, w, cls, Qg, Kg, Vg, dOg,
                         const_cast<float2*>(LD), dQg, fhead, fent, T_all, scale_log2, scale, table, nullptr, nullptr);
}
#endif
