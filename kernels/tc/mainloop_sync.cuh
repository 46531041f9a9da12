// The mma.sync main loop's parts: the products on mma.sync m16n8k16 with operands through ldmatrix
// (TcMmaSync), and the loads by cp.async (tc_load_tile, TcLoadAsync), which the wgmma builds of
// strided patterns use too (a residue class is no box of the bulk copies' view).
//
// Products (rows of CH 16-byte chunks, TcRowLayout; warp w owns rows w * RW .. w * RW + RW - 1 of
// the query tile, MT m16 tiles, every K/V fragment read from shared memory feeding MT mma). The
// interface every main loop's products share (TcMmaWgmma too):
//   Layout: the tiles' shared-memory layout; Ops: the lane's operand state, init(op, sm, warp,
//     lane) once Q has landed;
//   qk(s, op, st): S = Q K^T with K from stage st (s overwritten); here Q is held in registers
//     (QREG 1) or read from the resident Q tile (QREG 0), K through ldmatrix;
//   pv(acc, s, op, st, idle): O += P V with V from stage st, P re-packed from the S accumulators
//     (tc_p_frag); here V through ldmatrix.trans, and nothing when the warp is idle;
//   vote(x): x on any thread that issues the products together (here the warp);
//   fence_loads(): completed cp.async writes made visible to the products (nothing here).
// Loads (the K/V tiles stream through STAGES shared-memory buffers, one cp.async commit group per
// tile, rows >= T zero-filled). The interface every loader shares (TcLoadTma too):
//   init(sm, gm, w); begin(): Q's copy, issued before the list's head is read;
//   first_tiles(list): the list's first STAGES - 1 tiles, then waits for Q (TcLoadAsync: in two halves,
//     issue_first(list) and wait_first());
//   refill(sm, gm, T, bar, st, st_fill, phase, ent_nx, nx, n) (static): waits for tile `it`
//     (stage st), loads tile nx (entry ent_nx) into stage st_fill when nx < n;
//   release(bar, st) (static): a warp done with stage st (nothing here; TcLoadTmaReleased's arrival, REL 1).
//   (TcLoadAsync: refill's halves too, wait_tile<PENDING>() and load_next(...), for tc/decode_overlap.cuh.)
//   drain(): waits for what is left.
//   tc_load_tile<Layout, ROWS[, RS]>(dst, src, row0, T[, lo, tail]): rows [row0, row0 + ROWS) of a [T][HEAD_D]
//     matrix whose rows lie RS (default STRIDE) rows apart into a swizzled tile (any rows: Q, K or V); with
//     LAYOUT_R > 1 each layout row where it lies in the arrays (tc/rows.cuh: the tile's rows LAYOUT_R apart);
//     with ENTRY_SPAN the tile's rows below lo and its last tail rows zero-filled too, never read (a decode
//     list entry's span: tc/scheduler.cuh).
#pragma once
#include "tc/scheduler.cuh"

struct TcMmaSync {
    typedef TcRowLayout Layout;

    // the lane's operand addresses, set once Q has landed: the K and V stages' ldmatrix bases
    // (stage st at + st * TILE_BYTES), Q's (QREG 0) or Q's fragments themselves (QREG 1)
    struct Ops {
        u32 k, v, q;
#if QREG
        u32 qf[MT][HEAD_D / 16][4];
#endif
    };

    static __device__ __forceinline__ void init(Ops& op, const TcSmem& sm, int warp, int lane) {
        // a lane's row within a 16-row step has row & 7 == lane & 7, so the swizzled chunk
        // (c ^ (lane & 7)) of k-step ks is (base ^ (ks << 5)) with base holding the lane's own bits;
        // the 16-row steps are constant offsets
        const int l7 = lane & 7;
        op.q = sm.q + (u32)((warp * RW + (lane & 15)) * CH * 16 + (((lane >> 4) ^ l7) << 4));
        op.k = sm.k + (u32)((((lane >> 4) << 3) + l7) * CH * 16 + ((((lane >> 3) & 1) ^ l7) << 4));
        op.v = sm.v + (u32)(((((lane >> 3) & 1) << 3) + l7) * CH * 16 + (((lane >> 4) ^ l7) << 4));
#if QREG
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int ks = 0; ks < HEAD_D / 16; ++ks) tc_ldsm_x4(op.qf[m][ks], (op.q ^ (u32)(ks << 5)) + m * 16 * CH * 16);
#endif
    }

    // k-step ks's Q fragment of m16 tile m: a copy of the registers (QREG 1, folded away by the
    // compiler) or read from the resident Q tile
    static __device__ __forceinline__ void q_frag(u32 (&a)[4], const Ops& op, int m, int ks) {
#if QREG
#pragma unroll
        for (int x = 0; x < 4; ++x) a[x] = op.qf[m][ks][x];
#else
        tc_ldsm_x4(a, (op.q ^ (u32)(ks << 5)) + m * 16 * CH * 16);
#endif
    }

    // S = Q K^T for the warp's rows (s overwritten), K from stage st
    static __device__ __forceinline__ void qk(TcS& s, const Ops& op, int st) {
        const u32 cK = op.k + st * TILE_BYTES;
        tc_zero(s);
#pragma unroll
        for (int ks = 0; ks < HEAD_D / 16; ++ks) {
            u32 qk[MT][4];  // this k-step's Q fragments
#pragma unroll
            for (int m = 0; m < MT; ++m) q_frag(qk[m], op, m, ks);
#pragma unroll
            for (int np = 0; np < BN / 16; ++np) {
                u32 b[4];
                tc_ldsm_x4(b, (cK ^ (u32)(ks << 5)) + np * 16 * CH * 16);
#pragma unroll
                for (int m = 0; m < MT; ++m) {
                    tc_mma(s[m][2 * np], qk[m], b[0], b[1]);
                    tc_mma(s[m][2 * np + 1], qk[m], b[2], b[3]);
                }
            }
        }
    }

    // O += P V (P re-packed from the S accumulators, V of stage st through ldmatrix.trans), nothing
    // when the warp is idle
    static __device__ __forceinline__ void pv(TcAcc& acc, const TcS& s, const Ops& op, int st, bool idle) {
        const u32 cV = op.v + st * TILE_BYTES;
#pragma unroll
        for (int kk = 0; kk < BN / 16 && !idle; ++kk) {
            u32 a[MT][4];
#pragma unroll
            for (int m = 0; m < MT; ++m) tc_p_frag(a[m], s[m], kk);
#pragma unroll
            for (int dp = 0; dp < HEAD_D / 16; ++dp) {
                u32 b[4];
                tc_ldsm_x4_t(b, (cV ^ (u32)(dp << 5)) + kk * 16 * CH * 16);
#pragma unroll
                for (int m = 0; m < MT; ++m) {
                    tc_mma(acc[m][2 * dp], a[m], b[0], b[1]);
                    tc_mma(acc[m][2 * dp + 1], a[m], b[2], b[3]);
                }
            }
        }
    }

    // whether x holds on any thread that issues the products together (the warp)
    static __device__ __forceinline__ bool vote(bool x) { return __any_sync(0xffffffffu, x); }
    // completed cp.async writes made visible to the products' reads (nothing for ldmatrix)
    static __device__ __forceinline__ void fence_loads() {}
};

// A thread copies chunk c = tid % CH of rows r0 + i * RSTEP (RSTEP = THREADS / CH, a multiple of 8,
// so every one of its rows has the same swizzle and the addresses differ by constants). RS: the
// matrix's rows lie RS rows of HEAD_D apart (STRIDE: a residue class's; 1: rows that are not).
// NT, PROWS, tid, part0: NT threads (tid the thread's index among them) copy rows [part0, part0 + PROWS) of the
// ROWS-row tile (part0 a multiple of 8), the rest left to others (tc/decode_halves.cuh: a warpgroup's half);
// by default the block copies the whole tile.
template <class Layout, int ROWS, int RS = STRIDE, int EVF = 0, int NT = THREADS, int PROWS = ROWS>
__device__ __forceinline__ void tc_load_tile(u32 dst, const u16* __restrict__ src, int row0, int T, int lo = 0,
                                             int tail = 0, unsigned tid = threadIdx.x, int part0 = 0) {
    constexpr int RSTEP = NT / CH;
    static_assert(NT % CH == 0 && RSTEP % 8 == 0 && PROWS % RSTEP == 0 && PROWS <= ROWS,
                  "a tile's chunks must divide evenly among the threads, 8 rows apart");
    const int r0 = part0 + (int)(tid / CH), c = tid % CH;
    u32 d0 = dst + Layout::template swz<ROWS>(r0, c);
    if (EVF && WG)  // ptxas would otherwise share a uniform register between d0's uniform part and the policy,
        d0 = __shfl_sync(0xffffffffu, d0, threadIdx.x & 31);  // naming it desc[UR5]: an illegal instruction
    const u16* g0 = src + (size_t)tc_seq_row(row0 + r0) * (RS * HEAD_D) + c * 8;  // (tc/rows.cuh)
    // (ENTRY_SPAN: rows [lo, min(ROWS - tail, T - row0)) of the tile, one unsigned compare a row)
    const unsigned span = (unsigned)max(0, min(ROWS - tail, T - row0) - lo);
    const unsigned long long policy = EVF ? tc_evict_first_policy() : 0ull;  // EVF: K and V under KV_EVICT's policy
#pragma unroll
    for (int i = 0; i < PROWS / RSTEP; ++i) {
        const int r = r0 + i * RSTEP;
        const bool ok = ENTRY_SPAN ? (unsigned)(r - lo) < span : row0 + r < T;
        tc_cp_async16_kv<EVF>(d0 + i * RSTEP * Layout::ROWB,
                              ok ? g0 + (size_t)i * RSTEP * RS * TC_ROW_STEP * HEAD_D : src, ok ? 16 : 0, policy);
    }
}

// TROWS: the keys of a stage's K (and V) tile, BN unless a kernel's warps share a stage by key slices
// (kernels/decode_keys.cu); its stages then lie TROWS * HEAD_D * 2 bytes apart.
template <class Mma, int TROWS = BN>
struct TcLoadAsync {
    typedef typename Mma::Layout Layout;
    enum { STAGE_BYTES = TROWS * HEAD_D * 2 };

    TcSmem sm;
    TcGlobal gm;
    int qt, T;
    u32 bar;  // (TcLoadTma's barriers; none here)

    __device__ __forceinline__ void init(const TcSmem& sm_, const TcGlobal& gm_, const TcWork& w) {
        sm = sm_;
        gm = gm_;
        qt = w.qt;
        T = w.T;
        bar = 0;
    }

    __device__ __forceinline__ void begin() {
        tc_load_tile<Layout, BM>(sm.q, gm.q, qt * BM, T);
        tc_commit();
    }

    __device__ __forceinline__ void first_tiles(const TcTileList& list) {
        issue_first(list);
        wait_first();
    }

    // K and V of tile entry ent into stage s: rows [part0, part0 + PROWS) of the stage by NT threads (tid the
    // thread's index among them); by default the whole stage by the block
    template <int NT = THREADS, int PROWS = TROWS>
    static __device__ __forceinline__ void load_stage(const TcSmem& sm, const TcGlobal& gm, int T, int s, int ent,
                                                      unsigned tid = threadIdx.x, int part0 = 0) {
        const int kt = tc_entry_tile(ent), lo = tc_entry_lo(ent), tail = tc_entry_tail(ent);
        tc_load_tile<Layout, TROWS, STRIDE, KV_EVICT, NT, PROWS>(sm.k + s * STAGE_BYTES, gm.k, kt * TROWS, T, lo,
                                                                  tail, tid, part0);
        tc_load_tile<Layout, TROWS, STRIDE, KV_EVICT, NT, PROWS>(sm.v + s * STAGE_BYTES, gm.v, kt * TROWS, T, lo,
                                                                  tail, tid, part0);
    }

    // first_tiles in two halves (a persistent block issues the next work's loads before it stores this
    // one's output): the list's first STAGES - 1 tiles, a commit group each ...
    __device__ __forceinline__ void issue_first(const TcTileList& list) {
#pragma unroll
        for (int s = 0; s < STAGES - 1; ++s) {
            if (s < list.n) load_stage(sm, gm, T, s, list.ring[s]);
            tc_commit();
        }
    }

    // ... and the wait for the group before them (Q's)
    static __device__ __forceinline__ void wait_first() {
        tc_wait<STAGES - 1>();  // the Q group is the oldest
        Mma::fence_loads();
        __syncthreads();
    }

    // waits for the oldest tile (stage st, the one the loop is on), then loads tile nx (entry
    // ent_nx) into stage st_fill when nx < n (bar and phase: TcLoadTma's, unused here)
    static __device__ __forceinline__ void refill(const TcSmem& sm, const TcGlobal& gm, int T, u32 bar, int st,
                                                  int st_fill, u32 phase, int ent_nx, int nx, int n) {
        wait_tile<STAGES - 2>();  // tile `it` is visible to all; the stage refilled below is free
        load_next(sm, gm, T, st_fill, ent_nx, nx, n);
    }

    // refill's halves, for a walk whose loads run another distance ahead (tc/decode_overlap.cuh): the wait until
    // at most PENDING commit groups are in flight, the tiles landed made visible to the products, and a block
    // barrier (every warp past what it did before: the stage refilled next is free) ...
    template <int PENDING>
    static __device__ __forceinline__ void wait_tile() {
        tc_wait<PENDING>();
        Mma::fence_loads();
        __syncthreads();
    }
    // ... then tile nx (entry ent_nx) into stage st_fill when nx < n, a commit group either way
    static __device__ __forceinline__ void load_next(const TcSmem& sm, const TcGlobal& gm, int T, int st_fill,
                                                     int ent_nx, int nx, int n) {
        if (nx < n) load_stage(sm, gm, T, st_fill, ent_nx);
        tc_commit();
    }

    // a warp done with stage st: nothing to say (the next refill's block barrier waits for every warp)
    static __device__ __forceinline__ void release(u32 bar, int st) {}

    static __device__ __forceinline__ void drain() { tc_wait<0>(); }
};
