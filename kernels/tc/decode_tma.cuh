// DECODE_TMA 1 (kernels/decode.cu, the rows kernel on warpgroup MMA with one warpgroup on a block's rows): the K and
// V tiles of a split come by bulk tensor copies (kernels/tma.cuh) instead of a cp.async per 16-byte chunk per
// thread. Thread 0 issues a tile's copies (K's and V's 64-column panels, the copy engine applying the 128-byte
// swizzle the warpgroup MMA reads), each stage completing on an mbarrier of its own past the V stages; the block
// waits on the barrier's phase. Q still comes by cp.async, the block's one commit group.
// The maps view K and V as [B * H_kv][Tk][HEAD_D] (attnbench/tma.py head_maps) in boxes of BN rows: rows at Tk and
// past it read as 0, as the cp.async loads fill them. Rows of a sequence's cache past its own length would be read
// as they are, so the host takes this loader for batches of one length only, and for unstrided lists (STRIDE 1:
// the map's rows are the cache's); a partial tile's rows outside its span are loaded too (the mask zeroes their P).
// Tile t of a split sits in stage t % STAGES, whose barrier completes once for each tile it takes: tile t's phase
// is (t / STAGES) & 1. The loader counts the tiles it has waited for, so both walks (tc/decode_walk.cuh,
// tc/decode_overlap.cuh) keep their calls.
// With KV_EVICT 1 the copies carry the evict-first L2 policy the cp.async loads take (tc_evict_first_policy).
// Interface: TcLoadAsync's as the walks use it (init, first_tiles, refill, wait_tile<PENDING>, load_next, drain),
// on an instance (the barriers, the tile count and the key/value head's plane in the maps are its own).
#pragma once
#include "tc/common.cuh"

static_assert(WG && KWG == 1 && STRIDE == 1, "DECODE_TMA: the warpgroup MMA build, one warpgroup a block, unstrided");

template <class Mma>
struct DecodeLoadTma {
    TcSmem sm;
    TcGlobal gm;
    int plane;    // the key/value head's plane in the maps: b * H_kv + kvh
    u32 bar;      // the stages' barriers, after the V stages
    int waited;   // tiles waited for so far (the next one's stage and phase)
    unsigned long long policy;  // KV_EVICT 1: the copies' L2 policy

    __device__ __forceinline__ void init(const TcSmem& sm_, const TcGlobal& gm_, const TcWork& w) {
        sm = sm_;
        gm = gm_;
        plane = (int)w.bh;
        bar = sm.v + STAGES * TILE_BYTES;
        waited = 0;
        policy = KV_EVICT ? tc_evict_first_policy() : 0ull;
    }

    __device__ __forceinline__ void copy(u32 dst, const TmaMap* map, int col, int row0, u32 b) const {
        if (KV_EVICT)
            tma_load3_hint(dst, map, col, row0, plane, b, policy);
        else
            tma_load3(dst, map, col, row0, plane, b);
    }

    // K and V rows row0.. into stage s, completing on its barrier (thread 0's)
    __device__ __forceinline__ void load_stage(int s, int ent) const {
        const u32 b = bar + 8 * s;
        const int row0 = tc_entry_tile(ent) * BN;
        tma_expect(b, 2 * TILE_BYTES);
#pragma unroll
        for (int pn = 0; pn < HEAD_D / 64; ++pn) {
            copy(sm.k + s * TILE_BYTES + pn * BN * 128, gm.mk, pn * 64, row0, b);
            copy(sm.v + s * TILE_BYTES + pn * BN * 128, gm.mv, pn * 64, row0, b);
        }
    }

    // the barriers, the list's first STAGES - 1 tiles, then Q's commit group waited for by every thread
    __device__ __forceinline__ void first_tiles(const TcTileList& list) {
        if (threadIdx.x == 0) {
#pragma unroll
            for (int s = 0; s < STAGES; ++s) tma_bar_init(bar + 8 * s, 1);
            tma_bar_fence_init();
#pragma unroll
            for (int s = 0; s < STAGES - 1; ++s)
                if (s < list.n) load_stage(s, list.ring[s]);
        }
        tc_wait<0>();  // Q's rows, the block's only cp.async group
        Mma::fence_loads();
        __syncthreads();  // Q and the barriers' initialisation are visible to all
    }

    // the serial walk's refill: every warp is past tile it - 1 (whose stage is refilled), thread 0 loads tile nx
    // (entry ent_nx) into stage st_fill when nx < n, and all wait for tile it
    __device__ __forceinline__ void refill(const TcSmem&, const TcGlobal&, int, u32, int, int st_fill, u32, int ent_nx,
                                           int nx, int n) {
        __syncthreads();
        if (threadIdx.x == 0 && nx < n) load_stage(st_fill, ent_nx);
        wait_landed();
    }

    // the overlapped walk's halves: every warp past the step before (the stage refilled next is free) and the next
    // tile landed ...
    template <int PENDING>
    __device__ __forceinline__ void wait_tile() {
        __syncthreads();
        wait_landed();
    }
    // ... then tile nx (entry ent_nx) into stage st_fill when nx < n
    __device__ __forceinline__ void load_next(const TcSmem&, const TcGlobal&, int, int st_fill, int ent_nx, int nx,
                                              int n) {
        if (threadIdx.x == 0 && nx < n) load_stage(st_fill, ent_nx);
    }

    // the next tile's barrier phase completed: its K and V are in shared memory
    __device__ __forceinline__ void wait_landed() {
        const int s = waited % STAGES;
        tma_wait(bar + 8 * s, (u32)(waited / STAGES) & 1u);
        ++waited;
    }

    static __device__ __forceinline__ void drain() {}
};
