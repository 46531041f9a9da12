"""The attnbench command line."""
from __future__ import annotations

import functools
import json
import shlex
import sys
from typing import NoReturn

import click

from .configs import CONFIGS
from .errors import BadInput
from .impls import DTYPES, PASSES
from .patterns import PATTERNS, all_params, make_mask
from .timing import MAX_SAMPLES


def fail(message: str, code: int = 2) -> NoReturn:
    """The one way a command stops on an error: one 'error: ...' line on stderr, no traceback.
    Exit 2: refused (bad input, an unusable path, no device) before anything ran; exit 1: it
    ran, and no pass can be reported (a check failed, or nothing was checked)."""
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def friendly(fn):
    """Refused input and unusable paths: 'error: ...' on stderr, exit 2, no traceback."""
    @functools.wraps(fn)
    def wrapper(*a, **kw):
        try:
            return fn(*a, **kw)
        except BadInput as e:
            fail(str(e))
        except OSError as e:
            if e.filename is None:
                raise
            fail(f"{e.filename}: {e.strerror or type(e).__name__}")
    return wrapper


class OnceCommand(click.Command):
    """A command whose single-valued options may be given once: click would keep the last of two
    silently (`--H 8 --H 16` runs H=16 only), so a second one is a usage error naming the option."""

    def parse_args(self, ctx, args):
        valued = {o: p for p in self.params if isinstance(p, click.Option) and not p.is_flag and not p.count
                  for o in p.opts}  # the options that take a value (the next word, or after '=')
        seen, i = {}, 0
        while i < len(args) and args[i] != "--":
            name, eq, _ = args[i].partition("=")
            p = valued.get(name)
            if p is None:
                i += 1
                continue
            if not p.multiple:
                if p.name in seen:
                    raise click.UsageError(f"{name} given twice (after {seen[p.name]}): it takes one value; "
                                           f"give it once", ctx)
                seen[p.name] = args[i] if eq else " ".join(args[i:i + 2])
            i += 1 if eq else 2
        return super().parse_args(ctx, args)


class Cli(click.Group):
    """click's own usage errors in the same style as attnbench's: one 'error: ...' line, exit 2; single-valued
    options given twice refused (OnceCommand)."""

    command_class = OnceCommand

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except click.ClickException as e:
            if type(e).__name__ == "NoArgsIsHelpError":  # bare `attnbench`: the help, as click shows it
                e.show()
                sys.exit(e.exit_code)
            ctx = getattr(e, "ctx", None)
            fail(e.format_message() + (f" (see `{ctx.command_path} --help`)" if ctx else ""), e.exit_code)
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


def pattern_options(multiple: bool = False):
    """One option per declared pattern parameter of the registry (default: each pattern's own);
    with ``multiple``, repeatable (a sweep axis). Named integers (custom's ``--param NAME=VALUE``)
    are repeatable always: the values together make one parameter value, in a sweep too."""
    def deco(fn):
        for name, uses in reversed(list(all_params().items())):
            q = uses[0][1]
            takers = ", ".join(pat.name for pat, _ in uses)
            named = q.kind == "named"
            fn = click.option(q.flag, f"param_{name}", type=int if q.kind == "int" else str,
                              multiple=multiple or named, default=() if multiple or named else None,
                              metavar={"ints": "N,N,...", "pairs": "A:B,A:B,...", "named": "NAME=VALUE",
                                       "str": "TEXT"}.get(q.kind),
                              help=f"{q.help} ({takers}){'; repeatable' if multiple and not named else ''}")(fn)
        return fn
    return deco


def pattern_params(kw: dict, axes: bool = False) -> dict:
    """The pattern parameters the options gave (popped from ``kw``), by parameter name; with
    ``axes`` (a sweep), each a tuple of values, the named integers all in one."""
    p = {k[len("param_"):]: kw.pop(k) for k in [k for k in kw if k.startswith("param_")]}
    p = {k: v for k, v in p.items() if v not in (None, ())}
    if axes:
        named = {name for name, uses in all_params().items() if uses[0][1].kind == "named"}
        p = {k: (v,) if k in named else v for k, v in p.items()}
    return p


class ImplName(click.ParamType):
    """An implementation's name, checked against the registry when the option is read (the
    registry loads its modules on first use, so the choices are not fixed at import)."""
    name = "impl"

    def get_metavar(self, param, *args, **kwargs):
        from .impls import all_impls

        return "[" + "|".join(all_impls()) + "]"

    def convert(self, value, param, ctx):
        from .impls import all_impls

        names = list(all_impls())
        if value in names:
            return value
        self.fail(f"{value!r} is not one of {', '.join(map(repr, names))}", param, ctx)


IMPL = ImplName()


TILE_CONFIG_HELP = ("a fast-tc tile shape: FIELD=N,... of NWARPS, BN, STAGES, MT, MINB, QREG, WG, TMA, OV, REL, PP, KVS (the fields "
                    "left out as fast-tc chooses them for each configuration), or all by position "
                    "NWARPS,BN,STAGES[,MT,MINB,QREG,WG,TMA,OV,REL,PP,KVS]")


def tile_specs(texts, module: str = "fwd_config", parse: str = "parse_tile_config") -> list:
    """``--tile-config`` values parsed (BadInput naming the option and the limit), in order, once each;
    with ``module`` and ``parse``, another option's by its parser (``decode_specs``)."""
    if not texts:
        return []
    import importlib

    fn = getattr(importlib.import_module(f"{__package__}.{module}"), parse)
    return list(dict.fromkeys(fn(t) for t in texts))


DECODE_CONFIG_HELP = ("a fast-decode shape: FIELD=N,... of NWARPS, BN, STAGES, MINB, SPLITS (0: derived), BLOCKS_PER_SM "
                      "(0: as many as one SM holds), MIN_PER_SPLIT, MERGE, BY_KEYS (0: warps take rows, 1: keys, 2: keys where the "
                      "rows fit 16), ONE_PER_SM, CLASSES (1: a strided pattern's one query reads its residue class "
                      "only), BN_SHORT (the tiles of lists of at most 2048 keys; 0: BN's), PDL (1: the merge launch a "
                      "programmatic dependent on sm_90), CLUSTER (the most splits of a pair that merge in one "
                      "thread-block cluster on sm_90, no merge launch; 0: never), CLUSTER_TILES (a list of at most "
                      "CLUSTER x CLUSTER_TILES tiles takes CLUSTER splits), CLUSTER_ROWS (the most query rows a pair may hold "
                      "to merge in a cluster), BY_PAIRS (1: a warp takes a whole pair where its rows fit 16 and the "
                      "stages fit; 2: that where the pairs outnumber a wave of split blocks; 0: never), HEADS (the blocks "
                      "a group's query heads are dealt to; 0: where pairs are few, rows exceed 16 and the list holds "
                      "at most 512 keys), WG (1: the warps-on-rows kernel's products on warpgroup MMA on sm_90; 0: "
                      "mma.sync), KWG (2: that kernel's two warpgroups on the same rows, each half of every tile, "
                      "NWARPS=8, sm_90; 1: one; 0: 2 where the pairs are neither few nor more than the SMs and the list "
                      "holds more than 256 keys), EVICT (1: K and V loaded with L2's evict-first policy; 0: plain; 2: the first "
                      "where a launch reads at most three L2s of K and V and a group's heads take one block), CMERGE "
                      "(1: a cluster's merge issues each thread's reads of all its pieces before using any; 0: piece by "
                      "piece; 2: the first where the rows give a thread of the cluster more than one piece), RAGGED "
                      "(1: a ragged batch's splits counted from every list, so long sequences take more blocks; 0: "
                      "from the longest), FLAT (1: a ragged batch's lists end to end in one wave of equal runs, a "
                      "block's run crossing pairs, where the key slices' kernel merges by the merge launch; 2: a batch "
                      "of one length too, where its pairs take several splits; 0: each list split on its own), SPANS (1: a "
                      "partial tile's rows no query reads are never loaded; 0: every tile whole), OV (1: the warps-on-rows "
                      "kernel on warpgroup MMA keeps a tile's S and the tile before's P V in flight together, 3 stages "
                      "or more; 0: each product waited for) (the "
                      "others at their defaults); each adds a row per configuration, named e.g. "
                      "fast-decode[SPLITS=8], timed with the others (repeatable; the plain fast-decode takes "
                      "ATTNBENCH_DECODE_CONFIG)")


def bwd_specs(texts) -> list:
    from .bwd_config import parse_bwd_config

    return [parse_bwd_config(t) for t in texts]


def decode_specs(texts) -> list:
    """``--decode-config`` values parsed (BadInput naming the option and the limit), in order, once each."""
    return tile_specs(texts, "decode_config", "parse_decode_config")


PASS_HELP = ("fwd: the forward; bwd: the backward alone, given the forward's output and row log-sum-exp; "
             "fwd+bwd: a training step")


def serving_options(sweep: bool = False):
    """Grouped-query heads, the query length and a ragged batch's cache lengths (SPEC section 1);
    with ``sweep``, --Tq is repeatable (an axis) and the defaults are the config's."""
    from .serving import DISTRIBUTIONS

    def deco(fn):
        for o in reversed([
            click.option("--H-kv", "H_kv", type=int, default=None,
                         help="key/value heads, dividing H: query head h reads head h // (H // H_kv) "
                              + ("(default: the config's, else H)" if sweep else "(default: H)")),
            click.option("--Tq", "Tq", type=int, multiple=sweep, default=() if sweep else None,
                         help="queries, at positions Tk - Tq .. Tk - 1 of the Tk = T keys (1: decoding; "
                              + ("repeatable; default: the config's, else T)" if sweep else "default: T, prefill)")),
            click.option("--cache-lens", "cache_lens", default=None, metavar="N,N,...",
                         help="a ragged batch: each sequence's cache length (one per sequence, Tq to T)"),
            click.option("--cache-dist", "cache_dist", type=click.Choice(list(DISTRIBUTIONS)), default=None,
                         help="a ragged batch drawn: " + "; ".join(f"{k}: {v}" for k, v in DISTRIBUTIONS.items())),
            click.option("--cache-seed", "cache_seed", type=int, default=0, help="seed of --cache-dist"),
        ]):
            fn = o(fn)
        return fn
    return deco


def serving_given(kw: dict) -> dict:
    """The serving options (popped from ``kw``), --cache-lens parsed; BadInput naming the option."""
    from .serving import parse_lens

    s = {k: kw.pop(k) for k in ("H_kv", "Tq", "cache_lens", "cache_dist", "cache_seed")}
    if s["cache_lens"] is not None:
        s["cache_lens"] = parse_lens(s["cache_lens"])
        if s["cache_dist"] is not None:
            raise BadInput("--cache-lens and --cache-dist exclude each other (lengths given, or drawn)")
    if s["cache_dist"] is None and s["cache_seed"] != 0:
        raise BadInput("--cache-seed seeds --cache-dist: give --cache-dist too")
    return s


def serving_problem(mask, B, H, D, dtype, s: dict, *args, pass_name: str = "fwd"):
    """The Problem of one case with the serving options ``s`` (a drawn ragged batch at its B and T)."""
    from .impls import Problem
    from .serving import cache_lens_for

    Tq = mask.T if s["Tq"] is None else s["Tq"]
    lens = cache_lens_for(B, mask.T, Tq, s["cache_lens"], s["cache_dist"], s["cache_seed"]) \
        if 1 <= Tq <= mask.T else s["cache_lens"]
    return Problem(mask, B, H, D, dtype, *args, pass_name=pass_name, H_kv=s["H_kv"], Tq=s["Tq"], cache_lens=lens)


def check_samples(samples: int | None, budget: float | None) -> None:
    if samples is None:
        return
    if not 1 <= samples <= MAX_SAMPLES:
        raise BadInput(f"--samples={samples} must be from 1 to {MAX_SAMPLES}")
    if budget is not None:
        raise BadInput("--samples and --time-budget exclude each other (a fixed count, or an adaptive one)")


@click.group(cls=Cli, context_settings={"show_default": True})
@click.version_option(package_name="attnbench")
def main():
    """attnbench: what sparse attention really costs on your GPU."""


@main.command("list")
def list_cmd():
    """Patterns with their parameters, implementations and whether they run here."""
    from .impls import all_impls

    click.echo("patterns:")
    for pat in PATTERNS.values():
        ps = ", ".join(f"{p.name}={p.default}" for p in pat.params) or "no parameters"
        click.echo(f"  {pat.name:<15} {ps}")
        click.echo(f"  {'':<15} {pat.summary}")
    click.echo("implementations:")
    for im in all_impls().values():
        why = im.availability()
        state = "available" if why is None else f"unavailable: {why}"
        click.echo(f"  {im.name:<15} [{im.family}] {', '.join(im.dtypes)}; pass {', '.join(im.passes)}; "
                   f"{im.shapes_taken()}: {state}")
        click.echo(f"  {'':<15} {im.description}")
    click.echo("passes: fwd (forward), bwd (backward, given the forward's output and log-sum-exp), fwd+bwd "
               "(training step), each implementation's above; fast-tc and fast-tc-sync compute all three (fast-tc's "
               "backward on wgmma on sm_90, fast-tc-sync's on mma.sync), the peers too (the torch peers through autograd), the float32 "
               "family (naive, fast-f32) stays forward-only, and serving shapes (H_kv < H, Tq < Tk, ragged "
               "batches) are forward-only")


def case_options(impl: str, T: int, H: int, D: int, dtype: str):
    """The options of one case (run, profile), with the command's own defaults."""
    def deco(fn):
        for o in reversed([
            click.option("--pattern", default="streaming", type=click.Choice(list(PATTERNS))),
            click.option("--T", "T", type=int, default=T, help="sequence length"),
            pattern_options(),
            click.option("--B", "B", type=int, default=1),
            click.option("--H", "H", type=int, default=H),
            click.option("--D", "D", type=int, default=D, help="head dimension (the constant C of naive)"),
            click.option("--dtype", type=click.Choice(DTYPES), default=dtype),
            click.option("--impl", default=impl, type=IMPL),
        ]):
            fn = o(fn)
        return fn
    return deco


@main.command("run")
@case_options(impl="naive", T=2048, H=1, D=384, dtype="float32")
@click.option("--max-t", type=int, default=None, help="compile-time MAX_T (default: T rounded up)")
@click.option("--max-keys", type=int, default=None, help="compile-time MAX_KEYS (default: from the pattern)")
@click.option("--causal/--no-causal", default=True, show_default=True)
@click.option("--pass", "pass_name", type=click.Choice(PASSES), default="fwd", help=PASS_HELP)
@serving_options()
@friendly
def run_cmd(pattern, T, B, H, D, dtype, impl, max_t, max_keys, causal, pass_name, **kw):
    """Run dense and a pattern once each, check both, print time, TFLOP/s, error and speedup
    (a backward pass: its gradients checked, the pass timed)."""
    from .check import grad_inputs, judge, problem_inputs
    from .impls import get_impl

    serving = serving_given(kw)
    params = pattern_params(kw)
    im = get_impl(impl)
    probs = []
    for name, ps in (("dense", {}), (pattern, params)):
        mask = make_mask(name, T, causal, **ps)
        probs.append(serving_problem(mask, B, H, D, dtype, serving, None, max_t, max_keys, pass_name=pass_name))
    for prob in probs:  # refuse before any launch
        im.require(prob)
    q, k, v = problem_inputs(probs[0], seed=1234)
    grad = grad_inputs(probs[0], seed=1234)  # a backward pass: the output gradient do
    click.echo(f"{im.name}: B={B} H={H} T={T} D={D} {dtype} {'causal' if causal else 'non-causal'}"
               + ("" if pass_name == "fwd" else f", pass {pass_name}"))
    from .timing import EventTimer

    runners, results = {}, []
    for prob in probs:
        runner = im.prepare(prob, q, k, v, **grad)
        res = judge(im, prob, runner, q, k, v, **grad)
        results.append(res)
        if res.ok:
            runners[prob.mask.label()] = runner.run
    timings = EventTimer().time(runners) if len(runners) == len(probs) else {}
    for prob, res in zip(probs, results):
        t = timings.get(prob.mask.label())
        ms = t.median_ms if t is not None else float("nan")
        tflops = prob.flops / (ms * 1e-3) / 1e12
        state = "ok" if res.ok else f"FAILED: {res.reason}"
        click.echo(f"  {prob.mask.label():<40} {ms:10.3f} ms {tflops:9.3f} TFLOP/s  "
                   f"rel err {res.rel_err:.2e}  {state}")
    if not timings:
        sys.exit(1)
    dense_ms, pattern_ms = (timings[p.mask.label()].median_ms for p in probs)
    click.echo(f"  speedup {pattern} over dense: {dense_ms / pattern_ms:.2f}x")


def check_cases(patterns, Ts, given: dict | None = None):
    """Pattern instances for the gate: each pattern's examples at each T (block sizes that fit);
    a pattern that takes some of the ``given`` parameters runs with those (its defaults for the
    rest) instead of its examples."""
    for name in patterns:
        pat = PATTERNS[name]
        takes = {q.name: given[q.name] for q in pat.params if q.name in (given or {})}
        for T in Ts:
            for ps in [takes] if takes else pat.examples(T):
                yield name, ps, T


@main.command("check")
@click.option("--impl", "impls", multiple=True, type=IMPL, help="implementations (repeatable; default: every available one)")
@click.option("--pattern", "patterns", multiple=True, type=click.Choice(list(PATTERNS)),
              help="patterns (repeatable; default: every registered one)")
@click.option("--T", "Ts", type=int, multiple=True, help="sizes (repeatable; default: 1 7 128 1000 4096)")
@click.option("--D", "D", type=int, default=64, show_default=True)
@click.option("--B", "B", type=int, default=2, show_default=True)
@click.option("--H", "H", type=int, default=3, show_default=True)
@click.option("--causal/--no-causal", default=True, show_default=True)
@click.option("--pass", "pass_name", type=click.Choice(PASSES), default="fwd", help=PASS_HELP)
@pattern_options()
@serving_options()
@friendly
def check_cmd(impls, patterns, Ts, D, B, H, causal, pass_name, **kw):
    """The correctness gate over patterns x implementations x sizes. Exit 1 when a check failed
    or nothing was checked; 2 when refused (bad input, a named implementation that cannot run).
    Pattern parameter options (e.g. --pattern custom --expr ... --param W=64) replace the examples
    of the patterns that take them."""
    from .check import gate
    from .impls import all_impls, get_impl
    from .results import Tally

    serving = serving_given(kw)
    given = pattern_params(kw)
    patterns = patterns or tuple(PATTERNS)
    for opt, values in (("--T", Ts), ("--D", (D,)), ("--B", (B,)), ("--H", (H,))):
        for v in values:
            if v < 1:
                raise BadInput(f"{opt}={v} must be a positive integer")
    for T in Ts:  # the masks' own limits too, before any implementation is asked whether it can run here
        make_mask("dense", T)
    # the serving options against the longest T (a shorter T that Tq or a cache length exceeds: skipped),
    # and with the pass (serving shapes are forward-only)
    serving_problem(make_mask("dense", max(Ts or (4096,))), B, H, D, "float32", serving, pass_name=pass_name)
    for name in given:
        if not any(name in PATTERNS[p].defaults() for p in patterns):
            raise BadInput(f"{all_params()[name][0][1].flag}: none of the patterns checked takes it "
                           f"(it is a parameter of {', '.join(p.name for p, _ in all_params()[name])})")
    for p in patterns:  # and what depends on no T (custom's expression)
        pat = PATTERNS[p]
        ps = {q.name: q.value(given[q.name]) for q in pat.params if q.name in given}
        if ps:
            pat.check_params({**pat.defaults(), **ps})
    if impls:
        chosen = [get_impl(n) for n in dict.fromkeys(impls)]
        for im in chosen:  # asked for by name: refused rather than skipped case by case
            why = im.availability()
            if why:
                raise BadInput(f"impl={im.name} cannot run here: {why}")
    else:
        chosen = [i for i in all_impls().values() if i.availability() is None]
    if not chosen:
        raise BadInput("no implementation is available here (see `attnbench list`)")
    Ts = Ts or (1, 7, 128, 1000, 4096)
    tally = Tally()
    click.echo(f"{'impl':<15} {'dtype':<9} {'pattern':<44} {'T':>6} {'rel err':>10}  result")
    for im in chosen:
        for dtype in im.dtypes:
            for name, ps, T in check_cases(patterns, Ts, given):
                try:
                    prob = serving_problem(make_mask(name, T, causal, **ps), B, H, D, dtype, serving,
                                           pass_name=pass_name)
                    label = prob.mask.label()
                    why = im.unsupported(prob) or im.availability()
                except BadInput as e:
                    label, why = f"{name}{json.dumps(ps) if ps else ''}", str(e)
                if why:
                    tally.add("skipped", why)
                    click.echo(f"{im.name:<15} {dtype:<9} {label:<44} {T:>6} {'':>10}  skipped: {why}")
                    continue
                try:
                    res = gate(im, prob)
                    state = "ok" if res.ok else f"FAILED: {res.reason}"
                    err = f"{res.rel_err:10.2e}"
                except Exception as e:  # a crash is a failure of this case, the gate goes on
                    res, state, err = None, f"FAILED: {type(e).__name__}: {e}", f"{'':>10}"
                tally.add("ok" if res is not None and res.ok else "failed", state.removeprefix("FAILED: "))
                click.echo(f"{im.name:<15} {dtype:<9} {label:<44} {T:>6} {err}  {state}")
    click.echo(tally.summary())
    for line in tally.reason_lines():
        click.echo(line)
    if tally["failed"]:
        fail(f"{tally['failed']} of {tally.checked} checks failed", 1)
    if not tally.checked:
        fail(f"nothing was checked: all {tally['skipped']} cases were skipped (reasons above)", 1)


@main.command("compile")
@click.option("--arch", "archs", multiple=True, default=("sm_90",), show_default=True,
              help="target, e.g. sm_80 or sm_90 (repeatable)")
@click.option("--hashes", is_flag=True, help="add each cubin's SHA-256 (to show a source change leaves the code as it was)")
@click.option("--gate-builds", is_flag=True, help="also every fast-tc build the GPU gate tests compile")
@friendly
def compile_cmd(archs, hashes, gate_builds):
    """Compile every kernel with the standard configurations' constants (no GPU needed)."""
    from . import compile as kc

    builds = kc.standard_builds()
    if gate_builds:
        from .fast_tc import gate_builds as gate

        builds += [b for b in gate() if b not in builds]

    for arch in archs:
        kc.check_arch(arch)
    failed = 0
    refused = set()
    click.echo(f"{'arch':<6} {'source':<9} {'kernel':<28} {'constants':<36} {'regs':>5} {'spill st/ld':>12} "
               f"{'stack':>6} {'smem':>7}")
    for arch in archs:
        for name, defines in builds:
            consts = " ".join(f"{k}={v}" for k, v in sorted(defines.items()))
            target = kc.target_arch(defines, arch)
            if target is None:
                continue
            why = kc.unbuildable(name, target)
            if why:
                if (name, target) not in refused:
                    refused.add((name, target))
                    click.echo(f"skipped: {why}", err=True)
                continue
            try:
                reports = kc.compile_only(name, defines, target)
            except RuntimeError as e:
                failed += 1
                click.echo(f"{target:<6} {name:<9} FAILED {consts}\n{e}", err=True)
                continue
            for r in reports:
                click.echo(f"{r.arch:<6} {name:<9} {r.kernel:<28} {consts:<36} {r.registers:>5} "
                           f"{r.spill_stores:>5}/{r.spill_loads:<6} {r.stack:>6} {r.smem:>7}"
                           + (f" {r.cubin_sha256[:16]}" if hashes else ""))
    sys.exit(1 if failed else 0)


@main.command()
@click.option("--config", "config", default="seed", show_default=True, type=click.Choice(list(CONFIGS)),
              help="the standard configuration (SPEC section 5) the options below widen or override")
@click.option("--T-min", "T_min", type=int, help="smallest T (powers of two from here)")
@click.option("--T-max", "T_max", type=int, help="largest T")
@click.option("--T", "T", type=int, multiple=True, help="explicit T values (repeatable; wins over the range)")
@click.option("--pattern", "patterns", multiple=True, type=click.Choice(list(PATTERNS)),
              help="patterns to sweep (repeatable; default: all of the config)")
@click.option("--impl", "impls", multiple=True, type=IMPL,
              help="implementations (repeatable; default: every registered one)")
@pattern_options(multiple=True)
@click.option("--dtype", "dtypes", multiple=True, type=click.Choice(DTYPES),
              help="(repeatable; default: the config's)")
@click.option("--B", "B", type=int, multiple=True, help="batch sizes (repeatable; default: the config's)")
@click.option("--H", "H", type=int, help="heads (default: the config's)")
@click.option("--D", "D", type=int, multiple=True, help="head dims (repeatable; default: the config's)")
@click.option("--causal/--no-causal", default=None,
              help="force the causal flag of every pattern (default: the config's, else each pattern's own)")
@click.option("--out", "out", default="results.csv", show_default=True, type=click.Path(dir_okay=False))
@click.option("--resume", is_flag=True,
              help="add to --out, skipping (configuration, impl) rows it holds; a last line cut short is "
                   "set aside in <out>.partial")
@click.option("--retry-failed", "retry_failed", is_flag=True,
              help="with --resume: run the failed rows again, replacing them")
@click.option("--overwrite", is_flag=True,
              help="replace --out if it exists (it is replaced when the first rows arrive, not before)")
@click.option("--time-budget", "budget", type=float, default=None,
              help="seconds of timing samples per configuration before the adaptive repeats stop "
                   "(at least the minimum sample count is always taken)")
@click.option("--samples", type=int, default=None, metavar="N",
              help=f"exactly N timing samples per implementation instead of the adaptive time budget "
                   f"(1 to {MAX_SAMPLES})")
@click.option("--tile-config", "tile_configs", multiple=True, metavar="SPEC", help=TILE_CONFIG_HELP
              + "; each shape adds a row per configuration for every fast-tc implementation swept, named "
                "e.g. fast-tc[BN=32,STAGES=3], timed with the others; its setup_s records the whole shape "
                "(repeatable)")
@click.option("--decode-config", "decode_configs", multiple=True, metavar="SPEC", help=DECODE_CONFIG_HELP)
@click.option("--bwd-config", "bwd_configs", multiple=True, metavar="SPEC",
              help="fast-tc's backward with fields fixed: NWARPS (4: one warpgroup, 8: two), STAGES, MINB of its "
                   "main kernel, DQ (0: dQ's sums by float32 reductions, 1: dQ by its own pass, 2: that pass's blocks "
                   "in the main kernel's launch, 3: stored whole by the wgmma main loop where every query tile reads "
                   "one key tile) and STATS (with the pass, 2: it computes the rows' lse and delta from O "
                   "in shared memory and runs first, no prep; 1: the same from global memory; 0: prep does) and PAIRS "
                   "(two warpgroups at D=64: 1, dQ of two query tiles at a time, one a warpgroup; 2, the same with dQ's "
                   "products in flight through the next pair's first tile; 0, one tile's by both), SKIP (the pass "
                   "skips a warp's all-zero key blocks of P: 1, or 0), WAVES (the waves of blocks the work items "
                   "fill), PMINB (the pass's blocks per multiprocessor asked of the register allocator; 0: its "
                   "shape's), ORDER (the work items' launch order: 0, longest first; 1, by the query tiles they "
                   "read), L (the most query tiles a work item walks; 0: as chosen), CUT (the same for the items "
                   "of the key tiles L splits only; 0: L's), PWG (dQ's pass beside the wgmma main loop: 1, on "
                   "wgmma; 0, the mma.sync build's), PTMA (that wgmma pass's tiles: 1, by bulk tensor copies on "
                   "unstrided patterns; 0, by cp.async) and MTMA (the wgmma main loop's Q and dO tiles: 1, by bulk "
                   "tensor copies on unstrided patterns, not with DQ=2; 0, by cp.async) and PPER (the wgmma pass: 1, "
                   "persistent, about the GPU's resident blocks taking the query tiles in turn, by cp.async; 0, a "
                   "block a query tile) and MPER (the wgmma main loop: 1, persistent, the work items in turn, not "
                   "with DQ=2; 0, a block an item) and DQR (the wgmma main loop with DQ=0 and MTMA=1: 1, dQ's sums "
                   "by bulk tensor reductions from shared memory; 2, the same from two sets of staging buffers in turn, "
                   "one query tile at a time; 0, by red.global.add from registers) and LAG (two warpgroups of the "
                   "wgmma main loop with DQ=0 and MTMA=1: 1, each takes dQ of the tile before its current one, the "
                   "warpgroups meeting on barriers of their own, no block barrier a tile; 2 (D=128), the same with "
                   "dQ's products issued behind the tile's dK; 0, both meet every tile) "
                   "as FIELD=N,...; "
                   "each adds a row per bwd / fwd+bwd configuration for fast-tc and fast-tc-sync, named e.g. "
                   "fast-tc[bwd:DQ=1], timed with the others (repeatable)")
@click.option("--seed", type=int, default=0, show_default=True, help="seed of the random inputs")
@click.option("--pass", "pass_names", multiple=True, type=click.Choice(PASSES),
              help=PASS_HELP + " (repeatable; default: the config's, fwd but for --config training)")
@click.option("--shard", "shard_text", default=None, metavar="I/N",
              help="run only shard I of N (e.g. one process per GPU, CUDA_VISIBLE_DEVICES apart, each with its "
                   "own --out; `attnbench merge` joins them): a configuration's passes stay together, the "
                   "configurations dealt by their estimated time")
@serving_options(sweep=True)
@friendly
def sweep(config, T_min, T_max, T, patterns, impls, dtypes, B, H, D, causal, out, resume, retry_failed, overwrite,
          budget, samples, tile_configs, decode_configs, bwd_configs, seed, pass_names, shard_text, **kw):
    """Gate every implementation against the float64 reference, time the ones that pass
    (interleaved), and append one row per (configuration, implementation) to a CSV.
    Exit 1 when a row failed or nothing new was checked; 2 when refused before running."""
    from . import sweep as sw
    from .results import ResultWriter
    from .timing import DEFAULT_BUDGET_S

    if resume and overwrite:
        raise BadInput("--resume and --overwrite exclude each other")
    if budget is not None and budget <= 0:
        raise BadInput(f"--time-budget={budget} must be positive")
    check_samples(samples, budget)
    specs = tile_specs(tile_configs)
    dspecs = decode_specs(decode_configs)
    bspecs = bwd_specs(bwd_configs)
    serving = serving_given(kw)
    cases = sw.plan(config, patterns=patterns, T=T, T_min=T_min, T_max=T_max, B=B, H=H, D=D, dtype=dtypes,
                    causal=causal, passes=pass_names, **serving, **pattern_params(kw, axes=True))
    planned = len(cases)
    if shard_text is not None:
        index, count = sw.parse_shard(shard_text)
        cases = sw.shard(cases, index, count)
    chosen = sw.select_impls(impls, specs, dspecs, bspecs)
    command = "attnbench " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    # looks only: refuses an unusable --out; nothing is written before the device is there
    writer = ResultWriter(out, resume=resume, overwrite=overwrite, retry_failed=retry_failed,
                          warn=lambda msg: click.echo(f"warning: {msg}", err=True))
    ctx = sw.device_context(seed=seed, budget_s=budget or DEFAULT_BUDGET_S, command=command,
                            progress=sw.Progress(cost=sw.case_cost), samples=samples)
    writer.check_gpu(ctx.provenance["gpu"])
    if shard_text is not None:
        click.echo(f"shard {index}/{count}: {len(cases)} of the {planned} configurations", err=True)
    click.echo(f"{len(cases)} configurations x {len(chosen)} implementations "
               f"({', '.join(i.name for i in chosen)}) -> {out}", err=True)
    p = ctx.peaks
    click.echo(f"peaks: tensor-core {p.tc_tflops:.1f} TFLOP/s, float32 {p.f32_tflops:.1f} TFLOP/s, "
               f"copy {p.copy_tbps:.2f} TB/s, read {p.read_tbps:.2f} TB/s on {ctx.provenance['gpu']}", err=True)
    with writer:
        counts = sw.run_sweep(cases, chosen, writer, ctx)
    click.echo(f"{counts.summary()} -> {out}", err=True)
    for line in counts.reason_lines():
        click.echo(line, err=True)
    if counts["failed"]:
        fail(f"{counts['failed']} of {counts.checked} rows failed (their reasons are in {out})", 1)
    if not counts.checked and counts["skipped"]:
        fail(f"nothing was checked: all {counts['skipped']} new rows were skipped (reasons above)", 1)


@main.command()
@click.argument("csv_paths", metavar="RESULTS.csv...", nargs=-1, required=True)
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False), help="the merged CSV (written whole)")
@click.option("--replace", is_flag=True,
              help="a row whose (configuration, implementation) an earlier file holds replaces it "
                   "(default: refused)")
@friendly
def merge(csv_paths, out, replace):
    """Join results CSVs of one GPU (the shards of `sweep --shard`, or new rows for an older file)
    into one, in the order given. Refused: files of different GPUs, and a row two files hold
    unless --replace."""
    from .results import merge_results

    n, replaced = merge_results(list(csv_paths), out, replace=replace)
    click.echo(f"{n} rows from {len(csv_paths)} files -> {out}" + (f" ({replaced} replaced)" if replaced else ""),
               err=True)


@main.command("profile")
@case_options(impl="fast-tc", T=32768, H=16, D=64, dtype="bfloat16")
@click.option("--causal/--no-causal", default=True, show_default=True)
@click.option("--tile-config", "tile_config", default=None, metavar="SPEC",
              help=TILE_CONFIG_HELP + " (fast-tc and fast-tc-sync)")
@click.option("--decode-config", "decode_config", default=None, metavar="SPEC",
              help=DECODE_CONFIG_HELP.split("; each adds")[0] + " (fast-decode)")
@click.option("--bwd-config", "bwd_config", default=None, metavar="SPEC",
              help="fast-tc's backward with fields fixed, as `sweep --bwd-config` takes them (with --pass bwd "
                   "or fwd+bwd)")
@click.option("--pass", "pass_name", type=click.Choice(PASSES), default="fwd", help=PASS_HELP
              + "; a pass of several launches profiles each of them")
@click.option("--seed", type=int, default=1, show_default=True, help="seed of the random inputs")
@serving_options()
@friendly
def profile_cmd(impl, pattern, T, B, H, D, dtype, causal, tile_config, decode_config, bwd_config, pass_name, seed,
                **kw):
    """One run of one case for Nsight Compute: prepare, gate, a warm-up run, then one run inside the
    NVTX range profile/<impl>, e.g. `ncu --nvtx --nvtx-include "profile/" --set full
    attnbench profile --pattern window --window 256` (a backward's run is several launches: give ncu
    their count). Exit 1 when the gate fails (nothing profiled)."""
    from .devtools import PROFILE_RANGE, profile_launch
    from .impls import get_impl

    specs = tile_specs([tile_config] if tile_config is not None else [])
    dspecs = decode_specs([decode_config] if decode_config is not None else [])
    bspecs = bwd_specs([bwd_config] if bwd_config is not None else [])
    serving = serving_given(kw)
    im = get_impl(impl)
    for spec in specs:
        variant = im.tile_variant(spec)
        if variant is None:
            raise BadInput(f"--tile-config: impl={im.name} takes no tile shape (fast-tc and fast-tc-sync do)")
        im = variant
    for spec in dspecs:
        variant = im.decode_variant(spec)
        if variant is None:
            raise BadInput(f"--decode-config: impl={im.name} takes no decode shape (fast-decode does)")
        im = variant
    if bspecs and pass_name == "fwd":
        raise BadInput("--bwd-config: the backward's fields need --pass bwd or fwd+bwd")
    for spec in bspecs:
        variant = im.bwd_variant(spec)
        if variant is None:
            raise BadInput(f"--bwd-config: impl={im.name} takes no backward shape (fast-tc and fast-tc-sync do)")
        im = variant
    prob = serving_problem(make_mask(pattern, T, causal, **pattern_params(kw)), B, H, D, dtype, serving,
                           pass_name=pass_name)
    res, setup = profile_launch(im, prob, seed)
    what = (f"{im.name} {prob.mask.label()} {'causal' if causal else 'non-causal'} T={T} B={B} H={H} D={D} "
            f"{dtype}" + (f" H_kv={prob.kv_heads}" if prob.kv_heads != H else "")
            + (f" Tq={prob.q_len}" if prob.q_len != T else "")
            + (f" pass {pass_name}" if pass_name != "fwd" else "")
            + (f" backward {setup['bwd_tile_config']} ({setup['bwd_launches']})" if "bwd_launches" in setup else "")
            + (f" tile {setup['tile_config']}" if "tile_config" in setup else "")
            + (f" decode {setup['decode_config']} ({setup['kernel']}, {setup['splits']} splits"
               + (f", merged in a cluster of {setup['cluster']}" if setup.get("cluster", 1) > 1 else "") + ")"
               if "decode_config" in setup else ""))
    if not res.ok:
        fail(f"{what}: the gate failed ({res.reason}); nothing was profiled", 1)
    click.echo(f"{what}: gate ok (rel err {res.rel_err:.2e}); one launch in NVTX range {PROFILE_RANGE}/{im.name}")


@main.command("tiles")
@click.option("--config", "config", default="llm", show_default=True, type=click.Choice(list(CONFIGS)),
              help="the configuration whose pattern instances are built")
@click.option("--T", "T", type=int, default=131072, show_default=True, help="sequence length")
@click.option("--D", "Ds", type=int, multiple=True, help="head dims (repeatable; default: the config's)")
@click.option("--repeat", type=int, default=15, show_default=True, help="host builds of each list")
@click.option("--wgmma/--no-wgmma", default=None,
              help="the tile shapes fast-tc takes with wgmma (sm_90) or mma.sync (default: as the device "
                   "says; mma.sync without one)")
@click.option("--no-device", is_flag=True, help="host builds only, even where a device is")
@click.option("--out", "out", default=None, type=click.Path(dir_okay=False), help="also write the rows to this CSV")
@friendly
def tiles_cmd(config, T, Ds, repeat, wgmma, no_device, out):
    """Tile-list build times for the configuration's pattern instances at T, with the tile shape
    fast-tc takes for each D: the host build (first, median, min of --repeat) and, where a device
    is, the list's expansion on it."""
    from .devtools import tile_build_times, tile_header, tile_options, tile_row_line
    from .impls import device_problem

    tile_options(config, T, Ds, repeat)  # refused before any build
    if out is not None:
        from .safefile import probe

        probe(out, "--out")
    why = "--no-device" if no_device else device_problem()
    if why:
        click.echo(f"host builds only ({why})", err=True)
    click.echo(tile_header(not why))
    rows = tile_build_times(config, T, Ds, repeat, device=not why, wgmma=wgmma,
                            report=lambda row: click.echo(tile_row_line(row)),
                            skip=lambda label, reason: click.echo(f"{label:<68} skipped: {reason}"))
    if out is not None:
        write_rows(rows, out)


def write_rows(rows: list[dict], out: str) -> None:
    """A development command's rows as one CSV (written whole or not at all), said on stderr."""
    import pandas as pd

    from .safefile import write_atomically

    write_atomically(out, lambda f: pd.DataFrame(rows).to_csv(f, index=False), what="--out")
    click.echo(f"{len(rows)} rows -> {out}", err=True)


@main.command("floor")
@click.option("--samples", type=int, default=51, show_default=True, help="timed samples a case")
@click.option("--out", "out", default=None, type=click.Path(dir_okay=False), help="also write the rows to this CSV")
@friendly
def floor_cmd(samples, out):
    """The least a timed sample measures here: launches that do next to nothing (one and two of an
    empty kernel; reads alone, followed by an empty launch, and alone under L2's evict-first policy)
    under the sweep's timing protocol (L2 flushed, a blocking kernel, CUDA events). No row of a sweep
    can go below these."""
    from .devtools import event_floor_rows
    from .impls import device_problem

    check_samples(samples, None)
    if out is not None:
        from .safefile import probe

        probe(out, "--out")
    why = device_problem()
    if why:
        raise BadInput(f"floor needs a GPU: {why}")
    rows = event_floor_rows(samples)
    for r in rows:
        click.echo(f"{r['what']:<40} {r['median_ms'] * 1e3:8.1f} us (p20 {r['p20_ms'] * 1e3:.1f}, "
                   f"p80 {r['p80_ms'] * 1e3:.1f}, {r['samples']} samples)")
    if out is not None:
        write_rows(rows, out)


@main.command()
@click.argument("csv_path", metavar="RESULTS.csv")
@click.option("--out-dir", default="plots", show_default=True, type=click.Path(file_okay=False))
@friendly
def plot(csv_path, out_dir):
    """PNG figures from a results CSV, per (dtype, D, B, H): runtime, speedup-over-dense, tflops and
    share-of-floor vs T (a panel per pattern), and best-attnbench-vs-dense (the README's headline)."""
    from .plot import plot_csv

    for path in plot_csv(csv_path, out_dir):
        click.echo(str(path))


@main.command()
@click.argument("csv_paths", metavar="RESULTS.csv...", nargs=-1, required=True)
@click.option("--readme", "readme_paths", multiple=True, default=("README.md", "results/README.md"),
              show_default=True, type=click.Path(dir_okay=False),
              help="a file to update (repeatable): its headline and/or full-table markers are filled")
@click.option("--check", is_flag=True, help="exit 1 if a file's generated parts differ from the CSVs")
@friendly
def readme(csv_paths, readme_paths, check):
    """Rewrite the generated parts of the README (headline tables and figures) and of results/README.md
    (the full tables), between their attnbench markers, from results CSVs."""
    from pathlib import Path

    from .readme import update_files

    stale = update_files(readme_paths, list(csv_paths), check=check)
    for readme_path in readme_paths:
        changed = Path(readme_path) in stale
        if check and changed:
            click.echo(f"error: {readme_path} is stale: run `attnbench readme {' '.join(csv_paths)} "
                       f"--readme {readme_path}`", err=True)
        elif check:
            click.echo(f"{readme_path} is up to date", err=True)
        else:
            click.echo(f"{readme_path} {'updated' if changed else 'already up to date'}", err=True)
    if check and stale:
        sys.exit(1)


if __name__ == "__main__":
    main()
