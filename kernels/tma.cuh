// Hopper (sm_90) bulk tensor copies (TMA) completing on shared-memory mbarriers, for fast_tc.cu.
//
// A tensor map (128 bytes, built on the host by cuTensorMapEncodeTiled, attnbench/tma.py) describes
// a tiled view of a global tensor; one thread issues a copy of a whole box into shared memory,
// swizzled as the map says, with rows past the tensor's extent filled with zeros. The copy counts
// its bytes down on an mbarrier that the consumers wait on with a phase parity. Maps come as
// kernel parameters by value (__grid_constant__), where the copy engine reads them in place.
#pragma once

// CUtensorMap's size and alignment, without cuda.h
struct __align__(64) TmaMap {
    unsigned long long w[16];
};

// mbarrier at shared address `bar` expecting `count` arrivals per phase
__device__ __forceinline__ void tma_bar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(count) : "memory");
}
// make the initialised barriers visible to the copy engine (and, after a __syncthreads, to all)
__device__ __forceinline__ void tma_bar_fence_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// one arrival that also announces `bytes` more to come from copies completing on `bar`
__device__ __forceinline__ void tma_expect(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(bar), "r"(bytes) : "memory");
}
// one arrival on `bar` (release semantics: this thread's earlier reads and writes, and the wgmma reads it
// waited for, happen before whatever a waiter on the phase does next)
__device__ __forceinline__ void tma_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(bar) : "memory");
}
// ... one arrival for the calling warp: its lanes meet, then lane 0 arrives (a warp done with what `bar` guards)
__device__ __forceinline__ void tma_warp_arrive(unsigned bar) {
    __syncwarp();
    if ((threadIdx.x & 31) == 0) tma_arrive(bar);
}
// wait until the phase of parity `parity` of `bar` has completed
__device__ __forceinline__ void tma_wait(unsigned bar, unsigned parity) {
    asm volatile("{\n.reg .pred done;\n"
                 "TMA_WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra TMA_WAIT;\n}\n" :: "r"(bar), "r"(parity) : "memory");
}
// copy the box at coordinates (c0, c1, c2) of a 3-d tensor map into shared memory at `dst`
__device__ __forceinline__ void tma_load3(unsigned dst, const void* map, int c0, int c1, int c2, unsigned bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4}], [%5];\n"
                 :: "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(bar) : "memory");
}
// ... of a 4-d tensor map, at coordinates (c0, c1, c2, c3) (tc/rows.cuh: the class-major layout read in place)
__device__ __forceinline__ void tma_load4(unsigned dst, const void* map, int c0, int c1, int c2, int c3, unsigned bar) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4, %5}], [%6];\n"
                 :: "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar) : "memory");
}
// copy a box of shared memory at `src` to coordinates (c0, c1, c2) of a 3-d tensor map (elements
// past the tensor's extent are not written)
__device__ __forceinline__ void tma_store3(const void* map, int c0, int c1, int c2, unsigned src) {
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%1, %2, %3}], [%4];\n"
                 :: "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(src) : "memory");
}
// ... to coordinates (c0, c1, c2, c3) of a 4-d tensor map
__device__ __forceinline__ void tma_store4(const void* map, int c0, int c1, int c2, int c3, unsigned src) {
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n"
                 :: "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(src) : "memory");
}
// close the stores issued by this thread and wait until they have read their shared memory
__device__ __forceinline__ void tma_store_commit_and_wait() {
    asm volatile("cp.async.bulk.commit_group;\ncp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// add a box of float32 shared memory at `src` into coordinates (c0, c1, c2) of a 3-d float32 tensor
// map, element by element in L2 (elements past the tensor's extent are not touched); a bulk group
// like tma_store3's
__device__ __forceinline__ void tma_reduce_add3(const void* map, int c0, int c1, int c2, unsigned src) {
    asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2, %3}], [%4];\n"
                 :: "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(src) : "memory");
}
// close the bulk copies issued by this thread into a group
__device__ __forceinline__ void tma_bulk_commit() {
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// wait until every bulk group this thread committed has read its shared memory
__device__ __forceinline__ void tma_bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// wait until every bulk group this thread committed has completed its writes
__device__ __forceinline__ void tma_bulk_wait() {
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
