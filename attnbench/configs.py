"""The standard configurations (SPEC section 5), declared once: the sweep, the kernels' standard
builds, the commands and the tests all read them from here.

A configuration is the pattern instances it sweeps and the sizes it sweeps them at. ``attnbench
sweep --config NAME`` starts from it; options narrow or widen it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .patterns import get_pattern


@dataclass(frozen=True)
class Instance:
    """A pattern with its parameters (defaults filled in) and causal flag."""
    pattern: str
    params: tuple  # sorted (name, value) pairs
    causal: bool

    @classmethod
    def make(cls, pattern: str, causal: bool | None = None, **given) -> "Instance":
        """``causal`` None: the pattern's own default (block_diagonal and prefix_lm: off)."""
        pat = get_pattern(pattern)
        p = pat.defaults()
        p.update({k: v for k, v in given.items() if v is not None})
        return cls(pattern, tuple(sorted(p.items())), pat.default_causal if causal is None else bool(causal))

    @property
    def param_dict(self) -> dict:
        return dict(self.params)

    def mask(self, T: int):
        from .patterns import make_mask

        return make_mask(self.pattern, T, self.causal, **self.param_dict)


@dataclass(frozen=True)
class Config:
    name: str
    summary: str
    instances: tuple[Instance, ...]
    B: int
    H: int
    D: tuple[int, ...]
    dtype: tuple[str, ...]
    Ts: tuple[int, ...] = ()       # the T values, unless a range is given
    T_min: int | None = None       # or powers of two from T_min to T_max
    T_max: int | None = None
    causal: bool | None = None     # the causal flag of patterns it sweeps at their defaults (None: each pattern's)
    build_T: int = 4096            # the T at which the kernels' standard builds of this config are compiled
    passes: tuple[str, ...] = ("fwd",)  # impls.PASSES it sweeps
    # serving shapes (SPEC section 1; the decode configuration). Empty: B alone, H_kv = H, Tq = T
    Bs: tuple[int, ...] = ()       # batch sizes swept (B is the first)
    H_kv: int | None = None        # key/value heads
    Tqs: tuple[int, ...] = ()      # query lengths swept
    long_Ts: tuple[int, ...] = ()  # more T values, for the instances of long_patterns only
    long_patterns: tuple[str, ...] = ()  # the patterns whose cost does not grow with T
    long_Bs: tuple[int, ...] = ()  # the batch sizes of long_Ts (empty: every B); K and V of B=64 at
                                   # T=1048576, H_kv=8, D=128 would take 275 GB
    ragged: tuple[tuple, ...] = ()  # (B, Tq, T, distribution, seed): a ragged batch of every instance


SEED = Config(
    "seed", "the seeds' tables: every seed pattern at its defaults, causal, C=384, float32",
    tuple(Instance.make(name, True) for name in ("dense", "window", "streaming", "block_diagonal", "dilated",
                                                 "bigbird")),
    B=1, H=1, D=(384,), dtype=("float32",), T_min=128, T_max=4096, causal=True)

LLM = Config(
    "llm", "LLM-sized: the patterns people use at 4k to 128k tokens, D 64 and 128, bfloat16",
    (
        Instance.make("dense", True),
        Instance.make("streaming", True, sink=16, window=64),
        Instance.make("streaming", True, sink=4, window=1024),
        Instance.make("window", True, window=256),
        Instance.make("window", True, window=4096),
        Instance.make("block_diagonal", False, block=16),
        Instance.make("block_diagonal", False, block=128),
        Instance.make("dilated", True, window=512, dilation=2),
        Instance.make("bigbird", True),
        # packed documents (log-normal lengths around 2048) and LongNet-style multi-scale dilation
        Instance.make("document", True, doc_mean=2048, doc_seed=0),
        Instance.make("dilated", True, window=2048, dilation=1, levels=((2048, 2), (2048, 4))),
        # three of the above written as custom expressions: what the generic predicate and the
        # classified tile lists cost against the built-ins
        Instance.make("custom", True, expr="(j < 16) | (i - j < 64)"),
        Instance.make("custom", True, expr="i - j < 256"),
        Instance.make("custom", False, expr="i // 128 == j // 128"),
    ),
    B=1, H=16, D=(64, 128), dtype=("bfloat16",), Ts=(4096, 32768, 131072), build_T=32768)

# SPEC section 5: the llm configuration, forward, backward and training step
TRAINING = replace(LLM, name="training", summary="the llm configuration's instances and sizes for each pass: "
                   "forward, backward (given the forward's saved state), training step",
                   passes=("fwd", "bwd", "fwd+bwd"))

DECODE = Config(
    "decode", "serving: Tq = 1 and 16 queries at the end of 4k to 1M-key caches, H=32 over H_kv=8, D=128, bfloat16",
    (
        Instance.make("dense", True),
        Instance.make("streaming", True, sink=4, window=1024),
        Instance.make("streaming", True, sink=16, window=64),
        Instance.make("window", True, window=4096),
        Instance.make("dilated", True, window=512, dilation=2),
        Instance.make("bigbird", True),
    ),
    B=1, H=32, D=(128,), dtype=("bfloat16",), Ts=(4096, 32768, 131072), build_T=32768,
    Bs=(1, 8, 64), H_kv=8, Tqs=(1, 16), long_Ts=(1048576,), long_Bs=(1, 8),
    long_patterns=("streaming", "window", "dilated", "bigbird"),
    ragged=((8, 1, 32768, "uniform", 0),))

CONFIGS: dict[str, Config] = {c.name: c for c in (SEED, LLM, TRAINING, DECODE)}


def get_config(name: str) -> Config:
    from .errors import BadInput

    try:
        return CONFIGS[name]
    except KeyError:
        raise BadInput(f"config={name!r} is unknown: choose one of {', '.join(CONFIGS)}") from None


def layouts(mask) -> list:
    """``mask``, then its class-major layout where it has one, copied and read in place where its classes allow
    (what fast-tc and fast-tc-classes compile)."""
    r, banded = mask.class_major()
    if r == 1:
        return [mask]
    return [mask, banded] + [m for m in (banded.in_place(),) if m is not None]


__all__ = ["Instance", "Config", "CONFIGS", "SEED", "LLM", "TRAINING", "DECODE", "get_config", "layouts"]
