// Tensor-core attention forward for bfloat16 / float16 (float32 accumulation), FlashAttention-2
// style, over a host-built list of key tiles per query tile.
//
// Grid: (query tiles, B * H, residue classes); block: NWARPS warps, each owning MT m16 tiles of
// query rows (BM = 16 * MT * NWARPS). For every key tile of the query tile's list: S = Q K^T; on
// partial tiles only, keys failing ab_allowed(i, j) or j >= T set to -inf; online softmax; O += P V.
// Then O is normalised, staged in the Q buffer and stored. K/V tiles stream through STAGES
// shared-memory buffers. This file composes the parts, each in kernels/tc/ with its notes:
//   config.cuh          the -D constants with their defaults, the derived shapes (BM, RW, CH, ...)
//   common.cuh          shared-memory layout, swizzled tile layouts, cp.async / ldmatrix / mma /
//                       pack / exp2 / rcp; why some parts are macros (byte-identical cubins)
//   scheduler.cuh       the block's work item (TcWork), the walk over its tile list (TcTileList)
//   mainloop_sync.cuh   products on mma.sync + ldmatrix; loads by cp.async (TcLoadAsync)
//   mainloop_wgmma.cuh  products on wgmma (WG 1); loads by bulk tensor copies (TcLoadTma, TMA 1)
//   mask.cuh            partial-tile masking with the pattern predicate
//   softmax.cuh         the online softmax (lazy max, rescale only past 2^RESCALE_LOG2)
//   epilogue.cuh        normalise, stage, store (16-byte stores or the TMA store)
// The products (TcMma) and the loads (TcLoad) are chosen once below; the #if WG / #if TMA left in
// the body pick the matching step where their arguments differ.
#include "tc/config.cuh"
#include "tc/common.cuh"
#include "tc/scheduler.cuh"
#include "tc/mask.cuh"
#include "tc/softmax.cuh"
#include "tc/epilogue.cuh"
#include "tc/mainloop_sync.cuh"

#if WG
#include "tc/mainloop_wgmma.cuh"
typedef TcMmaWgmma TcMma;
#else
typedef TcMmaSync TcMma;
#endif
#if TMA
typedef TcLoadTma TcLoad;
#else
typedef TcLoadAsync<TcMma> TcLoad;
#endif

extern "C" __global__ void __launch_bounds__(THREADS, MINB)
fast_tc_fwd(const u16* __restrict__ Qg, const u16* __restrict__ Kg, const u16* __restrict__ Vg,
            u16* __restrict__ Og, const int4* __restrict__ thead, const int* __restrict__ tent,
            int T_all, float scale_log2, const int* __restrict__ table, const __grid_constant__ TmaMap mapQ,
            const __grid_constant__ TmaMap mapK, const __grid_constant__ TmaMap mapV,
            const __grid_constant__ TmaMap mapO) {
    // 1024-byte alignment: every tile starts at a multiple of its row pitch (CH * 16 bytes), which
    // the XOR addressing of the ldmatrix reads relies on (TcSmem)
    extern __shared__ __align__(1024) unsigned char smem[];
    const TcWork w = tc_block_work(T_all);
    const int qt = w.qt, T = w.T;
    const u16* q = Qg + w.base;
    const u16* k = Kg + w.base;
    const u16* v = Vg + w.base;
    u16* o = Og + w.base;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const TcSmem sm = tc_smem(smem);
    const u32 sQ = sm.q, sK = sm.k, sV = sm.v;

    const AB_PATTERN_T pat{AB_PATTERN_ARGS};

    const TcGlobal gm = {q, k, v, o, &mapQ, &mapK, &mapV, &mapO};
    TcLoad ld;
    ld.init(sm, gm, w);
    ld.begin();
    TcTileList list;
    list.init(thead, tent, qt);
    const int n = list.n;
    ld.first_tiles(list);
    const u32 sBar = ld.bar;  // (TMA: the stage barriers)

    // per-lane operand addresses of the products (set once)
#if WG
    // descriptor low words (start address, LBO): a k-step, panel or stage adds a constant to them
    const u32 dQ = wg_desc_lo(sQ + (u32)((warp >> 2) * 64 * 128), 0);  // this warpgroup's 64 rows
    const u32 dK = wg_desc_lo(sK, 0);
    const u32 dV = wg_desc_lo(sV, BN * 128);
#else
    // Q fragments: held in registers (QREG 1) or read from the resident Q tile for every key
    // tile (QREG 0: 4 * HEAD_D / 16 registers fewer, for shapes that run more blocks per SM)
    const u32 qthr = sQ + (u32)((warp * RW + (lane & 15)) * CH * 16 + (((lane >> 4) ^ (lane & 7)) << 4));
#if QREG
    u32 qf[MT][HEAD_D / 16][4];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int ks = 0; ks < HEAD_D / 16; ++ks)
            tc_ldsm_x4(qf[m][ks], (qthr ^ (u32)(ks << 5)) + m * 16 * CH * 16);
#endif
    // ldmatrix addresses: a lane's row within a 16-row step has row & 7 == lane & 7, so the
    // swizzled chunk (c ^ (lane & 7)) of k-step ks is (base ^ (ks << 5)) with base holding the
    // lane's own bits; the 16-row steps are constant offsets
    const int l7 = lane & 7;
    const u32 kthr = (u32)((((lane >> 4) << 3) + l7) * CH * 16 + ((((lane >> 3) & 1) ^ l7) << 4));
    const u32 vthr = (u32)(((((lane >> 3) & 1) << 3) + l7) * CH * 16 + (((lane >> 4) ^ l7) << 4));
#endif

    float acc[MT][HEAD_D / 8][4];
    tc_zero(acc);
    float mrow[MT][2], lrow[MT][2];
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        mrow[m][0] = mrow[m][1] = AB_NEG_INF;
        lrow[m][0] = lrow[m][1] = 0.f;
    }
    bool have_max = false;  // every row of this warp has a finite running max

    const int g = lane >> 2, t4 = lane & 3;

    u32 phase = 0;              // parity of the stage barriers' current phase (TMA)
    int st = 0;                 // the stage tile `it` sits in
    int st_fill = STAGES - 1;   // the stage tile `it + STAGES - 1` goes to
    for (int it = 0; it < n; ++it) {
        const int nx = it + STAGES - 1;
        int ent_nx;
        const int ent = list.next(tent, it, ent_nx);
#if TMA
        TC_TMA_REFILL(sK, sV, &mapK, &mapV, sBar, st, st_fill, phase, ent_nx, nx, n);
#else
        TcLoad::refill(sm, gm, T, st_fill, ent_nx, nx, n);
#endif
        st_fill = st_fill == STAGES - 1 ? 0 : st_fill + 1;
        const int kt = ent >> 1;
#if WG
        const u32 so = (u32)st * (TILE_BYTES >> 4);  // this stage's offset in descriptor units
#else
        const u32 tK = sK + st * TILE_BYTES, tV = sV + st * TILE_BYTES;
#endif
#if TMA
        if (st == STAGES - 1) phase ^= 1;
#endif
        st = st == STAGES - 1 ? 0 : st + 1;

        float s[MT][BN / 8][4];
        float rs[MT][2];  // this tile's row sums, this thread's share
        bool idle;        // no row of this warp has an allowed key in the tile: P = 0, no softmax
        for (int pass = 0;; ++pass) {
#if WG
            TcMma::qk(s, dQ, dK, so);
#else
            TC_QK_SYNC(s, tK, kthr, qf, qthr)
#endif

            // a tile reaching past this class's end is partial too (the list is built for the longest)
            idle = false;
            if ((ent & 1) || (STRIDE > 1 && kt * BN + BN > T)) {
                unsigned seen = 0;
#pragma unroll
                for (int m = 0; m < MT; ++m) {
                    TC_MASK_FRAG(s[m], pat, qt * BM + warp * RW + m * 16, kt * BN, T, g, t4, seen);
                }
                TC_MASK_IDLE(idle, seen)
            }

            bool big = false;
            if (idle)
                TC_SOFTMAX_ZERO(s, rs)
            else
                TC_SOFTMAX_PROBS(s, rs, acc, mrow, lrow, have_max, big, scale_log2, pass, it)
            if (!LAZY || !TcMma::vote(big)) break;
        }  // pass
        TC_SOFTMAX_ADD(lrow, rs)

        // O += P V
#if WG
        TC_PV_WGMMA(acc, s, dV, so)
#else
        TC_PV_SYNC(acc, s, tV, vthr, idle)
#endif
    }
    TcLoad::drain();

    TC_STAGE_OUTPUT(sQ, acc, lrow, warp, g, t4)
#if TMA
    TC_STORE_TMA(&mapO, sQ, qt)
#else
    TC_STORE_ROWS(o, sQ, qt, T, warp, lane)
#endif
}
