// Read bandwidth, for the bytes floor (attnbench/timing.py, measure_peaks): every thread reads
// 16-byte vectors over a grid-stride loop, four loads in flight, and adds its sum to one word so
// that no load is dead. A kernel that mostly reads (attention reads Q, K and V, writes only O) can
// beat the copy bandwidth, which counts a write for every read. No compile-time constants.
// read_sum_evict_first: the same reads with L2's evict-first policy (attnbench floor's "L2 evict-first"
// rows: what a launch that streams its bytes that way, as fast-decode's EVICT=1 does, measures).

// a 16-byte read (the compiler makes read_sum's read-only, ld.global.nc), the same with the policy when EVF
template <bool EVF>
__device__ __forceinline__ float4 read16(const float4* __restrict__ p) {
    if (!EVF) return *p;
    float4 v;
    unsigned long long pol;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol));
    asm("ld.global.nc.L2::cache_hint.v4.f32 {%0,%1,%2,%3}, [%4], %5;\n"
        : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p), "l"(pol));
    return v;
}

template <bool EVF>
__device__ __forceinline__ void read_body(const float4* __restrict__ src, long long n4, float* __restrict__ sink)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    float acc = 0.f;
    for (; i + 3 * stride < n4; i += 4 * stride) {
        const float4 a = read16<EVF>(src + i), b = read16<EVF>(src + i + stride), c = read16<EVF>(src + i + 2 * stride),
                     d = read16<EVF>(src + i + 3 * stride);
        acc += (a.x + a.y + a.z + a.w) + (b.x + b.y + b.z + b.w) + (c.x + c.y + c.z + c.w) + (d.x + d.y + d.z + d.w);
    }
    for (; i < n4; i += stride) {
        const float4 a = read16<EVF>(src + i);
        acc += a.x + a.y + a.z + a.w;
    }
    if (acc == 12345.f) atomicAdd(sink, acc);  // never true on the ones it reads; keeps the loads live
}

extern "C" __global__ void read_sum(const float4* __restrict__ src, long long n4, float* __restrict__ sink)
{
    read_body<false>(src, n4, sink);
}

extern "C" __global__ void read_sum_evict_first(const float4* __restrict__ src, long long n4, float* __restrict__ sink)
{
    read_body<true>(src, n4, sink);
}
