// Partial-tile masking: keys failing the pattern predicate (and, for non-causal patterns, keys
// j >= T) set to -inf in an S accumulator fragment. The predicate is Mask.tile_predicate's,
// compiled in (dense's, the causal clause alone, for patterns uniform over each tile): the kernel
// builds its pattern object once and passes it in; ab_allowed_bits (common.cuh) evaluates it 32
// keys of a row at a time.
//
// Interface (the m16 x n8 accumulator layout of mma.sync, also wgmma's per warp: s[j][e] is row
// row0 + g + 8 (e >> 1), key j0 + 8 j + 2 t4 + (e & 1); g = lane / 4, t4 = lane % 4):
//   tc_mask_frag(s, pat, row0, j0, T, g, t4) -> seen: masks one m16 fragment s (BN / 8 blocks of
//     4) for any rows and keys (query rows against a key tile here; a backward's key-tile-major
//     loop the same), rows clamped below T; returns the allowed bits it saw.
//   tc_mask_rows(s, pat, row_a, row_b, j0, T, t4) -> seen: the same for a thread's two rows given
//     by their positions (rows packed otherwise: a decode's query heads and positions), each < T.
//   tc_mask_idle(seen): BN <= 32 only (else false): no thread of the warp saw an allowed key.
#pragma once
#include "tc/scheduler.cuh"

template <class P>
__device__ __forceinline__ unsigned tc_mask_rows(float (&s)[BN / 8][4], const P& pat, int row_a, int row_b, int j0_tile,
                                                 int T, int t4) {
    unsigned seen = 0;
    // the predicate 32 keys at a time for each of the thread's two rows, shifted so that bit
    // 8 jj + x is key 32 w + 8 jj + 2 t4 + x, the column of s[4 w + jj][x]
#pragma unroll
    for (int w = 0; w < (BN + 31) / 32; ++w) {
        const int j0 = j0_tile + 32 * w;
        unsigned ba = ab_allowed_bits(pat, row_a, j0), bb = ab_allowed_bits(pat, row_b, j0);
        if (!CAUSAL) {
            const unsigned in_seq = ab_span(0, T - 1 - j0);
            ba &= in_seq;
            bb &= in_seq;
        }
        seen |= ba | bb;
        // (shifted in asm: the compiler would otherwise shift the 2 BN / 8 bit constants below
        // instead, a register and an instruction each per tile)
        ba = ab_shr(ba, 2 * t4);
        bb = ab_shr(bb, 2 * t4);
#pragma unroll
        for (int jj = 0; jj < 4 && 4 * w + jj < BN / 8; ++jj) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const bool ok = (((e < 2) ? ba : bb) >> (8 * jj + (e & 1))) & 1u;
                s[4 * w + jj][e] = ok ? s[4 * w + jj][e] : AB_NEG_INF;
            }
        }
    }
    return seen;
}

template <class P>
__device__ __forceinline__ unsigned tc_mask_frag(float (&s)[BN / 8][4], const P& pat, int row0, int j0_tile, int T,
                                                 int g, int t4) {
    // rows clamped below T so the predicate's table reads stay in range; with the causal clause a
    // key allowed to a row < T is < T too, so only non-causal patterns test the key against T
    return tc_mask_rows(s, pat, min(row0 + g, T - 1), min(row0 + g + 8, T - 1), j0_tile, T, t4);
}

// Whether a warp whose threads saw the allowed bits `seen` (tc_mask_frag) has no allowed key in
// the tile: P = 0, no softmax, no P V. Only with the 32-key tiles of all-partial lists, where
// whole warps fall outside small windows (streaming 16+64: 4 of 20 warp-tiles); with 64-key tiles
// the branch cost 14 registers and a block per SM, and idle warps are rare (docs/PERF.md v9).
__device__ __forceinline__ bool tc_mask_idle(unsigned seen) {
#if BN <= 32
    return !__any_sync(0xffffffffu, seen != 0);
#else
    return false;
#endif
}
