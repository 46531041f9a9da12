// Online softmax in float32 over a warp's rows: two rows per thread and m16 tile (g and g + 8),
// four lanes per row, with exp2 and scale * log2(e) folded into one FMA.
//
// The running max a row's exponentials are taken against moves only when a tile's max exceeds it
// by more than 2^RESCALE_LOG2 (any row of the warp: then all rescale), so most tiles skip the
// rescale of the output accumulators (exponentials stay <= 2^RESCALE_LOG2, exact after
// normalising). Under LAZY (WG builds), once every row of a warp has a running max, a tile first
// takes its exponentials against it without computing the tile's own max, and is redone through
// the max path (S again) only if a row's sum of them exceeds LAZY_SUM_MAX (scores that outgrew
// the running max): `big` comes back true and the caller votes over the threads that issue S
// together (TcMma::vote) and recomputes S.
//
// State (TcSoftmax, one per thread): m[MT][2] the running max of each of the thread's rows (raw
// scores, -inf before a row's first allowed key), l[MT][2] this thread's share of the row sums
// (the whole sum: add the 4 lanes of the row, as tc_stage_output does), have_max (every row of
// the warp has a finite running max). A row's log-sum-exp in base 2 is m * scale_log2 + log2(sum);
// a backward pass keeps it.
// Interface:
//   init(): no key seen.
//   zero(s, rs): P = 0 and row sums 0 for an idle tile.
//   probs(s, rs, acc, scale_log2, pass, it) -> big: S -> P in place, rs the tile's row sums (this
//     thread's share); the running max moved and acc, l rescaled when it grows (not on the first
//     tile, it == 0); pass 0 is the lazy pass; true when the lazy pass must be redone.
//   tile_max(s, tmax, scale_log2) -> grow, rescale(acc, tmax, scale_log2, it), exps(s, rs, scale_log2) -> big:
//     probs' steps (the max path's row max and rescale, then the exponentials), for a caller that must
//     order the rescale itself (tc/loop_overlap.cuh).
//   add(rs): l += rs.
#pragma once
#include "tc/common.cuh"

#define RESCALE_LOG2 8.f
// a thread's sum of a row's exponentials (taken against the running max) above which the tile is
// redone against its own max: every exponential stays below float16's largest value (65504)
#define LAZY_SUM_MAX 32768.f

struct TcSoftmax {
    TcRows m, l;
    bool have_max;

    __device__ __forceinline__ void init() {
#pragma unroll
        for (int i = 0; i < MT; ++i) {
            m[i][0] = m[i][1] = AB_NEG_INF;
            l[i][0] = l[i][1] = 0.f;
        }
        have_max = false;
    }

    // P = 0 for an idle tile (no allowed key in the warp's rows), its row sums 0
    static __device__ __forceinline__ void zero(TcS& s, TcRows& rs) {
#pragma unroll
        for (int i = 0; i < MT; ++i) {
            rs[i][0] = rs[i][1] = 0.f;
#pragma unroll
            for (int j = 0; j < BN / 8; ++j) s[i][j][0] = s[i][j][1] = s[i][j][2] = s[i][j][3] = 0.f;
        }
    }

    // S -> P in place for a tile with allowed keys (see the interface above)
    __device__ __forceinline__ bool probs(TcS& s, TcRows& rs, TcAcc& acc, float scale_log2, int pass, int it) {
        // first pass: the exponentials against the running max of earlier tiles, no row max of this
        // one (a warp whose every row has one); the caller's vote redoes the tile through the max
        // path if some sum grew past LAZY_SUM_MAX
        const bool fast = LAZY && pass == 0 && have_max;
        if (!fast) {
            // the tile's row max, a rescale only if some row's max grew by more than 2^RESCALE_LOG2
            float tmax[MT][2];
            // (a warp's first tile: acc and l are still 0, only the max moves)
            if (tile_max(s, tmax, scale_log2)) rescale(acc, tmax, scale_log2, it);
            if (LAZY) {
                bool fin = true;
#pragma unroll
                for (int i = 0; i < MT; ++i) fin &= m[i][0] != AB_NEG_INF && m[i][1] != AB_NEG_INF;
                have_max = __all_sync(0xffffffffu, fin);
            }
        }
        return exps(s, rs, scale_log2) && fast;
    }

    // The tile's row max (tmax), and whether some row of the warp grew past its running max by more
    // than 2^RESCALE_LOG2 (a row's first allowed key too, its m being -inf)
    __device__ __forceinline__ bool tile_max(const TcS& s, float (&tmax)[MT][2], float scale_log2) const {
        bool grow = false;
#pragma unroll
        for (int i = 0; i < MT; ++i) {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                float mx = AB_NEG_INF;
#pragma unroll
                for (int j = 0; j < BN / 8; ++j) mx = fmaxf(mx, fmaxf(s[i][j][2 * r], s[i][j][2 * r + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                tmax[i][r] = mx;
                grow |= (mx - m[i][r]) * scale_log2 > RESCALE_LOG2;
            }
        }
        return __any_sync(0xffffffffu, grow);
    }

    // The running max moved up to the tile's; acc and l rescaled to it (not on the first tile, it == 0,
    // where they are still 0)
    __device__ __forceinline__ void rescale(TcAcc& acc, const float (&tmax)[MT][2], float scale_log2, int it) {
#pragma unroll
        for (int i = 0; i < MT; ++i) {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const float mx = fmaxf(m[i][r], tmax[i][r]);
                // no allowed key yet: alpha stays 1 (l and acc are 0 anyway), never NaN
                const float alpha = mx == AB_NEG_INF ? 1.f : tc_exp2((m[i][r] - mx) * scale_log2);
                m[i][r] = mx;
                if (it > 0) {
                    l[i][r] *= alpha;
#pragma unroll
                    for (int d = 0; d < HEAD_D / 8; ++d) {
                        acc[i][d][2 * r] *= alpha;
                        acc[i][d][2 * r + 1] *= alpha;
                    }
                }
            }
        }
    }

    // S -> P in place against the running max as it stands, rs the row sums; true when a sum passed
    // LAZY_SUM_MAX. probs' last step, and the lazy pass alone where acc must not be touched
    // (tc/loop_overlap.cuh: P V of the tile before is writing it).
    __device__ __forceinline__ bool exps(TcS& s, TcRows& rs, float scale_log2) const {
        bool big = false;
#pragma unroll
        for (int i = 0; i < MT; ++i) {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                // no allowed key yet: subtract 0 instead of -inf so exp2 gives 0, never NaN
                const float ms = (m[i][r] == AB_NEG_INF) ? 0.f : m[i][r] * scale_log2;
                float sum = 0.f;
#pragma unroll
                for (int j = 0; j < BN / 8; ++j) {
                    const float a = tc_exp2(fmaf(s[i][j][2 * r], scale_log2, -ms));
                    const float b = tc_exp2(fmaf(s[i][j][2 * r + 1], scale_log2, -ms));
                    s[i][j][2 * r] = a;
                    s[i][j][2 * r + 1] = b;
                    sum += a + b;
                }
                rs[i][r] = sum;
                big |= !(sum <= LAZY_SUM_MAX);  // (a NaN or infinite sum too)
            }
        }
        return big;
    }

    // the running row sums (this thread's share) += the tile's
    __device__ __forceinline__ void add(const TcRows& rs) {
#pragma unroll
        for (int i = 0; i < MT; ++i) {
            l[i][0] += rs[i][0];
            l[i][1] += rs[i][1];
        }
    }
};
