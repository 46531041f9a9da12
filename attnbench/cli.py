"""Command line: ``attnbench sweep``, ``attnbench plot``, ``attnbench readme``."""
from __future__ import annotations

import functools
import shlex
import sys

import click

from .patterns import PATTERNS, BadInput


def _bad_input_exits(fn):
    """BadInput: ``error: ...`` on stderr, exit status 2, no traceback."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except BadInput as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(2)
    return wrapper


@click.group()
def main():
    """attnbench: sparse-attention CUDA kernels, benchmarked."""


@main.command()
@click.option("--config", "config", default="seed", show_default=True,
              help="seed or llm: the standard configuration (SPEC section 5) the options below widen or override")
@click.option("--T-min", "T_min", type=int, help="smallest T (powers of two from here)")
@click.option("--T-max", "T_max", type=int, help="largest T")
@click.option("--T", "T", type=int, multiple=True, help="explicit T values (repeatable; wins over the range)")
@click.option("--pattern", "patterns", multiple=True,
              help=f"patterns to sweep, of {', '.join(PATTERNS)} (repeatable; default: all of the config)")
@click.option("--impl", "impls", multiple=True, help="implementations (repeatable; default: every registered one)")
@click.option("--window", type=int, multiple=True, help="window W values (repeatable)")
@click.option("--sink", type=int, multiple=True, help="sink S values (repeatable)")
@click.option("--block", type=int, multiple=True, help="block Bk values (repeatable)")
@click.option("--dilation", type=int, multiple=True, help="dilation r values (repeatable)")
@click.option("--dtype", "dtypes", multiple=True,
              help="float32, float16 or bfloat16 (repeatable; default: the config's)")
@click.option("--B", "B", type=int, help="batch (default: the config's)")
@click.option("--H", "H", type=int, help="heads (default: the config's)")
@click.option("--D", "D", type=int, multiple=True, help="head dims (repeatable; default: the config's)")
@click.option("--causal/--no-causal", default=None, help="force the causal flag of every pattern")
@click.option("--out", "out", default="results.csv", show_default=True, type=click.Path(dir_okay=False))
@click.option("--resume", is_flag=True, help="add to --out, skipping (configuration, impl) rows it holds")
@click.option("--overwrite", is_flag=True, help="replace --out if it exists")
@click.option("--time-budget", "budget", type=float, default=None,
              help="seconds of timing samples per configuration before the adaptive repeats stop "
                   "(at least the minimum sample count is always taken)")
@click.option("--seed", type=int, default=0, show_default=True, help="seed of the random inputs")
@_bad_input_exits
def sweep(config, T_min, T_max, T, patterns, impls, window, sink, block, dilation, dtypes, B, H, D, causal,
          out, resume, overwrite, budget, seed):
    """Gate every implementation against the float64 reference, time the ones that pass
    (interleaved), and append one row per (configuration, implementation) to a CSV."""
    from . import sweep as sw
    from .results import ResultWriter
    from .timing import DEFAULT_BUDGET_S

    if resume and overwrite:
        raise BadInput("--resume and --overwrite exclude each other")
    if budget is not None and budget <= 0:
        raise BadInput(f"--time-budget={budget} must be positive")
    cases = sw.plan(config, patterns=patterns, T=T, T_min=T_min, T_max=T_max, B=B, H=H, D=D, dtype=dtypes,
                    causal=causal, window=window, sink=sink, block=block, dilation=dilation)
    chosen = sw.select_impls(impls)
    command = "attnbench " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    with ResultWriter(out, resume=resume, overwrite=overwrite) as writer:
        click.echo(f"{len(cases)} configurations x {len(chosen)} implementations "
                   f"({', '.join(i.name for i in chosen)}) -> {out}", err=True)
        ctx = sw.device_context(seed=seed, budget_s=budget or DEFAULT_BUDGET_S, command=command,
                                progress=sw.Progress())
        p = ctx.peaks
        click.echo(f"peaks: tensor-core {p.tc_tflops:.1f} TFLOP/s, float32 {p.f32_tflops:.1f} TFLOP/s, "
                   f"copy {p.copy_tbps:.2f} TB/s on {ctx.provenance['gpu']}", err=True)
        counts = sw.run_sweep(cases, chosen, writer, ctx)
    click.echo(", ".join(f"{k} {v}" for k, v in counts.items()) + f" -> {out}", err=True)


@main.command()
@click.argument("csv_path", metavar="RESULTS.csv")
@click.option("--out-dir", default="plots", show_default=True, type=click.Path(file_okay=False))
@_bad_input_exits
def plot(csv_path, out_dir):
    """PNG figures from a results CSV: runtime, speedup over dense, TFLOP/s and roofline vs T."""
    from .plot import plot_csv

    for path in plot_csv(csv_path, out_dir):
        click.echo(str(path))


@main.command()
@click.argument("csv_paths", metavar="RESULTS.csv...", nargs=-1, required=True)
@click.option("--readme", "readme_path", default="README.md", show_default=True, type=click.Path(dir_okay=False))
@click.option("--check", is_flag=True, help="exit 1 if the README's summary differs from the CSVs")
@_bad_input_exits
def readme(csv_paths, readme_path, check):
    """Rewrite the README summary between its attnbench:summary markers from results CSVs."""
    from .readme import update_readme

    changed = update_readme(readme_path, list(csv_paths), check=check)
    if check:
        if changed:
            click.echo(f"error: {readme_path} is stale: run `attnbench readme {' '.join(csv_paths)} "
                       f"--readme {readme_path}`", err=True)
            sys.exit(1)
        click.echo(f"{readme_path} is up to date", err=True)
    else:
        click.echo(f"{readme_path} {'updated' if changed else 'already up to date'}", err=True)


if __name__ == "__main__":
    main()
