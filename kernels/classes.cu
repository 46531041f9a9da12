// The class-major layout (attnbench/classes.py): rows of a [rows / T, T, row_bytes] array copied so
// that position c * n + a of the destination (n = T / r) is position a * r + c of the source
// (inverse 0: into the layout), or back (inverse 1). One 16-byte vector a thread, grid-stride; each
// row is `vecs` vectors. No compile-time constants.
extern "C" __global__ void class_major(const uint4* __restrict__ src, uint4* __restrict__ dst, int T, int r,
                                       int vecs, long long total, int inverse)
{
    const int n = T / r;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
        const long long row = e / vecs;
        const int v = (int)(e - row * vecs);
        const long long seq = row / T;
        const int p = (int)(row - seq * T);
        const int from = inverse ? (p % r) * n + p / r : (p % n) * r + p / n;
        dst[e] = src[(seq * T + from) * vecs + v];
    }
}
