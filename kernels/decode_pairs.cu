// Decoding attention when the (sequence, key/value head) pairs are many and each holds few query rows
// (H / H_kv x Tq <= 16) and a short list: a warp per pair, no splits.
//
// kernels/decode.cu and kernels/decode_keys.cu give a pair a block of NWARPS warps. Where the pairs
// alone outnumber one wave of those blocks (B=64 against 8 key/value heads: 512 blocks for 132 SMs
// holding two each), the blocks run in two waves, and each block's life is mostly latency: its list of a
// few tiles, its first loads, its output. Here each warp of a block takes a pair of its own: key/value
// head blockIdx.x * NWARPS + warp of sequence blockIdx.z (warps past H_kv idle), its 16 rows (one m16
// tile, Q read once), its own STAGES stages of BN-key K and V tiles in shared memory, filled by the
// warp's lanes alone with cp.async and synchronised by __syncwarp, and the pair's whole list. It runs
// the same parts as decode.cu (kernels/tc/): products on mma.sync (TcMmaSync), partial tiles masked at
// each row's own position (decode_tile), the online softmax, and stores the output itself (a single
// split: no partials, no merge launch). NWARPS pairs a block, so B * H_kv pairs take B * H_kv / NWARPS
// blocks.
//
// Shared memory: NWARPS x (16 + 2 x STAGES x BN) x HEAD_D x 2 bytes (208 KiB at 4 warps, 3 stages of
// 32 keys, D=128), so the host takes this kernel only for the short lists' tiles.
// Grid: (ceil(H_kv / NWARPS), 1, B); block: THREADS.
#include "tc/config.cuh"
#include "tc/common.cuh"
#include "tc/scheduler.cuh"
#include "tc/mask.cuh"
#include "tc/softmax.cuh"
#include "tc/mainloop_sync.cuh"
#define DEC_ROWS RW  // one m16 tile of rows
#include "tc/decode_common.cuh"

static_assert(!WG && !TMA && MT == 1 && QREG == 1, "decode_pairs: mma.sync, cp.async, one m16 tile per warp");
static_assert(CLUSTER == 1, "decode_pairs: a pair is one warp's, never split");

#define PAIR_BYTES ((RW + 2 * STAGES * BN) * HEAD_D * 2)  // a warp's Q tile, then its K stages, then its V stages

typedef TcMmaSync TcMma;

// rows [row0, row0 + ROWS) of a [T][HEAD_D] matrix whose rows lie RS rows of HEAD_D apart into a swizzled
// tile (TcRowLayout), by the warp's lanes alone: lane copies chunk lane % CH of rows lane / CH + i * RSTEP
// (rows >= T zero-filled, and with ENTRY_SPAN the rows below lo and the last tail: a list entry's span)
template <int ROWS, int RS, int EVF = 0>
__device__ __forceinline__ void decode_warp_load(u32 dst, const u16* __restrict__ src, int row0, int T, int lane,
                                                 int lo = 0, int tail = 0) {
    constexpr int RSTEP = 32 / CH;
    static_assert(32 % CH == 0 && ROWS % RSTEP == 0, "a tile's chunks must divide evenly among a warp's lanes");
    const int r0 = lane / CH, c = lane % CH;
    const unsigned long long policy = EVF ? tc_evict_first_policy() : 0ull;  // EVF: K and V under KV_EVICT's policy
    // (ENTRY_SPAN: rows [lo, min(ROWS - tail, T - row0)) of the tile, one unsigned compare a row)
    const unsigned span = (unsigned)max(0, min(ROWS - tail, T - row0) - lo);
#pragma unroll
    for (int i = 0; i < ROWS / RSTEP; ++i) {
        const int r = r0 + i * RSTEP;
        const bool ok = ENTRY_SPAN ? (unsigned)(r - lo) < span : row0 + r < T;
        tc_cp_async16_kv<EVF>(dst + TcRowLayout::swz<ROWS>(r, c),
                              ok ? src + (size_t)(row0 + r) * (RS * HEAD_D) + c * 8 : src, ok ? 16 : 0, policy);
    }
}

// list entry ent's key tile of the pair's K and V (its span's rows) into stage st
__device__ __forceinline__ void decode_warp_tile(const TcSmem& sm, const DecodeBlock& blk, int ent, int st, int lane) {
    const int kt = tc_entry_tile(ent), lo = tc_entry_lo(ent), tail = tc_entry_tail(ent);
    decode_warp_load<BN, STRIDE, KV_EVICT>(sm.k + st * TILE_BYTES, blk.k, kt * BN, blk.Tb, lane, lo, tail);
    decode_warp_load<BN, STRIDE, KV_EVICT>(sm.v + st * TILE_BYTES, blk.v, kt * BN, blk.Tb, lane, lo, tail);
}

extern "C" __global__ void __launch_bounds__(THREADS, MINB) decode_pairs(DECODE_SPLIT_PARAMS) {
    extern __shared__ __align__(1024) unsigned char smem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int kvh = blockIdx.x * NWARPS + warp;
    if (kvh >= H_kv) return;  // no block-wide barrier follows: a warp waits on its own lanes only
    const DecodeBlock blk = decode_block_at(0, kvh, blockIdx.z, Qg, Kg, Vg, lists, lens, list_of, H, H_kv, Tq, Tk,
                                            per_split, one_len, list_count);
    const int rows = blk.rows, Tb = blk.Tb, count = blk.count;  // rows <= RW (the host refuses more)
    const int g = lane >> 2, t4 = lane & 3;
    TcSmem sm;
    sm.q = tc_smem_addr(smem) + warp * PAIR_BYTES;
    sm.k = sm.q + RW * HEAD_D * 2;
    sm.v = sm.k + STAGES * TILE_BYTES;
    const AB_PATTERN_T pat{AB_PATTERN_ARGS};

    decode_warp_load<RW, 1>(sm.q, blk.q, 0, rows, lane);  // rows past the group's zero-filled
    tc_commit();
    TcTileList list;
    const DecodeEntries ents = decode_entries(tent, head);
    list.init_range(ents, blk.first, count);
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < count) decode_warp_tile(sm, blk, list.ring[s], s, lane);
        tc_commit();
    }
    tc_wait<STAGES - 1>();  // the Q group is the oldest
    __syncwarp();
    TcMma::Ops op;
    TcMma::init(op, sm, 0, lane);  // the warp's own tile: rows 0..15

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
        tc_wait<STAGES - 2>();
        __syncwarp();  // tile `it` is visible to every lane; the stage refilled below was read last tile
        if (nx < count) decode_warp_tile(sm, blk, ent_nx, st_fill, lane);
        tc_commit();
        st_fill = st_fill == STAGES - 1 ? 0 : st_fill + 1;
        const int sc = st;
        st = st == STAGES - 1 ? 0 : st + 1;
        decode_tile<TcMma>(acc, sf, op, pat, ent, sc, tc_entry_tile(ent) * BN, pos_a, pos_b, Tb, t4, scale_log2, it);
    }
    tc_wait<0>();

    // the pair's rows, normalised by their sums: the output itself
    u16* og = decode_out_slab(Og, blk, H, Tq);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = r ? rb : ra;
        const float x = tc_quad_sum(sf.l[0][r]);
        const float inv = x > 0.f ? tc_rcp(x) : 0.f;
        if (row < rows) {
#pragma unroll
            for (int d = 0; d < HEAD_D / 8; ++d)
                *reinterpret_cast<u32*>(og + (size_t)row * HEAD_D + d * 8 + 2 * t4) =
                    tc_pack(acc[0][d][2 * r] * inv, acc[0][d][2 * r + 1] * inv);
        }
    }
}
