// fast_tc's compile-time constants (-D, with their defaults) and the shapes derived from them.
//
// HEAD_D (64 or 128), BN (keys per tile, multiple of 16), STRIDE, QREG, WG, NWARPS, MT, KWG, MINB
// (blocks per SM for __launch_bounds__), STAGES (>= 2), TMA, OV, REL, KVS, PP, AB_F16 (1: float16, 0: bfloat16),
// KV_GROUP (query heads per key/value head, H / H_kv: grouped-query heads; default 1),
// LAZY (default WG), FWD_LSE (default 0), and the pattern itself: CAUSAL, AB_PATTERN_T and AB_PATTERN_ARGS
// (Mask.device_defines() of Mask.tile_predicate(BM, BN); kernels/common.cuh), its parameters as
// constants so that its divisions become multiplications by constants.
#pragma once

#ifndef HEAD_D
#define HEAD_D 64
#endif
#ifndef BN
#define BN 64
#endif
#ifndef NWARPS
#define NWARPS 4
#endif
#ifndef STAGES
#define STAGES 3
#endif
#ifndef AB_F16
#define AB_F16 0
#endif
#ifndef CAUSAL
#define CAUSAL 1
#endif

#ifndef MT
#define MT 1
#endif
#ifndef STRIDE
#define STRIDE 1
#endif
#ifndef QREG
#define QREG 1
#endif
#ifndef MINB
#define MINB 1
#endif
#ifndef WG
#define WG 0
#endif
#ifndef TMA
#define TMA 0
#endif
// OV 1: the products of consecutive tiles overlapped (tc/loop_overlap.cuh; WG, TMA, STAGES >= 3)
#ifndef OV
#define OV 0
#endif
// REL 1: with WG and TMA, the stages released by the warps' arrivals on a barrier each, no block barrier a tile
// (tc/load_released.cuh; either walk, the lazy pass's vote then over the warpgroup)
#ifndef REL
#define REL 0
#endif
// KVS 1: with OV and REL, K and V on stages of their own, K loaded a tile further ahead (tc/load_split.cuh)
#ifndef KVS
#define KVS 0
#endif
// PP 1: with OV, REL and two warpgroups or more, the warpgroups issue their products in turn (tc/turns.cuh)
#ifndef PP
#define PP 0
#endif
// LAZY 1: the exponentials against the running max first (WG builds; the mma.sync builds spill
// with it at D=64 and take the tile's max on every tile); tc/softmax.cuh
#ifndef LAZY
#define LAZY WG
#endif
// KV_GROUP: query heads sharing one key/value head (H / H_kv); 1 (the default) compiles the code of
// H_kv = H, K and V at Q's offsets (tc/scheduler.cuh)
#ifndef KV_GROUP
#define KV_GROUP 1
#endif
// FWD_LSE 1: fast_tc.cu's entry point is fast_tc_fwd_lse, which also stores each row's log-sum-exp
#ifndef FWD_LSE
#define FWD_LSE 0
#endif

// KWG: warpgroups that share a block's rows, each taking its BN keys of every stage of KWG x BN (kernels/decode.cu's
// rows kernel on warpgroup MMA: 1 or 2; default 1, every other kernel)
#ifndef KWG
#define KWG 1
#endif

#define THREADS (NWARPS * 32)
#define RW (MT * 16)  // query rows per warp
#define BM (NWARPS / KWG * RW)
#define CH (HEAD_D / 8)  // 16-byte chunks per row
#define TILE_BYTES (KWG * BN * HEAD_D * 2)  // a stage's K (or V) tile

static_assert(HEAD_D % 64 == 0, "HEAD_D must be a multiple of 64");
static_assert(BN % 16 == 0, "BN must be a multiple of 16");
static_assert(STAGES >= 2, "STAGES must be at least 2");
static_assert(KV_GROUP >= 1, "KV_GROUP must be at least 1");
#if WG
static_assert(MT == 1 && NWARPS % 4 == 0, "WG: one m16 tile per warp, whole warpgroups");
static_assert(BN == 32 || BN == 64 || BN == 128, "WG: BN 32, 64 or 128");
#endif
static_assert(KWG == 1 || (KWG == 2 && WG && NWARPS == 4 * KWG && !TMA),
              "KWG 2: two warpgroups on the same rows, wgmma, cp.async");
#if TMA
static_assert(WG && STRIDE == 1, "TMA: with WG, on unstrided patterns");
#endif
#if OV
static_assert(WG && TMA && STAGES >= 3, "OV: with WG and TMA, 3 stages or more");
#endif
#if REL
static_assert(WG && TMA, "REL: the wgmma products with bulk tensor copies");
#endif
#if KVS
static_assert(OV && REL, "KVS: the overlapped walk with REL");
#endif
#if PP
static_assert(OV && REL && NWARPS >= 8 && NWARPS <= 16, "PP: the overlapped walk with REL, two to four warpgroups");
#endif
