// Tiled float32 attention on CUDA cores, driven by a tile list, with split-K.
//
// fast_f32_split: one block per (query tile, split, b*h). The block takes its share of the query
// tile's key-tile list (Mask.tiles: entry = key_tile << 1 | partial) and runs an online softmax over
// it in float32. Q of the query tile stays in shared memory; K (in chunks of DK columns) and V (in
// chunks of VK keys) stream through a two-slot ring filled with cp.async one stage ahead of the
// compute. The mask is evaluated only on partial tiles.
//   direct != 0 (one split): the block writes the normalised output.
//   direct == 0: it writes its un-normalised output and the row max and row sum (m, l) to the
//   workspace; fast_f32_merge combines the splits through exp(m_s - max_s m_s).
//
// Compile-time constants (-D): C head dim, BM query rows per tile, BN keys per tile, NT threads,
// DK columns of a K stage, VK keys of a V stage, SMEM_BYTES the host's launch size (checked), and the
// pattern (AB_PATTERN_T, AB_PATTERN_ARGS: kernels/common.cuh), its parameters read at run time from pargs.
// Threads form a TY x 16 grid: thread (ty, tx) owns score rows ty*RM .. ty*RM+RM-1, score
// columns tx + 16*b and output columns 4*(tx + 16*g) .. +3 of the same rows, so the softmax
// rescale of a row never leaves the thread.
#include "common.cuh"
#include "pattern.cuh"

#ifndef C
#error "C (head dim) must be defined"
#endif
#ifndef BM
#define BM 64
#endif
#ifndef BN
#define BN 64
#endif
#ifndef NT
#define NT 256
#endif
#ifndef DK
#define DK 32
#endif
#ifndef VK
#define VK 8
#endif

// blocks per SM the register budget is sized for (small heads leave room for two)
#ifndef MINB
#define MINB ((C <= 64) ? 2 : 1)
#endif

constexpr int TX = 16;            // threads across score / output columns
constexpr int TY = NT / TX;       // threads across rows
constexpr int RM = BM / TY;       // rows per thread
constexpr int RN = BN / TX;       // score columns per thread
constexpr int DG = C / (4 * TX);  // float4 output column groups per thread
constexpr int QS = C + 4;         // shared row strides (floats), padded against bank conflicts
constexpr int KS = DK + 4;
constexpr int VS = C + 4;
constexpr int PS = BN + 4;
constexpr int NKS = C / DK;       // K stages per key tile
constexpr int NVS = BN / VK;      // V stages per key tile
constexpr int NST = NKS + NVS;    // stages per key tile
constexpr int RING = (BN * KS > VK * VS) ? BN * KS : VK * VS;  // floats per ring slot

static_assert(NT % TX == 0 && BM % TY == 0 && BN % TX == 0, "thread grid must tile BM x BN");
static_assert(C % (4 * TX) == 0, "C must be a multiple of 64");
static_assert(C % DK == 0 && DK % 4 == 0, "DK must divide C and be a multiple of 4");
static_assert(BN % VK == 0 && VK % 4 == 0, "VK must divide BN and be a multiple of 4");

// shared memory layout, in floats
constexpr int SQ_OFF = 0;
constexpr int SP_OFF = SQ_OFF + BM * QS;
constexpr int RING_OFF = SP_OFF + BM * PS;
constexpr int SMEM_FLOATS = RING_OFF + 2 * RING;
#ifdef SMEM_BYTES  // the host's size of the dynamic shared memory, checked against this layout
static_assert(SMEM_FLOATS * 4 == SMEM_BYTES, "host and kernel disagree on the shared memory size");
#endif


__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared; zero-filled when !valid (src is then not read).
__device__ __forceinline__ void cp16(float* dst, const float* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(smem_addr(dst)), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N)); }

// Copy rows [row0, row0 + R) x columns [col0, col0 + W) of a [T, C] matrix into shared memory
// (row stride S floats); rows at or past T are zero-filled.
template <int R, int W, int S>
__device__ __forceinline__ void load_rows(float* dst, const float* src, int row0, int col0, int T) {
    constexpr int W4 = W / 4;
    constexpr int N = R * W4;
#pragma unroll
    for (int u = 0; u < (N + NT - 1) / NT; ++u) {
        const int f = threadIdx.x + u * NT;
        if (N % NT == 0 || f < N) {
            const int r = f / W4, c = (f % W4) * 4;
            const int row = row0 + r;
            const bool ok = row < T;
            cp16(dst + r * S + c, ok ? src + (size_t)row * C + col0 + c : src, ok);
        }
    }
}

// Stage st of key tile kt: K columns [st*DK, +DK) for st < NKS, else V keys [(st-NKS)*VK, +VK).
__device__ __forceinline__ void load_stage(float* slot, const float* k, const float* v, int kt, int st,
                                           int T) {
    if (st < NKS)
        load_rows<BN, DK, KS>(slot, k, kt * BN, st * DK, T);
    else
        load_rows<VK, C, VS>(slot, v, kt * BN + (st - NKS) * VK, 0, T);
}

extern "C" __global__ void __launch_bounds__(NT, MINB)
fast_f32_split(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
               float* __restrict__ out, float* __restrict__ ws_o, float2* __restrict__ ws_ml,
               const int* __restrict__ tile_ptr, const int* __restrict__ tile_entries,
               const int* __restrict__ table, int T, int nq, int splits,
               int causal, const int* __restrict__ pargs, float scale, int direct) {
    extern __shared__ float4 smem4[];
    float* smem = reinterpret_cast<float*>(smem4);
    float* sQ = smem + SQ_OFF;
    float* sP = smem + SP_OFF;
    float* ring = smem + RING_OFF;

    const AB_PATTERN_T pat{AB_PATTERN_ARGS};
    const int tid = threadIdx.x, tx = tid % TX, ty = tid / TX;
    const int qt = nq - 1 - (int)blockIdx.x;  // the longest lists (causal: the last tiles) first
    const int split = blockIdx.y;
    const int bh = blockIdx.z;
    const int q0 = qt * BM;
    const size_t base = (size_t)bh * T * C;
    q += base;
    k += base;
    v += base;

    // this split's share of the query tile's list: [e0, e1)
    const int t0 = tile_ptr[qt], n = tile_ptr[qt + 1] - t0;
    const int e0 = t0 + (int)(((long long)n * split) / splits);
    const int e1 = t0 + (int)(((long long)n * (split + 1)) / splits);
    const int stages = (e1 - e0) * NST;

    float m[RM], l[RM], s[RM][RN];
    float4 o[RM][DG];
#pragma unroll
    for (int a = 0; a < RM; ++a) {
        m[a] = AB_NEG_INF;
        l[a] = 0.f;
#pragma unroll
        for (int g = 0; g < DG; ++g) o[a][g] = make_float4(0.f, 0.f, 0.f, 0.f);
    }

    if (stages > 0) {
        load_rows<BM, C, QS>(sQ, q, q0, 0, T);
        load_stage(ring, k, v, tile_entries[e0] >> 1, 0, T);
        cp_commit();
    }
    for (int t = 0; t < stages; ++t) {
        const int e = tile_entries[e0 + t / NST];
        const int st = t % NST;
        if (t + 1 < stages) {
            load_stage(ring + ((t + 1) & 1) * RING, k, v, tile_entries[e0 + (t + 1) / NST] >> 1,
                       (t + 1) % NST, T);
            cp_commit();
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        const float* slot = ring + (t & 1) * RING;
        if (st < NKS) {
            // scores: s += Q[:, st*DK : +DK] K[:, st*DK : +DK]^T
            if (st == 0) {
#pragma unroll
                for (int a = 0; a < RM; ++a)
#pragma unroll
                    for (int b = 0; b < RN; ++b) s[a][b] = 0.f;
            }
            const float* qc = sQ + st * DK;
#pragma unroll
            for (int d = 0; d < DK; d += 4) {
                float4 qa[RM];
#pragma unroll
                for (int a = 0; a < RM; ++a)
                    qa[a] = *reinterpret_cast<const float4*>(qc + (ty * RM + a) * QS + d);
#pragma unroll
                for (int b = 0; b < RN; ++b) {
                    const float4 kb = *reinterpret_cast<const float4*>(slot + (tx + TX * b) * KS + d);
#pragma unroll
                    for (int a = 0; a < RM; ++a) {
                        float acc = s[a][b];
                        acc = fmaf(qa[a].x, kb.x, acc);
                        acc = fmaf(qa[a].y, kb.y, acc);
                        acc = fmaf(qa[a].z, kb.z, acc);
                        acc = fmaf(qa[a].w, kb.w, acc);
                        s[a][b] = acc;
                    }
                }
            }
            if (st == NKS - 1) {
                // online softmax over this key tile; probabilities to sP
                const int kt = e >> 1;
                const bool partial = e & 1;
#pragma unroll
                for (int a = 0; a < RM; ++a) {
                    const int i = q0 + ty * RM + a;
                    float mt = AB_NEG_INF;
#pragma unroll
                    for (int b = 0; b < RN; ++b) {
                        const int j = kt * BN + tx + TX * b;
                        float x = s[a][b] * scale;
                        if (partial && !(i < T && j < T && ab_allowed(pat, i, j))) x = AB_NEG_INF;
                        s[a][b] = x;
                        mt = fmaxf(mt, x);
                    }
#pragma unroll
                    for (int w = TX / 2; w > 0; w /= 2) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, w));
                    const float mn = fmaxf(m[a], mt);
                    // mn == -inf: no key for this row yet; nothing to rescale, every p is 0
                    const float alpha = (mn == AB_NEG_INF) ? 1.f : expf(m[a] - mn);
                    m[a] = mn;
                    float ls = 0.f;
#pragma unroll
                    for (int b = 0; b < RN; ++b) {
                        const float p = (mn == AB_NEG_INF) ? 0.f : expf(s[a][b] - mn);
                        ls += p;
                        sP[(ty * RM + a) * PS + tx + TX * b] = p;
                    }
                    l[a] = l[a] * alpha + ls;  // this thread's columns; summed over tx at the end
#pragma unroll
                    for (int g = 0; g < DG; ++g) {
                        o[a][g].x *= alpha;
                        o[a][g].y *= alpha;
                        o[a][g].z *= alpha;
                        o[a][g].w *= alpha;
                    }
                }
            }
        } else {
            // o += P[:, c*VK : +VK] V[c*VK : +VK, :]
            const float* pc = sP + (st - NKS) * VK;
#pragma unroll
            for (int kk = 0; kk < VK; kk += 4) {
                float4 p[RM];
#pragma unroll
                for (int a = 0; a < RM; ++a)
                    p[a] = *reinterpret_cast<const float4*>(pc + (ty * RM + a) * PS + kk);
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    const float* vr = slot + (kk + u) * VS + 4 * tx;
#pragma unroll
                    for (int g = 0; g < DG; ++g) {
                        const float4 vv = *reinterpret_cast<const float4*>(vr + 4 * TX * g);
#pragma unroll
                        for (int a = 0; a < RM; ++a) {
                            const float pa = u == 0 ? p[a].x : u == 1 ? p[a].y : u == 2 ? p[a].z : p[a].w;
                            o[a][g].x = fmaf(pa, vv.x, o[a][g].x);
                            o[a][g].y = fmaf(pa, vv.y, o[a][g].y);
                            o[a][g].z = fmaf(pa, vv.z, o[a][g].z);
                            o[a][g].w = fmaf(pa, vv.w, o[a][g].w);
                        }
                    }
                }
            }
        }
        __syncthreads();  // the slot (and sP) may be refilled from the next iteration on
    }

    // row sums over the 16 threads of a row
#pragma unroll
    for (int a = 0; a < RM; ++a)
#pragma unroll
        for (int w = TX / 2; w > 0; w /= 2) l[a] += __shfl_xor_sync(0xffffffffu, l[a], w);

#pragma unroll
    for (int a = 0; a < RM; ++a) {
        const int r = ty * RM + a;
        const int i = q0 + r;
        if (i >= T) continue;
        if (direct) {
            float4* dst = reinterpret_cast<float4*>(out + base + (size_t)i * C) + tx;
            const bool any = l[a] > 0.f;
#pragma unroll
            for (int g = 0; g < DG; ++g) {
                float4 x = o[a][g];
                x.x = any ? x.x / l[a] : 0.f;
                x.y = any ? x.y / l[a] : 0.f;
                x.z = any ? x.z / l[a] : 0.f;
                x.w = any ? x.w / l[a] : 0.f;
                dst[TX * g] = x;
            }
        } else {
            const size_t row = (((size_t)bh * nq + qt) * splits + split) * BM + r;
            if (tx == 0) ws_ml[row] = make_float2(m[a], l[a]);
            if (stages > 0) {  // the merge never reads the output of a split with m = -inf
                float4* dst = reinterpret_cast<float4*>(ws_o + row * C) + tx;
#pragma unroll
                for (int g = 0; g < DG; ++g) dst[TX * g] = o[a][g];
            }
        }
    }
}

// One thread per (b*h, row, 4 output columns): out = sum_s w_s o_s / sum_s w_s l_s with
// w_s = exp(m_s - max m); a split whose m_s is -inf (no key for the row) has weight 0 and its
// output is not read.
extern "C" __global__ void __launch_bounds__(256)
fast_f32_merge(float* __restrict__ out, const float* __restrict__ ws_o, const float2* __restrict__ ws_ml,
               int T, int nq, int splits, long long total) {
    constexpr int C4 = C / 4;
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= total) return;
    const int c4 = (int)(idx % C4);
    const long long row = idx / C4;  // bh * T + i
    const int i = (int)(row % T);
    const long long bh = row / T;
    const int qt = i / BM, r = i % BM;
    const size_t first = ((size_t)bh * nq + qt) * splits;

    float mx = AB_NEG_INF;
    for (int s = 0; s < splits; ++s) mx = fmaxf(mx, ws_ml[(first + s) * BM + r].x);
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    float den = 0.f;
    if (mx != AB_NEG_INF) {
        for (int s = 0; s < splits; ++s) {
            const size_t wr = (first + s) * BM + r;
            const float2 ml = ws_ml[wr];
            if (ml.x == AB_NEG_INF) continue;
            const float w = expf(ml.x - mx);
            den = fmaf(w, ml.y, den);
            const float4 x = reinterpret_cast<const float4*>(ws_o + wr * C)[c4];
            acc.x = fmaf(w, x.x, acc.x);
            acc.y = fmaf(w, x.y, acc.y);
            acc.z = fmaf(w, x.z, acc.z);
            acc.w = fmaf(w, x.w, acc.w);
        }
    }
    const bool any = den > 0.f;
    float4 y;
    y.x = any ? acc.x / den : 0.f;
    y.y = any ? acc.y / den : 0.f;
    y.z = any ? acc.z / den : 0.f;
    y.w = any ? acc.w / den : 0.f;
    reinterpret_cast<float4*>(out + (size_t)row * C)[c4] = y;
}
