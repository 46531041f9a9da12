"""``flex``: FlexAttention under ``torch.compile``, its mask_mod the pattern's own predicate (``Mask.mask_mod``; a
decode's at the queries' absolute positions, ``serving_mask_mod``), at the better of block 64 and 128 (SPEC section 6);
a backward pass at the fastest of ``FLEX_BWD_SETTINGS`` that compiles."""
from __future__ import annotations

import functools
import time
import warnings
from dataclasses import dataclass

import numpy as np

from ..errors import BadInput
from ..impls import PASSES, Problem, Runner, register
from .common import ALL_DTYPES, TorchImpl, TorchRunner, sync, torch_reason

FLEX_BLOCKS = (64, 128)
REBUILDS = 5  # warm create_block_mask calls after the first: their median is block_mask_build_s
# From this T on the BlockMask is built by a compiled create_block_mask (what its _compile=True
# does): the eager build materialises the T x T mask and its int64 index arithmetic (over 10 GB
# at T = 32768, 128 GiB of mask alone at T = 131072).
FLEX_COMPILED_MASK_FROM = 32768


@functools.lru_cache(maxsize=None)
def _selection_timer():
    from ..timing import EventTimer

    return EventTimer()


def time_ms(fn, warmup: int = 2, reps: int = 5) -> float:
    """Median milliseconds of ``fn`` under the rows' own protocol (``timing.EventTimer``: the L2
    flushed, the host's path behind a hold), so a setting is chosen by the time its row shows and
    not by how fast the host issues it back to back."""
    for _ in range(warmup):
        fn()
    timer = _selection_timer()
    return float(np.median([timer.sample(fn) for _ in range(reps)]))


def serving_mask_mod(prob: Problem, device):
    """FlexAttention's mask_mod of a decode or ragged batch: the pattern's predicate at each
    query's absolute position (q_idx + Tk_b - Tq), keys past Tk_b excluded."""
    import torch

    from ..serving import query_offsets

    allowed = prob.mask.mask_mod(device)  # places a table on the device now
    if prob.cache_lens is None:
        off = prob.T - prob.q_len

        def mask_mod(b, h, q_idx, kv_idx):
            return allowed(b, h, q_idx + off, kv_idx)
        return mask_mod
    offs = torch.as_tensor(query_offsets(prob), device=device)
    lens = torch.as_tensor(np.asarray(prob.lens, np.int64), device=device)

    def ragged_mask_mod(b, h, q_idx, kv_idx):
        return allowed(b, h, q_idx + offs[b], kv_idx) & (kv_idx < lens[b])
    return ragged_mask_mod


@functools.lru_cache(maxsize=None)
def _flex():
    """(compiled flex_attention, create_block_mask, compiled create_block_mask).

    Every configuration brings its own mask_mod, so torch.compile recompiles for each; past
    its recompile limit it would silently run FlexAttention eagerly (unfused), so the limits
    are raised. Shapes are static, as a user with one model would compile them.

    The backward alone (``bwd``) goes back through one recorded forward with retain_graph=True,
    which a compiled backward with donated buffers (saved tensors it may overwrite) refuses; they
    are turned off (torch._functorch.config.donated_buffer), for every pass alike."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    cfg = torch._dynamo.config
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, floor in (("recompile_limit", 4096), ("cache_size_limit", 4096),
                            ("accumulated_recompile_limit", 65536), ("accumulated_cache_size_limit", 65536)):
            if hasattr(cfg, name):
                setattr(cfg, name, max(getattr(cfg, name), floor))
    try:
        import torch._functorch.config as aot_config
    except ImportError:  # an older torch, without donated buffers
        aot_config = None
    if hasattr(aot_config, "donated_buffer"):
        aot_config.donated_buffer = False
    return torch.compile(flex_attention, dynamic=False), create_block_mask, torch.compile(create_block_mask)


def flex_kernel_options(bs: int):
    return {"BLOCK_M": bs, "BLOCK_N": bs} if bs == 64 else None


@dataclass(frozen=True)
class FlexSetting:
    """What a Flex row runs at: the BlockMask's block size and the kernel options flex_attention is
    called with (none: its own defaults). The backward reads options of its own: BLOCK_M1 and
    BLOCK_N1 (the dK, dV loop's query and key blocks), BLOCK_M2 and BLOCK_N2 (the dQ loop's),
    num_warps, num_stages (``bwd_``/``fwd_`` prefixes aim them at one pass)."""
    block: int
    options: tuple = ()  # (name, value) pairs, in the order given

    @classmethod
    def make(cls, block: int, **options) -> "FlexSetting":
        return cls(block, tuple(options.items()))

    @classmethod
    def forward(cls, block: int) -> "FlexSetting":
        """The forward's setting at a block size (``flex_kernel_options``)."""
        return cls.make(block, **(flex_kernel_options(block) or {}))

    @property
    def kernel_options(self) -> dict | None:
        return dict(self.options) or None

    def label(self) -> str:
        """``BLOCK_SIZE=64 BLOCK_M=64 ...``, or ``BLOCK_SIZE=128 (defaults)``: as setup_s records it."""
        return f"BLOCK_SIZE={self.block}" + ("".join(f" {k}={v}" for k, v in self.options) or " (defaults)")


# The settings a backward pass tries in prepare, the fastest kept: block 128 at Flex's defaults, and
# block 64 with the backward block sizes SPEC section 7 names. At block 64 the backward may find no
# kernel: torch filters its default backward configurations (on sm90, for D = 64 and 128, BLOCK_N1 =
# BLOCK_M2 = 128) by whether they divide the BlockMask's blocks before it applies the options given
# (NoValidChoicesError); such a setting is recorded in setup_s (flex_failed) and left out.
FLEX_BWD_SETTINGS = (
    FlexSetting.make(128),
    FlexSetting.make(64, BLOCK_M=64, BLOCK_N=64, BLOCK_M1=32, BLOCK_N1=64, BLOCK_M2=64, BLOCK_N2=32),
)


def _failure(e: BaseException, most: int = 400) -> str:
    text = f"{type(e).__name__}: {' '.join(str(e).split())}"
    return text if len(text) <= most else text[:most] + "..."


class _FlexRunner(TorchRunner):
    """Tries each setting in prepare (the forward's: a block size each, ``blocks``; a backward
    pass's: ``bwd_settings``) and keeps the fastest at the pass it times. A setting a backward pass
    cannot compile or run is left out with its reason (``setup['flex_failed']``); none left is a
    BadInput naming every one."""

    def __init__(self, prob: Problem, q, k, v, blocks=FLEX_BLOCKS, bwd_settings=FLEX_BWD_SETTINGS, do=None):
        super().__init__(prob, q, k, v, do)
        self.fn, eager_build, compiled_build = _flex()
        T, Tq = prob.T, prob.q_len
        build = compiled_build if T >= FLEX_COMPILED_MASK_FROM else eager_build
        mask_mod = prob.mask.mask_mod(self.device) if prob.prefill else serving_mask_mod(prob, self.device)
        B = prob.B if prob.cache_lens is not None else None  # a ragged batch: a block mask per sequence
        self.gqa = {"enable_gqa": True} if prob.kv_heads != prob.H else {}
        backward = prob.pass_name != "fwd"
        settings = tuple(bwd_settings) if backward else tuple(FlexSetting.forward(bs) for bs in blocks)
        t_select = time.perf_counter()
        best, failed = None, {}
        with self.torch.cuda.stream(self.stream()):
            for st in settings:
                self.opts = st.kernel_options
                t0 = time.perf_counter()
                try:
                    self.block_mask = build(mask_mod, B, None, Tq, T, device=self.device, BLOCK_SIZE=st.block)
                    if self.pass_name == "bwd":
                        self.save_forward()
                    self.run()
                    sync()
                except Exception as e:  # noqa: BLE001 - a backward setting that does not compile: left out
                    if not backward:
                        raise
                    failed[st.label()] = _failure(e)
                    self._graph = self._out = self._tgrads = None
                    continue
                first = time.perf_counter() - t0
                rebuilds = []
                for _ in range(REBUILDS):
                    t0 = time.perf_counter()
                    self.block_mask = build(mask_mod, B, None, Tq, T, device=self.device, BLOCK_SIZE=st.block)
                    sync()
                    rebuilds.append(time.perf_counter() - t0)
                rebuild = float(np.median(rebuilds))
                ms = time_ms(self.run)
                if best is None or ms < best[0]:
                    best = (ms, st, self.block_mask, first, rebuild)
        if best is None:
            raise BadInput(f"flex: no setting of its {prob.pass_name} pass runs for {prob.mask.label()} at T={T}: "
                           + "; ".join(f"{k}: {v}" for k, v in failed.items()))
        _, st, self.block_mask, first, rebuild = best
        self.opts = st.kernel_options
        self.setup.update(compile_s=first, block_mask_build_s=rebuild, flex_block=st.block,
                          block_select_s=time.perf_counter() - t_select)
        if backward:
            self.setup["flex_options"] = st.label()
            if failed:
                self.setup["flex_failed"] = failed
            if self.pass_name == "bwd":  # the graph of the setting kept
                self.save_forward()
                sync()

    def _call(self):
        return self.fn(self.q, self.k, self.v, block_mask=self.block_mask, scale=self.prob.softmax_scale,
                       kernel_options=self.opts, **self.gqa)


@dataclass(eq=False)
class FlexImpl(TorchImpl):
    blocks: tuple = FLEX_BLOCKS  # block sizes tried in prepare; the fastest is kept
    bwd_settings: tuple = FLEX_BWD_SETTINGS  # FlexSettings a backward pass tries; the fastest that runs is kept
    passes = PASSES  # the backward through autograd of the compiled flex_attention
    gqa = True     # enable_gqa
    decode = True  # the pattern's mask_mod at the queries' absolute positions
    ragged = True  # a block mask per sequence, keys past its cache excluded

    def availability(self) -> str | None:
        return torch_reason(flex=True)

    def unsupported(self, prob: Problem) -> str | None:
        why = super().unsupported(prob)
        if why:
            return why
        D = prob.D
        if D < 16 or D & (D - 1):
            return f"{self.name}: head dim D={D} is not a power of two >= 16, which FlexAttention needs"
        return None

    def build(self, prob: Problem, q, k, v, do=None) -> Runner:
        return _FlexRunner(prob, q, k, v, self.blocks, self.bwd_settings, do)


FLEX = register(FlexImpl(
    "flex", "peer",
    "torch.nn.attention.flex_attention under torch.compile (static shapes), mask_mod = the pattern's own "
    "predicate (Mask.mask_mod), BlockMask built once per configuration (create_block_mask compiled from "
    f"T = {FLEX_COMPILED_MASK_FROM}), at the faster of block 64 (kernel BLOCK_M = BLOCK_N = 64) and 128 "
    "by a short timing in prepare under the rows' protocol (L2 flushed, host path held out); the backward through torch.autograd.grad of the compiled call, at the "
    "fastest of FLEX_BWD_SETTINGS that compiles (block 128 at Flex's defaults; block 64 with BLOCK_M1=32 "
    "BLOCK_N1=64 BLOCK_M2=64 BLOCK_N2=32), the one used and those that failed in setup_s",
    ALL_DTYPES))
