// Where a row of the kernels lies in the arrays: the class-major layout read in place.
//
// The kernels index the rows of Q, K, V, O and dO (and write those of dQ, dK and dV) as positions of their
// pattern. For the class-major layout (attnbench/classes.py: position c * LAYOUT_N + a of the layout stands for
// position a * LAYOUT_R + c of the sequence) with LAYOUT_R > 1, the arrays stay in the sequence's order and these
// helpers put a layout row where it lies there, so that no copy moves them into the layout and back. Every tile
// of LAYOUT_N's multiple of 128 rows lies in one class, so a tile's rows are LAYOUT_R rows of the arrays apart and a
// bulk tensor copy moves a tile through a 4-d map [B * H][LAYOUT_N][LAYOUT_R][HEAD_D] (attnbench/tma.py,
// head_maps with classes): the box (64 columns, class 1 wide, the tile's rows, one head) at (column, class, a,
// head). The row-major internals (the log-sum-exp, the (lse, delta) rows, dQ's float32 accumulator, the split key
// tiles' sums) stay in the layout's order. LAYOUT_R 1 (the default): rows are where they are, the code of before.
//
// Interface:
//   tc_seq_row(row): the row of the arrays that layout row `row` (< T) is; tc_flat_row(row): the same for a row of
//     the flat [B * H * T] view (the element-wise kernels'; T = LAYOUT_R * LAYOUT_N there).
//   TC_ROW_STEP: rows of the arrays between two consecutive rows of one class's tile.
//   tc_tma_load_rows(dst, map, col, row0, bh, bar): the box at column col, rows row0.. of head bh (a 3-d map's, or
//     with LAYOUT_R > 1 the 4-d map's), completing on bar; tc_tma_store_rows(map, col, row0, bh, src): the store.
#pragma once

#ifndef LAYOUT_R
#define LAYOUT_R 1
#endif
#ifndef LAYOUT_N
#define LAYOUT_N 1
#endif
static_assert(LAYOUT_R == 1 || (STRIDE == 1 && LAYOUT_N % 128 == 0),
              "LAYOUT_R: an unstrided pattern whose classes hold a multiple of 128 rows");

#define TC_ROW_STEP LAYOUT_R

__device__ __forceinline__ int tc_seq_row(int row) {
    if (LAYOUT_R == 1) return row;
    const int c = row / LAYOUT_N;
    return (row - c * LAYOUT_N) * LAYOUT_R + c;
}

// ... of a row of the flat [B * H * T] view (T = LAYOUT_R * LAYOUT_N with LAYOUT_R > 1)
__device__ __forceinline__ long long tc_flat_row(long long row) {
    if (LAYOUT_R == 1) return row;
    const long long bh = row / (LAYOUT_R * LAYOUT_N);
    const long long at = bh * (LAYOUT_R * LAYOUT_N);
    return at + tc_seq_row((int)(row - at));
}

__device__ __forceinline__ void tc_tma_load_rows(unsigned dst, const void* map, int col, int row0, int bh, unsigned bar) {
    if (LAYOUT_R == 1) {
        tma_load3(dst, map, col, row0, bh, bar);
    } else {
        const int c = row0 / LAYOUT_N;
        tma_load4(dst, map, col, c, row0 - c * LAYOUT_N, bh, bar);
    }
}

__device__ __forceinline__ void tc_tma_store_rows(const void* map, int col, int row0, int bh, unsigned src) {
    if (LAYOUT_R == 1) {
        tma_store3(map, col, row0, bh, src);
    } else {
        const int c = row0 / LAYOUT_N;
        tma_store4(map, col, c, row0 - c * LAYOUT_N, bh, src);
    }
}
