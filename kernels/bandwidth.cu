// Read bandwidth, for the bytes floor (attnbench/timing.py, measure_peaks): every thread reads
// 16-byte vectors over a grid-stride loop, four loads in flight, and adds its sum to one word so
// that no load is dead. A kernel that mostly reads (attention reads Q, K and V, writes only O) can
// beat the copy bandwidth, which counts a write for every read. No compile-time constants.
extern "C" __global__ void read_sum(const float4* __restrict__ src, long long n4, float* __restrict__ sink)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    float acc = 0.f;
    for (; i + 3 * stride < n4; i += 4 * stride) {
        const float4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
        acc += (a.x + a.y + a.z + a.w) + (b.x + b.y + b.z + b.w) + (c.x + c.y + c.z + c.w) + (d.x + d.y + d.z + d.w);
    }
    for (; i < n4; i += stride) {
        const float4 a = src[i];
        acc += a.x + a.y + a.z + a.w;
    }
    if (acc == 12345.f) atomicAdd(sink, acc);  // never true on the ones it reads; keeps the loads live
}
