"""``fast-tc`` and ``fast-tc-sync``: tensor-core attention for bfloat16 / float16 (kernels/fast_tc.cu).

A FlashAttention-2-style forward pass that visits only the key tiles of ``Mask.tiles(BM, BN)``
for each query tile, applying the pattern predicate only on tiles flagged partial. Tile shape,
warps and pipeline depth are compile-time constants chosen per head dimension (``SHAPES``); the
pattern (id, causal flag, parameters) is compiled in too, so each pattern gets its own module.
``fast-tc`` multiplies with Hopper's warpgroup MMA (wgmma, the "wgmma" shapes) on sm_90, its tiles
moved by bulk tensor copies (TMA, maps from ``attnbench.tma``), and with mma.sync elsewhere;
``fast-tc-sync`` is the mma.sync kernel with cp.async on every GPU.
A strided pattern (``Mask.strided``: dilated) runs as its inner pattern on every residue class,
one grid layer per class, rows gathered at the stride: no tile of it is partial for the stride.
Both take the passes bwd and fwd+bwd too: the forward with FWD_LSE 1 (entry fast_tc_fwd_lse) saves
each row's log-sum-exp and the backward runs after it (fast-tc on sm_90: kernels/fast_tc_bwd_wg.cu on
wgmma; fast-tc elsewhere and fast-tc-sync: kernels/fast_tc_bwd.cu on mma.sync); see ``attnbench.fast_tc_bwd``, whose ``forward_lse`` and ``backward`` are re-exported here.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import numpy as np

from .arrays import bind
from .compile import get_module
from .errors import BadInput
from .impls import Impl, Problem, Runner, register, timed
from .patterns import Mask
from .tiles import setup_times, tile_list
from .tma import TensorMap, head_maps

KERNEL = "fast_tc"
ENTRY = "fast_tc_fwd"
ENTRY_LSE = "fast_tc_fwd_lse"  # the forward that also stores each row's log-sum-exp (FWD_LSE 1)
LOG2E = 1.4426950408889634
DEFAULT_SMEM = 48 * 1024
MAX_GRID_Y = 65535
MAX_GRID_Z = 65535
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


def parse_fields(text: str, option: str, cls, limits: dict, min_positional: int) -> dict:
    """The integer fields of a shape given as 'FIELD=N,...' (any case) or all by position (at least
    ``min_positional``, the rest at the dataclass ``cls``'s defaults), each within ``limits``
    (field: (least, most, step)); BadInput naming ``option`` and the limit. fast-tc's
    ``--tile-config``, fast-decode's ``--decode-config``."""
    names = tuple(f.name for f in fields(cls))
    where = f"{option} {text!r}"
    parts = [p.strip() for p in str(text).split(",")]
    if not parts or not all(parts):
        raise BadInput(f"{where}: expected FIELD=N,... or {','.join(names[:min_positional])}"
                       f"[,{','.join(names[min_positional:])}]")
    if all("=" not in p for p in parts):  # positional: a whole shape
        if not min_positional <= len(parts) <= len(names):
            raise BadInput(f"{where}: the positional form takes {min_positional} to {len(names)} numbers "
                           f"({','.join(names)}), got {len(parts)}")
        defaults = {f.name: f.default for f in fields(cls)}
        pairs = list(zip(names, parts)) + [(f, str(defaults[f])) for f in names[len(parts):]]
    elif all("=" in p for p in parts):
        pairs = [tuple(x.strip() for x in p.split("=", 1)) for p in parts]
    else:
        raise BadInput(f"{where}: give every field as FIELD=N, or all of them by position")
    given = {}
    for key, value in pairs:
        name = key.upper()
        if name not in limits:
            raise BadInput(f"{where}: unknown field {key!r} (fields: {', '.join(names)})")
        if name in given:
            raise BadInput(f"{where}: {name} given twice")
        try:
            v = int(value)
        except ValueError:
            raise BadInput(f"{where}: {name}={value!r} is not an integer") from None
        lo, hi, step = limits[name]
        if not lo <= v <= hi or v % step:
            limit = "0 or 1" if (lo, hi) == (0, 1) else f"{f'a multiple of {step} ' if step > 1 else ''}from {lo} to {hi}"
            raise BadInput(f"{where}: {name}={v} must be {limit}")
        given[name] = v
    return given


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


class FastTCRunner(Runner):
    def __init__(self, kernel, grid, block, smem, args, out, setup, cfg):
        self.cfg = cfg
        self._kernel = kernel
        self._grid = grid
        self._block = block
        self._smem = smem
        self._args = args
        self._out = out
        self.setup = setup

    def run(self) -> None:
        self._kernel(self._grid, self._block, self._args, shared_mem=self._smem)


@dataclass(eq=False)
class FastTC(Impl):
    # the backward runs after this impl's forward with the log-sum-exp, on the same products: wgmma on
    # sm_90 for fast-tc (kernels/fast_tc_bwd_wg.cu), mma.sync otherwise (kernels/fast_tc_bwd.cu)
    passes = ("fwd", "bwd", "fwd+bwd")
    # the forward takes grouped-query heads (H_kv < H: query head h reads key/value head h // (H / H_kv),
    # KV_GROUP); prefill only (Tq = Tk, no ragged batch: fast-decode's), and no backward there (Problem)
    gqa = True
    wgmma: bool = True  # take the Hopper shapes on sm_90
    tile: TileSpec | None = None  # fields of the chosen shape fixed (``--tile-config``)
    bwd: object = None  # bwd_config.BwdSpec: fields of the backward fixed (``--bwd-config``)
    # run on the class-major layout (``attnbench.classes``): True always (fast-tc-classes), None where the
    # layout's lists visit fewer tiles by ``classes.MIN_GAIN`` (fast-tc), False never (fast-tc-sync)
    classes: bool | None = False

    def tile_variant(self, spec: TileSpec) -> "FastTC":
        """Named '<name>[<spec>]': the shape it chooses with ``spec``'s fields fixed."""
        return replace(self, name=f"{self.name}[{spec}]", tile=spec,
                       description=f"{self.name} with the tile shape fields {spec} (the others as it chooses)")

    def bwd_variant(self, spec) -> "FastTC":
        """Named '<name>[bwd:<spec>]': its backward with ``spec``'s fields fixed (a
        ``bwd_config.BwdSpec``); the forward alone is its own row, so pass=fwd is skipped."""
        return replace(self, name=f"{self.name}[bwd:{spec}]", bwd=spec,
                       description=f"{self.name} with the backward fields {spec} (the others as it chooses)")

    def shape_for(self, mask: Mask, D: int, wgmma: bool | None = None) -> TileConfig:
        """The shape it runs ``mask`` with at head dimension ``D`` (``wgmma`` None: as the device says)."""
        cfg = choose_config(mask, D, self.uses_wgmma() if wgmma is None else wgmma)
        return self.tile.apply(cfg) if self.tile is not None else cfg

    def uses_wgmma(self) -> bool:
        import cupy

        return self.wgmma and cupy.cuda.Device().compute_capability == "90"

    def unsupported(self, prob: Problem) -> str | None:
        why = super().unsupported(prob)
        if why:
            return why
        if self.bwd is not None and prob.pass_name == "fwd":
            return f"{self.name} fixes backward fields: its forward is {self.name.split('[bwd:')[0]}'s row"
        if prob.D not in CONFIGS:
            return (f"D={prob.D} is not supported by {self.name} "
                    f"(supports D in {', '.join(map(str, sorted(CONFIGS)))})")
        if prob.B * prob.H > MAX_GRID_Y:
            return f"B*H={prob.B * prob.H} exceeds {MAX_GRID_Y} for {self.name}"
        if self.classes and prob.mask.class_major()[0] == 1:
            return (f"{self.name}: {prob.mask.label()} at T={prob.T} has no class-major layout (its pairs of "
                    f"residue classes are no bands, or T is no multiple of the classes); fast-tc runs it")
        stride = prob.mask.strided()[0]
        if min(stride, prob.T) > MAX_GRID_Z:
            return f"dilation={stride} exceeds {MAX_GRID_Z} for {self.name} (one grid layer per residue class)"
        return None

    def takes_classes(self, mask: Mask) -> bool:
        """Whether ``mask`` runs on its class-major layout (``classes``)."""
        if self.classes is None:
            from .classes import prefers

            return prefers(mask)
        return bool(self.classes)

    def build(self, prob: Problem, q, k, v, cfg: TileConfig | None = None, do=None) -> Runner:
        if self.takes_classes(prob.mask):
            from .classes import build as build_classes

            return build_classes(self, prob, q, k, v, cfg, do)
        if prob.pass_name != "fwd":
            from .fast_tc_bwd import build_backward

            return build_backward(self, prob, q, k, v, do, cfg)
        import cupy

        if do is not None:
            raise BadInput(f"do= is the output's gradient of a backward pass; pass={prob.pass_name} takes none")
        arrays = bind_inputs(prob, q, k, v)
        setup: dict = {}
        cfg = self.checked_shape(prob, cfg, setup)
        out = cupy.empty(prob.shape, dtype=arrays[0].dtype)
        ln = forward_launch(prob, cfg, arrays, out, setup=setup)
        runner = FastTCRunner(ln.kernel, ln.grid, ln.block, ln.smem, ln.args, out, setup, cfg)
        runner.maps = ln.maps  # the host bytes the launch copies the maps from
        return runner

    def checked_shape(self, prob: Problem, cfg: TileConfig | None, setup: dict) -> TileConfig:
        """The forward's tile shape for ``prob`` (``cfg`` when given), refused by name when the kernel
        cannot be built with it or this GPU cannot run it; its choice timed into ``setup``."""
        import cupy

        with timed(setup, "config_s"):  # the lists it looked at included
            cfg = cfg or self.shape_for(prob.mask, prob.D)
        why = cfg.problem()
        if why:
            raise BadInput(f"{self.name}: tile shape {cfg.spec}: {why}")
        setup["tile_config"] = cfg.spec  # the shape it ran (the setup_s column)
        if cfg.WG and cupy.cuda.Device().compute_capability != "90":
            raise BadInput(f"{self.name}: tile shape {cfg} needs an sm_90 GPU (wgmma), "
                           f"this one is sm_{cupy.cuda.Device().compute_capability}")
        return cfg


def bind_inputs(prob: Problem, *arrays, names: str = "qkv") -> list:
    """CuPy storage arrays of the inputs, each of the problem's shape and dtype (BadInput naming it):
    k and v of ``prob.kv_shape`` ([B, H_kv, T, D]), the others of ``prob.shape``."""
    out = [bind(x, name, prob.dtype).array for x, name in zip(arrays, names)]
    for a, name in zip(out, names):
        want = prob.kv_shape if name in ("k", "v") else prob.shape
        if tuple(a.shape) != want:
            raise BadInput(f"{name} has shape {tuple(a.shape)}, expected {want}")
    return out


@dataclass
class Launch:
    """One kernel launch bound to its arguments (``maps``: the host bytes of its tensor maps)."""
    kernel: object
    grid: tuple
    block: tuple
    smem: int
    args: tuple
    maps: list = field(default_factory=list)

    def __call__(self) -> None:
        self.kernel(self.grid, self.block, self.args, shared_mem=self.smem)


def table_array(mask: Mask):
    """The pattern's table on the device (int32; one 0 for a pattern without one)."""
    import cupy

    table = mask.table
    return cupy.asarray(table if table is not None else np.zeros(1, np.int32), dtype=cupy.int32)


# the forward that stores the log-sum-exp holds its row sums to the end: at 4 blocks a multiprocessor
# (128 registers) the mma.sync D=64 build spills, at 3 it does not
LSE_MAX_MINB = 3


def lse_shape(cfg: TileConfig) -> TileConfig:
    """The shape of the forward with the log-sum-exp (FWD_LSE) for a forward of shape ``cfg``."""
    return replace(cfg, MINB=min(cfg.MINB, LSE_MAX_MINB))


def forward_launch(prob: Problem, cfg: TileConfig, arrays, out, lse=None, setup: dict | None = None) -> Launch:
    """The forward of ``prob`` on q, k, v (``arrays``) into ``out``, with shape ``cfg``; with ``lse``
    (float32 [B, H, T]) the entry that also stores each row's log-sum-exp (natural log, FWD_LSE).
    The list build, compile and map encoding are timed into ``setup``."""
    setup = {} if setup is None else setup
    cfg = lse_shape(cfg) if lse is not None else cfg
    stride, inner = prob.mask.strided()
    tiles = tile_list(inner, cfg.BM, cfg.BN)
    setup.update(setup_times(tiles))
    dev = tiles.device()
    defines = kernel_defines(prob.D, prob.dtype, prob.mask, cfg, group=prob.H // prob.kv_heads)
    if lse is not None:
        defines["FWD_LSE"] = 1
    with timed(setup, "compile_s"):
        mod = get_module(KERNEL, defines, cfg.arch)
        kernel = mod.get_function(ENTRY_LSE if lse is not None else ENTRY)
        smem = cfg.smem_bytes(prob.D)
        if smem > DEFAULT_SMEM:
            kernel.max_dynamic_shared_size_bytes = smem
    nq = -(-inner.T // cfg.BM)
    scale_log2 = np.float32(prob.softmax_scale * LOG2E)
    if uses_tma(cfg, prob.mask):
        with timed(setup, "tma_maps_s"):  # K's and V's over their own [B * H_kv, T, D]
            maps = head_maps(list(arrays) + [out], (cfg.BM, cfg.BN, cfg.BN, cfg.BM), prob.mask.rows_in_place())
    else:
        maps = [TensorMap()] * 4  # zeros, not read
    table = dev.table if dev.table is not None else table_array(inner)  # a device build wrote its own
    args = (arrays[0], arrays[1], arrays[2], out, dev.heads, dev.entries, np.int32(prob.T), scale_log2,
            table, *(m.arg for m in maps)) + ((lse,) if lse is not None else ())
    grid = (nq, prob.B * prob.H, min(stride, prob.T))  # one layer per non-empty residue class
    return Launch(kernel, grid, (cfg.threads,), smem, args, maps)


IMPL = register(FastTC(
    name="fast-tc",
    family="attnbench",
    description="tensor-core FlashAttention-2-style forward and backward over the pattern's tile lists: "
                "warpgroup MMA (wgmma) on sm_90, mma.sync with ldmatrix elsewhere; on the class-major layout "
                "(fast-tc-classes) where its lists visit 1.25x fewer tiles (dilated with several levels, T >= 8192)",
    dtypes=("bfloat16", "float16"),
    classes=None,
))
CLASSES_IMPL = register(FastTC(
    name="fast-tc-classes",
    family="attnbench",
    description="fast-tc on the class-major layout, for patterns whose pairs of residue classes are bands "
                "(dilated with several levels), the pattern run as one band per class pair: read in place by "
                "the kernels where each class holds whole 128-row tiles (T a multiple of 128 r), else Q, K, V "
                "(and dO) copied class by class and O (and dQ, dK, dV) copied back, all timed",
    dtypes=("bfloat16", "float16"),
    classes=True,
))
SYNC_IMPL = register(FastTC(
    name="fast-tc-sync",
    family="attnbench",
    description="fast-tc with mma.sync and ldmatrix on every GPU (what fast-tc runs before sm_90)",
    dtypes=("bfloat16", "float16"),
    wgmma=False,
))

__all__ = ["SHAPES", "shape", "CONFIGS", "WIDE_CONFIGS", "PARTIAL_CONFIGS", "HOPPER_CONFIGS", "HOPPER_WIDE_CONFIGS",
           "HOPPER_PARTIAL_CONFIGS", "HOPPER_LONG_CONFIGS", "LONG_KEYS_PER_ROW", "choose_config", "TileConfig", "TileSpec", "parse_tile_config", "overlap_builds", "FastTC", "IMPL", "SYNC_IMPL", "CLASSES_IMPL",
           "kernel_defines", "tile_list", "forward_lse", "backward"]


def standard_builds() -> list[tuple[str, dict]]:
    """The llm configuration (SPEC section 5) at its build T: every pattern (and its class-major layout where
    it has one), D = 64 and 128, bfloat16;
    float16 for dense causal; the mma.sync and the wgmma (sm_90a, ``target_arch``) shapes; three of its
    patterns with grouped-query heads (KV_GROUP = GQA_BUILD_GROUP); then the backward's builds and the forwards with the log-sum-exp it runs after (fast_tc_bwd)."""
    from .configs import LLM, layouts

    builds = []
    for D in (64, 128):
        for inst in LLM.instances:
            for mask in layouts(inst.mask(LLM.build_T)):  # and its class-major layout (fast-tc-classes)
                for dtype in ("bfloat16", "float16") if inst.pattern == "dense" else ("bfloat16",):
                    for wgmma in (False, True):
                        b = (KERNEL, kernel_defines(D, dtype, mask, choose_config(mask, D, wgmma)))
                        if b not in builds:
                            builds.append(b)
    # grouped-query heads (``attnbench sweep --config llm --H-kv 4``): a dense, a partial and a strided build
    for D in (64, 128):
        for inst in LLM.instances:
            if (inst.pattern, inst.param_dict.get("window")) in GQA_BUILD_PATTERNS:
                mask = inst.mask(LLM.build_T)
                for wgmma in (False, True):
                    b = (KERNEL, kernel_defines(D, "bfloat16", mask, choose_config(mask, D, wgmma), group=GQA_BUILD_GROUP))
                    if b not in builds:
                        builds.append(b)
    builds += [b for b in overlap_builds() if b not in builds]
    from .fast_tc_bwd import standard_builds as backward_builds

    return builds + [b for b in backward_builds() if b not in builds]


# the overlapped walk (``--tile-config OV=1``, kernels/tc/loop_overlap.cuh; on sm_90 the default of the D=128 wide
# and long shapes, rows of 512 keys or more; at D=64 not one), built for the compile tests on the llm configuration's
# dense, window 256 (partial tiles) and document (a table) instances
OVERLAP_BUILD_PATTERNS = (("dense", None), ("window", 256), ("document", 0))


def overlap_builds() -> list[tuple[str, dict]]:
    """fast-tc's forward with the overlapped walk, D = 64 and 128, bfloat16, wgmma at 3 stages: the wide
    role's shape (one warpgroup, 64-key tiles) with OV=1."""
    from .configs import LLM

    builds = []
    for D in (64, 128):
        for inst in LLM.instances:
            if (inst.pattern, inst.param_dict.get("window")) in OVERLAP_BUILD_PATTERNS:
                mask = inst.mask(LLM.build_T)
                cfg = replace(shape("wgmma", "wide", D), OV=1)
                cfg = replace(cfg, STAGES=max(3, cfg.STAGES))
                builds.append((KERNEL, kernel_defines(D, "bfloat16", mask, cfg)))
    return builds


# the grouped-query builds among the standard ones: H / H_kv of the llm configuration at --H-kv 4, and
# the llm instances (pattern, window) built so: dense, streaming 16+64, dilated 512/2
GQA_BUILD_GROUP = 4
GQA_BUILD_PATTERNS = (("dense", None), ("streaming", 64), ("dilated", 512))


GATE_TS = (1, 7, 100, 1000, 4096)  # the sizes of the GPU gate tests (tests/test_fast_tc.py)


def gate_builds() -> list[tuple[str, dict]]:
    """Every build the GPU gate compiles: each registered pattern's first example at each gate T,
    causal or not, D = 64 and 128, bfloat16 and float16, both main loops. ``attnbench compile
    --gate-builds --hashes`` before and after a source change shows whether a GPU's earlier
    verdict on these builds still stands. The backward's builds of the same masks follow."""
    from .fast_tc_bwd import gate_builds as backward_builds
    from .patterns import REGISTERED, make_mask

    builds, masks = [], []
    for pat in REGISTERED:
        for T in GATE_TS:
            for causal in (True, False):
                mask = make_mask(pat.name, T, causal, **pat.examples(T)[0])
                masks.append(mask)
                for D in (64, 128):
                    for dtype in ("bfloat16", "float16"):
                        for wgmma in (False, True):
                            b = (KERNEL, kernel_defines(D, dtype, mask, choose_config(mask, D, wgmma)))
                            if b not in builds:
                                builds.append(b)
    return builds + [b for b in backward_builds(masks) if b not in builds]


def forward_lse(mask: Mask, q, k, v, scale: float | None = None, **kw):
    """The forward that saves each row's log-sum-exp: (o, lse) (attnbench.fast_tc_bwd.forward_lse)."""
    from .fast_tc_bwd import forward_lse as run

    return run(mask, q, k, v, scale, **kw)


def backward(mask: Mask, q, k, v, o, lse, do, scale: float | None = None, **kw):
    """The gradients (dq, dk, dv) given o, lse and do (attnbench.fast_tc_bwd.backward)."""
    from .fast_tc_bwd import backward as run

    return run(mask, q, k, v, o, lse, do, scale, **kw)
