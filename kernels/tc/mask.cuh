// Partial-tile masking: keys failing the pattern predicate (and, for non-causal patterns, keys
// j >= T) set to -inf in an S accumulator fragment. The predicate is Mask.tile_predicate's,
// compiled in (dense's, the causal clause alone, for patterns uniform over each tile): the kernel
// builds its pattern object once and passes it in; ab_allowed_bits (common.cuh) evaluates it 32
// keys of a row at a time.
//
// Interface (the m16 x n8 accumulator layout of mma.sync, also wgmma's per warp: S[j][e] is row
// ROW0 + G + 8 (e >> 1), key J0 + 8 j + 2 T4 + (e & 1); G = lane / 4, T4 = lane % 4):
//   TC_MASK_FRAG(S, PAT, ROW0, J0, T, G, T4, SEEN): masks one m16 fragment S (BN / 8 blocks of 4)
//     for any rows and keys (query rows against a key tile here; a backward's key-tile-major loop
//     the same), rows clamped below T; ORs the allowed bits it saw into SEEN.
//   TC_MASK_IDLE(IDLE, SEEN): BN <= 32 only: IDLE = no thread of the warp saw an allowed key.
#pragma once
#include "tc/scheduler.cuh"

// (A macro, not a function: see tc/common.cuh.)
#define TC_MASK_FRAG(S, PAT, ROW0, J0, T_, G, T4, SEEN)                                                \
    {                                                                                                  \
           /* rows clamped below T so the predicate's table reads stay in range; with the causal       \
           clause a key allowed to a row < T is < T too, so only non-causal patterns test the key      \
           against T */                                                                                \
        const int row_a = min(ROW0 + G, T_ - 1);                                                       \
        const int row_b = min(ROW0 + G + 8, T_ - 1);                                                   \
           /* the predicate 32 keys at a time for each of the thread's two rows, shifted so that bit   \
           8 jj + x is key 32 w + 8 jj + 2 t4 + x, the column of S[4 w + jj][x] */                     \
        _Pragma("unroll") for (int w = 0; w < (BN + 31) / 32; ++w) {                                   \
            const int j0 = J0 + 32 * w;                                                                \
            unsigned ba = ab_allowed_bits(PAT, row_a, j0), bb = ab_allowed_bits(PAT, row_b, j0);       \
            if (!CAUSAL) {                                                                             \
                const unsigned in_seq = ab_span(0, T_ - 1 - j0);                                       \
                ba &= in_seq;                                                                          \
                bb &= in_seq;                                                                          \
            }                                                                                          \
            SEEN |= ba | bb;                                                                           \
               /* (shifted in asm: the compiler would otherwise shift the 2 BN / 8 bit constants below \
               instead, a register and an instruction each per tile) */                                \
            ba = ab_shr(ba, 2 * T4);                                                                   \
            bb = ab_shr(bb, 2 * T4);                                                                   \
            _Pragma("unroll") for (int jj = 0; jj < 4 && 4 * w + jj < BN / 8; ++jj) {                  \
                _Pragma("unroll") for (int e = 0; e < 4; ++e) {                                        \
                    const bool ok = (((e < 2) ? ba : bb) >> (8 * jj + (e & 1))) & 1u;                  \
                    S[4 * w + jj][e] = ok ? S[4 * w + jj][e] : AB_NEG_INF;                             \
                }                                                                                      \
            }                                                                                          \
        }                                                                                              \
    }

// Whether a warp whose threads saw the allowed bits `seen` (TC_MASK_FRAG) has no allowed key in
// the tile: P = 0, no softmax, no P V. Only with the 32-key tiles of all-partial lists, where
// whole warps fall outside small windows (streaming 16+64: 4 of 20 warp-tiles); with 64-key tiles
// the branch cost 14 registers and a block per SM, and idle warps are rare (docs/PERF.md v9).
#if BN <= 32
#define TC_MASK_IDLE(IDLE, SEEN) IDLE = !__any_sync(0xffffffffu, SEEN != 0);
#else
#define TC_MASK_IDLE(IDLE, SEEN)
#endif
