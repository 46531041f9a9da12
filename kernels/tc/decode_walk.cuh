// A split's walk over its stretch of the list (kernels/decode.cu, DecodeWalkSerial): for each key tile, its stage
// refilled (tile it + STAGES - 1 into the stage tile it - 1 left) and waited for, then decode_tile: S = Q K^T, the
// pattern's mask at each row's own position on a partial tile, the online softmax and O += P V, each product waited
// for before the next. tc/decode_overlap.cuh keeps the interface with the products of consecutive tiles in flight
// together (DECODE_OV 1).
// Interface:
//   run(acc, sf, op, list, ents, n, sm, gm, Tb, pat, slice, pos_a, pos_b, t4, scale_log2): the split's n tiles
//     into acc and sf (list and the first stages as the loader's first_tiles left them; a tile's first key is
//     (tile * KWG + slice) * BN: with KWG 2 the warpgroup's slice of the stage).
#pragma once
#include "tc/decode_common.cuh"

template <class Mma, class Load>
struct DecodeWalkSerial {
    template <class P>
    static __device__ __forceinline__ void run(TcAcc& acc, TcSoftmax& sf, const typename Mma::Ops& op,
                                               TcTileList& list, const DecodeEntries& ents, int n, const TcSmem& sm,
                                               const TcGlobal& gm, int Tb, const P& pat, int slice, int pos_a,
                                               int pos_b, int t4, float scale_log2) {
        int st = 0, st_fill = STAGES - 1;
        for (int it = 0; it < n; ++it) {
            const int nx = it + STAGES - 1;
            int ent_nx;
            const int ent = list.next(ents, it, ent_nx);
            Load::refill(sm, gm, Tb, 0, st, st_fill, 0, ent_nx, nx, n);
            st_fill = st_fill == STAGES - 1 ? 0 : st_fill + 1;
            const int sc = st;
            st = st == STAGES - 1 ? 0 : st + 1;
            decode_tile<Mma>(acc, sf, op, pat, ent, sc, decode_key0(ent, slice), pos_a, pos_b, Tb, t4, scale_log2, it);
        }
        Load::drain();
    }
};
