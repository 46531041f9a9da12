// Tensor-core attention forward for bfloat16 / float16 (float32 accumulation), FlashAttention-2
// style, over a host-built list of key tiles per query tile.
//
// Grid: (query tiles, B * H, residue classes); query head blockIdx.y reads key/value head
// blockIdx.y / KV_GROUP (grouped-query heads, H = KV_GROUP * H_kv; tc/scheduler.cuh). Block:
// NWARPS warps, each owning MT m16 tiles of query rows (BM = 16 * MT * NWARPS). For every key tile of the query tile's list: S = Q K^T; on
// partial tiles only, keys failing ab_allowed(i, j) or j >= T set to -inf; online softmax; O += P V.
// Then O is normalised, staged in the Q buffer and stored. K/V tiles stream through STAGES
// shared-memory buffers. This file composes the parts, each in kernels/tc/ with its notes:
//   config.cuh          the -D constants with their defaults, the derived shapes (BM, RW, CH, ...)
//   common.cuh          shared-memory layout, swizzled tile layouts, cp.async / ldmatrix / mma /
//                       pack / exp2 / rcp; the fragment types (TcS, TcAcc, TcRows)
//   scheduler.cuh       the block's work item (TcWork), the walk over its tile list (TcTileList)
//   mainloop_sync.cuh   products on mma.sync + ldmatrix; loads by cp.async (TcLoadAsync)
//   mainloop_wgmma.cuh  products on wgmma (WG 1); loads by bulk tensor copies (TcLoadTma, TMA 1)
//   loop.cuh            the walk over the tile list, each product waited for (TcLoopSerial)
//   loop_overlap.cuh    the same walk with S of tile it in flight beside P V of tile it - 1 (OV 1)
//   load_released.cuh   TMA loads whose stages the warps release by barrier arrivals, no block barrier a tile (REL 1)
//   load_split.cuh      the same with K and V on stages of their own, K a tile further ahead (KVS 1)
//   turns.cuh           the warpgroups' products issued as they come, or in turn (PP 1, FlashAttention-3's ping-pong)
//   mask.cuh            partial-tile masking with the pattern predicate
//   softmax.cuh         the online softmax (lazy max, rescale only past 2^RESCALE_LOG2)
//   epilogue.cuh        normalise, stage, store (16-byte stores or the TMA store); the rows'
//                       log-sum-exp for the backward (FWD_LSE 1: the entry fast_tc_fwd_lse)
// The products (TcMma), the loads (TcLoad) and the walk (TcLoop) are chosen once below; every part keeps a fixed
// interface (written in its header), so the kernel body has no #if of its own.
#include "tc/config.cuh"
#include "tc/common.cuh"
#include "tc/scheduler.cuh"
#include "tc/mask.cuh"
#include "tc/softmax.cuh"
#include "tc/epilogue.cuh"
#include "tc/mainloop_sync.cuh"
#include "tc/loop.cuh"

#if WG
#include "tc/mainloop_wgmma.cuh"
#include "tc/load_released.cuh"
#include "tc/load_split.cuh"
typedef TcMmaWgmma TcMma;
#else
typedef TcMmaSync TcMma;
#endif
#if KVS
typedef TcLoadTmaSplit TcLoad;
#elif REL
typedef TcLoadTmaReleased TcLoad;
#elif TMA
typedef TcLoadTma TcLoad;
#else
typedef TcLoadAsync<TcMma> TcLoad;
#endif
#if OV
#include "tc/loop_overlap.cuh"
#if PP
typedef TcTurnsPingpong TcTurns;
#else
typedef TcTurnsAny TcTurns;
#endif
typedef TcLoopOverlap<TcMma, TcLoad, TcTurns> TcLoop;
#else
typedef TcLoopSerial<TcMma, TcLoad> TcLoop;
#endif

// The forward's body; with LSE, each row's log-sum-exp is stored too (tc_store_lse). The two entry
// points below pass their parameters through (the maps by address: __grid_constant__ parameters
// stay in parameter space).
template <bool LSE>
__device__ __forceinline__ void fast_tc_body(const u16* __restrict__ Qg, const u16* __restrict__ Kg,
                                             const u16* __restrict__ Vg, u16* __restrict__ Og,
                                             const int4* __restrict__ thead, const int* __restrict__ tent, int T_all,
                                             float scale_log2, const int* __restrict__ table, const TmaMap& mapQ,
                                             const TmaMap& mapK, const TmaMap& mapV, const TmaMap& mapO,
                                             float* __restrict__ Lg) {
    // 1024-byte alignment: every tile starts at a multiple of its row pitch (CH * 16 bytes), which
    // the XOR addressing of the ldmatrix reads relies on (TcSmem)
    extern __shared__ __align__(1024) unsigned char smem[];
    const TcWork w = tc_block_work(T_all);
    const int qt = w.qt, T = w.T;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane >> 2, t4 = lane & 3;
    const TcSmem sm = tc_smem(smem);
    const TcGlobal gm = {Qg + w.base, Kg + w.kv_base, Vg + w.kv_base, Og + w.base, &mapQ, &mapK, &mapV, &mapO};
    const AB_PATTERN_T pat{AB_PATTERN_ARGS};

    TcLoad ld;
    ld.init(sm, gm, w);
    ld.begin();
    TcTileList list;
    list.init(thead, tent, qt);
    const int n = list.n;
    ld.first_tiles(list);
    typename TcMma::Ops op;  // the products' operands (Q in registers, QREG 1)
    TcMma::init(op, sm, warp, lane);

    TcAcc acc;
    tc_zero(acc);
    TcSoftmax sf;
    sf.init();

    TcLoop::run(acc, sf, op, list, n, ld.bar, sm, gm, tent, T, qt, warp, g, t4, pat, scale_log2);

    if (LSE) {
        tc_store_lse(Lg, sf, scale_log2, T_all, qt, T, warp, g, t4);  // before staging: it reads sf's sums
        // the warp's lanes done reading its Q rows before they stage the output over them (racecheck
        // warned of the read-then-write across lanes in this build; the plain build reports none)
        __syncwarp();
    }
    tc_stage_output<TcMma::Layout>(sm.q, acc, sf.l, warp, g, t4);
    tc_store_output<TcMma::Layout>(gm.o, &mapO, sm.q, qt, T, warp, lane);
}

// One entry point per module: fast_tc_fwd, or with FWD_LSE 1 fast_tc_fwd_lse, which also stores the
// rows' log-sum-exp (natural log of the sum of exp(scale * s) over the row's allowed keys; float32
// [B, H, T], Lg) for the backward (kernels/fast_tc_bwd.cu). A build of the one leaves the other's
// code untouched.
#define FAST_TC_PARAMS                                                                                              \
    const u16 *__restrict__ Qg, const u16 *__restrict__ Kg, const u16 *__restrict__ Vg, u16 *__restrict__ Og,     \
        const int4 *__restrict__ thead, const int *__restrict__ tent, int T_all, float scale_log2,                 \
        const int *__restrict__ table, const __grid_constant__ TmaMap mapQ, const __grid_constant__ TmaMap mapK, \
        const __grid_constant__ TmaMap mapV, const __grid_constant__ TmaMap mapO
#if FWD_LSE
extern "C" __global__ void __launch_bounds__(THREADS, MINB) fast_tc_fwd_lse(FAST_TC_PARAMS, float* __restrict__ Lg) {
    fast_tc_body<true>(Qg, Kg, Vg, Og, thead, tent, T_all, scale_log2, table, mapQ, mapK, mapV, mapO, Lg);
}
#else
extern "C" __global__ void __launch_bounds__(THREADS, MINB) fast_tc_fwd(FAST_TC_PARAMS) {
    fast_tc_body<false>(Qg, Kg, Vg, Og, thead, tent, T_all, scale_log2, table, mapQ, mapK, mapV, mapO, nullptr);
}
#endif
