"""``fast-tc`` and ``fast-tc-sync``: tensor-core attention for bfloat16 / float16 (kernels/fast_tc.cu).

A FlashAttention-2-style forward pass that visits only the key tiles of ``Mask.tiles(BM, BN)``
for each query tile, applying the pattern predicate only on tiles flagged partial. Tile shape,
warps and pipeline depth are compile-time constants chosen per head dimension (``fwd_config``: ``SHAPES``); the
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

from dataclasses import dataclass, field, replace

import numpy as np

from .arrays import bind
from .compile import get_module
from .errors import BadInput
from .fwd_config import (CONFIGS, TileConfig, TileSpec, choose_config, kernel_defines, lse_shape, shape,
                         uses_tma)
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

__all__ = ["overlap_builds", "FastTC", "IMPL", "SYNC_IMPL", "CLASSES_IMPL", "forward_lse", "backward"]


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
