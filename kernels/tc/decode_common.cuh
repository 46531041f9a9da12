// What the decoding kernels (kernels/decode.cu: the warps take a tile's rows; kernels/decode_keys.cu:
// the warps take a tile's keys; kernels/decode_pairs.cu: the warps take pairs) share: their parameters,
// a block's work, the split partials' layout, and the merge launch.
//
// A block takes one (sequence b, key/value head kvh) and one stretch (split) of the key tiles that
// sequence's queries may read. A row r of (b, kvh) is query head h0 + r / Tq at position t = r % Tq;
// in q and the output [B][H][Tq][HEAD_D] the group's rows are one contiguous slab from
// ((b * H + kvh * group) * Tq) rows. A split's rows are stored in float32, normalised by the split's
// own row sums, with their log-sum-exp (base 2): Op [B][H_kv][splits][DEC_ROWS][HEAD_D], Lp
// [B][H_kv][splits][DEC_ROWS] (DEC_ROWS, the partial's rows a split, defined by the kernel file before
// this header). When a pair has one split (gridDim.x == 1) the split kernel stores the output itself,
// in the input's 16-bit type, and the host launches no merge.
//
// Interface:
//   DECODE_SPLIT_PARAMS: the split kernels' parameters (the host launches either alike);
//   decode_entries(tent, head) -> DecodeEntries: the list's entries (TcTileList's init_range and next read
//     them), the first DECODE_HEAD_N from the launch's parameter `head`;
//   decode_block(...) -> DecodeBlock: the block's pair, split, rows, keys, Q slab, K/V and its stretch of
//     the list (first entry in tent, count); from the arguments alone when the batch is not ragged;
//     with STRIDE > 1 (one query a sequence) the keys and K/V of the query's residue class;
//     decode_block_at(split, kvh, b, ...) the same for a pair named otherwise than by blockIdx;
//   decode_out_slab(Og, blk, H, Tq): the group's first output row;
//   decode_block_stretch(seg, ...): the same for a stretch of a flat walk (FLAT, below);
//   decode_part_rows / decode_part_lse(..., blk, H_kv): the split's partial rows and log-sum-exps;
//   decode_alone(): whether the block is its pair's only split (it stores the output itself);
//   decode_work(blk): the loader's work item (TcLoadAsync::init);
//   decode_pos(r, rows, Tb, Tq): row r's position (padding rows: the last, never stored);
//   decode_tile<Mma>(...): one key tile's products (Mma's) and softmax for a warp's 16 rows (below);
//   decode_to_u16(y): y in the 16-bit type; decode_merge: the merge launch, a block per output row.
#pragma once
#include "tc/common.cuh"
#include "tc/mask.cuh"
#include "tc/softmax.cuh"
#include "tc/mainloop_sync.cuh"

#ifndef DEC_ROWS
#error "DEC_ROWS: the partial's rows a split (define it before including tc/decode_merge.cuh)"
#endif

#define DECODE_SPLIT_PARAMS                                                                                    \
    const u16 *__restrict__ Qg, const u16 *__restrict__ Kg, const u16 *__restrict__ Vg, float *__restrict__ Op,  \
        float *__restrict__ Lp, const int2 *__restrict__ lists, const int *__restrict__ tent,                      \
        const int *__restrict__ lens, const int *__restrict__ list_of, int H, int H_kv, int Tq, int Tk,           \
        int per_split, float scale_log2, const int *__restrict__ table, u16 *__restrict__ Og,                     \
        int *__restrict__ tickets, int one_len, int list_count, const int4 *__restrict__ segs,                   \
        const int *__restrict__ seg_at, const __grid_constant__ DecodeHead head

// The list's first DECODE_HEAD_N entries (tent[0 ..), zeros past its end) come with the launch as well, a kernel
// parameter: a block reads its first entries, and every one of a short list, from the launch's constant bank,
// so its first K/V loads wait on no read of global memory for them (the host passes tent[:DECODE_HEAD_N] as the
// structure; attnbench/decode.py HEAD_ENTRIES sets the count). DecodeEntries reads tent[i] from there below
// DECODE_HEAD_N, from tent itself above.
#ifndef DECODE_HEAD_N
#error "DECODE_HEAD_N: the list's entries passed with the launch (attnbench/decode.py: HEAD_ENTRIES)"
#endif
struct DecodeHead {
    int e[DECODE_HEAD_N];
};
struct DecodeEntries {
    const int* tent;
    const DecodeHead* head;
    __device__ __forceinline__ int operator[](int i) const { return i < DECODE_HEAD_N ? head->e[i] : __ldg(tent + i); }
};
__device__ __forceinline__ DecodeEntries decode_entries(const int* tent, const DecodeHead& head) {
    return DecodeEntries{tent, &head};
}

// CLUSTER > 1 (sm_90; the host sets it to the pair's split count, at most 16): the splits of a pair are one
// thread-block cluster along x (grid.x == CLUSTER) and merge through distributed shared memory in the
// split launch itself (decode_cluster_merge), so no partials go to global memory and no merge launches.
#ifndef CLUSTER
#define CLUSTER 1
#endif
static_assert(CLUSTER >= 1 && CLUSTER <= 16,
              "CLUSTER: 1 (no cluster) to 16 splits a cluster (above 8: the non-portable sizes)");
#if CLUSTER > 1
#define DECODE_CLUSTER __cluster_dims__(CLUSTER, 1, 1)
#else
#define DECODE_CLUSTER
#endif

// HSPLIT: the blocks (row groups) each key/value head's query heads are dealt to. The host then passes the row
// groups' count, H_kv x HSPLIT, as H_kv: everything but K and V (the group's rows, Q's and the output's slabs, the
// partials, the merge) is a row group's, H / H_kv query heads of it (1: a row group is a key/value head's group)
#ifndef HSPLIT
#define HSPLIT 1
#endif

struct DecodeBlock {
    int split, kvh, b;  // blockIdx (x, y, z)
    int group, rows;    // query heads a key/value head; the block's rows, group x Tq
    int Tb;             // this sequence's keys
    int first, count;   // the split's stretch of the sequence's list: first entry's index in tent, length
    int part;           // FLAT: its partial's index in Op / Lp (else (pair, split) of gridDim.x splits a pair)
    const u16 *q, *k, *v;  // the group's Q slab, the key/value head's K and V
};

// (one_len: every sequence holds Tk keys and reads the list at tent[0 .. list_count), given as
// arguments so that a block's first loads wait on no read of lens, list_of and lists)
// decode_block_at: the same for a given (split, kvh, b) (kernels/decode_pairs.cu: a warp's pair)
__device__ __forceinline__ DecodeBlock decode_block_at(int split, int kvh, int b, const u16* Qg, const u16* Kg,
                                                       const u16* Vg, const int2* lists, const int* lens,
                                                       const int* list_of, int H, int H_kv, int Tq, int Tk,
                                                       int per_split, int one_len, int list_count) {
    DecodeBlock d;
    d.split = split;
    d.kvh = kvh;
    d.b = b;
    d.group = H / H_kv;
    d.rows = d.group * Tq;
    const int Tfull = one_len ? Tk : lens[d.b];
    // STRIDE > 1 (a strided pattern, one query a sequence: the host builds it so): the query at
    // Tfull - 1 reads keys of its residue class c only, rows c, c + STRIDE, ... (the loader's row
    // step), the class's first (Tfull - 1) / STRIDE + 1 keys, and is the class's last position
    const int c = (Tfull - 1) % STRIDE;
    d.Tb = (Tfull - 1) / STRIDE + 1;
    const int2 head = one_len ? make_int2(0, list_count) : lists[list_of[d.b]];  // (first entry, count)
    const int first = d.split * per_split;
    d.first = head.x + first;
    d.count = max(0, min(per_split, head.y - first));
    d.q = Qg + ((size_t)d.b * H + (size_t)d.kvh * d.group) * Tq * HEAD_D;
    // HSPLIT > 1: a group's query heads are dealt to HSPLIT blocks (row groups); H_kv counts the row groups,
    // kvh names one, and K and V are those of the key/value head it shares with the other HSPLIT - 1
    const size_t kv = (((size_t)d.b * (H_kv / HSPLIT) + d.kvh / HSPLIT) * (size_t)Tk + c) * HEAD_D;
    d.k = Kg + kv;
    d.v = Vg + kv;
    return d;
}
__device__ __forceinline__ DecodeBlock decode_block(const u16* Qg, const u16* Kg, const u16* Vg, const int2* lists,
                                                    const int* lens, const int* list_of, int H, int H_kv, int Tq,
                                                    int Tk, int per_split, int one_len, int list_count) {
    return decode_block_at(blockIdx.x, blockIdx.y, blockIdx.z, Qg, Kg, Vg, lists, lens, list_of, H, H_kv, Tq, Tk,
                           per_split, one_len, list_count);
}

// FLAT 1 (the key slices' kernel, a ragged batch; attnbench/decode_config.py flat_stretches): the grid is one
// dimension, and block x walks the stretches segs[seg_at[x] .. seg_at[x + 1]), each {pair b * H_kv + kvh, its
// partial's index in Op / Lp, first entry's index in tent, count}: the pairs' lists laid end to end and cut into
// equal runs of tiles, so a run may cross from one pair into the next and every block holds the same tiles
// whatever the sequences' lengths. Every stretch stores a partial (no block is a pair's only one), and the merge
// launch weighs a pair's slots, those no stretch fills holding a log-sum-exp of -inf and zero rows (the host's).
#ifndef FLAT
#define FLAT 0
#endif
__device__ __forceinline__ DecodeBlock decode_block_stretch(const int4 seg, const u16* Qg, const u16* Kg,
                                                            const u16* Vg, const int2* lists, const int* lens,
                                                            const int* list_of, int H, int H_kv, int Tq, int Tk,
                                                            int one_len, int list_count) {
    DecodeBlock d = decode_block_at(0, seg.x % H_kv, seg.x / H_kv, Qg, Kg, Vg, lists, lens, list_of, H, H_kv, Tq, Tk,
                                    0, one_len, list_count);
    d.first = seg.z;
    d.count = seg.w;
    d.part = seg.y;
    return d;
}

// the loader's work item (TcLoadAsync reads K and V from the TcGlobal pointers, rows >= Tb zero-filled
// and masked: the tile holding Tb is partial)
__device__ __forceinline__ TcWork decode_work(const DecodeBlock& d) {
    TcWork w;
    w.qt = 0;
    w.bh = 0;
    w.T = d.Tb;
    w.base = 0;
    w.kv_base = 0;
    return w;
}

__device__ __forceinline__ int decode_pos(int r, int rows, int Tb, int Tq) { return r < rows ? Tb - Tq + r % Tq : Tb - 1; }

// the first key of tile entry ent for the warpgroup on `slice` of a stage of KWG x BN keys (the rows kernel's walks)
__device__ __forceinline__ int decode_key0(int ent, int slice) { return (tc_entry_tile(ent) * KWG + slice) * BN; }

// One key tile for a warp's 16 rows (the thread's two at positions pos_a, pos_b): S = Q K^T from
// stage `st` by Mma's products (TcMmaSync: ldmatrix and mma.sync, a decode_keys warp's slice is a stage
// index of its own; TcMmaWgmma: the warpgroup's 64 rows at once, every warp of it issuing), masked with the
// pattern predicate at each row's own position when the entry is partial (keys from j0), the online
// softmax, O += P V; nothing but zero row sums when the warp's keys are all masked (BN <= 32; on
// wgmma the warp still issues P V with its warpgroup, its P zero).
template <class Mma, class P>
__device__ __forceinline__ void decode_tile(TcAcc& acc, TcSoftmax& sf, const typename Mma::Ops& op, const P& pat,
                                            int ent, int st, int j0, int pos_a, int pos_b, int Tb, int t4,
                                            float scale_log2, int it) {
    TcS s;
    TcRows rs;
    Mma::qk(s, op, st);
    bool idle = false;
    if (ent & 1) idle = tc_mask_idle(tc_mask_rows(s[0], pat, pos_a, pos_b, j0, Tb, t4));
    if (idle)
        TcSoftmax::zero(s, rs);
    else
        sf.probs(s, rs, acc, scale_log2, 1, it);
    sf.add(rs);
    Mma::pv(acc, s, op, st, idle);
}

__device__ __forceinline__ u16 decode_to_u16(float y) { return (u16)(tc_pack(y, 0.f) & 0xffffu); }

// the group's output slab, rows (h - h0) * Tq + t
__device__ __forceinline__ u16* decode_out_slab(u16* Og, const DecodeBlock& d, int H, int Tq) {
    return Og + ((size_t)d.b * H + (size_t)d.kvh * d.group) * Tq * HEAD_D;
}

// the split's partial rows and log-sum-exps
__device__ __forceinline__ size_t decode_part(const DecodeBlock& d, int H_kv) {
    return FLAT ? (size_t)d.part : ((size_t)d.b * H_kv + d.kvh) * gridDim.x + d.split;
}
__device__ __forceinline__ float* decode_part_rows(float* Op, const DecodeBlock& d, int H_kv) {
    return Op + decode_part(d, H_kv) * DEC_ROWS * HEAD_D;
}
__device__ __forceinline__ float* decode_part_lse(float* Lp, const DecodeBlock& d, int H_kv) {
    return Lp + decode_part(d, H_kv) * DEC_ROWS;
}
// whether the block is its pair's only split, which stores the output itself (never a stretch of a flat walk)
__device__ __forceinline__ bool decode_alone() { return !FLAT && gridDim.x == 1; }

#if CLUSTER > 1
// (the release restricted to this block's own shared memory, the only memory whose writes the cluster's other blocks
// read past it: the split's rows and log-sum-exps; the arrive itself relaxed, the wait acquiring. The restricted
// fence needs PTX ISA 8.6: with an NVRTC before 12.8 the arrive releases everything, as it did before)
__device__ __forceinline__ void decode_cluster_sync() {  // every thread of every block of the cluster
#if __CUDACC_VER_MAJOR__ > 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 8)
    asm volatile("fence.release.sync_restrict::shared::cta.cluster;\n\tbarrier.cluster.arrive.relaxed.aligned;\n\t"
                 "barrier.cluster.wait.acquire.aligned;" ::: "memory");
#else
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}
// the same without ordering this block's earlier memory operations (no fence before the arrive): for the
// last barrier, which only keeps each block's shared memory alive until the others' reads of it are done
// (a read is done before the arrive that follows it, since the output it feeds is computed before)
__device__ __forceinline__ void decode_cluster_sync_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n\tbarrier.cluster.wait.aligned;" ::: "memory");
}
// a float, or four, in the shared memory of the cluster's block `rank`, at the address this block's own
// `addr` names
__device__ __forceinline__ u32 decode_dsmem_addr(u32 addr, int rank) {
    u32 remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
    return remote;
}
__device__ __forceinline__ float decode_dsmem_f32(u32 addr, int rank) {
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(decode_dsmem_addr(addr, rank)) : "memory");
    return v;
}
__device__ __forceinline__ float4 decode_dsmem_f32x4(u32 addr, int rank) {
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(decode_dsmem_addr(addr, rank))
                 : "memory");
    return v;
}

// The splits of a pair, one cluster, merge: each block has left its rows (normalised by its own sums) in
// part_o [DEC_ROWS][HEAD_D] (16-byte aligned) and their log-sum-exps (base 2) in part_l [DEC_ROWS], both in
// its shared memory at the same offsets as every other block of the cluster. After the cluster's barrier,
// block k (blockIdx.x, its rank) merges the output's four-column pieces k * THREADS + tid, stepping
// CLUSTER * THREADS: the piece's row's CLUSTER log-sum-exps, then its CLUSTER float4s, read through distributed
// shared memory (ptxas issues the float4s' reads after the row's largest log-sum-exp, behind the branch on it: a
// piece waits on two round trips, and the next piece's reads come after this one's store).
// The sums are decode_merge's, in split order (so both give the same bits).
__device__ __forceinline__ void decode_cluster_merge_turns(const float* part_o, const float* part_l, int rows, u16* og) {
    constexpr int PIECES = HEAD_D / 4;  // a row's four-column pieces
    const u32 o_at = tc_smem_addr(part_o), l_at = tc_smem_addr(part_l);
    for (int e = blockIdx.x * THREADS + threadIdx.x; e < rows * PIECES; e += CLUSTER * THREADS) {
        const int r = e / PIECES;
        float lse[CLUSTER];
        float4 v[CLUSTER];
#pragma unroll
        for (int s = 0; s < CLUSTER; ++s) lse[s] = decode_dsmem_f32(l_at + 4u * r, s);
#pragma unroll
        for (int s = 0; s < CLUSTER; ++s) v[s] = decode_dsmem_f32x4(o_at + 16u * e, s);
        float mx = AB_NEG_INF;
#pragma unroll
        for (int s = 0; s < CLUSTER; ++s) mx = fmaxf(mx, lse[s]);
        float4 num = make_float4(0.f, 0.f, 0.f, 0.f);
        float den = 0.f;
        if (mx != AB_NEG_INF) {
#pragma unroll
            for (int s = 0; s < CLUSTER; ++s) {
                const float wgt = lse[s] == AB_NEG_INF ? 0.f : tc_exp2(lse[s] - mx);
                num.x += wgt * v[s].x;
                num.y += wgt * v[s].y;
                num.z += wgt * v[s].z;
                num.w += wgt * v[s].w;
                den += wgt;
            }
        }
        const bool any = den > 0.f;
        *reinterpret_cast<uint2*>(og + 4 * (size_t)e) =
            make_uint2(tc_pack(any ? num.x / den : 0.f, any ? num.y / den : 0.f),
                       tc_pack(any ? num.z / den : 0.f, any ? num.w / den : 0.f));
    }
}
// CMERGE 1: the same pieces, sums and bits, but a thread issues the reads of all its pieces (at most TURNS) before
// it uses any, with no branch between them: decode_cluster_merge_turns' pieces each wait on their log-sum-exps,
// then on their float4s (ptxas places the float4s' reads after the row's largest log-sum-exp), one piece after
// another; here the thread waits on one round trip for all of them. A piece's sums need no branch on the row's
// largest log-sum-exp: where it is -inf every weight is 0, so the sums are 0 and the piece 0, as there. Its sums
// and store are written out again, not shared with decode_cluster_merge_turns: a shared helper changed that merge's
// SASS (not only its PTX). Both stay: the host (DecodeConfig.cmerge_for) gathers where a thread takes more than one
// piece (Tq=16: 0.95-1.01 of the time on an H100), and keeps the pieces in turn where it takes one (Tq=1, where
// gathering measured 0.98-1.03: docs/PERF.md "decode v12").
#ifndef CMERGE
#define CMERGE 0
#endif
__device__ __forceinline__ void decode_cluster_merge_gathered(const float* part_o, const float* part_l, int rows,
                                                              u16* og) {
    constexpr int PIECES = HEAD_D / 4, STEP = CLUSTER * THREADS;
    constexpr int TURNS = (DEC_ROWS * PIECES + STEP - 1) / STEP;  // a thread's pieces, at most
    const u32 o_at = tc_smem_addr(part_o), l_at = tc_smem_addr(part_l);
    const int first = blockIdx.x * THREADS + threadIdx.x, n = rows * PIECES;
    float lse[TURNS][CLUSTER];
    float4 v[TURNS][CLUSTER];
#pragma unroll
    for (int t = 0; t < TURNS; ++t) {
        const int e = first + t * STEP;
        if (e < n) {
#pragma unroll
            for (int s = 0; s < CLUSTER; ++s) lse[t][s] = decode_dsmem_f32(l_at + 4u * (e / PIECES), s);
#pragma unroll
            for (int s = 0; s < CLUSTER; ++s) v[t][s] = decode_dsmem_f32x4(o_at + 16u * e, s);
        }
    }
#pragma unroll
    for (int t = 0; t < TURNS; ++t) {
        const int e = first + t * STEP;
        if (e >= n) break;
        float mx = AB_NEG_INF;
#pragma unroll
        for (int s = 0; s < CLUSTER; ++s) mx = fmaxf(mx, lse[t][s]);
        float4 num = make_float4(0.f, 0.f, 0.f, 0.f);
        float den = 0.f;
#pragma unroll
        for (int s = 0; s < CLUSTER; ++s) {
            const float wgt = lse[t][s] == AB_NEG_INF ? 0.f : tc_exp2(lse[t][s] - mx);
            num.x += wgt * v[t][s].x;
            num.y += wgt * v[t][s].y;
            num.z += wgt * v[t][s].z;
            num.w += wgt * v[t][s].w;
            den += wgt;
        }
        const bool any = den > 0.f;
        *reinterpret_cast<uint2*>(og + 4 * (size_t)e) =
            make_uint2(tc_pack(any ? num.x / den : 0.f, any ? num.y / den : 0.f),
                       tc_pack(any ? num.z / den : 0.f, any ? num.w / den : 0.f));
    }
}
// The cluster's merge: the barrier, the pieces (CMERGE: gathered or in turn), then a second barrier, relaxed (its
// arrive waits for none of the output's stores), which keeps every block's shared memory alive until the others
// have read it.
__device__ __forceinline__ void decode_cluster_merge(const float* part_o, const float* part_l, int rows, u16* og) {
    decode_cluster_sync();
#if CMERGE
    decode_cluster_merge_gathered(part_o, part_l, rows, og);
#else
    decode_cluster_merge_turns(part_o, part_l, rows, og);
#endif
    decode_cluster_sync_relaxed();
}
#endif

// One output row (b, h, t) from the splits of its (b, key/value head), in a launch of its own (grid
// B * H * Tq, block HEAD_D: a thread per column). With PDL=1 on sm_90 it is a programmatic dependent
// of the split launch (attnbench/launch.py): its blocks are placed while the splits run and wait for
// them here.
// The splits' log-sum-exps are read at once (a thread per split) for their largest; then each thread
// walks the splits for its column with MERGE_UNROLL of them in flight, so the launch waits on about
// splits / MERGE_UNROLL round trips to L2 rather than one per split.
#define MERGE_UNROLL 8
extern "C" __global__ void __launch_bounds__(HEAD_D)
decode_merge(const float* __restrict__ Op, const float* __restrict__ Lp, u16* __restrict__ Og, int H, int H_kv,
             int Tq, int splits) {
    ab_pdl_wait();  // launched as a programmatic dependent: the splits' partials are complete from here
    const int row = blockIdx.x;  // (b * H + h) * Tq + t
    const int t = row % Tq, h = (row / Tq) % H, b = row / (Tq * H);
    const int group = H / H_kv, kvh = h / group, r = (h - kvh * group) * Tq + t;
    const size_t base = ((size_t)b * H_kv + kvh) * splits;
    const float* lse = Lp + base * DEC_ROWS + r;  // split s's at lse[s * DEC_ROWS]
    const float* o = Op + (base * DEC_ROWS + r) * HEAD_D + threadIdx.x;  // split s's at o[s * DEC_ROWS * HEAD_D]
    __shared__ float warp_max[HEAD_D / 32];
    float mx = AB_NEG_INF;
    for (int s = threadIdx.x; s < splits; s += HEAD_D) mx = fmaxf(mx, lse[(size_t)s * DEC_ROWS]);
#pragma unroll
    for (int k = 16; k; k >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, k));
    if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = mx;
    __syncthreads();
#pragma unroll
    for (int w = 0; w < HEAD_D / 32; ++w) mx = fmaxf(mx, warp_max[w]);
    float num = 0.f, den = 0.f;
    if (mx != AB_NEG_INF) {  // a split's rows are finite (zero where it saw no key), so a weight 0 adds 0
#pragma unroll MERGE_UNROLL
        for (int s = 0; s < splits; ++s) {
            const float l = lse[(size_t)s * DEC_ROWS];
            const float wgt = l == AB_NEG_INF ? 0.f : tc_exp2(l - mx);
            num += wgt * o[(size_t)s * DEC_ROWS * HEAD_D];
            den += wgt;
        }
    }
    Og[(size_t)row * HEAD_D + threadIdx.x] = decode_to_u16(den > 0.f ? num / den : 0.f);
}
