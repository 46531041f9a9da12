// Tensor-core attention forward for bfloat16 / float16 (float32 accumulation), FlashAttention-2
// style, over a host-built list of key tiles per query tile.
//
// Grid: (query tiles, B * H); block: NWARPS warps, each owning MT m16 tiles of query rows
// (BM = 16 * MT * NWARPS); every K/V fragment read from shared memory feeds MT mma.
// For every key tile of the query tile's list (entry = key_tile << 1 | partial; tent holds the
// lists one after another, thead[qt] = {first entry's index, count, first entry, second entry}
// so that a block starts its first loads after one 16-byte read):
//   S = Q K^T (mma.sync m16n8k16, Q held in registers, K through ldmatrix),
//   on partial tiles only: keys failing ab_allowed(i, j) or j >= T are set to -inf (the predicate of
//   Mask.tile_predicate: dense's, the causal clause alone, for patterns uniform over each tile),
//   online softmax in float32 with exp2 and scale * log2(e) folded into one FMA; the running
//   max a row's exponentials are taken against moves only when a tile's max exceeds it by more
//   than 2^RESCALE_LOG2 (any row of the warp: then all rescale), so most tiles skip the rescale
//   of the output accumulators (exponentials stay <= 2^RESCALE_LOG2, exact after normalising);
//   under WG (LAZY), once every row of a warp has a running max, a tile first takes its
//   exponentials against it without computing the tile's own max, and is redone through the max
//   path (S again) only if a row's sum of them exceeds LAZY_SUM_MAX (scores that outgrew the
//   running max; the block votes, since its warpgroups issue S together),
//   O += P V (P re-packed from the S accumulators, V through ldmatrix.trans).
// K/V tiles stream through STAGES shared-memory buffers filled by cp.async (rows >= T
// zero-filled); rows of 16-byte chunks are XOR-swizzled so ldmatrix and cp.async are free of
// bank conflicts. The output is staged through the Q buffer and written with 16-byte stores
// (4-byte stores straight from the accumulators measured 5-9% slower).
//
// Strided patterns (Mask.strided: dilated with r > 1): blockIdx.z is the residue class c, and row
// or key a of the kernel is position c + STRIDE * a of the sequence; the tile list and the
// predicate are those of the inner pattern on a class, which holds Tc = ceil((T - c) / STRIDE)
// positions.
//
// WG 1 (sm_90a only): both products on Hopper's warpgroup MMA instead of mma.sync. Tiles are
// stored as 64-column panels (the XOR swizzle above within each is the 128-byte swizzle wgmma
// expects). S = Q K^T is wgmma m64nBNk16 with Q and K read from shared memory through
// descriptors, O += P V is m64nHEAD_Dk16 with P from registers and V read N-major; each
// warpgroup owns 64 rows, and each product is issued, committed and waited for in one batch (the
// softmax between them is unchanged).
//
// TMA 1 (with WG, STRIDE 1): Q and the K/V tiles come by bulk tensor copies (kernels/tma.cuh) that
// one thread issues, each stage completing on its own mbarrier, instead of a cp.async per
// 16-byte chunk per thread; the copy engine applies the 128-byte swizzle and zero-fills rows >= T.
// The output tile goes back the same way, staged in the Q buffer. The tensor maps (Q, K, V, O:
// [B*H][T][HEAD_D] viewed in boxes of 64 columns) come by value; other builds take them too and
// ignore them.
//
// Compile-time constants (-D): HEAD_D (64 or 128), BN (keys per tile, multiple of 16), STRIDE, QREG, WG,
// NWARPS, MT, MINB (blocks per SM for __launch_bounds__), STAGES (>= 2), TMA, AB_F16 (1: float16, 0: bfloat16), and the pattern itself:
// CAUSAL, AB_PATTERN_T and AB_PATTERN_ARGS (Mask.device_defines() of Mask.tile_predicate(BM, BN), kernels/common.cuh) with
// its parameters as constants, so that its divisions become multiplications by constants.
#include "common.cuh"
#include "pattern.cuh"

#ifndef HEAD_D
#define HEAD_D 64
#endif
#ifndef BN
#define BN 64
#endif
#ifndef NWARPS
#define NWARPS 4
#endif
#ifndef STAGES
#define STAGES 3
#endif
#ifndef AB_F16
#define AB_F16 0
#endif
#ifndef CAUSAL
#define CAUSAL 1
#endif

#ifndef MT
#define MT 1
#endif
#ifndef STRIDE
#define STRIDE 1
#endif
#ifndef QREG
#define QREG 1
#endif
#ifndef MINB
#define MINB 1
#endif
#ifndef WG
#define WG 0
#endif
#ifndef TMA
#define TMA 0
#endif

#define THREADS (NWARPS * 32)
#define RESCALE_LOG2 8.f
#define RW (MT * 16)  // query rows per warp
#define BM (NWARPS * RW)
#define CH (HEAD_D / 8)  // 16-byte chunks per row
#define TILE_BYTES (BN * HEAD_D * 2)

static_assert(HEAD_D % 64 == 0, "HEAD_D must be a multiple of 64");
static_assert(BN % 16 == 0, "BN must be a multiple of 16");
static_assert(STAGES >= 2, "STAGES must be at least 2");
#if WG
static_assert(MT == 1 && NWARPS % 4 == 0, "WG: one m16 tile per warp, whole warpgroups");
static_assert(BN == 32 || BN == 64 || BN == 128, "WG: BN 32, 64 or 128");
#include "wgmma.cuh"
#define WG_CAT2(a, b) a##b
#define WG_CAT(a, b) WG_CAT2(a, b)
#endif
#include "tma.cuh"
#if TMA
static_assert(WG && STRIDE == 1, "TMA: with WG, on unstrided patterns");
#endif

#define TC_NEG_INF __int_as_float(0xff800000)
// LAZY 1: the exponentials against the running max first (WG builds; the mma.sync builds spill
// with it at D=64 and take the tile's max on every tile)
#ifndef LAZY
#define LAZY WG
#endif
// a thread's sum of a row's exponentials (taken against the running max) above which the tile is
// redone against its own max: every exponential stays below float16's largest value (65504)
#define LAZY_SUM_MAX 32768.f
#if WG
#define TC_VOTE(x) __syncthreads_or(x)
#else
#define TC_VOTE(x) __any_sync(0xffffffffu, x)
#endif

typedef unsigned short u16;
typedef unsigned int u32;

__device__ __forceinline__ u32 tc_smem_addr(const void* p) {
    u32 r;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
    return r;
}

// Byte offset of 16-byte chunk c of row r in a swizzled tile of ROWS rows: rows of CH chunks
// (mma.sync path), or under WG panels of 64 columns, [CH / 8][ROWS][8 chunks], each row 128
// bytes (the K-major and N-major layouts wgmma reads with 128-byte swizzle); the same for HEAD_D 64.
#if WG
#define ROWB 128
#else
#define ROWB (CH * 16)
#endif
template <int ROWS>
__device__ __forceinline__ u32 tc_swz(int r, int c) {
#if WG
    return (u32)((((c >> 3) * ROWS + r) << 7) + (((c & 7) ^ (r & 7)) << 4));
#else
    return (u32)((r * CH + (c ^ (r & 7))) * 16);
#endif
}

__device__ __forceinline__ void tc_cp_async16(u32 dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void tc_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void tc_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N)); }

__device__ __forceinline__ void tc_ldsm_x4(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void tc_ldsm_x4_t(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// d += a * b for one m16n8k16 tile (a: 4 regs, b: 2 regs, d: 4 floats).
__device__ __forceinline__ void tc_mma(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
#if AB_F16
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
#endif
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ u32 tc_pack(float lo, float hi) {
#if AB_F16
    return ab_pack_f16(lo, hi);
#else
    return ab_pack_bf16(lo, hi);
#endif
}

// The m16n8k16 A fragment of P for k-step kk (keys 16 kk .. 16 kk + 15) from an m16 tile's S
// accumulators (the same per warp for mma.sync and for wgmma with A in registers).
__device__ __forceinline__ void tc_p_frag(u32 (&a)[4], const float (&s)[BN / 8][4], int kk) {
    a[0] = tc_pack(s[2 * kk][0], s[2 * kk][1]);
    a[1] = tc_pack(s[2 * kk][2], s[2 * kk][3]);
    a[2] = tc_pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    a[3] = tc_pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

__device__ __forceinline__ float tc_rcp(float x) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float tc_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Copy rows [row0, row0 + ROWS) of a [T][HEAD_D] matrix whose rows lie STRIDE rows apart into a
// swizzled tile; rows >= T read as zero.
// A thread copies chunk c = tid % CH of rows r0 + i * RSTEP (RSTEP = THREADS / CH, a multiple of 8,
// so every one of its rows has the same swizzle and the addresses differ by constants).
template <int ROWS>
__device__ __forceinline__ void tc_load_tile(u32 dst, const u16* __restrict__ src, int row0, int T) {
    constexpr int RSTEP = THREADS / CH;
    static_assert(THREADS % CH == 0 && RSTEP % 8 == 0 && ROWS % RSTEP == 0,
                  "a tile's chunks must divide evenly among the threads, 8 rows apart");
    const int r0 = threadIdx.x / CH, c = threadIdx.x % CH;
    const u32 d0 = dst + tc_swz<ROWS>(r0, c);
    const u16* g0 = src + (size_t)(row0 + r0) * (STRIDE * HEAD_D) + c * 8;
#pragma unroll
    for (int i = 0; i < ROWS / RSTEP; ++i) {
        const bool ok = row0 + r0 + i * RSTEP < T;
        tc_cp_async16(d0 + i * RSTEP * ROWB, ok ? g0 + (size_t)i * RSTEP * STRIDE * HEAD_D : src, ok ? 16 : 0);
    }
}

#if TMA
// K and V tile rows [row0, row0 + BN) of this block's head into their stages, both completing on `bar`
__device__ __forceinline__ void tma_load_kv(u32 dK, u32 dV, const void* mapK, const void* mapV, int row0, u32 bar) {
    tma_expect(bar, 2 * TILE_BYTES);
#pragma unroll
    for (int pn = 0; pn < HEAD_D / 64; ++pn) {
        tma_load3(dK + pn * BN * 128, mapK, pn * 64, row0, blockIdx.y, bar);
        tma_load3(dV + pn * BN * 128, mapV, pn * 64, row0, blockIdx.y, bar);
    }
}
#endif

extern "C" __global__ void __launch_bounds__(THREADS, MINB)
fast_tc_fwd(const u16* __restrict__ Qg, const u16* __restrict__ Kg, const u16* __restrict__ Vg,
            u16* __restrict__ Og, const int4* __restrict__ thead, const int* __restrict__ tent,
            int T_all, float scale_log2, const int* __restrict__ table, const __grid_constant__ TmaMap mapQ,
            const __grid_constant__ TmaMap mapK, const __grid_constant__ TmaMap mapV,
            const __grid_constant__ TmaMap mapO) {
    // 1024-byte alignment: every tile starts at a multiple of its row pitch (CH * 16 bytes), which
    // the XOR addressing of the ldmatrix reads below relies on
    extern __shared__ __align__(1024) unsigned char smem[];
    const int nq = gridDim.x;
    const int qt = nq - 1 - (int)blockIdx.x;  // the longest lists (causal: last tiles) first
    // this block's residue class and its length (STRIDE 1: the whole sequence)
    const int T = (T_all - (int)blockIdx.z + STRIDE - 1) / STRIDE;
    const size_t base = (size_t)blockIdx.y * (size_t)T_all * HEAD_D + (size_t)blockIdx.z * HEAD_D;
    const u16* q = Qg + base;
    const u16* k = Kg + base;
    const u16* v = Vg + base;
    u16* o = Og + base;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const u32 sQ = tc_smem_addr(smem);
    const u32 sK = sQ + BM * HEAD_D * 2;
    const u32 sV = sK + STAGES * TILE_BYTES;

    const AB_PATTERN_T pat{AB_PATTERN_ARGS};

#if TMA
    // barriers after the V stages: Q's, then one per stage
    const u32 sBar = sV + STAGES * TILE_BYTES;
    if (threadIdx.x == 0) {
#pragma unroll
        for (int s = 0; s <= STAGES; ++s) tma_bar_init(sBar + 8 * s, 1);
        tma_bar_fence_init();
    }
    __syncthreads();  // the barriers are initialised before anyone (the copy engine too) uses them
#else
    tc_load_tile<BM>(sQ, q, qt * BM, T);
    tc_commit();
#endif
    const int4 head = thead[qt];
    const int e0 = head.x, n = head.y;
    // ring[s]: the entry of tile it + s (0 past the list), shifted down once per tile
    int ring[STAGES];
    ring[0] = head.z;
    ring[1] = head.w;
#pragma unroll
    for (int s = 2; s < STAGES; ++s) ring[s] = s < n ? tent[e0 + s] : 0;
#if TMA
    if (threadIdx.x == 0) {
        // Q's copy first, then the list's first tiles (their test of n waits for the head's load)
        tma_expect(sBar, BM * HEAD_D * 2);
#pragma unroll
        for (int pn = 0; pn < HEAD_D / 64; ++pn)
            tma_load3(sQ + pn * BM * 128, &mapQ, pn * 64, qt * BM, blockIdx.y, sBar);
#pragma unroll
        for (int s = 0; s < STAGES - 1; ++s)
            if (s < n) tma_load_kv(sK + s * TILE_BYTES, sV + s * TILE_BYTES, &mapK, &mapV, (ring[s] >> 1) * BN, sBar + 8 * (s + 1));
    }
    tma_wait(sBar, 0);
#else
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < n) {
            const int kt = ring[s] >> 1;
            tc_load_tile<BN>(sK + s * TILE_BYTES, k, kt * BN, T);
            tc_load_tile<BN>(sV + s * TILE_BYTES, v, kt * BN, T);
        }
        tc_commit();
    }
    tc_wait<STAGES - 1>();  // the Q group is the oldest
#if WG
    wg_fence_smem();
#endif
    __syncthreads();
#endif

    // Q fragments: held in registers (QREG 1) or read from the resident Q tile for every key
    // tile (QREG 0: 4 * HEAD_D / 16 registers fewer, for shapes that run more blocks per SM)
#if !WG
    const u32 qthr = sQ + (u32)((warp * RW + (lane & 15)) * CH * 16 + (((lane >> 4) ^ (lane & 7)) << 4));
#endif
#if QREG && !WG
    u32 qf[MT][HEAD_D / 16][4];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int ks = 0; ks < HEAD_D / 16; ++ks)
            tc_ldsm_x4(qf[m][ks], (qthr ^ (u32)(ks << 5)) + m * 16 * CH * 16);
#endif

    float acc[MT][HEAD_D / 8][4];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int d = 0; d < HEAD_D / 8; ++d)
            acc[m][d][0] = acc[m][d][1] = acc[m][d][2] = acc[m][d][3] = 0.f;
    float mrow[MT][2], lrow[MT][2];
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        mrow[m][0] = mrow[m][1] = TC_NEG_INF;
        lrow[m][0] = lrow[m][1] = 0.f;
    }
    bool have_max = false;  // every row of this warp has a finite running max

    const int g = lane >> 2, t4 = lane & 3;

#if !WG
    // ldmatrix addresses: a lane's row within a 16-row step has row & 7 == lane & 7, so the
    // swizzled chunk (c ^ (lane & 7)) of k-step ks is (base ^ (ks << 5)) with base holding the
    // lane's own bits; the 16-row steps are constant offsets
    const int l7 = lane & 7;
    const u32 kthr = (u32)((((lane >> 4) << 3) + l7) * CH * 16 + ((((lane >> 3) & 1) ^ l7) << 4));
    const u32 vthr = (u32)(((((lane >> 3) & 1) << 3) + l7) * CH * 16 + (((lane >> 4) ^ l7) << 4));
#endif

#if WG
    // descriptor low words (start address, LBO): a k-step, panel or stage adds a constant to them
    const u32 dQ = wg_desc_lo(sQ + (u32)((warp >> 2) * 64 * 128), 0);  // this warpgroup's 64 rows
    const u32 dK = wg_desc_lo(sK, 0);
    const u32 dV = wg_desc_lo(sV, BN * 128);
#endif
#if TMA
    u32 phase = 0;              // parity of the stage barriers' current phase
#endif
    int st = 0;                 // the stage tile `it` sits in
    int st_fill = STAGES - 1;   // the stage tile `it + STAGES - 1` goes to
    for (int it = 0; it < n; ++it) {
        const int nx = it + STAGES - 1;
        const int ent = ring[0];
        const int ent_nx = ring[STAGES - 1];
#pragma unroll
        for (int s = 0; s < STAGES - 1; ++s) ring[s] = ring[s + 1];
        ring[STAGES - 1] = nx + 1 < n ? tent[e0 + nx + 1] : 0;  // read a tile ahead of its use
#if TMA
        __syncthreads();  // every warp is done with the stage refilled below (tile it - 1's)
        if (threadIdx.x == 0 && nx < n)
            tma_load_kv(sK + st_fill * TILE_BYTES, sV + st_fill * TILE_BYTES, &mapK, &mapV, (ent_nx >> 1) * BN,
                        sBar + 8 * (st_fill + 1));
        tma_wait(sBar + 8 * (st + 1), phase);  // tile `it` has landed
#else
        tc_wait<STAGES - 2>();
#if WG
        wg_fence_smem();
#endif
        __syncthreads();  // tile `it` is visible to all; the stage refilled below is free
        if (nx < n) {
            const int ktn = ent_nx >> 1;
            tc_load_tile<BN>(sK + st_fill * TILE_BYTES, k, ktn * BN, T);
            tc_load_tile<BN>(sV + st_fill * TILE_BYTES, v, ktn * BN, T);
        }
        tc_commit();
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
            {
                wg_fence();
#pragma unroll
                for (int ks = 0; ks < HEAD_D / 16; ++ks)  // k-step ks: panel ks / 4, 32 bytes a step in it
                    WG_CAT(wg_ss, BN)(s[0], wg_desc_of(dQ + (((ks >> 2) * BM * 128 + (ks & 3) * 32) >> 4)),
                                      wg_desc_of(dK + so + (((ks >> 2) * BN * 128 + (ks & 3) * 32) >> 4)), ks);
                wg_commit();
                wg_wait<0>();
            }
#else
            const u32 cK = tK + kthr;
#pragma unroll
            for (int m = 0; m < MT; ++m)
#pragma unroll
                for (int j = 0; j < BN / 8; ++j) s[m][j][0] = s[m][j][1] = s[m][j][2] = s[m][j][3] = 0.f;
#pragma unroll
            for (int ks = 0; ks < HEAD_D / 16; ++ks) {
                u32 qk[MT][4];  // this k-step's Q fragments (QREG: copies the compiler folds away)
#pragma unroll
                for (int m = 0; m < MT; ++m) {
#if QREG
#pragma unroll
                    for (int x = 0; x < 4; ++x) qk[m][x] = qf[m][ks][x];
#else
                    tc_ldsm_x4(qk[m], (qthr ^ (u32)(ks << 5)) + m * 16 * CH * 16);
#endif
                }
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
#endif

            // a tile reaching past this class's end is partial too (the list is built for the longest)
            idle = false;
            if ((ent & 1) || (STRIDE > 1 && kt * BN + BN > T)) {
                unsigned seen = 0;
#pragma unroll
                for (int m = 0; m < MT; ++m) {
                    // rows clamped below T so the predicate's table reads stay in range; with the
                    // causal clause a key allowed to a row < T is < T too, so only non-causal
                    // patterns test the key against T
                    const int row_a = min(qt * BM + warp * RW + m * 16 + g, T - 1);
                    const int row_b = min(qt * BM + warp * RW + m * 16 + g + 8, T - 1);
                    // the predicate 32 keys at a time for each of the thread's two rows, shifted so
                    // that bit 8 jj + x is key 32 w + 8 jj + 2 t4 + x, the column of s[m][4 w + jj][x]
#pragma unroll
                    for (int w = 0; w < (BN + 31) / 32; ++w) {
                        const int j0 = kt * BN + 32 * w;
                        unsigned ba = ab_allowed_bits(pat, row_a, j0), bb = ab_allowed_bits(pat, row_b, j0);
                        if (!CAUSAL) {
                            const unsigned in_seq = ab_span(0, T - 1 - j0);
                            ba &= in_seq;
                            bb &= in_seq;
                        }
                        seen |= ba | bb;
                        // (shifted in asm: the compiler would otherwise shift the 2 BN / 8 bit
                        // constants below instead, a register and an instruction each per tile)
                        ba = ab_shr(ba, 2 * t4);
                        bb = ab_shr(bb, 2 * t4);
#pragma unroll
                        for (int jj = 0; jj < 4 && 4 * w + jj < BN / 8; ++jj) {
#pragma unroll
                            for (int e = 0; e < 4; ++e) {
                                const bool ok = (((e < 2) ? ba : bb) >> (8 * jj + (e & 1))) & 1u;
                                s[m][4 * w + jj][e] = ok ? s[m][4 * w + jj][e] : TC_NEG_INF;
                            }
                        }
                    }
                }
#if BN <= 32
                // only with the 32-key tiles of all-partial lists, where whole warps fall outside small
                // windows (streaming 16+64: 4 of 20 warp-tiles); with 64-key tiles the branch cost 14
                // registers and a block per SM, and idle warps are rare (docs/PERF.md v9)
                idle = !__any_sync(0xffffffffu, seen != 0);
#endif
            }

            bool big = false;
            if (idle) {
#pragma unroll
                for (int m = 0; m < MT; ++m) {
                    rs[m][0] = rs[m][1] = 0.f;
#pragma unroll
                    for (int j = 0; j < BN / 8; ++j) s[m][j][0] = s[m][j][1] = s[m][j][2] = s[m][j][3] = 0.f;
                }
            } else {
                // first pass: the exponentials against the running max of earlier tiles, no row max
                // of this one (a warp whose every row has one); the vote below redoes the tile
                // through the max path if some sum grew past LAZY_SUM_MAX
                const bool fast = LAZY && pass == 0 && have_max;
                if (!fast) {
                    // online softmax, two rows per thread and m-tile (g and g + 8), four lanes per row:
                    // the tile's row max, a rescale only if some row's max grew by more than 2^RESCALE_LOG2
                    float tmax[MT][2];
                    bool grow = false;
#pragma unroll
                    for (int m = 0; m < MT; ++m) {
#pragma unroll
                        for (int r = 0; r < 2; ++r) {
                            float mx = TC_NEG_INF;
#pragma unroll
                            for (int j = 0; j < BN / 8; ++j) mx = fmaxf(mx, fmaxf(s[m][j][2 * r], s[m][j][2 * r + 1]));
                            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                            tmax[m][r] = mx;
                            // true on a row's first allowed key too (mrow = -inf)
                            grow |= (mx - mrow[m][r]) * scale_log2 > RESCALE_LOG2;
                        }
                    }
                    // (a warp's first tile: acc and l are still 0, only the max moves)
                    if (__any_sync(0xffffffffu, grow)) {
#pragma unroll
                        for (int m = 0; m < MT; ++m) {
#pragma unroll
                            for (int r = 0; r < 2; ++r) {
                                const float mx = fmaxf(mrow[m][r], tmax[m][r]);
                                // no allowed key yet: alpha stays 1 (l and acc are 0 anyway), never NaN
                                const float alpha = mx == TC_NEG_INF ? 1.f : tc_exp2((mrow[m][r] - mx) * scale_log2);
                                mrow[m][r] = mx;
                                if (it > 0) {
                                    lrow[m][r] *= alpha;
#pragma unroll
                                    for (int d = 0; d < HEAD_D / 8; ++d) {
                                        acc[m][d][2 * r] *= alpha;
                                        acc[m][d][2 * r + 1] *= alpha;
                                    }
                                }
                            }
                        }
                    }
                    if (LAZY) {
                        bool fin = true;
#pragma unroll
                        for (int m = 0; m < MT; ++m) fin &= mrow[m][0] != TC_NEG_INF && mrow[m][1] != TC_NEG_INF;
                        have_max = __all_sync(0xffffffffu, fin);
                    }
                }
#pragma unroll
                for (int m = 0; m < MT; ++m) {
#pragma unroll
                    for (int r = 0; r < 2; ++r) {
                        // no allowed key yet: subtract 0 instead of -inf so exp2 gives 0, never NaN
                        const float ms = (mrow[m][r] == TC_NEG_INF) ? 0.f : mrow[m][r] * scale_log2;
                        float sum = 0.f;
#pragma unroll
                        for (int j = 0; j < BN / 8; ++j) {
                            const float a = tc_exp2(fmaf(s[m][j][2 * r], scale_log2, -ms));
                            const float b = tc_exp2(fmaf(s[m][j][2 * r + 1], scale_log2, -ms));
                            s[m][j][2 * r] = a;
                            s[m][j][2 * r + 1] = b;
                            sum += a + b;
                        }
                        rs[m][r] = sum;
                        big |= !(sum <= LAZY_SUM_MAX);  // (a NaN or infinite sum too)
                    }
                }
                big &= fast;
            }
            if (!LAZY || !TC_VOTE(big)) break;
        }  // pass
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            lrow[m][0] += rs[m][0];
            lrow[m][1] += rs[m][1];
        }

        // O += P V
#if WG
        {
            u32 pa[BN / 16][4];
#pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk) tc_p_frag(pa[kk], s[0], kk);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk)
                WG_CAT(wg_rs, HEAD_D)(acc[0], pa[kk], wg_desc_of(dV + so + ((kk * 16 * 128) >> 4)), 1);
            wg_commit();
            wg_wait<0>();
        }
#else
        const u32 cV = tV + vthr;
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
#endif
    }
#if !TMA
    tc_wait<0>();
#endif

    // normalise, stage this warp's rows in its own part of the Q buffer, store 16 bytes a lane (TMA:
    // one bulk tensor copy of the whole tile, rows >= T left out by the copy engine)
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        float inv[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float l = lrow[m][r];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            inv[r] = l > 0.f ? tc_rcp(l) : 0.f;
        }
        const int wrow = warp * RW + m * 16;
#pragma unroll
        for (int d = 0; d < HEAD_D / 8; ++d) {
            const u32 lo = tc_pack(acc[m][d][0] * inv[0], acc[m][d][1] * inv[0]);
            const u32 hi = tc_pack(acc[m][d][2] * inv[1], acc[m][d][3] * inv[1]);
            asm volatile("st.shared.u32 [%0], %1;\n" :: "r"(sQ + tc_swz<BM>(wrow + g, d) + t4 * 4), "r"(lo));
            asm volatile("st.shared.u32 [%0], %1;\n" :: "r"(sQ + tc_swz<BM>(wrow + g + 8, d) + t4 * 4), "r"(hi));
        }
    }
#if TMA
    wg_fence_smem();  // the staged rows (generic proxy) made visible to the copy engine
    __syncthreads();
    if (threadIdx.x == 0) {
#pragma unroll
        for (int pn = 0; pn < HEAD_D / 64; ++pn) tma_store3(&mapO, pn * 64, qt * BM, blockIdx.y, sQ + pn * BM * 128);
        tma_store_commit_and_wait();  // the block's shared memory must outlive the copy's reads
    }
#else
    __syncwarp();
#pragma unroll
    for (int idx = lane; idx < RW * CH; idx += 32) {
        const int r = idx / CH, c = idx % CH;
        const int grow = qt * BM + warp * RW + r;
        if (grow < T) {
            u32 x0, x1, x2, x3;
            asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                         : "=r"(x0), "=r"(x1), "=r"(x2), "=r"(x3) : "r"(sQ + tc_swz<BM>(warp * RW + r, c)));
            asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};\n"
                         :: "l"(o + (size_t)grow * (STRIDE * HEAD_D) + c * 8), "r"(x0), "r"(x1), "r"(x2), "r"(x3));
        }
    }
#endif
}
