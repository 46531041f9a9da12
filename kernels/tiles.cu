// Tile-list expansion (attnbench/tiles.py): the host builds a list as runs of consecutive key
// tiles with one flag; one launch here writes its entries and the list head of every query tile.
//
// packed (int32, one upload): ptr[nq + 1] | run_off[n_runs] | run_base[n_runs], where entry e of
// the run r holding it (the last r with run_off[r] <= e) is run_base[r] + 2 e.
// Threads [0, n) write entries[e]; threads [n, n + nq) write heads[q] = {first entry's index,
// count, first entry, second entry} (0 past the end of the list), fast_tc's one read before its
// first loads. No compile-time constants.

__device__ __forceinline__ int tiles_entry(const int* __restrict__ run_off, const int* __restrict__ run_base,
                                           int n_runs, int e)
{
    int lo = 0, hi = n_runs - 1;  // run_off[0] = 0 <= e
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (run_off[mid] <= e) lo = mid; else hi = mid - 1;
    }
    return run_base[lo] + 2 * e;
}

extern "C" __global__ void expand_tiles(const int* __restrict__ packed, int nq, int n_runs, int n,
                                        int* __restrict__ entries, int4* __restrict__ heads)
{
    const int* ptr = packed;
    const int* run_off = packed + nq + 1;
    const int* run_base = run_off + n_runs;
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < n) {
        entries[t] = tiles_entry(run_off, run_base, n_runs, t);
    } else if (t - n < nq) {
        const int q = t - n;
        const int s = ptr[q], c = ptr[q + 1] - s;
        heads[q] = make_int4(s, c, c > 0 ? tiles_entry(run_off, run_base, n_runs, s) : 0,
                             c > 1 ? tiles_entry(run_off, run_base, n_runs, s + 1) : 0);
    }
}
