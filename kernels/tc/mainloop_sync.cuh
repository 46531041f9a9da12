// The mma.sync main loop's parts: the products on mma.sync m16n8k16 with operands through ldmatrix
// (TcMmaSync, TC_QK_SYNC, TC_PV_SYNC), and the loads by cp.async (tc_load_tile, TcLoadAsync),
// which the wgmma builds of strided patterns use too (a residue class is no box of the bulk
// copies' view).
//
// Products (rows of CH 16-byte chunks, TcRowLayout; warp w owns rows w * RW .. w * RW + RW - 1 of
// the query tile, MT m16 tiles, every K/V fragment read from shared memory feeding MT mma):
//   TcMmaSync::Layout; vote(x): x on any thread that issues the products together (the warp);
//   fence_loads(): completed cp.async writes made visible to the products (nothing here).
//   TC_QK_SYNC(s, tK, kthr, qf, qthr): S = Q K^T, Q held in registers (QREG 1: qf) or read from
//     the resident Q tile (QREG 0: qthr), K through ldmatrix from the stage's tile tK.
//   TC_PV_SYNC(acc, s, tV, vthr, idle): O += P V, P re-packed from the S accumulators
//     (tc_p_frag), V through ldmatrix.trans; nothing when the warp is idle.
// Loads (the K/V tiles stream through STAGES shared-memory buffers, one cp.async commit group per
// tile, rows >= T zero-filled):
//   tc_load_tile<Layout, ROWS>(dst, src, row0, T): rows [row0, row0 + ROWS) of a [T][HEAD_D]
//     matrix whose rows lie STRIDE rows apart into a swizzled tile (any rows: Q, K or V).
//   TcLoadAsync<Mma>: init(sm, gm, w); begin(): Q's copy, issued before the list's head is read;
//     first_tiles(list): the list's first STAGES - 1 tiles, then waits for Q; refill(sm, gm, T,
//     st_fill, ent_nx, nx, n): waits for the oldest tile (the one the loop is on), then loads tile
//     nx (entry ent_nx) into stage st_fill when nx < n; drain(): waits for what is left.
#pragma once
#include "tc/scheduler.cuh"

struct TcMmaSync {
    typedef TcRowLayout Layout;
    // whether x holds on any thread that issues the products together (the warp)
    static __device__ __forceinline__ bool vote(bool x) { return __any_sync(0xffffffffu, x); }
    // completed cp.async writes made visible to the products' reads (nothing for ldmatrix)
    static __device__ __forceinline__ void fence_loads() {}
};

// QREG 1: the k-step's Q fragments are copies of the registers loaded once (the compiler folds
// them away); QREG 0: read from the resident Q tile
#if QREG
#define TC_Q_FRAG_SYNC(qk, qf, qthr, m, ks) _Pragma("unroll") for (int x = 0; x < 4; ++x) qk[m][x] = qf[m][ks][x];
#else
#define TC_Q_FRAG_SYNC(qk, qf, qthr, m, ks) tc_ldsm_x4(qk[m], (qthr ^ (u32)(ks << 5)) + m * 16 * CH * 16);
#endif

// S = Q K^T for the warp's rows (s overwritten): tK the stage's K tile, kthr / qthr the lane's
// ldmatrix offsets, qf the Q fragments (QREG 1)
#define TC_QK_SYNC(s, tK, kthr, qf, qthr)                                                                               \
    {                                                                                                                   \
        const u32 cK = tK + kthr;                                                                                       \
        _Pragma("unroll") for (int m = 0; m < MT; ++m)                                                                  \
            _Pragma("unroll") for (int j = 0; j < BN / 8; ++j) s[m][j][0] = s[m][j][1] = s[m][j][2] = s[m][j][3] = 0.f; \
        _Pragma("unroll") for (int ks = 0; ks < HEAD_D / 16; ++ks) {                                                    \
            u32 qk[MT][4];  /* this k-step's Q fragments (QREG: copies the compiler folds away) */                      \
            _Pragma("unroll") for (int m = 0; m < MT; ++m) {                                                            \
                TC_Q_FRAG_SYNC(qk, qf, qthr, m, ks)                                                                     \
            }                                                                                                           \
            _Pragma("unroll") for (int np = 0; np < BN / 16; ++np) {                                                    \
                u32 b[4];                                                                                               \
                tc_ldsm_x4(b, (cK ^ (u32)(ks << 5)) + np * 16 * CH * 16);                                               \
                _Pragma("unroll") for (int m = 0; m < MT; ++m) {                                                        \
                    tc_mma(s[m][2 * np], qk[m], b[0], b[1]);                                                            \
                    tc_mma(s[m][2 * np + 1], qk[m], b[2], b[3]);                                                        \
                }                                                                                                       \
            }                                                                                                           \
        }                                                                                                               \
    }

// O += P V (P re-packed from the S accumulators, V through ldmatrix.trans), nothing when the warp is
// idle: tV the stage's V tile, vthr the lane's ldmatrix offset
#define TC_PV_SYNC(acc, s, tV, vthr, idle)                                            \
    {                                                                                 \
        const u32 cV = tV + vthr;                                                     \
        _Pragma("unroll") for (int kk = 0; kk < BN / 16 && !idle; ++kk) {             \
            u32 a[MT][4];                                                             \
            _Pragma("unroll") for (int m = 0; m < MT; ++m) tc_p_frag(a[m], s[m], kk); \
            _Pragma("unroll") for (int dp = 0; dp < HEAD_D / 16; ++dp) {              \
                u32 b[4];                                                             \
                tc_ldsm_x4_t(b, (cV ^ (u32)(dp << 5)) + kk * 16 * CH * 16);           \
                _Pragma("unroll") for (int m = 0; m < MT; ++m) {                      \
                    tc_mma(acc[m][2 * dp], a[m], b[0], b[1]);                         \
                    tc_mma(acc[m][2 * dp + 1], a[m], b[2], b[3]);                     \
                }                                                                     \
            }                                                                         \
        }                                                                             \
    }

// A thread copies chunk c = tid % CH of rows r0 + i * RSTEP (RSTEP = THREADS / CH, a multiple of 8,
// so every one of its rows has the same swizzle and the addresses differ by constants).
template <class Layout, int ROWS>
__device__ __forceinline__ void tc_load_tile(u32 dst, const u16* __restrict__ src, int row0, int T) {
    constexpr int RSTEP = THREADS / CH;
    static_assert(THREADS % CH == 0 && RSTEP % 8 == 0 && ROWS % RSTEP == 0,
                  "a tile's chunks must divide evenly among the threads, 8 rows apart");
    const int r0 = threadIdx.x / CH, c = threadIdx.x % CH;
    const u32 d0 = dst + Layout::template swz<ROWS>(r0, c);
    const u16* g0 = src + (size_t)(row0 + r0) * (STRIDE * HEAD_D) + c * 8;
#pragma unroll
    for (int i = 0; i < ROWS / RSTEP; ++i) {
        const bool ok = row0 + r0 + i * RSTEP < T;
        tc_cp_async16(d0 + i * RSTEP * Layout::ROWB, ok ? g0 + (size_t)i * RSTEP * STRIDE * HEAD_D : src, ok ? 16 : 0);
    }
}

template <class Mma>
struct TcLoadAsync {
    typedef typename Mma::Layout Layout;

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
#pragma unroll
        for (int s = 0; s < STAGES - 1; ++s) {
            if (s < list.n) {
                const int kt = tc_entry_tile(list.ring[s]);
                tc_load_tile<Layout, BN>(sm.k + s * TILE_BYTES, gm.k, kt * BN, T);
                tc_load_tile<Layout, BN>(sm.v + s * TILE_BYTES, gm.v, kt * BN, T);
            }
            tc_commit();
        }
        tc_wait<STAGES - 1>();  // the Q group is the oldest
        Mma::fence_loads();
        __syncthreads();
    }

    // (static, its state passed in: as a method reading the struct, the cubins change)
    static __device__ __forceinline__ void refill(const TcSmem& sm, const TcGlobal& gm, int T, int st_fill, int ent_nx,
                                                  int nx, int n) {
        tc_wait<STAGES - 2>();
        Mma::fence_loads();
        __syncthreads();  // tile `it` is visible to all; the stage refilled below is free
        if (nx < n) {
            const int ktn = tc_entry_tile(ent_nx);
            tc_load_tile<Layout, BN>(sm.k + st_fill * TILE_BYTES, gm.k, ktn * BN, T);
            tc_load_tile<Layout, BN>(sm.v + st_fill * TILE_BYTES, gm.v, ktn * BN, T);
        }
        tc_commit();
    }

    static __device__ __forceinline__ void drain() { tc_wait<0>(); }
};
