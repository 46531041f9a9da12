// Tile classification (attnbench/classify.py): for every (query tile, key tile) of a BM x BN grid,
// the number of allowed pairs of any pattern compiled in (AB_PATTERN_T, its parameters at run time
// from pargs, as in predicate.cu), and the allowed keys of every row. The host turns the counts into
// a tile list: a tile with no pair is skipped, one whose every pair (i < T, j < T) is allowed is full,
// the others partial. This is how the custom pattern, which has no key intervals, gets its lists.
//
// Grid (query tiles, G); block y takes the key tiles y, y + G, ... and gives each of its warps whole
// tiles in turn: a lane takes 32-key words of the tile's rows, evaluates their pairs (ab_allowed,
// the causal clause included) into a bit mask and counts it with __popc; the warp sums its lanes
// with shuffles, lane 0 writes the tile's count. Row counts go to shared memory a word at a time and
// to global memory once per row and block. Causal: tiles wholly above the diagonal are not visited
// (their counts stay 0, the host zeroes the array). No atomics per pair.
#include "common.cuh"
#include "pattern.cuh"

extern "C" __global__ void __launch_bounds__(128)
classify_tiles(int causal, const int* __restrict__ pargs, const int* __restrict__ table, int T, int BM, int BN,
               int nk, int* __restrict__ counts, int* __restrict__ rows)
{
    const AB_PATTERN_T pat{AB_PATTERN_ARGS};
    extern __shared__ int row_acc[];  // BM
    const int qt = blockIdx.x;
    const int i0 = qt * BM, i_end = min(i0 + BM, T);
    for (int r = threadIdx.x; r < BM; r += blockDim.x) row_acc[r] = 0;
    __syncthreads();
    // causal: key tiles holding some j <= i_end - 1
    const int kt_end = causal ? min(nk, (i_end - 1) / BN + 1) : nk;
    const int wpr = (BN + 31) >> 5;  // 32-key words per row of a tile
    const int words = (i_end - i0) * wpr;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    for (int kt = blockIdx.y + gridDim.y * warp; kt < kt_end; kt += gridDim.y * nwarps) {
        const int j_tile = kt * BN, j_end = min(j_tile + BN, T);
        int n = 0;
        for (int w = lane; w < words; w += 32) {
            const int r = w / wpr, j0 = j_tile + 32 * (w - r * wpr);
            const int nb = min(32, j_end - j0);
            unsigned m = 0;
            for (int b = 0; b < nb; ++b) m |= (unsigned)ab_allowed(pat, i0 + r, j0 + b) << b;
            const int c = __popc(m);
            n += c;
            if (c) atomicAdd(&row_acc[r], c);
        }
        for (int o = 16; o; o >>= 1) n += __shfl_xor_sync(0xffffffffu, n, o);
        if (lane == 0) counts[(size_t)qt * nk + kt] = n;
    }
    __syncthreads();
    for (int r = threadIdx.x; r < i_end - i0; r += blockDim.x)
        if (row_acc[r]) atomicAdd(&rows[i0 + r], row_acc[r]);
}
