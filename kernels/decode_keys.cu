// Decoding attention when a group's query rows fit one m16 tile (H / H_kv x Tq <= 16: one query per
// sequence, or a few with few heads a group): the warps take a key tile's keys instead of its rows.
//
// kernels/decode.cu gives each warp 16 of the block's rows. With the 4 rows of one query against
// a group of 4 heads, its first warp holds them all and every product of the other warps is
// padding: 16 times the tensor work the rows need. Here every warp holds the same 16 rows (Q read
// once) and its own slice of BN keys of each key tile of KT = NWARPS x BN keys: S = Q K_slice^T
// (16 x BN), the slice's own online softmax and O_w += P V_slice, so the block's tensor work is
// that of 16 rows, a quarter of decode.cu's with 4 warps, and a warp whose slice is masked out
// (BN <= 32: tc_mask_idle) skips its softmax and P V. The tiles stream through STAGES shared-memory
// stages by cp.async as in decode.cu (a stage holds KT keys; warp w's slice is rows w * BN of it, so
// the products' ldmatrix addresses are TcMmaSync's with the slice's stage index st * NWARPS + w).
// After the split's last tile the warps' rows are merged through shared memory by their
// log-sum-exps, and the split stores them as decode.cu's do (tc/decode_common.cuh: float32 partials
// and a merge launch, or the output itself when the pair has one split).
//
// The list's tiles are KT keys (attnbench.decode builds them at KT). -D BN is the slice (16 or 32).
// Grid: (splits, H_kv, B), or with FLAT the blocks of a flat walk, each taking stretches of several pairs' lists
// (tc/decode_common.cuh); block: THREADS. decode_merge grid: B * H * Tq; block: HEAD_D threads.
#include "tc/config.cuh"
#include "tc/common.cuh"
#include "tc/scheduler.cuh"
#include "tc/mask.cuh"
#include "tc/softmax.cuh"
#include "tc/mainloop_sync.cuh"
#define DEC_ROWS RW  // one m16 tile of rows
#include "tc/decode_common.cuh"

#define KT (NWARPS * BN)  // keys of a list's tile: a stage
static_assert(!WG && !TMA && MT == 1 && QREG == 1, "decode_keys: mma.sync, cp.async, one m16 tile");
static_assert(BN <= 32, "decode_keys: a warp's slice of 16 or 32 keys (idle slices skipped)");
static_assert(!FLAT || CLUSTER == 1, "FLAT: the stretches' partials merge in the merge launch");

typedef TcMmaSync TcMma;
typedef TcLoadAsync<TcMma, KT> TcLoad;  // a stage holds the warps' slices together

// One stretch of one pair's list (a split, or with FLAT a stretch of a flat walk): the block's rows against its
// tiles, merged across the warps and stored as the split's partial, as the output (the pair's only split), or
// (CLUSTER > 1) left in shared memory for the cluster's merge.
__device__ __forceinline__ void decode_keys_stretch(const DecodeBlock& blk, unsigned char* smem, const AB_PATTERN_T& pat,
                                                    const int* tent, const DecodeHead& head, float* Op, float* Lp,
                                                    u16* Og, int H, int H_kv, int Tq, float scale_log2) {
    const int rows = blk.rows, Tb = blk.Tb, count = blk.count;  // rows <= RW (the host refuses more)
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane >> 2, t4 = lane & 3;
    // shared memory: Q's 16 rows, then STAGES stages of K and of V (KT rows each)
    TcSmem sm;
    sm.q = tc_smem_addr(smem);
    sm.k = sm.q + RW * HEAD_D * 2;
    sm.v = sm.k + STAGES * TcLoad::STAGE_BYTES;
    const TcGlobal gm = {blk.q, blk.k, blk.v, nullptr, nullptr, nullptr, nullptr, nullptr};

    TcLoad ld;
    ld.init(sm, gm, decode_work(blk));
    tc_load_tile<TcRowLayout, RW, 1>(sm.q, blk.q, 0, rows);  // rows past the group's zero-filled
    tc_commit();
    TcTileList list;
    const DecodeEntries ents = decode_entries(tent, head);
    list.init_range(ents, blk.first, count);
    ld.first_tiles(list);
    TcMma::Ops op;
    TcMma::init(op, sm, 0, lane);  // every warp: rows 0..15

    TcAcc acc;
    tc_zero(acc);
    TcSoftmax sf;
    sf.init();
    const int ra = g, rb = g + 8;  // the thread's two rows
    const int pos_a = decode_pos(ra, rows, Tb, Tq), pos_b = decode_pos(rb, rows, Tb, Tq);

    int st = 0, st_fill = STAGES - 1;
    for (int it = 0; it < count; ++it) {
        const int nx = it + STAGES - 1;
        int ent_nx;
        const int ent = list.next(ents, it, ent_nx);
        TcLoad::refill(sm, gm, Tb, ld.bar, st, st_fill, 0, ent_nx, nx, count);
        st_fill = st_fill == STAGES - 1 ? 0 : st_fill + 1;
        const int slice = st * NWARPS + warp;  // this warp's BN keys of stage st
        st = st == STAGES - 1 ? 0 : st + 1;
        decode_tile<TcMma>(acc, sf, op, pat, ent, slice, tc_entry_tile(ent) * KT + warp * BN, pos_a, pos_b, Tb, t4, scale_log2, it);
    }
    TcLoad::drain();
    __syncthreads();  // every warp is done with the stages: they hold the warps' rows now

    // each warp's rows normalised by its own sums, with their log-sum-exp (base 2), into the stages
    float* red_o = reinterpret_cast<float*>(smem + RW * HEAD_D * 2);  // [NWARPS][RW][HEAD_D]
    __shared__ float red_l[NWARPS][RW];
    static_assert(NWARPS * RW * HEAD_D * 4 <= 2 * STAGES * KT * HEAD_D * 2, "the warps' rows fit the stages");
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = r ? rb : ra;
        const float x = tc_quad_sum(sf.l[0][r]);
        const float inv = x > 0.f ? tc_rcp(x) : 0.f;
        float* dst = red_o + ((size_t)warp * RW + row) * HEAD_D + 2 * t4;
#pragma unroll
        for (int d = 0; d < HEAD_D / 8; ++d)
            *reinterpret_cast<float2*>(dst + d * 8) = make_float2(acc[0][d][2 * r] * inv, acc[0][d][2 * r + 1] * inv);
        if (t4 == 0) red_l[warp][row] = x > 0.f ? sf.m[0][r] * scale_log2 + __log2f(x) : AB_NEG_INF;
    }
    __syncthreads();

    // the block's rows: the warps' weighed by their log-sum-exps; stored as the split's partial, or as
    // the output when the pair has one split, or (CLUSTER > 1) left in shared memory past the warps'
    // rows for the cluster's merge
    const bool alone = decode_alone();
    float* part_o = red_o + NWARPS * RW * HEAD_D;  // [RW][HEAD_D], then part_l [RW]
    float* part_l = part_o + RW * HEAD_D;
    static_assert(CLUSTER == 1 || (NWARPS + 1) * RW * HEAD_D * 4 + RW * 4 <= 2 * STAGES * KT * HEAD_D * 2,
                  "the cluster's partial fits the stages beside the warps' rows");
    float* o = decode_part_rows(Op, blk, H_kv);
    float* l = decode_part_lse(Lp, blk, H_kv);
    u16* og = decode_out_slab(Og, blk, H, Tq);
    for (int e = threadIdx.x; e < rows * HEAD_D; e += THREADS) {
        const int r = e / HEAD_D, d = e % HEAD_D;
        float mx = AB_NEG_INF;
#pragma unroll
        for (int w = 0; w < NWARPS; ++w) mx = fmaxf(mx, red_l[w][r]);
        float num = 0.f, den = 0.f;
        if (mx != AB_NEG_INF) {
#pragma unroll
            for (int w = 0; w < NWARPS; ++w) {
                const float lse = red_l[w][r];
                if (lse == AB_NEG_INF) continue;
                const float wgt = tc_exp2(lse - mx);
                num += wgt * red_o[((size_t)w * RW + r) * HEAD_D + d];
                den += wgt;
            }
        }
        const float y = den > 0.f ? num / den : 0.f;
        if (CLUSTER > 1) {
            part_o[e] = y;
            if (d == 0) part_l[r] = den > 0.f ? mx + __log2f(den) : AB_NEG_INF;
        } else if (alone) {
            og[e] = decode_to_u16(y);
        } else {
            o[e] = y;
            if (d == 0) l[r] = den > 0.f ? mx + __log2f(den) : AB_NEG_INF;
        }
    }
#if CLUSTER > 1
    decode_cluster_merge(part_o, part_l, rows, og);
#endif
}

extern "C" __global__ void DECODE_CLUSTER __launch_bounds__(THREADS, MINB) decode_keys_split(DECODE_SPLIT_PARAMS) {
    extern __shared__ __align__(1024) unsigned char smem[];
    const AB_PATTERN_T pat{AB_PATTERN_ARGS};
#if FLAT
    ab_pdl_trigger();  // a merge launched as a programmatic dependent (PDL=1) may be placed now; it waits
    for (int sg = seg_at[blockIdx.x]; sg < seg_at[blockIdx.x + 1]; ++sg) {  // the block's stretches in turn
        __syncthreads();  // the stretch before is done with shared memory
        decode_keys_stretch(decode_block_stretch(segs[sg], Qg, Kg, Vg, lists, lens, list_of, H, H_kv, Tq, Tk, one_len,
                                                 list_count),
                            smem, pat, tent, head, Op, Lp, Og, H, H_kv, Tq, scale_log2);
    }
#else
    const DecodeBlock blk = decode_block(Qg, Kg, Vg, lists, lens, list_of, H, H_kv, Tq, Tk, per_split, one_len,
                                         list_count);
    ab_pdl_trigger();  // a merge launched as a programmatic dependent (PDL=1) may be placed now; it waits
    decode_keys_stretch(blk, smem, pat, tent, head, Op, Lp, Og, H, H_kv, Tq, scale_log2);
#endif
}
