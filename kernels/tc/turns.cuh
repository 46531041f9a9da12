// The order in which a block's warpgroups issue their products in the overlapped walk (tc/loop_overlap.cuh).
// TcTurnsAny: as they come (every build but PP 1). TcTurnsPingpong (PP 1; with REL, two to four warpgroups):
// they take turns, FlashAttention-3's ping-pong. Warpgroup w issues a step's products (S of tile it, P V of
// tile it - 1) only after warpgroup w - 1 (the last one for w = 0) has issued its own for the same step, so
// that one warpgroup's softmax runs while the other's products hold the tensor cores.
// - A turn is a named barrier a warpgroup (ids TC_TURN_BAR0 + w) of 256 threads: warpgroup w's 128 wait on it
//   (bar.sync) and its predecessor's 128 arrive (bar.arrive) once they have issued.
// - Warpgroup 0 goes first: its predecessor arrives once before the walk (start). The predecessor also skips its
//   arrival after the walk's last step, so that every barrier's arrivals and waits pair up by the block's end.
// - Every warpgroup walks the same list (they share the key tiles), so each takes n turns. With REL the
//   warpgroups meet nowhere else in the walk: thread 0's refill waits only for stages released a step or more
//   earlier, which the turns never hold back.
// Interface: start(n), before(), after(it, n): around a step's issue of its products.
#pragma once
#include "tc/config.cuh"

#ifndef TC_TURN_BAR0
#define TC_TURN_BAR0 8  // named barriers 8 .. 8 + warpgroups - 1 (0 is __syncthreads')
#endif

struct TcTurnsAny {
    static __device__ __forceinline__ void start(int) {}
    static __device__ __forceinline__ void before() {}
    static __device__ __forceinline__ void after(int, int) {}
};

struct TcTurnsPingpong {
    static constexpr int NWG = NWARPS / 4;  // two to four (tc/config.cuh's rule for PP)

    static __device__ __forceinline__ int wg() { return (int)(threadIdx.x / 128); }
    static __device__ __forceinline__ void arrive_next() {
        const int next = wg() + 1 == NWG ? 0 : wg() + 1;
        asm volatile("bar.arrive %0, 256;\n" :: "r"(TC_TURN_BAR0 + next) : "memory");
    }
    static __device__ __forceinline__ void start(int n) {
        if (n > 0 && wg() == NWG - 1) arrive_next();  // warpgroup 0's first turn
    }
    static __device__ __forceinline__ void before() {
        asm volatile("bar.sync %0, 256;\n" :: "r"(TC_TURN_BAR0 + wg()) : "memory");
    }
    static __device__ __forceinline__ void after(int it, int n) {
        if (!(wg() == NWG - 1 && it == n - 1)) arrive_next();  // the last warpgroup's last turn hands on nothing
    }
};
