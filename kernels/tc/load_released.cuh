// Bulk tensor copies whose stages the warps release (REL 1; either walk, tc/loop.cuh or tc/loop_overlap.cuh):
// TcLoadTma (tc/mainloop_wgmma.cuh) with the block barrier of each refill replaced by a barrier per stage
// that counts the warps done with it. The warpgroups of a block then wait for each other only through the
// stage a refill needs, not at every tile.
// - After the stage barriers (Q's, then one per stage, as TcLoadTma's) come STAGES more, "empty": stage s's
//   at bar + 8 (STAGES + 1 + s), expecting NWARPS arrivals a phase, one a warp.
// - release(bar, st): a warp whose products have read stage st for the last time (the walk calls it after
//   P V's wait) arrives on the stage's empty barrier, from lane 0 after the warp's lanes meet.
// - refill: one thread (REFILLER) refills stage st_fill with tile nx once every warp has released the tile
//   before it there, tile nx - STAGES (the phase (nx / STAGES - 1) of the empty barrier); every thread then
//   waits for tile it as TcLoadTma does. REFILLER is thread 0, or with PP (the warpgroups in turn,
//   tc/turns.cuh) the last warpgroup's first thread: its turn comes last, so the releases it waits for are
//   its own warps' and those of warpgroups ahead of it, and the wait holds back no one else's turn.
// - A warp cannot release tile nx before every warp has released tile nx - STAGES (tile nx is copied only
//   after that), so no arrival counts toward another tile's phase.
// - The serial walk (tc/loop.cuh) refills tile it - 1's stage at step it (nx = it + STAGES - 1), the overlapped
//   one tile it - 2's (nx = it + STAGES - 2); the phase above holds for both. In the serial walk the lazy pass's
//   vote is the warpgroup's under REL (TcMmaWgmma::vote), so no block barrier is left there either.
// Interface: TcLoadTma's (init, begin, first_tiles, refill, release, drain); bar: the barriers (init's).
#pragma once
#include "tc/mainloop_wgmma.cuh"

struct TcLoadTmaReleased : TcLoadTma {
    enum { REFILLER = PP ? THREADS - 128 : 0 };  // (an enum: no symbol in the module)

    static __device__ __forceinline__ u32 empty(u32 bar, int st) { return bar + 8 * (STAGES + 1 + st); }

    __device__ __forceinline__ void begin() {
        if (threadIdx.x == 0) {
#pragma unroll
            for (int s = 0; s <= STAGES; ++s) tma_bar_init(bar + 8 * s, 1);
#pragma unroll
            for (int s = 0; s < STAGES; ++s) tma_bar_init(empty(bar, s), NWARPS);
            tma_bar_fence_init();
        }
        __syncthreads();  // the barriers are initialised before anyone (the copy engine too) uses them
    }

    static __device__ __forceinline__ void refill(const TcSmem& sm, const TcGlobal& gm, int T, u32 bar, int st,
                                                  int st_fill, u32 phase, int ent_nx, int nx, int n) {
        if (threadIdx.x == REFILLER && nx < n) {
            if (nx >= STAGES) tma_wait(empty(bar, st_fill), (u32)(nx / STAGES - 1) & 1);  // tile nx - STAGES released
            tma_load_kv(sm.k + st_fill * TILE_BYTES, sm.v + st_fill * TILE_BYTES, gm.mk, gm.mv, tc_entry_tile(ent_nx) * BN,
                        bar + 8 * (st_fill + 1));
        }
        tma_wait(bar + 8 * (st + 1), phase);  // tile `it` has landed
    }

    static __device__ __forceinline__ void release(u32 bar, int st) { tma_warp_arrive(empty(bar, st)); }
};
