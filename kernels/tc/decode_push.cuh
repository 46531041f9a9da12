// PUSH (CLUSTER > 1, kernels/decode.cu's rows kernel; the region's bytes, below; 0: none): the cluster's merge with
// each split's rows pushed, not pulled. decode_cluster_merge has every block leave its rows in its own shared memory
// and, after the cluster's barrier, read the pieces it merges from every other block (a round trip through distributed
// shared memory), then wait on a second barrier so no block exits while another still reads it. Here each split stores
// its rows, as it normalises them, straight into the shared memory of the block that merges them (remote stores:
// nothing waits on them), into a region past Q's tile and the stages that no walk uses, so a split may push while the
// others still walk. One barrier (its arrive releasing the pushes to the cluster), then each block merges its pieces
// from its own shared memory; no block touches another's after the barrier, so no second one.
//
// The pieces and their owners are decode_cluster_merge's: the output's four-column piece e (row e / PIECES) is merged
// by block (e / THREADS) % CLUSTER, in its turn e / (CLUSTER x THREADS), by its thread e % THREADS; so a chunk of
// THREADS pieces (PUSH_RPC whole rows) has one owner. The region, at PUSH_AT bytes (the same offset in every block):
// o[split][turn][THREADS] float4s, then l[split][turn][PUSH_RPC] log-sum-exps (base 2). The sums are decode_merge's, in
// split order, so all three merges give the same bits.
//
// DSMEM may be written only once its block runs: decode_push_start's arrive at the kernel's start and DecodePush's wait
// before the first push (every block has arrived by then, so it waits on nothing).
#pragma once

#define PUSH_PIECES (HEAD_D / 4)                   // a row's four-column pieces
#define PUSH_STEP (CLUSTER * THREADS)              // the pieces of one turn of the cluster
#define PUSH_TURNS ((DEC_ROWS * PUSH_PIECES + PUSH_STEP - 1) / PUSH_STEP)
#define PUSH_RPC (THREADS / PUSH_PIECES)           // whole rows a chunk of THREADS pieces
#define PUSH_AT ((BM + 2 * STAGES * KWG * BN) * HEAD_D * 2)  // past Q's tile and the stages
#define PUSH_L_AT (CLUSTER * PUSH_TURNS * THREADS * 16)     // the log-sum-exps, from the region's start
// the region's bytes: PUSH itself is the host's count (attnbench/decode_config.py DecodeConfig.push_bytes), which it
// adds to the launch's shared memory
#define PUSH_BYTES (PUSH_L_AT + CLUSTER * PUSH_TURNS * PUSH_RPC * 4)
static_assert(PUSH == PUSH_BYTES, "PUSH: the host's count of the region's bytes is the kernel's");
static_assert(THREADS % PUSH_PIECES == 0, "PUSH: a chunk of THREADS pieces holds whole rows");

__device__ __forceinline__ void decode_push_start() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}

struct DecodePush {
    const unsigned char* base;  // the region in this block
    u32 at;                     // its shared address (the same offset in every block)

    __device__ __forceinline__ explicit DecodePush(const unsigned char* smem) {
        base = smem + PUSH_AT;
        at = tc_smem_addr(base);
        asm volatile("barrier.cluster.wait.aligned;" ::: "memory");  // every block of the cluster has started
    }
    static __device__ __forceinline__ u32 remote(u32 addr, int rank) {
        u32 r;
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
        return r;
    }
    // columns c, c + 1 (c even) of row r of this split's rows, to the piece's owner
    __device__ __forceinline__ void put2(int r, int c, float y0, float y1) const {
        const int e = r * PUSH_PIECES + c / 4, chunk = e / THREADS;
        const u32 a = at + ((blockIdx.x * PUSH_TURNS + chunk / CLUSTER) * THREADS + e % THREADS) * 16 + (c % 4) * 4;
        asm volatile("st.shared::cluster.v2.f32 [%0], {%1, %2};"
                     :: "r"(remote(a, chunk % CLUSTER)), "f"(y0), "f"(y1) : "memory");
    }
    // row r's log-sum-exp (base 2), to its pieces' owner
    __device__ __forceinline__ void put_lse(int r, float lse) const {
        const int chunk = r / PUSH_RPC;
        const u32 a = at + PUSH_L_AT + ((blockIdx.x * PUSH_TURNS + chunk / CLUSTER) * PUSH_RPC + r % PUSH_RPC) * 4;
        asm volatile("st.shared::cluster.f32 [%0], %1;" :: "r"(remote(a, chunk % CLUSTER)), "f"(lse) : "memory");
    }
    // after every thread's pushes: the barrier, then this block's pieces of the output's ``rows`` rows
    __device__ __forceinline__ void merge(int rows, u16* og) const {
        asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
        const float4* o = reinterpret_cast<const float4*>(base);
        const float* l = reinterpret_cast<const float*>(base + PUSH_L_AT);
#pragma unroll
        for (int t = 0; t < PUSH_TURNS; ++t) {
            const int e = (t * CLUSTER + blockIdx.x) * THREADS + threadIdx.x;
            if (e >= rows * PUSH_PIECES) break;
            float lse[CLUSTER];
            float4 v[CLUSTER];
#pragma unroll
            for (int s = 0; s < CLUSTER; ++s) {
                lse[s] = l[(s * PUSH_TURNS + t) * PUSH_RPC + threadIdx.x / PUSH_PIECES];
                v[s] = o[(s * PUSH_TURNS + t) * THREADS + threadIdx.x];
            }
            float mx = AB_NEG_INF;
#pragma unroll
            for (int s = 0; s < CLUSTER; ++s) mx = fmaxf(mx, lse[s]);
            float4 num = make_float4(0.f, 0.f, 0.f, 0.f);
            float den = 0.f;
#pragma unroll
            for (int s = 0; s < CLUSTER; ++s) {
                const float wgt = lse[s] == AB_NEG_INF ? 0.f : tc_exp2(lse[s] - mx);
                num.x += wgt * v[s].x;
                num.y += wgt * v[s].y;
                num.z += wgt * v[s].z;
                num.w += wgt * v[s].w;
                den += wgt;
            }
            const bool any = den > 0.f;
            *reinterpret_cast<uint2*>(og + 4 * (size_t)e) =
                make_uint2(tc_pack(any ? num.x / den : 0.f, any ? num.y / den : 0.f),
                           tc_pack(any ? num.z / den : 0.f, any ? num.w / den : 0.f));
        }
    }
};
