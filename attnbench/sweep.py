"""Sweeps: configurations x implementations, each gated against the float64 reference and
the survivors timed against each other (SPEC sections 3, 4, 5).

A configuration is a pattern instance (pattern, parameters, causal flag) at one T, B, H, D and
dtype. For each one, every implementation gives exactly one row:

* ``skipped``: the configuration does not fit (BadInput from the pattern, or its inputs and outputs alone exceed
  the device's memory, found before anything is allocated), the implementation is not available here, does not take
  the problem, or refuses it while preparing;
* ``failed``: the correctness gate failed, or an exception (out of memory, a compile error)
  came up while preparing, checking or timing it; its reason is kept;
* ``ok``: passed the gate and was timed, interleaved with the other implementations that
  passed on the same configuration.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import sys
import zlib
from dataclasses import dataclass, field, replace
from typing import Callable

from .check import grad_inputs, judge, problem_inputs, reference_of
from .configs import Instance, get_config
from .errors import BadInput
from .impls import DTYPES, PASSES, Impl, Problem, all_impls, get_impl
from .memory import MeteredRunner, PeakWindow, needed_bytes
from .patterns import all_params, get_pattern, make_mask, param_columns, pattern_label
from .results import COLUMNS, ResultWriter, Tally, now, params_json, row_key
from .serving import draw_lens, lens_text
from .timing import DEFAULT_BUDGET_S, HOLD_US, Peaks, Timing, floor_ms


@dataclass(frozen=True)
class Case:
    config: str
    inst: Instance
    T: int
    B: int
    H: int
    D: int
    dtype: str
    pass_name: str = "fwd"  # impls.PASSES
    # serving shapes (None: H_kv = H, Tq = T, every sequence holding T keys)
    H_kv: int | None = None
    Tq: int | None = None
    cache_lens: tuple[int, ...] | None = None

    def configuration(self) -> "Case":
        """This case with its pass left out: what a configuration's passes share (inputs, reference)."""
        return replace(self, pass_name="fwd")

    def describe(self) -> str:
        lab = pattern_label(self.inst.pattern, self.inst.param_dict)
        return (f"{lab} {'causal' if self.inst.causal else 'non-causal'} T={self.T} B={self.B} H={self.H} "
                f"D={self.D} {self.dtype}" + self.serving_text()
                + ("" if self.pass_name == "fwd" else f" {self.pass_name}"))

    def serving_text(self) -> str:
        """`` H_kv=8 Tq=16 ragged`` for what is not prefill's default; empty for prefill."""
        return "".join(f" {n}={v}" for n, v in (("H_kv", self.H_kv), ("Tq", self.Tq)) if v is not None) + (
            " ragged" if self.cache_lens is not None else "")


def powers_of_two(t_min: int, t_max: int) -> list[int]:
    if t_min < 1 or t_max < 1:
        raise BadInput(f"T range {t_min}..{t_max}: T must be a positive integer")
    if t_min > t_max:
        raise BadInput(f"--T-min={t_min} is above --T-max={t_max}")
    out, t = [], 1
    while t <= t_max:
        if t >= t_min:
            out.append(t)
        t *= 2
    if not out:
        raise BadInput(f"no power of two lies between --T-min={t_min} and --T-max={t_max}")
    return out


def t_values(config: str, T: tuple[int, ...] = (), T_min: int | None = None,
             T_max: int | None = None) -> list[int]:
    """Explicit ``T`` values win; else powers of two over the range (the config's bounds
    fill in the one not given); else the config's list."""
    c = get_config(config)
    if T:
        bad = [t for t in T if t < 1]
        if bad:
            raise BadInput(f"T={bad[0]} must be a positive integer")
        return sorted(set(T))
    if T_min is None and T_max is None and c.Ts:
        return list(c.Ts)
    lo = T_min if T_min is not None else (c.T_min or min(c.Ts))
    hi = T_max if T_max is not None else (c.T_max or max(c.Ts))
    return powers_of_two(lo, hi)


def instances(config: str, patterns: tuple[str, ...] = (), causal: bool | None = None,
              **options: tuple[int, ...]) -> list[Instance]:
    """Pattern instances of a sweep. With no parameter option, the config's own list (a pattern
    named that the config does not hold: at its defaults). With some, for each pattern the product
    of the given values of the parameters it takes (defaults for the rest): custom's ``--expr`` is
    an axis, its named integers (``--param``) one value that every expression takes; a pattern that
    takes none of the options given keeps the config's own instances (``--window 256 --pattern window
    --pattern custom``: the config's custom expressions, not custom's default)."""
    cfg = get_config(config)
    for name in patterns:
        get_pattern(name)
    unknown = set(options) - set(all_params())
    if unknown:
        raise BadInput(f"unknown pattern options {sorted(unknown)}")
    given = {k: tuple(v) for k, v in options.items() if v}
    chosen = list(patterns) or list(dict.fromkeys(i.pattern for i in cfg.instances))
    for name in chosen:  # a value that fits no T (below a parameter's minimum, not a number): refuse the sweep
        for prm in get_pattern(name).params:
            if prm.name in given:
                try:
                    given[prm.name] = tuple(prm.value(v) for v in given[prm.name])
                except BadInput as e:  # named by its option: "--block=0 is below its minimum 1"
                    msg = str(e).replace(prm.name, prm.flag, 1)
                    raise BadInput(f"{msg} ({name}: {prm.help})") from None
    if not given:
        out = [i for i in cfg.instances if i.pattern in chosen]
        held = {i.pattern for i in out}
        out += [Instance.make(name, cfg.causal) for name in chosen if name not in held]
    else:
        out = []
        for name in chosen:
            takes = [p.name for p in get_pattern(name).params if p.name in given]
            if not takes:  # no option given is this pattern's: as without options
                out += [i for i in cfg.instances if i.pattern == name] or [Instance.make(name, cfg.causal)]
                continue
            for values in itertools.product(*(given[p] for p in takes)):
                out.append(Instance.make(name, cfg.causal, **dict(zip(takes, values))))
    if causal is not None:
        out = [Instance(i.pattern, i.params, causal) for i in out]
    seen, uniq = set(), []
    for i in out:
        if i not in seen:
            seen.add(i)
            uniq.append(i)
            get_pattern(i.pattern).check_params(i.param_dict)  # what fits no T (custom's expression)
    if not uniq:
        raise BadInput(f"no pattern instance for --config {config} and --pattern {', '.join(patterns)}")
    return uniq


def plan(config: str = "seed", *, patterns=(), T=(), T_min=None, T_max=None, B=None, H=None, D=(),
         dtype=(), causal=None, passes=(), H_kv=None, Tq=(), cache_lens=None, cache_dist=None, cache_seed=0,
         **options) -> list[Case]:
    """Every configuration of a sweep, in order: by dtype, D, T, then pattern instance, then pass
    (``passes``, default the config's); serving configurations by dtype, D, T, B, Tq, then instance,
    and the config's ragged batches last. ``B`` is one batch or several (each a configuration)."""
    Bs = tuple(dict.fromkeys((B,) if isinstance(B, int) else (B or ())))
    for b in Bs:
        if b < 1:
            raise BadInput(f"B={b} must be a positive integer")
    cases = _plan(config, patterns=patterns, T=T, T_min=T_min, T_max=T_max, B=Bs[0] if Bs else None, H=H, D=D,
                  dtype=dtype, causal=causal, passes=passes, **options)
    return serving_cases(config, cases, B=Bs, H_kv=H_kv, Tq=Tq, cache_lens=cache_lens, cache_dist=cache_dist,
                         cache_seed=cache_seed, explicit_T=bool(T or T_min or T_max))


def serving_cases(config: str, cases: list[Case], *, B=(), H_kv=None, Tq=(), cache_lens=None, cache_dist=None,
                  cache_seed=0, explicit_T=False) -> list[Case]:
    """The prefill plan's cases at the serving shapes asked for: H_kv (--H-kv, else the config's),
    every Tq (--Tq, else the config's; none: Tq = T), every B of the config unless B (--B) gives some,
    the config's longer T for its bounded patterns (unless T is given), cache lengths given for
    every case (--cache-lens) or drawn for each (--cache-dist), and the config's ragged batches."""
    import dataclasses

    c = get_config(config)
    H_kv = c.H_kv if H_kv is None else H_kv
    if H_kv is not None and H_kv < 1:
        raise BadInput(f"--H-kv={H_kv} must be a positive integer")
    odd = [cs.H for cs in cases if H_kv is not None and cs.H % H_kv]
    if odd:
        raise BadInput(f"--H-kv={H_kv} must divide the query heads H={odd[0]}")
    bad = [t for t in Tq if t < 1]
    if bad:
        raise BadInput(f"--Tq={bad[0]} must be a positive integer")
    Tqs = tuple(dict.fromkeys(Tq)) or c.Tqs or (None,)
    B = (B,) if isinstance(B, int) else tuple(B or ())
    Bs = B or (c.Bs or (None,))
    if cache_lens is not None:
        if B and B != (len(cache_lens),):
            raise BadInput(f"--cache-lens gives {len(cache_lens)} lengths for --B={','.join(map(str, B))}: "
                           f"give one per sequence, for one batch")
        Bs = (len(cache_lens),)
        short = [cs.T for cs in cases if cs.T < max(cache_lens)]
        if short:
            raise BadInput(f"--cache-lens holds {max(cache_lens)}, above T={short[0]}: every length must be at most T")
    out = []
    long = [] if explicit_T else [dataclasses.replace(cs, T=t) for t in c.long_Ts for cs in cases
                                  if cs.T == cases[0].T and cs.inst.pattern in c.long_patterns]
    for cs in cases + long:
        for b in Bs:
            if cs in long and c.long_Bs and (b > max(c.long_Bs) if B else b not in c.long_Bs):
                continue  # the config's batches whose caches fit at the longer T (a batch given: none larger)
            for tq in Tqs:
                case = dataclasses.replace(cs, B=cs.B if b is None else b, H_kv=H_kv, Tq=tq)
                if cache_dist is not None:
                    case = dataclasses.replace(case, B=case.B, cache_lens=draw_lens(
                        cache_dist, cache_seed, case.B, case.T, min(tq or case.T, case.T)))
                elif cache_lens is not None:
                    case = dataclasses.replace(case, cache_lens=tuple(cache_lens))
                out.append(case)
    if cache_lens is None and cache_dist is None and not explicit_T:
        firsts: dict = {}
        for cs in cases:
            firsts.setdefault((cs.dtype, cs.D, cs.inst), cs)
        for b, tq, t, dist, seed in c.ragged:
            if (B and b not in B) or (Tq and tq not in Tq):
                continue  # --B and --Tq narrow the ragged batches too
            for cs in firsts.values():
                out.append(dataclasses.replace(cs, B=b, T=t, H_kv=H_kv, Tq=tq,
                                               cache_lens=draw_lens(dist, seed, b, t, tq)))
    key = lambda cs: (cs.dtype, cs.D, cs.cache_lens is not None, cs.T, cs.B, cs.Tq or 0)  # noqa: E731
    return sorted(out, key=key) if c.Tqs or c.Bs or c.long_Ts else out


def _plan(config: str = "seed", *, patterns=(), T=(), T_min=None, T_max=None, B=None, H=None, D=(),
          dtype=(), causal=None, passes=(), **options) -> list[Case]:
    """The prefill cases of a sweep, in order: by dtype, D, T, then pattern instance, then pass."""
    c = get_config(config)
    passes = tuple(dict.fromkeys(passes)) or c.passes
    for p in passes:
        if p not in PASSES:
            raise BadInput(f"pass={p!r} is not one of {', '.join(PASSES)}")
    dtypes = tuple(dtype) or c.dtype
    for dt in dtypes:
        if dt not in DTYPES:
            raise BadInput(f"dtype={dt!r} is not supported: choose one of {', '.join(DTYPES)}")
    Ds = tuple(D) or c.D
    B = c.B if B is None else B
    H = c.H if H is None else H
    for name, v in (("B", B), ("H", H)) + tuple(("D", x) for x in Ds):
        if v < 1:
            raise BadInput(f"{name}={v} must be a positive integer")
    insts = instances(config, tuple(patterns), causal, **options)
    Ts = t_values(config, tuple(T), T_min, T_max)
    return [Case(config, inst, t, B, H, dd, dt, p)
            for dt in dtypes for dd in Ds for t in Ts for inst in insts for p in passes]


# what one configuration's rows cost, roughly: a constant (setup, compiles, the gate's launches) and
# its forward's useful FLOPs at a rate that stands for the gate's float64 reference and the samples
# (H100, the training configuration at T=131072: dense D=64 took about 3 minutes a pass)
SHARD_FIXED_S = 10.0
SHARD_FLOPS_PER_S = 2e11


def case_cost(case: Case) -> float:
    """An estimate of the seconds one configuration takes (its shard's share, not a measurement)."""
    try:
        mask = make_mask(case.inst.pattern, case.T, case.inst.causal, **case.inst.param_dict)
        pairs = mask.pairs
    except Exception:  # noqa: BLE001 - an estimate never stops a sweep: such a case is skipped at once
        return 1.0
    rows = (case.Tq or case.T) / case.T  # a decode's queries: their share of the mask's pairs
    return SHARD_FIXED_S + 4 * case.D * pairs * rows * case.B * case.H / SHARD_FLOPS_PER_S


def parse_shard(text: str) -> tuple[int, int]:
    """``"I/N"`` -> (I, N) with 1 <= I <= N; BadInput naming the option otherwise."""
    parts = text.split("/")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise BadInput(f"--shard={text!r} is not I/N (shard I of N, e.g. 2/4)")
    i, n = (int(p) for p in parts)
    if n < 1 or not 1 <= i <= n:
        raise BadInput(f"--shard={text}: I must be 1 to N and N at least 1 (shard I of N)")
    return i, n


def shard(cases: list[Case], index: int, count: int, cost: Callable[[Case], float] = case_cost) -> list[Case]:
    """Shard ``index`` (1 to ``count``) of a plan, for ``count`` processes on as many GPUs: the
    configurations are grouped with their other passes (they share one reference), the groups
    dealt largest first to the shard with the least estimated time (``case_cost``), and this
    shard's cases returned in plan order. Every process that plans the same sweep deals the same
    way, so the shards cover the plan once."""
    if count < 1 or not 1 <= index <= count:
        raise BadInput(f"shard {index} of {count}: the shard must be 1 to {max(count, 1)}")
    groups: dict = {}
    for c in cases:
        groups.setdefault(c.configuration(), []).append(c)
    costs = {g: cost(g) * len(cs) for g, cs in groups.items()}  # its passes: alike enough for an estimate
    load = [0.0] * count
    owner = {}
    for key in sorted(groups, key=lambda g: -costs[g]):  # stable: plan order on ties
        s = min(range(count), key=lambda i: (load[i], i))
        owner[key] = s
        load[s] += costs[key]
    return [c for c in cases if owner[c.configuration()] == index - 1]


def select_impls(names=(), tile_configs=(), decode_configs=(), bwd_configs=()) -> list[Impl]:
    """The implementations named (BadInput naming the choices for an unknown one), else all;
    after each one with tile shapes (``Impl.tile_variant``), one variant per ``tile_configs``
    entry (``TileSpec``: fast-tc's ``--tile-config``), timed with the others as its own row; after
    fast-decode, one per ``decode_configs`` entry (``DecodeSpec``: ``--decode-config``) the same way;
    after each one with a backward of its own, one per ``bwd_configs`` entry (``BwdSpec``: ``--bwd-config``)."""
    if names:
        impls = [get_impl(n) for n in dict.fromkeys(names)]
    else:
        impls = list(all_impls().values())
    if not impls:
        raise BadInput("no implementation is registered")
    out = impls
    for specs, variant, option, what, who in (
            (tile_configs, "tile_variant", "--tile-config", "a tile shape", "fast-tc and fast-tc-sync do"),
            (decode_configs, "decode_variant", "--decode-config", "a decode shape", "fast-decode does"),
            (bwd_configs, "bwd_variant", "--bwd-config", "backward fields", "fast-tc and fast-tc-sync do")):
        if not specs:
            continue
        more = []
        for impl in out:
            more.append(impl)
            make = getattr(impl, variant)
            more += [v for v in (make(spec) for spec in dict.fromkeys(specs)) if v is not None]
        if len(more) == len(out):
            raise BadInput(f"{option}: none of the implementations ({', '.join(i.name for i in out)}) "
                           f"takes {what} ({who})")
        out = more
    return out


# -- running ------------------------------------------------------------------------------

def _device_inputs(shape, dtype, seed, keep="qkv"):
    from .arrays import random_inputs

    return random_inputs(shape, dtype, seed, keep=keep)


def _free_device_memory():
    """Give back what a configuration left: CuPy's pool and, when a torch peer ran, torch's cache.
    Objects a failure left in reference cycles (an exception's frames holding a peer's tensors)
    are collected first, else an out-of-memory failure keeps its memory through every later
    configuration."""
    import gc
    import sys

    import cupy

    gc.collect()
    cupy.get_default_memory_pool().free_all_blocks()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


class ReferenceCache:
    """The float64 reference of one configuration, kept for its other passes. A configuration's
    passes share their inputs (``case_seed`` leaves the pass out, and a sweep plans them one after
    another), so the gradients of a ``bwd`` serve the ``fwd+bwd`` after it, and their output a
    ``fwd``. One entry: a configuration with other inputs lets it go before its own inputs are
    made."""

    def __init__(self):
        self.key = None
        self.ref = None
        self.computed = 0  # references made (the others were reused)

    @staticmethod
    def key_of(case: "Case", seed: int) -> tuple:
        return case.configuration(), seed

    def forget_unless(self, key) -> None:
        if key != self.key:
            self.key = self.ref = None

    def get(self, key, backward: bool, make: Callable):
        """The reference under ``key``: a backward's gradients (a dict), else a forward's output,
        reused where the held one serves, else ``make()``, kept."""
        held = self.ref if key == self.key else None
        if isinstance(held, dict):
            return held if backward else held["out"]
        if held is not None and not backward:
            return held
        self.key = self.ref = None  # let the old one go before a new one is made
        ref = make()
        self.key, self.ref = key, ref
        self.computed += 1
        return ref


@dataclass
class Context:
    """What a sweep runs with: everything that touches the device can be replaced."""
    time: Callable  # time(runs: dict[name, fn], budget_s=...) -> dict[name, Timing | Exception]
    peaks: Peaks
    provenance: dict
    inputs: Callable = _device_inputs
    cleanup: Callable = _free_device_memory
    seed: int = 0
    budget_s: float = DEFAULT_BUDGET_S
    command: str = ""
    progress: Callable | None = None
    samples: int | None = None  # a fixed sample count per implementation instead of the budget
    # one meter per row of what an implementation allocates (attnbench.memory: the peak_mem_mb column);
    # None: the column stays empty
    memory: Callable | None = None
    # the last configuration's float64 reference, for the next pass of the same configuration
    references: "ReferenceCache" = field(default_factory=lambda: ReferenceCache())
    # called between a configuration's gate and its timing (the device's: a pause of timing.SETTLE_S); None: none
    settle: Callable[[], None] | None = None
    # the device's memory in bytes: a configuration whose inputs and outputs alone take more is skipped before anything
    # is allocated (None: no such check)
    device_bytes: int | None = None

    def timing_options(self) -> dict:
        """The keywords ``time`` takes: the budget, or the fixed sample count when one is set."""
        return {"budget_s": self.budget_s} if self.samples is None else {"samples": self.samples}


def _one_line(e: BaseException) -> str:
    """The message on one line (custom's expression errors show the expression and a caret
    under the offending token on lines of their own)."""
    return " ".join(str(e).split())


def _reason(e: BaseException) -> str:
    msg = _one_line(e)
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


def _base_row(case: Case, impl: Impl, ctx: Context, prob: Problem | None) -> dict:
    p = case.inst.param_dict
    row = dict(ctx.provenance)
    row.update(config=case.config, command=ctx.command, impl=impl.name, family=impl.family,
               pattern=case.inst.pattern, causal=case.inst.causal, params=params_json(p),
               B=case.B, H=case.H, T=case.T, D=case.D, dtype=case.dtype,
               peak_tflops=ctx.peaks.matrix_tflops(case.dtype), peak_tbps=ctx.peaks.bytes_tbps,
               H_kv=case.H if case.H_kv is None else case.H_kv, Tq=case.T if case.Tq is None else case.Tq,
               cache_lens=lens_text(case.cache_lens))
    for name in param_columns():
        row[name] = p.get(name)
    row["pass"] = case.pass_name
    if prob is not None:
        m = prob.mask
        row.update(label=m.label(), pairs=prob.pairs, density=prob.density, flops=prob.flops,
                   bytes_floor=prob.bytes_floor,
                   floor_ms=floor_ms(prob.flops, prob.bytes_floor, row["peak_tflops"], row["peak_tbps"]))
    else:
        row["label"] = pattern_label(case.inst.pattern, p)
    return row


def _finish(row: dict, status: str, reason: str = "") -> dict:
    row.update(status=status, reason=reason, timestamp=now())
    return row


def _setup_cols(row: dict, setup: dict | None) -> None:
    setup = dict(setup or {})
    row["compile_s"] = setup.get("compile_s")
    row["setup_s"] = json.dumps(setup, sort_keys=True)


def _note_hold(row: dict, t: Timing) -> None:
    """``setup_s`` gets ``hold_us`` where the host's path of a run outlasted the default hold and its
    samples were taken behind a longer one (``timing.EventTimer``)."""
    if t.hold_us is not None and t.hold_us > HOLD_US:
        setup = json.loads(row.get("setup_s") or "{}")
        setup["hold_us"] = round(t.hold_us, 1)
        row["setup_s"] = json.dumps(setup, sort_keys=True)


def case_seed(case: Case, seed: int) -> int:
    """Inputs of a configuration depend on the configuration and --seed only (resumable)."""
    text = f"{case.inst.pattern}|{case.inst.params}|{case.inst.causal}|{case.T}|{case.B}|{case.H}|{case.D}|{case.dtype}"
    text += f"|{case.H_kv}|{case.Tq}|{case.cache_lens}" if case.serving_text() else ""  # prefill's as before
    return (seed * 1_000_003 + zlib.crc32(text.encode())) % (2 ** 31)


def run_case(case: Case, impls: list[Impl], ctx: Context, done: Callable[[dict], bool] = lambda r: False
             ) -> list[dict]:
    """The rows of one configuration: one per implementation not already ``done``."""
    rows = {impl.name: _base_row(case, impl, ctx, None) for impl in impls}
    todo = [i for i in impls if not done(rows[i.name])]
    if not todo:
        return []
    try:
        mask = make_mask(case.inst.pattern, case.T, case.inst.causal, **case.inst.param_dict)
        prob = Problem(mask, case.B, case.H, case.D, case.dtype, pass_name=case.pass_name, H_kv=case.H_kv,
                       Tq=case.Tq, cache_lens=case.cache_lens)
    except BadInput as e:
        return [_finish(rows[i.name], "skipped", _one_line(e)) for i in todo]
    rows = {i.name: _base_row(case, i, ctx, prob) for i in todo}
    out: dict[str, dict] = {}
    candidates = []
    for impl in todo:
        why = impl.unsupported(prob) or impl.availability()
        if why:
            out[impl.name] = _finish(rows[impl.name], "skipped", why)
        else:
            candidates.append(impl)
    runners = {}
    ref_key = ReferenceCache.key_of(case, case_seed(case, ctx.seed))
    ctx.references.forget_unless(ref_key)  # another configuration's reference goes before these inputs come
    need = needed_bytes(prob)
    if candidates and ctx.device_bytes is not None and need > ctx.device_bytes:
        why = (f"its inputs and outputs alone take {need / 1e9:.1f} GB, more than the device's "
               f"{ctx.device_bytes / 1e9:.1f} GB")
        for impl in candidates:
            out[impl.name] = _finish(rows[impl.name], "skipped", why)
        candidates = []
    if candidates:
        try:
            seed = case_seed(case, ctx.seed)
            q, k, v = problem_inputs(prob, seed, ctx.inputs)
            grad = grad_inputs(prob, seed, ctx.inputs)  # a backward pass: the output gradient do
        except Exception as e:  # noqa: BLE001 - e.g. out of memory for the inputs
            for impl in candidates:
                out[impl.name] = _finish(rows[impl.name], "failed", f"inputs: {_reason(e)}")
            candidates = []
        ref = None  # one float64 reference per configuration (a backward's: its gradients), for every implementation
        backward = prob.pass_name != "fwd"
        for impl in candidates:
            row = rows[impl.name]
            # peak_mem_mb: from before prepare to the end of the gate's run, the reference left out
            window = PeakWindow(ctx.memory()) if ctx.memory is not None else None
            try:
                if window is not None:
                    window.begin()
                runner = impl.prepare(prob, q, k, v, **grad)
                _setup_cols(row, getattr(runner, "setup", None))
                if ref is None:
                    made = ctx.references.computed
                    with window.aside() if window is not None else contextlib.nullcontext():
                        ref = ctx.references.get(ref_key, backward, lambda: reference_of(prob, q, k, v, **grad))
                    if ctx.references.computed != made:
                        # the float64 reference's temporaries (gigabytes at T=131072) go back to the device
                        # before the next implementation prepares: a torch peer cannot allocate from CuPy's pool
                        ctx.cleanup()
                g = judge(impl, prob, MeteredRunner(runner, window) if window is not None else runner, q, k, v, ref,
                          **grad)
                if window is not None:
                    row["peak_mem_mb"] = window.mib(prob)
            except BadInput as e:
                out[impl.name] = _finish(row, "skipped", _one_line(e))
                continue
            except Exception as e:  # noqa: BLE001 - a failure of one implementation is a row
                out[impl.name] = _finish(row, "failed", _reason(e))
                e = None  # noqa: F841 - its traceback holds the failed run's arrays: let go before cleanup
                ctx.cleanup()
                continue
            finally:
                if window is not None:
                    window.end()  # the allocator as it was, whatever happened
            row.update(rel_err=g.rel_err, tolerance=g.tolerance)
            if g.ok:
                runners[impl.name] = runner
            else:
                out[impl.name] = _finish(row, "failed", g.reason)
    if runners:
        if ctx.settle is not None:
            ctx.settle()
        timings = ctx.time({n: r.run for n, r in runners.items()}, **ctx.timing_options())
        for name, t in timings.items():
            row = rows[name]
            if isinstance(t, Timing):
                row.update(median_ms=t.median_ms, p20_ms=t.p20_ms, p80_ms=t.p80_ms, samples=t.samples,
                           tflops=prob.flops / (t.median_ms * 1e-3) / 1e12,
                           roofline=row["floor_ms"] / t.median_ms)
                _note_hold(row, t)
                out[name] = _finish(row, "ok")
            else:
                out[name] = _finish(row, "failed", f"timing: {_reason(t)}")
    runners.clear()
    ref = None
    ctx.cleanup()
    return [out[i.name] for i in todo]


def run_sweep(cases: list[Case], impls: list[Impl], writer: ResultWriter, ctx: Context) -> Tally:
    """Run every configuration, writing its rows as soon as it finishes. Returns counts by
    status (and ``resumed``: rows the CSV already held), with the reasons of the others."""
    counts = Tally()
    if ctx.progress and hasattr(ctx.progress, "plan"):
        ctx.progress.plan(cases)
    for n, case in enumerate(cases):
        if ctx.progress:
            ctx.progress(n, len(cases), case)
        rows = run_case(case, impls, ctx, writer.is_done)
        if ctx.progress and hasattr(ctx.progress, "finished"):
            ctx.progress.finished(case, ran=bool(rows))
        counts["resumed"] += len(impls) - len(rows)
        writer.write(rows)
        for r in rows:
            counts.add(r["status"], r.get("reason", ""))
    if ctx.progress:
        ctx.progress(len(cases), len(cases), None)
    return counts


def _duration(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class Progress:
    """One stderr line, rewritten in place on a terminal: configurations done / left, the time
    spent, an estimate of the time left, current. The estimate: with ``cost`` (a Case's estimated
    seconds, ``case_cost``) and the plan given (``plan``), the seconds the configurations that ran
    took per estimated second, times the estimate of those left (so a sweep that starts with its
    largest configurations, or resumes past some, is not extrapolated from them as if all were
    alike); otherwise the mean of the configurations done so far."""

    def __init__(self, stream=None, clock: Callable[[], float] | None = None,
                 cost: Callable[[Case], float] | None = None):
        import time

        self.stream = stream or sys.stderr
        self.tty = getattr(self.stream, "isatty", lambda: False)()
        self.clock = clock or time.monotonic
        self.cost = cost
        self.t0 = self.last = None
        self.left_cost = None  # estimated seconds of the configurations not yet finished (with a plan)
        self.ran_cost = self.ran_time = 0.0

    def plan(self, cases: list[Case]) -> None:
        if self.cost is not None:
            self.left_cost = sum(self.cost(c) for c in cases)

    def finished(self, case: Case, ran: bool) -> None:
        """``case`` is done; ``ran``: its rows ran here (not all resumed from the CSV)."""
        if self.left_cost is None or self.last is None:
            return
        c = self.cost(case)
        self.left_cost -= c
        if ran:
            self.ran_cost += c
            self.ran_time += self.clock() - self.last

    def _eta(self, spent: float, done: int, total: int) -> float | None:
        if not 0 < done < total:
            return None
        if self.left_cost is not None:
            return self.ran_time / self.ran_cost * max(0.0, self.left_cost) if self.ran_cost > 0 else None
        return spent / done * (total - done)

    def __call__(self, done: int, total: int, case: Case | None) -> None:
        now = self.clock()
        if self.t0 is None:
            self.t0 = now
        self.last = now
        spent = now - self.t0
        left = self._eta(spent, done, total)
        eta = f", about {_duration(left)} left" if left is not None else ""
        what = case.describe() if case is not None else "finished"
        line = f"[{done}/{total} done, {total - done} left, {_duration(spent)} spent{eta}] {what}"
        if self.tty:
            self.stream.write("\r\033[K" + line + ("\n" if case is None else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def device_context(seed: int = 0, budget_s: float = DEFAULT_BUDGET_S, command: str = "",
                   progress: Callable | None = None, samples: int | None = None) -> Context:
    """The real thing: provenance, peaks measured once, CUDA-event timing with L2 flushes.
    BadInput, before anything is measured, when there is no device to sweep on."""
    from .impls import device_problem
    from . import memory
    from .results import provenance
    from .timing import EventTimer, measure_peaks

    why = device_problem()
    if why:
        raise BadInput(f"sweep needs a CUDA device: {why}")
    prov = provenance()
    peaks = measure_peaks()
    timer = EventTimer()
    return Context(time=timer.time, peaks=peaks, provenance=prov, seed=seed, budget_s=budget_s,
                   command=command, progress=progress, samples=samples, memory=memory.DeviceMemory, settle=settle,
                   device_bytes=memory.device_bytes())


def settle() -> None:
    """The pause between a configuration's gate and its timing (``timing.SETTLE_S``), the device idle."""
    import time

    from .timing import SETTLE_S

    time.sleep(SETTLE_S)


__all__ = ["Instance", "Case", "Context", "ReferenceCache", "plan", "shard", "parse_shard", "case_cost", "instances", "t_values", "select_impls", "run_case",
           "run_sweep", "device_context", "Progress", "COLUMNS", "row_key"]
