// The backward's products on mma.sync m16n8k16, operands through ldmatrix from swizzled tiles.
//
// A block holds one key tile (BN keys) and walks query tiles of BM = 16 * NWARPS rows (BM == BN);
// warp w owns query rows 16 w .. 16 w + 15 of the query tile for the row-major products (S, dP,
// dQ: the forward's layout, so tc_mask_frag masks S unchanged) and keys 16 w .. 16 w + 15 of
// the key tile for the key-major ones (dV, dK: P and dS read transposed from shared memory).
//
// Tiles: Q, dO (stages), K, V (resident) are rows of CH 16-byte chunks (TcRowLayout, pitch
// ROWB = HEAD_D * 2 bytes); P and dS are staged as rows of BN / 8 chunks (TcBwdPLayout, pitch
// BN * 2 bytes), chunk c of row r at (c ^ (r & 7)) as in TcRowLayout. Every pitch is a multiple of
// 128 bytes, so a lane's row has the same swizzle at every 16-row step and a k-step or a column
// pair is an XOR of the lane's base address (the forward's TcMmaSync trick).
//
// Lane addresses of an x4 ldmatrix (within a tile of pitch ROWB; XOR (x << 5) selects chunk pair x):
//   tc_lane_a:  rows lane & 15, chunk lane >> 4 (non-trans: the A fragment of a row-major tile, as
//               the forward's Q: matrices a0..a3 = rows 0-7 / 8-15 x chunk lo / hi);
//   tc_lane_n:  rows 8 (lane >> 4) + lane & 7, chunk (lane >> 3) & 1 (non-trans: the B fragments of
//               two n8 blocks from a [n][k] tile, as the forward's K; trans: the A fragment of the
//               transpose of a [k][m] tile, here P^T and dS^T from [query][key]);
//   tc_lane_t:  rows 8 ((lane >> 3) & 1) + lane & 7, chunk lane >> 4 (trans: the B fragments of two
//               n8 blocks from a [k][n] tile, as the forward's V).
// Interface:
//   tc_bwd_rows(x, a, b): x [16 rows][BN keys] = A B^T for the warp's rows, A (Q or dO) at a
//     (tc_lane_a, the warp's rows), B (K or V) at b (tc_lane_n); K = HEAD_D.
//   tc_bwd_cols(acc, a, b): acc [16 keys][HEAD_D] += X^T Y for the warp's keys, X^T (P or dS) at a
//     (tc_lane_n on the staged tile, XOR the warp's chunk pair), Y (dO or Q) at b (tc_lane_t); K = BM.
//   tc_bwd_dq_chunk<C>(c, ds, b, c0): c [16 rows][C columns from c0] = dS K, dS from registers (its
//     A fragments, tc_p_frag), K at b (tc_lane_t); K = BN. tc_bwd_dq_mac<C>: c += dS K.
//   tc_bwd_live(x): the warp's 16-key column blocks of x (P) that hold a nonzero value, a bit each
//     (warp-uniform); tc_bwd_rows_live(x, a, b, live) and tc_bwd_dq_mac_live<C>(c, ds, b, c0, live):
//     tc_bwd_rows and tc_bwd_dq_mac on those blocks only (the others of x zero; dS is zero where P is).
//   tc_zero_frag(x): a fragment of n8 blocks zeroed; tc_bwd_pack(a, x): x packed as A operands.
//   tc_bwd_stage(s, a, warp, g, t4): a warp's packed A fragments of a [16][BN] tile (P or dS) into
//     its rows of a staged tile at s.
#pragma once
#include "tc/common.cuh"

static_assert(BM == BN && BN % 64 == 0 && MT == 1 && !QREG,
              "backward: BN == BM = 16 * NWARPS, a multiple of 64; one m16 tile per warp; operands from shared memory");

#define BWD_PCH (BN / 8)      // 16-byte chunks of a staged P / dS row
#define BWD_PROWB (BN * 2)    // its pitch in bytes
#define BWD_ROWB (HEAD_D * 2) // the pitch of Q, dO, K, V tiles

typedef float TcBwdRows[BN / 8][4];       // a warp's [16][BN] fragment: S, P, dP, dS
typedef float TcBwdCols[HEAD_D / 8][4];   // a warp's [16][HEAD_D] accumulators: dK, dV
typedef u32 TcBwdFrag[BN / 16][4];        // a [16][BN] fragment packed as the A operands of its k-steps

template <int J>
__device__ __forceinline__ void tc_zero_frag(float (&x)[J][4]) {
#pragma unroll
    for (int j = 0; j < J; ++j) x[j][0] = x[j][1] = x[j][2] = x[j][3] = 0.f;
}

// two n8 blocks of one A fragment against an x4 ldmatrix of B fragments (b[0..1], b[2..3])
__device__ __forceinline__ void tc_mma2(float (&x0)[4], float (&x1)[4], const u32 (&a)[4], const u32 (&b)[4]) {
    tc_mma(x0, a, b[0], b[1]);
    tc_mma(x1, a, b[2], b[3]);
}

__device__ __forceinline__ u32 tc_lane_a(int lane, int rowb) {
    const int l7 = lane & 7;
    return (u32)((lane & 15) * rowb + (((lane >> 4) ^ l7) << 4));
}
__device__ __forceinline__ u32 tc_lane_n(int lane, int rowb) {
    const int l7 = lane & 7;
    return (u32)((((lane >> 4) << 3) + l7) * rowb + ((((lane >> 3) & 1) ^ l7) << 4));
}
__device__ __forceinline__ u32 tc_lane_t(int lane, int rowb) {
    const int l7 = lane & 7;
    return (u32)(((((lane >> 3) & 1) << 3) + l7) * rowb + (((lane >> 4) ^ l7) << 4));
}

// x = A B^T over HEAD_D: A's 16 rows at a (its k-step ks at a ^ (ks << 5)), B's BN rows at b; on the
// column blocks np of 16 keys with bit np of live set only (x zero elsewhere; all: tc_bwd_rows)
__device__ __forceinline__ void tc_bwd_rows_live(TcBwdRows& x, u32 a, u32 b, unsigned live) {
    tc_zero_frag(x);
#pragma unroll
    for (int ks = 0; ks < HEAD_D / 16; ++ks) {
        u32 af[4];
        tc_ldsm_x4(af, a ^ (u32)(ks << 5));
#pragma unroll
        for (int np = 0; np < BN / 16; ++np) {
            if (!((live >> np) & 1u)) continue;
            u32 bf[4];
            tc_ldsm_x4(bf, (b ^ (u32)(ks << 5)) + np * 16 * BWD_ROWB);
            tc_mma2(x[2 * np], x[2 * np + 1], af, bf);
        }
    }
}

__device__ __forceinline__ void tc_bwd_rows(TcBwdRows& x, u32 a, u32 b) { tc_bwd_rows_live(x, a, b, ~0u); }

// the 16-key column blocks kk (bit kk) where any of the warp's P values is nonzero: exp2 of a masked
// score or of a padding row is exactly zero, and so is dS = P (dP - delta) there
__device__ __forceinline__ unsigned tc_bwd_live(const TcBwdRows& x) {
    unsigned live = 0;
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
        bool nz = false;
#pragma unroll
        for (int i = 0; i < 4; ++i) nz |= (x[2 * kk][i] != 0.f) | (x[2 * kk + 1][i] != 0.f);
        live |= (unsigned)__any_sync(0xffffffffu, nz) << kk;
    }
    return live;
}

// acc += X^T Y over the BM query rows: X^T's k-step qs at a + qs * 16 rows of the staged tile,
// Y's at b + qs * 16 rows, its column pair dp at b ^ (dp << 5)
__device__ __forceinline__ void tc_bwd_cols(TcBwdCols& acc, u32 a, u32 b) {
#pragma unroll
    for (int qs = 0; qs < BM / 16; ++qs) {
        u32 af[4];
        tc_ldsm_x4_t(af, a + qs * 16 * BWD_PROWB);
#pragma unroll
        for (int dp = 0; dp < HEAD_D / 16; ++dp) {
            u32 bf[4];
            tc_ldsm_x4_t(bf, (b ^ (u32)(dp << 5)) + qs * 16 * BWD_ROWB);
            tc_mma2(acc[2 * dp], acc[2 * dp + 1], af, bf);
        }
    }
}

// c += dS K for columns c0 .. c0 + C - 1 (c0 a multiple of 16): dS's k-step kk is ds[kk], K's at
// b + kk * 16 rows; over the k-steps (key blocks) with bit kk of live set only (all: tc_bwd_dq_mac)
template <int C>
__device__ __forceinline__ void tc_bwd_dq_mac_live(float (&c)[C / 8][4], const TcBwdFrag& ds, u32 b, int c0,
                                                   unsigned live) {
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
        if (!((live >> kk) & 1u)) continue;
#pragma unroll
        for (int dp = 0; dp < C / 16; ++dp) {
            u32 bf[4];
            tc_ldsm_x4_t(bf, (b ^ (u32)((c0 / 16 + dp) << 5)) + kk * 16 * BWD_ROWB);
            tc_mma2(c[2 * dp], c[2 * dp + 1], ds[kk], bf);
        }
    }
}

template <int C>
__device__ __forceinline__ void tc_bwd_dq_mac(float (&c)[C / 8][4], const TcBwdFrag& ds, u32 b, int c0) {
    tc_bwd_dq_mac_live<C>(c, ds, b, c0, ~0u);
}

// c = dS K for columns c0 .. c0 + C - 1 (tc_bwd_dq_mac on zeroed accumulators)
template <int C>
__device__ __forceinline__ void tc_bwd_dq_chunk(float (&c)[C / 8][4], const TcBwdFrag& ds, u32 b, int c0) {
    tc_zero_frag(c);
    tc_bwd_dq_mac<C>(c, ds, b, c0);
}

// a warp's packed [16][BN] fragment into rows 16 warp + g and + 8 of a staged tile: a[kk][0] / [1]
// hold rows g / g + 8 at chunk 2 kk, a[kk][2] / [3] at chunk 2 kk + 1, each 4 bytes at t4 * 4
__device__ __forceinline__ void tc_bwd_stage(u32 s, const TcBwdFrag& a, int warp, int g, int t4) {
    const u32 r0 = s + (u32)((warp * 16 + g) * BWD_PROWB + t4 * 4);
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
#pragma unroll
        for (int x = 0; x < 4; ++x) {
            const u32 addr = r0 + (x & 1) * 8 * BWD_PROWB + (u32)(((2 * kk + (x >> 1)) ^ g) << 4);
            asm volatile("st.shared.u32 [%0], %1;\n" :: "r"(addr), "r"(a[kk][x]));
        }
    }
}

// a [16][BN] fragment packed into the A operands of its BN / 16 k-steps
__device__ __forceinline__ void tc_bwd_pack(TcBwdFrag& a, const TcBwdRows& x) {
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) tc_p_frag(a[kk], x, kk);
}
