// The forward's walk with the products overlapped (OV 1; WG and TMA builds, STAGES >= 3): at step it,
// S = Q K^T of tile it and O += P V of tile it - 1 are issued together, the wait returns once S is
// done, and the mask and the softmax of tile it run while P V of tile it - 1 is still on the tensor
// cores. Then P V's wait, and tile it's P goes to the registers the next step's P V reads.
// - The stages: P V of tile it - 1 reads its V until step it ends, so step it refills the stage of
//   tile it - 2 with tile it + STAGES - 2 (one tile less ahead than TcLoopSerial, hence STAGES >= 3).
//   Step 0 loads nothing: first_tiles brought tiles 0 .. STAGES - 2.
// - The accumulators: P V of tile it - 1 writes them until its wait, so the softmax may rescale them
//   only after it. Every tile takes its row max (no lazy pass, whose redo would take S again with P V
//   in flight; ptxas serialises the wgmma then), and a tile whose max moved by more than 2^RESCALE_LOG2
//   waits for P V before it rescales; the others overlap it whole.
// - Each step ends by releasing tile it - 1's stage (Load::release: nothing for TcLoadTma, whose next refill
//   waits on a block barrier; an arrival per warp for TcLoadTmaReleased, REL 1, tc/load_released.cuh). With K
//   and V on stages of their own (KVS 1, tc/load_split.cuh) K of tile it + STAGES - 1 is loaded at step it
//   (refill_k), K of tile it released once S has read it (release_k), and P V waits for V (wait_v).
// - Turns (tc/turns.cuh) orders the warpgroups' issues: as they come (TcTurnsAny), or in turn (PP 1).
// Interface: TcLoopSerial's (tc/loop.cuh).
#pragma once
#include "tc/loop.cuh"
#include "tc/turns.cuh"

template <class Mma, class Load, class Turns = TcTurnsAny>
struct TcLoopOverlap {
    static_assert(WG && TMA && STAGES >= 3 && MT == 1, "OV: the wgmma products, TMA loads and 3 stages or more");

    // the pattern's mask on a partial tile (and a tile past a class's end); true when no row of the
    // warp has an allowed key in it
    static __device__ __forceinline__ bool mask(TcS& s, int ent, int kt, const AB_PATTERN_T& pat, int row0, int T,
                                                int g, int t4) {
        if (!((ent & 1) || (STRIDE > 1 && kt * BN + BN > T))) return false;
        return tc_mask_idle(tc_mask_frag(s[0], pat, row0, kt * BN, T, g, t4));
    }

    // The walk's state between steps
    struct State {
        u32 phase = 0;             // parity of the stage barriers' current phase
        int st = 0;                // the stage tile `it` sits in
        int st_fill = STAGES - 2;  // the stage tile `it + STAGES - 2` goes to (tile it - 2's)
        int st_prev = 0;           // the stage of tile it - 1, whose P V is in flight during step it
        typename Mma::TcP pa;      // tile it - 1's P, P V's operand
    };

    // Step it (FIRST: it = 0, no P V before it). A template, so that P V's issue is not under a branch
    // whose join would copy the accumulators while P V writes them (ptxas then serialises the wgmma).
    template <bool FIRST>
    static __device__ __forceinline__ void step(State& w, int it, TcAcc& acc, TcSoftmax& sf, const typename Mma::Ops& op,
                                                TcTileList& list, int n, u32 bar, const TcSmem& sm, const TcGlobal& gm,
                                                const int* __restrict__ tent, int T, int row0, int g, int t4,
                                                const AB_PATTERN_T& pat, float scale_log2) {
        int ent_nx, ent_far;
        const int ent = list.next_near(tent, it, ent_nx, ent_far);
        Load::refill_k(sm, gm, bar, ent_far, it + STAGES - 1, n);  // (KVS 1: K a tile ahead of V; else nothing)
        Load::refill(sm, gm, T, bar, w.st, w.st_fill, w.phase, ent_nx, it + STAGES - 2, FIRST ? 0 : n);
        w.st_fill = w.st_fill == STAGES - 1 ? 0 : w.st_fill + 1;
        const int kt = tc_entry_tile(ent), sc = w.st;
        if (w.st == STAGES - 1) w.phase ^= 1;
        w.st = w.st == STAGES - 1 ? 0 : w.st + 1;

        TcS s;
        TcRows rs;  // this tile's row sums, this thread's share
        Turns::before();
        Mma::qk_issue(s, op, sc);
        if (FIRST) {
            Turns::after(it, n);
            wg_wait<0>();
        } else {
            Load::wait_v(bar, it - 1);                 // (KVS 1: V has its own barrier; else it came with K)
            Mma::pv_issue(acc, w.pa, op, w.st_prev);  // tile it - 1's
            Turns::after(it, n);
            wg_wait<1>();                              // S is done (the groups complete in order)
        }
        Load::release_k(bar, sc);  // S has read K of tile it (KVS 1; else K goes with V's release)
        if (mask(s, ent, kt, pat, row0, T, g, t4)) {
            TcSoftmax::zero(s, rs);  // no allowed key in the warp's rows: P = 0
        } else {
            // the max path on every tile (no lazy pass: its redo would take S again with P V in flight):
            // the row max overlaps P V, and only a tile whose max moved waits for P V to rescale acc
            float tmax[MT][2];
            if (sf.tile_max(s, tmax, scale_log2)) {
                wg_wait<0>();
                sf.rescale(acc, tmax, scale_log2, it);
            }
            sf.exps(s, rs, scale_log2);
        }
        sf.add(rs);
        wg_wait<0>();  // P V of tile it - 1 is done: its P registers and its stage are free
        if (!FIRST) Load::release(bar, w.st_prev);
        Mma::p_frags(w.pa, s);
        w.st_prev = sc;
    }

    static __device__ __forceinline__ void run(TcAcc& acc, TcSoftmax& sf, const typename Mma::Ops& op, TcTileList& list,
                                               int n, u32 bar, const TcSmem& sm, const TcGlobal& gm,
                                               const int* __restrict__ tent, int T, int qt, int warp, int g, int t4,
                                               const AB_PATTERN_T& pat, float scale_log2) {
        const int row0 = qt * BM + warp * RW;
        State w;
        Turns::start(n);
        if (n > 0) step<true>(w, 0, acc, sf, op, list, n, bar, sm, gm, tent, T, row0, g, t4, pat, scale_log2);
        for (int it = 1; it < n; ++it)
            step<false>(w, it, acc, sf, op, list, n, bar, sm, gm, tent, T, row0, g, t4, pat, scale_log2);
        if (n > 0) {
            Load::wait_v(bar, n - 1);
            Mma::pv_issue(acc, w.pa, op, w.st_prev);
            wg_wait<0>();
            Load::release(bar, w.st_prev);
        }
        Load::drain();
    }
};
