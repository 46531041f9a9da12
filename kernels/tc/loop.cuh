// The forward's walk over a query tile's key tiles (TcLoopSerial): for each, its stage refilled (tile
// it + STAGES - 1 into the stage tile it - 1 left) and waited for, S = Q K^T, the pattern's mask on
// partial tiles, the online softmax (the lazy pass redone through the max path when a vote says
// so), then O += P V, and the warp releases the stage (Load::release: REL 1's arrival, else nothing).
// Each product is waited for before the step after it. tc/loop_overlap.cuh
// keeps the same interface with the products overlapped (OV 1).
// Interface:
//   run(acc, sf, op, list, n, bar, sm, gm, tent, T, qt, warp, g, t4, pat, scale_log2): the query tile's
//     whole list into acc and sf (its n tiles, list.n read before first_tiles; list and the first stages
//     as first_tiles left them).
#pragma once
#include "tc/mask.cuh"
#include "tc/softmax.cuh"

template <class Mma, class Load>
struct TcLoopSerial {
    static __device__ __forceinline__ void run(TcAcc& acc, TcSoftmax& sf, const typename Mma::Ops& op, TcTileList& list,
                                               int n, u32 bar, const TcSmem& sm, const TcGlobal& gm,
                                               const int* __restrict__ tent, int T, int qt, int warp, int g, int t4,
                                               const AB_PATTERN_T& pat, float scale_log2) {
        u32 phase = 0;              // parity of the stage barriers' current phase (TMA)
        int st = 0;                 // the stage tile `it` sits in
        int st_fill = STAGES - 1;   // the stage tile `it + STAGES - 1` goes to
        for (int it = 0; it < n; ++it) {
            const int nx = it + STAGES - 1;
            int ent_nx;
            const int ent = list.next(tent, it, ent_nx);
            Load::refill(sm, gm, T, bar, st, st_fill, phase, ent_nx, nx, n);
            st_fill = st_fill == STAGES - 1 ? 0 : st_fill + 1;
            const int kt = tc_entry_tile(ent), sc = st;
            if (st == STAGES - 1) phase ^= 1;
            st = st == STAGES - 1 ? 0 : st + 1;

            TcS s;
            TcRows rs;  // this tile's row sums, this thread's share
            bool idle;  // no row of this warp has an allowed key in the tile: P = 0, no softmax
            for (int pass = 0;; ++pass) {
                Mma::qk(s, op, sc);
                // a tile reaching past this class's end is partial too (the list is built for the longest)
                idle = false;
                if ((ent & 1) || (STRIDE > 1 && kt * BN + BN > T)) {
                    unsigned seen = 0;
#pragma unroll
                    for (int m = 0; m < MT; ++m) seen |= tc_mask_frag(s[m], pat, qt * BM + warp * RW + m * 16, kt * BN, T, g, t4);
                    idle = tc_mask_idle(seen);
                }
                bool big = false;
                if (idle)
                    TcSoftmax::zero(s, rs);
                else
                    big = sf.probs(s, rs, acc, scale_log2, pass, it);
                if (!LAZY || !Mma::vote(big)) break;
            }  // pass
            sf.add(rs);
            Mma::pv(acc, s, op, sc, idle);  // O += P V
            Load::release(bar, sc);         // the warp is done with the tile's stage (REL 1; else nothing)
        }
        Load::drain();
    }
};
