// Bulk tensor copies with K and V on stages of their own (KVS 1; with REL and the overlapped walk,
// tc/loop_overlap.cuh): TcLoadTmaReleased with each stage's K and V completing on barriers of their own and
// released apart. S of tile it reads only K, and it is done a step before P V of the same tile, so K's stage is
// free a step earlier than V's, and K of tile it + STAGES - 1 can load at step it, while V of tile
// it + STAGES - 2 loads as before. K then arrives two steps ahead of its S instead of one.
// - The barriers after the V stages: Q's (bar), then STAGES "K full", STAGES "V full" (one arrival and the
//   copy's bytes a phase), STAGES "K empty", STAGES "V empty" (NWARPS arrivals a phase, one a warp).
// - first_tiles: Q and K and V of tiles 0 .. STAGES - 2, each on its own barrier.
// - refill_k(sm, gm, bar, ent, nx, n): K of tile nx = it + STAGES - 1 into stage nx % STAGES, once every warp
//   has released K of tile nx - STAGES there (step it - 1's S).
// - refill(..., st, st_fill, phase, ent_nx, nx, n): V of tile nx = it + STAGES - 2 into stage st_fill, once
//   every warp has released V of tile nx - STAGES (step it - 1's P V); then every thread waits for K of tile it
//   (stage st, parity phase).
// - wait_v(bar, t): V of tile t has landed (before its P V); release_k(bar, st) after S, release(bar, st) after
//   P V: the warp's arrival on the stage's K or V empty barrier.
// The phases: a stage's barriers complete once a tile, so tile t's is parity (t / STAGES) & 1, and the release of
// tile nx - STAGES that a refill waits for is parity (nx / STAGES - 1) & 1. As with REL alone, a warp cannot
// release K (or V) of tile nx before every warp has released tile nx - STAGES's, whose stage it is copied into.
// The refill's thread is REFILLER (tc/load_released.cuh's rule).
// Interface: TcLoadTma's with the overlapped walk's hooks (refill_k, wait_v, release_k).
#pragma once
#include "tc/load_released.cuh"

struct TcLoadTmaSplit : TcLoadTmaReleased {
    static __device__ __forceinline__ u32 full_k(u32 bar, int s) { return bar + 8 * (1 + s); }
    static __device__ __forceinline__ u32 full_v(u32 bar, int s) { return bar + 8 * (1 + STAGES + s); }
    static __device__ __forceinline__ u32 empty_k(u32 bar, int s) { return bar + 8 * (1 + 2 * STAGES + s); }
    static __device__ __forceinline__ u32 empty_v(u32 bar, int s) { return bar + 8 * (1 + 3 * STAGES + s); }

    __device__ __forceinline__ void begin() {
        if (threadIdx.x == 0) {
            tma_bar_init(bar, 1);
#pragma unroll
            for (int s = 0; s < STAGES; ++s) {
                tma_bar_init(full_k(bar, s), 1);
                tma_bar_init(full_v(bar, s), 1);
                tma_bar_init(empty_k(bar, s), NWARPS);
                tma_bar_init(empty_v(bar, s), NWARPS);
            }
            tma_bar_fence_init();
        }
        __syncthreads();  // the barriers are initialised before anyone (the copy engine too) uses them
    }

    __device__ __forceinline__ void first_tiles(const TcTileList& list) { first_tiles_by<TcLoadTmaSplit>(list); }

    // K and V rows row0.. into stage s, each completing on its own barrier
    static __device__ __forceinline__ void load_stage(const TcSmem& sm, const TcGlobal& gm, u32 bar, int s, int row0) {
        tma_load_rows(sm.k + s * TILE_BYTES, gm.mk, row0, full_k(bar, s));
        tma_load_rows(sm.v + s * TILE_BYTES, gm.mv, row0, full_v(bar, s));
    }

    static __device__ __forceinline__ void refill_k(const TcSmem& sm, const TcGlobal& gm, u32 bar, int ent, int nx,
                                                    int n) {
        if (threadIdx.x == REFILLER && nx < n) {
            const int s = nx % STAGES;
            if (nx >= STAGES) tma_wait(empty_k(bar, s), (u32)(nx / STAGES - 1) & 1);  // K of tile nx - STAGES released
            tma_load_rows(sm.k + s * TILE_BYTES, gm.mk, tc_entry_tile(ent) * BN, full_k(bar, s));
        }
    }

    static __device__ __forceinline__ void refill(const TcSmem& sm, const TcGlobal& gm, int T, u32 bar, int st,
                                                  int st_fill, u32 phase, int ent_nx, int nx, int n) {
        if (threadIdx.x == REFILLER && nx < n) {
            if (nx >= STAGES) tma_wait(empty_v(bar, st_fill), (u32)(nx / STAGES - 1) & 1);  // V of tile nx - STAGES
            tma_load_rows(sm.v + st_fill * TILE_BYTES, gm.mv, tc_entry_tile(ent_nx) * BN, full_v(bar, st_fill));
        }
        tma_wait(full_k(bar, st), phase);  // K of tile `it` has landed
    }

    static __device__ __forceinline__ void wait_v(u32 bar, int t) {
        tma_wait(full_v(bar, t % STAGES), (u32)(t / STAGES) & 1);
    }

    static __device__ __forceinline__ void release_k(u32 bar, int st) { tma_warp_arrive(empty_k(bar, st)); }
    static __device__ __forceinline__ void release(u32 bar, int st) { tma_warp_arrive(empty_v(bar, st)); }
};
