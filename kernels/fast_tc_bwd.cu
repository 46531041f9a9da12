// Tensor-core attention backward for bfloat16 / float16 (float32 accumulation), FlashAttention-2
// style, key-tile-major over the transposed tile list (for each key tile, the query tiles whose
// forward lists name it, flagged full or partial; attnbench.tiles.tile_list_t), cut into work
// items (attnbench.tiles.WorkItems: each key tile's list in stretches of at most L query tiles,
// the longest first; a key tile cut in more than one is *split*), on mma.sync (every GPU; the
// wgmma main loop of sm_90 is fast_tc_bwd_wg.cu). Three kernels: fast_tc_bwd_prep and
// fast_tc_bwd_dq (tc/bwd_prep.cuh: delta beside the log-sum-exp, accumulators zeroed; dQ and the
// split key tiles' dK and dV converted), and between them the main kernel:
//
//   fast_tc_bwd       grid: items x residue classes x B * H, flat (tc_item_work: the item slowest,
//                     so every head's longest items go first); block NWARPS warps. The block loads
//                     its key tile's K and V (BN keys) once and keeps dK and dV in registers; the query
//                     tiles (BM = BN rows) of its item stream Q and dO through STAGES shared-memory
//                     buffers by cp.async (TcLoadAsync, the stages the forward streams K and V
//                     through). For each: S = Q K^T, partial tiles only masked with the pattern
//                     predicate (tc_mask_frag, as the forward), P = exp2(S scale log2 e - lse2);
//                     dP = dO V^T; dS = P (dP - delta); dQ += dS K (float32 reductions); then
//                     dV += P^T dO and dK += dS^T Q. At the end dK (times the scale) and dV are
//                     stored in the storage dtype, or, by an item of a split key tile, added to
//                     the tile's float32 accumulator rows (tc_red2: red.global.add.v2.f32 on sm_90).
//
// Only split key tiles have rows in the float32 dK / dV accumulator (tc/bwd_prep.cuh), so memory
// and zeroing grow with what is split, not with T.
//
// Layout, and why: S and dP are computed query-major (warp w owns query rows 16 w .. 16 w + 15,
// the forward's layout) so the forward's masking applies unchanged and dS, still in registers, is
// the A operand of dQ += dS K exactly as P is of the forward's P V (K read by ldmatrix.trans like
// V). P and dS are staged through shared memory as 16-bit values and read transposed
// (ldmatrix.trans) for the key-major products dV += P^T dO and dK += dS^T Q, where warp w owns
// keys 16 w .. 16 w + 15: so BM == BN == 16 * NWARPS. dK and dV take HEAD_D / 4 floats a thread
// (128 at D = 128); dQ is computed and added in column chunks of DQ_CHUNK so that its accumulators
// stay small. Two barriers a query tile: after the refill's (tile `it` landed, every warp done with
// the stage refilled and with the staged P and dS of the tile before) and before the key-major
// products (P and dS staged by every warp).
//
// The parts are in kernels/tc/ (bwd_mma.cuh: operands and products; bwd_epilogue.cuh: row
// statistics, dQ atomics, dK / dV stores; the forward's scheduler, mask and cp.async loader). The
// pattern and the tile shape are compile-time constants as in the forward (tc/config.cuh);
// strided patterns run as their inner pattern on each residue class, a grid layer per class.
#include "tc/config.cuh"
#include "tc/common.cuh"
#include "tc/scheduler.cuh"
#include "tc/mask.cuh"
#include "tc/mainloop_sync.cuh"
#include "tc/bwd_mma.cuh"
#include "tc/bwd_epilogue.cuh"
#include "tc/bwd_prep.cuh"
#include "tc/bwd_dq_pass.cuh"

#ifndef DQ_CHUNK
#define DQ_CHUNK 32
#endif
static_assert(HEAD_D % DQ_CHUNK == 0 && DQ_CHUNK % 16 == 0, "DQ_CHUNK: a multiple of 16 dividing HEAD_D");
static_assert(!TMA && !WG, "this backward: mma.sync products, cp.async loads (WG builds: fast_tc_bwd_wg.cu)");

typedef TcLoadAsync<TcMmaSync> TcLoad;

extern "C" __global__ void __launch_bounds__(THREADS, MINB)
fast_tc_bwd(const u16* __restrict__ Qg, const u16* __restrict__ Kg, const u16* __restrict__ Vg,
            const u16* __restrict__ dOg, const float2* __restrict__ LD, float* __restrict__ dQacc,
            u16* __restrict__ dKg, u16* __restrict__ dVg, const int4* __restrict__ ihead,
            const int2* __restrict__ itile, const int* __restrict__ tent, float* __restrict__ dKVacc, int BH,
            int T_all, float scale_log2, float scale, const int* __restrict__ table) {
    // 1024-byte alignment: every tile starts at a multiple of its row pitch (tc/bwd_mma.cuh)
    extern __shared__ __align__(1024) unsigned char smem[];
    int item, cls;
    const TcWork w = tc_item_work(T_all, BH, item, cls);
    const int2 kts = itile[item];  // (key tile, split slot or -1)
    const int kt = kts.x;
    const int T = w.T;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane >> 2, t4 = lane & 3;
    const AB_PATTERN_T pat{AB_PATTERN_ARGS};

    // shared memory: K, V (resident), Q stages, dO stages, staged P, staged dS
    const u32 sK = tc_smem_addr(smem);
    const u32 sV = sK + TILE_BYTES;
    TcSmem sm;  // the loader's view: the streamed Q and dO tiles where the forward streams K and V
    sm.q = 0;
    sm.k = sV + TILE_BYTES;
    sm.v = sm.k + STAGES * TILE_BYTES;
    const u32 sP = sm.v + STAGES * TILE_BYTES;
    const u32 sS = sP + BM * BWD_PROWB;
    const TcGlobal gm = {nullptr, Qg + w.base, dOg + w.base, nullptr, nullptr, nullptr, nullptr, nullptr};
    const float2* ld = LD + (size_t)w.bh * T_all + cls;
#if !BWD_DQ_PASS
    float* dq = dQacc + w.base;
    const u32 tK = sK + tc_lane_t(lane, BWD_ROWB);
#endif

    tc_load_tile<TcRowLayout, BN>(sK, Kg + w.base, kt * BN, T);
    tc_load_tile<TcRowLayout, BN>(sV, Vg + w.base, kt * BN, T);
    tc_commit();
    TcLoad lq;
    lq.init(sm, gm, w);
    TcTileList list;
    list.init(ihead, tent, item);  // the item's stretch of its key tile's list
    const int n = list.n;
    lq.first_tiles(list);  // waits for K and V

    // the lane's operand addresses (stage st of Q / dO at + st * TILE_BYTES)
    const u32 aQ = sm.k + warp * 16 * BWD_ROWB + tc_lane_a(lane, BWD_ROWB);
    const u32 aO = sm.v + warp * 16 * BWD_ROWB + tc_lane_a(lane, BWD_ROWB);
    const u32 nK = sK + tc_lane_n(lane, BWD_ROWB), nV = sV + tc_lane_n(lane, BWD_ROWB);
    const u32 tQ = sm.k + tc_lane_t(lane, BWD_ROWB), tO = sm.v + tc_lane_t(lane, BWD_ROWB);
    const u32 nP = (sP + tc_lane_n(lane, BWD_PROWB)) ^ (u32)(warp << 5);  // the warp's keys
    const u32 nS = (sS + tc_lane_n(lane, BWD_PROWB)) ^ (u32)(warp << 5);

    TcBwdCols dk, dv;
    tc_zero_frag(dk);
    tc_zero_frag(dv);
    // a key tile reaching past this class's end: its keys >= T masked on every query tile
    const bool edge = kt * BN + BN > T;

    TcBwdWalk walk;
    for (int it = 0; it < n; ++it) {
        u32 so;
        const int ent = walk.step(list, tent, sm, gm, T, it, n, so);
        const int qt = tc_entry_tile(ent);
        const int row0 = qt * BM + warp * 16;
        const float2 ra = tc_bwd_row_stats(ld, row0 + g, T), rb = tc_bwd_row_stats(ld, row0 + g + 8, T);

        TcBwdRows x;
        TcBwdFrag p, f;
        tc_bwd_rows(x, aQ + so, nK);  // S = Q K^T
        if ((ent & 1) || edge) tc_mask_frag(x, pat, row0, kt * BN, T, g, t4);
        tc_bwd_probs(x, ra, rb, scale_log2);  // P
        // P kept packed (16-bit, as the products read it) while dP is computed: half the registers
        tc_bwd_pack(p, x);
        tc_bwd_stage(sP, p, warp, g, t4);
        tc_bwd_rows(x, aO + so, nV);  // dP = dO V^T
        tc_bwd_dscores(x, p, ra, rb);  // dS
        tc_bwd_pack(f, x);
        tc_bwd_stage(sS, f, warp, g, t4);
#if !BWD_DQ_PASS
#pragma unroll 1
        for (int c0 = 0; c0 < HEAD_D; c0 += DQ_CHUNK) {  // dQ += dS K, a column chunk at a time
            float c[DQ_CHUNK / 8][4];
            tc_bwd_dq_chunk<DQ_CHUNK>(c, f, tK, c0);
            tc_bwd_dq_add<DQ_CHUNK>(dq, c, c0, row0, T, g, t4);
        }
#endif
        __syncthreads();  // P and dS staged by every warp
        tc_bwd_cols(dv, nP, tO + so);  // dV += P^T dO
        tc_bwd_cols(dk, nS, tQ + so);  // dK += dS^T Q
    }
    TcLoad::drain();

    tc_bwd_finish(dKg, dVg, dKVacc, dk, dv, kts, w, cls, BH, T_all, scale, warp, g, t4);
}

#if BWD_DQ_PASS
// dQ's own pass: one block a query tile of the forward list (tc_block_work's grid and order), the
// work of tc/bwd_dq_pass.cuh
extern "C" __global__ void __launch_bounds__(THREADS, MINB)
fast_tc_bwd_dq_pass(TC_BWD_DQ_PASS_PARAMS) {
    extern __shared__ __align__(1024) unsigned char smem[];
    tc_bwd_dq_pass_block(smem, tc_block_work(T_all), blockIdx.z, TC_BWD_DQ_PASS_ARGS);
}
#endif
