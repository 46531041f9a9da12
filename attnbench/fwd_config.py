"""fast-tc's forward shape (``TileConfig``) and how one is chosen: the shape table ``SHAPES`` with the reason for each
entry, the thresholds that pick a role (``choose_config``), ``--tile-config``'s fields (``parse_tile_config``) and a
build's -D constants (``kernel_defines``, ``pattern_defines``). The launches are ``fast_tc``'s.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from .errors import BadInput
from .patterns import Mask
from .shape_fields import parse_fields
from .tiles import tile_list

WG_ARCH = "sm_90a"


@dataclass(frozen=True)
class TileConfig:
    """Compile-time shape of the kernel for one head dimension."""
    NWARPS: int
    BN: int
    STAGES: int
    MT: int = 1    # m16 row tiles per warp
    MINB: int = 1  # blocks per multiprocessor asked of the register allocator
    QREG: int = 1  # 1: Q fragments held in registers; 0: read from shared memory per key tile
    WG: int = 0    # 1: Hopper warpgroup MMA (wgmma, sm_90a) instead of mma.sync; MT=1
    TMA: int = 0   # 1 (with WG): Q, K and V tiles by bulk tensor copies (unstrided patterns; else cp.async)
    OV: int = 0    # 1 (with WG, TMA, STAGES >= 3): S of a tile issued beside P V of the one before, the softmax
    #                between them overlapping P V (kernels/tc/loop_overlap.cuh); unstrided patterns
    REL: int = 0   # 1 (with WG, TMA): the warps release each stage by barrier arrivals, no block barrier a tile
    #                (kernels/tc/load_released.cuh; either walk)
    PP: int = 0    # 1 (with OV, REL, two warpgroups or more): the warpgroups issue their products in turn
    #                (FlashAttention-3's ping-pong, kernels/tc/turns.cuh)
    KVS: int = 0   # 1 (with OV, REL): K and V on stages of their own, K loaded a tile further ahead
    #                (kernels/tc/load_split.cuh)

    @property
    def arch(self) -> str | None:
        """The target this shape needs beyond what CuPy picks for the device (None: any)."""
        return WG_ARCH if self.WG else None

    @property
    def BM(self) -> int:
        return 16 * self.MT * self.NWARPS

    @property
    def threads(self) -> int:
        return 32 * self.NWARPS

    def smem_bytes(self, D: int) -> int:
        # with TMA, an 8-byte mbarrier for Q and one per stage after the tiles
        # (REL: one more a stage, the warps' releases; KVS: K's and V's apart, four a stage)
        bars = 8 * (self.STAGES + 1) + (8 * self.STAGES if self.REL else 0) + (16 * self.STAGES if self.KVS else 0)
        return 2 * D * (self.BM + 2 * self.STAGES * self.BN) + (bars if self.TMA else 0)

    @property
    def spec(self) -> str:
        """Every field, in the ``--tile-config`` form: 'NWARPS=4,BN=64,STAGES=2,MT=1,...' (OV, REL, PP and KVS only where
        set)."""
        return ",".join(f"{f}={getattr(self, f)}" for f in TILE_FIELDS if f not in OPTIONAL_FIELDS or getattr(self, f))

    def problem(self) -> str | None:
        """Why the kernel cannot be built with this shape (kernels/tc/config.cuh), or None."""
        if self.WG and (self.MT != 1 or self.NWARPS % 4):
            return "WG=1 needs MT=1 and NWARPS a multiple of 4 (whole warpgroups)"
        if self.WG and self.BN not in (32, 64, 128):
            return "WG=1 needs BN 32, 64 or 128"
        if self.TMA and not self.WG:
            return "TMA=1 needs WG=1"
        if self.OV and not (self.WG and self.TMA and self.STAGES >= 3):
            return "OV=1 needs WG=1, TMA=1 and STAGES >= 3 (P V of a tile reads its stage through the next step)"
        if self.REL and not (self.WG and self.TMA):
            return "REL=1 needs WG=1 and TMA=1 (the warps release the stages of bulk tensor copies)"
        if self.KVS and not (self.OV and self.REL):
            return "KVS=1 needs OV=1 and REL=1 (the overlapped walk releases K's and V's stages apart)"
        if self.PP and not (self.OV and self.REL and 8 <= self.NWARPS <= 16):
            return "PP=1 needs OV=1, REL=1 and NWARPS 8 to 16 (two to four warpgroups taking turns)"
        return None


TILE_FIELDS = tuple(f.name for f in fields(TileConfig))
OPTIONAL_FIELDS = ("OV", "REL", "PP", "KVS")  # left out of a spec where 0, and of a positional shape unless given
# (least, most, step) of each field on the command line; the kernel's own rules in TileConfig.problem
TILE_LIMITS = {"NWARPS": (1, 32, 1), "BN": (16, 256, 16), "STAGES": (2, 8, 1), "MT": (1, 4, 1),
               "MINB": (1, 32, 1), "QREG": (0, 1, 1), "WG": (0, 1, 1), "TMA": (0, 1, 1), "OV": (0, 1, 1),
               "REL": (0, 1, 1), "PP": (0, 1, 1), "KVS": (0, 1, 1)}


@dataclass(frozen=True)
class TileSpec:
    """Tile shape fields given on the command line (``--tile-config``); the fields not given come
    from the shape fast-tc chooses for each configuration (``choose_config``)."""
    given: tuple  # (field, value) pairs in TILE_FIELDS order
    whole: bool = False  # given by position: OV, REL, PP and KVS, where not named, are 0 (TileConfig's defaults)

    def __str__(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.given)

    def apply(self, cfg: TileConfig) -> TileConfig:
        """``cfg`` with the given fields. OV, REL, PP and KVS, where not given, are 0 in a whole shape (given by
        position) and follow ``cfg`` elsewhere if the shape they give can be built (STAGES=2: the serial walk)."""
        given = dict(self.given)
        if self.whole:
            given = {**{f: 0 for f in OPTIONAL_FIELDS}, **given}
        out = replace(cfg, **given)
        if out.problem() and not all(f in given for f in OPTIONAL_FIELDS):
            plain = replace(out, **{f: 0 for f in OPTIONAL_FIELDS if f not in given})
            if not plain.problem():
                return plain
        return out


def parse_tile_config(text: str, option: str = "--tile-config") -> TileSpec:
    """'FIELD=N,...' (any of NWARPS, BN, STAGES, MT, MINB, QREG, WG, TMA, OV, REL, PP, KVS; the others as fast-tc
    chooses them) or the positional 'NWARPS,BN,STAGES[,MT[,MINB[,QREG[,WG[,TMA[,OV[,REL[,PP[,KVS]]]]]]]]]' (a whole shape,
    the fields left out at TileConfig's defaults). BadInput naming ``option`` and the limit."""
    given = parse_fields(text, option, TileConfig, TILE_LIMITS, min_positional=3)
    if "=" not in text:
        for f in OPTIONAL_FIELDS:  # a positional shape names the overlapped walk only where it asks for it
            if not given.get(f):
                given.pop(f, None)
    spec = TileSpec(tuple((f, given[f]) for f in TILE_FIELDS if f in given), whole="=" not in text)
    if set(TILE_FIELDS) - set(OPTIONAL_FIELDS) <= set(given):  # a whole shape: the kernel's rules are known now
        why = TileConfig(**given).problem()
        if why:
            raise BadInput(f"{option} {text!r}: {why}")
    return spec


# The tile shapes, one table: (products, role, D) -> (shape, why). Products "sync" (mma.sync, also
# fast-tc-sync) or "wgmma" (sm_90: wgmma with bulk tensor copies, TMA); roles "long" (wgmma only, unstrided
# patterns whose rows average >= LONG_KEYS_PER_ROW[D] allowed keys), "wide" (rows averaging >=
# WIDE_KEYS_PER_ROW[D] allowed keys), "partial" (every tile of the default list is partial) and "strided"
# (not a shape: the blocks per SM asked for strided patterns, which load by cp.async on sm_90). Chosen from
# interleaved timings on an H200; the history of each choice is in docs/PERF.md ("Shape table (moved from
# fast_tc.py)", and for "long" "forward: two warpgroups sharing 128-key tiles for long lists").
SHAPES: dict[tuple[str, str, int], tuple[TileConfig | int, str]] = {
    ("sync", "default", 64): (TileConfig(NWARPS=4, BN=64, STAGES=2, MINB=4, QREG=0),
                              "64-key tiles in 2 stages, Q read from shared memory: 4 blocks per SM"),
    ("sync", "default", 128): (TileConfig(NWARPS=4, BN=64, STAGES=2),
                               "64-key tiles in 2 stages, Q held in registers"),
    ("sync", "wide", 64): (TileConfig(NWARPS=4, BN=64, STAGES=2, MT=2),
                           "two m16 tiles per warp amortise each K/V fragment over 32 rows"),
    ("sync", "wide", 128): (TileConfig(NWARPS=4, BN=32, STAGES=3, MT=2, QREG=0),
                            "MT 2 with Q from shared memory, 32-key tiles in 3 stages: 2 blocks per SM, no spills"),
    ("sync", "partial", 64): (TileConfig(NWARPS=2, BN=32, STAGES=3, MINB=8),
                              "32-key tiles (less masked work) in 2-warp blocks, 8 per SM"),
    ("sync", "partial", 128): (TileConfig(NWARPS=4, BN=32, STAGES=3),
                               "32-key tiles (less masked work) in 3 stages"),
    ("wgmma", "default", 64): (TileConfig(NWARPS=4, BN=64, STAGES=2, MINB=4, QREG=0, WG=1, TMA=1),
                               "64-key tiles in 2 stages: with TMA loads, 5 blocks' shared memory beat 3 stages"),
    ("wgmma", "default", 128): (TileConfig(NWARPS=4, BN=32, STAGES=2, MINB=4, QREG=0, WG=1, TMA=1),
                                "32-key tiles in 2 stages, 4 blocks per SM: short lists (window 256, block-diagonal, "
                                "streaming 16+64) 4-9% faster than the wide shape's 2 blocks per SM"),
    ("wgmma", "wide", 64): (TileConfig(NWARPS=4, BN=64, STAGES=2, MINB=4, QREG=0, WG=1, TMA=1),
                            "the default: 128-key tiles were within 1% on dense, 4% slower on window 4096"),
    ("wgmma", "wide", 128): (TileConfig(NWARPS=4, BN=64, STAGES=3, QREG=0, WG=1, TMA=1, OV=1),
                             "64-key tiles in 3 stages, S of a tile beside P V of the one before: 1-4% on every "
                             "unstrided llm instance; document and streaming 4+1024 1-7% ahead of the default"),
    ("wgmma", "long", 64): (TileConfig(NWARPS=8, BN=128, STAGES=2, MINB=2, QREG=0, WG=1, TMA=1),
                            "two warpgroups share 128-key tiles: dense 9% faster, window 4096 even, shorter lists slower"),
    ("wgmma", "long", 128): (TileConfig(NWARPS=8, BN=128, STAGES=3, QREG=0, WG=1, TMA=1, OV=1, REL=1),
                             "two warpgroups share 128-key tiles, products overlapped, stages released by the warps: "
                             "dense 12% and window 4096 8% faster, then REL 7% more on both"),
    ("wgmma", "partial", 64): (TileConfig(NWARPS=4, BN=64, STAGES=2, MINB=4, QREG=0, WG=1, TMA=1),
                               "the default: with the lazy softmax 32-key tiles lost their lead"),
    ("wgmma", "partial", 128): (TileConfig(NWARPS=4, BN=32, STAGES=2, MINB=4, QREG=0, WG=1, TMA=1),
                                "the default: 4 blocks per SM were 1-9% faster than 3 stages at 2 blocks per SM"),
    ("wgmma", "strided", 64): (5, "cp.async addressing took 106 registers at 4 blocks per SM; 5 holds it to 92, faster"),
}
# rows averaging at least this many allowed keys take the wide shape (D=128: it paid from
# streaming 4+1024 up, about 1000 keys a row; D=64: only from window 4096 up)
WIDE_KEYS_PER_ROW: dict[int, int] = {64: 2048, 128: 512}
# unstrided rows averaging at least this many allowed keys take the long shape on sm_90 (at D=128 window 4096,
# about 3900 keys a row, gained 8% and document and streaming 4+1024, about 1000, lost 1-4%; at D=64 window
# 4096 was even and dense, 16384, gained 9%)
LONG_KEYS_PER_ROW: dict[int, int] = {64: 4096, 128: 2048}
# whether a pattern whose predicate is the user's own (custom) takes the long shape: at D=64 its 2 blocks an SM
# hold 128 registers, where a heavy expression spilled (180 bytes; at D=128 the same took 232 registers, no spill)
LONG_USER_PREDICATES: dict[int, bool] = {64: False, 128: True}


def shape(products: str, role: str, D: int) -> TileConfig:
    """The table's shape for these products ("sync" or "wgmma"), role and head dimension."""
    cfg = SHAPES[(products, role, D)][0]
    assert isinstance(cfg, TileConfig)
    return cfg


def _role_table(products: str, role: str) -> dict[int, TileConfig]:
    return {D: cfg for (p, r, D), (cfg, _) in SHAPES.items() if (p, r) == (products, role)}


# The table by role, under the names the tests and scripts use.
CONFIGS = _role_table("sync", "default")
WIDE_CONFIGS = _role_table("sync", "wide")
PARTIAL_CONFIGS = _role_table("sync", "partial")
HOPPER_CONFIGS = _role_table("wgmma", "default")
HOPPER_WIDE_CONFIGS = _role_table("wgmma", "wide")
HOPPER_PARTIAL_CONFIGS = _role_table("wgmma", "partial")
HOPPER_LONG_CONFIGS = _role_table("wgmma", "long")
HOPPER_STRIDED_MINB: dict[int, int] = _role_table("wgmma", "strided")  # type: ignore[assignment]


def choose_config(mask: Mask, D: int, wgmma: bool = False) -> TileConfig:
    """The tile shape for a pattern (its inner pattern when strided), from SHAPES for mma.sync or
    with ``wgmma`` for sm_90: long (sm_90, unstrided, a user's predicate where LONG_USER_PREDICATES[D]) when
    rows average >= LONG_KEYS_PER_ROW[D] allowed keys, wide when they average >= WIDE_KEYS_PER_ROW[D], partial
    when every tile of the default list is partial, else the default; strided patterns on sm_90 with at least
    the "strided" blocks per SM."""
    products = "wgmma" if wgmma else "sync"
    stride, mask = mask.strided()
    if (stride == 1 and (products, "long", D) in SHAPES and mask.pairs >= LONG_KEYS_PER_ROW[D] * mask.T
            and (LONG_USER_PREDICATES[D] or not mask.pattern.user_predicate)):
        cfg = shape(products, "long", D)
    elif mask.pairs >= WIDE_KEYS_PER_ROW[D] * mask.T:
        cfg = shape(products, "wide", D)
    else:
        cfg = shape(products, "default", D)
        t = tile_list(mask, cfg.BM, cfg.BN)
        if t.n_visited and t.n_partial == t.n_visited:
            cfg = shape(products, "partial", D)
    minb = SHAPES.get((products, "strided", D), (0, ""))[0]
    if stride > 1 and cfg.MINB < minb:
        cfg = replace(cfg, MINB=minb)
    return cfg


def pattern_defines(mask: Mask) -> dict:
    """The pattern compiled in with its parameters as constants, and CAUSAL for the kernel's own tests."""
    return dict(CAUSAL=int(mask.causal), **mask.device_defines())


def kernel_defines(D: int, dtype: str, mask: Mask, cfg: TileConfig | None = None, group: int = 1) -> dict:
    """The -D constants of kernels/fast_tc.cu for a head dimension, dtype and pattern (the
    inner pattern and its stride when the pattern is strided); ``group`` query heads per key/value
    head (H / H_kv, grouped-query heads) as KV_GROUP, left out at 1 (the builds of H_kv = H as before)."""
    cfg = cfg or choose_config(mask, D)
    stride, inner = mask.strided()
    d = dict(HEAD_D=D, BN=cfg.BN, NWARPS=cfg.NWARPS, STAGES=cfg.STAGES, MT=cfg.MT, MINB=cfg.MINB, QREG=cfg.QREG,
             AB_F16=int(dtype == "float16"), STRIDE=stride)
    if group != 1:
        d["KV_GROUP"] = group
    if cfg.WG:
        d["WG"] = 1
    if uses_tma(cfg, mask):
        d["TMA"] = 1
        if cfg.OV:  # (a strided pattern loads by cp.async: its walk stays the serial one, without REL)
            d["OV"] = 1
        if cfg.REL:
            d["REL"] = 1
            if cfg.PP:
                d["PP"] = 1
            if cfg.KVS:
                d["KVS"] = 1
    d.update(pattern_defines(inner.tile_predicate(cfg.BM, cfg.BN)))
    return d


def uses_tma(cfg: TileConfig, mask: Mask) -> bool:
    """Tiles by bulk tensor copies: asked by the shape and the pattern is not strided (a residue
    class's rows are no box of the [B*H, T, D] view; strided patterns keep cp.async)."""
    return bool(cfg.WG and cfg.TMA and mask.strided()[0] == 1)


# the forward that stores the log-sum-exp holds its row sums to the end: at 4 blocks a multiprocessor
# (128 registers) the mma.sync D=64 build spills, at 3 it does not
LSE_MAX_MINB = 3


def lse_shape(cfg: TileConfig) -> TileConfig:
    """The shape of the forward with the log-sum-exp (FWD_LSE) for a forward of shape ``cfg``."""
    return replace(cfg, MINB=min(cfg.MINB, LSE_MAX_MINB))
