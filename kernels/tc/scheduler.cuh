// Which work a block does, and the walk over its query tile's list of key tiles.
//
// The forward: one work item per block: query tile qt = nq - 1 - blockIdx.x (the longest lists, causal:
// the last tiles, first), batch * head blockIdx.y, residue class blockIdx.z (strided patterns,
// Mask.strided: dilated with r > 1; row or key a of the kernel is position c + STRIDE * a of the
// sequence, and the tile list and the predicate are those of the inner pattern on a class, which
// holds Tc = ceil((T - c) / STRIDE) positions). Grouped-query heads (KV_GROUP = H / H_kv > 1): the
// query head of blockIdx.y = b * H + h reads key/value head b * H_kv + h / KV_GROUP, which is
// blockIdx.y / KV_GROUP since H = KV_GROUP * H_kv (tc_kv_bh; K and V are [B * H_kv][T][HEAD_D]); with
// KV_GROUP 1 K and V sit at Q's offsets, the code of before. A persistent scheduler, loading the next work item
// while the current one computes, would replace tc_block_work.
//
// Interface:
//   TcWork tc_block_work(T_all): the block's work item (qt, bh, T, base, kv_base).
//   tc_kv_bh(): the block's key/value head in K and V ([B * H_kv] of them; blockIdx.y when KV_GROUP 1).
//   TcWork tc_item_work(T_all, BH, item, cls): the backward's (a work item of a key tile's list;
//   the grid flat over items, residue classes and B * H), its item and residue class.
//   tc_item_work_at(T_all, BH, b, item, cls), tc_block_work_at(T_all, nq, x, y, z): the same for a
//   block named otherwise than by blockIdx (the backward's fused launch); tc_block_work_flat(T_all, nq, BH, f,
//   cls): tc_block_work_at's for the flat number f of a block of that grid.
//   TcTileList: init(thead, tent, qt) reads the list head and the entries of the first STAGES
//   tiles (init_range(tent, e0, n): a stretch of a list, a decode's split); next(tent, it, ahead)
//   moves to tile `it`, returning its entry, with `ahead` the entry of
//   tile it + STAGES - 1 (the one loaded now; 0 past the list) and reading the entry a tile further;
//   tc_entry_tile(ent): its key tile. (tent comes in each time: kept in the struct, the kernel
//   lost its __restrict__ and the cubins changed.)
// Lists (tiles.py): entry = key_tile << 1 | partial (the decoding kernels': ENTRY_SPAN below); tent holds the
// lists one after another, thead[qt] = {first entry's index, count, first entry, second entry}, so that a
// block starts its first loads after one 16-byte read.
#pragma once
#include "tc/common.cuh"

struct TcWork {
    int qt;       // query tile
    int bh;       // batch * head
    int T;        // positions in this block's residue class (STRIDE 1: the whole sequence)
    size_t base;  // element offset of the class's first row in Q and O (and K, V when KV_GROUP 1)
    size_t kv_base;  // element offset of the class's first row in K and V (grouped heads: of tc_kv_bh())
};

__device__ __forceinline__ unsigned tc_kv_bh() { return blockIdx.y / KV_GROUP; }

__device__ __forceinline__ TcWork tc_block_work(int T_all) {
    TcWork w;
    const int nq = gridDim.x;
    w.qt = nq - 1 - (int)blockIdx.x;  // the longest lists (causal: last tiles) first
    w.bh = blockIdx.y;
    // this block's residue class and its length (STRIDE 1: the whole sequence)
    w.T = (T_all - (int)blockIdx.z + STRIDE - 1) / STRIDE;
    w.base = (size_t)blockIdx.y * (size_t)T_all * HEAD_D + (size_t)blockIdx.z * HEAD_D;
    w.kv_base = KV_GROUP == 1 ? w.base : (size_t)tc_kv_bh() * (size_t)T_all * HEAD_D + (size_t)blockIdx.z * HEAD_D;
    return w;
}

// The backward's work items (attnbench.tiles.WorkItems: stretches of the transposed lists, the
// longest first): blockIdx.x = (item * classes + cls) * BH + bh, the item slowest, so that the
// longest items of every head and class are dispatched before any shorter one. qt is the item.
// (tc_item_work_at: the same for a block number b other than blockIdx.x, fast_tc_bwd_wg.cu's fused
// launch; tc_block_work_at: tc_block_work's for a block (x, y, z) of a grid nq blocks wide, no grouped heads)
__device__ __forceinline__ TcWork tc_item_work_at(int T_all, int BH, int b, int& item, int& cls) {
    TcWork w;
    const int C = STRIDE < T_all ? STRIDE : T_all;  // residue classes
    const int per = BH * C;
    item = b / per;
    const int r = b - item * per;
    cls = r / BH;
    w.bh = r - cls * BH;
    w.qt = item;
    w.T = (T_all - cls + STRIDE - 1) / STRIDE;
    w.base = (size_t)w.bh * (size_t)T_all * HEAD_D + (size_t)cls * HEAD_D;
    w.kv_base = w.base;  // (no grouped heads in a backward)
    return w;
}

__device__ __forceinline__ TcWork tc_item_work(int T_all, int BH, int& item, int& cls) {
    return tc_item_work_at(T_all, BH, (int)blockIdx.x, item, cls);
}

__device__ __forceinline__ TcWork tc_block_work_at(int T_all, int nq, int x, int y, int z) {
    TcWork w;
    w.qt = nq - 1 - x;
    w.bh = y;
    w.T = (T_all - z + STRIDE - 1) / STRIDE;
    w.base = (size_t)y * (size_t)T_all * HEAD_D + (size_t)z * HEAD_D;
    w.kv_base = w.base;
    return w;
}

// tc_block_work_at's for the flat number f of a block of that grid (f = x + nq * (y + BH * z), the order it launches
// in), its residue class z in cls (the backward's fused launch and its persistent pass)
__device__ __forceinline__ TcWork tc_block_work_flat(int T_all, int nq, int BH, int f, int& cls) {
    const int x = f % nq, r = f / nq;
    cls = r / BH;
    return tc_block_work_at(T_all, nq, x, r - cls * BH, cls);
}

// ENTRY_SPAN 1 (the decoding kernels' lists, attnbench/decode.py DecodeList.device_entries): entry = key_tile <<
// (1 + 2 SPAN_BITS) | lo << (1 + SPAN_BITS) | tail << 1 | partial, where the tile's rows that some query of the block
// may read lie in [SPAN_UNIT lo, tile rows - SPAN_UNIT tail); the K/V loads zero-fill the rows outside (tc_entry_lo,
// tc_entry_tail: 0 without it). SPAN_UNIT and SPAN_BITS come from the host (attnbench/decode_config.py).
#ifndef ENTRY_SPAN
#define ENTRY_SPAN 0
#endif
#if ENTRY_SPAN && !(defined(SPAN_UNIT) && defined(SPAN_BITS))
#error "ENTRY_SPAN: the host gives SPAN_UNIT and SPAN_BITS"
#endif
#if !ENTRY_SPAN
#define SPAN_UNIT 0
#define SPAN_BITS 0
#endif
#define TC_SPAN_MASK ((1 << SPAN_BITS) - 1)
__device__ __forceinline__ int tc_entry_tile(int ent) { return ent >> (1 + 2 * SPAN_BITS); }
__device__ __forceinline__ int tc_entry_lo(int ent) { return (ent >> (1 + SPAN_BITS) & TC_SPAN_MASK) * SPAN_UNIT; }
__device__ __forceinline__ int tc_entry_tail(int ent) { return (ent >> 1 & TC_SPAN_MASK) * SPAN_UNIT; }

struct TcTileList {
    int e0, n;        // the list's first entry's index in tent, its length
    int ring[STAGES];  // ring[s]: the entry of tile it + s (0 past the list), shifted down once per tile

    __device__ __forceinline__ void init(const int4* __restrict__ thead, const int* __restrict__ tent, int qt) {
        const int4 head = thead[qt];
        e0 = head.x;
        n = head.y;
        ring[0] = head.z;
        ring[1] = head.w;
#pragma unroll
        for (int s = 2; s < STAGES; ++s) ring[s] = s < n ? tent[e0 + s] : 0;
    }

    // a stretch of a list instead (a split of a decode's list): its n entries from tent[e0] (tent: the
    // entries' pointer, or anything indexed so: a decode's DecodeEntries)
    template <class Entries>
    __device__ __forceinline__ void init_range(const Entries& tent, int first, int count) {
        e0 = first;
        n = count;
#pragma unroll
        for (int s = 0; s < STAGES; ++s) ring[s] = s < n ? tent[e0 + s] : 0;
    }

    template <class Entries>
    __device__ __forceinline__ int next(const Entries& tent, int it, int& ahead) {
        const int nx = it + STAGES - 1;
        const int ent = ring[0];
        ahead = ring[STAGES - 1];
#pragma unroll
        for (int s = 0; s < STAGES - 1; ++s) ring[s] = ring[s + 1];
        ring[STAGES - 1] = nx + 1 < n ? tent[e0 + nx + 1] : 0;  // read a tile ahead of its use
        return ent;
    }

    // next(), for a walk that loads tile it + STAGES - 2 at step it (tc/loop_overlap.cuh, tc/decode_overlap.cuh): `near` is
    // that tile's entry, `far` tile it + STAGES - 1's (K's, a tile earlier than V's, tc/load_split.cuh)
    template <class Entries>
    __device__ __forceinline__ int next_near(const Entries& tent, int it, int& near, int& far) {
        near = ring[STAGES - 2];
        return next(tent, it, far);
    }
};
