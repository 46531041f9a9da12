// The backward's products on Hopper's warpgroup MMA (WG 1, sm_90a; fast_tc_bwd_wg.cu): NWG =
// NWARPS / 4 warpgroups a block, a key tile of BN = 64 NWG keys (warpgroup w: keys 64 w ..
// 64 w + 63) against query tiles of BWG_QT = 64 rows that all of them share, key-major so that P^T
// and dS^T stay in registers as the A operands of the two largest products:
//
//   S^T = K Q^T, dP^T = V dO^T   m64n64k16, K / V (resident) and Q / dO (a stage) from shared
//                                memory, all K-major: the warpgroup's rows are keys (warp w:
//                                keys 16 w .. 16 w + 15), its columns the tile's queries;
//   dV += P^T dO, dK += dS^T Q   m64nHEAD_Dk16, A from registers (tc_p_frag of the S^T / dS^T
//                                accumulators), B (dO, Q) read N-major as the forward reads V;
//   dQ = dS K                    m64n64k16 per 64 columns of dQ over the tile's BN keys, A = dS
//                                read M-major from dS^T staged in shared memory ([key][query],
//                                128-byte rows, the 128-byte swizzle), B = K read N-major; with
//                                NWG > 1 warpgroup w takes columns 64 w .. (HEAD_D = 64 NWG), or
//                                at HEAD_D = 64 with two warpgroups both compute the one panel
//                                and each reduces half its columns (32 w ..): dQ is summed over
//                                all BN keys before its float32 reductions (tc_bwd_dq_add), so the
//                                reductions and the Q / dO loads per key fall as 1 / NWG.
//
// Tiles are 64-column panels (TcPanelLayout), streamed by cp.async (tc_load_tile): the Q and dO
// tiles and the tile's rows of (lse2, delta) (8 bytes a row) through STAGES buffers, one commit
// group a tile. With TMA 1 (unstrided patterns) the Q and dO tiles come by bulk tensor copies that
// one thread issues, a stage's two completing on its own mbarrier (after the (lse2, delta) stages),
// and the rows of (lse2, delta) by cp.async as before. Padding rows (>= T) load as zeros (the copy
// engine's fill past the tensor's rows): their S^T column is 0 and lse2 0, so P^T = 1
// there, but dO's zero rows make their dP^T, dS^T and dV terms 0, and their dQ is not stored.
//
// Interface:
//   TcBwgSmem tc_bwg_smem(smem): K, V, STAGES Q, STAGES dO tiles, the staged dS^T, STAGES rows of
//     (lse2, delta), with TMA one mbarrier a stage; BWG_SMEM_BYTES in all.
//   TcBwgWalk: first(sm, src, list, T) loads the list's first STAGES - 1 tiles and waits for K and
//     V (the oldest group); step(sm, src, list, tent, T, it, n, st) -> entry of tile `it`, waits
//     for it (stage st) and refills the stage tile it - 1 used. (TMA: the barriers initialised by
//     first, or once by init_barriers for a persistent block, whose walks carry their phases on; src
//     names the maps of Q and dO and the head.) first = issue_first (static) + wait_first.
//   TcBwgOps tc_bwg_ops(sm, wg): the descriptors' low words for warpgroup wg.
//   tc_bwg_scores(s, dp, op, st): issues S^T and dP^T (two commit groups), waits for S^T.
//   tc_bwg_mask(s, pat, key0, q0, T, g, t4): S^T's disallowed entries -inf (partial tiles, edges).
//   tc_bwg_probs(s, lds, scale_log2): S^T into P^T; lds: the stage's (lse2, delta) rows at 16 t4.
//   tc_bwg_dscores(dp, p, lds): dP^T into dS^T = P^T (dP^T - delta), P^T packed (p).
//   tc_bwg_kv(acc, a, b): issues acc += A B for A's 4 k-steps (dV: A = P^T, B = dO; dK: A = dS^T,
//     B = Q), one commit group.
//   tc_bwg_pack(a, x), tc_bwg_stage(s, a, warp, g, t4): a fragment packed as A operands; dS^T staged.
//   TC_BWG_PRODUCTS(s, dp, pd, dk, dv, op, so, lds, scale_log2): probs, dV issued, dscores, dK issued (the
//     above in a tile's order once S^T landed), dS^T packed in pd.
//   TcBwgDq tc_bwg_dq_at(p, map, bh, sm): where dQ's sums go (BWD_DQ_BULK: by bulk tensor reductions, the map);
//     tc_bwg_dq_out<C>(dq, c, c0, row0, T, g, t4, buf): a warp's C columns of them added there;
//     tc_bwg_dq_free(), tc_bwg_dq_drain(): (BWD_DQ_BULK) the staging buffers read, the reductions done.
//   tc_bwg_dq(dq, op, wg, row0, T, g, t4): dQ's rows of the tile += dS K, a 64-column panel at a time.
//   tc_bwg_dq_tile(dq, op, ds, wg, row0, T, g, t4): (BWG_DQ_PAIRED) one tile's dQ rows += dS K, the whole
//     panel by warpgroup wg, from the dS^T buffer at descriptor word ds; tc_bwg_dq_issue(c, op, ds, p) its
//     products alone (against K's 64-column panel p, default 0), into c (BWG_DQ_PIPE: reduced a tile later;
//     tc/bwd_lag.cuh's LAG 2: behind the next tile's dK).
#pragma once
#include "tc/common.cuh"
#include "tc/scheduler.cuh"
#include "tc/mainloop_sync.cuh"
#include "tc/mainloop_wgmma.cuh"
#include "tc/bwd_mma.cuh"
#include "tc/bwd_epilogue.cuh"

#define BWG_NWG (NWARPS / 4)  // warpgroups
#define BWG_QT 64             // query rows a tile
// dQ's panels: one warpgroup takes all; several split them, one 64-column panel each; two at
// HEAD_D = 64 share the one panel, each computing it and reducing half its columns
#define BWG_DQ_HALVES (BWG_NWG == 2 && HEAD_D == 64)
// ... or, with BWD_DQ_PAIRS (the default), they take a list's query tiles two at a time: dS^T of the
// pair's first tile staged in one buffer, the second's in another, then warpgroup w computes and
// reduces all of tile w's dQ (the halves above only for a list's odd last tile): no product done
// twice, one barrier fewer a pair
#ifndef BWD_DQ_PASS
#define BWD_DQ_PASS 0
#endif
#ifndef BWD_DQ_PAIRS
#define BWD_DQ_PAIRS 1
#endif
#define BWG_DQ_PAIRED (BWG_DQ_HALVES && BWD_DQ_PAIRS && !BWD_DQ_PASS)
// BWD_DQ_PAIRS 2 (BWG_DQ_PIPE): a pair's dQ products left in flight through the next pair's first tile
// (its barrier, refill and S^T) and reduced once that S^T lands; two sets of the pair's buffers in
// turn, so that no warp restages one a warpgroup's products may still read
#define BWG_DQ_PIPE (BWG_DQ_PAIRED && BWD_DQ_PAIRS == 2)
// BWD_DQ_BULK 1 (TMA builds, dQ summed here): a warpgroup's dQ panel leaves by a bulk tensor reduction, not by
// red.global.add from each thread's registers: the 64 x 64 float32 panel staged in shared memory (two 32-column
// boxes of 128-byte rows, the 128-byte swizzle; a buffer a warpgroup, or a panel with one warpgroup), then one
// thread of the warpgroup adds it into the float32 accumulator in L2 (cp.reduce.async.bulk.tensor, rows >= T
// clipped by the map). Before the block's barrier that precedes dQ's products each warpgroup's issuing thread
// waits until its last reductions have read their buffers (tc_bwg_dq_free). BWD_DQ_BULK 2: two sets of those
// buffers, a tile's dQ in set it % 2 (the loop that takes one query tile at a time), and the issuing thread waits
// only for the reductions of the set it is about to refill, two tiles old, so the last tile's stay in flight
#ifndef BWD_DQ_BULK
#define BWD_DQ_BULK 0
#endif
// BWD_DQ_STORE 1 (the host's rule: every query tile's forward list holds one key tile, so one work item sums all of
// its dQ): dQ's rows leave as the finished gradient, times the scale in the storage dtype, by plain stores from
// registers into dQ itself; no float32 accumulator, no zeroing, no reductions and no convert
#ifndef BWD_DQ_STORE
#define BWD_DQ_STORE 0
#endif
#define BWG_DQ_BUFS (BWD_DQ_BULK ? (HEAD_D / 64 > BWG_NWG ? HEAD_D / 64 : BWG_NWG) : 0)
#define BWG_DQB (BWG_QT * 64 * 4)  // a staged float32 panel: two boxes of 64 rows x 128 bytes
#define BWG_DQ_SETS (BWD_DQ_BULK == 2 ? 2 : 1)
// the bulk groups a warpgroup's issuing thread commits a tile: one a panel it reduces
#define BWG_DQ_GROUPS (BWG_DQ_BUFS / BWG_NWG)
static_assert(BWD_DQ_BULK != 2 || !BWG_DQ_PAIRED, "dQ's staging buffers in two sets: one query tile at a time");
static_assert(!BWD_DQ_BULK || (TMA && !BWD_DQ_PASS && !BWG_DQ_PIPE),
              "dQ by bulk reductions: beside bulk tensor copies, with dQ summed in the main loop, not in flight");
static_assert(!BWD_DQ_STORE || (!BWD_DQ_PASS && !BWD_DQ_BULK && !BWG_DQ_PIPE),
              "dQ stored by the main loop: summed there, from registers, not in flight");
static_assert(WG && (!TMA || STRIDE == 1) && NWARPS % 4 == 0 && BN == 64 * BWG_NWG &&
              (BWG_NWG == 1 || HEAD_D == 64 * BWG_NWG || BWG_DQ_HALVES),
              "wgmma backward: BN = 64 keys a warpgroup, bulk tensor copies on unstrided patterns only; several "
              "warpgroups split dQ by 64-column panels (two at HEAD_D = 64 by 32-column halves)");

#define BWG_QBYTES (BWG_QT * HEAD_D * 2)  // a Q or dO tile
#define BWG_LDB (BWG_QT * 8)              // a stage's (lse2, delta) rows
#define BWG_DSB (BN * BWG_QT * 2)          // a staged dS^T
// BWD_DQ_LAG 1 (tc/bwd_lag.cuh): two warpgroups, each taking dQ of the tile before its current one, no block barrier
// a tile: two staged dS^T in turn, a copy of the (lse2, delta) stages a warpgroup, four more barriers and a counter a
// stage after the stages' barriers
#ifndef BWD_DQ_LAG
#define BWD_DQ_LAG 0
#endif
#define BWG_DS_BUFS (BWG_DQ_PIPE ? 4 : (BWG_DQ_PAIRED || BWD_DQ_LAG) ? 2 : 1)
#define BWG_LD_SETS (BWD_DQ_LAG ? BWG_NWG : 1)
#define BWG_SMEM_BYTES (2 * TILE_BYTES + 2 * STAGES * BWG_QBYTES + BWG_DS_BUFS * BWG_DSB + BWG_DQ_SETS * BWG_DQ_BUFS * BWG_DQB + \
                        BWG_LD_SETS * STAGES * BWG_LDB + (TMA ? 8 * STAGES : 0) + (BWD_DQ_LAG ? 32 + 4 * STAGES : 0))

typedef float TcBwgRows[BWG_QT / 8][4];  // a warp's [16 keys][64 queries] fragment: S^T, P^T, dP^T, dS^T
typedef u32 TcBwgFrag[BWG_QT / 16][4];   // the same packed as the A operands of its k-steps

struct TcBwgSmem {
    u32 k, v;  // the key tile's K and V
    u32 q, o;  // the Q and dO stages (stage s at + s * BWG_QBYTES)
    u32 ds;    // dS^T staged for dQ (BWG_DS_BUFS buffers, BWG_DSB bytes apart)
    u32 dqs;   // BWD_DQ_BULK: dQ's float32 panels staged for their reductions (BWG_DQ_SETS x BWG_DQ_BUFS, BWG_DQB
               // bytes apart)
    u32 ld;    // the (lse2, delta) stages (stage s at + s * BWG_LDB; BWD_DQ_LAG: warpgroup w's at + (w STAGES + s) BWG_LDB)
    u32 bar;   // TMA: the stages' mbarriers (stage s's at + 8 s; BWD_DQ_LAG: tc/bwd_lag.cuh's after them)
};

__device__ __forceinline__ TcBwgSmem tc_bwg_smem(const void* smem) {
    TcBwgSmem s;
    s.k = tc_smem_addr(smem);
    s.v = s.k + TILE_BYTES;
    s.q = s.v + TILE_BYTES;
    s.o = s.q + STAGES * BWG_QBYTES;
    s.ds = s.o + STAGES * BWG_QBYTES;
    s.dqs = s.ds + BWG_DS_BUFS * BWG_DSB;
    s.ld = s.dqs + BWG_DQ_SETS * BWG_DQ_BUFS * BWG_DQB;
    s.bar = s.ld + BWG_LD_SETS * STAGES * BWG_LDB;
    return s;
}

// the tensors a work item streams, at its class's first row; with TMA the maps of Q and dO too
// ([B*H][T][HEAD_D], boxes of 64 columns by BWG_QT rows) and the item's head, their third coordinate
struct TcBwgSrc {
    const u16 *q, *o;
    const float2* ld;  // rows STRIDE apart
#if TMA
    const TmaMap *mq, *mo;
    int bh;
#endif
};

__device__ __forceinline__ void tc_cp_async8(u32 dst, const void* src, int bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" :: "r"(dst), "l"(src), "r"(bytes));
}

// query tile qt's rows of (lse2, delta) into stage s (rows >= T zero-filled)
__device__ __forceinline__ void tc_bwg_load_ld(const TcBwgSmem& sm, const TcBwgSrc& src, int qt, int T, int s) {
    if (threadIdx.x < BWG_QT) {
        const int row = qt * BWG_QT + threadIdx.x;
        const bool ok = row < T;
        tc_cp_async8(sm.ld + s * BWG_LDB + threadIdx.x * 8, ok ? src.ld + (size_t)row * STRIDE : src.ld, ok ? 8 : 0);
    }
}

// query tile qt's Q, dO and (lse2, delta) rows into stage s (rows >= T zero-filled)
__device__ __forceinline__ void tc_bwg_load(const TcBwgSmem& sm, const TcBwgSrc& src, int qt, int T, int s) {
    tc_load_tile<TcPanelLayout, BWG_QT>(sm.q + s * BWG_QBYTES, src.q, qt * BWG_QT, T);
    tc_load_tile<TcPanelLayout, BWG_QT>(sm.o + s * BWG_QBYTES, src.o, qt * BWG_QT, T);
    tc_bwg_load_ld(sm, src, qt, T, s);
}

#if TMA
// query tile qt's Q and dO into stage s by bulk tensor copies (thread 0), completing on the stage's barrier
__device__ __forceinline__ void tc_bwg_copy(const TcBwgSmem& sm, const TcBwgSrc& src, int qt, int s) {
    const u32 bar = sm.bar + 8 * s;
    tma_expect(bar, 2 * BWG_QBYTES);
#pragma unroll
    for (int pn = 0; pn < HEAD_D / 64; ++pn) {
        tc_tma_load_rows(sm.q + s * BWG_QBYTES + pn * BWG_QT * 128, src.mq, pn * 64, qt * BWG_QT, src.bh, bar);
        tc_tma_load_rows(sm.o + s * BWG_QBYTES + pn * BWG_QT * 128, src.mo, pn * 64, qt * BWG_QT, src.bh, bar);
    }
}
#endif

struct TcBwgWalk {
    int st = 0, st_fill = STAGES - 1;
#if TMA
    u32 phases = 0;  // bit s: the parity of stage s's barrier's current phase (a persistent block's runs on)
#endif

    // query tile qt into stage s (one commit group with the caller's tc_commit)
    static __device__ __forceinline__ void fill(const TcBwgSmem& sm, const TcBwgSrc& src, int qt, int T, int s) {
#if TMA
        if (threadIdx.x == 0) tc_bwg_copy(sm, src, qt, s);
        tc_bwg_load_ld(sm, src, qt, T, s);
#else
        tc_bwg_load(sm, src, qt, T, s);
#endif
    }

    __device__ __forceinline__ void first(const TcBwgSmem& sm, const TcBwgSrc& src, const TcTileList& list, int T) {
#if TMA
        init_barriers(sm);
#endif
        issue_first(sm, src, list, T);
        wait_first();
    }

#if TMA
    // the stages' barriers, once a block
    static __device__ __forceinline__ void init_barriers(const TcBwgSmem& sm) {
        if (threadIdx.x == 0) {
#pragma unroll
            for (int s = 0; s < STAGES; ++s) tma_bar_init(sm.bar + 8 * s, 1);
            tma_bar_fence_init();
        }
        __syncthreads();  // the barriers are initialised before anyone (the copy engine too) uses them
    }
#endif

    // first's loads and its wait apart (cp.async: a persistent block issues the next item's loads before it
    // stores this one's dK and dV): the list's first STAGES - 1 tiles, a commit group each ...
    static __device__ __forceinline__ void issue_first(const TcBwgSmem& sm, const TcBwgSrc& src,
                                                       const TcTileList& list, int T) {
#pragma unroll
        for (int s = 0; s < STAGES - 1; ++s) {
            if (s < list.n) fill(sm, src, tc_entry_tile(list.ring[s]), T, s);
            tc_commit();
        }
    }

    // ... and the wait for the group before them (K and V's)
    static __device__ __forceinline__ void wait_first() {
        tc_wait<STAGES - 1>();  // K and V's group is the oldest
        wg_fence_smem();
        __syncthreads();
    }

    __device__ __forceinline__ int step(const TcBwgSmem& sm, const TcBwgSrc& src, TcTileList& list,
                                        const int* __restrict__ tent, int T, int it, int n, int& stage) {
        int ent_nx;
        const int ent = list.next(tent, it, ent_nx);
        tc_wait<STAGES - 2>();
#if TMA
        tma_wait(sm.bar + 8 * st, (phases >> st) & 1);  // tile it's Q and dO (its (lse2, delta) rows: the group above)
        phases ^= 1u << st;
#endif
        wg_fence_smem();
        __syncthreads();  // tile `it` visible to all; every warp done with tile it - 1 (its stage, dS^T)
        if (it + STAGES - 1 < n) fill(sm, src, tc_entry_tile(ent_nx), T, st_fill);
        tc_commit();
        st_fill = st_fill == STAGES - 1 ? 0 : st_fill + 1;
        stage = st;
        st = st == STAGES - 1 ? 0 : st + 1;
        return ent;
    }
};

// descriptor low words: K-major views (S^T, dP^T: this warpgroup's 64 rows of K and V, the Q and
// dO stages), N-major views with their panel stride (dV, dK: dO and Q; dQ: K), the staged dS^T read
// M-major (one 64-query panel)
struct TcBwgOps {
    u32 k, v, q, o;    // K-major (stage offsets added for q and o)
    u32 qn, on, kn;    // N-major
    u32 ds;
};

__device__ __forceinline__ TcBwgOps tc_bwg_ops(const TcBwgSmem& sm, int wg) {
    TcBwgOps op;
    op.k = wg_desc_lo(sm.k + (u32)(wg * 64 * 128), 0);
    op.v = wg_desc_lo(sm.v + (u32)(wg * 64 * 128), 0);
    op.q = wg_desc_lo(sm.q, 0);
    op.o = wg_desc_lo(sm.o, 0);
    op.qn = wg_desc_lo(sm.q, BWG_QT * 128);
    op.on = wg_desc_lo(sm.o, BWG_QT * 128);
    op.kn = wg_desc_lo(sm.k, BN * 128);
    op.ds = wg_desc_lo(sm.ds, BWG_QT * 128);
    return op;
}


__device__ __forceinline__ void tc_bwg_scores(TcBwgRows& s, TcBwgRows& dp, const TcBwgOps& op, int st) {
    const u32 so = (u32)st * (BWG_QBYTES >> 4);
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < HEAD_D / 16; ++ks)
        wg_ss64(s, wg_desc_of(op.k + tc_wg_kstep<BN>(ks)), wg_desc_of(op.q + so + tc_wg_kstep<BWG_QT>(ks)), ks);
    wg_commit();
#pragma unroll
    for (int ks = 0; ks < HEAD_D / 16; ++ks)
        wg_ss64(dp, wg_desc_of(op.v + tc_wg_kstep<BN>(ks)), wg_desc_of(op.o + so + tc_wg_kstep<BWG_QT>(ks)), ks);
    wg_commit();
    wg_wait<1>();
}

// S^T's entries the pattern disallows set to -inf: s[j][e] is key key0 + g + 8 (e >> 1), query
// q0 + 8 j + 2 t4 + (e & 1). Thread (g, t4) evaluates the predicate for queries 8 g + 2 t4 and + 1
// over the warp's 16 keys (ab_allowed_bits, low 16 bits of each word, packed in one), and block j
// takes its word from lane 4 j + t4. Queries clamped below T (the predicate's table reads); keys
// >= T masked for non-causal patterns (a causal key beyond T is beyond every real query).
template <class P>
__device__ __forceinline__ void tc_bwg_mask(TcBwgRows& s, const P& pat, int key0, int q0, int T, int g, int t4) {
    const int qa = q0 + 8 * g + 2 * t4;
    unsigned wa = ab_allowed_bits(pat, min(qa, T - 1), key0), wb = ab_allowed_bits(pat, min(qa + 1, T - 1), key0);
    if (!CAUSAL) {
        const unsigned in_seq = ab_span(0, T - 1 - key0);
        wa &= in_seq;
        wb &= in_seq;
    }
    const unsigned mine = (wa & 0xffffu) | (wb << 16);
#pragma unroll
    for (int j = 0; j < BWG_QT / 8; ++j) {
        const unsigned x = __shfl_sync(0xffffffffu, mine, 4 * j + t4) >> g;
        s[j][0] = (x & 1u) ? s[j][0] : AB_NEG_INF;
        s[j][1] = ((x >> 16) & 1u) ? s[j][1] : AB_NEG_INF;
        s[j][2] = ((x >> 8) & 1u) ? s[j][2] : AB_NEG_INF;
        s[j][3] = ((x >> 24) & 1u) ? s[j][3] : AB_NEG_INF;
    }
}

// (lse2, delta) of queries 8 j + 2 t4 and + 1: one 16-byte read (lds = the stage's rows + 16 t4)
__device__ __forceinline__ float4 tc_bwg_stats(u32 lds, int j) {
    float4 r;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(r.x), "=f"(r.y), "=f"(r.z), "=f"(r.w) : "r"(lds + j * 64));
    return r;
}

__device__ __forceinline__ void tc_bwg_probs(TcBwgRows& s, u32 lds, float scale_log2) {
#pragma unroll
    for (int j = 0; j < BWG_QT / 8; ++j) {
        const float4 L = tc_bwg_stats(lds, j);
        s[j][0] = tc_exp2(fmaf(s[j][0], scale_log2, -L.x));
        s[j][1] = tc_exp2(fmaf(s[j][1], scale_log2, -L.z));
        s[j][2] = tc_exp2(fmaf(s[j][2], scale_log2, -L.x));
        s[j][3] = tc_exp2(fmaf(s[j][3], scale_log2, -L.z));
    }
}

// p[kk][e] (tc_p_frag): block 2 kk + (e >> 1), key g + 8 (e & 1), its two queries' P
__device__ __forceinline__ void tc_bwg_dscores(TcBwgRows& dp, const TcBwgFrag& p, u32 lds) {
#pragma unroll
    for (int j = 0; j < BWG_QT / 8; ++j) {
        const float4 L = tc_bwg_stats(lds, j);
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // keys g, g + 8
            const float2 pv = tc_unpack(p[j >> 1][2 * (j & 1) + h]);
            dp[j][2 * h] = pv.x * (dp[j][2 * h] - L.y);
            dp[j][2 * h + 1] = pv.y * (dp[j][2 * h + 1] - L.w);
        }
    }
}

// acc += A B over the tile's 64 queries: A's k-step kk is a[kk], B's rows 16 kk .. at descriptor
// word b (an N-major view with the stage offset added); one commit group
__device__ __forceinline__ void tc_bwg_kv(TcBwdCols& acc, const TcBwgFrag& a, u32 b) {
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < BWG_QT / 16; ++kk) WG_CAT(wg_rs, HEAD_D)(acc, a[kk], wg_desc_of(b + ((kk * 16 * 128) >> 4)), 1);
    wg_commit();
}

// a [16 keys][64 queries] fragment packed as the A operands of its 4 k-steps (tc_p_frag)
__device__ __forceinline__ void tc_bwg_pack(TcBwgFrag& a, const TcBwgRows& x) {
#pragma unroll
    for (int kk = 0; kk < BWG_QT / 16; ++kk) tc_p_frag(a[kk], x, kk);
}

// a warp's packed dS^T into its keys' rows (16 warp + g and + 8) of the staged [BN][64] tile: 128-byte
// rows, chunk c of row r at (c ^ (r & 7)); a[kk][0] / [1] keys g / g + 8 at chunk 2 kk, a[kk][2] / [3]
// at chunk 2 kk + 1, 4 bytes at t4 * 4 (the 128-byte swizzle wgmma reads)
__device__ __forceinline__ void tc_bwg_stage(u32 s, const TcBwgFrag& a, int warp, int g, int t4) {
    const u32 r0 = s + (u32)((warp * 16 + g) * 128 + t4 * 4);
#pragma unroll
    for (int kk = 0; kk < BWG_QT / 16; ++kk) {
#pragma unroll
        for (int x = 0; x < 4; ++x) {
            const u32 addr = r0 + (x & 1) * 8 * 128 + (u32)(((2 * kk + (x >> 1)) ^ g) << 4);
            asm volatile("st.shared.u32 [%0], %1;\n" :: "r"(addr), "r"(a[kk][x]));
        }
    }
}

// where dQ's sums go: the float32 accumulator at the head's (class's) first row; with BWD_DQ_BULK also its map
// ([B*H][T][HEAD_D], boxes of 32 columns by 64 rows), the head and the staging buffers
struct TcBwgDq {
    float* p;
#if BWD_DQ_STORE
    u16* o;       // dQ itself at the head's (class's) first row
    float scale;  // the softmax scale dQ is multiplied by
#endif
#if BWD_DQ_BULK
    const TmaMap* map;
    int bh;
    u32 buf;
#endif
};

// BWD_DQ_STORE: dQ's rows stored at o (the head's first row of dQ in the storage dtype), times scale
__device__ __forceinline__ TcBwgDq tc_bwg_dq_store_at(u16* o, float scale) {
#if BWD_DQ_STORE
    return {nullptr, o, scale};
#else
    (void)o, (void)scale;
    return {nullptr};
#endif
}

__device__ __forceinline__ TcBwgDq tc_bwg_dq_at(float* p, const TmaMap* map, int bh, const TcBwgSmem& sm) {
#if BWD_DQ_BULK
    return {p, map, bh, sm.dqs};
#else
    (void)map, (void)bh, (void)sm;
    return {p};
#endif
}

// BWD_DQ_BULK: each warpgroup's issuing thread waits until its last reductions have read their buffers (2: all but
// the last tile's, BWG_DQ_GROUPS groups, in the other set); before the block's barrier that precedes dQ's products,
// which the buffers' next writes follow
__device__ __forceinline__ void tc_bwg_dq_free() {
#if BWD_DQ_BULK == 2
    if (threadIdx.x % 128 == 0) asm volatile("cp.async.bulk.wait_group.read %0;\n" :: "n"(BWG_DQ_GROUPS) : "memory");
#elif BWD_DQ_BULK
    if (threadIdx.x % 128 == 0) tma_bulk_wait_read();
#endif
}

// ... and at the end of a block's work, until their writes are done
__device__ __forceinline__ void tc_bwg_dq_drain() {
#if BWD_DQ_BULK
    if (threadIdx.x % 128 == 0) tma_bulk_wait();
#endif
}

// C = 64 or 32 columns of a warp's dQ rows row0 + g, + 8 (c[j]: columns 8 j + 2 t4, + 1) added at dQ's columns
// c0: by red.global.add from registers; with BWD_DQ_STORE stored (times the scale, a column pair a 4-byte store,
// rows below T), the tile's whole sum; with BWD_DQ_BULK, staged in buffer `buf` (box j / 4: 16-byte chunk
// (2 (j % 4) + t4 / 2) ^ (row % 8) of the row's 128 bytes) and added by one bulk tensor reduction a box, issued
// by the warpgroup's first thread once its four warps have staged theirs (rows >= T: the map clips them)
template <int C>
__device__ __forceinline__ void tc_bwg_dq_out(const TcBwgDq& dq, const float (&c)[C / 8][4], int c0, int row0, int T,
                                              int g, int t4, int buf) {
#if BWD_DQ_STORE
    (void)buf;
    tc_bwd_store_part<C>(dq.o, c, c0, dq.scale, row0, T, g, t4);
#elif BWD_DQ_BULK
    const u32 base = dq.buf + (u32)buf * BWG_DQB;
    const int r = (row0 & (BWG_QT - 1)) + g;
#pragma unroll
    for (int j = 0; j < C / 8; ++j) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int rr = r + 8 * h;
            const u32 addr = base + (u32)((j >> 2) * (BWG_QT * 128) + rr * 128 +
                                          (((2 * (j & 3) + (t4 >> 1)) ^ (rr & 7)) << 4) + (t4 & 1) * 8);
            asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" :: "r"(addr), "f"(c[j][2 * h]), "f"(c[j][2 * h + 1]));
        }
    }
    wg_fence_smem();  // the staged panel visible to the copy engine ...
    asm volatile("bar.sync %0, 128;\n" :: "r"(1 + (int)(threadIdx.x / 128)) : "memory");  // ... staged by all four warps
    if (threadIdx.x % 128 == 0) {
#pragma unroll
        for (int b = 0; b < C / 32; ++b) tma_reduce_add3(dq.map, c0 + 32 * b, row0 & ~(BWG_QT - 1), dq.bh,
                                                          base + (u32)(b * BWG_QT * 128));
        tma_bulk_commit();
    }
    (void)T;
#else
    (void)buf;
    tc_bwd_dq_add<C>(dq.p, c, c0, row0, T, g, t4);
#endif
}

// dQ rows row0 + g, + 8 (this warp's query rows of the tile) += dS K over the tile's BN keys, 64
// columns at a time: A = dS from the staged dS^T (M-major, k-step kk at its rows 16 kk ..), B = K's
// panel p (N-major); one warpgroup takes every panel, several take one each (panel wg), two at
// HEAD_D = 64 the one panel, warpgroup wg reducing its columns 32 wg .. 32 wg + 31; with BWD_DQ_BULK, staged in
// the buffers of set `set` (BWD_DQ_BULK 2: the tile's parity)
__device__ __forceinline__ void tc_bwg_dq(const TcBwgDq& dq, const TcBwgOps& op, int wg, int row0, int T, int g,
                                          int t4, int set = 0) {
    const int b0 = set * BWG_DQ_BUFS;
#pragma unroll 1
    for (int p = (BWG_NWG == 1 || BWG_DQ_HALVES) ? 0 : wg; p < (BWG_NWG == 1 ? HEAD_D / 64 : BWG_DQ_HALVES ? 1 : wg + 1);
         ++p) {
        float c[8][4];
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk)
            wg_tt64(c, wg_desc_of(op.ds + ((kk * 16 * 128) >> 4)),
                    wg_desc_of(op.kn + ((p * BN * 128 + kk * 16 * 128) >> 4)), kk);
        wg_commit();
        wg_wait<0>();
        if (!BWG_DQ_HALVES) {
            tc_bwg_dq_out<64>(dq, c, p * 64, row0, T, g, t4, b0 + (BWG_NWG == 1 ? p : wg));
        } else if (wg == 0) {  // constant indices: c stays in registers
            tc_bwg_dq_out<32>(dq, reinterpret_cast<const float(&)[4][4]>(c[0]), 0, row0, T, g, t4, b0);
        } else {
            tc_bwg_dq_out<32>(dq, reinterpret_cast<const float(&)[4][4]>(c[4]), 32, row0, T, g, t4, b0 + 1);
        }
    }
}

// one query tile's dQ rows (this warp's 16) of dS K over the tile's BN keys into c, a whole 64-column panel by this
// warpgroup (BWG_DQ_PAIRED: D = 64's one panel; tc/bwd_lag.cuh's LAG 2: panel p = the warpgroup): A = dS from the
// dS^T staged at descriptor word ds (M-major), B = K's columns 64 p .. (N-major); one commit group
__device__ __forceinline__ void tc_bwg_dq_issue(float (&c)[8][4], const TcBwgOps& op, u32 ds, int p = 0) {
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk)
        wg_tt64(c, wg_desc_of(ds + ((kk * 16 * 128) >> 4)), wg_desc_of(op.kn + ((p * BN * 128 + kk * 16 * 128) >> 4)),
                kk);
    wg_commit();
}

// ... issued, waited for and added to dQ's rows row0 + g, + 8 (by warpgroup wg)
__device__ __forceinline__ void tc_bwg_dq_tile(const TcBwgDq& dq, const TcBwgOps& op, u32 ds, int wg, int row0, int T,
                                               int g, int t4) {
    float c[8][4];
    tc_bwg_dq_issue(c, op, ds);
    wg_wait<0>();
    tc_bwg_dq_out<64>(dq, c, 0, row0, T, g, t4, wg);
}

// a tile's products once S^T has landed (and been masked): P^T, dV += P^T dO issued; dP^T waited for, dS^T
// packed into pd, dK += dS^T Q issued (so: the stage's descriptor offset, lds its (lse2, delta) rows). A
// macro, not a function: the main loops' code stays token for token what it was (as a function, NVVM
// numbered the registers of the dQ-pass builds otherwise, and their cubins changed)
#define TC_BWG_PRODUCTS(s, dp, pd, dk, dv, op, so, lds, scale_log2) \
    do {                                                            \
        TcBwgFrag pa_;                                              \
        tc_bwg_probs(s, lds, scale_log2);                           \
        tc_bwg_pack(pa_, s);                                        \
        tc_bwg_kv(dv, pa_, (op).on + (so));                         \
        wg_wait<1>();                                               \
        tc_bwg_dscores(dp, pa_, lds);                               \
        tc_bwg_pack(pd, dp);                                        \
        tc_bwg_kv(dk, pd, (op).qn + (so));                          \
    } while (0)
