// KWG 2 (kernels/decode.cu: two warpgroups on the same rows, warpgroup w on keys w * BN .. of every stage of
// 2 x BN): each warpgroup loads the half of every stage that it alone reads, and waits for it on a barrier of its
// own 128 threads (bar.sync 1 + w), so the warpgroups meet only after their last tile (decode_kwg_merge).
// TcLoadAsync's block copies every stage with all its threads, so each tile waits there on a block barrier.
// The interface is TcLoadAsync's (tc/mainloop_sync.cuh); Q still comes by the block, waited on at the block
// barrier of wait_first().
#pragma once
#include "tc/mainloop_sync.cuh"

static_assert(KWG == 2 && THREADS == 256, "tc/decode_halves.cuh: two warpgroups sharing the stages");

template <class Mma>
struct DecodeLoadHalves : TcLoadAsync<Mma, KWG * BN> {
    typedef TcLoadAsync<Mma, KWG * BN> Base;

    // this warpgroup's BN rows of tile entry ent's K and V into stage s
    static __device__ __forceinline__ void load_half(const TcSmem& sm, const TcGlobal& gm, int T, int s, int ent) {
        Base::template load_stage<128, BN>(sm, gm, T, s, ent, threadIdx.x % 128, (int)(threadIdx.x / 128) * BN);
    }

    __device__ __forceinline__ void first_tiles(const TcTileList& list) {
#pragma unroll
        for (int s = 0; s < STAGES - 1; ++s) {
            if (s < list.n) load_half(this->sm, this->gm, this->T, s, list.ring[s]);
            tc_commit();
        }
        Base::wait_first();
    }

    static __device__ __forceinline__ void refill(const TcSmem& sm, const TcGlobal& gm, int T, u32 bar, int st,
                                                  int st_fill, u32 phase, int ent_nx, int nx, int n) {
        wait_tile<STAGES - 2>();
        load_next(sm, gm, T, st_fill, ent_nx, nx, n);
    }

    // TcLoadAsync's halves of refill, a warpgroup's: the wait, then this warpgroup's half of tile `it` is visible to
    // its four warps and its half of the stage refilled next, which only its own products read, is free ...
    template <int PENDING>
    static __device__ __forceinline__ void wait_tile() {
        tc_wait<PENDING>();
        Mma::fence_loads();
        asm volatile("bar.sync %0, 128;\n" :: "r"(1 + (int)(threadIdx.x / 128)) : "memory");
    }
    // ... and its half of tile nx (entry ent_nx) into stage st_fill when nx < n, a commit group either way
    static __device__ __forceinline__ void load_next(const TcSmem& sm, const TcGlobal& gm, int T, int st_fill,
                                                     int ent_nx, int nx, int n) {
        if (nx < n) load_half(sm, gm, T, st_fill, ent_nx);
        tc_commit();
    }
};
