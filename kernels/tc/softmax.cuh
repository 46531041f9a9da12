// Online softmax in float32 over a warp's rows: two rows per thread and m16 tile (g and g + 8),
// four lanes per row, with exp2 and scale * log2(e) folded into one FMA.
//
// The running max a row's exponentials are taken against moves only when a tile's max exceeds it
// by more than 2^RESCALE_LOG2 (any row of the warp: then all rescale), so most tiles skip the
// rescale of the output accumulators (exponentials stay <= 2^RESCALE_LOG2, exact after
// normalising). Under LAZY (WG builds), once every row of a warp has a running max, a tile first
// takes its exponentials against it without computing the tile's own max, and is redone through
// the max path (S again) only if a row's sum of them exceeds LAZY_SUM_MAX (scores that outgrew
// the running max): BIG comes back true and the caller votes over the threads that issue S
// together (TcMma::vote) and recomputes S.
//
// State (the caller's): mrow[MT][2] the running max of each of the thread's rows (raw scores,
// -inf before a row's first allowed key), lrow[MT][2] this thread's share of the row sums (the
// whole sum: add the 4 lanes of the row, as TC_STAGE_OUTPUT does), have_max (every row of the warp
// has a finite running max). A row's log-sum-exp in base 2 is mrow * scale_log2 + log2(sum).
// Interface:
//   TC_SOFTMAX_ZERO(s, rs): P = 0 and row sums 0 for an idle tile.
//   TC_SOFTMAX_PROBS(s, rs, acc, mrow, lrow, have_max, big, scale_log2, pass, it): S -> P in place,
//     rs the tile's row sums (this thread's share); the running max moved and acc, lrow rescaled
//     when it grows (not on the first tile, it == 0); pass 0 is the lazy pass; big |= redo.
//   TC_SOFTMAX_ADD(lrow, rs): lrow += rs.
// Macros, not functions: see tc/common.cuh.
#pragma once
#include "tc/common.cuh"

#define RESCALE_LOG2 8.f
// a thread's sum of a row's exponentials (taken against the running max) above which the tile is
// redone against its own max: every exponential stays below float16's largest value (65504)
#define LAZY_SUM_MAX 32768.f

// P = 0 for an idle tile (no allowed key in the warp's rows), its row sums 0
#define TC_SOFTMAX_ZERO(s, rs)                                                                                          \
    {                                                                                                                   \
        _Pragma("unroll") for (int m = 0; m < MT; ++m) {                                                                \
            rs[m][0] = rs[m][1] = 0.f;                                                                                  \
            _Pragma("unroll") for (int j = 0; j < BN / 8; ++j) s[m][j][0] = s[m][j][1] = s[m][j][2] = s[m][j][3] = 0.f; \
        }                                                                                                               \
    }

// S -> P in place for a tile with allowed keys (see the interface above)
#define TC_SOFTMAX_PROBS(s, rs, acc, mrow, lrow, have_max, big, scale_log2, pass, it)                                             \
    {                                                                                                                             \
        /* first pass: the exponentials against the running max of earlier tiles, no row max */                                   \
        /* of this one (a warp whose every row has one); the caller's vote redoes the tile */                                     \
        /* through the max path if some sum grew past LAZY_SUM_MAX */                                                             \
        const bool fast = LAZY && pass == 0 && have_max;                                                                          \
        if (!fast) {                                                                                                              \
            /* online softmax, two rows per thread and m-tile (g and g + 8), four lanes per row: */                               \
            /* the tile's row max, a rescale only if some row's max grew by more than 2^RESCALE_LOG2 */                           \
            float tmax[MT][2];                                                                                                    \
            bool grow = false;                                                                                                    \
            _Pragma("unroll") for (int m = 0; m < MT; ++m) {                                                                      \
                _Pragma("unroll") for (int r = 0; r < 2; ++r) {                                                                   \
                    float mx = AB_NEG_INF;                                                                                        \
                    _Pragma("unroll") for (int j = 0; j < BN / 8; ++j) mx = fmaxf(mx, fmaxf(s[m][j][2 * r], s[m][j][2 * r + 1])); \
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));                                                          \
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));                                                          \
                    tmax[m][r] = mx;                                                                                              \
                    /* true on a row's first allowed key too (mrow = -inf) */                                                     \
                    grow |= (mx - mrow[m][r]) * scale_log2 > RESCALE_LOG2;                                                        \
                }                                                                                                                 \
            }                                                                                                                     \
            /* (a warp's first tile: acc and l are still 0, only the max moves) */                                                \
            if (__any_sync(0xffffffffu, grow)) {                                                                                  \
                _Pragma("unroll") for (int m = 0; m < MT; ++m) {                                                                  \
                    _Pragma("unroll") for (int r = 0; r < 2; ++r) {                                                               \
                        const float mx = fmaxf(mrow[m][r], tmax[m][r]);                                                           \
                        /* no allowed key yet: alpha stays 1 (l and acc are 0 anyway), never NaN */                               \
                        const float alpha = mx == AB_NEG_INF ? 1.f : tc_exp2((mrow[m][r] - mx) * scale_log2);                     \
                        mrow[m][r] = mx;                                                                                          \
                        if (it > 0) {                                                                                             \
                            lrow[m][r] *= alpha;                                                                                  \
                            _Pragma("unroll") for (int d = 0; d < HEAD_D / 8; ++d) {                                              \
                                acc[m][d][2 * r] *= alpha;                                                                        \
                                acc[m][d][2 * r + 1] *= alpha;                                                                    \
                            }                                                                                                     \
                        }                                                                                                         \
                    }                                                                                                             \
                }                                                                                                                 \
            }                                                                                                                     \
            if (LAZY) {                                                                                                           \
                bool fin = true;                                                                                                  \
                _Pragma("unroll") for (int m = 0; m < MT; ++m) fin &= mrow[m][0] != AB_NEG_INF && mrow[m][1] != AB_NEG_INF;       \
                have_max = __all_sync(0xffffffffu, fin);                                                                          \
            }                                                                                                                     \
        }                                                                                                                         \
        _Pragma("unroll") for (int m = 0; m < MT; ++m) {                                                                          \
            _Pragma("unroll") for (int r = 0; r < 2; ++r) {                                                                       \
                /* no allowed key yet: subtract 0 instead of -inf so exp2 gives 0, never NaN */                                   \
                const float ms = (mrow[m][r] == AB_NEG_INF) ? 0.f : mrow[m][r] * scale_log2;                                      \
                float sum = 0.f;                                                                                                  \
                _Pragma("unroll") for (int j = 0; j < BN / 8; ++j) {                                                              \
                    const float a = tc_exp2(fmaf(s[m][j][2 * r], scale_log2, -ms));                                               \
                    const float b = tc_exp2(fmaf(s[m][j][2 * r + 1], scale_log2, -ms));                                           \
                    s[m][j][2 * r] = a;                                                                                           \
                    s[m][j][2 * r + 1] = b;                                                                                       \
                    sum += a + b;                                                                                                 \
                }                                                                                                                 \
                rs[m][r] = sum;                                                                                                   \
                big |= !(sum <= LAZY_SUM_MAX);  /* (a NaN or infinite sum too) */                                                 \
            }                                                                                                                     \
        }                                                                                                                         \
        big &= fast;                                                                                                              \
    }

// the running row sums (this thread's share) += the tile's
#define TC_SOFTMAX_ADD(lrow, rs)                         \
    {                                                    \
        _Pragma("unroll") for (int m = 0; m < MT; ++m) { \
            lrow[m][0] += rs[m][0];                      \
            lrow[m][1] += rs[m][1];                      \
        }                                                \
    }
