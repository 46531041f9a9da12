// Decoding attention for bfloat16 / float16 (float32 accumulation): Tq queries at the end of each
// sequence's key/value cache, grouped-query heads, ragged batches, any pattern; split-KV.
//
// A block takes one (sequence b, key/value head) and one stretch (split) of the key tiles that
// sequence's queries may read (its list: the tiles some of the Tq positions Tk_b - Tq .. Tk_b - 1
// allow, flagged full or partial for all of them). Its query rows are every query head of the
// group that reads this key/value head, times the Tq positions: rows (h - h0) * Tq + t, which in
// q [B, H, Tq, D] are one contiguous slab, so each K/V byte is read once per split for the whole
// group. Rows past the group's (at most BM) are padding, never stored. The block runs fast_tc's
// parts (kernels/tc/): products on mma.sync (TcMmaSync), or with WG 1 (sm_90a) on Hopper's warpgroup
// MMA (TcMmaWgmma: a warpgroup's 64 rows a product, Q and the K/V stages in 64-column panels, the
// 128-byte swizzle; with KWG 2 two warpgroups on the same rows, each on its BN keys of a stage of 2 x BN
// and its own softmax, merged in shared memory after the last tile: decode_kwg_merge), K/V tiles by
// cp.async (TcLoadAsync; with KWG 2 DecodeLoadHalves, tc/decode_halves.cuh: each warpgroup loads its own
// keys of every stage and waits on a barrier of its own), partial tiles masked with the pattern
// predicate at each row's own position (tc_mask_rows), the online softmax (TcSoftmax), walked one tile after
// another (DecodeWalkSerial, tc/decode_walk.cuh) or, with DECODE_OV 1 on warpgroup MMA, with S of one tile and
// P V of the one before in flight together (DecodeWalkOverlap, tc/decode_overlap.cuh). Each split
// stores its rows' output normalised by its own row sums, in
// float32, with the rows' log-sum-exp (base 2); decode_merge (tc/decode_common.cuh) then weighs the
// splits of every row in a second launch, a block per output row (the default). A pair with one split
// stores its output itself and no merge runs. With MERGE_LAST the last split of each
// (b, key/value head) to finish merges the group's rows itself (a ticket per pair, taken after a
// fence, put back to 0 by that block for the next launch): one launch in all, but that block's
// serial merge cost more than the second launch saved (docs/PERF.md "decode: the merge").
//
// decode_split grid: (splits, H_kv, B); block: THREADS. decode_merge grid: B * H * Tq; block:
// HEAD_D threads.
#include "tc/config.cuh"
#include "tc/common.cuh"
#include "tc/scheduler.cuh"
#include "tc/mask.cuh"
#include "tc/softmax.cuh"
#include "tc/mainloop_sync.cuh"
#if WG
#include "tc/mainloop_wgmma.cuh"
#endif
#define DEC_ROWS BM  // the partial's rows a split: the whole tile's
#include "tc/decode_common.cuh"

static_assert(!TMA && MT == 1 && (WG || QREG == 1), "decode: mma.sync or wgmma, cp.async, one m16 tile per warp");

#if WG
typedef TcMmaWgmma TcMma;
#else
typedef TcMmaSync TcMma;
#endif
#if KWG > 1
#include "tc/decode_halves.cuh"
typedef DecodeLoadHalves<TcMma> TcLoad;  // a stage of 2 x BN keys, each warpgroup loading and reading its BN
#else
typedef TcLoadAsync<TcMma, BN> TcLoad;
#endif
// the walk over the split's tiles: each product waited for (tc/decode_walk.cuh), or with DECODE_OV 1 the products of
// consecutive tiles in flight together (tc/decode_overlap.cuh; the warpgroup MMA build)
#ifndef DECODE_OV
#define DECODE_OV 0
#endif
#include "tc/decode_walk.cuh"
#if DECODE_OV
#include "tc/decode_overlap.cuh"
typedef DecodeWalkOverlap<TcMma, TcLoad> DecodeWalk;
#else
typedef DecodeWalkSerial<TcMma, TcLoad> DecodeWalk;
#endif

#if KWG > 1
// KWG 2: the second warpgroup's online-softmax state (its rows' max, each thread's partial row sums, O) merged
// into the first's, the thread of the same lane in the same warp of its group holding the same rows; through
// shared memory past the cluster's rows (element-major: a store or load of the 128 threads is one of 32 banks)
#define KWG_AT ((BM * HEAD_D * 4 + BM * 4 + 15) / 16 * 16)
#define KWG_N (HEAD_D / 8 * 4 + 4)  // a thread's floats: O's, then the two rows' max and sums
static_assert(KWG_AT + KWG_N * 128 * 4 <= (BM + 2 * STAGES * KWG * BN) * HEAD_D * 2,
              "the exchange fits past the cluster's rows");
__device__ __forceinline__ void decode_kwg_merge(TcAcc& acc, TcSoftmax& sf, unsigned char* smem, int slice,
                                                 float scale_log2) {
    float* x = reinterpret_cast<float*>(smem + KWG_AT) + threadIdx.x % 128;
    __syncthreads();  // every warp past its last tile: Q's tile and the stages are free
    if (slice == 1) {
#pragma unroll
        for (int d = 0; d < HEAD_D / 8; ++d)
#pragma unroll
            for (int e = 0; e < 4; ++e) x[(d * 4 + e) * 128] = acc[0][d][e];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            x[(KWG_N - 4 + r) * 128] = sf.m[0][r];
            x[(KWG_N - 2 + r) * 128] = sf.l[0][r];
        }
    }
    __syncthreads();
    if (slice == 0) {
        float f0[2], f1[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float m1 = x[(KWG_N - 4 + r) * 128], m0 = sf.m[0][r], m = fmaxf(m0, m1);
            f0[r] = m0 == AB_NEG_INF ? 0.f : tc_exp2((m0 - m) * scale_log2);
            f1[r] = m1 == AB_NEG_INF ? 0.f : tc_exp2((m1 - m) * scale_log2);
            sf.m[0][r] = m;
            sf.l[0][r] = sf.l[0][r] * f0[r] + x[(KWG_N - 2 + r) * 128] * f1[r];
        }
#pragma unroll
        for (int d = 0; d < HEAD_D / 8; ++d)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[0][d][e] = acc[0][d][e] * f0[e >> 1] + x[(d * 4 + e) * 128] * f1[e >> 1];
    }
}
#endif

extern "C" __global__ void DECODE_CLUSTER __launch_bounds__(THREADS, MINB) decode_split(DECODE_SPLIT_PARAMS) {
    extern __shared__ __align__(1024) unsigned char smem[];
    const DecodeBlock blk = decode_block(Qg, Kg, Vg, lists, lens, list_of, H, H_kv, Tq, Tk, per_split, one_len,
                                             list_count);
    ab_pdl_trigger();  // a merge launched as a programmatic dependent (PDL=1) may be placed now; it waits
    const int b = blk.b, kvh = blk.kvh, rows = blk.rows, Tb = blk.Tb, count = blk.count;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane >> 2, t4 = lane & 3;
    const TcSmem sm = tc_smem(smem);
    const u16* q = blk.q;
    const TcGlobal gm = {q, blk.k, blk.v, nullptr, nullptr, nullptr, nullptr, nullptr};
    const AB_PATTERN_T pat{AB_PATTERN_ARGS};

    TcLoad ld;
    ld.init(sm, gm, decode_work(blk));
    tc_load_tile<TcMma::Layout, BM, 1>(sm.q, q, 0, rows);  // Q's rows past the group's zero-filled
    tc_commit();
    TcTileList list;
    const DecodeEntries ents = decode_entries(tent, head);
    list.init_range(ents, blk.first, count);
    ld.first_tiles(list);
    typename TcMma::Ops op;
    TcMma::init(op, sm, warp, lane);

    TcAcc acc;
    tc_zero(acc);
    TcSoftmax sf;
    sf.init();
    const int slice = warp / 4 % KWG;  // the warpgroup's BN keys of each stage (KWG 2)
    const int ra = (KWG > 1 ? warp % 4 : warp) * RW + g, rb = ra + 8;  // the thread's two rows
    const int pos_a = decode_pos(ra, rows, Tb, Tq), pos_b = decode_pos(rb, rows, Tb, Tq);

    DecodeWalk::run(acc, sf, op, list, ents, count, sm, gm, Tb, pat, slice, pos_a, pos_b, t4, scale_log2);
#if KWG > 1
    decode_kwg_merge(acc, sf, smem, slice, scale_log2);
#endif

    // this split's rows: O normalised by the split's own row sums, and the log-sum-exp (base 2); the
    // output itself when the pair has one split
    const bool alone = decode_alone();
#if CLUSTER > 1
    // the cluster's merge: the rows in shared memory (Q's tile and the stages are free once every warp is
    // past its last tile), [BM][HEAD_D] then the log-sum-exps [BM]
    static_assert(!MERGE_LAST, "CLUSTER > 1 merges in the cluster, MERGE_LAST in the last split");
    static_assert(BM * HEAD_D * 4 + BM * 4 <= (BM + 2 * STAGES * BN) * HEAD_D * 2,
                  "the rows fit Q's tile and the stages");
    __syncthreads();
    float* o = reinterpret_cast<float*>(smem);
    float* l = o + BM * HEAD_D;
#else
    float* o = decode_part_rows(Op, blk, H_kv);
    float* l = decode_part_lse(Lp, blk, H_kv);
#endif
    u16* og = decode_out_slab(Og, blk, H, Tq);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = r ? rb : ra;
        const float x = tc_quad_sum(sf.l[0][r]);
        const float inv = x > 0.f ? tc_rcp(x) : 0.f;
        if (row < rows && slice == 0) {
#pragma unroll
            for (int d = 0; d < HEAD_D / 8; ++d) {
                const float y0 = acc[0][d][2 * r] * inv, y1 = acc[0][d][2 * r + 1] * inv;
                if (alone)
                    *reinterpret_cast<u32*>(og + (size_t)row * HEAD_D + d * 8 + 2 * t4) = tc_pack(y0, y1);
                else
                    *reinterpret_cast<float2*>(o + (size_t)row * HEAD_D + d * 8 + 2 * t4) = make_float2(y0, y1);
            }
            if (t4 == 0 && !alone) l[row] = x > 0.f ? sf.m[0][r] * scale_log2 + __log2f(x) : AB_NEG_INF;
        }
    }
#if CLUSTER > 1
    decode_cluster_merge(o, l, rows, og);
#endif
    if (alone || !MERGE_LAST) return;
    // the last split of (b, kvh) to finish merges the group's rows
    __shared__ int is_last;
    __threadfence();
    __syncthreads();
    int* ticket = tickets + (size_t)b * H_kv + kvh;
    if (threadIdx.x == 0) is_last = atomicAdd(ticket, 1) == (int)gridDim.x - 1;
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    const int splits = gridDim.x;
    const size_t base = ((size_t)b * H_kv + kvh) * splits;
    // a row's splits' largest log-sum-exp and the sum of their weights, in split order as decode_merge
    // sums them, so that both merges give the same bits
    __shared__ float row_mx[BM], row_den[BM];
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
        float mx = AB_NEG_INF, den = 0.f;
        for (int sp = 0; sp < splits; ++sp) mx = fmaxf(mx, __ldcg(Lp + (base + sp) * BM + r));
        if (mx != AB_NEG_INF)
            for (int sp = 0; sp < splits; ++sp) {
                const float lse = __ldcg(Lp + (base + sp) * BM + r);
                if (lse != AB_NEG_INF) den += tc_exp2(lse - mx);
            }
        row_mx[r] = mx;
        row_den[r] = den;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < rows * HEAD_D; e += blockDim.x) {
        const int r = e / HEAD_D, d = e % HEAD_D;
        const float mx = row_mx[r], den = row_den[r];
        float num = 0.f;
        if (mx != AB_NEG_INF) {
#pragma unroll 4
            for (int sp = 0; sp < splits; ++sp) {
                const float lse = __ldcg(Lp + (base + sp) * BM + r);
                if (lse != AB_NEG_INF) num += tc_exp2(lse - mx) * __ldcg(Op + ((base + sp) * BM + r) * HEAD_D + d);
            }
        }
        og[e] = decode_to_u16(den > 0.f ? num / den : 0.f);
    }
    if (threadIdx.x == 0) *ticket = 0;  // for the next launch
}
