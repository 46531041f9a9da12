// Decoding attention for bfloat16 / float16 (float32 accumulation): Tq queries at the end of each
// sequence's key/value cache, grouped-query heads, ragged batches, any pattern; split-KV.
//
// A block takes one (sequence b, key/value head) and one stretch (split) of the key tiles that
// sequence's queries may read (its list: the tiles some of the Tq positions Tk_b - Tq .. Tk_b - 1
// allow, flagged full or partial for all of them). Its query rows are every query head of the
// group that reads this key/value head, times the Tq positions: rows (h - h0) * Tq + t, which in
// q [B, H, Tq, D] are one contiguous slab, so each K/V byte is read once per split for the whole
// group. Rows past the group's (at most BM) are padding, never stored. The block runs fast_tc's
// parts (kernels/tc/): products on mma.sync (TcMmaSync), K/V tiles by cp.async (TcLoadAsync),
// partial tiles masked with the pattern predicate at each row's own position (tc_mask_rows), the
// online softmax (TcSoftmax). Each split stores its rows' output normalised by its own row sums, in
// float32, with the rows' log-sum-exp (base 2); decode_merge then weighs the splits of every row
// in a second launch, a block per output row (the default). With MERGE_LAST the last split of each
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

static_assert(!WG && !TMA && STRIDE == 1 && MT == 1 && QREG == 1, "decode: mma.sync, cp.async, one m16 tile per warp");

typedef TcMmaSync TcMma;
typedef TcLoadAsync<TcMma> TcLoad;

__device__ __forceinline__ u16 decode_to_u16(float y) { return (u16)(tc_pack(y, 0.f) & 0xffffu); }

extern "C" __global__ void __launch_bounds__(THREADS, MINB)
decode_split(const u16* __restrict__ Qg, const u16* __restrict__ Kg, const u16* __restrict__ Vg,
             float* __restrict__ Op, float* __restrict__ Lp, const int2* __restrict__ lists,
             const int* __restrict__ tent, const int* __restrict__ lens, const int* __restrict__ list_of,
             int H, int H_kv, int Tq, int Tk, int per_split, float scale_log2, const int* __restrict__ table,
             u16* __restrict__ Og, int* __restrict__ tickets) {
    extern __shared__ __align__(1024) unsigned char smem[];
    const int split = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
    const int group = H / H_kv, rows = group * Tq;
    const int Tb = lens[b];  // this sequence's keys
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane >> 2, t4 = lane & 3;
    const TcSmem sm = tc_smem(smem);
    const u16* q = Qg + ((size_t)b * H + (size_t)kvh * group) * Tq * HEAD_D;
    const size_t kv = ((size_t)b * H_kv + kvh) * (size_t)Tk * HEAD_D;
    const TcGlobal gm = {q, Kg + kv, Vg + kv, nullptr, nullptr, nullptr, nullptr, nullptr};
    const AB_PATTERN_T pat{AB_PATTERN_ARGS};

    // this split's stretch of the sequence's list
    const int2 head = lists[list_of[b]];  // (first entry, count)
    const int first = split * per_split;
    const int count = max(0, min(per_split, head.y - first));

    TcWork w;
    w.qt = 0;
    w.bh = 0;
    w.T = Tb;  // K and V rows >= Tb are zero-filled (and masked: the tile holding Tb is partial)
    w.base = 0;
    w.kv_base = 0;  // (the loads read gm's pointers, set above)
    TcLoad ld;
    ld.init(sm, gm, w);
    tc_load_tile<TcMma::Layout, BM>(sm.q, q, 0, rows);  // Q's rows past the group's zero-filled
    tc_commit();
    TcTileList list;
    list.init_range(tent, head.x + first, count);
    ld.first_tiles(list);
    typename TcMma::Ops op;
    TcMma::init(op, sm, warp, lane);

    TcAcc acc;
    tc_zero(acc);
    TcSoftmax sf;
    sf.init();
    // the positions of the thread's two rows (padding rows: the last position, never stored)
    const int ra = warp * RW + g, rb = ra + 8;
    const int pos_a = ra < rows ? Tb - Tq + ra % Tq : Tb - 1;
    const int pos_b = rb < rows ? Tb - Tq + rb % Tq : Tb - 1;

    int st = 0, st_fill = STAGES - 1;
    for (int it = 0; it < count; ++it) {
        const int nx = it + STAGES - 1;
        int ent_nx;
        const int ent = list.next(tent, it, ent_nx);
        TcLoad::refill(sm, gm, Tb, ld.bar, st, st_fill, 0, ent_nx, nx, count);
        st_fill = st_fill == STAGES - 1 ? 0 : st_fill + 1;
        const int kt = tc_entry_tile(ent), sc = st;
        st = st == STAGES - 1 ? 0 : st + 1;

        TcS s;
        TcRows rs;
        TcMma::qk(s, op, sc);
        bool idle = false;
        if (ent & 1) idle = tc_mask_idle(tc_mask_rows(s[0], pat, pos_a, pos_b, kt * BN, Tb, t4));
        if (idle)
            TcSoftmax::zero(s, rs);
        else
            sf.probs(s, rs, acc, scale_log2, 1, it);
        sf.add(rs);
        TcMma::pv(acc, s, op, sc, idle);
    }
    TcLoad::drain();

    // this split's rows: O normalised by the split's own row sums, and the log-sum-exp (base 2)
    float* o = Op + ((((size_t)b * H_kv + kvh) * gridDim.x + split) * BM) * HEAD_D;
    float* l = Lp + (((size_t)b * H_kv + kvh) * gridDim.x + split) * BM;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = r ? rb : ra;
        float x = sf.l[0][r];
        x += __shfl_xor_sync(0xffffffffu, x, 1);
        x += __shfl_xor_sync(0xffffffffu, x, 2);
        const float inv = x > 0.f ? tc_rcp(x) : 0.f;
        if (row < rows) {
#pragma unroll
            for (int d = 0; d < HEAD_D / 8; ++d) {
                float2 v2 = make_float2(acc[0][d][2 * r] * inv, acc[0][d][2 * r + 1] * inv);
                *reinterpret_cast<float2*>(o + (size_t)row * HEAD_D + d * 8 + 2 * t4) = v2;
            }
            if (t4 == 0) l[row] = x > 0.f ? sf.m[0][r] * scale_log2 + __log2f(x) : AB_NEG_INF;
        }
    }
    if (!MERGE_LAST) return;
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
    // a warp per row: its splits' largest log-sum-exp and 1 / the sum of the weights
    __shared__ float row_mx[BM], row_inv[BM];
    for (int r = warp; r < rows; r += NWARPS) {
        float mx = AB_NEG_INF;
        for (int sp = lane; sp < splits; sp += 32) mx = fmaxf(mx, __ldcg(Lp + (base + sp) * BM + r));
        for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        float den = 0.f;
        if (mx != AB_NEG_INF)
            for (int sp = lane; sp < splits; sp += 32) {
                const float lse = __ldcg(Lp + (base + sp) * BM + r);
                if (lse != AB_NEG_INF) den += tc_exp2(lse - mx);
            }
        for (int o = 16; o; o >>= 1) den += __shfl_xor_sync(0xffffffffu, den, o);
        if (lane == 0) {
            row_mx[r] = mx;
            row_inv[r] = den > 0.f ? 1.f / den : 0.f;
        }
    }
    __syncthreads();
    u16* og = Og + ((size_t)b * H + (size_t)kvh * group) * Tq * HEAD_D;  // rows (h - h0) * Tq + t
    for (int e = threadIdx.x; e < rows * HEAD_D; e += blockDim.x) {
        const int r = e / HEAD_D, d = e % HEAD_D;
        const float mx = row_mx[r];
        float num = 0.f;
        if (mx != AB_NEG_INF) {
#pragma unroll 4
            for (int sp = 0; sp < splits; ++sp) {
                const float lse = __ldcg(Lp + (base + sp) * BM + r);
                if (lse != AB_NEG_INF) num += tc_exp2(lse - mx) * __ldcg(Op + ((base + sp) * BM + r) * HEAD_D + d);
            }
        }
        og[e] = decode_to_u16(num * row_inv[r]);
    }
    if (threadIdx.x == 0) *ticket = 0;  // for the next launch
}

// One output row (b, h, t) from the splits of its (b, key/value head), in a launch of its own
// (MERGE_LAST 0, the default).
extern "C" __global__ void __launch_bounds__(HEAD_D)
decode_merge(const float* __restrict__ Op, const float* __restrict__ Lp, u16* __restrict__ Og, int H, int H_kv,
             int Tq, int splits) {
    const int row = blockIdx.x;  // (b * H + h) * Tq + t
    const int t = row % Tq, h = (row / Tq) % H, b = row / (Tq * H);
    const int group = H / H_kv, kvh = h / group, r = (h - kvh * group) * Tq + t;
    const size_t base = ((size_t)b * H_kv + kvh) * splits;
    float mx = AB_NEG_INF;
    for (int s = 0; s < splits; ++s) mx = fmaxf(mx, Lp[(base + s) * BM + r]);
    float num = 0.f, den = 0.f;
    if (mx != AB_NEG_INF) {
        for (int s = 0; s < splits; ++s) {
            const float lse = Lp[(base + s) * BM + r];
            if (lse == AB_NEG_INF) continue;
            const float wgt = tc_exp2(lse - mx);
            num += wgt * Op[((base + s) * BM + r) * HEAD_D + threadIdx.x];
            den += wgt;
        }
    }
    Og[(size_t)row * HEAD_D + threadIdx.x] = decode_to_u16(den > 0.f ? num / den : 0.f);
}
