// A split's walk with the products of consecutive tiles in flight together (DecodeWalkOverlap, DECODE_OV 1: the
// rows kernel on warpgroup MMA, kernels/decode.cu, 3 stages or more): tc/loop_overlap.cuh's order on decode's
// cp.async loads. At step it, S = Q K^T of tile it and O += P V of tile it - 1 are issued together; the wait returns
// once S is done, and the mask and the softmax of tile it run while P V of tile it - 1 is still on the tensor cores.
// A tile whose row max moved by more than 2^RESCALE_LOG2 waits for P V before it rescales O (every tile takes its
// max: the WG builds have no lazy pass). Then P V's wait, and tile it's P goes to the registers the next step's P V
// reads.
// - The stages: P V of tile it - 1 reads its V until step it ends, so step it refills the stage of tile it - 2 with
//   tile it + STAGES - 2, a tile less ahead than DecodeWalkSerial (tc/decode_walk.cuh). Step 0 loads nothing: the
//   loader's first_tiles brought tiles 0 .. STAGES - 2.
// - The commit groups: one a tile, tile t's the (t + 1)-th after Q's, and none at step 0; so before step it's load
//   tile it has landed once at most STAGES - 3 groups are in flight (STAGES - 2 at step 0). The barrier after that
//   wait (Load::wait_tile: the block's; with KWG 2 the warpgroup's, which alone reads its half of a stage) also
//   says every warp is past step it - 1, whose last wait was P V of tile it - 2: the stage refilled next is free.
// Interface: DecodeWalkSerial's.
#pragma once
#include "tc/decode_common.cuh"

template <class Mma, class Load>
struct DecodeWalkOverlap {
    static_assert(WG && STAGES >= 3 && MT == 1, "DECODE_OV: the warpgroup MMA build, 3 stages or more");

    struct State {
        int st = 0;                // the stage tile `it` sits in
        int st_fill = STAGES - 2;  // the stage tile `it + STAGES - 2` goes to (tile it - 2's)
        int st_prev = 0;           // the stage of tile it - 1, whose P V is in flight during step it
        typename Mma::TcP pa;      // tile it - 1's P, P V's operand
    };

    // Step it (FIRST: it = 0, no P V before it); a template, so that P V's issue is under no branch whose join
    // would copy the accumulators while P V writes them (ptxas then serialises the warpgroup MMA)
    template <bool FIRST, class P>
    static __device__ __forceinline__ void step(State& w, int it, TcAcc& acc, TcSoftmax& sf,
                                                const typename Mma::Ops& op, TcTileList& list,
                                                const DecodeEntries& ents, int n, const TcSmem& sm,
                                                const TcGlobal& gm, int Tb, const P& pat, int slice, int pos_a,
                                                int pos_b, int t4, float scale_log2) {
        int ent_nx, ent_far;
        const int ent = list.next_near(ents, it, ent_nx, ent_far);
        Load::template wait_tile<FIRST ? STAGES - 2 : STAGES - 3>();  // tile it has landed; tile it - 2's stage is free
        if (!FIRST) Load::load_next(sm, gm, Tb, w.st_fill, ent_nx, it + STAGES - 2, n);
        w.st_fill = w.st_fill == STAGES - 1 ? 0 : w.st_fill + 1;
        const int sc = w.st;
        w.st = w.st == STAGES - 1 ? 0 : w.st + 1;

        TcS s;
        TcRows rs;  // this tile's row sums, this thread's share
        Mma::qk_issue(s, op, sc);
        if (FIRST) {
            wg_wait<0>();
        } else {
            Mma::pv_issue(acc, w.pa, op, w.st_prev);  // tile it - 1's
            wg_wait<1>();                              // S is done (the groups complete in order)
        }
        bool idle = false;
        if (ent & 1) idle = tc_mask_idle(tc_mask_rows(s[0], pat, pos_a, pos_b, decode_key0(ent, slice), Tb, t4));
        if (idle) {
            TcSoftmax::zero(s, rs);  // no allowed key in the warp's rows: P = 0
        } else {
            float tmax[MT][2];
            if (sf.tile_max(s, tmax, scale_log2)) {
                wg_wait<0>();  // P V of tile it - 1 writes O until then
                sf.rescale(acc, tmax, scale_log2, it);
            }
            sf.exps(s, rs, scale_log2);
        }
        sf.add(rs);
        wg_wait<0>();  // P V of tile it - 1 is done: its P registers and its stage are free
        Mma::p_frags(w.pa, s);
        w.st_prev = sc;
    }

    template <class P>
    static __device__ __forceinline__ void run(TcAcc& acc, TcSoftmax& sf, const typename Mma::Ops& op,
                                               TcTileList& list, const DecodeEntries& ents, int n, const TcSmem& sm,
                                               const TcGlobal& gm, int Tb, const P& pat, int slice, int pos_a,
                                               int pos_b, int t4, float scale_log2) {
        State w;
        if (n > 0)
            step<true>(w, 0, acc, sf, op, list, ents, n, sm, gm, Tb, pat, slice, pos_a, pos_b, t4, scale_log2);
        for (int it = 1; it < n; ++it)
            step<false>(w, it, acc, sf, op, list, ents, n, sm, gm, Tb, pat, slice, pos_a, pos_b, t4, scale_log2);
        if (n > 0) {
            Mma::pv_issue(acc, w.pa, op, w.st_prev);
            wg_wait<0>();
        }
        Load::drain();
    }
};
