// Document tile lists on the device (attnbench/document_tiles.py): from the document boundaries,
// one launch writes what the forward kernels read of a document mask: the position table of the
// predicate (kernels/patterns/document.cuh) and the tile list, CSR ptr, entries kt << 1 | partial
// and the heads of every query tile (as kernels/tiles.cu writes them), the same list as the host's
// closed form (Document.tile_bounds in attnbench/patterns/document.py).
//
// bounds[ndocs + 1]: each document's start, then T. A row's keys are one interval [lo, hi) that
// holds the row, and lo and hi never decrease along the rows, so a query tile's keys are
// [lo(first row), hi(last row)) and what every row of it allows [lo(last row), hi(first row)).
//
// Grid: every block writes table rows (grid-stride, a binary search over bounds per row); block b
// also owns query tiles [b * DT_CHUNK, (b + 1) * DT_CHUNK): it sums the entry counts of the tiles
// before its own (each block redundantly: a few thousand bounds), scans its own in shared memory,
// writes their ptr and heads, then a warp per tile writes the tile's entries, 32 at a time.
// Entries at or past `cap` (the host's bound on the list's size) are not written.
#include "common.cuh"

#define DT_THREADS 512
#define DT_CHUNK 128
#define DT_WARPS (DT_THREADS / 32)
#define DT_SMEM_BOUNDS 4096  // boundaries kept in shared memory, at most (16 KiB)

// the boundaries in shared memory where they fit: each binary search (two per query tile, one per
// table row) then costs shared-memory latency, not L2's
__shared__ int dt_sbounds[DT_SMEM_BOUNDS];

struct ab_doc_band {
    const int* bounds;  // global memory
    int ndocs, T, BM, BN, window, causal;
    bool shared;        // read them from dt_sbounds

    __device__ __forceinline__ int at(int d) const { return shared ? dt_sbounds[d] : __ldg(bounds + d); }

    // the document holding row i: the last d with bounds[d] <= i
    __device__ __forceinline__ int doc(int i) const {
        int lo = 0, hi = ndocs - 1;
        while (lo < hi) {
            const int mid = (lo + hi + 1) >> 1;
            if (at(mid) <= i) lo = mid; else hi = mid - 1;
        }
        return lo;
    }
    // row i's keys [lo, hi)
    __device__ __forceinline__ int2 span(int i) const {
        const int d = doc(i);
        int lo = at(d), hi = causal ? i + 1 : at(d + 1);
        if (window) {
            lo = max(lo, i - window + 1);
            hi = min(hi, i + window);
        }
        return make_int2(lo, hi);
    }
    // query tile q's key tiles: visited [ks, ke), full [fs, fe) (fe = fs when none is)
    __device__ __forceinline__ int4 tile(int q) const {
        const int r0 = q * BM, r1 = min(r0 + BM, T) - 1;
        const int2 a = span(r0), b = span(r1);
        const int ks = a.x / BN, ke = (b.y + BN - 1) / BN, fs = (b.x + BN - 1) / BN;
        return make_int4(ks, fs, max(a.y / BN, fs), ke);
    }
};

__device__ __forceinline__ int dt_entry(int4 t, int kt) { return kt << 1 | (kt < t.y || kt >= t.z); }

// the sum of v over the block (every thread gets it)
__device__ __forceinline__ int dt_block_sum(int v, int* scratch)
{
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
    __syncthreads();
    int s = 0;
    for (int w = 0; w < DT_WARPS; ++w) s += scratch[w];
    __syncthreads();
    return s;
}

// meta (int32, uploaded with the boundaries: two launch arguments in all, as each one costs the
// host's launch path time): ndocs, T, BM, BN, window, causal, nq, cap, then bounds [ndocs + 1].
// out (one allocation, int32): heads [nq][4] | table [T][2] | ptr [nq + 1] | entries [cap]
extern "C" __global__ void __launch_bounds__(DT_THREADS)
document_list(const int* __restrict__ meta, int* __restrict__ out)
{
    const int ndocs = meta[0], T = meta[1], BM = meta[2], BN = meta[3], window = meta[4], causal = meta[5],
              nq = meta[6], cap = meta[7];
    const bool in_smem = ndocs + 1 <= DT_SMEM_BOUNDS;
    if (in_smem)
        for (int d = threadIdx.x; d <= ndocs; d += DT_THREADS) dt_sbounds[d] = meta[8 + d];
    __syncthreads();
    int4* __restrict__ heads = reinterpret_cast<int4*>(out);
    int2* __restrict__ table = reinterpret_cast<int2*>(out + 4 * nq);
    int* __restrict__ ptr = out + 4 * nq + 2 * T;
    int* __restrict__ entries = ptr + nq + 1;
    const ab_doc_band band{meta + 8, ndocs, T, BM, BN, window, causal, in_smem};
    for (int i = blockIdx.x * DT_THREADS + threadIdx.x; i < T; i += gridDim.x * DT_THREADS) {
        const int d = band.doc(i);
        table[i] = make_int2(band.at(d), band.at(d + 1));
    }
    const int q0 = blockIdx.x * DT_CHUNK;
    if (q0 >= nq) return;  // the whole block: no barrier below is left half-met
    __shared__ int scratch[DT_WARPS];
    __shared__ int4 tiles[DT_CHUNK];
    __shared__ int start[DT_CHUNK + 1];
    int before = 0;
    for (int q = threadIdx.x; q < q0; q += DT_THREADS) {
        const int4 t = band.tile(q);
        before += t.w - t.x;
    }
    before = dt_block_sum(before, scratch);
    const int n_own = min(DT_CHUNK, nq - q0);
    // this block's tiles: an inclusive scan of their counts, a warp at a time, then across warps
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int c = 0;
    if (threadIdx.x < n_own) {
        const int4 t = band.tile(q0 + threadIdx.x);
        tiles[threadIdx.x] = t;
        c = t.w - t.x;
    }
    int incl = c;
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
    }
    if (lane == 31) scratch[warp] = incl;
    __syncthreads();
    for (int w = 0; w < warp; ++w) incl += scratch[w];
    if (threadIdx.x < n_own) {
        const int q = q0 + threadIdx.x, s = before + incl - c;
        start[threadIdx.x] = s;
        ptr[q] = s;
        if (q == nq - 1) ptr[nq] = s + c;
        const int4 t = tiles[threadIdx.x];
        heads[q] = make_int4(s, c, c > 0 ? dt_entry(t, t.x) : 0, c > 1 ? dt_entry(t, t.x + 1) : 0);
    }
    __syncthreads();
    for (int k = warp; k < n_own; k += DT_WARPS) {
        const int4 t = tiles[k];
        const int s = start[k];
        for (int e = lane; e < t.w - t.x; e += 32)
            if (s + e < cap) entries[s + e] = dt_entry(t, t.x + e);
    }
}
